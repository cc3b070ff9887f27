"""The compiled bounded-knapsack kernels behind :func:`routepack_opt.core.bounds.knapsack_max`
and :func:`~routepack_opt.core.bounds.knapsack_top` (the Gilmore–Gomory pricing and the dual
bound's exact maximum). A module of their own so that ``import routepack_opt`` (which imports
``core.bounds``) stays free of numba: the bounds import it when first called."""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True)
def _knapsack_dp(w_M, b_M, v_M, C, min_load):
    """Bounded knapsack, exact in int64: max Σ v_j a_j over 0 ≤ a_j ≤ b_j, min_load ≤ Σ w_j a_j ≤ C.

    Without a least load (``min_load`` ≤ 0) types with v_j ≤ 0 are left out; the others split
    into 0/1 items of 1, 2, 4, … copies (every count 0..min(b_j, C // w_j) is a sum of them). DP
    over the exact weight (−1: not reachable) with a choice table for the backtrack. Returns
    (max, a_M); (−1, 0) when no pattern reaches ``min_load``."""
    m = w_M.size
    cnt = 0
    for j in range(m):
        if (v_M[j] > 0 or min_load > 0) and v_M[j] >= 0 and w_M[j] <= C:
            k = min(b_M[j], C // w_M[j])
            p = 1
            while k > 0:
                t = min(p, k)
                cnt += 1
                k -= t
                p *= 2
    iw = np.empty(cnt, dtype=np.int64)
    iv = np.empty(cnt, dtype=np.int64)
    it = np.empty(cnt, dtype=np.int64)
    im = np.empty(cnt, dtype=np.int64)
    q = 0
    for j in range(m):
        if (v_M[j] > 0 or min_load > 0) and v_M[j] >= 0 and w_M[j] <= C:
            k = min(b_M[j], C // w_M[j])
            p = 1
            while k > 0:
                t = min(p, k)
                iw[q] = t * w_M[j]
                iv[q] = t * v_M[j]
                it[q] = j
                im[q] = t
                q += 1
                k -= t
                p *= 2
    dp = np.full(C + 1, -1, dtype=np.int64)
    dp[0] = 0
    take = np.zeros((cnt, C + 1), dtype=np.bool_)
    for i in range(cnt):
        wi = iw[i]
        vi = iv[i]
        for x in range(C, wi - 1, -1):
            if dp[x - wi] >= 0:
                c = dp[x - wi] + vi
                if c > dp[x]:
                    dp[x] = c
                    take[i, x] = True
    a_M = np.zeros(m, dtype=np.int64)
    x = -1
    best = -1
    for y in range(max(min_load, 0), C + 1):
        if dp[y] > best:
            best = dp[y]
            x = y
    if x < 0:
        return best, a_M
    for i in range(cnt - 1, -1, -1):
        if take[i, x]:
            a_M[it[i]] += im[i]
            x -= iw[i]
    return best, a_M


@numba.njit(cache=True, inline='always')
def _dantzig_bound(ow, ov, ob, i, capl, val):
    """The value ``val`` so far plus the capacity ``capl`` left filled from level ``i`` on in
    order, the last type fractionally (an upper bound of any completion)."""
    n = ow.size
    ub = float(val)
    k = i
    while k < n and capl > 0:
        t = min(ob[k], capl // ow[k])
        ub += t * ov[k]
        capl -= t * ow[k]
        if t < ob[k] and capl > 0:
            ub += capl * ov[k] / ow[k]
            capl = 0
        k += 1
    return ub


@numba.njit(cache=True)
def _knapsack_bb(w_M, b_M, v_M, C, min_load, node_limit):
    """Bounded knapsack by depth-first branch and bound (Horowitz–Sahni): types by decreasing
    v/w, counts from the most that fits down, pruned by the Dantzig bound (the rest filled
    fractionally) and by the load still reachable (``min_load``). Exact when it finishes;
    returns (max, a_M, finished) — (−1, 0, True) when no pattern reaches ``min_load``."""
    m = w_M.size
    idx = np.empty(m, dtype=np.int64)
    r = np.empty(m, dtype=np.float64)
    q = 0
    for j in range(m):
        if w_M[j] <= C and b_M[j] > 0 and (v_M[j] > 0 or (min_load > 0 and v_M[j] >= 0)):
            idx[q] = j
            r[q] = -v_M[j] / w_M[j]
            q += 1
    order = idx[:q][np.argsort(r[:q], kind="mergesort")]
    n = q
    ow = np.empty(n, dtype=np.int64)
    ov = np.empty(n, dtype=np.int64)
    ob = np.empty(n, dtype=np.int64)
    for i in range(n):
        j = order[i]
        ow[i] = w_M[j]
        ov[i] = v_M[j]
        ob[i] = min(b_M[j], C // w_M[j])
    reach = np.zeros(n + 1, dtype=np.int64)  # Σ of the weights from i on
    for i in range(n - 1, -1, -1):
        reach[i] = reach[i + 1] + ow[i] * ob[i]
    best = -1
    best_a = np.zeros(n, dtype=np.int64)
    cur = np.zeros(n, dtype=np.int64)
    nodes = 0
    # iterative DFS: level i, count cur[i] decreasing
    i = 0
    load = 0
    val = 0
    descending = True
    while True:
        if descending:
            if i == n:
                if load >= min_load and val > best:
                    best = val
                    best_a[:] = cur
                descending = False
                i -= 1
                if i < 0:
                    break
                continue
            nodes += 1
            if nodes > node_limit:
                return best, best_a, False, order
            ub = _dantzig_bound(ow, ov, ob, i, C - load, val)
            if ub <= best or load + min(reach[i], C - load) < min_load:
                descending = False
                i -= 1
                if i < 0:
                    break
                continue
            c = min(ob[i], (C - load) // ow[i])
            cur[i] = c
            load += c * ow[i]
            val += c * ov[i]
            i += 1
        else:
            # backtrack at level i: lower its count by one, or go up
            if cur[i] > 0:
                cur[i] -= 1
                load -= ow[i]
                val -= ov[i]
                i += 1
                descending = True
                # clear deeper counts
                for k in range(i, n):
                    cur[k] = 0
            else:
                i -= 1
                if i < 0:
                    break
    return best, best_a, True, order


@numba.njit(cache=True)
def _knapsack_pareto(w_M, b_M, v_M, C, state_limit, top):
    """Bounded knapsack (no least load) over the Pareto list of (load, value) states: the 0/1
    items of :func:`_knapsack_dp` merged in one by one, a state kept only when no lighter state
    is worth as much. Exact; O(states) per item, few states when few items fill a bin (large
    capacities). Returns (max, a_M, finished): not finished past ``state_limit`` states."""
    m = w_M.size
    cap = 1 << 12
    sl = np.empty(cap, dtype=np.int64)
    sv = np.empty(cap, dtype=np.int64)
    sp = np.empty(cap, dtype=np.int64)
    st = np.empty(cap, dtype=np.int64)  # type of the item that made the state
    sk = np.empty(cap, dtype=np.int64)  # copies it added
    ns = 1
    sl[0], sv[0], sp[0], st[0], sk[0] = 0, 0, -1, -1, 0
    cur = np.zeros(1, dtype=np.int64)
    for j in range(m):
        if v_M[j] <= 0 or w_M[j] > C:
            continue
        k = min(b_M[j], C // w_M[j])
        p = 1
        while k > 0:
            t = min(p, k)
            k -= t
            p *= 2
            wi = t * w_M[j]
            vi = t * v_M[j]
            nc = cur.size
            out = np.empty(2 * nc, dtype=np.int64)
            no = 0
            a = 0
            b = 0
            last = -1
            while a < nc or b < nc:
                # next from A (cur) or B (cur shifted by wi), by load
                use_b = False
                if b < nc and sl[cur[b]] + wi <= C:
                    if a >= nc:
                        use_b = True
                    else:
                        lb_ = sl[cur[b]] + wi
                        la = sl[cur[a]]
                        if lb_ < la or (lb_ == la and sv[cur[b]] + vi > sv[cur[a]]):
                            use_b = True
                elif a >= nc:
                    break
                if use_b:
                    val = sv[cur[b]] + vi
                    if val > last:
                        if ns == cap:
                            cap *= 2
                            sl, sv, sp = _grown(sl, ns, cap), _grown(sv, ns, cap), _grown(sp, ns, cap)
                            st, sk = _grown(st, ns, cap), _grown(sk, ns, cap)
                        sl[ns] = sl[cur[b]] + wi
                        sv[ns] = val
                        sp[ns] = cur[b]
                        st[ns] = j
                        sk[ns] = t
                        out[no] = ns
                        no += 1
                        ns += 1
                        last = val
                    b += 1
                else:
                    if sv[cur[a]] > last:
                        out[no] = cur[a]
                        no += 1
                        last = sv[cur[a]]
                    a += 1
            cur = out[:no].copy()
            if ns > state_limit:
                return -1, np.zeros((1, m), dtype=np.int64), np.zeros(1, dtype=np.int64), False
    a_TM, v_T = _top_states(cur, sv, sp, st, sk, top, m)
    return v_T[0], a_TM, v_T, True


@numba.njit(cache=True, inline='always')
def _grown(arr, ns, cap):
    """``arr`` in a new array of ``cap`` entries, its first ``ns`` kept."""
    out = np.empty(cap, dtype=np.int64)
    out[:ns] = arr[:ns]
    return out


@numba.njit(cache=True, inline='always')
def _top_states(cur, sv, sp, st, sk, top, m):
    """The ``top`` most valuable final states of the Pareto list ``cur`` (the heaviest ones:
    values rise with the load) as patterns, each traced back through its parents: (a_TM, v_T)."""
    kk = min(top, cur.size)
    a_TM = np.zeros((kk, m), dtype=np.int64)
    v_T = np.empty(kk, dtype=np.int64)
    for q in range(kk):
        x = cur[cur.size - 1 - q]
        v_T[q] = sv[x]
        while x > 0:
            a_TM[q, st[x]] += sk[x]
            x = sp[x]
    return a_TM, v_T

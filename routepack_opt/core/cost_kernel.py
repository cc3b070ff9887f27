"""The one cost authority of the compiled searches: how a block's cost J is made and how the
blocks' costs become the lexicographic key (makespan, total, peak) under each objective, with the
incremental pieces every move kind needs. The annealer (:mod:`routepack_opt.heuristics.anneal`),
its greedy seed, the row-aware placement refinement (:mod:`routepack_opt.heuristics.placement.refine`)
and the replica refinement (:mod:`routepack_opt.heuristics.placement.replica_refine`) call these;
the row-aware model (:mod:`routepack_opt.models.placement_rowaware`) scores through
:meth:`routepack_opt.core.objective.Objective.makespan`, this module's Python counterpart.

Legend: R rows, G shards, X = K = R·G row-shard blocks (x = r·G + g), P EP ranks.

Block cost, exactly as :func:`routepack_opt.core.evaluate.row_shard_costs` computes it::

    J[x] = (attention[x] + γ·Σ_l max_p W[x, l, p]) + overhead        (:func:`block_cost`)

Key of a layout: makespan max_g Σ_r J (max-sum) or Σ_r max_g J (sum-max), total Σ J, peak max J,
compared lexicographically (:func:`less`). :func:`is_max_sum` is the one place that branches on
the objective's integer code (:attr:`routepack_opt.core.objective.Objective.code`), and it raises
on a code it does not know, so a new objective is added here (one aggregate) and in
``core/objective.py``, and nowhere runs it silently as one of the two.

Not imported by ``import routepack_opt`` (numba on first use, as core.projection).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from routepack_opt.core.objective import Objective

__all__ = ["MAX_SUM", "SUM_MAX", "is_max_sum", "block_cost", "less", "top2", "top3", "peak_after_swap",
           "expert_peak_sum", "BlockCosts", "key_of", "pairwise_sum", "pairwise_sum_ws", "aggregates",
           "update_aggregates", "delta"]

MAX_SUM = Objective.MAX_SUM.code
SUM_MAX = Objective.SUM_MAX.code


@njit(cache=True, _nrt=False, inline='always')
def is_max_sum(code):
    """True for max-sum, False for sum-max (``code``: :attr:`Objective.code`); raises on any
    other code. The only branch on the objective in the compiled searches: a kernel whose
    aggregate differs by objective asks this, so an objective it does not know stops it."""
    if code == 0:
        return True
    if code == 1:
        return False
    raise ValueError("unknown objective code (core.objective.Objective.code)")


@njit(cache=True, _nrt=False, inline='always')
def block_cost(att, M, c):
    """J of a block from its attention cost and Σ_l max_p W (the evaluator's association);
    ``c`` carries ``gamma`` and ``ovh`` (the annealer's Problem, or :class:`BlockCosts`)."""
    return (att + c.gamma * np.float64(M)) + c.ovh


@njit(cache=True, _nrt=False, inline='always')
def less(m1, t1, p1, m0, t0, p0):
    """Strict lexicographic (m1, t1, p1) < (m0, t0, p0)."""
    if m1 < m0:
        return True
    if m1 > m0:
        return False
    if t1 < t0:
        return True
    if t1 > t0:
        return False
    return p1 < p0


@njit(cache=True, _nrt=False)
def top3(W_KP, tv_K3, ti_K3):
    """Per block k the three largest rank loads and their ranks (−1 / −1 where P < 3; loads are
    ≥ 0). Integer or float loads: the values take W's type."""
    K, P = W_KP.shape
    for k in range(K):
        v0 = -1
        v1 = -1
        v2 = -1
        i0 = -1
        i1 = -1
        i2 = -1
        for p in range(P):
            w = W_KP[k, p]
            if w > v0:
                v2, i2 = v1, i1
                v1, i1 = v0, i0
                v0, i0 = w, p
            elif w > v1:
                v2, i2 = v1, i1
                v1, i1 = w, p
            elif w > v2:
                v2, i2 = w, p
        tv_K3[k, 0], tv_K3[k, 1], tv_K3[k, 2] = v0, v1, v2
        ti_K3[k, 0], ti_K3[k, 1], ti_K3[k, 2] = i0, i1, i2


@njit(cache=True, _nrt=False, inline='always')
def peak_after_swap(tv_K3, ti_K3, k, p, q, wp, wq):
    """Block k's peak max_r W[k, r] once ranks p and q carry wp and wq (every other rank
    unchanged), in O(1) from its :func:`top3`: the largest of wp, wq and the first of the top
    three on another rank (of three, at most two are p and q)."""
    m = wp
    if wq > m:
        m = wq
    for j in range(3):
        r = ti_K3[k, j]
        if r != p and r != q:
            if r >= 0 and tv_K3[k, j] > m:
                m = tv_K3[k, j]
            break
    return m


@njit(cache=True, _nrt=False)
def expert_peak_sum(W_KP):
    """Σ_k max_p W[k, p] in block order: the expert part of one layer's cost, in tokens (the
    replica refinement's stand-in for the key: with one shard, γ times it is the layer's share
    of the makespan under either objective, every other part of J held fixed; with several
    shards a proxy that the one evaluator then judges)."""
    K, P = W_KP.shape
    c = 0.0
    for k in range(K):
        m = W_KP[k, 0]
        for p in range(1, P):
            if W_KP[k, p] > m:
                m = W_KP[k, p]
        c += m
    return c


@njit(cache=True, _nrt=False)
def _pairwise_block(a, lo, n):
    """numpy's pairwise-sum leaf (n ≤ 128): 8 accumulators, then the remainder."""
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    r0 = a[lo]
    r1 = a[lo + 1]
    r2 = a[lo + 2]
    r3 = a[lo + 3]
    r4 = a[lo + 4]
    r5 = a[lo + 5]
    r6 = a[lo + 6]
    r7 = a[lo + 7]
    m = n - n % 8
    for i in range(8, m, 8):
        r0 += a[lo + i]
        r1 += a[lo + i + 1]
        r2 += a[lo + i + 2]
        r3 += a[lo + i + 3]
        r4 += a[lo + i + 4]
        r5 += a[lo + i + 5]
        r6 += a[lo + i + 6]
        r7 += a[lo + i + 7]
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    for i in range(m, n):
        res += a[lo + i]
    return res


@njit(cache=True)
def pairwise_sum(a, lo, n):
    """numpy's pairwise summation of a[lo:lo+n] (bit-identical to ``ndarray.sum`` of a
    contiguous float64 array): blocks of ≤ 128 summed by 8 accumulators, larger ranges split
    in two halves (first half a multiple of 8). Iterative: numba's cache mishandles recursion."""
    if n <= 128:
        return _pairwise_block(a, lo, n)
    return pairwise_sum_ws(a, lo, n, np.empty((3, 64), dtype=np.int64), np.empty(64))


@njit(cache=True, _nrt=False)
def pairwise_sum_ws(a, lo, n, st_i, st_left):
    """:func:`pairwise_sum` with its walk stack in caller-provided scratch (st_i [3, 64]
    int64: range start, length, state; st_left [64]): allocation-free, for the move loop."""
    if n <= 128:
        return _pairwise_block(a, lo, n)
    # explicit post-order walk of the split tree; depth ≤ 64; state 0: left pending, 1: right
    top = 0
    st_i[0, 0] = lo
    st_i[1, 0] = n
    st_i[2, 0] = 0
    result = 0.0
    have = False
    while top >= 0:
        if have:  # a child just finished with `result`
            if st_i[2, top] == 0:
                st_left[top] = result
                st_i[2, top] = 1
                have = False
                n2 = st_i[1, top] // 2
                n2 -= n2 % 8
                clo = st_i[0, top] + n2
                cn = st_i[1, top] - n2
            else:
                result = st_left[top] + result
                top -= 1
                continue
        else:
            cn = st_i[1, top]
            n2 = cn // 2
            n2 -= n2 % 8
            clo = st_i[0, top]
            cn = n2
        if cn <= 128:
            result = _pairwise_block(a, clo, cn)
            have = True
        else:
            top += 1
            st_i[0, top] = clo
            st_i[1, top] = cn
            st_i[2, top] = 0
    return result


# ---------------------------------------------------------------------------------------------
# Blocks whose expert part changes (placement searches): J_k = block_cost(att_k, M_k + dM_k)
# ---------------------------------------------------------------------------------------------

class BlockCosts(NamedTuple):
    """The placement-free constants of a fixed layout's blocks (read by :func:`key_of`)."""

    att_K: np.ndarray    # [K] float64: attention part of each block
    gamma: float         # cost per token of the busiest rank, per layer
    ovh: float           # fixed cost per row and shard
    shard_K: np.ndarray  # [K] int64: shard of block k
    row_K: np.ndarray    # [K] int64: row of block k
    G: int
    R: int
    objective: int       # Objective.code


@njit(cache=True, _nrt=False)
def key_of(bk, M_K, dM_K, S_buf):
    """(makespan, total, peak) of the blocks J_k = block_cost(att_k, M_k + dM_k), summed in
    block order (the placement refinement's own running sums: its acceptance test compares
    keys of this one form). ``S_buf``: [≥ max(G, R)] scratch."""
    K = M_K.shape[0]
    ms = is_max_sum(bk.objective)
    for j in range(S_buf.shape[0]):
        S_buf[j] = 0.0 if ms else -np.inf
    total = 0.0
    peak = -np.inf
    for k in range(K):
        J = block_cost(bk.att_K[k], M_K[k] + dM_K[k], bk)
        total += J
        if J > peak:
            peak = J
        if ms:
            S_buf[bk.shard_K[k]] += J
        else:
            if J > S_buf[bk.row_K[k]]:
                S_buf[bk.row_K[k]] = J
    if ms:
        m = -np.inf
        for g in range(bk.G):
            if S_buf[g] > m:
                m = S_buf[g]
    else:
        m = 0.0
        for r in range(bk.R):
            m += S_buf[r]
    return m, total, peak


# ---------------------------------------------------------------------------------------------
# The annealer's aggregates over its State ``st`` and Problem ``pb``
# (routepack_opt.heuristics.anneal.state / problem): exact sums in numpy's pairwise order
# ---------------------------------------------------------------------------------------------


@njit(cache=True, _nrt=False, inline='always')
def top2(J, X, agg):
    """agg[2], agg[4] = the largest J and its block; agg[5], agg[6] = the largest J over the
    other blocks and its block (−inf, −1 when X = 1)."""
    p1 = -np.inf
    i1 = 0
    p2 = -np.inf
    i2 = -1
    for x in range(X):  # selects, not branches (see attn_top2)
        v = J[x]
        up = v > p1
        down = (not up) & (v > p2)
        i2 = (i1 if x > 0 else -1) if up else (x if down else i2)
        p2 = max(p2, min(p1, v))
        i1 = x if up else i1
        p1 = max(p1, v)
    agg[2] = p1
    agg[4] = i1
    agg[5] = p2
    agg[6] = i2


@njit(cache=True)
def aggregates(st, pb):
    """Recompute shard sums, row maxima, makespan, total, peak and energy from J (exact).

    agg = [makespan, total, peak, energy, peak_block, second_peak, second_block]: the second
    peak is the largest J over the blocks other than peak_block, so that a move touching the
    peak block gets the new peak in O(1) (see :func:`delta`)."""
    J, colsum, rowmax, agg = st.J, st.colsum, st.rowmax, st.agg
    R, G, objective, eps1, eps2 = pb.R, pb.G, pb.objective, pb.eps1, pb.eps2
    X = R * G
    top2(J, X, agg)
    peak = agg[2]
    total = pairwise_sum(J, np.int64(0), X)
    for g in range(G):
        s = J[g]
        for r in range(1, R):
            s += J[r * G + g]
        colsum[g] = s
    for r in range(R):
        m = J[r * G]
        for g in range(1, G):
            m = max(m, J[r * G + g])
        rowmax[r] = m
    if is_max_sum(objective):
        ms = colsum[0]
        for g in range(1, G):
            ms = max(ms, colsum[g])
    else:
        ms = pairwise_sum(rowmax, np.int64(0), R)
    agg[0] = ms
    agg[1] = total
    agg[3] = ms + eps1 * total + eps2 * peak


@njit(cache=True, _nrt=False, inline='always')
def update_aggregates(st, pb, ra, ga, dA, rb, gb, dB, dtot):
    """After block (ra, ga) changed by dA and (rb, gb) by dB (rb < 0: none), dtot in total:
    update the objective's own aggregate (max-sum: the touched shard sums by dA, dB; sum-max:
    the touched row maxima, recomputed, and the makespan by their change; the other one is not
    used by the search and goes stale), the makespan, the top two blocks and the energy, in O(G)
    — not O(R), as re-summing a shard of R = 181 blocks per accepted move was at N = 16,384.
    The carried sums drift by rounding only (~1e-16 relative per move, far below the
    1e-9 tie-break): :func:`aggregates` recomputes them exactly at every chunk of sweeps, and the
    reported score is recomputed from the layout."""
    J, colsum, rowmax, agg = st.J, st.colsum, st.rowmax, st.agg
    R, G, objective, eps1, eps2 = pb.R, pb.G, pb.objective, pb.eps1, pb.eps2
    X = R * G
    if is_max_sum(objective):
        colsum[ga] += dA
        if gb >= 0:
            colsum[gb] += dB
        ms = colsum[0]
        for g in range(1, G):
            ms = max(ms, colsum[g])
    else:
        ms = agg[0]
        for r in (ra, rb if rb != ra else -1):
            if r >= 0:
                o = r * G
                m = J[o]
                for g in range(1, G):
                    m = max(m, J[o + g])
                ms += m - rowmax[r]
                rowmax[r] = m
    total = agg[1] + dtot
    A = ra * G + ga
    B = rb * G + gb if rb >= 0 else -1
    # The top two blocks. Every block other than the old top two costs ≤ the old second
    # value; so the new top two are the two best of {A, B, the untouched old top blocks}
    # whenever both reach that value (ties: any order). Otherwise (a top block went below
    # the old second value and nothing replaces it) rescan.
    v1 = agg[2]
    i1 = np.int64(agg[4])
    v2 = agg[5]
    i2 = np.int64(agg[6])
    hit1 = (i1 == A) | (i1 == B)
    hit2 = (i2 == A) | (i2 == B)
    # candidates: (value, block); an untouched old top keeps its value, a touched one is
    # dropped (A and B enter with their new values)
    c1v = -np.inf if hit1 else v1
    c1i = -1 if hit1 else i1
    c2v = -np.inf if hit2 else v2
    c2i = -1 if hit2 else i2
    bv = -np.inf
    bi = -1
    av = J[A]
    if B >= 0:
        bv = J[B]
        bi = B
    # the two best of the four candidates
    t1v = -np.inf
    t1i = -1
    t2v = -np.inf
    t2i = -1
    for cv, ci in ((c1v, c1i), (c2v, c2i), (av, A), (bv, bi)):
        up = cv > t1v
        down = (not up) & (cv > t2v)
        t2i = t1i if up else (ci if down else t2i)
        t2v = max(t2v, min(t1v, cv))
        t1i = ci if up else t1i
        t1v = max(t1v, cv)
    if t2v >= v2 and t2i >= 0:
        agg[2] = t1v
        agg[4] = t1i
        agg[5] = t2v
        agg[6] = t2i
    else:
        top2(J, X, agg)
    agg[0] = ms
    agg[1] = total
    agg[3] = ms + eps1 * total + agg[2] * eps2


@njit(cache=True, _nrt=False, inline='always')
def delta(st, pb, ra, ga, JA, rb, gb, JB):
    """(Δmakespan, Δtotal, Δpeak) when block A = (ra, ga) costs JA and B = (rb, gb) costs JB
    (rb < 0: only A changes). Row and shard come in explicitly: no integer division here."""
    J, colsum, rowmax, agg = st.J, st.colsum, st.rowmax, st.agg
    G, objective = pb.G, pb.objective
    A = ra * G + ga
    B = rb * G + gb if rb >= 0 else -1
    dA = JA - J[A]
    dB = JB - J[B] if B >= 0 else 0.0
    peak = agg[2]
    # the new peak: max(JA, JB, max over the untouched blocks), the last from the top two.
    # Written with selects: these comparisons are data-dependent and mispredicted as branches.
    pk = max(JA, JB) if B >= 0 else JA
    i1 = np.int64(agg[4])
    i2 = np.int64(agg[6])
    hit1 = (i1 == A) | (i1 == B)
    hit2 = (i2 == A) | (i2 == B)
    rest = agg[5] if hit1 else peak
    if hit1 & hit2:  # both top blocks touched (rare): scan the rest
        rest = -np.inf
        for x in range(J.shape[0]):
            if x != A and x != B:
                rest = max(rest, J[x])
    pk = max(pk, rest)
    if is_max_sum(objective):
        ms = -np.inf
        for g in range(G):
            v = colsum[g] + (dA if g == ga else 0.0)
            v = v + (dB if g == gb else 0.0)
            ms = max(ms, v)
        dms = ms - agg[0]
    else:
        o = ra * G
        m = -np.inf
        for g in range(G):
            v = J[o + g]
            if o + g == A:
                v = JA
            elif o + g == B:
                v = JB
            m = max(m, v)
        dms = m - rowmax[ra]
        if B >= 0 and rb != ra:
            o = rb * G
            m = -np.inf
            for g in range(G):
                v = J[o + g]
                if g == gb:
                    v = JB
                m = max(m, v)
            dms += m - rowmax[rb]
    return dms, dA + dB, pk - peak

"""Compiled cost kernels of the annealer: a block's cost J from the integer state, and the
change of (makespan, total, peak) when a move rewrites one or two blocks.

Legend: L layers, P EP ranks (Pp padded to a multiple of 8), D DP slots, G shards, R rows,
S attention stages, X = R·G row-shard blocks (x = r·G + g), cell c = r·D + d.

Block cost, exactly as :func:`routepack_opt.core.evaluate.row_shard_costs` computes it::

    J[x] = (Σ_s max_{d∈g} (α_s·T[r,d] + β_s·Q[r,d]) + γ·Σ_l max_p W[x, p·L + l]) + overhead

with T, Q the cells' Σ length and Σ length² and W the block's per-rank expert loads. J is always
recomputed from the integers, never carried, so it never drifts; sums over blocks use numpy's
pairwise order (:func:`pairwise_sum`), so claimed totals are bit-identical to the evaluator's.

The functions that take ``st`` and ``pb`` read a replica's
:class:`~routepack_opt.heuristics.anneal.state.State` and the
:class:`~routepack_opt.heuristics.anneal.problem.Problem`.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

__all__ = ["attn", "attn_top2", "attn_one", "block_cost", "msum_swap", "msum_swap8", "msum_swap_wide",
           "msum_add", "msum_add8", "msum_add_wide", "msum", "w_swap",
           "pairwise_sum", "pairwise_sum_ws", "top2", "aggregates", "update_aggregates", "delta"]


@njit(cache=True, _nrt=False, inline='always')
def attn(T, Q, r, g, P, alpha, beta, D, cx, Tx, Qx, cy, Ty, Qy):
    """Σ_s max_{d∈g} (α_s·T[r,d] + β_s·Q[r,d]) with cells cx, cy overridden (−1: none).

    The search works in shard-major slot order (internal slot g·P + j is the j-th slot of shard
    g; :class:`~routepack_opt.heuristics.anneal.problem.Instance` maps user slots in and out),
    so a shard's cells are contiguous and the loop vectorises (the overrides are selects)."""
    base = np.uint64(r * D + g * P)
    tot = 0.0
    for s in range(alpha.shape[0]):
        a = alpha[s]
        bb = beta[s]
        m = -np.inf
        for jj in range(P):
            c = base + np.uint64(jj)
            ci = np.int64(c)
            t = T[c]
            q = Q[c]
            if ci == cx:
                t = Tx
                q = Qx
            if ci == cy:
                t = Ty
                q = Qy
            m = max(m, a * np.float64(t) + bb * np.float64(q))
        tot += m
    return tot


@njit(cache=True, _nrt=False, inline='always')
def attn_top2(T, Q, r, g, P, alpha, beta, D, At, x):
    """Per stage s of block x = (r, g): the largest cell cost α_s·T + β_s·Q, its cell and the
    largest cost over the block's other cells, into At[(x·S + s)·3 + (0, 1, 2)]."""
    base = r * D + g * P
    S = alpha.shape[0]
    for s in range(S):
        a = alpha[s]
        bb = beta[s]
        m1 = -np.inf
        i1 = -1
        m2 = -np.inf
        for jj in range(P):
            c = base + jj
            v = a * np.float64(T[c]) + bb * np.float64(Q[c])
            # branch-free (selects): the data-dependent branches mispredicted half the time
            m2 = max(m2, min(m1, v))
            i1 = c if v > m1 else i1
            m1 = max(m1, v)
        o = (x * S + s) * 3
        At[o] = m1
        At[o + 1] = i1
        At[o + 2] = m2


@njit(cache=True, _nrt=False, inline='always')
def attn_one(At, x, c, Tc, Qc, alpha, beta):
    """:func:`attn` of block x with the one cell c at (Tc, Qc), in O(S) from the top two of
    :func:`attn_top2` (the same maxima and the same stage sum, so bit-identical)."""
    S = alpha.shape[0]
    tot = 0.0
    for s in range(S):
        o = (x * S + s) * 3
        v = alpha[s] * np.float64(Tc) + beta[s] * np.float64(Qc)
        rest = At[o + 2] if At[o + 1] == c else At[o]
        tot += max(v, rest)
    return tot


def _narrow(x, w):
    """x (an int64 from numba's scalar promotion) cast to the element type of array w."""
    return x


@overload(_narrow)
def _narrow_impl(x, w):
    if w.dtype == types.int32:
        return lambda x, w: np.int32(x)
    return lambda x, w: np.int64(x)


# The expert kernels below dominate the search (one per evaluated move between blocks; a
# relocation is a swap with the zero row b[N], so one kernel serves both). W and b are stored
# rank-major (index p·L + l) with the ranks zero-padded to a multiple of 8 (``nb`` blocks of 8;
# zero ranks never change a maximum because every W + Δ is ≥ 0). For one block (P ≤ 8, the usual
# case) each layer's maximum over the 8 ranks is one expression, so the loop over the L layers
# vectorises without scratch memory (~2.5× faster than a running maximum in an array); indices
# are unsigned so numba emits no negative-index wraparound, which would block vectorisation.
# ``m`` is an [L] scratch row (W's dtype) for nb > 1.


@njit(cache=True, _nrt=False, inline='always')
def _ranks8(q0, L1):
    """The rank-major indices of ranks 1..7 of the block of 8 whose rank 0 is at q0."""
    q1 = q0 + L1
    q2 = q1 + L1
    q3 = q2 + L1
    q4 = q3 + L1
    q5 = q4 + L1
    q6 = q5 + L1
    return q1, q2, q3, q4, q5, q6, q6 + L1


@njit(cache=True, _nrt=False, inline='always')
def _swap8(W, au, bu, b, iu, ju, q0, L1):
    """One layer of :func:`msum_swap` over one block of 8 ranks (rank-major index q0 + p·L):
    (max_p (W[A] − b[i] + b[j]), max_p (W[B] + b[i] − b[j]))."""
    q1, q2, q3, q4, q5, q6, q7 = _ranks8(q0, L1)
    d0 = _narrow(b[iu, q0] - b[ju, q0], W)
    d1 = _narrow(b[iu, q1] - b[ju, q1], W)
    d2 = _narrow(b[iu, q2] - b[ju, q2], W)
    d3 = _narrow(b[iu, q3] - b[ju, q3], W)
    d4 = _narrow(b[iu, q4] - b[ju, q4], W)
    d5 = _narrow(b[iu, q5] - b[ju, q5], W)
    d6 = _narrow(b[iu, q6] - b[ju, q6], W)
    d7 = _narrow(b[iu, q7] - b[ju, q7], W)
    va = max(max(max(_narrow(W[au, q0] - d0, W), _narrow(W[au, q1] - d1, W)),
                 max(_narrow(W[au, q2] - d2, W), _narrow(W[au, q3] - d3, W))),
             max(max(_narrow(W[au, q4] - d4, W), _narrow(W[au, q5] - d5, W)),
                 max(_narrow(W[au, q6] - d6, W), _narrow(W[au, q7] - d7, W))))
    vb = max(max(max(_narrow(W[bu, q0] + d0, W), _narrow(W[bu, q1] + d1, W)),
                 max(_narrow(W[bu, q2] + d2, W), _narrow(W[bu, q3] + d3, W))),
             max(max(_narrow(W[bu, q4] + d4, W), _narrow(W[bu, q5] + d5, W)),
                 max(_narrow(W[bu, q6] + d6, W), _narrow(W[bu, q7] + d7, W))))
    return va, vb


@njit(cache=True, _nrt=False)
def msum_swap8(W, A, B, b, i, j, L):
    """:func:`msum_swap` for P ≤ 8 (one block of 8 ranks), the usual case: no scratch, so the
    loop only reads memory and LLVM vectorises it without the run-time overlap checks that the
    scratch stores of the general kernel force before every call (twice as fast per call at
    L = 48 on an AVX2 core, random blocks and samples: 123 ns against 255 ns; the production
    window's search 1.5× as many proposals per CPU-second)."""
    au = np.uint64(A)
    bu = np.uint64(B)
    iu = np.uint64(i)
    ju = np.uint64(j)
    L1 = np.uint64(L)
    sa = 0
    sb = 0
    for l in range(L):
        va, vb = _swap8(W, au, bu, b, iu, ju, np.uint64(l), L1)
        sa += va
        sb += vb
    return sa, sb


@njit(cache=True, _nrt=False, inline='always')
def msum_swap(W, A, B, b, i, j, L, nb, m):
    """(Σ_l max_p (W[A] − b[i] + b[j]), Σ_l max_p (W[B] + b[i] − b[j])) in one pass (i in A
    swaps with j in B; j = N, the zero row, relocates i from A to B); ``m`` holds 2L scratch
    entries, used when nb > 1. Inlined into its caller, so the choice of kernel costs no call:
    :func:`msum_swap8` for nb = 1, :func:`msum_swap_wide` otherwise."""
    if nb == 1:
        return msum_swap8(W, A, B, b, i, j, L)
    return msum_swap_wide(W, A, B, b, i, j, L, nb, m)


@njit(cache=True, _nrt=False)
def msum_swap_wide(W, A, B, b, i, j, L, nb, m):
    """:func:`msum_swap` for nb > 1 blocks of 8 ranks: each block's per-layer maxima folded
    into the scratch ``m``."""
    au = np.uint64(A)
    bu = np.uint64(B)
    iu = np.uint64(i)
    ju = np.uint64(j)
    L1 = np.uint64(L)
    for k in range(nb):
        o = np.uint64(8 * k) * L1
        for l in range(L):
            va, vb = _swap8(W, au, bu, b, iu, ju, o + np.uint64(l), L1)
            if k == 0:
                m[l] = va
                m[L + l] = vb
            else:
                m[l] = max(m[l], va)
                m[L + l] = max(m[L + l], vb)
    sa = 0
    sb = 0
    for l in range(L):
        sa += m[l]
        sb += m[L + l]
    return sa, sb


@njit(cache=True, _nrt=False, inline='always')
def _add8(W, xu, b, iu, q0, L1):
    """One layer of :func:`msum_add` over one block of 8 ranks: max_p (W[x] + b[i])."""
    q1, q2, q3, q4, q5, q6, q7 = _ranks8(q0, L1)
    return max(max(max(_narrow(W[xu, q0] + b[iu, q0], W), _narrow(W[xu, q1] + b[iu, q1], W)),
                   max(_narrow(W[xu, q2] + b[iu, q2], W), _narrow(W[xu, q3] + b[iu, q3], W))),
               max(max(_narrow(W[xu, q4] + b[iu, q4], W), _narrow(W[xu, q5] + b[iu, q5], W)),
                   max(_narrow(W[xu, q6] + b[iu, q6], W), _narrow(W[xu, q7] + b[iu, q7], W))))


@njit(cache=True, _nrt=False)
def msum_add8(W, x, b, i, L):
    """:func:`msum_add` for P ≤ 8, without scratch (as :func:`msum_swap8`)."""
    xu = np.uint64(x)
    iu = np.uint64(i)
    L1 = np.uint64(L)
    s = 0
    for l in range(L):
        s += _add8(W, xu, b, iu, np.uint64(l), L1)
    return s


@njit(cache=True, _nrt=False, inline='always')
def msum_add(W, x, b, i, L, nb, m):
    """Σ_l max_p (W[x] + b[i]): block x's expert sum with sample i added (the one side of
    :func:`msum_swap` that a placement needs); ``m`` holds L scratch entries, used when nb > 1.
    Inlined, as :func:`msum_swap`: :func:`msum_add8` for nb = 1, :func:`msum_add_wide` otherwise."""
    if nb == 1:
        return msum_add8(W, x, b, i, L)
    return msum_add_wide(W, x, b, i, L, nb, m)


@njit(cache=True, _nrt=False)
def msum_add_wide(W, x, b, i, L, nb, m):
    """:func:`msum_add` for nb > 1 blocks of 8 ranks (maxima folded into ``m``)."""
    xu = np.uint64(x)
    iu = np.uint64(i)
    L1 = np.uint64(L)
    for k in range(nb):
        o = np.uint64(8 * k) * L1
        for l in range(L):
            v = _add8(W, xu, b, iu, o + np.uint64(l), L1)
            m[l] = v if k == 0 else max(m[l], v)
    s = 0
    for l in range(L):
        s += m[l]
    return s


@njit(cache=True)
def msum(W, x, L, P, m):
    xu = np.uint64(x)
    for l in range(L):
        m[l] = W[xu, np.uint64(l)]
    for p in range(1, P):
        o = np.uint64(p) * np.uint64(L)
        for l in range(L):
            m[l] = max(m[l], W[xu, o + np.uint64(l)])
    s = 0
    for l in range(L):
        s += m[l]
    return s


@njit(cache=True, _nrt=False)
def w_swap(W, A, B, b, i, j, n):
    """W[A] += b[j] − b[i]; W[B] += b[i] − b[j]."""
    au = np.uint64(A)
    bu = np.uint64(B)
    iu = np.uint64(i)
    ju = np.uint64(j)
    for o in range(n):
        q = np.uint64(o)
        d = b[iu, q] - b[ju, q]
        W[au, q] -= d
        W[bu, q] += d


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
    if objective == 0:
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
    if objective == 0:
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
    if objective == 0:
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




@njit(cache=True, _nrt=False, inline='always')
def block_cost(att, M, pb):
    """J of a block from its attention cost and Σ_l max_p W (the evaluator's association)."""
    return (att + pb.gamma * np.float64(M)) + pb.ovh

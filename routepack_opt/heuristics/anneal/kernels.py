"""Compiled cost kernels of the annealer: a block's cost J from the integer state, and the
change of (makespan, total, peak) when a move rewrites one or two blocks.

Legend: L layers, P EP ranks (Pp padded to a multiple of 8), D DP slots, G shards, R rows,
S attention stages, X = R·G row-shard blocks (x = r·G + g), cell c = r·D + d.

Block cost (:func:`routepack_opt.core.cost_kernel.block_cost`, with the aggregates, their
deltas and numpy's pairwise sum, re-exported from there), exactly as
:func:`routepack_opt.core.evaluate.row_shard_costs` computes it::

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

# the block cost, the aggregates and their deltas live in the one cost module (re-exported here,
# where the annealer's modules have always imported them)
from routepack_opt.core.cost_kernel import (
    aggregates,
    block_cost,
    delta,
    pairwise_sum,
    pairwise_sum_ws,
    top2,
    update_aggregates,
)

__all__ = ["attn", "block_attn", "attn_top2", "attn_one", "block_cost", "msum_swap", "msum_swap8", "msum_swap_wide",
           "msum_add", "msum_add8", "msum_add_wide", "msum", "w_swap",
           "pairwise_sum", "pairwise_sum_ws", "top2", "aggregates", "update_aggregates", "delta"]


@njit(cache=True, _nrt=False, inline='always')
def attn(st, pb, r, g, cx, Tx, Qx, cy, Ty, Qy):
    """Σ_s max_{d∈g} (α_s·T[r,d] + β_s·Q[r,d]) of block (r, g) of the state's cell sums
    (st.T, st.Q) with cells cx, cy at (Tx, Qx), (Ty, Qy) instead (−1: none).

    The search works in shard-major slot order (internal slot g·P + j is the j-th slot of shard
    g; :class:`~routepack_opt.heuristics.anneal.problem.Instance` maps user slots in and out),
    so a shard's cells are contiguous and the loop vectorises (the overrides are selects)."""
    T, Q, P, alpha, beta = st.T, st.Q, pb.P, pb.alpha, pb.beta
    base = np.uint64(r * pb.D + g * P)
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
def block_attn(st, pb, r, g):
    """:func:`attn` of block (r, g) as the state holds it (no cell overridden)."""
    return attn(st, pb, r, g, -1, 0, 0, -1, 0, 0)


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

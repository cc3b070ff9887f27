"""The swap move: two samples of different cells exchange cells (both cells stay ≤ capacity;
counts unchanged).

The partner j is uniform among the samples with length in [l_i, l_i + free capacity of i's cell]
— exactly the swaps that fit, each pair one way round — and, with probability ``p_near``, also
among the ``window`` nearest in length order (:func:`fitting_partner`). A guided sample's near
partner is any of the ``window`` neighbours either side, shorter ones too, capacity checked
(:func:`near_partner`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from routepack_opt.heuristics.anneal.proposal import SWAP, Proposal, no_move
from routepack_opt.heuristics.anneal.rng import below, unit, xo
from routepack_opt.heuristics.anneal.sampling import WINDOW_TRIES, in_window

__all__ = ["near_partner", "fitting_partner", "propose_swap"]


@njit(cache=True, _nrt=False, inline='always')
def near_partner(s0, s1, s2, s3, pb, mv, i):
    """A guided sample's near-swap partner: a length neighbour either way (a bottleneck sample
    may swap with a shorter one), −1 past either end; capacity is checked by the caller. Only
    guided moves draw it, so never inside a row window."""
    x, s0, s1, s2, s3 = xo(s0, s1, s2, s3)
    k = below(x, 2 * mv.window) - mv.window
    if k >= 0:
        k += 1
    j = i + k
    if j < 0 or j >= pb.N:
        return -1, s0, s1, s2, s3
    return j, s0, s1, s2, s3


@njit(cache=True, _nrt=False, inline='always')
def fitting_partner(s0, s1, s2, s3, st, pb, mv, i, a, near, r0, w):
    """A swap partner that always fits (−1: none): length in [l_i, l_i + free(a)] (a receives
    l_j, j's cell gets no longer; every feasible swap is such a pair one way round), for a near
    swap also within ``window`` of i in length order; never i itself; with a row window, in it
    (up to WINDOW_TRIES draws)."""
    li = pb.lengths[i]
    lo = np.int64(pb.n_le[li - 1])
    hi = np.int64(pb.n_le[min(li + pb.C - st.T[a], pb.C)])
    if near:
        nw = mv.window if w >= pb.R else mv.wide
        lo = max(lo, i - nw)
        hi = min(hi, i + nw + 1)
    if hi - lo < 2:
        return -1, s0, s1, s2, s3
    for _t in range(WINDOW_TRIES):
        x, s0, s1, s2, s3 = xo(s0, s1, s2, s3)
        j = lo + below(x, hi - lo - 1)
        j += 1 if j >= i else 0
        if w >= pb.R or in_window(np.int64(st.row[j]), r0, w, pb.R):
            return j, s0, s1, s2, s3
    return -1, s0, s1, s2, s3


@njit(cache=True, _nrt=False, inline='always')
def propose_swap(s0, s1, s2, s3, st, pb, mv, i, guided, r0, w):
    """A swap of i (in its cell a) with a partner: a SWAP
    :class:`~routepack_opt.heuristics.anneal.proposal.Proposal` with the two cells' token sums
    after it, or none (no partner, same cell, or over capacity)."""
    ra = np.int64(st.row[i])
    da = np.int64(st.slot[i])
    a = ra * pb.D + da
    near = False
    if mv.p_near > 0.0:
        x, s0, s1, s2, s3 = xo(s0, s1, s2, s3)
        near = unit(x) <= mv.p_near
    if near and guided:
        j, s0, s1, s2, s3 = near_partner(s0, s1, s2, s3, pb, mv, i)
    else:
        j, s0, s1, s2, s3 = fitting_partner(s0, s1, s2, s3, st, pb, mv, i, a, near, r0, w)
    if j < 0:
        return no_move(), s0, s1, s2, s3
    rb = np.int64(st.row[j])
    db = np.int64(st.slot[j])
    bc = rb * pb.D + db
    if bc == a:
        return no_move(), s0, s1, s2, s3
    li = pb.lengths[i]
    lj = pb.lengths[j]
    Ta = st.T[a] - li + lj
    Tb = st.T[bc] - lj + li
    if Ta > pb.C or Tb > pb.C:
        return no_move(), s0, s1, s2, s3
    zero = np.int64(0)
    return Proposal(kind=np.int64(SWAP), i=np.int64(i), j=np.int64(j), k=np.int64(-1),
                    a=a, ra=ra, ga=np.int64(pb.shard_D[da]), da=da,
                    bc=bc, rb=rb, gb=np.int64(pb.shard_D[db]), db=db, cc=np.int64(-1), dc=np.int64(-1),
                    Ta=Ta, Qa=st.Q[a] - pb.len2[i] + pb.len2[j], Tb=Tb,
                    Qb=st.Q[bc] - pb.len2[j] + pb.len2[i], Tc=zero, Qc=zero), s0, s1, s2, s3

"""The rotation move (off by default: ``AnnealConfig.p_rotate`` = 0): three samples rotate over
three cells, i: a → b, j: b → c, k: c → a, where c is another cell of a's block (same row and
shard) and b a cell of another block.

Every cell keeps its count (so it is a move of the equal-samples-per-slot mode too), and the
expert loads change exactly as for the swap i ↔ j (k stays in block A): one
:func:`~routepack_opt.heuristics.anneal.kernels.msum_swap`, as for a swap; only block A's
attention is recomputed over its cells, two of which change. It reaches what a swap cannot when
j does not fit into a: a takes k instead, and c takes j.

The partner j is a length neighbour of i (within ``swap_window`` either side in length order,
``wide`` inside a row window), so b's tokens barely change, and k a uniform member of c.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from routepack_opt.heuristics.anneal.proposal import ROTATE, Proposal, no_move
from routepack_opt.heuristics.anneal.rng import below, xo
from routepack_opt.heuristics.anneal.sampling import WINDOW_TRIES, in_window

__all__ = ["rotation_partner", "propose_rotation"]


@njit(cache=True, _nrt=False, inline='always')
def rotation_partner(s0, s1, s2, s3, st, pb, mv, i, r0, w):
    """j: a length neighbour of i (never i), in the row window when w < R; −1: none in
    WINDOW_TRIES draws."""
    nw = mv.window if w >= pb.R else mv.wide
    for _t in range(WINDOW_TRIES):
        x, s0, s1, s2, s3 = xo(s0, s1, s2, s3)
        d = below(x, 2 * nw) - nw
        j = i + d + (1 if d >= 0 else 0)
        if 0 <= j < pb.N and (w >= pb.R or in_window(np.int64(st.row[j]), r0, w, pb.R)):
            return j, s0, s1, s2, s3
    return -1, s0, s1, s2, s3


@njit(cache=True, _nrt=False)
def propose_rotation(s0, s1, s2, s3, st, pb, mv, i, r0, w):
    """A rotation of i (in cell a) with a partner j in another block and a member k of another
    cell c of a's block: a ROTATE :class:`~routepack_opt.heuristics.anneal.proposal.Proposal`
    with the three cells' token sums after it, or none (P = 1, no partner, j in a's block, or
    over capacity). A call, not inlined: the default move loop never runs it and stays as small
    as without it."""
    P, D = pb.P, pb.D
    ra = np.int64(st.row[i])
    da = np.int64(st.slot[i])
    a = ra * D + da
    ga = np.int64(pb.shard_D[da])
    if P < 2:
        return no_move(), s0, s1, s2, s3
    x, s0, s1, s2, s3 = xo(s0, s1, s2, s3)
    dc = ga * P + below(x, P - 1)  # internal slots are shard-major: a's shard is g·P .. g·P + P − 1
    dc += 1 if dc >= da else 0
    cc = ra * D + dc
    x, s0, s1, s2, s3 = xo(s0, s1, s2, s3)
    k = np.int64(st.memb[below(x, st.cnt[cc]) * (pb.R * D) + cc])
    j, s0, s1, s2, s3 = rotation_partner(s0, s1, s2, s3, st, pb, mv, i, r0, w)
    if j < 0:
        return no_move(), s0, s1, s2, s3
    rb = np.int64(st.row[j])
    db = np.int64(st.slot[j])
    gb = np.int64(pb.shard_D[db])
    if rb == ra and gb == ga:  # j in block A: three cells of one block (not this move's shape)
        return no_move(), s0, s1, s2, s3
    bc = rb * D + db
    li, lj, lk = pb.lengths[i], pb.lengths[j], pb.lengths[k]
    Ta = st.T[a] - li + lk
    Tb = st.T[bc] - lj + li
    Tc = st.T[cc] - lk + lj
    if Ta > pb.C or Tb > pb.C or Tc > pb.C:
        return no_move(), s0, s1, s2, s3
    qi, qj, qk = pb.len2[i], pb.len2[j], pb.len2[k]
    return Proposal(kind=np.int64(ROTATE), i=np.int64(i), j=np.int64(j), k=k, a=a, ra=ra, ga=ga, da=da,
                    bc=bc, rb=rb, gb=gb, db=db, cc=cc, dc=np.int64(dc),
                    Ta=Ta, Qa=st.Q[a] - qi + qk, Tb=Tb, Qb=st.Q[bc] - qj + qi,
                    Tc=Tc, Qc=st.Q[cc] - qk + qj), s0, s1, s2, s3

"""The relocation move: one sample to another cell (only if its cell keeps ≥ 1 sample and the
target stays ≤ capacity C).

Target first (:func:`pick_target_first`): a uniform *open* cell c (one with room for the shortest
sample; the open cells are kept in a set updated in O(1) per accepted move), then i uniform among
the samples no longer than c's free capacity (a table of counts by length). With equal samples
per slot a relocation keeps i in its slot (:func:`target_in_slot`): i first (uniform, or
guided), then the first other row of i's slot with room, from a uniform start. A guided
relocation tries up to 8 random targets with room (:func:`guided_target`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from routepack_opt.heuristics.anneal.proposal import RELOCATE, Proposal, no_move
from routepack_opt.heuristics.anneal.rng import below, xo
from routepack_opt.heuristics.anneal.sampling import WINDOW_TRIES, in_window

__all__ = ["pick_target_first", "target_in_slot", "guided_target", "propose_relocation"]


@njit(cache=True, _nrt=False, inline='always')
def pick_target_first(s0, s1, s2, s3, st, pb, r0, w):
    """Unguided relocation, target first: (i, target cell), i = −1 when no cell is open. A
    uniform open cell (room for the shortest sample), then a uniform sample among those that
    fit its free capacity (n_le[s] = #samples of length ≤ s); with a row window (w < R) both
    redrawn until inside it (i = −1: not found)."""
    n_cells = pb.R * pb.D
    n_open = st.opn[2 * n_cells]
    win = w < pb.R
    bc = np.int64(-1)
    for t in range(WINDOW_TRIES):
        x, s0, s1, s2, s3 = xo(s0, s1, s2, s3)
        if n_open == 0:
            return -1, -1, s0, s1, s2, s3
        bc = np.int64(st.opn[below(x, n_open)])
        if not win or in_window(bc // pb.D, r0, w, pb.R):
            break
        if t == WINDOW_TRIES - 1:
            return -1, -1, s0, s1, s2, s3
    nfit = pb.n_le[pb.C - st.T[bc]]  # ≥ 1: bc is open
    for _t in range(WINDOW_TRIES):
        x, s0, s1, s2, s3 = xo(s0, s1, s2, s3)
        i = below(x, nfit)
        if not win or in_window(np.int64(st.row[i]), r0, w, pb.R):
            return i, bc, s0, s1, s2, s3
    return -1, -1, s0, s1, s2, s3


@njit(cache=True, _nrt=False, inline='always')
def target_in_slot(s0, s1, s2, s3, st, pb, ra, da, li, r0, w):
    """Equal counts: another row of i's own slot (of the row window, which holds ra, when
    w < R), the first with room from a uniform start (cells of a slot are often nearly full:
    one random row rarely fits); −1: none."""
    R, D = pb.R, pb.D
    if w < R:
        x, s0, s1, s2, s3 = xo(s0, s1, s2, s3)
        k0 = below(x, w - 1)
        oa = ra - r0
        oa += R if oa < 0 else 0  # ra's place in the window
        for t in range(w - 1):
            k = k0 + t
            k -= (w - 1) if k >= w - 1 else 0
            k += 1 if k >= oa else 0
            rt = r0 + k
            rt -= R if rt >= R else 0
            if st.T[rt * D + da] + li <= pb.C:
                return rt * D + da, s0, s1, s2, s3
        return -1, s0, s1, s2, s3
    if R < 2:
        return -1, s0, s1, s2, s3
    x, s0, s1, s2, s3 = xo(s0, s1, s2, s3)
    r0 = below(x, R - 1)
    for t in range(R - 1):
        rt = r0 + t
        rt -= (R - 1) if rt >= R - 1 else 0
        rt += 1 if rt >= ra else 0
        if st.T[rt * D + da] + li <= pb.C:
            return rt * D + da, s0, s1, s2, s3
    return -1, s0, s1, s2, s3


@njit(cache=True, _nrt=False, inline='always')
def guided_target(s0, s1, s2, s3, st, pb, a, li):
    """A guided relocation's target: up to 8 random open cells other than a with room; −1: none."""
    n_open = st.opn[2 * pb.R * pb.D]
    if n_open == 0:
        return -1, s0, s1, s2, s3
    for _t in range(8):
        x, s0, s1, s2, s3 = xo(s0, s1, s2, s3)
        c = np.int64(st.opn[below(x, n_open)])
        if c != a and st.T[c] + li <= pb.C:
            return c, s0, s1, s2, s3
    return -1, s0, s1, s2, s3


@njit(cache=True, _nrt=False, inline='always')
def propose_relocation(s0, s1, s2, s3, st, pb, i, bc, r0, w):
    """A relocation of i out of its cell a to ``bc`` (when the target came first) or to a target
    drawn here (equal counts: :func:`target_in_slot`; guided: :func:`guided_target`): a
    RELOCATE :class:`~routepack_opt.heuristics.anneal.proposal.Proposal`, or none (a would
    empty, or no room)."""
    ra = np.int64(st.row[i])
    da = np.int64(st.slot[i])
    a = ra * pb.D + da
    li = pb.lengths[i]
    if st.cnt[a] < 2 or bc == a:
        return no_move(), s0, s1, s2, s3
    if pb.eq:
        bc, s0, s1, s2, s3 = target_in_slot(s0, s1, s2, s3, st, pb, ra, da, li, r0, w)
    elif bc < 0:
        bc, s0, s1, s2, s3 = guided_target(s0, s1, s2, s3, st, pb, a, li)  # guided: no window
    if bc < 0:
        return no_move(), s0, s1, s2, s3
    rb = bc // pb.D
    db = bc - rb * pb.D
    zero = np.int64(0)
    return Proposal(kind=np.int64(RELOCATE), i=np.int64(i), j=np.int64(pb.N), k=np.int64(-1),
                    a=a, ra=ra, ga=np.int64(pb.shard_D[da]), da=da,
                    bc=np.int64(bc), rb=np.int64(rb), gb=np.int64(pb.shard_D[db]), db=np.int64(db),
                    cc=np.int64(-1), dc=np.int64(-1),
                    Ta=st.T[a] - li, Qa=st.Q[a] - pb.len2[i], Tb=st.T[bc] + li,
                    Qb=st.Q[bc] + pb.len2[i], Tc=zero, Qc=zero), s0, s1, s2, s3

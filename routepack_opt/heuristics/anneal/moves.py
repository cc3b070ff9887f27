"""The moves of the annealer, one function per kind, and the Metropolis loop that proposes them.

Every move keeps every constraint (capacity C, nonempty cells, and with equal samples per slot
N/D samples in each slot):

- *relocate* sample i to another cell (only if i's cell keeps ≥ 1 sample and the target stays
  ≤ capacity). Target first (:func:`pick_target_first`): a uniform *open* cell c (one with room
  for the shortest sample; the open cells are kept in a set updated in O(1) per accepted move),
  then i uniform among the samples no longer than c's free capacity (a table of counts by
  length). With equal samples per slot a relocation keeps i in its slot
  (:func:`target_in_slot`): i first (uniform, or guided), then the first other row of i's slot
  with room, from a uniform start;
- *swap* two samples of different cells (both cells stay ≤ capacity; counts unchanged). The
  partner j is uniform among the samples with length in [l_i, l_i + free capacity of i's cell]
  — exactly the swaps that fit, each pair one way round — and, with probability ``p_near``,
  also among the ``window`` nearest in length order (:func:`fitting_partner`). A guided
  sample's near partner is any of the ``window`` neighbours either side, shorter ones too,
  capacity checked (:func:`near_partner`);
- *guided*: with probability ``p_guide`` the moved sample comes from the bottleneck
  (:func:`pick_guided`) — for ``max-sum`` the shard with the largest Σ_r J (its rows weighted by
  J[r, g*]); for ``sum-max`` a row drawn with probability ∝ max_g J[r, g], then that row's argmax
  shard; then, with probability ``p_guide_cell``, the block's costliest cell at the first
  attention stage (the one that sets its attention term), else a uniform cell of that block, and
  a uniform member of it. A guided relocation tries
  up to 8 random targets with room (:func:`guided_target`).

- *row window* (large windows only, :func:`row_window`): rows are interchangeable in the cost, so
  a replica spends stretches of proposals inside a circular window of ``w`` consecutive rows
  (drawn from its own stream) whose blocks and samples fit in the processor's cache: every
  unguided move then keeps its samples and targets inside the window, by redrawing (up to
  WINDOW_TRIES times, else the proposal is dropped); guided moves stay global, so the bottleneck
  is always reachable. Off (w = R) the moves are exactly those above, draw for draw.

A proposal's cost change comes from :func:`~routepack_opt.heuristics.anneal.kernels.move_delta`
and an accepted one is applied by :func:`~routepack_opt.heuristics.anneal.state.apply_move`.

The random state lives in four registers (s0..s3) that every function taking it returns updated;
the order of the draws is part of the result (same seed, same moves, bit-identical layouts).
"""

from __future__ import annotations

import math
from collections import namedtuple

import numpy as np
from numba import njit, prange

from routepack_opt.heuristics.anneal.config import AnnealConfig
from routepack_opt.heuristics.anneal.kernels import aggregates, move_delta
from routepack_opt.heuristics.anneal.rng import below, unit, xo
from routepack_opt.heuristics.anneal.state import (
    LOG_SIZE,
    Population,
    State,
    Walk,
    apply_move,
    replica_state,
    replica_walk,
    scratch,
)

__all__ = ["Moves", "moves_of", "row_window", "in_window", "weighted_row",
           "sample_in_window", "pick_guided", "pick_target_first", "near_partner",
           "fitting_partner", "target_in_slot", "guided_target", "propose_swap",
           "propose_relocation", "save_best", "run_replica", "run_population", "run", "run_one"]

# The move mix (from AnnealConfig) as the compiled loop reads it.
Moves = namedtuple("Moves", (
    "p_swap",   # float: probability a proposal is a swap (else a relocation)
    "p_guide",  # float: probability the moved sample comes from the bottleneck
    "p_near",   # float: probability a swap partner is a length neighbour
    "window",   # int: length-order neighbourhood (samples each side) of near swaps
    "rows",     # int: rows w of a row window (≥ R: no window; see row_window)
    "stay",     # int: proposals a replica makes in one row window before drawing the next
    "wide",     # int: ``window`` of near swaps inside a row window (widened by R/w)
    "p_cell",   # float: probability a guided sample comes from its block's costliest attention cell
))


GUIDE_SCAN_ROWS = 64  # guided rows: prefix sums up to this many rows, rejection past it
GUIDE_TRIES = 16  # rejection draws of a guided move's row (expected ~1.1–1.5; see pick_guided)
WINDOW_TRIES = 32  # draws of a sample, partner or cell inside the row window before giving up


def row_window(inst, cfg: AnnealConfig) -> tuple[int, int]:
    """(rows w of a row window, proposals per window) for ``inst`` under ``cfg``.

    A proposal reads the rows of b of one or two random samples and the expert loads W of two
    random blocks. Once b and a replica's W outgrow the cache (b alone is 25 MB at N = 32,768,
    L = 48, P = 8), most proposals wait on memory: the cost per proposal nearly doubled from
    N = 4,096 to 32,768 (experiments/results/bench_latency). A window holds the rows whose
    share of b (N/R samples a row) and of W (G blocks a row) fits ``cfg.window_bytes``; it is
    at least 2 rows (a relocation in equal-count mode needs another row of its slot) and off
    (w = R) when the whole instance fits, so small windows search exactly as before. A replica
    stays ``cfg.window_sweeps`` sweeps of the window's own samples in it, so that the samples
    it loaded are read again before it moves on.

    Measured (experiments/results/bench_window, default budget, N = 16,384 and 32,768, D = 32 to
    512, two seeds): no plan worse by more than 0.004 %, eight of ten better by 0.02–0.15 %
    (unguided moves concentrated in a window intensify the local search), and at N = 32,768,
    D = 128 the ladder about 10 % faster (0.91× the cost per proposal, interleaved in one
    process; 0.97× at 16,384 on D = 512). Windows that also confined the
    guided moves were faster still but lost 0.06 % at equal time: they could not reach the
    bottleneck outside the window."""
    R = inst.R
    if cfg.window_bytes == 0 or R < 3:
        return R, 0
    b_row = inst.b.shape[1] * inst.b.itemsize  # one sample's loads
    w_row = inst.L * inst.Pp * np.dtype(inst.wdtype).itemsize  # one block's loads
    per_row = (inst.N / R) * b_row + inst.G * w_row
    w = max(2, int(cfg.window_bytes // per_row))
    if w >= R:
        return R, 0
    return w, max(1, int(round(cfg.window_sweeps * inst.N * w / R)))


def moves_of(cfg: AnnealConfig, inst) -> Moves:
    """The move mix of ``cfg`` and its row window on ``inst``."""
    w, stay = row_window(inst, cfg)
    # in a row window of w of R rows, 1 sample in R/w is a member: the near-swap neighbourhood
    # widens by that factor so it still holds ~swap_window members each side
    wide = cfg.swap_window if stay == 0 else cfg.swap_window * -(-inst.R // w)
    return Moves(p_swap=cfg.p_swap, p_guide=cfg.p_guide, p_near=cfg.p_near, window=cfg.swap_window,
                 rows=w, stay=stay, wide=wide, p_cell=cfg.p_guide_cell)


@njit(cache=True, _nrt=False, inline='always')
def in_window(r, r0, w, R):
    """Row r lies in the circular window of w rows from r0."""
    d = r - r0
    d += R if d < 0 else 0
    return d < w


@njit(cache=True, _nrt=False, inline='always')
def sample_in_window(s0, s1, s2, s3, st, pb, r0, w):
    """A uniform sample of the window's rows (by redrawing a uniform sample); −1: none found."""
    for _t in range(WINDOW_TRIES):
        x, s0, s1, s2, s3 = xo(s0, s1, s2, s3)
        i = below(x, pb.N)
        if in_window(np.int64(st.row[i]), r0, w, pb.R):
            return i, s0, s1, s2, s3
    return -1, s0, s1, s2, s3


@njit(cache=True, _nrt=False, inline='always')
def weighted_row(s0, s1, s2, s3, w, off, stride, R, total, peak):
    """A row r drawn with probability ∝ w[off + r·stride] (weights summing to ``total``, none
    above ``peak``). Up to GUIDE_SCAN_ROWS rows by the prefix sums (the first r whose prefix
    reaches u, counted branch-free); past that by rejection, O(1) expected draws instead of
    O(R): a uniform row is kept with probability weight / peak, up to GUIDE_TRIES draws, else
    the last one."""
    rs = 0
    if R <= GUIDE_SCAN_ROWS:
        x, s0, s1, s2, s3 = xo(s0, s1, s2, s3)
        u = unit(x) * total
        acc = 0.0
        for r in range(R):
            acc += w[off + r * stride]
            rs += 1 if acc < u else 0
        return min(rs, R - 1), s0, s1, s2, s3
    for _t in range(GUIDE_TRIES):
        x, s0, s1, s2, s3 = xo(s0, s1, s2, s3)
        rs = below(x, R)
        x, s0, s1, s2, s3 = xo(s0, s1, s2, s3)
        if unit(x) * peak <= w[off + rs * stride]:
            break
    return rs, s0, s1, s2, s3


@njit(cache=True, _nrt=False, inline='always')
def pick_guided(s0, s1, s2, s3, st, pb, p_cell):
    """A sample of the bottleneck block (cells are never empty) and the new RNG state (never
    confined to a row window: the bottleneck may lie anywhere)."""
    J, R, D, G, P = st.J, pb.R, pb.D, pb.G, pb.P
    # The row r is drawn (weighted_row) with probability ∝ J[r, g*] of the shard g* with the
    # largest Σ_r J (max-sum), or ∝ max_g J[r, g] (sum-max); every weight is ≤ the peak J.
    if pb.objective == 0:
        gs = 0
        best = st.colsum[0]
        for g in range(1, G):  # branch-free argmax (as branches they mispredicted)
            v = st.colsum[g]
            gs = g if v > best else gs
            best = max(best, v)
        # best = colsum[gs] = Σ_r J[r, gs]
        rs, s0, s1, s2, s3 = weighted_row(s0, s1, s2, s3, J, gs, G, R, best, st.agg[2])
    else:
        # the makespan agg[0] = Σ_r rowmax[r]
        rs, s0, s1, s2, s3 = weighted_row(s0, s1, s2, s3, st.rowmax, 0, 1, R, st.agg[0], st.agg[2])
        o = rs * G
        gs = 0
        best = J[o]
        for g in range(1, G):
            v = J[o + g]
            gs = g if v > best else gs
            best = max(best, v)
    # internal slots are shard-major (slot g·P + j): the shard's cells are contiguous
    x, s0, s1, s2, s3 = xo(s0, s1, s2, s3)
    c = rs * D + gs * P + below(x, P)
    if p_cell > 0.0:  # the cell whose first-stage cost sets the block's attention term
        x, s0, s1, s2, s3 = xo(s0, s1, s2, s3)
        if unit(x) < p_cell:
            c = np.int64(st.At[(rs * G + gs) * pb.alpha.shape[0] * 3 + 1])
    x, s0, s1, s2, s3 = xo(s0, s1, s2, s3)
    return np.int64(st.memb[below(x, st.cnt[c]) * (R * D) + c]), s0, s1, s2, s3


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
def propose_swap(s0, s1, s2, s3, st, pb, mv, i, a, guided, r0, w):
    """A swap of i (in cell a) with a partner: (j, its cell, row and slot, Ta, Qa, Tb, Qb) —
    the two cells' token sums after it — or j = −1 (no partner, same cell, or over capacity)."""
    near = False
    if mv.p_near > 0.0:
        x, s0, s1, s2, s3 = xo(s0, s1, s2, s3)
        near = unit(x) <= mv.p_near
    if near and guided:
        j, s0, s1, s2, s3 = near_partner(s0, s1, s2, s3, pb, mv, i)
    else:
        j, s0, s1, s2, s3 = fitting_partner(s0, s1, s2, s3, st, pb, mv, i, a, near, r0, w)
    zero = np.int64(0)
    if j < 0:
        return -1, -1, -1, -1, zero, zero, zero, zero, s0, s1, s2, s3
    rb = np.int64(st.row[j])
    db = np.int64(st.slot[j])
    bc = rb * pb.D + db
    if bc == a:
        return -1, -1, -1, -1, zero, zero, zero, zero, s0, s1, s2, s3
    li = pb.lengths[i]
    lj = pb.lengths[j]
    Ta = st.T[a] - li + lj
    Tb = st.T[bc] - lj + li
    if Ta > pb.C or Tb > pb.C:
        return -1, -1, -1, -1, zero, zero, zero, zero, s0, s1, s2, s3
    Qa = st.Q[a] - pb.len2[i] + pb.len2[j]
    Qb = st.Q[bc] - pb.len2[j] + pb.len2[i]
    return j, bc, rb, db, Ta, Qa, Tb, Qb, s0, s1, s2, s3


@njit(cache=True, _nrt=False, inline='always')
def propose_relocation(s0, s1, s2, s3, st, pb, i, a, ra, da, bc, r0, w):
    """A relocation of i out of cell a = (ra, da) to ``bc`` (when the target came first) or to
    a target drawn here (equal counts: :func:`target_in_slot`; guided: :func:`guided_target`):
    (target cell, its row and slot, Ta, Qa, Tb, Qb), or target −1 (a would empty, or no
    room)."""
    zero = np.int64(0)
    li = pb.lengths[i]
    if st.cnt[a] < 2 or bc == a:
        return -1, -1, -1, zero, zero, zero, zero, s0, s1, s2, s3
    if pb.eq:
        bc, s0, s1, s2, s3 = target_in_slot(s0, s1, s2, s3, st, pb, ra, da, li, r0, w)
    elif bc < 0:
        bc, s0, s1, s2, s3 = guided_target(s0, s1, s2, s3, st, pb, a, li)  # guided: no window
    if bc < 0:
        return -1, -1, -1, zero, zero, zero, zero, s0, s1, s2, s3
    rb = bc // pb.D
    return (bc, rb, bc - rb * pb.D, st.T[a] - li, st.Q[a] - pb.len2[i], st.T[bc] + li,
            st.Q[bc] + pb.len2[i], s0, s1, s2, s3)


@njit(cache=True, _nrt=False)
def save_best(st, wk, log, n_log):
    """wk.best_row/best_slot = the current layout with the last ``n_log`` logged moves undone
    (latest first, so a sample moved twice gets its oldest place back)."""
    for t in range(st.row.shape[0]):
        wk.best_row[t] = st.row[t]
        wk.best_slot[t] = st.slot[t]
    for k in range(n_log - 1, -1, -1):
        wk.best_row[log[k, 0]] = log[k, 1]
        wk.best_slot[log[k, 0]] = log[k, 2]


@njit(cache=True, _nrt=False)
def run_replica(n_moves, temp, mv, pb, st, wk, sc):
    """``n_moves`` Metropolis proposals at temperature ``temp`` for one replica (state ``st``,
    walk ``wk``, scratch ``sc``; see :mod:`routepack_opt.heuristics.anneal.state`).

    ``wk.probe`` (length > 0): record |ΔE| of each evaluated proposal there and accept nothing
    (used to scale the ladder). ``wk.last`` = the deltas of the last evaluated proposal (checked
    by the tests against the evaluator).

    Compiled without numba's reference counting (``_nrt=False``, as are its callees): the
    atomic increments and decrements of array arguments crossing the helpers took about a
    quarter of the time per move. Hence no allocation or array slicing here. The small helpers
    are inlined by numba (``inline='always'``; LLVM left them as calls, each passing every array
    argument as a 7-word struct); the expert kernels stay calls (inlining them was slower)."""
    N = pb.N
    nprobe = wk.probe.shape[0]
    at_best = False  # the current state is the best seen and not yet written out
    logging = False  # the best state is the current one with sc.log[:n_log] undone
    n_log = 0
    # RNG state, counters and the last deltas live in locals (stores to arrays would force
    # reloads: numba gives LLVM no aliasing information); written back at the end.
    s0 = wk.rng[0]
    s1 = wk.rng[1]
    s2 = wk.rng[2]
    s3 = wk.rng[3]
    n_eval = wk.counters[0]
    n_acc = wk.counters[1]
    n_probe = wk.counters[2]
    n_prop = wk.counters[3]
    l0 = wk.last[0]
    l1 = wk.last[1]
    l2 = wk.last[2]
    w = min(mv.rows, pb.R)  # the row window (w = R: none)
    win = w < pb.R
    r0 = 0
    left = 0  # proposals left in the current row window
    for _ in range(n_moves):
        n_prop += 1
        if win:
            if left == 0:  # the next row window, from this replica's stream
                x, s0, s1, s2, s3 = xo(s0, s1, s2, s3)
                r0 = below(x, pb.R)
                left = mv.stay
            left -= 1
        # --- propose: the sample i, the kind of move, the partner or target ---------------------
        i = -1
        guided = False
        if mv.p_guide > 0.0:
            x, s0, s1, s2, s3 = xo(s0, s1, s2, s3)
            guided = unit(x) <= mv.p_guide
            if guided:
                i, s0, s1, s2, s3 = pick_guided(s0, s1, s2, s3, st, pb, mv.p_cell)
        x, s0, s1, s2, s3 = xo(s0, s1, s2, s3)
        swap = unit(x) <= mv.p_swap
        bc = -1
        if i < 0:
            if swap or pb.eq:
                if win:
                    i, s0, s1, s2, s3 = sample_in_window(s0, s1, s2, s3, st, pb, r0, w)
                    if i < 0:
                        continue
                else:
                    x, s0, s1, s2, s3 = xo(s0, s1, s2, s3)
                    i = below(x, N)
            else:
                i, bc, s0, s1, s2, s3 = pick_target_first(s0, s1, s2, s3, st, pb, r0, w)
                if i < 0:
                    continue
        ra = np.int64(st.row[i])
        da = np.int64(st.slot[i])
        a = ra * pb.D + da
        wm = pb.R if guided else w  # guided moves are never confined to the row window
        if swap:
            j, bc, rb, db, Ta, Qa, Tb, Qb, s0, s1, s2, s3 = propose_swap(s0, s1, s2, s3, st, pb,
                                                                         mv, i, a, guided, r0, wm)
            if j < 0:
                continue
        else:
            j = N  # the zero row: a relocation is evaluated as a swap with it
            bc, rb, db, Ta, Qa, Tb, Qb, s0, s1, s2, s3 = propose_relocation(s0, s1, s2, s3, st,
                                                                            pb, i, a, ra, da, bc,
                                                                            r0, wm)
            if bc < 0:
                continue
        ga = np.int64(pb.shard_D[da])
        gb = np.int64(pb.shard_D[db])
        # --- evaluate ------------------------------------------------------------------------
        n_eval += 1
        dms, dtot, dpk, JA, JB, MA, MB = move_delta(st, pb, sc, i, j, a, ra, ga, Ta, Qa,
                                                    bc, rb, gb, Tb, Qb)
        dE = dms + pb.eps1 * dtot + pb.eps2 * dpk
        l0 = dms
        l1 = dtot
        l2 = dpk
        if nprobe > 0:
            if n_probe < nprobe:
                wk.probe[n_probe] = abs(dE)
                n_probe += 1
            continue
        # --- Metropolis ----------------------------------------------------------------------
        if dE > 0.0:
            x, s0, s1, s2, s3 = xo(s0, s1, s2, s3)
            if dE > -temp * math.log(unit(x)):
                continue
        n_acc += 1
        if at_best and not dE < -1e-12 * abs(st.agg[3]):
            # leaving the best state seen (or not clearly improving on it): from here on log
            # what each move overwrites, so the best state is the current one undone
            at_best = False
            logging = True
            n_log = 0
        if logging:
            if n_log + 2 > sc.log.shape[0]:  # log full: write the best state out now
                save_best(st, wk, sc.log, n_log)
                logging = False
            else:
                sc.log[n_log, 0] = i
                sc.log[n_log, 1] = st.row[i]
                sc.log[n_log, 2] = st.slot[i]
                n_log += 1
                if swap:
                    sc.log[n_log, 0] = j
                    sc.log[n_log, 1] = st.row[j]
                    sc.log[n_log, 2] = st.slot[j]
                    n_log += 1
        apply_move(st, pb, sc, i, j, swap, a, bc, ra, ga, da, rb, gb, db, Ta, Qa, Tb, Qb,
                   JA, JB, MA, MB, dtot)
        if st.agg[3] < wk.best_e[0]:
            wk.best_e[0] = st.agg[3]
            at_best = True  # written out at the end, or logged from when the walk leaves it
            logging = False
    if at_best:
        save_best(st, wk, sc.log, 0)
    elif logging:
        save_best(st, wk, sc.log, n_log)
    wk.rng[0] = s0
    wk.rng[1] = s1
    wk.rng[2] = s2
    wk.rng[3] = s3
    wk.counters[0] = n_eval
    wk.counters[1] = n_acc
    wk.counters[2] = n_probe
    wk.counters[3] = n_prop
    wk.last[0] = l0
    wk.last[1] = l1
    wk.last[2] = l2


@njit(cache=True, parallel=True)
def run_population(n_moves, temp, mv, pb, S, V):
    """All replicas in parallel (each one's stream and state are its own)."""
    for k in prange(S.row.shape[0]):
        st = replica_state(S, k)
        aggregates(st, pb)  # the carried sums, exact again (see kernels.update_aggregates)
        run_replica(n_moves, temp, mv, pb, st, replica_walk(V, k), scratch(pb.L, st.W))


def run(pop: Population, n_moves: int, temp: float, cfg: AnnealConfig, probe=None) -> None:
    """``n_moves`` proposals per replica at ``temp`` (``probe`` [K, n]: record |ΔE|, accept
    nothing)."""
    walk = pop.walk if probe is None else pop.walk._replace(probe=probe)
    run_population(n_moves, temp, moves_of(cfg, pop.inst), pop.inst.problem, pop.state, walk)


def run_one(pop: Population, n_moves: int, temp: float, cfg: AnnealConfig, k: int = 0,
            log_size: int = LOG_SIZE) -> None:
    """Replica k alone, serially (no thread launch): for tests stepping one move at a time
    (``log_size``: entries of the undo log that keeps the best state)."""
    st = State(**{f: a[k] for f, a in pop.state._asdict().items()})
    wk = Walk(**{f: a[k:k + 1] if f == "best_e" else a[k] for f, a in pop.walk._asdict().items()})
    aggregates(st, pop.inst.problem)
    run_replica(n_moves, temp, moves_of(cfg, pop.inst), pop.inst.problem, st, wk,
                scratch(pop.inst.L, st.W, log_size))

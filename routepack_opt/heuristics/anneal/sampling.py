"""How a move picks its sample, shared by the move kinds (:mod:`.move_swap`,
:mod:`.move_relocate`, :mod:`.move_rotate`), and the move mix (:class:`Moves`) the compiled loop
reads.

- *guided*: with probability ``p_guide`` the moved sample comes from the bottleneck
  (:func:`pick_guided`) — for ``max-sum`` the shard with the largest Σ_r J (its rows weighted by
  J[r, g*]); for ``sum-max`` a row drawn with probability ∝ max_g J[r, g], then that row's argmax
  shard; then, with probability ``p_guide_cell``, the block's costliest cell at the first
  attention stage (the one that sets its attention term), else a uniform cell of that block, and
  a uniform member of it.
- *row window* (large windows only, :func:`row_window`): rows are interchangeable in the cost, so
  a replica spends stretches of proposals inside a circular window of ``w`` consecutive rows
  (drawn from its own stream) whose blocks and samples fit in the processor's cache: every
  unguided move then keeps its samples and targets inside the window, by redrawing (up to
  WINDOW_TRIES times, else the proposal is dropped); guided moves stay global, so the bottleneck
  is always reachable. Off (w = R) the moves are exactly those without it, draw for draw.

The random state lives in four registers (s0..s3) that every function taking it returns updated;
the order of the draws is part of the result (same seed, same moves, bit-identical layouts).
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit

from routepack_opt.core.cost_kernel import is_max_sum
from routepack_opt.heuristics.anneal.config import AnnealConfig
from routepack_opt.heuristics.anneal.rng import below, unit, xo

__all__ = ["Moves", "moves_of", "row_window", "in_window", "weighted_row", "sample_in_window",
           "pick_guided", "GUIDE_SCAN_ROWS", "GUIDE_TRIES", "WINDOW_TRIES"]

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
    "p_rotate",  # float: probability a proposal is a three-sample rotation (move_rotate; 0: never drawn)
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
                 rows=w, stay=stay, wide=wide, p_cell=cfg.p_guide_cell,
                 p_rotate=cfg.p_rotate)


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
    if is_max_sum(pb.objective):
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

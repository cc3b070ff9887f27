"""Layouts with equal sample counts per DP slot (``Topology.equal_samples_per_slot``).

Legend: N samples, D DP slots, R rows, C token cap, m = N / D samples per slot, cell = (row, slot).

An equal-count layout with R rows exists iff the samples split into D groups of m samples, each
packable into R nonempty bins of capacity C (m ≥ R, so a group packed into ≤ R bins can always
be spread over exactly R: a lone sample fits any bin). Constructions, tried in order (the first
that succeeds wins; all length-only):

- ``kk``: verl's split — Karmarkar–Karp over slots with equal sizes (verl's ``equal_size``, exact
  sizes since D divides N), then each slot's m samples into R cells by KK, overfull cells
  repaired by moves and swaps *inside the slot*, else the slot is bin-packed into R bins
  (FFD/BFD, then the caller's exact packer, e.g. :func:`routepack_opt.certify.pack_into_bins`);
- ``count-ffd`` / ``count-bfd``: first-/best-fit decreasing over all R·D cells where a slot
  takes no more than m samples (Johnson 1973's FFD with a cardinality limit per slot group),
  then empty cells of a slot take a lone sample from the slot's fullest cells.

:func:`equal_count_layout` returns the first success or raises :class:`InfeasibleError`
(which does not prove infeasibility: :func:`routepack_opt.certify.certify_rows` does that).
"""

from __future__ import annotations

import time

import numpy as np

from routepack_opt.core.errors import BinPackUndecided, InfeasibleError, InputError
from routepack_opt.core.topology import Topology
from routepack_opt.heuristics.cells import check_layout, kk_partition, order_rows, prepare_lengths, repair_capacity

__all__ = ["equal_count_layout", "equal_counts_ok", "count_fit_decreasing"]


def equal_counts_ok(slot_N, dp: int) -> bool:
    """Whether every one of the ``dp`` slots holds the same number of samples."""
    per_D = np.bincount(np.asarray(slot_N, dtype=np.int64), minlength=dp)
    return bool((per_D == per_D[0]).all())


def _spread_in_slot(len_N, row_N, R: int) -> bool:
    """Make every one of the R cells of one slot nonempty (``row_N`` of the slot's samples, in
    place): empty cells take the shortest sample of a cell holding two or more (a lone sample
    always fits). Needs ≥ R samples."""
    cnt = np.bincount(row_N, minlength=R)
    for i in np.argsort(len_N, kind="stable"):
        empty = np.flatnonzero(cnt == 0)
        if empty.size == 0:
            return True
        if cnt[row_N[i]] >= 2:
            cnt[row_N[i]] -= 1
            row_N[i] = empty[0]
            cnt[empty[0]] += 1
    return bool((cnt > 0).all())


def _pack_slot(len_g, R: int, C: int, deadline: float, exact_pack) -> np.ndarray | None:
    """The R-cell rows of one slot's samples: KK, in-slot repair, else a bin packing by
    ``exact_pack`` (see :data:`routepack_opt.heuristics.baselines.ExactPacker`); None if none
    found or no packer given."""
    row = kk_partition(len_g, R, equal_size=False).astype(np.int64)
    if repair_capacity(len_g, row, R, 1, C, deadline):  # one slot: cells are its rows
        return row
    if exact_pack is None:
        return None
    try:
        bins = exact_pack(len_g, C, R, max(0.05, deadline - time.perf_counter()))
    except BinPackUndecided:
        return None
    if bins is None:
        return None
    _, row = np.unique(bins, return_inverse=True)
    row = row.astype(np.int64)
    return row if _spread_in_slot(len_g, row, R) else None


def _kk_groups(len_N, R: int, D: int, C: int, deadline: float, exact_pack):
    slot_N = kk_partition(len_N, D, equal_size=True).astype(np.int64)
    row_N = np.empty_like(slot_N)
    for d in range(D):
        idx = np.flatnonzero(slot_N == d)
        row = _pack_slot(len_N[idx], R, C, deadline, exact_pack)
        if row is None:
            return None
        row_N[idx] = row
    return row_N, slot_N


def count_fit_decreasing(len_N, R: int, D: int, C: int, best: bool = False):
    """First-fit (``best``: best-fit) decreasing over R·D cells (cell c = r·D + d, so first fit
    deals rows round the slots) with at most m = N / D samples per slot; then each slot's empty
    cells are filled from its fuller ones. (row_N, slot_N) or None when a sample finds no cell."""
    N = len_N.size
    m = N // D
    free = np.full(R * D, C, dtype=np.int64)
    per_D = np.zeros(D, dtype=np.int64)
    slot_of = np.arange(R * D) % D
    cell_N = np.empty(N, dtype=np.int64)
    for i in np.argsort(-len_N, kind="stable"):
        ok = (free >= len_N[i]) & (per_D[slot_of] < m)
        cand = np.flatnonzero(ok)
        if cand.size == 0:
            return None
        c = int(cand[np.argmin(free[cand] - len_N[i])]) if best else int(cand[0])
        free[c] -= len_N[i]
        per_D[slot_of[c]] += 1
        cell_N[i] = c
    row_N, slot_N = cell_N // D, cell_N % D
    for d in range(D):
        idx = np.flatnonzero(slot_N == d)
        row = row_N[idx].copy()
        if not _spread_in_slot(len_N[idx], row, R):
            return None
        row_N[idx] = row
    return row_N, slot_N


def equal_count_layout(lengths, topology: Topology, rows: int, time_limit: float = 10.0,
                       info: dict | None = None, *, exact_pack=None) -> tuple[np.ndarray, np.ndarray]:
    """A layout at exactly ``rows`` rows with N / D samples in every slot (module docstring).
    ``info["construction"]`` names the construction that succeeded. InputError when N % D != 0;
    InfeasibleError when no construction succeeds (not a proof). ``exact_pack``: the exact
    packing of a slot whose KK split breaks the cap (see
    :data:`routepack_opt.heuristics.baselines.ExactPacker`); without it that slot fails the
    ``kk`` construction."""
    len_N, R, D, C = prepare_lengths(lengths, topology, rows)
    N = len_N.size
    if N % D:
        raise InputError(f"equal samples per slot: N={N} samples do not divide over D={D} slots")
    if R > N // D:
        raise InfeasibleError(f"{R} rows need ≥ {R} samples per slot; each slot holds N/D = {N // D}")
    info = {} if info is None else info
    deadline = time.perf_counter() + time_limit
    tries = (("kk", lambda: _kk_groups(len_N, R, D, C, deadline, exact_pack)),
             ("count-ffd", lambda: count_fit_decreasing(len_N, R, D, C)),
             ("count-bfd", lambda: count_fit_decreasing(len_N, R, D, C, best=True)))
    for name, build in tries:
        got = build()
        if got is not None and check_layout(len_N, got[0], got[1], R, D, C) and equal_counts_ok(got[1], D):
            info["construction"] = name
            return order_rows(len_N, got[0], got[1], R, D)
    raise InfeasibleError(f"no equal-count layout with {R} rows found by KK, count-FFD or count-BFD "
                          f"(N={N}, D={D}, capacity {C})")

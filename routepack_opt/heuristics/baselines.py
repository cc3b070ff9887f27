"""Length-only packing baselines at exactly R rows (docs/pipeline.md, "Baselines").

Legend: N samples, D DP slots, R rows (micro-batches per slot), C token cap of a micro-batch,
cell = (row, slot). A layout is ``(row_N, slot_N)``.

Two baselines in the style of today's RL frameworks; both look at lengths only:

- ``verl-kk`` — verl's sequence balancing: Karmarkar–Karp largest differencing (Karmarkar & Karp
  1982; the k-way form of verl's ``get_seqlen_balanced_partitions``) of token counts over the D
  slots with equal sample counts where possible (verl's ``equal_size``), then over the R
  micro-batches inside each slot (``equal_size=False``). verl treats the token cap as a target;
  here it is strict: overfull cells are repaired by moving and swapping samples, and where that
  fails, cap-feasible cells (bin packing) are dealt to slots by equal-size KK.
- ``nemo-ffd`` — NeMo-RL's sequence packing: first-fit-decreasing bins of cap C (Johnson 1973);
  while there are fewer than R·D bins the heaviest bin is split in two; the bins are then dealt
  to slots, R per slot, balancing tokens (cardinality-constrained LPT, Graham 1969) or
  round-robin.

Inside every slot the micro-batches are ordered by decreasing tokens, so row r holds the r-th
largest micro-batch of every slot.

Both return a feasible layout whenever one exists (``binpack_opt(len, C) ≤ R·D ≤ N``): if the
greedy construction breaks the cap and moving or swapping samples cannot fix it, the last resort
packs into at most R·D bins (FFD/BFD, else the caller's exact packer ``exact_pack``, e.g.
:func:`routepack_opt.certify.pack_into_bins`; without one, InfeasibleError says so),
splits bins until there are exactly R·D nonempty cells and deals them to (row, slot).
:class:`InfeasibleError` when no layout exists.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable

import numpy as np

from routepack_opt.core.errors import BinPackUndecided, InfeasibleError, InputError
from routepack_opt.core.topology import Topology
from routepack_opt.heuristics.binpack import best_packing, first_fit_decreasing
from routepack_opt.heuristics.cells import check_layout, kk_partition, order_rows, prepare_lengths, repair_capacity
from routepack_opt.heuristics.equal_counts import equal_count_layout
from routepack_opt.heuristics.placement.lpt import lpt_assign

__all__ = ["verl_kk_layout", "nemo_ffd_layout", "BASELINES", "ExactPacker"]

# An exact packer into at most ``num_bins`` bins: ``exact_pack(sizes, capacity, num_bins,
# time_limit)`` returns a bin id per item, None when proved impossible, and raises
# BinPackUndecided when undecided in time. The certifier's
# :func:`routepack_opt.certify.pack_into_bins` is one; it sits above the heuristics (it runs the
# exact models), so callers pass it in rather than the baselines importing it.
ExactPacker = Callable[[np.ndarray, int, int, float], "np.ndarray | None"]


def _split_until(len_N, bin_N, num_cells: int) -> np.ndarray:
    """Relabel a packing's nonempty bins 0..B-1 and split the heaviest multi-sample bin in two
    (LPT over two halves) until there are exactly ``num_cells`` bins. Needs N ≥ num_cells.
    Vectorised up to the splits: a bin's members (by decreasing length, ties by index) are
    listed only when it is split, so a packing that already has ``num_cells`` bins costs a few
    O(N log N) passes (at N = 10^6 the per-sample Python loop was over a second)."""
    bin_N = np.asarray(bin_N).reshape(-1)
    if bin_N.size and bin_N.dtype.kind in "iu" and bin_N.min() >= 0 and bin_N.max() < 4 * bin_N.size + 16:
        # bin ids are small (a packer's 0..B-1): relabel by counting, no sort (np.unique's labels)
        present = np.bincount(bin_N) > 0
        bin_N = (np.cumsum(present) - 1)[bin_N].astype(np.int64)
    else:
        _, bin_N = np.unique(bin_N, return_inverse=True)
        bin_N = bin_N.astype(np.int64).reshape(-1)
    B = int(bin_N.max()) + 1
    if B >= num_cells:
        return bin_N
    order = np.argsort(-len_N, kind="stable")  # members listed by decreasing length
    by_bin = order[np.argsort(bin_N[order], kind="stable")]
    starts = np.searchsorted(bin_N[by_bin], np.arange(B + 1))
    members: list[list[int] | None] = [None] * B  # filled when first split
    tokens = np.bincount(bin_N, weights=len_N, minlength=B)
    multi = np.flatnonzero(np.diff(starts) > 1)
    heap = list(zip(-tokens[multi], multi.tolist()))  # numpy floats, as before: the same order
    heapq.heapify(heap)
    while B < num_cells:
        _, b = heapq.heappop(heap)
        mem = members[b]
        if mem is None:
            mem = by_bin[starts[b]:starts[b + 1]].tolist()
        half: list[list[int]] = [[], []]
        load = [0, 0]
        for i in mem:
            side = 0 if load[0] <= load[1] else 1
            half[side].append(i)
            load[side] += int(len_N[i])
        members[b] = half[0]
        members.append(half[1])
        bin_N[half[1]] = B
        for bb, h, t in ((b, half[0], load[0]), (B, half[1], load[1])):
            if len(h) > 1:
                heapq.heappush(heap, (-t, bb))
        B += 1
    return bin_N


def _deal(len_N, cell_N, R: int, D: int, deal: str) -> tuple[np.ndarray, np.ndarray]:
    """Place R·D nonempty groups (``cell_N`` in 0..R·D-1) on (row, slot): R per slot, rows in
    decreasing tokens inside each slot. ``balanced``: cardinality-constrained LPT over slots;
    ``kk``: Karmarkar–Karp with equal sizes (verl's equal_size); ``round-robin``: groups by
    decreasing tokens, the j-th to slot j mod D."""
    K = R * D
    tokens = np.bincount(cell_N, weights=len_N, minlength=K)
    if deal == "balanced":
        slot_K, row_K = lpt_assign(tokens[None], D, R)
        slot_K, row_K = slot_K[0], row_K[0]
    elif deal == "kk":
        slot_K = kk_partition(tokens, D, equal_size=True)
        # rows: decreasing tokens inside each slot (ties by group id)
        order = np.lexsort((np.arange(K), -tokens, slot_K))
        row_K = np.empty(K, dtype=np.int64)
        row_K[order] = np.arange(K) % R
    elif deal == "round-robin":
        order = np.argsort(-tokens, kind="stable")
        slot_K = np.empty(K, dtype=np.int64)
        row_K = np.empty(K, dtype=np.int64)
        slot_K[order] = np.arange(K) % D
        row_K[order] = np.arange(K) // D
    else:
        raise InputError(f"deal must be 'balanced', 'kk' or 'round-robin', got {deal!r}")
    return row_K[cell_N], slot_K[cell_N]


def _pack_exact(len_N, C: int, num_bins: int, time_limit: float,
                exact_pack: ExactPacker | None) -> np.ndarray:
    """A packing into at most ``num_bins`` bins by ``exact_pack``, or InfeasibleError: proved
    impossible, undecided in time, or no exact packer given (each said so in the message)."""
    if exact_pack is None:
        raise InfeasibleError(f"FFD/BFD need more than {num_bins} bins of capacity {C} and no exact "
                              f"packer was given (exact_pack=routepack_opt.certify.pack_into_bins)")
    try:
        bins = exact_pack(len_N, C, num_bins, time_limit)
    except BinPackUndecided as exc:
        raise InfeasibleError(f"no packing into {num_bins} bins of capacity {C} found within "
                              f"{time_limit}s (undecided: {exc})") from None
    if bins is None:
        raise InfeasibleError(f"the samples do not fit in {num_bins} bins of capacity {C} (proved)")
    return np.asarray(bins, dtype=np.int64)


def _last_resort(len_N, R: int, D: int, C: int, deal: str, time_limit: float, info: dict,
                 exact_pack: ExactPacker | None):
    """FFD/BFD into ≤ R·D bins if they fit, else the exact packing; split to R·D cells; deal."""
    bin_N, used, how = best_packing(len_N, C)
    if used <= R * D:
        info["fallback"] = how
    else:
        info["fallback"] = "exact-binpack"
        bin_N = _pack_exact(len_N, C, R * D, time_limit, exact_pack)
    cell_N = _split_until(len_N, bin_N, R * D)
    return _deal(len_N, cell_N, R, D, deal)


def _finish(len_N, row_N, slot_N, R, D, C, deal, time_limit, info, exact_pack):
    """Make the layout strict on the cap (repair for up to half of ``time_limit``, then the last
    resort); order rows."""
    cell_N = row_N * D + slot_N
    t0 = time.perf_counter()
    if not repair_capacity(len_N, cell_N, R, D, C, t0 + 0.5 * time_limit):
        left = max(0.05, time_limit - (time.perf_counter() - t0))
        return _last_resort(len_N, R, D, C, deal, left, info, exact_pack)
    row_N, slot_N = order_rows(len_N, cell_N // D, cell_N % D, R, D)
    if not check_layout(len_N, row_N, slot_N, R, D, C):  # not reachable when repair succeeds
        return _last_resort(len_N, R, D, C, deal, time_limit, info, exact_pack)
    return row_N, slot_N


# ------------------------------------------------------------------ the baselines


def verl_kk_layout(lengths, topology: Topology, rows: int, time_limit: float = 10.0,
                   info: dict | None = None, *, exact_pack: ExactPacker | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """verl-style layout: KK over slots (equal sample counts where possible), then KK over the
    R micro-batches of each slot; overfull cells repaired by moves and swaps. If that fails
    (tight windows), cells come from a cap-feasible bin packing and are dealt to slots by KK
    with equal sizes (R each). ``time_limit`` bounds the exact packing; ``info`` (optional dict)
    receives ``fallback`` (``FFD``/``BFD``/``exact-binpack``) when the last resort was used;
    ``exact_pack`` (see :data:`ExactPacker`) is that last resort's exact packing."""
    if topology.equal_samples_per_slot:
        # verl's own split (KK, equal sizes), kept exact: repairs stay inside a slot
        return equal_count_layout(lengths, topology, rows, time_limit, info, exact_pack=exact_pack)
    len_N, R, D, C = prepare_lengths(lengths, topology, rows)
    info = {} if info is None else info
    slot_N = kk_partition(len_N, D, equal_size=True)
    row_N = np.empty_like(slot_N)
    by_slot = np.argsort(slot_N, kind="stable")
    starts = np.searchsorted(slot_N[by_slot], np.arange(D + 1))
    for d in range(D):
        idx = by_slot[starts[d]:starts[d + 1]]
        row_N[idx] = kk_partition(len_N[idx], R, equal_size=False)
    return _finish(len_N, row_N, slot_N, R, D, C, "kk", time_limit, info, exact_pack)


def nemo_ffd_layout(lengths, topology: Topology, rows: int, deal: str = "balanced",
                    time_limit: float = 10.0, info: dict | None = None, *,
                    exact_pack: ExactPacker | None = None) -> tuple[np.ndarray, np.ndarray]:
    """NeMo-RL-style layout: FFD bins of cap C, heaviest bins split until R·D, dealt R per slot
    (``deal``: ``balanced`` by tokens, or ``round-robin``). Splitting bins does not keep sample
    counts, so with ``equal_samples_per_slot`` it raises InfeasibleError (the seeds skip it)."""
    if topology.equal_samples_per_slot:
        raise InfeasibleError("nemo-ffd does not keep equal sample counts per slot")

    len_N, R, D, C = prepare_lengths(lengths, topology, rows)
    info = {} if info is None else info
    bin_N, used = first_fit_decreasing(len_N, C)
    if used > R * D:
        return _last_resort(len_N, R, D, C, deal, time_limit, info, exact_pack)
    cell_N = _split_until(len_N, bin_N, R * D)
    return _deal(len_N, cell_N, R, D, deal)


# name → layout(lengths, topology, rows, time_limit=...) -> (row_N, slot_N)
BASELINES: dict[str, Callable[..., tuple[np.ndarray, np.ndarray]]] = {
    "verl-kk": verl_kk_layout, "nemo-ffd": nemo_ffd_layout}

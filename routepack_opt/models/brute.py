"""Brute-force layout enumeration for tiny windows (N ≤ 8): the reference the exact models are
tested against.

It enumerates every set partition of the samples into exactly R·D nonempty cells that respect
the capacity (restricted-growth strings), then every assignment of those cells to the R × G
(row, shard) blocks, P cells to a block. Only the order of cells *inside* a block is skipped: a
block's attention cost is a max over its cells and its expert load a sum over them (docs/model.md), so
that order never changes ``J`` — a symmetry common to both objectives and independent of the
row/shard symmetry the models break. Every candidate is scored by the one evaluator; the best by
the lexicographic key wins (first found on ties).

With ``equal_samples_per_slot`` the order of cells inside a block does matter (it decides which
slot gets which cell's samples), so every order is enumerated and layouts whose slots hold
unequal counts are dropped.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from routepack_opt.core.bounds import check_sizes
from routepack_opt.core.errors import InputError
from routepack_opt.core.evaluate import Score
from routepack_opt.models.layout_common import LayoutInstance, prefeasibility

__all__ = ["brute_force_layout", "BruteResult", "set_partitions", "brute_force_bins"]


@dataclasses.dataclass(frozen=True)
class BruteResult:
    """The optimum by enumeration: score (evaluator), layout, and how many layouts were scored."""

    score: Score | None
    row: np.ndarray | None
    slot: np.ndarray | None
    count: int

    @property
    def objective(self) -> float | None:
        return None if self.score is None else self.score.makespan


def set_partitions(lengths_N, num_blocks: int, capacity: int):
    """Partitions of range(N) into exactly ``num_blocks`` nonempty blocks with token sums ≤
    capacity, as block-id arrays (restricted growth: block ids appear in first-use order)."""
    lengths = [int(v) for v in lengths_N]
    N = len(lengths)
    label = [0] * N
    load = [0] * num_blocks

    def rec(i, used):
        if N - i < num_blocks - used:  # not enough samples left to open the remaining blocks
            return
        if i == N:
            yield np.array(label, dtype=np.int64)
            return
        for b in range(min(used + 1, num_blocks)):
            if load[b] + lengths[i] > capacity:
                continue
            label[i] = b
            load[b] += lengths[i]
            yield from rec(i + 1, max(used, b + 1))
            load[b] -= lengths[i]

    yield from rec(0, 0)


def _block_assignments(num_cells: int, num_blocks: int, per_block: int):
    """Ways to deal cells 0..K-1 to ``num_blocks`` labelled blocks, ``per_block`` each, order
    inside a block ignored: yields a list of cell tuples per block."""
    def rec(remaining, k):
        if k == num_blocks:
            yield []
            return
        for combo in itertools.combinations(remaining, per_block):
            rest = [c for c in remaining if c not in combo]
            for tail in rec(rest, k + 1):
                yield [combo] + tail
    yield from rec(list(range(num_cells)), 0)


def brute_force_layout(inst: LayoutInstance, max_samples: int = 8, max_layouts: int = 2_000_000
                       ) -> BruteResult:
    """The lexicographic optimum of ``inst`` by enumeration (score from the evaluator)."""
    N = inst.num_samples
    if N > max_samples:
        raise InputError(f"brute force is for tiny windows: N={N} > {max_samples}")
    if prefeasibility(inst) is not None:
        return BruteResult(None, None, None, 0)
    topo = inst.topology
    R, D, G, P = inst.rows, topo.dp, topo.num_shards, topo.ep
    K = R * D
    blocks = [(r, g) for r in range(R) for g in range(G)]
    deals = list(_block_assignments(K, R * G, P))
    best_key, best, count = None, None, 0
    eq = topo.equal_samples_per_slot
    if eq and N % D:
        return BruteResult(None, None, None, 0)
    if eq:  # every order of the cells inside each block (module docstring)
        deals = [list(p) for deal in deals for p in itertools.product(
            *(itertools.permutations(cells) for cells in deal))]
    for part_N in set_partitions(inst.window.lengths, K, topo.capacity):
        for deal in deals:
            row_K = np.empty(K, dtype=np.int64)
            slot_K = np.empty(K, dtype=np.int64)
            for (r, g), cells in zip(blocks, deal):
                for j, c in enumerate(cells):
                    row_K[c], slot_K[c] = r, inst.slots_GP[g, j]
            row_N, slot_N = row_K[part_N], slot_K[part_N]
            if eq and (np.bincount(slot_N, minlength=D) != N // D).any():
                continue
            score = inst.score(row_N, slot_N)
            count += 1
            if count > max_layouts:
                raise InputError(f"brute force: more than {max_layouts} layouts; use a smaller case")
            if best_key is None or score.key < best_key:
                best_key, best = score.key, (score, row_N, slot_N)
    if best is None:
        return BruteResult(None, None, None, count)
    return BruteResult(best[0], best[1], best[2], count)


def brute_force_bins(sizes, capacity) -> int:
    """Least number of bins of ``capacity`` holding ``sizes``, by enumerating set partitions
    (items in decreasing order, equal bin loads tried once): the oracle for tiny bin-packing
    instances in tests."""
    sizes_N, capacity = check_sizes(sizes, capacity)
    s = sorted((int(x) for x in sizes_N), reverse=True)
    best = [len(s)]

    def rec(i, loads):
        if len(loads) >= best[0]:
            return
        if i == len(s):
            best[0] = len(loads)
            return
        seen = set()
        for b in range(len(loads)):
            if loads[b] + s[i] <= capacity and loads[b] not in seen:
                seen.add(loads[b])
                loads[b] += s[i]
                rec(i + 1, loads)
                loads[b] -= s[i]
        loads.append(s[i])
        rec(i + 1, loads)
        loads.pop()

    rec(0, [])
    return best[0] if s else 0

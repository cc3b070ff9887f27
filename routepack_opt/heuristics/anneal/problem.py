"""The constant data of one annealing instance: the caller's (window, placement via b_NLP,
topology, cost, rows, objective), checked once and laid out for the compiled kernels.

Legend: N samples, L layers, P EP ranks, Pp = 8·⌈P/8⌉ padded ranks, D DP slots, G = D/P shards,
R rows, S attention stages, C capacity (tokens per cell).

Two orders differ from the caller's, and :class:`Instance` maps layouts in and out:

- samples are numbered by length (stable): internal sample i is the caller's sample perm[i].
  Length neighbours are index neighbours (near swaps need no lookup table) and the samples that
  fit a free capacity s are 0 .. n_le[s] − 1;
- slots are shard-major: internal slot g·P + j is the j-th slot of shard g, so a shard's cells
  are contiguous (:func:`routepack_opt.heuristics.anneal.kernels.attn` vectorises).
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

from routepack_opt.core.cost import CostModel
from routepack_opt.core.errors import InputError
from routepack_opt.core.evaluate import row_shard_costs, score_from_J
from routepack_opt.core.objective import Objective, check_objective
from routepack_opt.core.topology import Topology

__all__ = ["Problem", "Instance"]

# Samples per block when the caller's loads are put in length order into b: the caller's loads
# come as int64 [N, L, P] (8·L·P bytes per sample, ~1 GB at N = 32,768, L = 58, P = 64), and a
# whole permuted copy of them was the planner's largest temporary.
_PERMUTE_BLOCK = 4096

# What the compiled kernels read, as one named tuple (numba resolves the attributes at compile
# time: no cost over separate arguments, and no argument order to get wrong).
Problem = namedtuple("Problem", (
    "lengths",    # [N] int64, ascending
    "len2",       # [N] int64, lengths²
    "b",          # [N + 1, Pp·L] int16/int32/int64: rank-major expert loads b[i, p·L + l]; row N is zero
    "shard_D",    # [D] int64: shard of each internal slot (= d // P)
    "n_le",       # [C + 1] int32: number of samples of length ≤ s
    "alpha",      # [S] float64: attention coefficient of Σ length per stage
    "beta",       # [S] float64: attention coefficient of Σ length² per stage
    "gamma",      # float: cost per token of the busiest rank, per layer
    "ovh",        # float: fixed cost per row and shard
    "N", "L", "P", "Pp", "D", "G", "R", "C",  # ints (see the legend)
    "cap",        # int: most samples one cell can ever hold (sizes the member lists)
    "objective",  # int: Objective.code (only core.cost_kernel.is_max_sum reads it)
    "eps1",       # float: η/(2G), weight of the total in the energy
    "eps2",       # float: η/2, weight of the peak in the energy
    "eq",         # bool: equal samples per slot (relocations stay in their slot)
))


class Instance:
    """One (window, placement, topology, cost, R, objective) instance: :attr:`problem` for the
    kernels (its fields are readable here as attributes too) and the maps between the caller's
    layouts and the internal ones. ``storage`` forces the (b, W) dtypes (see
    :func:`routepack_opt.heuristics.anneal.search.warm_storage`)."""

    def __init__(self, lengths_N, b_NLP, topology: Topology, cost: CostModel, rows: int,
                 objective: Objective, tie_eps: float, storage: tuple | None = None):
        objective = check_objective(objective)
        self.objective = objective
        lengths = np.ascontiguousarray(lengths_N, dtype=np.int64)
        if lengths.ndim != 1 or lengths.size == 0:
            raise InputError("anneal: lengths must be a non-empty 1-D array")
        b_NLP = np.asarray(b_NLP)
        N = lengths.size
        D, P, G = topology.dp, topology.ep, topology.num_shards
        if b_NLP.ndim != 3 or b_NLP.shape[0] != N or b_NLP.shape[2] != P:
            raise InputError(f"anneal: b_NLP must have shape [{N}, L, {P}], got {list(b_NLP.shape)}")
        if isinstance(rows, bool) or not isinstance(rows, (int, np.integer)) or rows < 1:
            raise InputError(f"anneal: rows must be a positive integer, got {rows!r}")
        R = int(rows)
        if R * D > N:
            raise InputError(f"anneal: {R} rows × {D} slots = {R * D} cells > {N} samples "
                             "(cells must be nonempty)")
        C = topology.capacity
        if lengths.min() < 1 or lengths.max() > C:
            raise InputError("anneal: every length must be in 1..capacity")
        L = b_NLP.shape[1]
        self.perm = np.argsort(lengths, kind="stable")
        lengths = lengths[self.perm]
        # W never exceeds the window's per-(l, p) column sums; int32 when they fit. b is int16
        # when its entries fit (half the memory traffic of the expert kernels, whose rows of b
        # are random reads; the kernels widen it to W's type). All three are order-free: taken
        # on the caller's array, which is copied only into b's own storage, in samples' order.
        wmax = int(b_NLP.sum(axis=0).max(initial=0)) if N else 0
        self.wdtype = np.int32 if 2 * wmax < 2**31 else np.int64
        bmax = int(b_NLP.max(initial=0))
        dtype = np.int16 if (self.wdtype == np.int32 and bmax < 2**15
                             and int(b_NLP.min(initial=0)) >= 0) else self.wdtype
        if storage is not None:  # (b dtype, W dtype) forced: the warm-up compiles every variant
            dtype, self.wdtype = storage
        # rank-major rows b[i, p·L + l], ranks zero-padded to Pp = 8·⌈P/8⌉ (see
        # kernels.msum_swap); one extra zero row b[N]: a relocation of i is evaluated as a swap
        # of i with it
        Pp = 8 * ((P + 7) // 8)
        b_NPL = np.zeros((N + 1, Pp, L), dtype=dtype)
        for lo in range(0, N, _PERMUTE_BLOCK):  # by blocks: no whole permuted copy of the loads
            hi = min(lo + _PERMUTE_BLOCK, N)
            b_NPL[lo:hi, :P, :] = b_NLP[self.perm[lo:hi]].transpose(0, 2, 1)
        # internal slot order is shard-major: internal slot g·P + j = user slot slots_of_shard[g, j]
        self.ext_D = np.ascontiguousarray(topology.slots_of_shard().ravel(), dtype=np.int64)
        self.int_D = np.empty(D, dtype=np.int64)
        self.int_D[self.ext_D] = np.arange(D)
        # most samples one cell can ever hold (capacity, and every other cell keeps one)
        fit = int(np.searchsorted(np.cumsum(np.sort(lengths)), C, side="right"))
        eq = bool(topology.equal_samples_per_slot)
        if eq:
            topology.check_samples(N)
        self.topology, self.cost = topology, cost
        self.problem = Problem(
            lengths=lengths, len2=lengths * lengths, b=b_NPL.reshape(N + 1, Pp * L),
            shard_D=np.arange(D, dtype=np.int64) // P,
            n_le=np.searchsorted(lengths, np.arange(C + 1), side="right").astype(np.int32),
            alpha=np.asarray(cost.alphas, dtype=np.float64),
            beta=np.asarray(cost.betas, dtype=np.float64),
            gamma=float(cost.gamma), ovh=float(cost.row_overhead),
            N=N, L=L, P=P, Pp=Pp, D=D, G=G, R=R, C=C, cap=max(1, min(N - R * D + 1, fit)),
            objective=objective.code, eps1=tie_eps / (2.0 * G), eps2=tie_eps / 2.0,
            eq=eq)

    def __getattr__(self, name):  # the compiled constants: inst.N, inst.lengths, ...
        if name == "problem":
            raise AttributeError(name)
        try:
            return getattr(self.problem, name)
        except AttributeError:
            raise AttributeError(f"Instance has no attribute {name!r}") from None

    def b_NLP(self) -> np.ndarray:
        """The loads in the caller's [N, L, P] shape (internal sample order)."""
        return self.b[:self.N].reshape(self.N, self.Pp, self.L)[:, :self.P, :].transpose(0, 2, 1)

    def check_layout(self, row, slot, what: str) -> tuple[np.ndarray, np.ndarray]:
        """A caller's layout (row_N, slot_N), validated, as internal (row, slot) int32 arrays."""
        row = np.asarray(row, dtype=np.int64)[self.perm]
        slot = np.asarray(slot, dtype=np.int64)[self.perm]
        N, R, D = self.N, self.R, self.D
        if row.shape != (N,) or slot.shape != (N,):
            raise InputError(f"anneal: {what} must give a row and a slot for each of {N} samples")
        if row.min() < 0 or row.max() >= R or slot.min() < 0 or slot.max() >= D:
            raise InputError(f"anneal: {what} puts a sample outside the {R} × {D} grid")
        cell = row * D + slot
        if (np.bincount(cell, minlength=R * D) == 0).any():
            raise InputError(f"anneal: {what} leaves a cell empty")
        if np.bincount(cell, weights=self.lengths, minlength=R * D).max() > self.C:
            raise InputError(f"anneal: {what} overfills a cell (capacity {self.C})")
        if self.eq and (np.bincount(slot, minlength=D) != N // D).any():
            raise InputError(f"anneal: {what} breaks equal samples per slot (N/D = {N // D} each)")
        return row.astype(np.int32), self.int_D[slot].astype(np.int32)

    def external(self, row, slot) -> tuple[np.ndarray, np.ndarray]:
        """The caller's layout (row_N, slot_N) (int64) from an internal one (samples numbered
        by length, shard-major slots)."""
        row_N = np.empty(self.N, dtype=np.int64)
        slot_N = np.empty(self.N, dtype=np.int64)
        row_N[self.perm] = np.asarray(row, dtype=np.int64)
        slot_N[self.perm] = self.ext_D[np.asarray(slot, dtype=np.int64)]
        return row_N, slot_N

    def evaluator_key(self, row, slot) -> tuple[float, float, float]:
        """The evaluator's lexicographic key of an internal layout."""
        J = row_shard_costs(self.lengths, self.b_NLP(), np.asarray(row, dtype=np.int64),
                            self.ext_D[np.asarray(slot, dtype=np.int64)], self.R,
                            self.topology, self.cost)
        return score_from_J(J, self.objective).key

"""Shared pieces of the exact layout models (docs/pipeline.md, step 4): the instance, the result, and the
symmetry structure both models break.

Legend: N samples, L layers, E experts, P EP ranks, D DP slots, G shards, R rows, S stages,
cell c = r·D + d.

Symmetries of the layout problem at fixed placement and R (docs/model.md cost):
- slots inside a shard: ``J[r,g]`` takes a max over the shard's cells (attention) and a sum over
  them (expert loads ``W``), so the P cells of one (row, shard) block may be permuted, row by row;
- ``max-sum`` (``max_g Σ_r J[r,g]``): rows may be permuted *inside each shard* independently, and
  whole shards (all their rows) may be permuted;
- ``sum-max`` (``Σ_r max_g J[r,g]``): shards may be permuted *inside each row* independently, but
  rows only as whole rows (all shards at once).
The secondary keys (``Σ J``, ``max J``) are invariant under all of these.

Both models break them with *min-index ordering* (the representative of an orbit is the layout
whose units are ordered by their smallest sample id): at each level, inside each group of
interchangeable units ``u_0, u_1, ...``, the smallest sample of ``u_{j-1}`` is below that of
``u_j``. As a linear constraint, for every sample i and j ≥ 1:

    Σ_{c ∈ u_j} x[i,c]  ≤  Σ_{i' < i} Σ_{c ∈ u_{j-1}} x[i',c].

Levels nest (coarse to fine), and each level's key (a unit's smallest sample) is invariant under
the permutations of the finer levels, so the orderings can be imposed together: every layout has
exactly one representative (:func:`canonical_layout`) with the same score (cells are nonempty).
"Smallest" is taken in a fixed order of the samples, heaviest first (``LayoutInstance.order_N``).

Equal samples per slot (``Topology.equal_samples_per_slot``): permuting the slots of a block in
one row only, or (``sum-max``) the shards of one row only, moves samples between whole slots and
breaks the per-slot counts, so those levels are replaced by permutations that act on whole slots
across every row (each slot keeps its N / D samples): ``max-sum``: whole shards, rows inside each
shard, then whole slots inside each shard; ``sum-max``: whole rows, whole shards, then whole
slots inside each shard. Each level's key is again invariant under the other levels (a row of a
shard keeps its cells as a set under slot permutations; a whole slot keeps its cells under row
permutations), so the orderings still combine to exactly one representative.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from routepack_opt.core.cost import CostModel
from routepack_opt.core.evaluate import Evaluator, Score
from routepack_opt.core.layout import check_rows
from routepack_opt.core.objective import Objective, check_objective
from routepack_opt.core.placement import Placement, as_placement
from routepack_opt.core.plan import Plan
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import Window

__all__ = ["LayoutInstance", "LayoutResult", "STATUSES", "solver_result", "symmetry_groups", "canonical_layout",
           "is_canonical", "prefeasibility", "MAX_BINARIES", "BuildTimeout", "BuildClock"]

STATUSES = ("optimal", "feasible", "infeasible", "unknown")

# N·R·D assignment binaries above which the exact models refuse (they would not even load).
MAX_BINARIES = 200_000


class BuildTimeout(Exception):
    """A model's construction ran past its deadline (the symmetry-breaking rows alone are
    O(N²·R·D) terms: tens of seconds and gigabytes at N = 600); the caller reports ``unknown``
    and keeps its warm start."""


class BuildClock:
    """The deadline (a ``time.perf_counter()`` value, or None) that model builders check
    between constraint families and inside their long loops."""

    def __init__(self, deadline: float | None):
        self.deadline = deadline

    def check(self) -> None:
        if self.deadline is not None and time.perf_counter() > self.deadline:
            raise BuildTimeout("the model was not built within the time limit")


@dataclasses.dataclass(frozen=True)
class LayoutInstance:
    """The data of one exact layout problem: window, topology, cost, fixed placement and rows."""

    window: Window
    topology: Topology
    cost: CostModel
    placement: Placement  # fixed (given as a Placement or a permutation π[l, e])
    rows: int
    objective: Objective
    evaluator: Evaluator
    b_NLP: np.ndarray  # per-rank loads under the placement
    coef_SN: np.ndarray  # α_s·len + β_s·len² (µs) per stage and sample
    slots_GP: np.ndarray
    order_N: np.ndarray  # sample ids, heaviest first: the order of the min-index symmetry breaking

    @classmethod
    def build(cls, window: Window, topology: Topology, cost: CostModel, placement, rows: int,
              objective: Objective | str, evaluator: Evaluator | None = None) -> LayoutInstance:
        objective = check_objective(objective)
        check_rows(rows)
        evaluator = evaluator or Evaluator(window, topology, cost)
        placement = as_placement(placement, topology.ep)
        b_NLP = evaluator.rank_loads(placement)
        lengths = window.lengths.astype(np.float64)
        coef_SN = (np.asarray(cost.alphas)[:, None] * lengths[None]
                   + np.asarray(cost.betas)[:, None] * lengths[None] ** 2)
        # Heaviest samples first (standalone cost), so the symmetry breaking pins the samples
        # that matter most (largest-item-first, as in bin-packing symmetry breaking).
        weight_N = coef_SN.sum(axis=0) + cost.gamma * b_NLP.max(axis=2).sum(axis=1)
        order_N = np.lexsort((np.arange(window.num_samples), -weight_N)).astype(np.int64)
        return cls(window, topology, cost, placement, int(rows), objective, evaluator, b_NLP,
                   coef_SN, topology.slots_of_shard(), order_N)

    @property
    def num_samples(self) -> int:
        return self.window.num_samples

    @property
    def num_cells(self) -> int:
        return self.rows * self.topology.dp

    def cell(self, r: int, d: int) -> int:
        return r * self.topology.dp + d

    def lower_bound(self) -> float:
        """docs/model.md bound (valid for both objectives)."""
        return self.evaluator.lower_bound(self.placement, self.rows)

    def constant(self) -> float:
        """The makespan's layout-independent part: R·row_overhead (both objectives)."""
        return self.rows * self.cost.row_overhead

    def score(self, row_N, slot_N) -> Score:
        return self.evaluator.score(self.placement, row_N, slot_N, self.rows, self.objective)

    def violations(self, row_N, slot_N) -> list[str]:
        plan = Plan(self.topology, self.rows, self.placement, row_N, slot_N, self.objective)
        return plan.validate(self.window)


def prefeasibility(inst: LayoutInstance) -> str | None:
    """A reason no layout exists, found without search (None: not ruled out)."""
    N, K, C = inst.num_samples, inst.num_cells, inst.topology.capacity
    lengths = inst.window.lengths
    if N < K:
        return f"{N} samples cannot fill {inst.rows} rows × {inst.topology.dp} slots = {K} nonempty cells"
    if lengths.max(initial=0) > C:
        return f"sample {int(lengths.argmax())} has {int(lengths.max())} tokens > capacity {C}"
    if int(lengths.sum()) > K * C:
        return f"{int(lengths.sum())} tokens exceed {K} cells × capacity {C}"
    D = inst.topology.dp
    if inst.topology.equal_samples_per_slot and N % D:
        return f"equal samples per slot: N={N} samples do not divide over D={D} slots"
    return None


@dataclasses.dataclass(frozen=True)
class LayoutResult:
    """What an exact layout model returns.

    ``objective`` is the makespan of ``(row, slot)`` *re-scored by the evaluator* (``score`` is the
    full lexicographic score); ``bound`` is a proved lower bound on the optimal makespan (the
    solver's bound, lowered by the worst-case rounding error where costs were integer-scaled, and
    never below the docs/model.md bound); ``gap = (objective - bound) / objective``.
    """

    status: str
    objective: float | None
    bound: float
    gap: float
    seconds: float
    row: np.ndarray | None
    slot: np.ndarray | None
    score: Score | None = None
    solver: str = ""
    objective_name: Objective = Objective.MAX_SUM
    rows: int = 0
    claimed: float | None = None  # the solver's own makespan (µs, unscaled)
    rounding_error: float = 0.0  # worst-case |scaled model − true cost| of any layout (µs)
    lexicographic: bool = False
    info: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")

    @property
    def layout(self) -> tuple[np.ndarray, np.ndarray] | None:
        return None if self.row is None else (self.row, self.slot)

    def report(self) -> dict:
        d = {"status": self.status, "objective": self.objective, "bound": self.bound,
             "gap": self.gap, "seconds": self.seconds, "solver": self.solver,
             "objective_name": self.objective_name, "rows": self.rows,
             "lexicographic": self.lexicographic, "rounding_error": self.rounding_error}
        if self.score is not None:
            d["score"] = self.score.as_dict()
        d.update(self.info)
        return d


def lex_better(a, b, tol: float) -> bool:
    """Is score ``a`` lexicographically better than ``b``, allowing ``a`` a makespan ``tol``
    above ``b`` (the stage-2 makespan is only fixed up to the rounding error)?"""
    tol = tol + 1e-9 * abs(b.makespan)
    if a.makespan < b.makespan - tol:
        return True
    return a.makespan <= b.makespan + tol and (a.total, a.peak) < (b.total, b.peak)


def gap_of(objective: float | None, bound: float) -> float:
    if objective is None:
        return float("inf")
    if objective <= 0:
        return 0.0
    return max(0.0, (objective - bound) / objective)


# --------------------------------------------------------------------------------------------
# Symmetry
# --------------------------------------------------------------------------------------------


def symmetry_groups(topology: Topology, rows: int, objective: Objective | str,
                    slots: bool = True) -> list[list[list[int]]]:
    """Groups of interchangeable units, coarse levels first. Each group is an ordered list of
    units; each unit is a list of cell ids ``r·D + d``. The models order the units of each group
    by their smallest sample. ``slots=False`` leaves out the finest level (slots inside a block or
    a shard): with replicas the even-local rule rotates by a slot's position in its shard, so
    those permutations change the score (:mod:`routepack_opt.models.layout_replicas`)."""
    objective = check_objective(objective)
    D, P, G, R = topology.dp, topology.ep, topology.num_shards, rows
    S = topology.slots_of_shard()

    def block(r, g):
        return [r * D + int(S[g, j]) for j in range(P)]

    groups: list[list[list[int]]] = []
    eq = topology.equal_samples_per_slot  # only levels that keep whole slots (module docstring)
    if objective == Objective.MAX_SUM:
        if G > 1:  # whole shards
            groups.append([[c for r in range(R) for c in block(r, g)] for g in range(G)])
        if R > 1:  # rows inside each shard
            groups += [[block(r, g) for r in range(R)] for g in range(G)]
    else:
        if R > 1:  # whole rows
            groups.append([[r * D + d for d in range(D)] for r in range(R)])
        if G > 1 and eq:  # whole shards (every row at once)
            groups.append([[c for r in range(R) for c in block(r, g)] for g in range(G)])
        elif G > 1:  # shards inside each row
            groups += [[block(r, g) for g in range(G)] for r in range(R)]
    if not slots:
        return groups
    if P > 1 and eq:  # whole slots inside each shard (every row at once)
        groups += [[[r * D + int(S[g, j]) for r in range(R)] for j in range(P)] for g in range(G)]
    elif P > 1:  # slots inside each (row, shard) block
        groups += [[[c] for c in block(r, g)] for r in range(R) for g in range(G)]
    return groups


def canonical_layout(row_N, slot_N, topology: Topology, rows: int, objective: Objective | str, order=None,
                     slots: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The orbit representative of a layout under the objective's symmetries (same score):
    units ordered by smallest sample at every level (see the module docstring). ``order``: the
    sample ids in the order that defines "smallest" (default 0..N-1). ``slots=False``: every
    sample keeps its slot's position inside its shard (the levels of
    ``symmetry_groups(..., slots=False)``)."""
    objective = check_objective(objective)
    row_N = np.asarray(row_N, dtype=np.int64)
    slot_N = np.asarray(slot_N, dtype=np.int64)
    N = row_N.size
    D, P, G, R = topology.dp, topology.ep, topology.num_shards, rows
    S = topology.slots_of_shard()
    shard_D = topology.shard_array()
    pos_D = np.empty(D, dtype=np.int64)  # position of slot d inside its shard
    pos_D[S.ravel()] = np.tile(np.arange(P), G)
    g_N, j_N = shard_D[slot_N], pos_D[slot_N]
    rank_N = np.empty(N, dtype=np.int64)
    rank_N[np.arange(N) if order is None else np.asarray(order, dtype=np.int64)] = np.arange(N)

    def first(mask):
        sel = rank_N[mask]
        return int(sel.min()) if sel.size else N  # empty units sort last

    def relabel(outer_N, n_outer, inner_N, n_inner):
        """Outer units by smallest sample, then inner units inside each outer unit."""
        new_out, new_in = np.empty(N, np.int64), np.empty(N, np.int64)
        for o2, o in enumerate(np.argsort([first(outer_N == o) for o in range(n_outer)], kind="stable")):
            in_o = outer_N == o
            new_out[in_o] = o2
            order_i = np.argsort([first(in_o & (inner_N == i)) for i in range(n_inner)], kind="stable")
            for i2, i in enumerate(order_i):
                new_in[in_o & (inner_N == i)] = i2
        return new_out, new_in

    if topology.equal_samples_per_slot:  # levels that keep whole slots (module docstring)
        if objective == Objective.MAX_SUM:  # whole shards, then rows inside a shard
            new_g, new_r = relabel(g_N, G, row_N, R)
        else:  # whole rows, then whole shards
            new_r = np.empty(N, np.int64)
            new_g = np.empty(N, np.int64)
            for r2, r in enumerate(np.argsort([first(row_N == r) for r in range(R)], kind="stable")):
                new_r[row_N == r] = r2
            for g2, g in enumerate(np.argsort([first(g_N == g) for g in range(G)], kind="stable")):
                new_g[g_N == g] = g2
        if not slots:
            return new_r, S[new_g, j_N]
        new_j = np.empty(N, np.int64)
        for g in range(G):
            sh = new_g == g
            order_j = np.argsort([first(sh & (j_N == j)) for j in range(P)], kind="stable")
            for j2, j in enumerate(order_j):
                new_j[sh & (j_N == j)] = j2
        return new_r, S[new_g, new_j]
    if objective == Objective.MAX_SUM:  # whole shards, then rows inside a shard
        new_g, new_r = relabel(g_N, G, row_N, R)
    else:  # whole rows, then shards inside a row
        new_r, new_g = relabel(row_N, R, g_N, G)
    if not slots:
        return new_r, S[new_g, j_N]
    new_j = np.empty(N, np.int64)
    for r in range(R):
        for g in range(G):
            blk = (new_r == r) & (new_g == g)
            order_j = np.argsort([first(blk & (j_N == j)) for j in range(P)], kind="stable")
            for j2, j in enumerate(order_j):
                new_j[blk & (j_N == j)] = j2
    return new_r, S[new_g, new_j]


def is_canonical(row_N, slot_N, topology: Topology, rows: int, objective: Objective | str, order=None,
                 slots: bool = True) -> bool:
    """Does the layout satisfy the symmetry-breaking constraints of both models?"""
    r2, s2 = canonical_layout(row_N, slot_N, topology, rows, objective, order, slots)
    return bool(np.array_equal(r2, row_N) and np.array_equal(s2, slot_N))


def solver_result(inst: LayoutInstance, solver: str, status: str, layout, bound: float, t0: float,
                  claimed, rounding_error: float, lexicographic: bool, info: dict) -> LayoutResult:
    """A :class:`LayoutResult` whose objective is the evaluator's score of the solver's layout
    (never the solver's own claim); a layout that breaks a plan rule is an internal bug."""
    score = None
    row = slot = None
    if layout is not None:
        row, slot = layout
        errs = inst.violations(row, slot)
        if errs:  # the model and the plan rules disagree: an internal bug, never a user error
            raise RuntimeError(f"{solver} returned an infeasible layout: " + "; ".join(errs[:3]))
        score = inst.score(row, slot)
    objective = None if score is None else score.makespan
    if objective is not None:
        # rounding (CP-SAT) or solver tolerances (HiGHS) can push a bound a hair past the optimum
        bound = min(bound, objective)
    return LayoutResult(status=status, objective=objective, bound=bound, gap=gap_of(objective, bound),
                        seconds=time.perf_counter() - t0, row=row, slot=slot, score=score,
                        solver=solver, objective_name=inst.objective, rows=inst.rows,
                        claimed=claimed, rounding_error=rounding_error, lexicographic=lexicographic,
                        info=info)

"""Exact layout *and* replica placement together (issue 26, "Exact"): the shared instance, result
and brute-force reference of the CP-SAT (:mod:`routepack_opt.models.layout_replicas_cpsat`) and
Pyomo/HiGHS (:mod:`routepack_opt.models.layout_replicas_milp`) models.

Legend: N samples, L layers, E logical experts, P EP ranks, S = E + N_red slots per layer (S/P
per rank), D DP slots, G shards, R rows, x = r·D + d a cell, q_x the EP rank of its slot inside
its shard (its position in ``slots_of_shard``), k = (r, g) a row-shard block, n a replica count,
j a replica index (replicas in ascending rank order).

Both models choose, at once, which cell holds each sample (``x[i,x]``, as the layout models) and,
per layer, how many replicas each expert has and on which ranks (distinct ranks, S/P per rank).
The tokens' split over the replicas is **not** a variable: it is the even-local rule the runtime
applies and the evaluator scores (docs/model.md "Replicas"; core.placement) — a cell holding
``c`` tokens of e sends replica j of n

    ⌊c/n⌋ + [ (j − q_x) mod n < c mod n ]

tokens. The models encode it exactly, for every candidate count n, by the cell's quotient and
remainder in unary:

    c[x,l,e]   = Σ_i counts[i,l,e] x[i,x]                          (linear in the layout)
    c[x,l,e]   = n · f[x,l,e,n] + Σ_{t=0}^{n−2} δ[x,l,e,n,t]      f ∈ ℤ≥0, δ ∈ {0,1}
    δ[x,l,e,n,t+1] ≤ δ[x,l,e,n,t]                                  (so Σ_t δ = c mod n and
                                                                    δ[t] = [t < c mod n])
    share[x,l,e,n,j] = f[x,l,e,n] + δ[x,l,e,n,(j − q_x) mod n]      (δ[n−1] ≡ 0)

which is the rule's amount (the unary remainder makes ``[t < c mod n]`` a single variable). The
placement is the indicator model of :mod:`routepack_opt.models.replica_placement`:

    y[l,e,p]  a replica of e on rank p:  Σ_e y = S/P ∀(l,p);  Σ_p y ≥ 1
    u[l,e,n]  e has n replicas:          Σ_n u = 1;  Σ_n n·u = Σ_p y        (n ≤ nmax = min(P, N_red+1))
    v[l,e,p,j] e's replica on p is its j-th:  Σ_j v = y[l,e,p];  Σ_j j·v = Σ_{p'<p} y  (if y)

and the load of rank p from expert e in block k is bounded below by the selected share,

    z[k,l,e,p] ≥ Σ_{x∈k} share[x,l,e,n,j]     whenever u[l,e,n] ∧ v[l,e,p,j]   (z ≥ 0)
    M[k,l]     ≥ Σ_e z[k,l,e,p]  ∀p;     P · M[k,l] ≥ Σ_{x∈k} Σ_e c[x,l,e]  (a valid cut)

then ``J``, ``max-sum`` and ``sum-max`` exactly as the layout models. Minimisation drives each z to
its share, so the model's makespan of any (layout, placement) is the evaluator's, and its optimum
is the optimum over every layout and every replica placement with replicas on distinct ranks
(up to CP-SAT's integer-scaling error on the attention terms, see
:mod:`routepack_opt.models.layout_cpsat`; the expert term counts tokens and is exact). Every
answer is nevertheless re-scored by the one evaluator: ``objective`` is the evaluator's makespan,
``claimed`` the model's.

Symmetry. The row and shard levels of :mod:`routepack_opt.models.layout_common` stay valid (the
placement is shared by all rows and shards, and a block keeps its cells' positions), but slots
inside a block are no longer interchangeable: the rotation by q_x makes the split depend on the
slot's position. So the models break only the row/shard levels (``symmetry_groups(...,
slots=False)``). Ranks are not interchangeable either (replica j sits on e's j-th lowest rank).

Bound. The model's proved bound, never below the placement-free bound with replicas
(docs/model.md: it holds for every placement with ``N_red`` redundant slots).
"""

from __future__ import annotations

import dataclasses
import itertools
import time

import numpy as np

from routepack_opt.core.cost import CostModel
from routepack_opt.core.errors import InputError
from routepack_opt.core.evaluate import Evaluator, Score
from routepack_opt.core.layout import Layout, check_rows
from routepack_opt.core.objective import Objective, check_objective
from routepack_opt.core.placement import Placement, split_counts
from routepack_opt.core.plan import Plan
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import Window
from routepack_opt.models.brute import set_partitions
from routepack_opt.models.layout_common import STATUSES, LayoutInstance, gap_of, prefeasibility
from routepack_opt.models.replica_placement import layer_choices, placement_from_y

__all__ = ["ReplicaLayoutInstance", "ReplicaLayoutResult", "replica_result", "brute_force_replica_layout",
           "ReplicaBruteResult", "cell_counts", "model_loads"]


@dataclasses.dataclass(frozen=True)
class ReplicaLayoutInstance(LayoutInstance):
    """A :class:`LayoutInstance` whose placement is a variable with ``redundant`` extra slots per
    layer (0: the placement is a free permutation, every expert one replica). ``placement`` holds
    the identity :class:`Placement`'s first replica slots (only so the layout rules can be checked);
    ``b_NLP`` is ``[N, L, 1]``: each sample's routed tokens per layer (the symmetry order's weight
    and the models' upper bounds need no placement)."""

    redundant: int = 0

    @classmethod
    def build_replicas(cls, window: Window, topology: Topology, cost: CostModel, rows: int,
                       objective: Objective | str, evaluator: Evaluator | None = None
                       ) -> ReplicaLayoutInstance:
        objective = check_objective(objective)
        check_rows(rows)
        topology.check_experts(window.num_experts)
        L, E, P = window.num_layers, window.num_experts, topology.ep
        red = topology.redundant_experts
        if E + red > E * P:
            raise InputError(f"redundant_experts {red}: S={E + red} slots exceed one replica of each of "
                             f"E={E} experts on each of P={P} ranks")
        evaluator = evaluator or Evaluator(window, topology, cost)
        lengths = window.lengths.astype(np.float64)
        coef_SN = (np.asarray(cost.alphas)[:, None] * lengths[None]
                   + np.asarray(cost.betas)[:, None] * lengths[None] ** 2)
        b_NLP = window.counts.sum(axis=2)[:, :, None].astype(np.int64)
        weight_N = coef_SN.sum(axis=0) + cost.gamma * b_NLP.sum(axis=(1, 2))
        order_N = np.lexsort((np.arange(window.num_samples), -weight_N)).astype(np.int64)
        ident = Placement.identity(L, E, P, red).log2phy()[:, :, 0]
        return cls(window, topology, cost, ident, int(rows), objective, evaluator, b_NLP, coef_SN,
                   topology.slots_of_shard(), order_N, int(red))

    @property
    def nmax(self) -> int:
        """The most replicas of one expert: one per rank, and at most N_red + 1."""
        return min(self.topology.ep, self.redundant + 1)

    @property
    def slots_per_rank(self) -> int:
        return (self.window.num_experts + self.redundant) // self.topology.ep

    def q_D(self) -> np.ndarray:
        """EP rank of each DP slot inside its shard (the even-local rotation)."""
        q = np.empty(self.topology.dp, dtype=np.int64)
        q[self.slots_GP] = np.arange(self.topology.ep)[None, :]
        return q

    def lower_bound(self) -> float:
        """The placement-free bound with ``redundant`` replicas (docs/model.md)."""
        return self.evaluator.placement_free_lower_bound(self.rows, self.redundant)

    def score(self, row_N, slot_N, placement: Placement | None = None) -> Score:
        if placement is None:
            raise InputError("a replica layout is scored with its placement")
        return self.evaluator.score(placement, row_N, slot_N, self.rows, self.objective)

    def violations(self, row_N, slot_N, placement: Placement | None = None) -> list[str]:
        pl = placement if placement is not None else Placement.identity(
            self.window.num_layers, self.window.num_experts, self.topology.ep, self.redundant)
        plan = Plan.from_layout(self.topology, pl, Layout(row_N, slot_N, self.rows), self.objective)
        return plan.validate(self.window)


def cell_counts(inst: ReplicaLayoutInstance, row_N, slot_N) -> np.ndarray:
    """``c[x, l, e]``: the tokens of expert e at layer l in cell x = r·D + d."""
    w = inst.window
    c_XLE = np.zeros((inst.num_cells, w.num_layers, w.num_experts), dtype=np.int64)
    np.add.at(c_XLE, np.asarray(row_N) * inst.topology.dp + np.asarray(slot_N), w.counts)
    return c_XLE


def model_loads(inst: ReplicaLayoutInstance, row_N, slot_N, placement: Placement) -> np.ndarray:
    """``z[k, l, e, p]``: the tokens block k = r·G + g sends to e's replica on rank p under the
    even-local rule (the models' z at the solution; the hints' values). Summed over e it is the
    evaluator's W (a test checks it)."""
    c_XLE = cell_counts(inst, row_N, slot_N)
    L, E = inst.window.num_layers, inst.window.num_experts
    P, G, D = inst.topology.ep, inst.topology.num_shards, inst.topology.dp
    q_D, shard_D = inst.q_D(), inst.topology.shard_array()
    ranks_LEK = placement.replica_ranks()
    cnt_LE = placement.logcnt
    z = np.zeros((inst.rows * G, L, E, P), dtype=np.int64)
    for x in range(inst.num_cells):
        k = (x // D) * G + shard_D[x % D]
        for l in range(L):
            for e in range(E):
                c = int(c_XLE[x, l, e])
                if c:
                    n = int(cnt_LE[l, e])
                    for j, a in enumerate(split_counts(c, n, int(q_D[x % D]))):
                        z[k, l, e, ranks_LEK[l, e, j]] += a
    return z


@dataclasses.dataclass(frozen=True)
class ReplicaLayoutResult:
    """What a replica layout model returns: ``objective`` is the evaluator's makespan of
    ``(row, slot, placement)`` (``score`` its full key), ``claimed`` the model's own makespan,
    ``bound`` a proved lower bound on the optimum over every layout and replica placement."""

    status: str
    objective: float | None
    bound: float
    gap: float
    seconds: float
    row: np.ndarray | None
    slot: np.ndarray | None
    placement: Placement | None
    score: Score | None = None
    solver: str = ""
    objective_name: Objective = Objective.MAX_SUM
    rows: int = 0
    claimed: float | None = None
    rounding_error: float = 0.0
    info: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")

    @property
    def layout(self) -> tuple[np.ndarray, np.ndarray] | None:
        if self.row is None or self.slot is None:
            return None
        return self.row, self.slot

    def report(self) -> dict:
        d: dict = {"status": self.status, "objective": self.objective, "bound": self.bound, "gap": self.gap,
             "seconds": self.seconds, "solver": self.solver, "objective_name": self.objective_name,
             "rows": self.rows, "claimed": self.claimed, "rounding_error": self.rounding_error}
        if self.score is not None:
            d["score"] = self.score.as_dict()
        if self.placement is not None:
            d.update(self.placement.to_json())
        d.update(self.info)
        return d


def replica_result(inst: ReplicaLayoutInstance, solver: str, status: str, layout, y_LEP, bound: float,
                   t0: float, claimed, rounding_error: float, info: dict) -> ReplicaLayoutResult:
    """The result, re-scored by the evaluator; a solution that breaks a plan rule is an internal
    bug (never a user error)."""
    row = slot = placement = score = None
    if layout is not None:
        row, slot = layout
        placement = placement_from_y(y_LEP, inst.topology.ep)
        if (placement.logcnt > inst.nmax).any() or placement.redundant != inst.redundant:
            raise RuntimeError(f"{solver} returned a placement outside the model")
        errs = inst.violations(row, slot, placement)
        if errs:
            raise RuntimeError(f"{solver} returned an infeasible plan: " + "; ".join(errs[:3]))
        score = inst.score(row, slot, placement)
    objective = None if score is None else score.makespan
    if objective is not None:
        bound = min(bound, objective)
    return ReplicaLayoutResult(status=status, objective=objective, bound=bound, gap=gap_of(objective, bound),
                               seconds=time.perf_counter() - t0, row=row, slot=slot, placement=placement,
                               score=score, solver=solver, objective_name=inst.objective, rows=inst.rows,
                               claimed=claimed, rounding_error=rounding_error, info=info)


# --------------------------------------------------------------------------------------------
# Brute force
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ReplicaBruteResult:
    """The optimum by enumeration: evaluator score, layout, placement, candidates scored."""

    score: Score | None
    row: np.ndarray | None
    slot: np.ndarray | None
    placement: Placement | None
    count: int

    @property
    def objective(self) -> float | None:
        return None if self.score is None else self.score.makespan


def brute_force_replica_layout(inst: ReplicaLayoutInstance, max_samples: int = 8,
                               max_candidates: int = 200_000) -> ReplicaBruteResult:
    """The lexicographic optimum over every layout and every replica placement (replicas of an
    expert on distinct ranks, S/P slots per rank), each scored by the one evaluator.

    Layouts: every partition of the samples into R·D nonempty cells within the capacity, times
    every assignment of those cells to the R·D (row, slot) positions — no symmetry is used, so
    this reference does not depend on the models' symmetry argument. Placements: every product
    of per-layer replica choices (:func:`routepack_opt.models.replica_placement.layer_choices`)."""
    N = inst.num_samples
    if N > max_samples:
        raise InputError(f"brute force is for tiny windows: N={N} > {max_samples}")
    if prefeasibility(inst) is not None:
        return ReplicaBruteResult(None, None, None, None, 0)
    topo = inst.topology
    R, D = inst.rows, topo.dp
    K = R * D
    L, E, P = inst.window.num_layers, inst.window.num_experts, topo.ep
    per_layer = list(layer_choices(E, P, inst.slots_per_rank))
    placements = [placement_from_y(np.stack(combo), P) for combo in itertools.product(per_layer, repeat=L)]
    positions = list(itertools.permutations(range(K)))
    best_key, best, count = None, None, 0
    eq = topo.equal_samples_per_slot
    for part_N in set_partitions(inst.window.lengths, K, topo.capacity):
        for pos in positions:
            cell_N = np.asarray(pos, dtype=np.int64)[part_N]
            row_N, slot_N = cell_N // D, cell_N % D
            if eq and (np.bincount(slot_N, minlength=D) != N // D).any():
                continue
            for pl in placements:
                count += 1
                if count > max_candidates:
                    raise InputError(f"brute force: more than {max_candidates} candidates; use a smaller case")
                score = inst.score(row_N, slot_N, pl)
                if best_key is None or score.key < best_key:
                    best_key, best = score.key, (score, row_N, slot_N, pl)
    if best is None:
        return ReplicaBruteResult(None, None, None, None, count)
    return ReplicaBruteResult(best[0], best[1], best[2], best[3], count)

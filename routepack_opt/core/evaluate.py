"""The one evaluator (docs/model.md): every layout in RoutePack is scored here.

Legend: N samples, L layers, E experts, P EP ranks, D DP slots, G shards, R rows, S stages.

The evaluator works from per-rank loads ``b_NLP[i, l, p]`` — the window's counts projected through
the placement once (:func:`rank_loads`). Scoring a layout is then a few dense reductions:

    T[r,d], Q[r,d]        tokens and squared lengths per cell           (bincount)
    W[r,g,l,p]            shard-row expert load per rank                (compiled block sum, int64)
    J[r,g] = Σ_s max_{d∈g}(α_s T + β_s Q) + γ Σ_l max_p W + row_overhead

Objectives are lexicographic: ``max-sum`` (max_g Σ_r J, Σ J, max J) and ``sum-max``
(Σ_r max_g J, Σ J, max J). The first component is the predicted step time (makespan).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from routepack_opt.core.bounds import layout_lower_bound, placement_free_lower_bound
from routepack_opt.core.cost import CostModel
from routepack_opt.core.errors import InputError
from routepack_opt.core.layout import Layout
from routepack_opt.core.objective import Objective, check_objective
from routepack_opt.core.plan import Plan
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import Window

__all__ = ["rank_loads", "Score", "Evaluation", "Evaluator", "row_shard_costs", "score_from_J",
           "evaluate_plan"]


def rank_loads(counts_NLE: np.ndarray, placement_LE: np.ndarray, ep: int) -> np.ndarray:
    """``b_NLP[i, l, p] = Σ_{e: rank(π[l,e]) = p} counts[i, l, e]`` with rank = slot // (E/P)."""
    N, L, E = counts_NLE.shape
    if E % ep:
        raise InputError(f"E={E} experts is not divisible by ep={ep}")
    placement_LE = np.asarray(placement_LE, dtype=np.int64)
    if placement_LE.shape != (L, E):
        raise InputError(f"placement: expected shape [{L}, {E}], got {list(placement_LE.shape)}")
    if placement_LE.size and (placement_LE.min() < 0 or placement_LE.max() >= E):
        raise InputError(f"placement: slots must be in 0..{E - 1}")
    # numba (~0.15 s to import) on first use, as in row_shard_costs, the only such imports in core:
    # `import routepack_opt` (which loads this module) stays free of numba, and the CLI's --help
    # and input errors fast
    from routepack_opt.core.projection import project_counts

    rank_LE = np.ascontiguousarray(placement_LE // (E // ep))
    return project_counts(np.ascontiguousarray(counts_NLE), rank_LE, int(ep))


def expert_rank_loads(load_LE: np.ndarray, placement_LE: np.ndarray, ep: int) -> np.ndarray:
    """Aggregate ``Lagg_LP[l, p]`` (all tokens of the window on rank p at layer l)."""
    return rank_loads(np.asarray(load_LE)[None], placement_LE, ep)[0]


@dataclasses.dataclass(frozen=True)
class Score:
    """Lexicographic score of one objective; compare with ``key``."""

    objective: Objective
    makespan: float
    total: float
    peak: float

    @property
    def key(self) -> tuple[float, float, float]:
        return (self.makespan, self.total, self.peak)

    def as_dict(self) -> dict:
        return {"makespan": self.makespan, "total": self.total, "peak": self.peak}


def score_from_J(J_RG: np.ndarray, objective: Objective | str) -> Score:
    """Lexicographic score of a row × shard cost matrix."""
    objective = check_objective(objective)
    total = float(J_RG.sum())
    peak = float(J_RG.max())
    if objective is Objective.MAX_SUM:
        makespan = float(J_RG.sum(axis=0).max())
    else:
        makespan = float(J_RG.max(axis=1).sum())
    return Score(objective, makespan, total, peak)


def row_shard_costs(lengths_N, b_NLP, row_N, slot_N, rows: int, topology: Topology,
                    cost: CostModel, parts: bool = False):
    """``J_RG[r, g]`` (docs/model.md). With ``parts=True`` also returns the attention part ``A_SRG``
    (per stage, max over the shard's cells) and the expert peaks ``M_RGL = max_p W``."""
    D, P, G = topology.dp, topology.ep, topology.num_shards
    lengths_N = np.asarray(lengths_N, dtype=np.float64)
    N = lengths_N.shape[0]
    r_N, d_N = np.asarray(row_N, dtype=np.int64), np.asarray(slot_N, dtype=np.int64)
    if r_N.shape != (N,) or d_N.shape != (N,) or (N and (min(r_N.min(), d_N.min()) < 0 or r_N.max() >= rows
                                                        or d_N.max() >= D)):
        raise InputError(f"a layout must put each of the {N} samples in a cell of the {rows} × {D} grid")
    cell_N = r_N * D + d_N
    T_RD = np.bincount(cell_N, weights=lengths_N, minlength=rows * D).reshape(rows, D)
    Q_RD = np.bincount(cell_N, weights=lengths_N * lengths_N, minlength=rows * D).reshape(rows, D)
    slots_GP = topology.slots_of_shard()
    alpha_S = np.asarray(cost.alphas)[:, None, None, None]
    beta_S = np.asarray(cost.betas)[:, None, None, None]
    A_SRGP = alpha_S * T_RD[None][:, :, slots_GP] + beta_S * Q_RD[None][:, :, slots_GP]
    A_SRG = A_SRGP.max(axis=3)
    # W[r,g,l,p]: every sample's per-rank loads added into its (row, shard) block (int64, exact).
    from routepack_opt.core.projection import block_loads  # numba, on first use (see rank_loads)

    if b_NLP.shape[0] != N:
        raise InputError(f"per-rank loads for {b_NLP.shape[0]} samples, lengths for {N}")
    L = b_NLP.shape[1]
    rg_N = r_N * G + topology.shard_array()[d_N]
    W = block_loads(np.asarray(b_NLP), np.ascontiguousarray(rg_N), rows * G)
    M_RGL = W.reshape(rows, G, L, P).max(axis=3).astype(np.float64)
    J_RG = A_SRG.sum(axis=0) + cost.gamma * M_RGL.sum(axis=2) + cost.row_overhead
    if parts:
        return J_RG, A_SRG, M_RGL
    return J_RG


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """Both objectives' scores, the bounds and the gap of one layout."""

    objective: Objective
    J: np.ndarray
    scores: dict[Objective, Score]
    lower_bound: float
    placement_free_lower_bound: float

    @property
    def score(self) -> Score:
        return self.scores[self.objective]

    @property
    def gap(self) -> float:
        return self.score.makespan / self.lower_bound if self.lower_bound > 0 else float("inf")

    def report(self) -> dict:
        other = Objective.SUM_MAX if self.objective is Objective.MAX_SUM else Objective.MAX_SUM
        s = self.score
        return {"objective": self.objective, "makespan": s.makespan, "total": s.total,
                "peak": s.peak, "other_objective": other,
                "other_makespan": self.scores[other].makespan,
                "makespan_max_sum": self.scores[Objective.MAX_SUM].makespan,
                "makespan_sum_max": self.scores[Objective.SUM_MAX].makespan,
                "lower_bound": self.lower_bound,
                "placement_free_lower_bound": self.placement_free_lower_bound, "gap": self.gap}


class Evaluator:
    """Cost authority for one window, topology and cost model (PyVRP's ``CostEvaluator`` habit).

    Caches the per-rank loads of the last placement, so scoring many layouts under one placement
    projects counts once.
    """

    def __init__(self, window: Window, topology: Topology, cost: CostModel):
        topology.check_experts(window.num_experts)
        self.window = window
        self.topology = topology
        self.cost = cost
        self._load_LE = window.expert_loads()
        self._cache_key: bytes | None = None
        self._b: np.ndarray | None = None

    def rank_loads(self, placement_LE) -> np.ndarray:
        placement_LE = np.ascontiguousarray(placement_LE, dtype=np.int64)
        key = placement_LE.tobytes()
        if key != self._cache_key:
            self._b = rank_loads(self.window.counts, placement_LE, self.topology.ep)
            self._cache_key = key
        return self._b

    def costs(self, placement_LE, row_N, slot_N, rows: int, parts: bool = False):
        return row_shard_costs(self.window.lengths, self.rank_loads(placement_LE), row_N, slot_N,
                               rows, self.topology, self.cost, parts=parts)

    def score(self, placement_LE, row_N, slot_N, rows: int, objective: Objective | str) -> Score:
        return score_from_J(self.costs(placement_LE, row_N, slot_N, rows), objective)

    def lower_bound(self, placement_LE, rows: int) -> float:
        Lagg_LP = expert_rank_loads(self._load_LE, placement_LE, self.topology.ep)
        return layout_lower_bound(self.window.lengths, Lagg_LP, rows, self.topology, self.cost)

    def placement_free_lower_bound(self, rows: int) -> float:
        return placement_free_lower_bound(self.window.lengths, self._load_LE, rows, self.topology, self.cost)

    def evaluate(self, placement_LE, row_N, slot_N, rows: int,
                 objective: Objective | str = Objective.MAX_SUM) -> Evaluation:
        J = self.costs(placement_LE, row_N, slot_N, rows)
        return Evaluation(objective=check_objective(objective), J=J,
                          scores={o: score_from_J(J, o) for o in Objective},
                          lower_bound=self.lower_bound(placement_LE, rows),
                          placement_free_lower_bound=self.placement_free_lower_bound(rows))

    def score_layout(self, placement_LE, layout: Layout, objective: str) -> Score:
        """:meth:`score` of a :class:`Layout`."""
        return self.score(placement_LE, layout.row, layout.slot, layout.rows, objective)

    def evaluate_layout(self, placement_LE, layout: Layout, objective: str = "max-sum") -> Evaluation:
        """:meth:`evaluate` of a :class:`Layout`."""
        return self.evaluate(placement_LE, layout.row, layout.slot, layout.rows, objective)

    def evaluate_plan(self, plan: Plan, objective: Objective | str | None = None) -> Evaluation:
        errs = plan.validate(self.window)
        if errs:
            more = f" (+{len(errs) - 5} more)" if len(errs) > 5 else ""
            raise InputError("invalid plan: " + "; ".join(errs[:5]) + more)
        return self.evaluate_layout(plan.placement, plan.layout, objective or plan.objective)


def evaluate_plan(window: Window, plan: Plan, cost: CostModel,
                  objective: Objective | str | None = None) -> Evaluation:
    """Validate ``plan`` against ``window`` and score it (both objectives, bounds, gap)."""
    return Evaluator(window, plan.topology, cost).evaluate_plan(plan, objective)

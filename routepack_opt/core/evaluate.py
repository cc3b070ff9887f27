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

from routepack_opt.core.bounds import (
    attention_lower_bound,
    force_balanced_lower_bound,
    layout_lower_bound,
    placement_free_lower_bound,
)
from routepack_opt.core.checks import check_type
from routepack_opt.core.cost import CostModel
from routepack_opt.core.errors import InputError
from routepack_opt.core.layout import Layout
from routepack_opt.core.objective import Objective, check_objective
from routepack_opt.core.placement import Placement, as_placement
from routepack_opt.core.plan import Plan
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import Window

__all__ = ["rank_loads", "Score", "Evaluation", "Evaluator", "row_shard_costs", "score_from_J",
           "evaluate_plan", "replica_rank_loads", "replica_block_W", "RankImbalance", "rank_imbalance"]


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
    return Score(objective, objective.makespan(J_RG), total, peak)


def _check_cells(N: int, row_N, slot_N, rows: int, D: int) -> tuple[np.ndarray, np.ndarray]:
    r_N, d_N = np.asarray(row_N, dtype=np.int64), np.asarray(slot_N, dtype=np.int64)
    if r_N.shape != (N,) or d_N.shape != (N,) or (N and (min(r_N.min(), d_N.min()) < 0 or r_N.max() >= rows
                                                        or d_N.max() >= D)):
        raise InputError(f"a layout must put each of the {N} samples in a cell of the {rows} × {D} grid")
    return r_N, d_N


def _costs_from_W(lengths_N, r_N, d_N, W, rows: int, topology: Topology, cost: CostModel, L: int,
                  parts: bool):
    """J_RG from the cells' lengths and the blocks' rank loads ``W[r·G + g, l·P + p]``."""
    D, P, G = topology.dp, topology.ep, topology.num_shards
    cell_N = r_N * D + d_N
    T_RD = np.bincount(cell_N, weights=lengths_N, minlength=rows * D).reshape(rows, D)
    Q_RD = np.bincount(cell_N, weights=lengths_N * lengths_N, minlength=rows * D).reshape(rows, D)
    slots_GP = topology.slots_of_shard()
    alpha_S = np.asarray(cost.alphas)[:, None, None, None]
    beta_S = np.asarray(cost.betas)[:, None, None, None]
    A_SRGP = alpha_S * T_RD[None][:, :, slots_GP] + beta_S * Q_RD[None][:, :, slots_GP]
    A_SRG = A_SRGP.max(axis=3)
    M_RGL = W.reshape(rows, G, L, P).max(axis=3).astype(np.float64)
    J_RG = A_SRG.sum(axis=0) + cost.gamma * M_RGL.sum(axis=2) + cost.row_overhead
    if parts:
        return J_RG, A_SRG, M_RGL
    return J_RG


def row_shard_costs(lengths_N, b_NLP, row_N, slot_N, rows: int, topology: Topology,
                    cost: CostModel, parts: bool = False):
    """``J_RG[r, g]`` (docs/model.md) from per-sample rank loads ``b_NLP`` (a placement without
    replicas, or the search's linear surrogate of one with replicas). With ``parts=True`` also
    returns the attention part ``A_SRG`` (per stage, max over the shard's cells) and the expert
    peaks ``M_RGL = max_p W``."""
    J, _ = _row_shard_costs_W(lengths_N, b_NLP, row_N, slot_N, rows, topology, cost, parts)
    return J


def _row_shard_costs_W(lengths_N, b_NLP, row_N, slot_N, rows, topology, cost, parts):
    lengths_N = np.asarray(lengths_N, dtype=np.float64)
    N = lengths_N.shape[0]
    r_N, d_N = _check_cells(N, row_N, slot_N, rows, topology.dp)
    # W[r,g,l,p]: every sample's per-rank loads added into its (row, shard) block (int64, exact).
    from routepack_opt.core.projection import block_loads  # numba, on first use (see rank_loads)

    if b_NLP.shape[0] != N:
        raise InputError(f"per-rank loads for {b_NLP.shape[0]} samples, lengths for {N}")
    L = b_NLP.shape[1]
    rg_N = r_N * topology.num_shards + topology.shard_array()[d_N]
    W = block_loads(np.asarray(b_NLP), np.ascontiguousarray(rg_N), rows * topology.num_shards)
    return _costs_from_W(lengths_N, r_N, d_N, W, rows, topology, cost, L, parts), W


def _rule_tables(placement: Placement) -> tuple[np.ndarray, np.ndarray]:
    rank_LEK = np.ascontiguousarray(placement.replica_ranks())
    return rank_LEK, np.ascontiguousarray(placement.logcnt)


def replica_rank_loads(counts_NLE: np.ndarray, placement: Placement) -> np.ndarray:
    """The search's linear surrogate ``b_NLP`` of a placement with replicas (each sample's tokens
    of e spread evenly over e's replicas, rounded per sample; core.projection)."""
    from routepack_opt.core.projection import surrogate_rank_loads

    rank_LEK, logcnt_LE = _rule_tables(placement)
    return surrogate_rank_loads(np.ascontiguousarray(counts_NLE), rank_LEK, logcnt_LE, placement.ep)


def replica_block_W(counts_NLE: np.ndarray, placement: Placement, row_N, slot_N, rows: int,
                    topology: Topology) -> np.ndarray:
    """``W[r·G + g, l·P + p]`` under the exact even-local replica rule (core.placement): what
    the dispatch sends to each rank, computed from each micro-batch's per-expert token counts."""
    from routepack_opt.core.projection import replica_block_loads

    N = counts_NLE.shape[0]
    r_N, d_N = _check_cells(N, row_N, slot_N, rows, topology.dp)
    D = topology.dp
    cell_N = r_N * D + d_N
    order_N = np.argsort(cell_N, kind="stable")
    cells_X, start_X = np.unique(cell_N[order_N], return_index=True)
    start_X = np.append(start_X, N).astype(np.int64)
    # every cell of the grid appears (empty ones with no samples) so the block count is R·G
    all_X = np.arange(rows * D, dtype=np.int64)
    full_start = np.searchsorted(cell_N[order_N], all_X, side="left").astype(np.int64)
    full_start = np.append(full_start, N).astype(np.int64)
    del cells_X, start_X
    q_D = np.empty(D, dtype=np.int64)
    q_D[topology.slots_of_shard()] = np.arange(topology.ep)[None, :]
    rank_LEK, logcnt_LE = _rule_tables(placement)
    return replica_block_loads(np.ascontiguousarray(counts_NLE), order_N.astype(np.int64), full_start,
                               all_X, q_D, rank_LEK, logcnt_LE, topology.shard_array(), D,
                               topology.num_shards, topology.ep)


@dataclasses.dataclass(frozen=True)
class RankImbalance:
    """EP-rank imbalance per (micro-batch row, shard, layer) block, from its rank loads W:
    ``ratio = max_p W / mean_p W`` and verl's ``MaxVio = (max_p W − mean_p W) / mean_p W``
    (blocks with no expert tokens are left out). ``per_layer_median[l]``: the median ratio of
    layer l over the row-shard blocks."""

    median: float
    p90: float
    max: float
    maxvio_mean: float
    maxvio_median: float
    per_layer_median: tuple[float, ...] = dataclasses.field(repr=False, default=())

    def report(self) -> dict:
        return {"rank_imbalance_median": self.median, "rank_imbalance_p90": self.p90,
                "rank_imbalance_max": self.max, "maxvio_mean": self.maxvio_mean,
                "maxvio_median": self.maxvio_median}


def rank_imbalance(W, rows: int, topology: Topology, num_layers: int) -> RankImbalance:
    """:class:`RankImbalance` of block loads ``W[r·G + g, l·P + p]``."""
    W_XLP = np.asarray(W, dtype=np.float64).reshape(rows * topology.num_shards, num_layers, topology.ep)
    mean_XL = W_XLP.mean(axis=2)
    ok = mean_XL > 0
    if not ok.any():
        return RankImbalance(1.0, 1.0, 1.0, 0.0, 0.0, tuple(1.0 for _ in range(num_layers)))
    ratio_XL = np.where(ok, W_XLP.max(axis=2) / np.where(ok, mean_XL, 1.0), np.nan)
    r = ratio_XL[ok]
    per_layer = tuple(float(np.nanmedian(ratio_XL[:, l])) if ok[:, l].any() else 1.0
                      for l in range(num_layers))
    return RankImbalance(median=float(np.median(r)), p90=float(np.quantile(r, 0.9)), max=float(r.max()),
                         maxvio_mean=float((r - 1).mean()), maxvio_median=float(np.median(r - 1)),
                         per_layer_median=per_layer)


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """Both objectives' scores, the bounds and the gap of one layout.

    ``lower_bound``: the bound that applies to the layout's placement (for a placement without
    replicas, docs/model.md's bound under that placement; with replicas, the bound over every
    placement with as many slots). ``force_balanced_lower_bound``: every rank gets 1/P of every
    layer's expert tokens in every row (valid for any placement, replicas or not).
    ``imbalance``: EP-rank imbalance per (row, shard, layer) block. ``replica_bytes_per_rank``:
    expert state a rank holds beyond E/P experts (``cost.expert_bytes`` per extra slot)."""

    objective: Objective
    J: np.ndarray
    scores: dict[Objective, Score]
    lower_bound: float
    placement_free_lower_bound: float
    force_balanced_lower_bound: float = 0.0
    imbalance: RankImbalance | None = None
    redundant_experts: int = 0
    replica_bytes_per_rank: float = 0.0

    @property
    def score(self) -> Score:
        return self.scores[self.objective]

    @property
    def gap(self) -> float:
        return self.score.makespan / self.lower_bound if self.lower_bound > 0 else float("inf")

    @property
    def gap_force_balanced(self) -> float:
        fb = self.force_balanced_lower_bound
        return self.score.makespan / fb if fb > 0 else float("inf")

    def report(self) -> dict:
        other = self.objective.other
        s = self.score
        d = {"objective": self.objective, "makespan": s.makespan, "total": s.total,
             "peak": s.peak, "other_objective": other,
             "other_makespan": self.scores[other].makespan,
             "makespan_max_sum": self.scores[Objective.MAX_SUM].makespan,
             "makespan_sum_max": self.scores[Objective.SUM_MAX].makespan,
             "lower_bound": self.lower_bound,
             "placement_free_lower_bound": self.placement_free_lower_bound, "gap": self.gap,
             "force_balanced_lower_bound": self.force_balanced_lower_bound,
             "gap_force_balanced": self.gap_force_balanced,
             "redundant_experts": self.redundant_experts,
             "replica_bytes_per_rank": self.replica_bytes_per_rank}
        if self.imbalance is not None:
            d.update(self.imbalance.report())
        return d


class Evaluator:
    """Cost authority for one window, topology and cost model (PyVRP's ``CostEvaluator`` habit).

    A placement is a :class:`Placement`; a permutation ``π[l, e]`` array is taken as the
    placement without replicas (:func:`~routepack_opt.core.placement.as_placement`, the one
    conversion). Without replicas a layout is scored from per-sample rank loads ``b_NLP``,
    cached for the last placement, so scoring many layouts under one placement projects counts
    once. With replicas the expert term depends on each micro-batch's per-expert counts (the
    integer even-local split, core.placement), so it is computed per layout
    (:func:`replica_block_W`)."""

    def __init__(self, window: Window, topology: Topology, cost: CostModel):
        check_type(window, "window", Window)
        check_type(topology, "topology", Topology)
        check_type(cost, "cost", CostModel)
        topology.check_experts(window.num_experts)
        self.window = window
        self.topology = topology
        self.cost = cost
        self._load_LE = window.expert_loads()
        self._cache_key: tuple | None = None
        self._b: np.ndarray | None = None
        self._attention: tuple[tuple, float] | None = None  # (what it is of, attention_lower_bound)

    def _placement(self, placement) -> Placement:
        pl = as_placement(placement, self.topology.ep)
        L, E = self.window.num_layers, self.window.num_experts
        if (pl.num_layers, pl.num_experts) != (L, E) or pl.ep != self.topology.ep:
            raise InputError(f"placement: built for L={pl.num_layers}, E={pl.num_experts}, ep={pl.ep}; "
                             f"window and topology have L={L}, E={E}, ep={self.topology.ep}")
        return pl

    def _terms(self, placement) -> _ExpertTerms:
        """How the expert term of ``placement`` is computed: from the exact per-sample rank loads
        (no replicas), or per cell under the even-local split (replicas)."""
        pl = self._placement(placement)
        return _PlainTerms(self, pl) if pl.is_permutation else _ReplicaTerms(self, pl)

    def rank_loads(self, placement) -> np.ndarray:
        """Per-sample rank loads ``b_NLP``: exact without replicas, the linear surrogate with."""
        pl = self._placement(placement)
        key = (pl.phy2log.shape, pl.phy2log.tobytes())
        if key != self._cache_key:
            self._b = self._terms(pl).rank_loads()
            self._cache_key = key
        assert self._b is not None
        return self._b

    def block_loads(self, placement, row_N, slot_N, rows: int) -> np.ndarray:
        """``W[r·G + g, l·P + p]``: the expert tokens each rank receives per (row, shard, layer)."""
        return self._costs_W(placement, row_N, slot_N, rows, False)[1]

    def _costs_W(self, placement, row_N, slot_N, rows: int, parts: bool):
        return self._terms(placement).costs_W(row_N, slot_N, rows, parts)

    def costs(self, placement, row_N, slot_N, rows: int, parts: bool = False):
        return self._costs_W(placement, row_N, slot_N, rows, parts)[0]

    def score(self, placement, row_N, slot_N, rows: int, objective: Objective | str) -> Score:
        return score_from_J(self.costs(placement, row_N, slot_N, rows), objective)

    def lower_bound(self, placement, rows: int) -> float:
        """The bound that applies to ``placement`` (see :class:`Evaluation`)."""
        return self._terms(placement).lower_bound(rows)

    def attention_lower_bound(self) -> float:
        """:func:`~routepack_opt.core.bounds.attention_lower_bound` of this window, computed once
        (every row count's and placement's bound shares it; at N = 10^6 it is a sort)."""
        key = (self.window, self.topology, self.cost)  # compared by identity: held, so never reused
        if self._attention is None or any(a is not b for a, b in zip(self._attention[0], key)):
            self._attention = (key, attention_lower_bound(self.window.lengths, self.topology, self.cost))
        return self._attention[1]

    def placement_free_lower_bound(self, rows: int, redundant: int = 0) -> float:
        return placement_free_lower_bound(self.window.lengths, self._load_LE, rows, self.topology, self.cost,
                                          redundant=redundant, attention=self.attention_lower_bound())

    def force_balanced_lower_bound(self, rows: int) -> float:
        return force_balanced_lower_bound(self.window.lengths, self._load_LE, rows, self.topology, self.cost,
                                          attention=self.attention_lower_bound())

    def evaluate(self, placement, row_N, slot_N, rows: int,
                 objective: Objective | str = Objective.MAX_SUM) -> Evaluation:
        J, W = self._costs_W(placement, row_N, slot_N, rows, False)
        red = self._placement(placement).redundant
        return Evaluation(objective=check_objective(objective), J=J,
                          scores={o: score_from_J(J, o) for o in Objective},
                          lower_bound=self.lower_bound(placement, rows),
                          placement_free_lower_bound=self.placement_free_lower_bound(rows, red),
                          force_balanced_lower_bound=self.force_balanced_lower_bound(rows),
                          imbalance=rank_imbalance(W, rows, self.topology, self.window.num_layers),
                          redundant_experts=red,
                          replica_bytes_per_rank=red / self.topology.ep * self.cost.expert_bytes)

    def score_layout(self, placement, layout: Layout, objective: Objective | str) -> Score:
        """:meth:`score` of a :class:`Layout`."""
        return self.score(placement, layout.row, layout.slot, layout.rows, objective)

    def evaluate_layout(self, placement, layout: Layout, objective: Objective | str = Objective.MAX_SUM) -> Evaluation:
        """:meth:`evaluate` of a :class:`Layout`."""
        return self.evaluate(placement, layout.row, layout.slot, layout.rows, objective)

    def evaluate_plan(self, plan: Plan, objective: Objective | str | None = None) -> Evaluation:
        check_type(plan, "plan", Plan)
        objective = plan.objective if objective is None else check_objective(objective)  # '' is no objective
        errs = plan.validate(self.window)
        if errs:
            more = f" (+{len(errs) - 5} more)" if len(errs) > 5 else ""
            raise InputError("invalid plan: " + "; ".join(errs[:5]) + more)
        return self.evaluate_layout(plan.placement, plan.layout, objective)


def evaluate_plan(window: Window, plan: Plan, cost: CostModel,
                  objective: Objective | str | None = None) -> Evaluation:
    """Validate ``plan`` against ``window`` and score it (both objectives, bounds, gap)."""
    check_type(plan, "plan", Plan)
    return Evaluator(window, plan.topology, cost).evaluate_plan(plan, objective)


class _PlainTerms:
    """The expert term of a placement without replicas: exact per-sample rank loads ``b_NLP``
    (cached by the evaluator), summed per block; the layout bound of that placement."""

    def __init__(self, ev: Evaluator, pl: Placement):
        self.ev, self.pl = ev, pl

    def rank_loads(self) -> np.ndarray:
        return rank_loads(self.ev.window.counts, self.pl.permutation(), self.ev.topology.ep)

    def costs_W(self, row_N, slot_N, rows: int, parts: bool):
        ev = self.ev
        return _row_shard_costs_W(ev.window.lengths, ev.rank_loads(self.pl), row_N, slot_N, rows,
                                  ev.topology, ev.cost, parts)

    def lower_bound(self, rows: int) -> float:
        ev = self.ev
        Lagg_LP = expert_rank_loads(ev._load_LE, self.pl.permutation(), ev.topology.ep)
        return layout_lower_bound(ev.window.lengths, Lagg_LP, rows, ev.topology, ev.cost,
                                  attention=ev.attention_lower_bound())


class _ReplicaTerms:
    """The expert term of a placement with replicas: the linear surrogate for the search's
    ``b_NLP``, the exact even-local split per cell for scoring, the placement-free bound."""

    def __init__(self, ev: Evaluator, pl: Placement):
        self.ev, self.pl = ev, pl

    def rank_loads(self) -> np.ndarray:
        return replica_rank_loads(self.ev.window.counts, self.pl)

    def costs_W(self, row_N, slot_N, rows: int, parts: bool):
        ev = self.ev
        W = replica_block_W(ev.window.counts, self.pl, row_N, slot_N, rows, ev.topology)
        lengths_N = np.asarray(ev.window.lengths, dtype=np.float64)
        r_N, d_N = _check_cells(lengths_N.shape[0], row_N, slot_N, rows, ev.topology.dp)
        return _costs_from_W(lengths_N, r_N, d_N, W, rows, ev.topology, ev.cost,
                             ev.window.num_layers, parts), W

    def lower_bound(self, rows: int) -> float:
        return self.ev.placement_free_lower_bound(rows, self.pl.redundant)


_ExpertTerms = _PlainTerms | _ReplicaTerms

"""Typed reports of a planning call: what ran, how long it took, and how good the result is.

A :class:`PlanReport` travels inside a :class:`routepack_opt.core.plan.Plan`; it becomes JSON only
at the IO boundary (``PlanReport.to_json()``, the plan file's ``info`` object, docs/formats.md),
and a plan file's ``info`` is read back with :meth:`PlanReport.from_json`. The JSON keys are those
the plan files have always had.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

__all__ = ["SearchStats", "JointStats", "EvaluationSummary", "PlanReport"]


def _num(x: Any) -> Any:
    """A numpy scalar as its Python value (JSON has no numpy types)."""
    return x.item() if hasattr(x, "item") and not isinstance(x, (list, dict)) else x


@dataclasses.dataclass(frozen=True)
class SearchStats:
    """Statistics of one population-annealing run (``info.search`` in a plan file).

    ``sweeps`` is fractional (proposals / N); ``seconds`` is the whole call, ``search_seconds`` /
    ``search_cpu_seconds`` the temperature ladder alone; ``best_seed`` indexes the seeds;
    ``stopped_by_time``: the clock or a cancel ended it before the ladder did. ``trace`` (the
    anytime curve) and ``seed_energies`` are kept in memory but not written to plan files."""

    sweeps: float
    replicas: int
    temperatures_done: int
    temperatures: int
    moves_proposed: int
    moves_evaluated: int
    moves_accepted: int
    seconds: float
    search_seconds: float
    search_cpu_seconds: float
    moves_per_second: float
    moves_per_cpu_second: float
    t_hot: float
    t_cold: float
    seeds: int
    best_seed: int
    greedy_seed: bool
    improved: bool
    stopped_by_time: bool
    t_hot_quantile: float = 0.5  # the quantile T_hot came from (t_hot_quantile or ..._near)
    seed_gap: float = -1.0  # best seed's makespan / layout lower bound − 1 (−1: no bound)
    timings: Mapping[str, float] = dataclasses.field(default_factory=dict)
    trace: tuple[Mapping[str, float], ...] = dataclasses.field(default=(), repr=False)
    seed_energies: tuple[float, ...] = dataclasses.field(default=(), repr=False)

    _NOT_IN_JSON = ("trace", "seed_energies")

    @classmethod
    def from_anneal(cls, stats: Mapping[str, Any]) -> SearchStats:
        """From the annealer's ``AnnealResult.stats``."""
        names = {f.name for f in dataclasses.fields(cls)}
        d = {k: _num(v) for k, v in stats.items() if k in names}
        d["timings"] = {k: _num(v) for k, v in dict(stats.get("timings") or {}).items()}
        d["trace"] = tuple(stats.get("trace") or ())
        d["seed_energies"] = tuple(float(e) for e in stats.get("seed_energies") or ())
        return cls(**d)

    def to_json(self) -> dict:
        return {f.name: (dict(getattr(self, f.name)) if f.name == "timings" else getattr(self, f.name))
                for f in dataclasses.fields(self) if f.name not in self._NOT_IN_JSON}


@dataclasses.dataclass(frozen=True)
class JointStats:
    """Statistics of the joint placement search (``info.joint`` in a plan file).

    ``start``: the start that won (``stay``, ``from-current`` or ``from-placement0``) and
    ``starts`` every start tried; ``rounds``: refinement + packing rounds of the winner;
    ``lower_bound`` / ``lower_bound_start``: the evaluator's bound under the final / starting
    placement; ``migration``: the moves against the materialized placement (or the start);
    ``objective_value`` = makespan + w·migration time when migration was optimised."""

    start: str
    wall_s: float
    starts: tuple[str, ...]
    rounds: int
    lower_bound: float
    lower_bound_start: float
    migration_optimised: bool
    migration: Mapping[str, float]
    objective_value: float

    @classmethod
    def from_joint(cls, stats: Mapping[str, Any]) -> JointStats:
        """From the joint search's ``JointResult.stats``."""
        mig = {k: _num(v) for k, v in dict(stats["migration"]).items() if k != "moved_per_layer"}
        return cls(start=stats["start"], wall_s=float(stats["wall_s"]), starts=tuple(stats["starts"]),
                   rounds=int(stats["rounds"]), lower_bound=float(stats["lower_bound"]),
                   lower_bound_start=float(stats["lower_bound_start"]),
                   migration_optimised=bool(stats["migration_optimised"]), migration=mig,
                   objective_value=float(stats["objective_value"]))

    def to_json(self) -> dict:
        # ``starts`` is written as {name: {}}, the form plan files have always had.
        return {"start": self.start, "wall_s": self.wall_s, "starts": {n: {} for n in self.starts},
                "rounds": self.rounds, "lower_bound": self.lower_bound,
                "lower_bound_start": self.lower_bound_start,
                "migration_optimised": self.migration_optimised, "migration": dict(self.migration),
                "objective_value": self.objective_value}


@dataclasses.dataclass(frozen=True)
class EvaluationSummary:
    """The evaluator's verdict on a plan (``Evaluation.report()``): both objectives' makespans,
    the bounds and ``gap`` = makespan / lower bound; the force-balanced bound and the gap to it;
    the EP-rank imbalance per (row, shard, layer) block (max/mean: median, 90 % quantile, max;
    verl's MaxVio = max/mean − 1: mean, median); the redundant slots per layer and the expert
    state they add per rank (bytes)."""

    objective: str
    makespan: float
    total: float
    peak: float
    other_objective: str
    other_makespan: float
    makespan_max_sum: float
    makespan_sum_max: float
    lower_bound: float
    placement_free_lower_bound: float
    gap: float
    force_balanced_lower_bound: float | None = None
    gap_force_balanced: float | None = None
    redundant_experts: int = 0
    replica_bytes_per_rank: float = 0.0
    rank_imbalance_median: float | None = None
    rank_imbalance_p90: float | None = None
    rank_imbalance_max: float | None = None
    maxvio_mean: float | None = None
    maxvio_median: float | None = None

    def to_json(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


_EVAL_FIELDS = dataclasses.fields(EvaluationSummary)
_EVAL_KEYS = tuple(f.name for f in _EVAL_FIELDS if f.default is dataclasses.MISSING)
_EVAL_OPTIONAL = tuple(f.name for f in _EVAL_FIELDS if f.default is not dataclasses.MISSING)


@dataclasses.dataclass(frozen=True)
class PlanReport:
    """What a planning call did (every field optional: a plan from the pipeline fills most,
    a baseline or an exact model's plan few).

    ``placement_kind``: ``lpt``, ``lpt-plain``, ``identity``, ``joint`` or ``given``;
    ``seed_scores``: makespan of every length-only seed; ``search`` / ``joint``: the searches'
    statistics; ``fallback``: why the plan is a fallback, if it is; ``timings``: seconds per stage
    (``total`` excludes ``warmup``); ``notes``: other producers' facts (e.g. an exact model's
    ``status`` and ``bound``, a baseline's ``packing``); ``evaluation``: the evaluator's scores."""

    placement_kind: str | None = None
    seed_scores: Mapping[str, float] | None = None
    search: SearchStats | None = None
    fallback: str | None = None
    joint: JointStats | None = None
    timings: Mapping[str, float] | None = None
    notes: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    evaluation: EvaluationSummary | None = None

    def replace(self, **changes: Any) -> PlanReport:
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict:
        """The ``info`` object of a plan file (docs/formats.md)."""
        d: dict[str, Any] = {}
        if self.placement_kind is not None:
            d["placement_kind"] = self.placement_kind
        if self.seed_scores is not None:
            d["seed_scores"] = dict(self.seed_scores)
        if self.search is not None:
            d["search"] = self.search.to_json()
        if self.fallback is not None:
            d["fallback"] = self.fallback
        if self.joint is not None:
            d["joint"] = self.joint.to_json()
        if self.timings is not None:
            d["timings"] = dict(self.timings)
        d.update(self.notes)
        if self.evaluation is not None:
            d.update(self.evaluation.to_json())
        return d

    @classmethod
    def from_json(cls, info: Mapping[str, Any]) -> PlanReport:
        """A plan file's ``info`` back. Lenient (plan files from other versions and tools): what
        does not parse into a typed field stays, as written, in ``notes``."""
        info = dict(info)
        notes: dict[str, Any] = {}
        typed: dict[str, Any] = {}
        if all(k in info for k in _EVAL_KEYS):
            typed["evaluation"] = EvaluationSummary(**{k: info.pop(k) for k in _EVAL_KEYS},
                                                    **{k: info.pop(k) for k in _EVAL_OPTIONAL if k in info})
        for key, value in info.items():
            try:
                if key == "search" and isinstance(value, dict):
                    typed[key] = SearchStats.from_anneal(value)
                elif key == "joint" and isinstance(value, dict):
                    typed[key] = JointStats.from_joint(value)
                elif key in ("placement_kind", "fallback") and isinstance(value, str):
                    typed[key] = value
                elif key in ("seed_scores", "timings") and isinstance(value, dict):
                    typed[key] = dict(value)
                else:
                    notes[key] = value
            except (KeyError, TypeError, ValueError):
                notes[key] = value
        return cls(notes=notes, **typed)

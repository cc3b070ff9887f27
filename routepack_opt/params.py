"""Parameters of the planner: one frozen tree, loadable from one TOML file (``--config``).

::

    [anneal]            # population annealing (AnnealConfig)
    population = 16
    [joint]             # joint placement search (JointParams)
    max_rounds = 3
    [refine]            # placement refinement inside each joint round (RefineConfig)
    max_passes = 4
    [certify]           # R* certification (CertifyParams)
    time_limit = 10.0
    [seeds]             # length-only seed layouts (SeedParams)
    time_limit = 10.0
    [rows]              # the choice of the row count R in [R*, R_max] (RowParams)
    extra = 4

Every section and key is optional; an unknown section or key is an ``InputError`` naming it. A
file without any section is read as ``[anneal]`` (the older ``--config ANNEAL.toml`` form). The
defaults are the planner's behaviour (a default ``PlannerParams()`` plans exactly as before the
parameters were gathered here). Per-call budgets — ``time_limit``, ``max_sweeps``, ``seed`` — are
arguments of :func:`routepack_opt.solve`, not parameters: they change from call to call.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from routepack_opt.core.checks import check_choice, check_time_limit
from routepack_opt.core.errors import InputError, load_document
from routepack_opt.heuristics.anneal import AnnealConfig
from routepack_opt.heuristics.placement.joint import JointConfig
from routepack_opt.heuristics.placement.refine import RefineConfig

__all__ = ["PlannerParams", "JointParams", "CertifyParams", "SeedParams", "RowParams", "CERTIFY_METHODS"]

CERTIFY_METHODS = ("auto", "cpsat", "arcflow")


def _share(section: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
        raise InputError(f"{section}: share must be a number in (0, 1], got {v!r}")
    return float(v)


def _seconds(section: str, v: Any) -> float:
    return check_time_limit(v, f"{section}: time_limit")


@dataclasses.dataclass(frozen=True)
class JointParams:
    """The joint placement search (``placement="joint"``): ``max_rounds`` rounds of (placement
    refinement + packing); the other fields are :class:`JointConfig`'s. Three rounds of four
    refinement passes are deterministic and give most of the gain of longer runs
    (experiments/results/joint_placement/joint_placement.md)."""

    max_rounds: int = 3
    migration_weight: float = 1.0
    sticky: bool = True
    min_rel_gain: float = 1e-6

    def __post_init__(self) -> None:
        if isinstance(self.max_rounds, bool) or not isinstance(self.max_rounds, int) or self.max_rounds < 1:
            raise InputError(f"joint: max_rounds must be an integer ≥ 1, got {self.max_rounds!r}")
        if not isinstance(self.sticky, bool):
            raise InputError(f"joint: sticky must be true or false, got {self.sticky!r}")
        for name in ("migration_weight", "min_rel_gain"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise InputError(f"joint: {name} must be a number, got {v!r}")
            object.__setattr__(self, name, float(v))
        self.config(RefineConfig(), None)  # JointConfig's own checks

    def config(self, refine: RefineConfig, anneal_sweeps: int | None) -> JointConfig:
        """The :class:`JointConfig` of one call (``anneal_sweeps``: the call's sweep budget)."""
        return JointConfig(refine=refine, anneal_sweeps=anneal_sweeps, max_rounds=self.max_rounds,
                           migration_weight=self.migration_weight, sticky=self.sticky,
                           min_rel_gain=self.min_rel_gain)


@dataclasses.dataclass(frozen=True)
class CertifyParams:
    """R* certification: at most ``time_limit`` seconds and at most ``share`` of the call's time
    limit; ``method`` is the exact model used where bounds and packings do not meet."""

    time_limit: float = 10.0
    share: float = 0.2
    method: str = "auto"

    def __post_init__(self) -> None:
        object.__setattr__(self, "time_limit", _seconds("certify", self.time_limit))
        object.__setattr__(self, "share", _share("certify", self.share))
        check_choice(self.method, "certify: method", CERTIFY_METHODS)


@dataclasses.dataclass(frozen=True)
class SeedParams:
    """The length-only seed layouts (KK, FFD) with their cap repair: at most ``time_limit``
    seconds together, and at most ``share`` of the call's time limit."""

    time_limit: float = 10.0
    share: float = 0.2

    def __post_init__(self) -> None:
        object.__setattr__(self, "time_limit", _seconds("seeds", self.time_limit))
        object.__setattr__(self, "share", _share("seeds", self.share))


@dataclasses.dataclass(frozen=True)
class RowParams:
    """The row count as a decision (docs/pipeline.md, step 2b). Without a forced ``rows`` the
    planner searches R in [R*, R_max]: ``R_max`` = ``max_rows`` when set (> 0), else R* + ``extra``
    row multiples; never more than N / D (a sample per cell). Every candidate R whose layout
    lower bound (which grows with R by the per-micro-batch overhead) reaches the best makespan
    found is pruned. ``screen_share`` of the sweep budget (or of the time left) screens the
    candidates (each R: its length-only seeds and a short annealing run); the rest goes to the
    best one. A gap at R* of at most ``tight_gap`` (makespan / lower bound) after its screening
    ends the search at R*, and ``patience`` counts screened in a row that are each worse than
    the best so far end it there (makespans rise past the best count: on qwen3-30b-a3b windows
    each further row only added overhead). ``extra = 0`` plans at R* (the behaviour before the
    row search)."""

    extra: int = 4
    max_rows: int = 0
    tight_gap: float = 1.01
    screen_share: float = 0.3
    patience: int = 2

    def __post_init__(self) -> None:
        if isinstance(self.extra, bool) or not isinstance(self.extra, int) or not 0 <= self.extra <= 4096:
            raise InputError(f"rows: extra must be an integer in 0..4096, got {self.extra!r}")
        if isinstance(self.max_rows, bool) or not isinstance(self.max_rows, int) or self.max_rows < 0:
            raise InputError(f"rows: max_rows must be an integer ≥ 0 (0: R* + extra), got {self.max_rows!r}")
        if isinstance(self.patience, bool) or not isinstance(self.patience, int) or self.patience < 1:
            raise InputError(f"rows: patience must be an integer ≥ 1, got {self.patience!r}")
        v = self.tight_gap
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 1:
            raise InputError(f"rows: tight_gap must be a number ≥ 1, got {v!r}")
        object.__setattr__(self, "tight_gap", float(v))
        v = self.screen_share
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1:
            raise InputError(f"rows: screen_share must be a number in (0, 1), got {v!r}")
        object.__setattr__(self, "screen_share", float(v))


# section name → parameter class (the TOML sections, in the order documented)
_SECTIONS: dict[str, type] = {"anneal": AnnealConfig, "joint": JointParams, "refine": RefineConfig,
                              "certify": CertifyParams, "seeds": SeedParams, "rows": RowParams}


def _section(name: str, cls: type, data: Any) -> Any:
    if not isinstance(data, Mapping):
        raise InputError(f"config: [{name}] must be a table of parameters")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise InputError(f"config: unknown parameter(s) {', '.join(unknown)} in [{name}] "
                         f"(known: {', '.join(sorted(known))})")
    return cls(**data)


@dataclasses.dataclass(frozen=True)
class PlannerParams:
    """Every parameter of the planner (frozen; each section checks itself when built).

    ``refine`` defaults to 4 passes per joint round (the joint stage's budget), not
    :class:`RefineConfig`'s own 8."""

    anneal: AnnealConfig = AnnealConfig()
    joint: JointParams = JointParams()
    refine: RefineConfig = RefineConfig(max_passes=4)
    certify: CertifyParams = CertifyParams()
    seeds: SeedParams = SeedParams()
    rows: RowParams = RowParams()

    def __post_init__(self) -> None:
        for name, cls in _SECTIONS.items():
            if not isinstance(getattr(self, name), cls):
                raise InputError(f"params: {name} must be a {cls.__name__}, got {getattr(self, name)!r}")

    def replace(self, **changes: Any) -> PlannerParams:
        """A copy with whole sections replaced (checked again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlannerParams:
        """From ``{"anneal": {...}, "joint": {...}, ...}``; a missing section or key keeps its
        default (for ``refine``: the planner's 4 passes)."""
        if not isinstance(data, Mapping):
            raise InputError("config: expected a table of sections")
        if data and not any(isinstance(v, Mapping) for v in data.values()):
            data = {"anneal": data}  # no sections: the older ANNEAL.toml form
        unknown = sorted(set(data) - set(_SECTIONS))
        if unknown:
            raise InputError(f"config: unknown section(s) {', '.join(f'[{u}]' for u in unknown)} "
                             f"(known: {', '.join(f'[{s}]' for s in _SECTIONS)})")
        default = cls()
        sections = {}
        for name, cls_ in _SECTIONS.items():
            if name in data:
                base = dataclasses.asdict(getattr(default, name))
                _section(name, cls_, data[name])  # unknown keys named before merging
                sections[name] = cls_(**{**base, **data[name]})
        return cls(**sections)

    @classmethod
    def from_toml(cls, path: str | Path) -> PlannerParams:
        """Read a TOML file of sections (module docstring)."""
        return load_document(path, "config", "toml", cls.from_dict)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """The sections as plain tables (``from_dict(p.to_dict()) == p``)."""
        return {name: dataclasses.asdict(getattr(self, name)) for name in _SECTIONS}

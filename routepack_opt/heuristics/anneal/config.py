"""Parameters and result of the population annealer (frozen dataclasses, checked when built)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np

from routepack_opt.core.errors import InputError, load_document
from routepack_opt.core.objective import Objective
from routepack_opt.core.window import available_memory

__all__ = ["AnnealConfig", "AnnealResult", "check_sweep_budget"]


# Declared domain of the sizes (checked when a config is built or read; defaults 16, 24, 2048).
# Past them a config only buys time and memory the clock cannot take back: the ladder's arrays and
# rungs scale with ``temperatures``, the calibration's |ΔE| record with ``calibration_moves``.
MAX_SIZES = {"population": 4096, "temperatures": 4096, "calibration_moves": 1 << 22,
             "chunk_sweeps": 1 << 10, "swap_window": 1 << 20, "window_bytes": 1 << 40}
MAX_WALK_SWEEPS = 1e4
# The most proposals one replica may be asked for (sweeps × N): about an hour of search on one
# core at ~100 ns a proposal and 16 replicas; past it a sweep budget is refused, not run unbounded.
MAX_PROPOSALS = 1 << 31
MAX_SEEDS = 8  # seed layouts of a search: the caller's (KK, FFD, ...) and the greedy
MIN_REPLICA_BYTES = 256  # the fixed part of one replica's state (aggregates, stream, counters)


@dataclasses.dataclass(frozen=True)
class AnnealConfig:
    """Parameters of the search (frozen; checked when built; ``from_toml`` reads a file).

    The default budget (``population × sweeps`` sweeps of N proposals) plans a production window
    (N=1024, L=48, E=256, k=8, D=32, P=8) in about a second on two cores.
    """

    population: int = 16  # replicas K
    temperatures: int = 24  # rungs of the geometric ladder
    sweeps: int = 200  # sweeps per replica over the whole ladder (one sweep = N proposals)
    p_swap: float = 0.7  # probability a proposal is a swap (else a relocation)
    p_guide: float = 0.3  # probability the moved sample is drawn from the bottleneck
    p_near: float = 0.75  # probability a swap partner is a length-neighbour (within swap_window)
    # probability a guided sample comes from its block's costliest attention cell (the one that
    # sets the block's attention term) rather than a uniform cell of the block: with 0.5, plans at
    # the default budget were better on 30 of 35 windows (N = 256–2,048, D = 16–128, P = 8–64;
    # on 24 of them median −0.06 % max-sum, −0.13 % sum-max; worst +0.31 %), most on wide blocks
    p_guide_cell: float = 0.5
    swap_window: int = 16  # length-order neighbourhood (samples each side) of near swaps
    # probability a proposal is a three-sample rotation (anneal/move_rotate.py; drawn before the
    # swap/relocation choice). 0 (the default): never drawn, so plans are those without it,
    # draw for draw (see docs/annealer.md for its measured effect)
    p_rotate: float = 0.0
    t_hot_quantile: float = 0.5  # T_hot = this quantile of |ΔE| of random moves from the seeds
    # ... or this one on windows of at least near_min_samples samples whose best seed's makespan
    # is within near_gap of the layout lower bound (experiments/results/bench_latency: there a
    # hot start only undoes the seed, −0.1 to −0.8 % at N = 4k–16k with the cool one; a poor
    # seed still needs it, +1.2 % at N = 1,024, D = 128, and so do small windows, +0.08 % on
    # average over 40 windows of N ≤ 1,024)
    t_hot_quantile_near: float = 0.05
    near_gap: float = 0.05  # 0: always t_hot_quantile
    near_min_samples: int = 4096
    t_cold_ratio: float = 1e-3  # T_cold = t_cold_ratio · T_hot
    calibration_moves: int = 2048  # random proposals per seed to scale the ladder
    random_fraction: float = 0.5  # share of replicas started from random walks off a seed
    random_walk_sweeps: float = 1.0  # length of those walks (sweeps at infinite temperature)
    greedy_seed: bool = True  # add the joint-cost greedy layout to the seeds
    tie_eps: float = 1e-9  # η: relative weight of the tie-break terms (see search.py)
    chunk_sweeps: int = 2  # sweeps per compiled call (clock checks in between)
    # Row windows (moves.row_window): where b and W outgrow this many bytes, a replica's
    # unguided moves stay window_sweeps sweeps of a window's samples inside a window of rows whose
    # share of them fits it (0: never). Below it (every window of N ≤ 4,096 at L = 48, P = 8)
    # nothing changes; above it plans were equal or better (experiments/results/bench_window).
    window_bytes: int = 4 << 20
    window_sweeps: float = 2.0
    resample: bool = True  # systematic resampling between temperatures
    fill_time: bool = False  # with a time limit and no max_sweeps: use all of it (else ≤ sweeps)

    def __post_init__(self):
        ints = {"population": 1, "temperatures": 1, "sweeps": 1, "calibration_moves": 16,
                "chunk_sweeps": 1, "swap_window": 1, "near_min_samples": 1, "window_bytes": 0}
        for name, lo in ints.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
                raise InputError(f"anneal: {name} must be an integer ≥ {lo}, got {v!r}")
            most = MAX_SIZES.get(name)
            if most is not None and v > most:
                raise InputError(f"anneal: {name} = {v:,} is out of range (at most {most:,}; the "
                                 f"default is {getattr(AnnealConfig, name):,})")
            object.__setattr__(self, name, int(v))
        self._check_memory()
        unit = ("p_swap", "p_guide", "p_near", "p_guide_cell", "p_rotate", "random_fraction")
        for name in unit:
            v = _float(name, getattr(self, name))
            if not 0.0 <= v <= 1.0:
                raise InputError(f"anneal: {name} must be in [0, 1], got {v}")
            object.__setattr__(self, name, v)
        open_unit = ("t_hot_quantile", "t_hot_quantile_near", "t_cold_ratio")
        for name in open_unit:
            v = _float(name, getattr(self, name))
            if not 0.0 < v <= 1.0:
                raise InputError(f"anneal: {name} must be in (0, 1], got {v}")
            object.__setattr__(self, name, v)
        v = _float("near_gap", self.near_gap)
        if v < 0:
            raise InputError(f"anneal: near_gap must be ≥ 0, got {v}")
        object.__setattr__(self, "near_gap", v)
        v = _float("random_walk_sweeps", self.random_walk_sweeps)
        if not 0 <= v <= MAX_WALK_SWEEPS:
            raise InputError(f"anneal: random_walk_sweeps must be in [0, {MAX_WALK_SWEEPS:g}], got {v}")
        object.__setattr__(self, "random_walk_sweeps", v)
        v = _float("window_sweeps", self.window_sweeps)
        if not v > 0:
            raise InputError(f"anneal: window_sweeps must be > 0, got {v}")
        object.__setattr__(self, "window_sweeps", v)
        v = _float("tie_eps", self.tie_eps)
        if not 0.0 < v <= 1e-3:
            raise InputError(f"anneal: tie_eps must be in (0, 1e-3], got {v}")
        object.__setattr__(self, "tie_eps", v)
        for name in ("greedy_seed", "resample", "fill_time"):
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"anneal: {name} must be true or false, got {getattr(self, name)!r}")

    def _check_memory(self) -> None:
        """The least memory the sizes imply, whatever the window: ``calibration_moves`` |ΔE| of
        up to ``MAX_SEEDS`` seeds (float64) and ``population`` replicas of at least
        ``MIN_REPLICA_BYTES`` each (the search checks the exact figure for its window)."""
        need = 8 * self.calibration_moves * MAX_SEEDS + MIN_REPLICA_BYTES * self.population
        avail = available_memory()
        if avail is not None and need > avail:
            raise InputError(f"anneal: population = {self.population:,} and calibration_moves = "
                             f"{self.calibration_moves:,} need at least {need / 2**30:.1f} GiB; only "
                             f"{avail / 2**30:.1f} GiB is available")

    def replace(self, **changes) -> AnnealConfig:
        """A copy with ``changes`` (validated again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, data: dict) -> AnnealConfig:
        if not isinstance(data, dict):
            raise InputError("anneal: expected a table of parameters")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InputError(f"anneal: unknown parameter(s) {', '.join(unknown)} "
                             f"(known: {', '.join(sorted(known))})")
        return cls(**data)

    @classmethod
    def from_toml(cls, path: str | Path) -> AnnealConfig:
        """Read parameters from a TOML file: top-level keys or an ``[anneal]`` table."""
        return load_document(path, "config", "toml",
                             lambda d: cls.from_dict(d["anneal"] if "anneal" in d else d))


def _float(name: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise InputError(f"anneal: {name} must be a number, got {v!r}")
    v = float(v)
    if not math.isfinite(v):
        raise InputError(f"anneal: {name} must be finite, got {v}")
    return v


@dataclasses.dataclass(frozen=True)
class AnnealResult:
    """Best layout found. ``score`` = (makespan, total, peak) as computed by the search from its
    integer state (the evaluator agrees to rounding); ``energy`` is the scalar it minimised."""

    row: np.ndarray
    slot: np.ndarray
    energy: float
    score: tuple[float, float, float]
    objective: Objective
    stats: dict

    @property
    def makespan(self) -> float:
        return self.score[0]


def check_sweep_budget(sweeps, num_samples: int, name: str = "max_sweeps") -> int:
    """``sweeps`` (a positive integer) within :data:`MAX_PROPOSALS` proposals per replica for a
    window of ``num_samples`` samples; an :class:`InputError` naming the most that is taken."""
    if isinstance(sweeps, bool) or not isinstance(sweeps, (int, np.integer)) or sweeps < 1:
        raise InputError(f"{name} must be a positive integer, got {sweeps!r}")
    most = max(1, MAX_PROPOSALS // max(1, int(num_samples)))
    if sweeps > most:
        raise InputError(f"{name} = {int(sweeps):,} is out of range for {num_samples:,} samples (at most {most:,} "
                         f"sweeps: {MAX_PROPOSALS:,} proposals per replica); use a time limit for longer searches")
    return int(sweeps)

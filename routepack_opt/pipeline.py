"""The planning pipeline (docs/pipeline.md): placement → R* → seeds → population annealing → validate.

``plan()`` always returns a valid :class:`Plan`: if a stage fails it falls back to the best valid
length-only baseline and says so in ``plan.info["fallback"]``. Scores in the plan come from the one
evaluator, never from a solver's own bookkeeping.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from routepack_opt.core.cost import CostModel
from routepack_opt.core.errors import InfeasibleError, InputError
from routepack_opt.core.evaluate import Evaluator, check_objective
from routepack_opt.core.plan import Plan, check_placement
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import Window

__all__ = ["resolve_placement", "resolve_rows", "baseline_layouts", "plan", "layout_plan",
           "PLACEMENT_KINDS"]

PLACEMENT_KINDS = ("lpt", "lpt-plain", "identity", "joint")


def resolve_placement(window: Window, topology: Topology, placement) -> tuple[np.ndarray, str]:
    """``placement`` is ``"lpt"``, ``"identity"``, a [L, E] array or a :class:`Plan` (its
    placement is reused, e.g. the one already materialized)."""
    from routepack_opt.heuristics.placement.lpt import identity_placement, lpt_placement, swap_refine

    topology.check_experts(window.num_experts)
    if isinstance(placement, Plan):
        placement = placement.placement
    if isinstance(placement, str):
        load = window.expert_loads()
        if placement in ("lpt", "joint"):
            # Graham's LPT, then swaps off the busiest rank: never worse than LPT, and within
            # 0.3% of the proved per-layer bound where plain LPT is up to ~9% off
            # (experiments/results/placement_gap.md).
            return swap_refine(load, lpt_placement(load, topology.ep), topology.ep), "lpt"
        if placement == "lpt-plain":
            return lpt_placement(load, topology.ep), "lpt-plain"
        if placement == "identity":
            return identity_placement(window.num_layers, window.num_experts), "identity"
        raise InputError(f"placement must be one of {', '.join(PLACEMENT_KINDS)} or a plan file, got {placement!r}")
    arr = np.asarray(placement, dtype=np.int64)
    errs = check_placement(arr, window.num_layers, window.num_experts)
    if errs:
        raise InputError("given placement does not fit the window: " + errs[0])
    return arr, "given"


def resolve_rows(window: Window, topology: Topology, rows: int | None, time_limit: float = 10.0):
    """(R, certificate dict). Without ``rows``, R = R* from :func:`certify_rows`; with ``rows``,
    the row rules are checked and R* is still certified for the report."""
    from routepack_opt.certify import certify_rows

    cert = certify_rows(window, topology, time_limit=time_limit)
    cdict = cert.as_dict()
    if rows is None:
        return int(cert.rows), cdict
    if isinstance(rows, bool) or not isinstance(rows, (int, np.integer)) or rows < 1:
        raise InputError(f"--rows must be a positive integer, got {rows!r}")
    if not topology.row_ok(rows):
        raise InputError(f"--rows {rows} breaks the row rules (min_rows {topology.min_rows}, "
                         f"row_multiple {topology.row_multiple})")
    if rows * topology.dp > window.num_samples:
        raise InputError(f"--rows {rows}: {rows}×{topology.dp} cells need ≥ {rows * topology.dp} samples, "
                         f"window has {window.num_samples}")
    if rows < cert.lower_bound:
        raise InputError(f"--rows {rows} is below the proved minimum {cert.lower_bound} (no layout fits the cap)")
    return int(rows), cdict


def baseline_layouts(window: Window, topology: Topology, rows: int,
                     time_limit: float = 10.0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Every length-only baseline layout at exactly ``rows`` rows (name → (row_N, slot_N)).
    ``time_limit`` bounds them all together (their cap repair and, on tight windows, the exact
    packing of their last resort)."""
    from routepack_opt.heuristics.baselines import BASELINES

    out = {}
    end = time.perf_counter() + time_limit
    for k, (name, fn) in enumerate(BASELINES.items()):
        share = (end - time.perf_counter()) / (len(BASELINES) - k)  # an even split of what is left
        try:
            out[name] = fn(window.lengths, topology, rows, time_limit=max(0.05, share))
        except InfeasibleError:
            continue
    if not out:
        raise InputError(f"no feasible layout with {rows} rows for this window and capacity")
    return out


def layout_plan(window, topology, cost, placement, row, slot, rows, objective, info=None,
                certificate=None, evaluator: Evaluator | None = None) -> Plan:
    """A :class:`Plan` whose score, bound and gap come from the evaluator."""
    ev = evaluator or Evaluator(window, topology, cost)
    p = Plan(topology, int(rows), placement, row, slot, objective=objective, certificate=certificate,
             info=dict(info or {}))
    errs = p.validate(window)
    if errs:
        raise RuntimeError("internal: layout is invalid: " + "; ".join(errs[:3]))
    e = ev.evaluate(placement, row, slot, rows, objective)
    p.score = e.score.as_dict()
    p.lower_bound = e.lower_bound
    p.info.update(e.report())
    return p


def plan(window: Window, topology: Topology, cost: CostModel, objective: str = "max-sum",
         placement="lpt", rows: int | None = None, time_limit: float | None = None,
         max_sweeps: int | None = None, seed: int = 0, config=None, certify_time_limit: float = 10.0,
         progress: Callable[[float], None] | None = None, current_placement=None,
         certificate: dict | None = None, stop: Callable[[], bool] | None = None) -> Plan:
    """The full pipeline. ``time_limit`` bounds the search (anytime); ``max_sweeps`` + ``seed``
    make it bit-identical. ``placement="joint"`` refines the placement against row-local peaks
    together with the packing (and, with ``current_placement``, against migration cost).
    ``certificate`` (with ``rows``) reuses an R* certificate the caller already has.
    ``stop()`` (polled by the annealer, and before the joint stage) cancels cooperatively: the
    best layout so far is returned. Numba kernels are compiled/loaded by ``warm()`` before the
    clock starts (``info["timings"]["warmup"]``, not part of ``total``)."""
    from routepack_opt.heuristics.anneal import AnnealConfig, anneal
    from routepack_opt.warmup import groups_for, warm

    check_objective(objective)
    t_warm = time.perf_counter()
    warm(groups_for(placement))
    t_warm = time.perf_counter() - t_warm
    t_start = time.perf_counter()
    clock = _Clock(time_limit)
    timings = {}
    t0 = time.perf_counter()
    pl, pl_kind = resolve_placement(window, topology, placement)
    timings["placement"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    if certificate is not None and rows is not None:  # rows already checked by the caller
        R, cert = int(rows), certificate
    else:
        R, cert = resolve_rows(window, topology, rows, clock.share(_CERTIFY_SHARE, certify_time_limit))
    timings["certify"] = time.perf_counter() - t0
    ev = Evaluator(window, topology, cost)
    t0 = time.perf_counter()
    seeds = baseline_layouts(window, topology, R, clock.share(_SEEDS_SHARE, 10.0))
    b = ev.rank_loads(pl)
    t_score = time.perf_counter()
    seed_scores = {name: ev.score(pl, r, s, R, objective).key for name, (r, s) in seeds.items()}
    # what the final validation + scoring will cost, kept in hand (×3, with a floor)
    clock.reserve = 3.0 * (time.perf_counter() - t_score) / max(len(seeds), 1) + 0.02
    best_seed = min(seed_scores, key=seed_scores.get)
    timings["seeds"] = time.perf_counter() - t0
    info = {"placement_kind": pl_kind, "seed_scores": {k: v[0] for k, v in seed_scores.items()}}
    row, slot = seeds[best_seed]
    t0 = time.perf_counter()
    try:
        cfg = config if config is not None else AnnealConfig()
        if clock.expired():
            raise _OutOfTime(f"the {time_limit:g}s limit was spent before the search")
        res = anneal(window.lengths, b, topology, cost, R, objective, list(seeds.values()),
                     config=cfg, seed=seed, time_limit=clock.left(), max_sweeps=max_sweeps,
                     progress=progress, stop=stop)
        cand = Plan(topology, R, pl, res.row, res.slot, objective=objective)
        errs = cand.validate(window)
        if errs:
            raise RuntimeError("annealer returned an invalid layout: " + errs[0])
        if ev.score(pl, res.row, res.slot, R, objective).key <= seed_scores[best_seed]:
            row, slot = res.row, res.slot
        info["search"] = _stats_dict(res.stats)
    except _OutOfTime as exc:
        info["fallback"] = f"no search: {exc}; using baseline {best_seed}"
    except Exception as exc:  # fall back to the best valid baseline, and say so
        info["fallback"] = f"annealing failed ({exc.__class__.__name__}: {exc}); using baseline {best_seed}"
    timings["anneal"] = time.perf_counter() - t0
    if (pl_kind == "lpt" and placement == "joint" and not clock.expired()
            and not (stop is not None and stop())):
        t0 = time.perf_counter()
        try:
            from routepack_opt.heuristics.placement.joint import JointConfig, joint_search
            from routepack_opt.heuristics.placement.refine import RefineConfig

            remaining = clock.left()
            # Default budget: 3 rounds of (4 refinement passes + annealing): deterministic, and
            # most of the gain of longer runs (experiments/results/joint_placement.md).
            jr = joint_search(window, topology, cost, R, objective, pl, (row, slot), time_limit=remaining,
                              seed=seed, max_rounds=3, current_placement=current_placement,
                              config=JointConfig(refine=RefineConfig(max_passes=4),
                                                 anneal_sweeps=max_sweeps))
            cand = Plan(topology, R, jr.placement, jr.row, jr.slot, objective=objective)
            if not cand.validate(window):
                pl, row, slot, pl_kind = jr.placement, jr.row, jr.slot, "joint"
                info["joint"] = _stats_dict(getattr(jr, "stats", {}))
        except Exception as exc:
            info["fallback"] = f"joint placement failed ({exc.__class__.__name__}: {exc}); kept LPT"
        timings["joint"] = time.perf_counter() - t0
        info["placement_kind"] = pl_kind
    timings["total"] = time.perf_counter() - t_start
    timings["warmup"] = t_warm
    info["timings"] = timings
    return layout_plan(window, topology, cost, pl, row, slot, R, objective, info, cert, ev)


# Shares of the whole time limit that the stages before the search may take at most (each also
# keeps its own cap); the search gets what is left, less the reserve for the final scoring.
_CERTIFY_SHARE = 0.2
_SEEDS_SHARE = 0.2


class _OutOfTime(Exception):
    pass


class _Clock:
    """The pipeline's one time limit, counted from :func:`plan`'s start: every stage draws on
    it (R* certification and the seeds up to a share, the search the rest), and ``reserve``
    seconds stay in hand for the final validation and scoring."""

    def __init__(self, time_limit: float | None):
        if time_limit is not None and not (isinstance(time_limit, (int, float))
                                           and np.isfinite(time_limit) and time_limit > 0):
            raise InputError(f"time limit must be a positive number of seconds, got {time_limit!r}")
        self.limit = None if time_limit is None else float(time_limit)
        self.end = None if time_limit is None else time.perf_counter() + float(time_limit)
        self.reserve = 0.0

    def left(self) -> float | None:
        """Seconds left for the search (None: unlimited)."""
        if self.end is None:
            return None
        return max(0.0, self.end - self.reserve - time.perf_counter())

    def expired(self) -> bool:
        return self.end is not None and self.left() <= 0.0

    def share(self, fraction: float, cap: float) -> float:
        """A stage's limit: ``cap``, and at most ``fraction`` of the whole limit or what is left."""
        if self.end is None:
            return cap
        return max(0.01, min(cap, fraction * self.limit, self.left()))


def _stats_dict(stats) -> dict:
    if stats is None:
        return {}
    if isinstance(stats, dict):
        d = stats
    elif hasattr(stats, "__dataclass_fields__"):
        import dataclasses

        d = dataclasses.asdict(stats)
    else:
        d = dict(vars(stats))
    out = {}
    for k, v in d.items():
        if isinstance(v, (int, float, str, bool)) or v is None:
            out[k] = v
        elif isinstance(v, (np.integer, np.floating)):
            out[k] = v.item()
        elif isinstance(v, dict) or hasattr(v, "__dataclass_fields__"):
            out[k] = _stats_dict(v)
    return out

"""The planning pipeline (docs/pipeline.md): placement → R* → seeds → population annealing → validate.

:func:`solve` always returns a valid :class:`Plan`: if a stage fails it falls back to the best valid
length-only baseline and says so in ``plan.report.fallback``. Scores in the plan come from the one
evaluator, never from a solver's own bookkeeping. This module imports the compiled kernels (numba,
OR-Tools); ``import routepack_opt`` stays cheap because the package exports :func:`solve` lazily.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from routepack_opt.certify import Certificate, certify_rows, pack_into_bins
from routepack_opt.core.bounds import is_packing
from routepack_opt.core.checks import INT64_MAX, check_int, check_redundant_experts, check_time_limit, shown
from routepack_opt.core.cost import CostModel
from routepack_opt.core.errors import InfeasibleError, InputError
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.core.layout import Layout, check_rows
from routepack_opt.core.objective import Objective, check_objective
from routepack_opt.core.placement import Placement, as_placement
from routepack_opt.core.placement import slot_array as as_placement_array
from routepack_opt.core.plan import Plan, check_placement
from routepack_opt.core.report import EvaluationSummary, JointStats, PlanReport, SearchStats
from routepack_opt.core.sizing import too_costly
from routepack_opt.core.timing import Timings
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import Window
from routepack_opt.heuristics.anneal import Hooks, anneal
from routepack_opt.heuristics.anneal.config import MAX_SEEDS, check_sweep_budget
from routepack_opt.heuristics.baselines import BASELINES
from routepack_opt.heuristics.placement.joint import AlternateRules, alternate, anneal_packer, joint_search
from routepack_opt.heuristics.placement.lpt import lpt_placement, swap_refine
from routepack_opt.heuristics.placement.replicate import eplb_placement, replicated_placement
from routepack_opt.params import PlannerParams, RowParams
from routepack_opt.warmup import groups_for, warm

__all__ = ["solve", "build_plan", "resolve_placement", "resolve_rows", "certified_rows", "baseline_layouts",
           "row_candidates",
           "SharedPacker",
           "PLACEMENT_KINDS", "DEFAULT_PARAMS"]

PLACEMENT_KINDS = ("lpt", "lpt-plain", "identity", "joint", "eplb")
DEFAULT_PARAMS = PlannerParams()


def resolve_placement(window: Window, topology: Topology, placement) -> tuple[Placement, str]:
    """(the :class:`Placement`, its kind). ``placement`` is ``"lpt"``, ``"identity"``,
    ``"eplb"``, a [L, E] permutation array, a :class:`Placement` or a :class:`Plan` (its
    placement is reused, e.g. the one already materialized). With
    ``topology.redundant_experts > 0`` the placement has replicas (``lpt``/``joint``: replicate
    the hottest experts, LPT on distinct ranks, swaps; ``eplb``: DeepSeek EPLB's policy)."""
    topology.check_experts(window.num_experts)
    if isinstance(placement, str):
        return _built_placement(window, topology, placement)
    if isinstance(placement, Plan):
        placement = placement.placement
    pl = as_placement(placement, topology.ep)
    if pl.num_layers != window.num_layers or pl.num_experts != window.num_experts:
        raise InputError(f"given placement is for L={pl.num_layers}, E={pl.num_experts}; "
                         f"the window has L={window.num_layers}, E={window.num_experts}")
    red = topology.redundant_experts
    if pl.ep != topology.ep or pl.redundant != red:
        raise InputError(f"given placement has ep={pl.ep} and {pl.redundant} redundant "
                         f"slots; the topology has ep={topology.ep}, redundant_experts={red}")
    return pl, "given"


def _built_placement(window: Window, topology: Topology, kind: str) -> tuple[Placement, str]:
    """The placement the planner builds from the window's loads (:func:`resolve_placement`)."""
    load, ep, red = window.expert_loads(), topology.ep, topology.redundant_experts
    if red or kind == "eplb":
        S = topology.num_slots(window.num_experts)
        if kind in ("lpt", "joint", "lpt-plain"):
            return replicated_placement(load, ep, S), "lpt-replicated"
        if kind == "eplb":
            return eplb_placement(load, ep, S), "eplb"
        if kind == "identity":
            return Placement.identity(window.num_layers, window.num_experts, ep, red), "identity"
    elif kind in ("lpt", "joint"):
        # Graham's LPT, then swaps off the busiest rank: never worse than LPT, and within
        # 0.3% of the proved per-layer bound where plain LPT is up to ~9% off
        # (experiments/results/placement_gap/placement_gap.md).
        return Placement.from_permutation(swap_refine(load, lpt_placement(load, ep), ep), ep), "lpt"
    elif kind == "lpt-plain":
        return Placement.from_permutation(lpt_placement(load, ep), ep), "lpt-plain"
    elif kind == "identity":
        return Placement.identity(window.num_layers, window.num_experts, ep), "identity"
    raise InputError(f"placement must be one of {', '.join(PLACEMENT_KINDS)} or a plan file, got {kind!r}")


def check_current_placement(current_placement, window: Window) -> np.ndarray | None:
    """The materialized placement as an [L, E] array that fits ``window``, or None; a bad one is
    an InputError (never dropped silently), as the CLI's ``--placement-from``."""
    if current_placement is None:
        return None
    if isinstance(current_placement, Plan):
        current_placement = current_placement.placement.first_slots
    arr = as_placement_array("current_placement", current_placement)
    errs = check_placement(arr, window.num_layers, window.num_experts)
    if errs:
        raise InputError(f"current_placement does not fit the window: {errs[0]}")
    return arr


def resolve_rows(window: Window, topology: Topology, rows: int | None, time_limit: float = 10.0,
                 method: str = "auto") -> tuple[int, dict]:
    """(R, certificate dict). Without ``rows``, R = R* from :func:`certify_rows`; with ``rows``,
    the row rules are checked and R* is still certified for the report."""
    R, cert = certified_rows(window, topology, rows, time_limit, method)
    return R, cert.as_dict()


def certified_rows(window: Window, topology: Topology, rows: int | None, time_limit: float,
                   method: str) -> tuple[int, Certificate]:
    """:func:`resolve_rows` with the whole :class:`Certificate` (its packing serves the seeds)."""
    cert = certify_rows(window, topology, time_limit=time_limit, method=method)
    if rows is None:
        return int(cert.rows), cert
    rows = check_rows(rows, "--rows")
    if not topology.row_ok(rows):
        raise InputError(f"--rows {rows} breaks the row rules (min_rows {topology.min_rows}, "
                         f"row_multiple {topology.row_multiple})")
    if rows * topology.dp > window.num_samples:
        raise InputError(f"--rows {rows}: {rows}×{topology.dp} cells need ≥ {rows * topology.dp} samples, "
                         f"window has {window.num_samples}")
    if rows < cert.lower_bound:
        raise InputError(f"--rows {rows} is below the proved minimum {cert.lower_bound} (no layout fits the cap)")
    return rows, cert


class SharedPacker:
    """The baselines' last-resort exact packer (:data:`~routepack_opt.heuristics.baselines.ExactPacker`),
    shared by all of them: a packing the R* certificate already holds answers for the whole
    window at no cost, and every other question (sizes, capacity, bins) is solved once. On tight
    windows each baseline used to repeat the same seconds-long packing (N = 16,384: 2 × 5 s)."""

    def __init__(self, lengths, capacity: int, packing=None):
        self._known = None
        if packing is not None:
            self._known = (np.asarray(lengths, dtype=np.int64), int(capacity),
                           np.asarray(packing, dtype=np.int64))
        self._memo: dict = {}

    def __call__(self, sizes, capacity, num_bins, time_limit):
        s = np.asarray(sizes, dtype=np.int64)
        if self._known is not None:
            lengths, C, packing = self._known
            if (int(capacity) == C and s.shape == lengths.shape and np.array_equal(s, lengths)
                    and is_packing(s, C, packing, int(num_bins))):
                return packing.copy()
        key = (s.tobytes(), int(capacity), int(num_bins))
        if key not in self._memo:  # an undecided packing raises and is asked again next time
            self._memo[key] = pack_into_bins(s, capacity, num_bins, time_limit)
        got = self._memo[key]
        return None if got is None else got.copy()


def baseline_layouts(window: Window, topology: Topology, rows: int,
                     time_limit: float = 10.0, *, packing=None) -> dict[str, Layout]:
    """Every length-only baseline layout at exactly ``rows`` rows (name → layout).
    ``time_limit`` bounds them all together (their cap repair and, on tight windows, the exact
    packing of their last resort, done once for all of them); ``packing``: a bin per sample into
    at most ``rows·D`` bins of the capacity already known (the R* certificate's), which that
    last resort then uses as is."""
    out: dict[str, Layout] = {}
    exact_pack = SharedPacker(window.lengths, topology.capacity, packing)
    end = time.perf_counter() + time_limit
    for k, (name, fn) in enumerate(BASELINES.items()):
        share = (end - time.perf_counter()) / (len(BASELINES) - k)  # an even split of what is left
        if out and share < _PACKER_S_PER_ITEM * window.num_samples:
            break  # one seed in hand and no time for the next (each is a few O(N log N) passes)
        try:
            row, slot = fn(window.lengths, topology, rows, time_limit=max(0.05, share), exact_pack=exact_pack)
        except InfeasibleError:
            continue
        out[name] = Layout(row, slot, rows)
    if not out and packing is not None and topology.equal_samples_per_slot:
        # The constructions missed a layout the R* certificate holds (with equal counts its
        # packing is a layout, cell = row·D + slot; e.g. one CP-SAT found on a tight window)
        lay = _certificate_layout(window.lengths, topology, rows, packing)
        if lay is not None:
            out["certificate"] = lay
    if not out:
        raise InputError(f"no feasible layout with {rows} rows for this window and capacity")
    return out


def _certificate_layout(lengths_N, topology: Topology, rows: int, packing_N) -> Layout | None:
    """The equal-count certificate's layout at ``rows`` rows if it is one (every cell nonempty
    and under the cap, N / D samples per slot), else None."""
    D = topology.dp
    cell_N = np.asarray(packing_N, dtype=np.int64)
    if cell_N.shape != lengths_N.shape or cell_N.min(initial=0) < 0 or cell_N.max(initial=0) >= rows * D:
        return None
    per_cell = np.bincount(cell_N, minlength=rows * D)
    tokens = np.bincount(cell_N, weights=lengths_N, minlength=rows * D)
    per_slot = per_cell.reshape(rows, D).sum(axis=0)
    if (per_cell == 0).any() or (tokens > topology.capacity).any() or (per_slot != per_slot[0]).any():
        return None
    return Layout(cell_N // D, cell_N % D, rows)


_NO_REPORT = PlanReport()  # immutable: a safe default


def build_plan(evaluator: Evaluator, placement, layout: Layout, objective: Objective, *,
               report: PlanReport = _NO_REPORT, certificate: dict | None = None) -> Plan:
    """The complete :class:`Plan` of ``(placement, layout)``: validated, and scored (score, bound,
    gap in ``report.evaluation``) by ``evaluator``."""
    topology = evaluator.topology
    errs = Plan.from_layout(topology, placement, layout, objective).validate(evaluator.window)
    if errs:
        raise RuntimeError("internal: layout is invalid: " + "; ".join(errs[:3]))
    e = evaluator.evaluate_layout(placement, layout, objective)
    return Plan.from_layout(topology, placement, layout, objective, score=e.score.as_dict(),
                            lower_bound=e.lower_bound, certificate=certificate,
                            report=report.replace(evaluation=EvaluationSummary(**e.report())))


def solve(window: Window, topology: Topology, cost: CostModel, *, objective: str = "max-sum",
          placement="lpt", rows: int | None = None, params: PlannerParams = DEFAULT_PARAMS,
          time_limit: float | None = None, max_sweeps: int | None = None, seed: int = 0,
          current_placement=None, certificate: dict | Certificate | None = None,
          progress: Callable[[float], None] | None = None,
          stop: Callable[[], bool] | None = None, redundant_experts: int | None = None,
          max_replica_bytes: float | None = None, max_rows: int | None = None) -> Plan:
    """Plan one window: placement, R*, length-only seeds, population annealing and (with
    ``placement="joint"``) the joint placement search; always a valid, scored :class:`Plan`.

    ``placement``: ``"lpt"``, ``"lpt-plain"``, ``"identity"``, ``"joint"``, an [L, E] array or a
    :class:`Plan`; ``rows``: R forced (default: R is searched in [R*, R_max], R* the certified
    minimum, docs/pipeline.md step 2b; ``max_rows`` sets R_max, else ``params.rows``);
    ``params``: the search parameters (:class:`PlannerParams`, ``--config``). ``time_limit`` bounds the whole call
    (anytime); ``max_sweeps`` + ``seed`` make the plan bit-identical. ``current_placement``: the
    materialized placement, charged for migration by ``"joint"``. ``certificate``
    reuses an R* certificate the caller already has (a :class:`Certificate`: its packing also
    serves the seeds' last resort on tight windows). ``stop()`` (polled by the annealer, and
    before the joint stage) cancels cooperatively: the best layout so far is returned;
    ``progress(fraction)`` reports the annealer's progress. Numba kernels are compiled or loaded
    by ``warm()`` before the clock starts (``timings["warmup"]``, not part of ``total``).

    ``redundant_experts`` (overrides ``topology.redundant_experts``): extra physical expert slots
    per layer, E + N divisible by P; the plan then carries a :class:`Placement` with replicas
    (``plan.replicas``), the search packs against the surrogate rank loads and the evaluator
    scores the exact even-local split. ``max_replica_bytes``: the most expert state (bytes,
    ``cost.expert_bytes`` per slot) the replicas may add to one rank; more is an ``InputError``."""
    for name, value, cls in (("window", window, Window), ("topology", topology, Topology), ("cost", cost, CostModel)):
        if not isinstance(value, cls):
            raise InputError(f"solve: {name} must be a {cls.__name__}, got {type(value).__name__} {value!r:.40}")
    objective = check_objective(objective)
    topology = with_replicas(topology, window.num_experts, cost, redundant_experts, max_replica_bytes)
    if not isinstance(params, PlannerParams):
        raise InputError(f"params must be a PlannerParams, got {type(params).__name__}")
    if max_rows is not None:
        max_rows = check_rows(max_rows, "max_rows")
    if rows is not None:
        rows = check_rows(rows, "rows")
    seed = check_int(seed, "seed", 0, INT64_MAX)
    for name, fn in (("progress", progress), ("stop", stop)):
        if fn is not None and not callable(fn):
            raise InputError(f"solve: {name} must be a function, got {shown(fn)}")
    limit = row_limit(topology, params.rows, max_rows, rows)
    if max_sweeps is not None:
        max_sweeps = check_sweep_budget(max_sweeps, window.num_samples)
    check_sweep_budget(params.anneal.sweeps, window.num_samples, "anneal.sweeps")
    current_placement = check_current_placement(current_placement, window)
    warmup = Timings()
    with warmup.stage("warmup"):
        warm(groups_for(placement, topology.redundant_experts))
    t_start = time.perf_counter()
    clock = _Clock(time_limit)
    timings = Timings()
    with timings.stage("placement"):
        pl, pl_kind = resolve_placement(window, topology, placement)
    with timings.stage("certify"):
        R, cert, packing = _certify(window, topology, rows, certificate, params, clock)
    if rows is None:
        check_row_limit(limit, cert)
    ctx = _Context(window, topology, cost, objective, placement, params, seed, clock, stop, timings,
                   packing, Evaluator(window, topology, cost), current_placement)
    candidates = [R] if rows is not None else row_candidates(window.num_samples, topology, R, params.rows,
                                                             None if limit is None else limit.rows)
    notes: dict = {}
    if rows is not None or (len(candidates) == 1 and params.rows.extra == 0 and limit is None):
        res = _plan_at(ctx, pl, pl_kind, R, max_sweeps, progress=progress)
    else:
        # an R_max the caller set bounds the baselines' counts too; the default one does not
        hard = None if limit is None else candidates[-1]
        with timings.stage("rows-baseline-check"):
            best, complete = _best_baseline(ctx, pl, hard, R)
        res, notes["row_search"] = _search_rows(ctx, pl, pl_kind, candidates, max_sweeps, progress, hard)
        notes["row_search"]["max_rows"] = None if limit is None else limit.asked
        res, notes["baseline_check"] = _baseline_check(ctx, res, best, complete, R)
    timings.record("total", time.perf_counter() - t_start)
    timings.record("warmup", warmup.seconds["warmup"])
    if res.replica_notes:
        notes["replicas"] = res.replica_notes
    report = PlanReport(placement_kind=res.pl_kind, seed_scores={k: v[0] for k, v in res.seed_scores.items()},
                        search=res.search, fallback=res.fallback, joint=res.joint, timings=timings.seconds,
                        notes=notes)
    return build_plan(ctx.ev, res.pl, res.layout, objective, report=report, certificate=cert)


def _certify(window: Window, topology: Topology, rows: int | None, certificate: dict | Certificate | None,
             params: PlannerParams, clock: _Clock) -> tuple[int, dict, np.ndarray | None]:
    """(R, the certificate's dict, its packing or None): the caller's certificate reused (rows,
    when given, already checked by the caller), else R* certified on the clock's share."""
    if certificate is None:
        c = params.certify
        R, full = certified_rows(window, topology, rows, clock.share(c.share, c.time_limit), c.method)
        return R, full.as_dict(), full.packing_N
    packing = None
    if isinstance(certificate, Certificate):
        cert, packing = certificate.as_dict(), certificate.packing_N
    else:
        cert = certificate
    R = check_rows(rows) if rows is not None else check_rows(cert.get("rows"), "certificate rows")
    return R, cert, packing


@dataclasses.dataclass
class _Context:
    """What every stage of one :func:`solve` call shares."""

    window: Window
    topology: Topology
    cost: CostModel
    objective: Objective
    placement: object  # the caller's placement argument ("lpt", "joint", an array, ...)
    params: PlannerParams
    seed: int
    clock: _Clock
    stop: Callable[[], bool] | None
    timings: Timings
    packing: np.ndarray | None
    ev: Evaluator
    current_placement: np.ndarray | None
    frameworks: dict = dataclasses.field(default_factory=dict)  # framework_layouts' answers, memoised
    frameworks_skipped: list = dataclasses.field(default_factory=list)  # packers sized out, with why
    seeds: dict = dataclasses.field(default_factory=dict)  # R → baseline_layouts(R), memoised

    def stopped(self) -> bool:
        return self.clock.expired() or (self.stop is not None and self.stop())


@dataclasses.dataclass
class _Result:
    """A layout at ``R`` rows under placement ``pl``, with what produced it."""

    pl: object
    pl_kind: str
    layout: Layout
    R: int
    key: tuple
    seed_scores: dict
    search: SearchStats | None = None
    joint: JointStats | None = None
    fallback: str | None = None
    replica_notes: dict = dataclasses.field(default_factory=dict)


class RowLimit(NamedTuple):
    """A row maximum the caller set: ``asked`` as given, ``rows`` the largest count ≤ it that keeps
    the row rules, ``name`` how the caller spelled it (for messages)."""

    asked: int
    rows: int
    name: str


def row_limit(topology: Topology, rp: RowParams, max_rows: int | None, rows: int | None = None) -> RowLimit | None:
    """The row maximum of a call (``max_rows``, else ``[rows] max_rows`` when set; None: R* +
    ``extra`` row multiples), checked against the row rules before any work: InputError when no
    count ≤ it keeps ``min_rows`` and ``row_multiple``, or when a forced ``rows`` is above it.
    A limit is never raised to fit: the search stays within it or the call fails."""
    if max_rows is not None:
        asked, name = check_rows(max_rows, "max_rows"), "max_rows (--max-rows, max_micro_batches)"
    elif rp.max_rows:
        asked, name = rp.max_rows, "[rows] max_rows"
    else:
        return None
    top = asked // topology.row_multiple * topology.row_multiple
    if top < topology.min_rows or top < 1:
        raise InputError(f"{name} = {asked} leaves no valid row count: rows must be ≥ min_rows = "
                         f"{topology.min_rows} and a multiple of row_multiple = {topology.row_multiple}, "
                         f"and none of them is ≤ {asked} (raise the maximum or lower min_rows)")
    if isinstance(rows, (int, np.integer)) and not isinstance(rows, bool) and rows > asked:
        raise InputError(f"rows = {rows} is above {name} = {asked} (drop one of them)")
    return RowLimit(asked, top, name)


def check_row_limit(limit: RowLimit | None, cert: dict) -> None:
    """InputError when the certificate leaves no layout within ``limit``: its maximum below the
    proved least rows, or below the best known rows when R* is not proved (no layout that
    short is known)."""
    if limit is None or limit.rows >= int(cert["rows"]):
        return
    lb = int(cert.get("lower_bound", cert["rows"]))
    if limit.rows < lb:
        raise InputError(f"{limit.name} = {limit.asked} is below R* ≥ {lb}, the proved least rows under the "
                         f"token cap: no plan has so few micro-batches (raise the maximum or the capacity)")
    raise InputError(f"{limit.name} = {limit.asked}: no layout with at most {limit.rows} rows was found "
                     f"(the best known has {cert['rows']}, R* ≥ {lb} is proved, status {cert.get('status')}); "
                     "give the certifier more time ([certify] time_limit) or raise the maximum")


def row_candidates(num_samples: int, topology: Topology, r_star: int, rp: RowParams,
                   max_rows: int | None = None) -> list[int]:
    """The row counts the search may choose: R* and every count in (R*, R_max] that keeps the
    row rules, R_max = ``max_rows`` (else ``rp.max_rows`` when set, else R* + ``rp.extra`` row
    multiples), and never more than N / D rows (every cell holds a sample). A maximum below R*
    is an InputError (see :func:`check_row_limit`), never raised to R*."""
    m = topology.row_multiple
    top = max_rows if max_rows is not None else (rp.max_rows or r_star + rp.extra * m)
    if top < r_star:
        raise InputError(f"the row maximum {top} is below R* = {r_star}")
    top = min(top, num_samples // topology.dp)
    return [r_star] + [r for r in range(r_star + 1, top + 1) if topology.row_ok(r)]


def _plan_at(ctx: _Context, pl: Placement, pl_kind: str, R: int, max_sweeps: int | None, *,
             progress=None, extra_seeds: dict[str, Layout] | None = None) -> _Result:
    """The packing search at ``R`` rows (seeds, replica moves, annealing, joint placement), on
    what is left of the clock. ``extra_seeds``: layouts at R to start from as well (e.g. a
    screening's result)."""
    topology, objective, clock, timings, ev = ctx.topology, ctx.objective, ctx.clock, ctx.timings, ctx.ev
    with timings.stage("seeds"):
        seeds = _seeds_at(ctx, R, clock.share(ctx.params.seeds.share, ctx.params.seeds.time_limit))
        seeds.update(extra_seeds or {})
        b = ev.rank_loads(pl)
        t_score = time.perf_counter()
        seed_scores, best_seed = _scored_seeds(ev, pl, seeds, objective)
        # what the final validation + scoring will cost, kept in hand (×3, with a floor)
        clock.reserve = 3.0 * (time.perf_counter() - t_score) / max(len(seeds), 1) + 0.02
    layout = seeds[best_seed]
    search = joint = fallback = None
    # with replicas: row-aware replica moves for the best seed's packing first (the search then
    # packs against them), and again for the packing found; under a time limit the first packing
    # gets half of what is left and rounds of moves and re-packing share the rest (_replica_rounds)
    replicated = topology.redundant_experts > 0 and ctx.placement in ("lpt", "joint")  # pl has replicas
    replica_notes: dict = {}
    if replicated and not ctx.stopped():
        with timings.stage("replicas-start"):
            try:
                pl, moved, replica_notes = _replica_start(ctx.window, topology, ev, pl, layout, R, objective,
                                                          seed_scores[best_seed], clock, ctx.stop)
                if moved:  # the seeds are scored again against the placement they will be packed for
                    b = ev.rank_loads(pl)
                    seed_scores, best_seed = _scored_seeds(ev, pl, seeds, objective)
                    layout = seeds[best_seed]
            except Exception as exc:  # keep the constructive replicas, and say so
                fallback = f"replica moves failed ({exc.__class__.__name__}: {exc}); kept the constructive replicas"
    with timings.stage("anneal"):
        layout, search, failed = _search(ctx, pl, b, seeds, best_seed, seed_scores[best_seed], R,
                                         max_sweeps, progress, half=replicated)
        fallback = failed or fallback
    if replicated and fallback is None and not ctx.stopped():
        with timings.stage("replicas"):
            try:
                pl, layout, rounds = _replica_rounds(ctx, pl, layout, R, max_sweeps)
                replica_notes = {**rounds, "start_moves": replica_notes.get("start_moves", 0),
                                 "start_kept": replica_notes.get("start_kept", False)}
            except Exception as exc:  # keep the packing and placement found so far, and say so
                fallback = f"replica moves failed ({exc.__class__.__name__}: {exc}); kept the constructive replicas"
    if pl_kind == "lpt" and ctx.placement == "joint" and not ctx.stopped():
        with timings.stage("joint"):
            try:
                pl, layout, joint = _joint_at(ctx, pl, layout, R, max_sweeps)
                pl_kind = "lpt" if joint is None else "joint"
            except Exception as exc:
                fallback = f"joint placement failed ({exc.__class__.__name__}: {exc}); kept LPT"
    return _Result(pl, pl_kind, layout, R, ev.score_layout(pl, layout, objective).key, seed_scores,
                   search, joint, fallback, replica_notes)


def _scored_seeds(ev: Evaluator, pl: Placement, seeds: dict[str, Layout], objective: Objective) -> tuple[dict, str]:
    """Each seed's score key under ``pl`` and the best seed's name."""
    scores = {name: ev.score_layout(pl, lay, objective).key for name, lay in seeds.items()}
    return scores, min(scores, key=lambda name: scores[name])


def _search(ctx: _Context, pl: Placement, b_NLP, seeds: dict[str, Layout], best_seed: str, best_key: tuple,
            R: int, max_sweeps: int | None, progress, half: bool) -> tuple[Layout, SearchStats | None, str | None]:
    """Population annealing at ``R`` rows from every seed, against rank loads ``b_NLP`` of
    ``pl``, on what is left of the clock (``half``: half of it, the replica rounds take the
    rest). Returns the layout (the one found if the evaluator scores it no worse than the best
    seed's ``best_key``, else that seed's), the search's statistics, and why it fell back to the
    best seed (None: it did not)."""
    topology, objective, clock = ctx.topology, ctx.objective, ctx.clock
    try:
        if clock.expired():
            raise _OutOfTime(f"the {clock.limit:g}s limit was spent before the search")
        sized_out = _anneal_sized_out(ctx, R)
        if sized_out is not None:
            raise _OutOfTime(sized_out)
        left = clock.left()
        res = anneal(ctx.window.lengths, b_NLP, topology, ctx.cost, R, objective,
                     [lay.arrays() for lay in seeds.values()], config=ctx.params.anneal, seed=ctx.seed,
                     time_limit=None if left is None else (0.5 * left if half else left),
                     max_sweeps=max_sweeps, hooks=Hooks(progress, ctx.stop))
        found = Layout(res.row, res.slot, R)
        errs = Plan.from_layout(topology, pl, found, objective).validate(ctx.window)
        if errs:
            raise RuntimeError("annealer returned an invalid layout: " + errs[0])
        keep = ctx.ev.score_layout(pl, found, objective).key <= best_key
        return (found if keep else seeds[best_seed]), SearchStats.from_anneal(res.stats), None
    except _OutOfTime as exc:
        return seeds[best_seed], None, f"no search: {exc}; using baseline {best_seed}"
    except Exception as exc:  # fall back to the best valid baseline, and say so
        return seeds[best_seed], None, (f"annealing failed ({exc.__class__.__name__}: {exc}); "
                                        f"using baseline {best_seed}")


def _joint_at(ctx: _Context, pl: Placement, layout: Layout, R: int,
              max_sweeps: int | None) -> tuple[Placement, Layout, JointStats | None]:
    """The joint placement search from ``(pl, layout)`` at ``R`` rows (charged for migration
    from the materialized placement, if any); its result if valid (with its statistics), else
    ``(pl, layout, None)``."""
    window, topology, objective, params = ctx.window, ctx.topology, ctx.objective, ctx.params
    packer = anneal_packer(window, topology, ctx.cost, R, objective, config=params.anneal, max_sweeps=max_sweeps)
    jr = joint_search(window, topology, ctx.cost, R, objective, pl, layout.arrays(),
                      time_limit=ctx.clock.left(), seed=ctx.seed, current_placement=ctx.current_placement,
                      config=params.joint.config(params.refine, max_sweeps), packer=packer)
    found = Layout(jr.row, jr.slot, R)
    if Plan.from_layout(topology, jr.placement, found, objective).validate(window):
        return pl, layout, None
    return jr.placement, found, JointStats.from_joint(jr.stats)


def _anneal_sized_out(ctx: _Context, R: int) -> str | None:
    """Why the annealer cannot run at ``R`` rows (None: it can), sized before it allocates: its
    problem holds a table of "samples of length ≤ v" for v in 0..C (int32 from an int64 range:
    12 bytes a unit of capacity, 26 GB at C = 2^31 − 1), and each replica (the population and
    the seeds') a member table of cells × the most samples a cell can hold, 4 bytes each, beside
    O(N + cells) and the rank loads of every (row, shard) block (as
    ``anneal.state.Population.bytes_per_replica`` counts them). Over the memory budget the plan
    is the best seed."""
    w, topo = ctx.window, ctx.topology
    N, cells, blocks = w.num_samples, R * topo.dp, R * topo.num_shards
    fit = int(np.searchsorted(np.cumsum(np.sort(w.lengths)), topo.capacity, side="right"))
    cap = max(1, min(N - cells + 1, fit))
    per = 20 * N + 24 * cells + 4.0 * cells * cap + blocks * w.num_layers * topo.ep * 8.0 + 64.0 * blocks
    replicas = ctx.params.anneal.population + MAX_SEEDS
    return too_costly(f"population annealing at {R} rows", nbytes=12.0 * (topo.capacity + 1) + replicas * per,
                      input_bytes=int(w.counts.nbytes))


def _seeds_at(ctx: _Context, R: int, time_limit: float) -> dict[str, Layout]:
    """:func:`baseline_layouts` at ``R``, built once per call of :func:`solve` (the screening's
    and the final search's seeds at one count are the same layouts; at N = 200,000 each build is
    a second)."""
    if R not in ctx.seeds:
        ctx.seeds[R] = baseline_layouts(ctx.window, ctx.topology, R, time_limit, packing=ctx.packing)
    return dict(ctx.seeds[R])


def _screen(ctx: _Context, pl, b, R: int, sweeps: int, time_limit: float | None,
            seed_time: float, extra_seeds: dict[str, Layout]) -> tuple[Layout, tuple, str]:
    """One candidate row count, screened: its length-only seeds (and ``extra_seeds``) and a
    short annealing run from them (``sweeps`` sweeps, within ``time_limit``). Returns the best
    layout, its score key and where it came from."""
    ev, objective = ctx.ev, ctx.objective
    seeds = _seeds_at(ctx, R, seed_time)
    seeds.update(extra_seeds)
    scores = {name: ev.score_layout(pl, lay, objective).key for name, lay in seeds.items()}
    best = min(scores, key=lambda name: scores[name])
    layout, key, source = seeds[best], scores[best], best
    if ctx.stopped() or _anneal_sized_out(ctx, R) is not None:
        return layout, key, source
    # a short run from the length-only seeds and the joint-cost greedy seed
    res = anneal(ctx.window.lengths, b, ctx.topology, ctx.cost, R, objective,
                 [lay.arrays() for lay in seeds.values()][:MAX_SEEDS - 1], config=ctx.params.anneal, seed=ctx.seed,
                 time_limit=time_limit, max_sweeps=sweeps, hooks=Hooks(stop=ctx.stop))
    found = Layout(res.row, res.slot, R)
    if not Plan.from_layout(ctx.topology, pl, found, objective).validate(ctx.window):
        k = ev.score_layout(pl, found, objective).key
        if k <= key:
            layout, key, source = found, k, "anneal"
    return layout, key, source


def framework_layouts(ctx: _Context, r_star: int, max_rows: int | None = None) -> dict[int, dict[str, Layout]]:
    """The cap-keeping length-only baselines a run is compared with (``routepack
    replay-report``): every framework's packer at the row count it picks
    (:data:`~routepack_opt.heuristics.frameworks.FRAMEWORK_PACKERS`) and verl's KK at R*, where
    they keep the cap, the row rules and ``max_rows`` (when given): row count → {name: layout}."""
    from routepack_opt.heuristics.baselines import BASELINES
    from routepack_opt.heuristics.frameworks import FRAMEWORK_PACKERS, cap_violations

    if (r_star, max_rows) in ctx.frameworks:
        return ctx.frameworks[r_star, max_rows]
    topo, lengths = ctx.topology, ctx.window.lengths
    got: dict[str, tuple] = {}
    # first fit over every open bin (slime) and MFFD's scans (NeMo-RL) cost N × bins: sized first
    bins = -(-int(lengths.sum()) // topo.capacity)
    allowed = _FRAMEWORK_MAX_S if ctx.clock.limit is None else min(BASELINE_CHECK_SHARE * ctx.clock.limit,
                                                                    ctx.clock.left() or 0.0)
    start = time.perf_counter()
    for name, fn in FRAMEWORK_PACKERS.items():
        # each packer is a few O(N log N) passes (KK, FFD, splitting and dealing), some N × bins
        seconds = _PACKER_S_PER_ITEM * lengths.size + (
            _PACKER_S_PER_ITEM_BIN * lengths.size * bins if name in _QUADRATIC_PACKERS else 0.0)
        why = too_costly(f"framework:{name}", seconds=seconds, time_left=allowed - (time.perf_counter() - start))
        if why is not None:
            ctx.frameworks_skipped.append(why)
            continue
        try:
            got[f"framework:{name}"] = fn(lengths, topo)
        except Exception:  # e.g. a framework that cannot keep equal counts per slot
            continue
    why = too_costly("framework:verl-kk@R*", seconds=_PACKER_S_PER_ITEM * lengths.size,
                     time_left=allowed - (time.perf_counter() - start))
    if why is not None:
        ctx.frameworks_skipped.append(why)
    else:
        try:
            row, slot = BASELINES["verl-kk"](lengths, topo, r_star, exact_pack=SharedPacker(
                lengths, topo.capacity, ctx.packing))
            got["framework:verl-kk@R*"] = (row, slot, r_star)
        except Exception:
            pass
    out: dict[int, dict[str, Layout]] = {}
    for name, (row, slot, rows) in got.items():
        rows = int(rows)
        if not topo.row_ok(rows) or rows * topo.dp > lengths.size or (max_rows is not None and rows > max_rows) \
                or cap_violations(lengths, row, slot, rows, topo.dp, topo.capacity):
            continue
        lay = Layout(np.asarray(row, dtype=np.int64), np.asarray(slot, dtype=np.int64), rows)
        if Plan.from_layout(topo, np.tile(np.arange(ctx.window.num_experts), (ctx.window.num_layers, 1)),
                            lay, ctx.objective).validate(ctx.window):
            continue  # e.g. an empty cell
        out.setdefault(rows, {})[name] = lay
    ctx.frameworks[r_star, max_rows] = out
    return out


# The fewest sweeps a screening run gets: with 1 sweep the makespans of one count ranged ±5 %
# around its full-budget one (qwen3-30b-a3b, N = 1,024), far more than the counts differ
SCREEN_MIN_SWEEPS = 4


class _ScreenBudget(NamedTuple):
    """What screening one row count may spend: annealing sweeps, seconds (None: no limit) and
    the seeds' seconds."""

    sweeps: int
    time_limit: float | None
    seed_time: float


def _screen_counts(ctx: _Context, pl: Placement, cands: list[int], bounds: dict[int, float],
                   framework: dict[int, dict[str, Layout]], r_star: int,
                   budget: _ScreenBudget) -> tuple[dict, list[dict], int | None, str]:
    """Screen the candidate counts in ascending order (:func:`_search_rows`'s rules: pruned by
    the bound, skipped after ``patience`` worse counts in a row or once R* is tight). Returns
    ``(screened: R → (layout, key, source), the record per count, the best R or None, why the
    screening stopped early or "")``."""
    rp = ctx.params.rows
    b = ctx.ev.rank_loads(pl)
    screened: dict[int, tuple[Layout, tuple, str]] = {}
    record: list[dict] = []
    why = ""
    best_R = None
    worse = 0  # counts screened in a row since the best one, each worse than it
    for R in cands:
        entry: dict = {"rows": R, "lower_bound": bounds[R]}
        record.append(entry)
        if best_R is not None and why:
            entry["status"] = "skipped"
            continue
        if best_R is not None and bounds[R] >= screened[best_R][1][0]:
            entry["status"] = "pruned"  # the bound grows with R by the overhead
            continue
        if best_R is not None and R not in framework and worse >= rp.patience:
            entry["status"] = "skipped"  # the last counts screened only got worse
            continue
        if ctx.stopped():
            entry["status"] = "skipped"
            continue
        lay, key, source = _screen(ctx, pl, b, R, budget.sweeps, budget.time_limit, budget.seed_time,
                                   framework.get(R, {}))
        screened[R] = (lay, key, source)
        entry.update(status="screened", makespan=key[0], gap=key[0] / bounds[R], source=source)
        if best_R is None or key < screened[best_R][1]:
            best_R, worse = R, 0
        else:
            worse += 1
        if R == r_star and key[0] <= rp.tight_gap * bounds[R]:
            why = f"tight at R*: gap {key[0] / bounds[R]:.4f} ≤ {rp.tight_gap:g}"
    return screened, record, best_R, why


def _search_rows(ctx: _Context, pl, pl_kind: str, candidates: list[int], max_sweeps: int | None,
                 progress, max_rows: int | None = None) -> tuple[_Result, dict]:
    """R as a decision (docs/pipeline.md, step 2b): screen the candidate row counts in
    ascending order (each: seeds + a short annealing run, ``screen_share`` of the budget split
    evenly), pruning every R whose layout lower bound reaches the best makespan screened so far,
    stopping at R* when its gap is within ``tight_gap`` and after ``patience`` counts in a row
    worse than the best (the frameworks' own counts are still screened); the rest of the budget goes to the
    best screened R, started from its screened layout. The frameworks' cap-keeping layouts join
    as candidates at their own counts (up to ``max_rows`` when given) and as seeds there.
    Returns the result and the report's ``row_search`` record."""
    rp, ev, clock = ctx.params.rows, ctx.ev, ctx.clock
    r_star = candidates[0]
    t0 = time.perf_counter()
    with ctx.timings.stage("rows-baselines"):
        framework = framework_layouts(ctx, r_star, max_rows)
    cands = sorted(set(candidates) | set(framework))
    budget = max_sweeps if max_sweeps is not None else ctx.params.anneal.sweeps
    screen_sweeps = max(SCREEN_MIN_SWEEPS, int(budget * rp.screen_share / len(cands)))
    left = clock.left()
    screen_time = None if left is None else rp.screen_share * left / len(cands)
    seed_time = clock.share(ctx.params.seeds.share, ctx.params.seeds.time_limit) / len(cands)
    bounds = {R: ev.lower_bound(pl, R) for R in cands}
    with ctx.timings.stage("rows-screen"):
        screened, record, best_R, why = _screen_counts(ctx, pl, cands, bounds, framework, r_star,
                                                       _ScreenBudget(screen_sweeps, screen_time, seed_time))
    if best_R is None:  # stopped before any screening: R* with what is left
        best_R = r_star
    # the chosen count gets the whole sweep budget (the screening's sweeps come on top of it, a
    # share of it spread over the counts); under a time limit, what the screening left
    final_sweeps = None if max_sweeps is None and clock.limit is not None else budget
    extra = {"screened": screened[best_R][0]} if best_R in screened else {}
    extra.update(framework.get(best_R, {}))
    res = _plan_at(ctx, pl, pl_kind, best_R, final_sweeps, progress=progress, extra_seeds=extra)
    for R, (lay, key, _) in screened.items():  # never worse than a screened count (same placement)
        if key < res.key:
            res = _Result(pl, pl_kind, lay, R, key, res.seed_scores, res.search, res.joint, res.fallback,
                          res.replica_notes)
    at_star = screened.get(r_star)
    if res.R == r_star:
        m_star = res.key[0]
    else:
        m_star = None if at_star is None else at_star[1][0]
    if not why:
        if res.R == r_star:
            why = ("R* is the only candidate (R_max = R*: max_rows or N/D)" if len(cands) == 1 else "R* scored best"
                   + ("" if len(screened) > 1 else " (every other count pruned by its bound)"))
        else:
            why = (f"{res.R} rows beat R* = {r_star}: makespan {res.key[0]:,.1f} vs {m_star:,.1f} µs"
                   if m_star is not None else f"{res.R} rows scored best")
    notes = {"r_star": r_star, "r_max": candidates[-1], "chosen": res.R, "why": why,
             "makespan_r_star": m_star, "makespan_chosen": res.key[0],
             "gap_r_star": None if m_star is None else m_star / bounds[r_star],
             "gap_chosen": res.key[0] / ev.lower_bound(res.pl, res.R),
             "screen_sweeps": screen_sweeps, "final_sweeps": final_sweeps,
             "candidates": record, "seconds": time.perf_counter() - t0}
    return res, notes


BASELINE_CHECK_SHARE = 0.15
# The frameworks' packers that scan every open bin per sample (first fit in Python/numpy, MFFD):
# about 5 ns per (sample, bin) pair; without a time limit, at most this many seconds of them
_QUADRATIC_PACKERS = frozenset({"slime", "nemo-mffd"})
_PACKER_S_PER_ITEM_BIN, _FRAMEWORK_MAX_S = 5e-9, 30.0
_PACKER_S_PER_ITEM = 2e-6  # every packer's O(N log N) part: ~0.4 s at N = 200,000 on a loaded 2-core machine


def _best_baseline(ctx: _Context, pl, max_rows: int | None, r_star: int) -> tuple[tuple | None, bool]:
    """The best cap-keeping framework baseline (each packer at its own row count, verl's KK at
    R*) under ``pl`` and (where the planner chooses the placement: ``lpt``, ``joint``) the
    baselines' placements (identity, EPLB's), scored by the one evaluator: ``((key, name,
    placement, layout) or None, whether every one was scored before the clock ran out)``. Run
    before the search, so that a time limit leaves the search what the check took."""
    window, topo, ev, objective = ctx.window, ctx.topology, ctx.ev, ctx.objective
    placements: dict[str, object] = {"plan": pl}
    if not (isinstance(ctx.placement, str) and ctx.placement in ("lpt", "joint")):
        pass  # a placement the caller fixed (identity, given, lpt-plain) is kept
    elif topo.redundant_experts:
        for k in ("identity", "eplb"):
            placements[k] = resolve_placement(window, topo, k)[0]
    else:  # EPLB without replicas is LPT
        placements["identity"] = resolve_placement(window, topo, "identity")[0]
        placements["eplb"] = resolve_placement(window, topo, "lpt-plain")[0]
    best = None
    # under a time limit the check takes at most BASELINE_CHECK_SHARE of it (N = 8,192, L = 48:
    # 18 scorings took 3 s of a 5 s limit), and says when it stopped short
    until = None if ctx.clock.limit is None else time.perf_counter() + BASELINE_CHECK_SHARE * ctx.clock.limit
    for lays in framework_layouts(ctx, r_star, max_rows).values():
        for name, lay in lays.items():
            for plname, plc in placements.items():
                if ctx.stopped() or (until is not None and time.perf_counter() > until):
                    return best, False
                if Plan.from_layout(topo, plc, lay, objective).validate(window):
                    continue
                key = ev.score_layout(plc, lay, objective).key
                if best is None or key < best[0]:
                    best = (key, f"{name}/{plname}", plc, lay)
    return best, True


def _baseline_check(ctx: _Context, res: _Result, best: tuple | None, complete: bool,
                    r_star: int) -> tuple[_Result, dict]:
    """The plan against the best baseline (:func:`_best_baseline`): a baseline that scores
    better is taken (the plan never loses silently) and named, with why."""
    skipped = {"skipped": list(ctx.frameworks_skipped)} if ctx.frameworks_skipped else {}
    if best is None:
        return res, {"best": None, "complete": complete, **skipped}
    key, name, plc, lay = best
    note = {"best": name, "rows": lay.rows, "makespan": key[0], "plan_makespan": res.key[0],
            "saving": (key[0] - res.key[0]) / key[0], "taken": False, "complete": complete, **skipped}
    if key < res.key:
        searched = set(row_candidates(ctx.window.num_samples, ctx.topology, r_star, ctx.params.rows))
        causes = []
        if not name.endswith("/plan"):
            causes.append(f"its placement ({name.split('/')[-1]}) beats the plan's with this packing")
        if lay.rows not in searched:
            causes.append(f"its {lay.rows} rows lie outside the searched range")
        if not causes:
            causes.append("the search did not reach it within its budget")
        note.update(taken=True, reason=(
            f"{name} at {lay.rows} rows scored {key[0]:,.1f} µs against the search's {res.key[0]:,.1f} "
            f"at {res.R} rows: " + "; ".join(causes) + "; the plan is that baseline"))
        res = _Result(plc, "eplb" if name.endswith("/eplb") else ("identity" if name.endswith("/identity")
                      else res.pl_kind), lay, lay.rows, key, res.seed_scores, res.search, res.joint,
                      res.fallback, res.replica_notes)
    return res, note


# Passes of row-aware replica moves outside the timed rounds: before the first packing, and
# (twice as many: these moves are for the packing the plan keeps) after it. Most moves come in
# the first passes (DeepSeek-V3, N = 4,096, P = 32: 5,457 in the first 4, 1,458 in the next 4,
# 284 after), and a pass costs about a tenth of a second there; a call ends at a pass without
# a move (experiments/results/replication, the planning-time table)
REPLICA_PASSES = 8


def _replica_moves(window: Window, topology: Topology, pl: Placement, layout: Layout, R: int,
                   clock: _Clock, stopped: Callable[[], bool], chunks: int, passes: int,
                   t_score: float, until: float | None = None) -> tuple[Placement, int]:
    """Up to ``chunks`` calls of ``passes`` passes of row-aware replica moves for ``layout``'s
    packing (a call that makes no move ends them), with the clock read between calls: none is
    started with less than 1.5 calls' time and three scorings (``t_score``) left, or after
    ``until`` (a perf_counter time). Returns the candidate placement and the moves made."""
    from routepack_opt.heuristics.placement.replica_refine import block_expert_loads, refine_replicas

    V = block_expert_loads(window.counts, layout.row, layout.slot, R, topology)
    cand, moves, t_pass = pl, 0, 0.0
    for _ in range(chunks):
        left = clock.left()
        if left is not None and left < 1.5 * t_pass + 3.0 * t_score:
            break
        if until is not None and time.perf_counter() + t_pass > until:
            break
        t0 = time.perf_counter()
        cand, m = refine_replicas(V, cand, topology, max_passes=passes)
        t_pass = max(t_pass, time.perf_counter() - t0)
        moves += m
        if m == 0 or stopped():
            break
    return cand, moves


def _replica_start(window: Window, topology: Topology, ev: Evaluator, pl: Placement, layout: Layout,
                   R: int, objective, best: tuple, clock: _Clock, stop) -> tuple[Placement, bool, dict]:
    """Row-aware replica moves for the best seed's packing (``layout``, scored ``best`` under
    ``pl``) before the first packing, so that it packs against them: up to ``REPLICA_PASSES``
    passes (single passes under a time limit, within a quarter of what is left). Returns the
    placement, whether it changed (kept only if the evaluator scores ``layout`` better under it)
    and notes."""
    def stopped() -> bool:
        return clock.expired() or (stop is not None and stop())

    t0 = time.perf_counter()
    left = clock.left()
    timed = left is not None
    chunks, passes = (REPLICA_PASSES, 1) if timed else (1, REPLICA_PASSES)
    cand, moves = _replica_moves(window, topology, pl, layout, R, clock, stopped, chunks, passes, 0.0,
                                 None if left is None else t0 + 0.25 * left)
    kept = moves > 0 and not clock.expired() and ev.score_layout(cand, layout, objective).key < best
    return (cand if kept else pl), kept, {"start_moves": moves, "start_kept": kept}


def _replica_rounds(ctx: _Context, pl: Placement, layout: Layout, R: int, max_sweeps: int | None,
                    max_rounds: int = 3) -> tuple[Placement, Layout, dict]:
    """Row-aware replica moves for the packing found, kept only if the one evaluator scores it
    better (:func:`~routepack_opt.heuristics.placement.joint.alternate`, strict). Without a time
    limit: one call of ``2 · REPLICA_PASSES`` passes (the packing had the whole sweep budget).
    Under a time limit: rounds of (moves in single passes between clock checks, ≤ 32 a round;
    then packing again against the new placement's surrogate loads, from the current layout),
    each kept only if better; the first packing had half of the time, each re-packing takes half
    of what is left (the last one all of it)."""
    window, topology, ev, objective, clock = ctx.window, ctx.topology, ctx.ev, ctx.objective, ctx.clock
    timed = clock.limit is not None
    chunks, passes = (32, 1) if timed else (1, 2 * REPLICA_PASSES)
    t_score = [0.0]  # the longest exact scoring (the even-local split, per cell) so far

    def scorer(p: Placement, lay: Layout) -> tuple:
        t0 = time.perf_counter()
        key = ev.score_layout(p, lay, objective).key
        t_score[0] = max(t_score[0], time.perf_counter() - t0)
        return key

    def refiner(p: Placement, lay: Layout, rnd: int) -> tuple[Placement, int]:
        return _replica_moves(window, topology, p, lay, R, clock, ctx.stopped, chunks, passes, t_score[0])

    def packer(p: Placement, lay: Layout, rnd: int) -> Layout:
        # what scoring the re-packing (and, after it, the plan) will cost
        left = max(0.01, (clock.left() or 0.0) - 2.0 * t_score[0])
        res = anneal(window.lengths, ev.rank_loads(p), topology, ctx.cost, R, objective, [lay.arrays()],
                     config=ctx.params.anneal, seed=ctx.seed + rnd,
                     time_limit=0.5 * left if rnd < max_rounds else left,
                     max_sweeps=None if max_sweeps is None else max(1, max_sweeps // 2),
                     hooks=Hooks(stop=ctx.stop))
        found = Layout(res.row, res.slot, R)
        if Plan.from_layout(topology, p, found, objective).validate(window):
            raise RuntimeError("annealer returned an invalid layout")
        return found

    rules = AlternateRules(max_rounds if timed else 1, strict=True, repack=timed)
    pl, layout, _, rounds = alternate(refiner, packer, scorer, pl, layout, rules, ctx.stopped)
    notes = {"rounds": len(rounds), "moves": sum(r.moves for r in rounds),
             "placements_kept": sum(r.kept for r in rounds), "packings_kept": sum(r.packed for r in rounds)}
    return pl, layout, notes


def with_replicas(topology: Topology, num_experts: int, cost: CostModel, redundant_experts: int | None,
                  max_replica_bytes: float | None) -> Topology:
    """``topology`` with ``redundant_experts`` (when given), checked: E + N divisible by P, and
    the replicas' expert state per rank (N / P slots × ``cost.expert_bytes``) within
    ``max_replica_bytes`` (when given)."""
    if redundant_experts is not None:
        topology = dataclasses.replace(topology, redundant_experts=check_redundant_experts(redundant_experts))
    topology.check_experts(num_experts)
    if max_replica_bytes is not None:
        if isinstance(max_replica_bytes, bool) or not isinstance(max_replica_bytes, (int, float, np.number)) \
                or not np.isfinite(max_replica_bytes) or max_replica_bytes < 0:
            raise InputError(f"max_replica_bytes must be a finite number ≥ 0, got {max_replica_bytes!r}")
        red = topology.redundant_experts
        if red and cost.expert_bytes <= 0:
            raise InputError("max_replica_bytes needs the cost model's expert_bytes (bytes of one "
                             "expert's weights, gradients and optimizer state); use a preset or set "
                             "expert_bytes in the cost TOML")
        per_rank = red / topology.ep * cost.expert_bytes
        if per_rank > max_replica_bytes:
            fit = int(max_replica_bytes // cost.expert_bytes) * topology.ep if cost.expert_bytes else 0
            raise InputError(
                f"--redundant-experts {red}: {red / topology.ep:g} extra slots per rank × "
                f"{cost.expert_bytes:,.0f} bytes = {per_rank:,.0f} bytes per rank, over "
                f"max_replica_bytes {max_replica_bytes:,.0f}; at most {fit} redundant experts fit")
    return topology


class _OutOfTime(Exception):
    pass


class _Clock:
    """The pipeline's one time limit, counted from :func:`solve`'s start: every stage draws on
    it (R* certification and the seeds up to a share, the search the rest), and ``reserve``
    seconds stay in hand for the final validation and scoring."""

    def __init__(self, time_limit: float | None):
        self.limit = None if time_limit is None else check_time_limit(time_limit)
        self.end = None if time_limit is None else time.perf_counter() + float(time_limit)
        self.reserve = 0.0

    def left(self) -> float | None:
        """Seconds left for the search (None: unlimited)."""
        if self.end is None:
            return None
        return max(0.0, self.end - self.reserve - time.perf_counter())

    def expired(self) -> bool:
        left = self.left()
        return left is not None and left <= 0.0

    def share(self, fraction: float, cap: float) -> float:
        """A stage's limit: ``cap``, and at most ``fraction`` of the whole limit or what is left."""
        if self.end is None or self.limit is None:
            return cap
        return max(0.01, min(cap, fraction * self.limit, self.left() or 0.0))

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

import numpy as np

from routepack_opt.certify import Certificate, certify_rows, pack_into_bins
from routepack_opt.core.bounds import is_packing
from routepack_opt.core.cost import CostModel
from routepack_opt.core.errors import InfeasibleError, InputError
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.core.layout import Layout, check_rows
from routepack_opt.core.objective import check_objective
from routepack_opt.core.placement import Placement
from routepack_opt.core.plan import Plan, check_placement
from routepack_opt.core.report import EvaluationSummary, JointStats, PlanReport, SearchStats
from routepack_opt.core.timing import Timings
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import Window
from routepack_opt.heuristics.anneal import anneal
from routepack_opt.heuristics.baselines import BASELINES
from routepack_opt.heuristics.placement.joint import anneal_packer, joint_search
from routepack_opt.heuristics.placement.lpt import identity_placement, lpt_placement, swap_refine
from routepack_opt.heuristics.placement.replicate import eplb_placement, replicated_placement
from routepack_opt.params import PlannerParams
from routepack_opt.warmup import groups_for, warm

__all__ = ["solve", "build_plan", "resolve_placement", "resolve_rows", "certified_rows", "baseline_layouts",
           "SharedPacker",
           "PLACEMENT_KINDS", "DEFAULT_PARAMS"]

PLACEMENT_KINDS = ("lpt", "lpt-plain", "identity", "joint", "eplb")
DEFAULT_PARAMS = PlannerParams()


def resolve_placement(window: Window, topology: Topology, placement) -> tuple[np.ndarray | Placement, str]:
    """``placement`` is ``"lpt"``, ``"identity"``, ``"eplb"``, a [L, E] array, a
    :class:`Placement` or a :class:`Plan` (its placement is reused, e.g. the one already
    materialized). With ``topology.redundant_experts > 0`` the result is a :class:`Placement` with
    replicas (``lpt``/``joint``: replicate the hottest experts, LPT on distinct ranks, swaps;
    ``eplb``: DeepSeek EPLB's policy)."""
    topology.check_experts(window.num_experts)
    if isinstance(placement, Plan):
        placement = placement.expert_placement
    red = topology.redundant_experts
    if isinstance(placement, str) and (red or placement == "eplb"):
        load = window.expert_loads()
        S = topology.num_slots(window.num_experts)
        if placement in ("lpt", "joint", "lpt-plain"):
            return replicated_placement(load, topology.ep, S), "lpt-replicated"
        if placement == "eplb":
            return eplb_placement(load, topology.ep, S), "eplb"
        if placement == "identity":
            return Placement.identity(window.num_layers, window.num_experts, topology.ep, red), "identity"
    if isinstance(placement, Placement):
        if placement.num_layers != window.num_layers or placement.num_experts != window.num_experts:
            raise InputError(f"given placement is for L={placement.num_layers}, E={placement.num_experts}; "
                             f"the window has L={window.num_layers}, E={window.num_experts}")
        if placement.ep != topology.ep or placement.redundant != red:
            raise InputError(f"given placement has ep={placement.ep} and {placement.redundant} redundant "
                             f"slots; the topology has ep={topology.ep}, redundant_experts={red}")
        return (placement.permutation(), "given") if placement.is_permutation else (placement, "given")
    if red:
        raise InputError(f"a placement without replicas does not fit --redundant-experts {red}")
    if isinstance(placement, str):
        load = window.expert_loads()
        if placement in ("lpt", "joint"):
            # Graham's LPT, then swaps off the busiest rank: never worse than LPT, and within
            # 0.3% of the proved per-layer bound where plain LPT is up to ~9% off
            # (experiments/results/placement_gap/placement_gap.md).
            return swap_refine(load, lpt_placement(load, topology.ep), topology.ep), "lpt"
        if placement == "lpt-plain":
            return lpt_placement(load, topology.ep), "lpt-plain"
        if placement == "identity":
            return identity_placement(window.num_layers, window.num_experts), "identity"
        raise InputError(f"placement must be one of {', '.join(PLACEMENT_KINDS)} or a plan file, got {placement!r}")
    arr = as_placement_array("placement", placement)
    errs = check_placement(arr, window.num_layers, window.num_experts)
    if errs:
        raise InputError("given placement does not fit the window: " + errs[0])
    return arr, "given"


def as_placement_array(name: str, value) -> np.ndarray:
    """``value`` as an [L, E] int64 array, or an InputError naming ``name`` (ragged lists,
    floats, booleans and the like are refused, not truncated)."""
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{name}: cannot be read as an [L, E] array of expert slots ({exc})") from None
    if arr.dtype == object or arr.ndim != 2:
        raise InputError(f"{name}: expected an [L, E] array of integers, got "
                         f"{'a ragged or mixed list' if arr.dtype == object else f'shape {tuple(arr.shape)}'}")
    if arr.dtype.kind not in "iu":
        raise InputError(f"{name}: expected integers, got dtype {arr.dtype}")
    return arr.astype(np.int64)


def check_current_placement(current_placement, window: Window) -> np.ndarray | None:
    """The materialized placement as an [L, E] array that fits ``window``, or None; a bad one is
    an InputError (never dropped silently), as the CLI's ``--placement-from``."""
    if current_placement is None:
        return None
    if isinstance(current_placement, Plan):
        current_placement = current_placement.placement
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
    out = {}
    exact_pack = SharedPacker(window.lengths, topology.capacity, packing)
    end = time.perf_counter() + time_limit
    for k, (name, fn) in enumerate(BASELINES.items()):
        share = (end - time.perf_counter()) / (len(BASELINES) - k)  # an even split of what is left
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


def build_plan(evaluator: Evaluator, placement, layout: Layout, objective: str, *,
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
          max_replica_bytes: float | None = None) -> Plan:
    """Plan one window: placement, R*, length-only seeds, population annealing and (with
    ``placement="joint"``) the joint placement search; always a valid, scored :class:`Plan`.

    ``placement``: ``"lpt"``, ``"lpt-plain"``, ``"identity"``, ``"joint"``, an [L, E] array or a
    :class:`Plan`; ``rows``: R (default: the certified minimum R*); ``params``: the search
    parameters (:class:`PlannerParams`, ``--config``). ``time_limit`` bounds the whole call
    (anytime); ``max_sweeps`` + ``seed`` make the plan bit-identical. ``current_placement``: the
    materialized placement, charged for migration by ``"joint"``. ``certificate`` (with ``rows``)
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
        packing = None
        if certificate is not None and rows is not None:  # rows already checked by the caller
            R = check_rows(rows)
            if isinstance(certificate, Certificate):
                cert, packing = certificate.as_dict(), certificate.packing_N
            else:
                cert = certificate
        else:
            c = params.certify
            R, full = certified_rows(window, topology, rows, clock.share(c.share, c.time_limit), c.method)
            cert, packing = full.as_dict(), full.packing_N
    ev = Evaluator(window, topology, cost)
    with timings.stage("seeds"):
        seeds = baseline_layouts(window, topology, R, clock.share(params.seeds.share, params.seeds.time_limit),
                                  packing=packing)
        b = ev.rank_loads(pl)
        t_score = time.perf_counter()
        seed_scores = {name: ev.score_layout(pl, lay, objective).key for name, lay in seeds.items()}
        # what the final validation + scoring will cost, kept in hand (×3, with a floor)
        clock.reserve = 3.0 * (time.perf_counter() - t_score) / max(len(seeds), 1) + 0.02
        best_seed = min(seed_scores, key=lambda name: seed_scores[name])
    layout = seeds[best_seed]
    search = joint = fallback = None
    # with replicas: row-aware replica moves for the best seed's packing first (the search then
    # packs against them), and again for the packing found; under a time limit the first packing
    # gets half of what is left and rounds of moves and re-packing share the rest (_replica_rounds)
    replicated = isinstance(pl, Placement) and not pl.is_permutation and placement in ("lpt", "joint")
    replica_notes: dict = {}
    if replicated and not clock.expired() and not (stop is not None and stop()):
        with timings.stage("replicas-start"):
            try:
                assert isinstance(pl, Placement)
                pl, moved, replica_notes = _replica_start(window, topology, ev, pl, layout, R, objective,
                                                          seed_scores[best_seed], clock, stop)
                if moved:  # the seeds are scored again against the placement they will be packed for
                    b = ev.rank_loads(pl)
                    seed_scores = {name: ev.score_layout(pl, lay, objective).key for name, lay in seeds.items()}
                    best_seed = min(seed_scores, key=lambda name: seed_scores[name])
                    layout = seeds[best_seed]
            except Exception as exc:  # keep the constructive replicas, and say so
                fallback = f"replica moves failed ({exc.__class__.__name__}: {exc}); kept the constructive replicas"
    with timings.stage("anneal"):
        try:
            if clock.expired():
                raise _OutOfTime(f"the {time_limit:g}s limit was spent before the search")
            left = clock.left()
            res = anneal(window.lengths, b, topology, cost, R, objective,
                         [lay.arrays() for lay in seeds.values()], config=params.anneal, seed=seed,
                         time_limit=None if left is None else (0.5 * left if replicated else left),
                         max_sweeps=max_sweeps,
                         progress=progress, stop=stop)
            found = Layout(res.row, res.slot, R)
            errs = Plan.from_layout(topology, pl, found, objective).validate(window)
            if errs:
                raise RuntimeError("annealer returned an invalid layout: " + errs[0])
            if ev.score_layout(pl, found, objective).key <= seed_scores[best_seed]:
                layout = found
            search = SearchStats.from_anneal(res.stats)
        except _OutOfTime as exc:
            fallback = f"no search: {exc}; using baseline {best_seed}"
        except Exception as exc:  # fall back to the best valid baseline, and say so
            fallback = f"annealing failed ({exc.__class__.__name__}: {exc}); using baseline {best_seed}"
    if replicated and fallback is None and not clock.expired() and not (stop is not None and stop()):
        with timings.stage("replicas"):
            try:
                assert isinstance(pl, Placement)
                pl, layout, rounds = _replica_rounds(window, topology, cost, ev, pl, layout, R,
                                                     objective, params, seed, clock, max_sweeps, stop)
                replica_notes = {**rounds, "start_moves": replica_notes.get("start_moves", 0),
                                 "start_kept": replica_notes.get("start_kept", False)}
            except Exception as exc:  # keep the packing and placement found so far, and say so
                fallback = f"replica moves failed ({exc.__class__.__name__}: {exc}); kept the constructive replicas"
    if (pl_kind == "lpt" and placement == "joint" and not clock.expired()
            and not (stop is not None and stop())):
        with timings.stage("joint"):
            try:
                jp = params.joint
                packer = anneal_packer(window, topology, cost, R, objective, config=params.anneal,
                                       max_sweeps=max_sweeps)
                jr = joint_search(window, topology, cost, R, objective, pl, layout.arrays(),
                                  time_limit=clock.left(), seed=seed, max_rounds=jp.max_rounds,
                                  current_placement=current_placement,
                                  config=jp.config(params.refine, max_sweeps), packer=packer)
                found = Layout(jr.row, jr.slot, R)
                if not Plan.from_layout(topology, jr.placement, found, objective).validate(window):
                    pl, layout, pl_kind = jr.placement, found, "joint"
                    joint = JointStats.from_joint(jr.stats)
            except Exception as exc:
                fallback = f"joint placement failed ({exc.__class__.__name__}: {exc}); kept LPT"
    timings.record("total", time.perf_counter() - t_start)
    timings.record("warmup", warmup.seconds["warmup"])
    report = PlanReport(placement_kind=pl_kind, seed_scores={k: v[0] for k, v in seed_scores.items()},
                        search=search, fallback=fallback, joint=joint, timings=timings.seconds,
                        notes={"replicas": replica_notes} if replica_notes else {})
    return build_plan(ev, pl, layout, objective, report=report, certificate=cert)


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


def _replica_rounds(window: Window, topology: Topology, cost: CostModel, ev: Evaluator, pl: Placement,
                    layout: Layout, R: int, objective, params: PlannerParams, seed: int, clock: _Clock,
                    max_sweeps: int | None, stop, max_rounds: int = 3) -> tuple[Placement, Layout, dict]:
    """Row-aware replica moves for the packing found, kept only if the one evaluator scores it
    better. Without a time limit: one call of ``2 · REPLICA_PASSES`` passes (the packing had the
    whole sweep budget). Under a time limit: rounds of (moves in single passes between clock
    checks, ≤ 32 a round; then packing again against the new placement's surrogate loads, from
    the current layout), each kept only if better; the first packing had half of the time, each
    re-packing takes half of what is left (the last one all of it)."""
    t0 = time.perf_counter()
    best = ev.score_layout(pl, layout, objective).key
    t_score = time.perf_counter() - t0  # one exact scoring (the even-local split, per cell)
    notes = {"rounds": 0, "moves": 0, "placements_kept": 0, "packings_kept": 0}

    def stopped() -> bool:
        return clock.expired() or (stop is not None and stop())

    timed = clock.limit is not None
    chunks, passes = (32, 1) if timed else (1, 2 * REPLICA_PASSES)
    for rnd in range(max_rounds if timed else 1):
        if stopped():
            break
        cand, moves = _replica_moves(window, topology, pl, layout, R, clock, stopped, chunks, passes, t_score)
        notes["rounds"] += 1
        notes["moves"] += moves
        t0 = time.perf_counter()
        key = ev.score_layout(cand, layout, objective).key
        t_score = max(t_score, time.perf_counter() - t0)
        if moves == 0 or key >= best:
            break
        pl, best = cand, key
        notes["placements_kept"] += 1
        if not timed or stopped():
            break
        # what scoring the re-packing (and, after it, the plan) will cost
        left = max(0.01, (clock.left() or 0.0) - 2.0 * t_score)
        res = anneal(window.lengths, ev.rank_loads(pl), topology, cost, R, objective, [layout.arrays()],
                     config=params.anneal, seed=seed + rnd + 1,
                     time_limit=0.5 * left if rnd + 1 < max_rounds else left,
                     max_sweeps=None if max_sweeps is None else max(1, max_sweeps // 2),
                     stop=stop)
        found = Layout(res.row, res.slot, R)
        if Plan.from_layout(topology, pl, found, objective).validate(window):
            raise RuntimeError("annealer returned an invalid layout")
        key = ev.score_layout(pl, found, objective).key
        if key < best:
            layout, best = found, key
            notes["packings_kept"] += 1
    return pl, layout, notes


def with_replicas(topology: Topology, num_experts: int, cost: CostModel, redundant_experts: int | None,
                  max_replica_bytes: float | None) -> Topology:
    """``topology`` with ``redundant_experts`` (when given), checked: E + N divisible by P, and
    the replicas' expert state per rank (N / P slots × ``cost.expert_bytes``) within
    ``max_replica_bytes`` (when given)."""
    if redundant_experts is not None:
        if isinstance(redundant_experts, bool) or not isinstance(redundant_experts, (int, np.integer)) \
                or redundant_experts < 0:
            raise InputError(f"redundant_experts must be an integer ≥ 0, got {redundant_experts!r}")
        topology = dataclasses.replace(topology, redundant_experts=int(redundant_experts))
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
        left = self.left()
        return left is not None and left <= 0.0

    def share(self, fraction: float, cap: float) -> float:
        """A stage's limit: ``cap``, and at most ``fraction`` of the whole limit or what is left."""
        if self.end is None or self.limit is None:
            return cap
        return max(0.01, min(cap, fraction * self.limit, self.left() or 0.0))

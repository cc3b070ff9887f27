"""Integration API for trainers (verl, AReaL, slime, NeMo-RL, OpenRLHF, Megatron).

One call per optimizer step::

    from routepack_opt import plan_micro_batches
    mb = plan_micro_batches(lengths=seqlens, counts=replayed_counts,   # or routes=[T, L, k] ids
                            dp_size=32, ep_size=8, max_tokens=8192, cost="qwen3-30b-a3b")
    my_batches = mb.micro_batches[dp_rank]          # list of lists of sample indices
    expert_map = mb.logical_to_physical             # [L, E], EPLB-style (no redundancy)

and :class:`AsyncPlanner` plans the next window in a background thread while the current step
trains, returning the best plan found by a deadline — never raising because of the planning
(a valid fallback plan instead, with the error recorded). Plans are always valid and
deterministic for the same inputs, seed and sweep budget.

Both take the same keyword-only options, :class:`PlanOptions` (one place for their defaults and
checks); bad options raise :class:`routepack_opt.core.errors.InputError`.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import threading
import time
from concurrent.futures import Future
from typing import Any

import numpy as np

from routepack_opt import pipeline
from routepack_opt.core.checks import check_bool, check_number, check_time_limit
from routepack_opt.core.cost import CostModel, resolve_cost
from routepack_opt.core.errors import InfeasibleError, InputError
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.core.layout import Layout
from routepack_opt.core.objective import check_objective
from routepack_opt.core.placement import Placement
from routepack_opt.core.plan import Plan
from routepack_opt.core.report import PlanReport
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import Window
from routepack_opt.heuristics.equal_counts import count_fit_decreasing
from routepack_opt.params import PlannerParams
from routepack_opt.pipeline import (
    DEFAULT_PARAMS,
    PLACEMENT_KINDS,
    as_placement_array,
    baseline_layouts,
    build_plan,
    check_current_placement,
    resolve_placement,
    solve,
)
from routepack_opt.warmup import groups_for
from routepack_opt.warmup import warm as warm_kernels

__all__ = ["MicroBatchPlan", "PlanOptions", "plan_micro_batches", "AsyncPlanner", "window_from", "quick_fallback"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class MicroBatchPlan:
    """``micro_batches[d][m]``: sample indices of micro-batch m on DP rank d (same count on every
    rank); ``physical_to_logical[l, s]`` / ``logical_to_physical[l, e]`` as in DeepSeek's EPLB
    (``phy2log`` / ``log2phy``): with one replica per expert both are [L, E] permutations; with
    ``redundant_experts`` they are ``phy2log`` [L, E + N] and ``log2phy`` [L, E, K], −1 past an
    expert's replica count (``plan.replicas`` holds the :class:`Placement`); ``report``: score, bounds, gap,
    certificate and timings (``fallback`` and ``error`` when a fallback plan was returned)."""

    micro_batches: list[list[list[int]]]
    physical_to_logical: np.ndarray
    logical_to_physical: np.ndarray
    plan: Plan
    report: dict

    @property
    def num_micro_batches(self) -> int:
        return self.plan.rows


@dataclasses.dataclass(frozen=True)
class PlanOptions:
    """Options of one planning call (checked when built; bad values raise ``InputError``).

    ``dp_size``, ``ep_size``, ``max_tokens`` are required. ``placement``: ``"lpt"``,
    ``"lpt-plain"``, ``"identity"``, ``"joint"`` or an [L, E] array (e.g. the placement already
    materialized); ``current_placement``: the materialized one, charged for migration by
    ``"joint"``. ``pp_multiple`` makes the micro-batch count a multiple of the pipeline schedule
    (PP × VPP). ``num_micro_batches`` forces the count; without it the planner chooses it in
    [R*, ``max_micro_batches``] (default R* + 4 pipeline multiples, docs/pipeline.md step 2b:
    more micro-batches than the fewest can balance a step better, each costs the cost model's
    ``row_overhead``); ``plan.rows`` is the count the trainer must run. ``time_limit`` bounds the
    search (anytime); ``max_sweeps`` + ``seed`` make it
    bit-identical. ``equal_samples_per_slot``: every DP rank gets exactly N / dp_size samples
    (verl's DP balance; N must divide by dp_size). ``params``: the planner's parameters
    (:class:`routepack_opt.PlannerParams`, e.g. ``PlannerParams.from_toml(path)``).
    ``redundant_experts``: extra physical expert slots per layer (E + N divisible by ep_size;
    hot experts get replicas, docs/model.md); ``max_replica_bytes``: the most expert state the
    replicas may add to one EP rank (bytes; needs the cost model's ``expert_bytes``).
    """

    dp_size: int | None = None
    ep_size: int | None = None
    max_tokens: int | None = None
    cost: str | CostModel = "qwen3-30b-a3b"
    objective: str = "max-sum"
    placement: object = "lpt"
    num_micro_batches: int | None = None
    max_micro_batches: int | None = None
    pp_multiple: int = 1
    min_micro_batches: int = 1
    time_limit: float | None = None
    max_sweeps: int | None = None
    seed: int = 0
    current_placement: object = None
    equal_samples_per_slot: bool = False
    params: PlannerParams = DEFAULT_PARAMS
    redundant_experts: int = 0
    max_replica_bytes: float | None = None

    def __post_init__(self):
        for name in ("dp_size", "ep_size", "max_tokens"):
            if getattr(self, name) is None:
                raise InputError(f"{name} is required (e.g. {name}=8)")
        check_objective(self.objective)
        if not isinstance(self.cost, (str, CostModel)):
            raise InputError(f"cost must be a preset name, a TOML path or a CostModel, got {self.cost!r}")
        if self.time_limit is not None:
            check_time_limit(self.time_limit, "time_limit")
        for name, lo in (("max_sweeps", 1), ("num_micro_batches", 1), ("max_micro_batches", 1), ("seed", 0)):
            v = getattr(self, name)
            if v is None and name != "seed":
                continue
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
                raise InputError(f"{name} must be an integer ≥ {lo}, got {v!r}")
        if not isinstance(self.params, PlannerParams):
            raise InputError(f"params must be a PlannerParams, got {self.params!r}")
        # dp/ep/capacity/row rules checked here, in the caller's thread; a row maximum no valid
        # count meets (min_micro_batches above it, or pp_multiple past it) too
        pipeline.row_limit(self.topology(), self.params.rows, self.max_micro_batches, self.num_micro_batches)
        self.cost_model()  # an unknown preset or a bad cost file, too
        if isinstance(self.placement, str):
            if self.placement not in PLACEMENT_KINDS:
                raise InputError(f"placement must be one of {', '.join(PLACEMENT_KINDS)} or an [L, E] "
                                 f"array, got {self.placement!r}")
        elif not isinstance(self.placement, Plan):
            as_placement_array("placement", self.placement)
        if self.current_placement is not None and not isinstance(self.current_placement, Plan):
            as_placement_array("current_placement", self.current_placement)

    @classmethod
    def of(cls, options: dict[str, Any]) -> PlanOptions:
        """From keyword options; an unknown one is an ``InputError`` naming it."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise InputError(f"unknown option(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        return cls(**options)

    def topology(self) -> Topology:
        # required: __post_init__ refused None
        assert self.dp_size is not None and self.ep_size is not None and self.max_tokens is not None
        return Topology(dp=self.dp_size, ep=self.ep_size, capacity=self.max_tokens,
                        min_rows=self.min_micro_batches, row_multiple=self.pp_multiple,
                        equal_samples_per_slot=self.equal_samples_per_slot,
                        redundant_experts=self.redundant_experts)

    def cost_model(self) -> CostModel:
        return self.cost if isinstance(self.cost, CostModel) else resolve_cost(self.cost)


def window_from(lengths, counts=None, routes=None, num_experts: int | None = None, top_k=None) -> Window:
    """A window from per-sample counts [N, L, E] or per-token routes [T, L, k] (+ num_experts)."""
    if (counts is None) == (routes is None):
        raise InputError("give exactly one of counts=[N, L, E] or routes=[T, L, k]")
    if counts is not None:
        return Window(lengths, counts, top_k=top_k)
    if num_experts is None:
        raise InputError("routes=... needs num_experts=E")
    return Window.from_routes(lengths, routes, num_experts)


def checked_window(lengths, counts, routes, num_experts, opts: PlanOptions) -> Window:
    """The window of a call, checked against its options before any planning: every window
    invariant (:class:`Window`), E divisible by ``ep_size``, the placements' shapes, every length
    within ``max_tokens``, enough samples for R·D nonempty cells (and N/D with
    ``equal_samples_per_slot``). Raises InputError."""
    window = window_from(lengths, counts, routes, num_experts)
    # the replica rules as the planner applies them: E + N divisible by ep, at most one replica
    # of an expert per rank, the replicas' bytes within max_replica_bytes
    topo = pipeline.with_replicas(opts.topology(), window.num_experts, opts.cost_model(), None,
                                  opts.max_replica_bytes)
    if topo.redundant_experts:
        from routepack_opt.heuristics.placement.replicate import _check as check_replica_slots

        check_replica_slots(np.zeros((1, window.num_experts)), topo.ep, window.num_experts + topo.redundant_experts)
    topo.check_samples(window.num_samples)
    check_current_placement(opts.current_placement, window)
    if not isinstance(opts.placement, str):
        resolve_placement(window, topo, opts.placement)
    longest = int(window.lengths.max())
    if longest > topo.capacity:
        raise InputError(f"a sample of {longest} tokens exceeds max_tokens={topo.capacity}")
    m = topo.row_multiple
    least_rows = max(-(-topo.min_rows // m) * m, opts.num_micro_batches or 1)
    if window.num_samples < least_rows * topo.dp:
        raise InputError(f"{window.num_samples} samples cannot fill {least_rows} micro-batch(es) on each "
                         f"of {topo.dp} DP ranks (every micro-batch holds at least one sample)")
    return window


def _to_result(p: Plan) -> MicroBatchPlan:
    cells = p.cells()
    mbs = [[cells[r][d] for r in range(p.rows)] for d in range(p.topology.dp)]
    p2l = p.placement.phy2log.copy()  # [L, S]; l2p: [L, E] π, or [L, E, K] with replicas (−1 past logcnt)
    l2p = p.placement.first_slots.copy() if p.replicas is None else p.placement.log2phy()
    rep = p.info  # the report's JSON form: what a trainer logs
    rep["certificate"] = p.certificate
    return MicroBatchPlan(mbs, p2l, l2p, p, rep)


def _plan(window: Window, opts: PlanOptions, *, rows=None, certificate=None, time_limit=None,
          stop=None) -> MicroBatchPlan:
    """:func:`solve` on ``window`` with ``opts`` (``rows``/``certificate``/``time_limit`` override)."""
    p = solve(window, opts.topology(), opts.cost_model(), objective=opts.objective,
              placement=opts.placement, rows=opts.num_micro_batches if rows is None else rows,
              params=opts.params, time_limit=opts.time_limit if time_limit is None else time_limit,
              max_sweeps=opts.max_sweeps, seed=opts.seed, current_placement=opts.current_placement,
              certificate=certificate, stop=stop, max_replica_bytes=opts.max_replica_bytes,
              max_rows=opts.max_micro_batches)
    return _to_result(p)


def plan_micro_batches(lengths, counts=None, *, routes=None, num_experts: int | None = None,
                       **options: Any) -> MicroBatchPlan:
    """Plan one optimizer step. ``options`` are :class:`PlanOptions`' fields (``dp_size``,
    ``ep_size``, ``max_tokens`` required; an unknown one is an ``InputError``). The window is
    per-sample ``counts`` [N, L, E] or per-token ``routes`` [T, L, k] with ``num_experts``. Numba
    kernels are compiled (or loaded from the cache) before ``time_limit`` starts counting."""
    opts = PlanOptions.of(options)
    return _plan(checked_window(lengths, counts, routes, num_experts, opts), opts)  # as submit() checks


# ---------------------------------------------------------------------------------------------
# AsyncPlanner
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class _Job:
    """One submitted window and what planning it has produced so far."""

    window: Window  # checked in submit()
    opts: PlanOptions
    deadline_at: float  # time.monotonic() by which result() should answer (plus grace)
    future: Future
    cancel: threading.Event = dataclasses.field(default_factory=threading.Event)
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    plan: MicroBatchPlan | None = None
    fallback: MicroBatchPlan | None = None
    error: BaseException | None = None
    stage: str = "queued"  # queued → warm-up → certify → fallback → search → done


class AsyncPlanner:
    """Plans the next window in a background thread while the current step trains.

    ``submit(lengths, counts, deadline=S, **options)`` (options: :class:`PlanOptions`) returns
    within milliseconds: it only checks the options and hands the window to the planner's
    worker thread; the window's arrays must not be modified until ``result()`` returns.
    ``result()`` waits at most until ``deadline`` seconds after the submit plus ``grace``, and
    returns the plan if it is ready, else a valid fallback (identity — or ``current_placement``
    — placement with length-only packing), computed on the spot if the worker has not built one
    yet. It never re-raises an error of the planning thread: the fallback is returned, the error
    is in ``report["error"]`` and :attr:`last_error`, and logged.

    Latest window wins: a ``submit`` while an earlier window is still being planned cancels
    that one cooperatively (the annealer stops at its next chunk of sweeps) and plans the new
    one next — a trainer that moved on has no use for the old plan, and queueing would make
    every later window later still. ``result()`` refers to the latest submit. One worker thread
    plans one window at a time, so a stuck stage never piles up threads. Safe to call from
    several threads. Creating a planner starts the numba warm-up in the background
    (``warm=False`` to skip), so the first window is not planned by compiling kernels.
    """

    def __init__(self, grace: float = 1.0, warm: bool = True):
        self.grace = check_number(grace, "grace", 0.0, 1e9)  # seconds; 0: result() answers at the deadline
        check_bool(warm, "warm")
        self.last_error: BaseException | None = None
        self._cv = threading.Condition(threading.Lock())
        self._pending: _Job | None = None  # submitted, not yet picked up by the worker
        self._latest: _Job | None = None  # what result() answers for
        self._worker: threading.Thread | None = None
        self._closed = False
        if warm:
            threading.Thread(target=warm_kernels, name="routepack-warmup", daemon=True).start()

    # --- caller side ---------------------------------------------------------------------------
    def submit(self, lengths, counts=None, *, deadline: float, routes=None,
               num_experts: int | None = None, **options: Any) -> Future:
        """Start planning a window (``options``: :class:`PlanOptions`' fields, as
        :func:`plan_micro_batches`); ``deadline``: seconds
        from now until ``result()`` answers (the search's time limit is what is left of it, or
        ``time_limit`` if smaller). Returns a Future of the plan (or the worker's fallback;
        cancelled if superseded). Raises ``InputError`` for bad input, checked here as
        :func:`plan_micro_batches` checks it (the window's invariants, shapes, the cost, the
        placements, E divisible by ``ep_size``, lengths within ``max_tokens``, enough samples
        for the cells); never because an earlier window is still running."""
        deadline = check_time_limit(deadline, "deadline")
        opts = PlanOptions.of(options)
        # every input checked here, in the caller's thread (one pass over the counts)
        window = checked_window(lengths, counts, routes, num_experts, opts)
        job = _Job(window, opts, time.monotonic() + deadline, Future())
        with self._cv:
            if self._closed:
                raise RuntimeError("AsyncPlanner: closed")
            for old in (self._pending, self._latest):
                if old is not None and not old.done.is_set():
                    old.cancel.set()  # superseded: stop it at its next check
            if self._pending is not None:  # never started: finish it as cancelled
                self._finish(self._pending)
            self._pending = job
            self._latest = job
            if self._worker is None:
                self._worker = threading.Thread(target=self._loop, name="routepack-planner", daemon=True)
                self._worker.start()
            self._cv.notify_all()
        return job.future

    def result(self) -> MicroBatchPlan:
        """The latest submitted window's plan, by its deadline + grace; else its fallback (the
        worker's, or a quick one built here); every plan returned passes ``Plan.validate()``.
        Never raises because planning failed. Raises ``InputError`` only for a window on which
        no valid plan exists at all (e.g. N not a multiple of D with every sample too long to
        share a micro-batch: :func:`plan_micro_batches` refuses it too), ``RuntimeError``
        before any submit."""
        with self._cv:
            job = self._latest
        if job is None:
            raise RuntimeError("AsyncPlanner: nothing submitted")
        job.done.wait(max(0.0, job.deadline_at + self.grace - time.monotonic()))
        with job.lock:
            if job.plan is not None:
                return job.plan
            job.cancel.set()  # past its deadline: a late plan would be thrown away, stop it
            if job.fallback is None:
                try:
                    job.fallback = self._quick_fallback(job)
                except InputError:
                    quick_failed = True
                else:
                    quick_failed = False
            else:
                quick_failed = False
        if quick_failed:
            # best-fit may need more rows than the window has samples for where the certified R*
            # does not: build the worker's kind of fallback (at R*) here
            fb = self._certified_fallback(job)
            with job.lock:
                if job.fallback is None:
                    job.fallback = fb
        with job.lock:
            if job.plan is not None:
                return job.plan
            done = job.fallback
            assert done is not None  # set above, or by the worker
            if job.error is not None and "error" not in done.report:
                done.report["error"] = f"{job.error.__class__.__name__}: {job.error}"
            return done

    def close(self) -> None:
        """Cancel what is running and let the worker thread end."""
        with self._cv:
            self._closed = True
            for job in (self._pending, self._latest):
                if job is not None:
                    job.cancel.set()
            self._cv.notify_all()

    # --- worker side ---------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cv:
                while self._pending is None and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                job, self._pending = self._pending, None
            if job is None:  # unreachable: the wait ends with a job or closed
                continue
            try:
                self._run(job)
            except BaseException as exc:  # recorded; result() returns the fallback
                job.error = exc
                self.last_error = exc
                log.error("routepack AsyncPlanner: planning failed: %s: %s",
                          exc.__class__.__name__, exc, exc_info=exc)
            finally:
                self._finish(job)

    def _run(self, job: _Job) -> None:
        opts = job.opts
        job.stage = "warm-up"
        # waits for the background warm-up if it is running
        warm_kernels(groups_for(opts.placement, opts.redundant_experts))
        if job.cancel.is_set():
            return
        window = job.window
        topo, cost = opts.topology(), opts.cost_model()
        job.stage = "certify"
        left = job.deadline_at - time.monotonic()
        c = opts.params.certify
        rows, cert = pipeline.resolve_rows(window, topo, opts.num_micro_batches,
                                  time_limit=min(c.time_limit, max(0.05, 0.5 * left)), method=c.method)
        job.stage = "fallback"
        fb = self._fallback(window, topo, cost, opts, rows, cert)
        with job.lock:
            if job.fallback is None:
                job.fallback = fb
        left = job.deadline_at - time.monotonic()
        if job.cancel.is_set() or left <= 0:
            return
        job.stage = "search"
        # 10 % of what is left stays in hand for the evaluator, joint stage and hand-over
        limit = 0.9 * left if opts.time_limit is None else min(opts.time_limit, 0.9 * left)
        # the count is searched from the certified R* unless the options force one
        mb = _plan(window, opts, rows=opts.num_micro_batches, certificate=cert, time_limit=limit,
                   stop=job.cancel.is_set)
        if not job.cancel.is_set():
            with job.lock:
                job.plan = mb

    def _certified_fallback(self, job: _Job) -> MicroBatchPlan:
        """The worker's fallback, built in the caller's thread (R* certified first); InputError
        only where no valid plan exists."""
        opts = job.opts
        topo, c = opts.topology(), opts.params.certify
        try:
            rows, cert = pipeline.resolve_rows(job.window, topo, opts.num_micro_batches,
                                               time_limit=c.time_limit, method=c.method)
            return self._fallback(job.window, topo, opts.cost_model(), opts, rows, cert)
        except (InputError, InfeasibleError) as exc:
            raise InputError(f"AsyncPlanner: no valid plan exists for this window: {exc}") from None

    @staticmethod
    def _fallback(window, topo, cost, opts, rows, cert) -> MicroBatchPlan:
        """Identity (or the materialized) placement + the first length-only baseline at R."""
        pl, _ = resolve_placement(window, topo, "identity" if opts.current_placement is None
                                  else opts.current_placement)
        name, layout = next(iter(baseline_layouts(window, topo, rows).items()))
        return _to_result(build_plan(Evaluator(window, topo, cost), pl, layout, opts.objective,
                                     report=PlanReport(fallback=f"deadline: baseline {name}"),
                                     certificate=cert))

    def _finish(self, job: _Job) -> None:
        job.stage = "done"
        job.done.set()
        if job.error is not None:
            self.last_error = job.error
        fut = job.future
        if fut.done():
            return
        if job.plan is not None:
            fut.set_result(job.plan)
        elif job.cancel.is_set():
            fut.cancel()
        elif job.fallback is not None:
            fut.set_result(job.fallback)
        else:
            fut.set_exception(job.error or RuntimeError("AsyncPlanner: no plan"))

    def _quick_fallback(self, job: _Job) -> MicroBatchPlan:
        """A valid plan from the lengths alone, in numpy and plain Python (no numba, so it is
        quick even while kernels compile): identity placement, best-fit decreasing into bins,
        bins split until every one of the R·D cells has a sample, dealt row-major."""
        try:
            mb = _quick_plan(job)
        except InputError as exc:
            if job.error is None:
                job.error = exc
                self.last_error = exc
            raise InputError(f"AsyncPlanner: no plan and no fallback for this window: {exc}") from exc
        log.warning("routepack AsyncPlanner: no plan by the deadline (stage %s); quick fallback",
                    job.stage)
        return mb


def quick_fallback(lengths, counts=None, *, routes=None, num_experts=None,
                   options: PlanOptions | dict | None = None) -> MicroBatchPlan:
    """AsyncPlanner's quick fallback for one window (numpy only, no numba): the window checked
    as :meth:`AsyncPlanner.submit` checks it, packed best-fit decreasing at the current (or
    identity) placement. Raises ``InputError`` for bad input or a window no fallback fits."""
    opts = options if isinstance(options, PlanOptions) else PlanOptions.of(options or {})
    window = checked_window(lengths, counts, routes, num_experts, opts)
    return _quick_plan(_Job(window, opts, 0.0, Future()))


def _quick_plan(job: _Job) -> MicroBatchPlan:
    opts = job.opts
    topo = opts.topology()
    lengths = job.window.lengths  # checked in submit()
    L, E = job.window.num_layers, job.window.num_experts
    placement: np.ndarray | Placement = np.tile(np.arange(E, dtype=np.int64), (L, 1))
    if topo.redundant_experts:
        topo.check_experts(E)
        placement = Placement.identity(L, E, topo.ep, topo.redundant_experts)
    else:
        current = check_current_placement(opts.current_placement, job.window)
        if current is not None:
            placement = current
    N, D, C = lengths.size, topo.dp, topo.capacity
    if lengths.min() < 1 or lengths.max() > C:
        raise InputError(f"every length must be in 1..max_tokens={C}")
    # best-fit decreasing (≤ 11/9·OPT + 6/9 bins; Dósa 2007) on a sorted list of free rooms
    order = np.argsort(-lengths, kind="stable")
    bin_N = np.empty(N, dtype=np.int64)
    rooms: list[int] = []  # free capacity of the open bins, ascending
    ids: list[int] = []
    bins = 0
    for i in order.tolist():
        li = int(lengths[i])
        j = bisect.bisect_left(rooms, li)  # the fullest bin the sample still fits
        if j == len(rooms):
            b, room = bins, C
            bins += 1
        else:
            b, room = ids.pop(j), rooms.pop(j)
        bin_N[i] = b
        k = bisect.bisect_left(rooms, room - li)
        rooms.insert(k, room - li)
        ids.insert(k, b)
    m = topo.row_multiple
    R = max(topo.min_rows, -(-bins // D))
    R = -(-R // m) * m
    if opts.num_micro_batches is not None:
        R = max(R, int(opts.num_micro_batches))
    if R * D > N:
        raise InputError(f"the quick fallback needs {R}×{D} cells but the window has {N} samples")
    if topo.equal_samples_per_slot:  # count-limited first fit (numpy only), fewest rows it fills
        topo.check_samples(N)
        while R * D <= N:
            got = count_fit_decreasing(lengths, R, D, C)
            if got is not None:
                p = Plan.from_layout(topo, placement, Layout(got[0], got[1], R), opts.objective,
                                     report=PlanReport(fallback="deadline: quick count-limited first-fit fallback"))
                return _to_result(p)
            R += m
        raise InputError(f"the quick fallback found no layout with N/D = {N // D} samples per slot")
    # split bins until there are R·D of them (every cell nonempty; a split never overfills)
    members: list[list[int]] = [[] for _ in range(bins)]
    for i in order.tolist():
        members[bin_N[i]].append(i)
    k = 0
    while len(members) < R * D:
        while len(members[k]) < 2:
            k += 1
        members.append([members[k].pop()])
    row = np.empty(N, dtype=np.int64)
    slot = np.empty(N, dtype=np.int64)
    for c, ids in enumerate(members):
        row[ids] = c // D
        slot[ids] = c % D
    p = Plan.from_layout(topo, placement, Layout(row, slot, R), opts.objective,
                         report=PlanReport(fallback="deadline: quick best-fit fallback (no plan, no baseline in time)"))
    return _to_result(p)

"""Ray: the replay report's windows in parallel, and the planner as a Ray actor.

Our users' trainers run on Ray (verl's single controller, slime's ``RolloutManager``); this module
puts RoutePack's work on Ray CPU workers, off the trainer's critical path. Ray is optional
(pinned in the ``verl`` extra, ``ray==2.60.0``); without it every entry point is an
:class:`~routepack_opt.core.errors.InputError` saying how to install it.

- :func:`ray_cluster` starts a local cluster of N CPUs (and stops it), joins one at an address,
  or reuses the one this process already initialised (:mod:`._ray_cluster`, with the reaper of
  what a started cluster leaves behind; re-exported here).
- :func:`map_windows` runs :func:`routepack_opt.report_run.analyze_window` as one Ray task per
  window (one CPU each, numba on one thread), at most ``2 × CPUs`` in flight, and yields the
  records as they finish. A task that dies (worker killed, out of memory) gives an ``error``
  record; the run goes on.
- :func:`run_report`: ``routepack replay-report`` (resumable, ``steps.jsonl`` + ``report.html``).
- :class:`RayPlanner`: :class:`routepack_opt.api.AsyncPlanner`'s contract with the planning in
  a Ray actor on a CPU worker (see its docstring).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from routepack_opt.core.checks import check_time_limit
from routepack_opt.core.errors import InputError
from routepack_opt.integrations._ray_cluster import (  # the cluster, re-exported
    RayCluster,
    _cluster_failure,
    _ray,
    check_workers,
    ray_cluster,
)

__all__ = ["ray_cluster", "map_windows", "run_report", "RayCluster", "RayPlanner", "task_overhead"]


def _one_thread() -> None:
    """A task holds one CPU: numba's parallel kernels use one thread, so N tasks use N cores."""
    with contextlib.suppress(Exception):
        import numba

        numba.set_num_threads(1)


def _analyze_task(path: str, cfg, step: int) -> dict:
    _one_thread()
    from routepack_opt.report_run import analyze_window

    return analyze_window(path, cfg, step)


def map_windows(items: Iterable[tuple[str, int]], cfg, cluster: RayCluster,
                max_in_flight: int | None = None) -> Iterator[dict]:
    """Analyse each ``(path, step)`` as a Ray task; yield the records as they finish (any order).
    The config goes to the object store once (``ray.put``); each task reads its own window."""
    ray = _ray()
    task = ray.remote(num_cpus=1, max_retries=1)(_analyze_task)
    cfg_ref = ray.put(cfg)
    limit = max_in_flight or 2 * cluster.slots
    it = iter(items)
    pending: dict[Any, tuple[str, int]] = {}

    def fill():
        for path, step in it:
            pending[task.remote(path, cfg_ref, step)] = (path, step)
            if len(pending) >= limit:
                return

    fill()
    while pending:
        try:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=2.0)
        except Exception as exc:
            raise InputError(f"the Ray cluster failed mid-run ({exc.__class__.__name__}: "
                             f"{' '.join(str(exc).split())[:200]}); {_RESUME}") from None
        if not ready:  # nothing finished: is the cluster still there? (a dead raylet never answers)
            why = _cluster_failure()
            if why is not None:
                raise InputError(f"the Ray cluster failed mid-run ({why}: out of memory?); {_RESUME}")
            continue
        ref = ready[0]
        path, step = pending.pop(ref)
        try:
            rec = ray.get(ref)
        except Exception as exc:  # the worker died (killed, out of memory): recorded, the run goes on
            msg = " ".join(str(exc).split())[:300]
            rec = {"window": Path(path).name, "step": step, "error": f"worker failed: {exc.__class__.__name__}: {msg}"}
        fill()
        yield rec


_RESUME = "the finished windows are kept in steps.jsonl: run the same command again to resume"


def _noop(x=None):
    return x


def task_overhead(n: int = 200) -> dict:
    """Ray's cost per task on the running cluster, in seconds: ``serial`` — submit and wait for
    one empty task at a time (round trip); ``batch`` — n empty tasks submitted at once, wall / n
    (the driver's throughput limit)."""
    ray = _ray()
    f = ray.remote(num_cpus=1)(_noop)
    ray.get([f.remote() for _ in range(min(n, 20))])  # workers started
    t0 = time.perf_counter()
    for _ in range(n):
        ray.get(f.remote())
    serial = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    ray.get([f.remote() for _ in range(n)])
    batch = (time.perf_counter() - t0) / n
    return {"serial": serial, "batch": batch, "tasks": n}


# ---------------------------------------------------------------------------------------------
# RayPlanner
# ---------------------------------------------------------------------------------------------


class _PlannerActor:
    """Holds an :class:`AsyncPlanner` in a Ray worker; its methods run on the actor's threads,
    which take calls in any order: ``submit`` carries the driver's sequence number, and one
    older than a submit already taken is dropped (the latest window wins, as in AsyncPlanner)."""

    def __init__(self, grace: float, warm: bool):
        from routepack_opt.api import AsyncPlanner

        _one_thread()
        self._planner = AsyncPlanner(grace=grace, warm=warm)
        self._lock = threading.Lock()
        self._seq = -1

    def submit(self, seq: int, lengths, counts, routes, num_experts, deadline_at: float, options: dict) -> None:
        """``deadline_at``: wall-clock time (``time.time()``) by which the driver wants the plan."""
        with self._lock:
            if seq <= self._seq:
                return  # a newer window was submitted already
            self._seq = seq
            left = max(1e-3, deadline_at - time.time())
            self._planner.submit(lengths, counts, routes=routes, num_experts=num_experts, deadline=left, **options)

    def result(self, submitted=None):
        """``submitted``: the ObjectRef of the matching ``submit`` call, passed by the driver so
        that Ray runs this only after that submit (a threaded actor runs calls in any order)."""
        return self._planner.result()

    def threads(self) -> int:
        return threading.active_count()

    def close(self) -> None:
        self._planner.close()


class RayPlanner:
    """:class:`routepack_opt.api.AsyncPlanner` with the planning in a Ray actor on a CPU worker.

    ``submit(lengths, counts, deadline=S, **options)`` (options: :class:`~routepack_opt.api.PlanOptions`)
    checks the options here (bad ones raise ``InputError`` in the caller), puts the arrays in
    Ray's object store (``ray.put``: one copy into shared memory, read without a copy by the
    actor on the same node; a torch CPU tensor is viewed as numpy without a copy first) and
    returns at once; the actor plans the window with an ``AsyncPlanner`` (latest window wins).
    ``result()`` answers by ``deadline + grace`` seconds after the submit: the actor's plan (or
    its fallback, answered by its own ``deadline + grace / 2``), or — when the actor is late,
    died or failed — a quick valid fallback built here from the lengths alone (identity
    placement, best-fit decreasing; numpy only). It never raises because of the planning: the
    error is in ``report["error"]`` and :attr:`last_error`. A dead actor is replaced at the next
    submit. ``close()`` (or ``with RayPlanner() as p:``) ends the actor: nothing is left running.

    Ray must already be initialised (``ray.init()``; verl's and slime's drivers are Ray
    drivers). ``num_cpus``: the actor's CPU reservation; ``actor_options``: more
    ``ray.remote`` options (e.g. ``scheduling_strategy``, ``runtime_env``)."""

    def __init__(self, grace: float = 1.0, *, warm: bool = True, num_cpus: float = 1,
                 actor_options: dict | None = None):
        ray = _ray()
        if not ray.is_initialized():
            raise InputError("RayPlanner needs a running Ray: call ray.init() (or ray.init(address=...)) first")
        self.grace = check_time_limit(grace, "grace") if grace != 0 else 0.0
        self.last_error: BaseException | None = None
        self._warm = warm
        # two threads: result() of one window may still wait while the next submit arrives
        self._options = dict(num_cpus=num_cpus, max_concurrency=2, **(actor_options or {}))
        self._actor = self._start()
        self._job: tuple | None = None  # (lengths, counts, routes, num_experts, opts, deadline_at)
        self._submitted = None  # ObjectRef of the actor's submit call
        self._seq = 0
        self._closed = False

    def _start(self):
        ray = _ray()
        return ray.remote(**self._options)(_PlannerActor).remote(self.grace / 2, self._warm)

    def __enter__(self) -> RayPlanner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def submit(self, lengths, counts=None, *, deadline: float, routes=None, num_experts: int | None = None,
               **options: Any) -> None:
        """Start planning a window in the actor (see the class docstring); returns at once.
        Raises only ``InputError`` for bad options (and ``RuntimeError`` after ``close()``)."""
        from routepack_opt.api import PlanOptions, checked_window

        ray = _ray()
        if self._closed:
            raise RuntimeError("RayPlanner: closed")
        deadline = check_time_limit(deadline, "deadline")
        if (counts is None) == (routes is None):
            raise InputError("give exactly one of counts=[N, L, E] or routes=[T, L, k]")
        opts = PlanOptions.of(options)
        deadline_at = time.time() + deadline
        lengths, counts, routes = (None if a is None else _as_numpy(a) for a in (lengths, counts, routes))
        checked_window(lengths, counts, routes, num_experts, opts)  # bad input: InputError here, as AsyncPlanner
        self._job = (lengths, counts, routes, num_experts, opts, deadline_at)
        refs = [None if a is None else ray.put(a) for a in (lengths, counts, routes)]
        self._seq += 1
        try:
            self._submitted = self._actor.submit.remote(self._seq, *refs, num_experts, deadline_at, options)
        except Exception as exc:  # the actor handle is unusable: a new actor, and try once more
            self.last_error = exc
            self._actor = self._start()
            self._submitted = self._actor.submit.remote(self._seq, *refs, num_experts, deadline_at, options)

    def result(self):
        """The latest window's :class:`~routepack_opt.api.MicroBatchPlan` by its deadline +
        grace (see the class docstring). ``RuntimeError`` before any submit; ``InputError`` only
        when not even a fallback exists (the lengths themselves are unusable)."""
        ray = _ray()
        if self._job is None:
            raise RuntimeError("RayPlanner: nothing submitted")
        lengths, counts, routes, num_experts, opts, deadline_at = self._job
        error: BaseException | None = None
        try:
            ref = self._actor.result.remote(self._submitted)  # runs after that submit
            ready, _ = ray.wait([ref], timeout=max(0.0, deadline_at + self.grace - time.time()))
            if ready:
                return ray.get(ref)
            error = TimeoutError("no plan from the Ray actor by the deadline")
        except Exception as exc:  # the actor died or its planning failed: the fallback below
            error = exc
            if isinstance(exc, ray.exceptions.RayActorError):
                self._actor = self._start()  # the next submit goes to a live actor
        self.last_error = error
        mb = _driver_fallback(lengths, counts, routes, num_experts, opts)
        mb.report["error"] = f"{error.__class__.__name__}: {' '.join(str(error).split())[:300]}"
        return mb

    def actor_threads(self) -> int:
        """Threads alive in the actor process (a leak check)."""
        return int(_ray().get(self._actor.threads.remote()))

    def close(self) -> None:
        """End the actor (its planning thread with it). Idempotent."""
        if self._closed:
            return
        self._closed = True
        ray = _ray()
        with contextlib.suppress(Exception):
            ray.get(self._actor.close.remote(), timeout=5)
        with contextlib.suppress(Exception):
            ray.kill(self._actor)


def _as_numpy(a):
    """A numpy view of ``a`` (torch CPU tensors without a copy), else ``a`` (a list of per-sample
    arrays, slime's form, goes as it is)."""
    if isinstance(a, np.ndarray):
        return a
    if hasattr(a, "numpy") and hasattr(a, "detach"):  # torch.Tensor
        return a.detach().cpu().numpy()
    if isinstance(a, (list, tuple)):
        return np.asarray(a) if a and np.isscalar(a[0]) else a
    return np.asarray(a)


def _driver_fallback(lengths, counts, routes, num_experts, opts):
    """AsyncPlanner's quick fallback (numpy only), built in the driver."""
    from routepack_opt.api import quick_fallback

    return quick_fallback(lengths, counts, routes=routes, num_experts=num_experts, options=opts)


# ---------------------------------------------------------------------------------------------
# the replay report's run
# ---------------------------------------------------------------------------------------------


def run_report(run_dir, out_dir, cfg, *, workers: int | None = None, address: str | None = None,
               retry_errors: bool = False, progress: bool = False, on_step=None) -> dict:
    """``routepack replay-report``: analyse every window of ``run_dir`` not yet in
    ``OUT_DIR/steps.jsonl`` (:mod:`routepack_opt.report_run`) on a Ray cluster (see
    :func:`ray_cluster`), appending each line as it finishes; then write ``report.html`` from all
    lines. ``retry_errors``: plan again the windows whose line holds an ``error`` (the newest line
    of a window wins in the report). ``on_step(record)`` is called after each append. Returns a
    summary: windows, planned now, skipped, failed, wall seconds, paths."""
    from routepack_opt import report_run as rr

    if workers is not None:
        check_workers(workers)  # before OUT_DIR is made
    out = rr.check_dirs(run_dir, out_dir)
    files = rr.list_windows(run_dir, cfg.format)
    rr.prepare_out_dir(out, cfg)
    steps_path = out / rr.STEPS
    done, _ = rr.read_steps(steps_path)
    have = {r["window"] for r in done if not (retry_errors and "error" in r)}
    todo = [(str(p), k) for k, p in enumerate(files) if p.name not in have]
    todo = rr.schedule(todo, cfg)  # likely-slow windows first
    t0 = time.perf_counter()
    failed = 0
    if todo:
        with ray_cluster(workers=workers, address=address) as cluster, \
                _progress(progress, len(files), len(files) - len(todo)) as bar:
            for rec in map_windows(todo, cfg, cluster):
                rr.append_step(steps_path, rec)
                failed += "error" in rec
                bar(rec)
                if on_step is not None:
                    on_step(rec)
    wall = time.perf_counter() - t0
    notes: list[str] = []
    records, _ = rr.read_steps(steps_path, notes)  # lines no run writes: skipped, with a note
    names = [p.name for p in files]
    latest = rr.run_records(records, names, notes)  # only RUN_DIR's windows, each its newest line
    options = cfg.options()
    rr.render_report(latest, out / rr.REPORT, title=str(run_dir), windows=names, options=options,
                     notes=notes)
    summary_json = rr.write_summary(out, latest, options)
    return {"windows": len(files), "planned": len(todo), "skipped": len(files) - len(todo), "failed": failed,
            "seconds": wall, "steps": str(steps_path), "report": str(out / rr.REPORT),
            "summary": rr.summarize(latest), "summary_json": str(summary_json),
            "run_summary": rr.run_summary(latest, options), "notes": notes}


@contextlib.contextmanager
def _progress(enabled, total: int, completed: int):
    """A rich progress bar over the windows (``enabled`` True or ``"bar"``); ``"lines"``: one
    ``k/N windows`` line per window on stderr with the time left (a batch job's log); yields
    ``advance(record)`` (a no-op when disabled)."""
    if enabled == "lines":
        import sys

        t0, state = time.perf_counter(), {"k": completed}

        def line(rec):
            state["k"] += 1
            done_now = state["k"] - completed
            el = time.perf_counter() - t0
            eta = el / done_now * (total - state["k"]) if done_now else 0.0
            print(f"replay-report: {state['k']}/{total} windows, {el:.0f} s elapsed, ~{eta:.0f} s left "
                  f"({rec['window']}{': error' if 'error' in rec else ''})", file=sys.stderr, flush=True)

        yield line
        return
    if not enabled:
        yield lambda rec: None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with Progress(TextColumn("replay-report"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), TextColumn("{task.fields[last]}")) as prog:
        task = prog.add_task("windows", total=total, completed=completed, last="")

        def advance(rec):
            last = (f"{rec['window']}: error" if "error" in rec else
                    f"{rec['window']}: saving {100 * rec['saving']:+.1f}%" if rec.get("saving") is not None
                    else rec["window"])
            prog.update(task, advance=1, last=last)

        yield advance

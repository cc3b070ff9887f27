"""The trainer-facing API: plan_micro_batches options and AsyncPlanner's never-crash contract."""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest

from routepack_opt import api, pipeline
from routepack_opt.api import AsyncPlanner, PlanOptions, plan_micro_batches
from routepack_opt.core.cost import PRESETS
from routepack_opt.core.errors import InputError
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import Window
from routepack_opt.heuristics.anneal import Hooks, anneal
from routepack_opt.trace import generate_window

COST = PRESETS["olmoe-1b-7b"].cost
OPTS = dict(dp_size=8, ep_size=4, max_tokens=4096, cost=COST)


@pytest.fixture(scope="module")
def window():
    return generate_window("olmoe-1b-7b", 96, seed=5, num_layers=4)


def test_missing_required_option_is_input_error(window):
    """A missing dp_size / ep_size / max_tokens is an InputError (not KeyError/TypeError), sync and async."""
    for missing in ("dp_size", "ep_size", "max_tokens"):
        kw = {k: v for k, v in OPTS.items() if k != missing}
        with pytest.raises(InputError, match=missing):
            plan_micro_batches(window.lengths, window.counts, **kw)
        with pytest.raises(InputError, match=missing):
            AsyncPlanner(warm=False).submit(window.lengths, window.counts, deadline=1.0, **kw)


@pytest.mark.parametrize("bad", [dict(objective="fastest"), dict(time_limit=0), dict(time_limit=float("nan")),
                                 dict(max_sweeps=0), dict(seed=-1), dict(dp_size=0), dict(cost=3)])
def test_bad_options_are_input_errors(bad):
    """Bad option values raise InputError when the options are built."""
    with pytest.raises(InputError):
        PlanOptions(**{**OPTS, **bad})


def test_submit_takes_time_limit_and_deadline(window):
    """submit(time_limit=..., deadline=...) is accepted (no duplicate-argument TypeError) and plans."""
    ap = AsyncPlanner(grace=30.0, warm=False)
    ap.submit(window.lengths, window.counts, deadline=30.0, time_limit=0.5, max_sweeps=5, **OPTS)
    mb = ap.result()
    assert mb.plan.validate(window) == [] and "fallback" not in mb.report
    ap.close()


def test_async_plan_equals_sync_plan_with_sweep_budget(window):
    """With a sweep budget and an ample deadline, AsyncPlanner's plan is plan_micro_batches' plan."""
    sync = plan_micro_batches(window.lengths, window.counts, max_sweeps=5, seed=2, **OPTS)
    ap = AsyncPlanner(grace=60.0, warm=False)
    ap.submit(window.lengths, window.counts, deadline=60.0, max_sweeps=5, seed=2, **OPTS)
    got = ap.result()
    assert got.micro_batches == sync.micro_batches
    assert np.array_equal(got.logical_to_physical, sync.logical_to_physical)
    ap.close()


def test_overrunning_loop_never_raises_and_always_returns_valid_plans(window):
    """20 steps whose planning overruns its deadline: no submit raises, every result() is valid."""
    ap = AsyncPlanner(grace=0.0, warm=False)
    kinds = []
    for step in range(20):
        # joint placement with a deadline far below what it needs: the worker is always busy
        ap.submit(window.lengths, window.counts, deadline=0.01, placement="joint", seed=step, **OPTS)
        mb = ap.result()
        assert mb.plan.validate(window) == []
        assert len({len(rank) for rank in mb.micro_batches}) == 1
        kinds.append(mb.report.get("fallback"))
    assert any(k is not None for k in kinds)  # the deadline did bite: fallbacks were returned
    ap.close()


def test_submit_hands_certification_to_the_worker(window, monkeypatch):
    """submit returns while R* is still blocked in the worker thread (never in the caller's)."""
    entered, release = threading.Event(), threading.Event()
    threads = []
    real = pipeline.resolve_rows

    def slow_rows(*args, **kwargs):
        threads.append(threading.current_thread())
        entered.set()
        release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "resolve_rows", slow_rows)
    ap = AsyncPlanner(grace=30.0, warm=False)
    t0 = time.perf_counter()
    ap.submit(window.lengths, window.counts, deadline=30.0, max_sweeps=2, **OPTS)
    latency = time.perf_counter() - t0
    assert not release.is_set()  # submit came back although R* cannot have finished
    assert entered.wait(30) and threads == [threads[0]] and threads[0] is not threading.current_thread()
    release.set()
    assert ap.result().plan.validate(window) == []
    print(f"submit latency {latency * 1e3:.2f} ms")
    ap.close()


def test_planning_error_returns_fallback_and_records_it(window, monkeypatch, caplog):
    """An exception in the planning thread: result() returns a valid fallback, the error is kept and logged."""

    def boom(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(api, "_plan", boom)
    ap = AsyncPlanner(grace=30.0, warm=False)
    with caplog.at_level(logging.ERROR, logger="routepack_opt.api"):
        ap.submit(window.lengths, window.counts, deadline=30.0, **OPTS)
        mb = ap.result()
    assert mb.plan.validate(window) == []
    assert "fallback" in mb.report and "boom" in mb.report["error"]
    assert isinstance(ap.last_error, RuntimeError) and str(ap.last_error) == "boom"
    assert any("boom" in r.getMessage() for r in caplog.records)
    ap.close()


def test_result_without_worker_progress_builds_quick_fallback(window, monkeypatch):
    """If the worker has built nothing by the deadline (e.g. still compiling), result() builds a
    valid fallback itself, honouring the row rules."""
    release = threading.Event()
    monkeypatch.setattr(pipeline, "resolve_rows", lambda *a, **k: release.wait(30) and None)
    ap = AsyncPlanner(grace=0.0, warm=False)
    ap.submit(window.lengths, window.counts, deadline=0.01, pp_multiple=2, **OPTS)
    mb = ap.result()
    release.set()
    assert mb.plan.validate(window) == []
    assert mb.num_micro_batches % 2 == 0 and "quick" in mb.report["fallback"]
    ap.close()


def test_two_threads_submit_and_result_concurrently(window):
    """Two threads calling submit/result at once never raise and always get valid plans."""
    ap = AsyncPlanner(grace=0.0, warm=False)
    errors, plans = [], []

    def trainer(seed):
        try:
            for step in range(8):
                ap.submit(window.lengths, window.counts, deadline=0.02, seed=seed + step, max_sweeps=3, **OPTS)
                plans.append(ap.result())
        except BaseException as exc:  # noqa: BLE001 - any exception fails the test below
            errors.append(exc)

    ts = [threading.Thread(target=trainer, args=(s,)) for s in (0, 100)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not errors and len(plans) == 16
    assert all(mb.plan.validate(window) == [] for mb in plans)
    ap.close()


def test_anneal_stop_cancels_cooperatively(window):
    """anneal(hooks=Hooks(stop=...)) returning True ends the search after its first chunk with a valid layout."""
    from routepack_opt.heuristics.placement.lpt import identity_placement
    from routepack_opt.pipeline import baseline_layouts

    topo = Topology(dp=8, ep=4, capacity=4096)
    b = Evaluator(window, topo, COST).rank_loads(identity_placement(window.num_layers, window.num_experts))
    R = pipeline.resolve_rows(window, topo, None)[0]
    res = anneal(window.lengths, b, topo, COST, R, "max-sum", [lay.arrays() for lay in baseline_layouts(window, topo, R).values()],
                 max_sweeps=200, seed=0, hooks=Hooks(stop=lambda: True))
    assert res.stats["temperatures_done"] == 1 and res.stats["sweeps"] <= 2
    cells = res.row * topo.dp + res.slot
    assert np.bincount(cells, minlength=R * topo.dp).min() >= 1


def test_quick_fallback_is_valid_at_the_certified_rows_on_a_tight_window():
    """The numba-free quick fallback packs a tight window (R* = N/D) into valid, full-row cells."""
    rng = np.random.default_rng(3)
    # perfect-fit pairs: R* bins of exactly C tokens, and exactly 2 samples per cell → R·D = N/2
    C, D = 1000, 4
    a = rng.integers(100, 900, size=16)
    lengths = np.concatenate([a, C - a])
    counts = np.zeros((lengths.size, 1, 4), dtype=np.int64)
    counts[:, 0, 0] = lengths
    job = api._Job(Window(lengths, counts, top_k=1), PlanOptions(dp_size=D, ep_size=2, max_tokens=C),
                   0.0, api.Future())
    mb = api._quick_plan(job)
    assert mb.plan.validate(Window(lengths, counts, top_k=1)) == []
    assert mb.num_micro_batches == 4  # 16 full bins on 4 slots: best-fit finds the pairs

"""``routepack replay-report`` and ``RayPlanner`` on one small local Ray cluster (issue 28).

One ``ray.init(num_cpus=2)`` for the whole module (Ray's start costs seconds); the commands
reuse it. Windows are tiny (48 samples, 2 layers) and the search budget a few sweeps.
"""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

from routepack_opt.core.cost import CostModel, Stage
from routepack_opt.core.errors import InputError
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.core.testing import random_window
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import save_window
from routepack_opt.report_run import (
    ReportConfig,
    analyze_window,
    append_step,
    read_steps,
    render_report,
    strip_timings,
    summarize,
)

COST = CostModel(stages=(Stage("attn", 0.02, 1e-4),), gamma=0.05, row_overhead=3.0)
TOPO = Topology(dp=4, ep=2, capacity=60)
OPTS = ["--dp", 4, "--ep", 2, "--capacity", 60, "--max-sweeps", 3]


def _cost_file(tmp_path):
    p = tmp_path / "cost.toml"
    p.write_text(COST.to_toml())
    return p


def _run_dir(tmp_path, n=3, bad=False):
    d = tmp_path / "run"
    d.mkdir()
    for k in range(n):
        save_window(random_window(48, 2, 8, 2, max_len=40, min_len=5, seed=k), d / f"step_{k}.npz")
    if bad:
        (d / "step_9.npz").write_bytes(b"not a zip file")
    return d


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install ray==2.60.0)")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield ray
    ray.shutdown()


# --- without Ray ---------------------------------------------------------------------------------


def test_analyze_window_scores_every_layout_with_the_evaluator(tmp_path):
    """A window's record: the saving is over the best cap-keeping baseline, the time split adds up to the makespan, baselines re-score."""
    d = _run_dir(tmp_path, n=1)
    cfg = ReportConfig(topology=TOPO, cost=COST, max_sweeps=3)
    rec = analyze_window(d / "step_0.npz", cfg, 0)
    assert "error" not in rec, rec.get("error")
    split = rec["time_split"]
    assert split["attention"] + split["experts"] + split["overhead"] == pytest.approx(rec["makespan"], rel=1e-9)
    keep = {k: b for k, b in rec["baselines"].items() if "makespan" in b and b["cap_violations"] == 0}
    best = rec["best_baseline"]
    assert keep[best]["makespan"] == min(b["makespan"] for b in keep.values())
    assert rec["saving"] == pytest.approx((keep[best]["makespan"] - rec["makespan"]) / keep[best]["makespan"])
    assert rec["rows"] == rec["certificate"]["rows"] and rec["makespan"] >= rec["lower_bound"] * (1 - 1e-12)
    # verl's strict KK at R* under identity placement, scored again here
    from routepack_opt.heuristics.baselines import verl_kk_layout
    from routepack_opt.heuristics.placement.lpt import identity_placement

    w = __import__("routepack_opt").load_window(d / "step_0.npz")
    row, slot = verl_kk_layout(w.lengths, TOPO, rec["rows"])
    ms = Evaluator(w, TOPO, COST).score(identity_placement(2, 8), row, slot, rec["rows"], "max-sum").makespan
    assert rec["baselines"]["verl-kk@R*/identity"]["makespan"] == pytest.approx(ms, rel=1e-12)
    assert rec["baselines"]["verl-kk@R*/identity"]["extra_rows"] == 0


def test_a_bad_window_is_an_error_record(tmp_path):
    """A window that cannot be read gives a record with its error, not an exception."""
    p = tmp_path / "w.npz"
    p.write_bytes(b"junk")
    rec = analyze_window(p, ReportConfig(topology=TOPO, cost=COST), 7)
    assert rec["window"] == "w.npz" and rec["step"] == 7 and "not a readable .npz" in rec["error"]


def test_steps_jsonl_ignores_and_cuts_a_torn_last_line(tmp_path):
    """A torn last line (a kill mid-write) is ignored by the reader and cut before the next append; a bad middle line is an error."""
    from routepack_opt.report_run import _trim_torn_tail

    p = tmp_path / "steps.jsonl"
    append_step(p, {"window": "a", "error": "1"})
    append_step(p, {"window": "b", "error": "2"})
    with open(p, "ab") as fh:
        fh.write(b'{"window": "c", "error"')
    recs, torn = read_steps(p)
    assert [r["window"] for r in recs] == ["a", "b"] and torn
    _trim_torn_tail(p)
    append_step(p, {"window": "c", "error": "3"})
    recs, torn = read_steps(p)
    assert [r["window"] for r in recs] == ["a", "b", "c"] and not torn
    p.write_bytes(p.read_bytes().replace(b'"b"', b'"b'))
    with pytest.raises(InputError, match="line 2"):
        read_steps(p)


def test_report_html_is_self_contained(tmp_path):
    """report.html embeds its plots as base64 PNGs and shows the run's mean saving."""
    d = _run_dir(tmp_path, n=2)
    cfg = ReportConfig(topology=TOPO, cost=COST, max_sweeps=3)
    recs = [analyze_window(d / f"step_{k}.npz", cfg, k) for k in range(2)] + [{"window": "x.npz", "error": "E"}]
    path = render_report(recs, tmp_path / "report.html")
    text = path.read_text()
    assert text.count("data:image/png;base64,") >= 5 and "src='http" not in text and "<script" not in text
    mean = summarize(recs)["mean_saving"]
    assert f"{100 * mean:+.2f}%" in text and "x.npz" in text


def test_run_summary_answers_in_seconds_against_cap_keeping_baselines(tmp_path):
    """summary.json: seconds saved = Σ over steps of (best cap-keeping baseline − ours), planning
    seconds measured (R* + plan), net = their difference, every option; report.html leads with the
    net seconds and shows the options; a cap-breaking best baseline is refused."""
    from routepack_opt.report_run import run_summary, write_summary

    d = _run_dir(tmp_path, n=2)
    cfg = ReportConfig(topology=TOPO, cost=COST, max_sweeps=3, cost_name="my-cost")
    recs = [analyze_window(d / f"step_{k}.npz", cfg, k) for k in range(2)] + [{"window": "x.npz", "error": "E"}]
    want = 0.0
    for r in recs[:2]:
        best = r["baselines"][r["best_baseline"]]
        assert best["cap_violations"] == 0
        assert all(b["makespan"] >= best["makespan"] for b in r["baselines"].values()
                   if "makespan" in b and b["cap_violations"] == 0)
        want += (best["makespan"] - r["makespan"]) / 1e6
    path = write_summary(tmp_path, recs, cfg.options())
    s = json.loads(path.read_text())
    assert s["windows"] == 3 and s["seconds_saved"] == pytest.approx(want)
    plan_s = sum(r["timings"]["certify"] + r["timings"]["plan"] for r in recs[:2])
    assert s["planning_seconds"] == pytest.approx(plan_s)
    assert s["net_seconds_saved"] == pytest.approx(want - plan_s)
    opts = s["options"]
    assert opts["redundant_experts"] == 0 and opts["cost"] == "my-cost" and opts["max_sweeps"] == 3
    assert opts["dp"] == TOPO.dp and opts["capacity"] == TOPO.capacity
    text = render_report(recs, tmp_path / "report.html", options=cfg.options()).read_text()
    head = text.index("id=net-seconds")
    assert head < text.index("id=mean-saving") and head < text.index("id=options")
    assert f"{s['net_seconds_saved']:+,.2f} s" in text and "redundant_experts" in text and "my-cost" in text
    bad = json.loads(json.dumps(recs[0]))
    bad["baselines"][bad["best_baseline"]]["cap_violations"] = 1
    with pytest.raises(InputError, match="breaks the cap"):
        run_summary([bad])


@pytest.mark.parametrize("case", ["empty", "missing", "out-is-run", "out-is-file", "both", "replay-no-e", "address",
                                  "replicas-indivisible", "replica-bytes"])
def test_replay_report_bad_inputs_are_one_error_line(tmp_path, run_cli, case):
    """Bad inputs to replay-report: one error: line, exit 2, before any Ray start."""
    d = tmp_path / "run"
    d.mkdir()
    cost = _cost_file(tmp_path)
    out = tmp_path / "out"
    extra = []
    if case != "empty":
        save_window(random_window(48, 2, 8, 2, max_len=40, min_len=5), d / "step_0.npz")
    if case == "missing":
        d = tmp_path / "nope"
    elif case == "out-is-run":
        out = d
    elif case == "out-is-file":
        out = d / "step_0.npz"
    elif case == "both":
        extra = ["--workers", 2, "--address", "auto"]
    elif case == "replay-no-e":
        extra = ["--format", "slime"]
    elif case == "address":
        pytest.importorskip("ray", reason="ray is not installed (pip install ray==2.60.0)")
        extra = ["--address", "127.0.0.1:1"]  # nothing listens on port 1
    elif case == "replicas-indivisible":  # E=8 + 3 slots over ep=2: refused before Ray, not per window
        extra = ["--redundant-experts", 3]
    elif case == "replica-bytes":  # the cost file has no expert_bytes to weigh a replica with
        extra = ["--redundant-experts", 2, "--max-replica-bytes", 1e9]
    code, stdout, err = run_cli("replay-report", d, "-o", out, "--cost", cost, *OPTS, *extra)
    assert code == 2 and err.startswith("error:") and err.count("\n") == 1 and stdout == ""
    assert not (tmp_path / "out").exists() or case == "out-is-run"


# --- on Ray ------------------------------------------------------------------------------------


def test_replay_report_runs_resumes_and_records_errors(ray_cluster, tmp_path, run_cli):
    """replay-report on Ray: one line per window, a bad window recorded with its error, a rerun plans nothing, a lost line is planned again to the same numbers."""
    d = _run_dir(tmp_path, n=3, bad=True)
    out = tmp_path / "out"
    cost = _cost_file(tmp_path)
    code, stdout, err = run_cli("replay-report", d, "-o", out, "--cost", cost, *OPTS, "--workers", 2, "--json")
    assert code == 0, err
    res = json.loads(stdout)
    assert res["windows"] == 4 and res["planned"] == 4 and res["failed"] == 1
    recs, torn = read_steps(out / "steps.jsonl")
    assert sorted(r["window"] for r in recs) == ["step_0.npz", "step_1.npz", "step_2.npz", "step_9.npz"] and not torn
    assert "error" in next(r for r in recs if r["window"] == "step_9.npz")
    assert (out / "report.html").stat().st_size > 10_000
    code, stdout, _ = run_cli("replay-report", d, "-o", out, "--cost", cost, *OPTS, "--json")
    assert code == 0 and json.loads(stdout)["planned"] == 0
    # lose a line and tear the tail, as a kill would; the rerun plans that window again, same numbers
    lines = (out / "steps.jsonl").read_bytes().splitlines(keepends=True)
    keep = [ln for ln in lines if b"step_1.npz" not in ln]
    (out / "steps.jsonl").write_bytes(b"".join(keep) + b'{"window": "step_1.n')
    code, stdout, err = run_cli("replay-report", d, "-o", out, "--cost", cost, *OPTS, "--workers", 1, "--json")
    assert code == 0, err
    assert json.loads(stdout)["planned"] == 1
    again, torn = read_steps(out / "steps.jsonl")
    canon = lambda rs: sorted(json.dumps(strip_timings(r), sort_keys=True) for r in rs)
    assert canon(again) == canon(recs) and not torn


def test_replay_report_with_replicas(ray_cluster, tmp_path, run_cli):
    """--redundant-experts N: our plan and the baselines' EPLB / identity placements all have N
    replica slots; every line's numbers are the one evaluator's on that placement and layout."""
    from routepack_opt.core.placement import Placement
    from routepack_opt.heuristics.frameworks import FRAMEWORK_PACKERS
    from routepack_opt.heuristics.placement.replicate import eplb_placement

    d = _run_dir(tmp_path, n=2)
    out = tmp_path / "out"
    code, stdout, err = run_cli("replay-report", d, "-o", out, "--cost", _cost_file(tmp_path), *OPTS,
                                "--redundant-experts", 2, "--workers", 1, "--json")
    assert code == 0, err
    recs, _ = read_steps(out / "steps.jsonl")
    assert len(recs) == 2 and not any("error" in r for r in recs)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["options"]["redundant_experts"] == 2 and summary["windows"] == 2
    assert json.loads(stdout)["run_summary"]["net_seconds_saved"] == pytest.approx(summary["net_seconds_saved"])
    # no terminal: one "k/N windows" line per window on stderr, with the time left
    assert "1/2 windows" in err and "2/2 windows" in err and "s left" in err
    assert "redundant_experts" in (out / "report.html").read_text()
    topo = Topology(dp=4, ep=2, capacity=60, redundant_experts=2)
    for rec in recs:
        assert rec["redundant_experts"] == 2 and rec["gap_force_balanced"] >= 1.0 - 1e-9
        w = random_window(48, 2, 8, 2, max_len=40, min_len=5, seed=int(rec["window"][5]))
        ev = Evaluator(w, topo, COST)
        pl = eplb_placement(w.expert_loads(), 2, 10)
        assert isinstance(pl, Placement) and (pl.logcnt > 1).any()
        row, slot, rows = FRAMEWORK_PACKERS["nemo-ffd"](w.lengths, topo)
        assert rec["baselines"]["nemo-ffd/eplb"]["makespan"] == pytest.approx(
            ev.evaluate(pl, row, slot, rows, "max-sum").score.makespan)
        best = rec["baselines"][rec["best_baseline"]]
        assert rec["saving"] == pytest.approx((best["makespan"] - rec["makespan"]) / best["makespan"])
        # the baselines' EP-rank CV is their placement's even split, identity's worse than EPLB's
        cv = rec["ep_imbalance"]
        assert 0 <= cv["eplb"] < cv["identity"] and np.isfinite(cv["routepack"])


def test_replay_report_refuses_other_options_on_resume(ray_cluster, tmp_path, run_cli):
    """Resuming into an OUT_DIR made with other options is one error line, exit 2."""
    d = _run_dir(tmp_path, n=1)
    out = tmp_path / "out"
    cost = _cost_file(tmp_path)
    assert run_cli("replay-report", d, "-o", out, "--cost", cost, *OPTS)[0] == 0
    code, _, err = run_cli("replay-report", d, "-o", out, "--cost", cost, *OPTS[:-1], 4)
    assert code == 2 and err.startswith("error:") and "max_sweeps" in err and err.count("\n") == 1


def _alive_planner_actors() -> int:
    from ray._private import state

    return sum(1 for a in state.actors().values()  # pending creation, alive or restarting: not dead
               if a["State"] != "DEAD" and a.get("ActorClassName") == "_PlannerActor")


def test_ray_planner_always_late_never_raises_and_leaks_nothing(ray_cluster):
    """RayPlanner with a deadline it always misses: a valid plan every step, no raise, one actor while open, none and no new thread after close."""
    from routepack_opt.integrations.ray import RayPlanner

    w = random_window(400, 4, 8, 2, max_len=40, min_len=5, seed=1)
    threads = None
    with RayPlanner(grace=0.05) as planner:
        for k in range(5):
            t0 = time.perf_counter()
            planner.submit(w.lengths, w.counts, deadline=0.001, dp_size=4, ep_size=2, max_tokens=60,
                           max_sweeps=200, cost=COST)
            assert time.perf_counter() - t0 < 1.0
            mb = planner.result()
            assert not mb.plan.validate(w) and mb.report.get("fallback")
            assert sorted(i for d in mb.micro_batches for m in d for i in m) == list(range(400))
            assert _alive_planner_actors() == 1
            if k == 1:
                threads = threading.active_count()
        assert threading.active_count() == threads
        # with time to plan: the actor's searched plan, not a fallback (result() returns as soon as
        # the plan is there; the long deadline only covers a cold numba cache on a loaded machine)
        planner.submit(w.lengths, w.counts, deadline=300, dp_size=4, ep_size=2, max_tokens=60, max_sweeps=3, cost=COST)
        mb = planner.result()
        assert not mb.plan.validate(w) and not mb.report.get("fallback") and "error" not in mb.report
    deadline = time.time() + 10
    while _alive_planner_actors() and time.time() < deadline:
        time.sleep(0.1)
    assert _alive_planner_actors() == 0


def test_ray_planner_checks_options_in_the_caller(ray_cluster):
    """Bad options and a bad window raise InputError at submit (AsyncPlanner's contract); result() before any submit is a RuntimeError."""
    from routepack_opt.integrations.ray import RayPlanner

    w = random_window(40, 2, 8, 2, max_len=40, min_len=5, seed=2)
    with RayPlanner(grace=0.1, warm=False) as planner:
        with pytest.raises(RuntimeError):
            planner.result()
        with pytest.raises(InputError):
            planner.submit(w.lengths, w.counts, deadline=1.0, dp_size=4, ep_size=2)  # no max_tokens
        with pytest.raises(InputError):
            planner.submit(w.lengths, w.counts, deadline=-1, dp_size=4, ep_size=2, max_tokens=60)
        bad = np.asarray(w.counts)[:, :, :3]  # counts that do not add up to k·len
        with pytest.raises(InputError, match="counts"):
            planner.submit(w.lengths, bad, deadline=1.0, dp_size=4, ep_size=2, max_tokens=60)
        planner.submit(w.lengths, w.counts, deadline=1.0, dp_size=4, ep_size=2, max_tokens=60)
        mb = planner.result()
        assert sorted(i for d in mb.micro_batches for m in d for i in m) == list(range(40))


def test_schedule_starts_the_tightly_filled_windows_first(tmp_path):
    """Windows whose tokens nearly fill the rows the volume bound allows (where the certifier
    searches for seconds) start first; the rest keep step order; an unreadable file goes last."""
    from routepack_opt.core.window import Window
    from routepack_opt.report_run import predicted_fill, schedule

    d = tmp_path / "run"
    d.mkdir()
    cfg = ReportConfig(topology=TOPO, cost=COST, objective="max-sum")
    cell = TOPO.dp * TOPO.capacity  # 240 tokens a row
    fills = {0: 0.5, 1: 239 / 240, 2: 0.75, 3: 479 / 480}
    for k, f in fills.items():
        rows = 2 if k == 3 else 1
        total = round(f * rows * cell)
        lengths = np.full(24 * rows, total // (24 * rows))
        lengths[: total - lengths.sum()] += 1
        counts = np.zeros((lengths.size, 1, 4), dtype=np.int64)
        counts[:, 0, 0] = lengths  # top-1, every token to expert 0
        save_window(Window(lengths, counts, top_k=1), d / f"step_{k}.npz")
    (d / "step_4.npz").write_bytes(b"not a zip file")
    items = [(str(d / f"step_{k}.npz"), k) for k in range(5)]
    for k, f in fills.items():
        assert predicted_fill(items[k][0], cfg) == pytest.approx(f)
    assert predicted_fill(items[4][0], cfg) == 0.0
    assert [k for _, k in schedule(items, cfg)] == [3, 1, 2, 0, 4]


def test_seed_packing_has_no_clock():
    """Tight windows: the seeds' packing into R*·D bins comes from iteration- and node-bounded searches, the same on every call."""
    from routepack_opt.core.bounds import is_packing
    from routepack_opt.report_run import _seed_packing

    sizes = np.array([4, 4, 3, 3, 3, 3])  # FFD: 3 bins of 10; 2 exist: {4, 3, 3} twice
    a, det = _seed_packing(sizes, 10, 2, None)
    b, _ = _seed_packing(sizes, 10, 2, None)
    assert det and is_packing(sizes, 10, a, 2) and np.array_equal(a, b)

"""Replay report on Ray (issue 28): a whole run planned window by window, 1 vs 2 workers, a
killed-and-resumed run, RayPlanner always late, and a cost model for 64 workers.

    python experiments/replay_report.py [--windows 200] [--samples 1024] [--max-sweeps 20]
        [--run-dir /tmp/routepack-replay-run] [--parts gen,time,resume,overhead,planner] [--out DIR]

- gen: ``--windows`` calibrated qwen3-30b-a3b windows (``routepack_opt.trace``, default
  dispersion and skew), one per optimizer step: routing drifts every step (the generator's
  random walk of the popularity logits), and response lengths drift over the run (the median
  response grows from 18 % to 27 % of the cap in 10 stages, one routing calibration per stage).
  Generated once, in parallel on Ray, into ``--run-dir`` (not committed: ~9.5 MB a window).
- time: ``routepack replay-report`` on 1 worker, then on 2 (fresh output folders, same
  ``--max-sweeps`` and seed): wall times (with Ray's start) and the per-window records compared
  without their timings.
- resume: a 2-worker run killed with SIGKILL once ~40 % of the lines are in, then the same
  command again: its ``steps.jsonl`` against the uninterrupted one, line for line up to order.
- overhead: Ray's measured per-task overhead and the driver's append+fsync per line → the
  cost model for 64 workers.
- planner: RayPlanner in a 20-step loop whose deadline is always missed: no raise, a valid plan
  every step, actors and threads counted.

Writes ``experiments/results/replay_report/``: ``replay_report.md``, ``replay_report.json``,
``report.html`` (the 2-worker run's report), ``speedup.png``, ``window_times.png``,
``cost_model.png``. The screenshot of ``report.html`` in headless Chromium is taken separately
(``report_screenshot.png``, command in the markdown).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
from _lib import report, settings

STUDY = "replay_report"
PRESET = "qwen3-30b-a3b"
STAGES = 10
RESP_LO, RESP_HI = 0.18, 0.27


def response_mean(step: int, windows: int) -> float:
    stage = min(STAGES - 1, step * STAGES // max(windows, 1))
    return RESP_LO + (RESP_HI - RESP_LO) * stage / (STAGES - 1)


def _gen_one(path: str, step: int, windows: int, samples: int, seed: int) -> str:
    from routepack_opt.trace import write_trace

    if not Path(path).exists():
        write_trace(path, PRESET, samples, seed, step=step, response_mean=response_mean(step, windows))
    return path


def gen(run_dir: Path, windows: int, samples: int, seed: int) -> float:
    import ray

    run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    try:
        f = ray.remote(num_cpus=1)(_gen_one)
        ray.get([f.remote(str(run_dir / f"step_{t:04d}.npz"), t, windows, samples, seed) for t in range(windows)])
    finally:
        ray.shutdown()
    return time.perf_counter() - t0


def cli(*args) -> list[str]:
    return [sys.executable, "-m", "routepack_opt", "replay-report", *map(str, args)]


def run_cli(args, env) -> float:
    t0 = time.perf_counter()
    subprocess.run(args, check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def records(out: Path) -> list[dict]:
    from routepack_opt.report_run import read_steps

    return read_steps(out / "steps.jsonl")[0]


def canon(recs) -> list[str]:
    from routepack_opt.report_run import strip_timings

    return sorted(json.dumps(strip_timings(r), sort_keys=True) for r in recs)


def subset(run_dir: Path, work: Path, k: int | None) -> Path:
    """A run folder of the first ``k`` windows (symlinks), or ``run_dir`` itself."""
    files = sorted(run_dir.glob("*.npz"))
    if k is None or k >= len(files):
        return run_dir
    d = work / f"run_first_{k}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    for f in files[:k]:
        (d / f.name).symlink_to(f)
    return d


def full_run(run_dir: Path, work: Path, common: list, env) -> dict:
    out = work / "out_full"
    shutil.rmtree(out, ignore_errors=True)
    load0 = os.getloadavg()[0]
    wall = run_cli(cli(run_dir, "-o", out, *common, "--workers", 2), env)
    recs = records(out)
    print(f"full run: {wall:.1f} s ({len(recs)} windows)", file=sys.stderr)
    return {"wall": wall, "load_before": load0, "load_after": os.getloadavg()[0], "windows": len(recs),
            "window_seconds": [r["timings"]["total"] for r in recs],
            "window_cpu": [r["timings"].get("cpu", np.nan) for r in recs], "errors": sum("error" in r for r in recs)}


def time_runs(run_dir: Path, work: Path, common: list, env) -> dict:
    res = {}
    for w in (1, 2):
        out = work / f"out_w{w}"
        shutil.rmtree(out, ignore_errors=True)
        load0 = os.getloadavg()[0]
        wall = run_cli(cli(run_dir, "-o", out, *common, "--workers", w), env)
        recs = records(out)
        res[w] = {"wall": wall, "load_before": load0, "load_after": os.getloadavg()[0],
                  "window_seconds": [r["timings"]["total"] for r in recs], "windows": len(recs),
                  "window_cpu": [r["timings"].get("cpu", np.nan) for r in recs],
                  "errors": sum("error" in r for r in recs)}
        print(f"workers={w}: {wall:.1f} s ({len(recs)} windows)", file=sys.stderr)
    res["identical"] = canon(records(work / "out_w1")) == canon(records(work / "out_w2"))
    full = work / "out_full" / "steps.jsonl"
    if full.exists():  # the same windows' lines in the 200-window run (2 workers, other windows beside them)
        names = {r["window"] for r in records(work / "out_w1")}
        res["identical_to_full_run"] = canon(records(work / "out_w1")) == canon(
            [r for r in records(work / "out_full") if r["window"] in names])
    res["speedup"] = res[1]["wall"] / res[2]["wall"]
    return res


def resume_run(run_dir: Path, work: Path, common: list, env, windows: int) -> dict:
    out = work / "out_killed"
    shutil.rmtree(out, ignore_errors=True)
    proc = subprocess.Popen(cli(run_dir, "-o", out, *common, "--workers", 2), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    steps = out / "steps.jsonl"
    target = max(1, int(0.4 * windows))
    while proc.poll() is None:
        n = steps.read_bytes().count(b"\n") if steps.exists() else 0
        if n >= target:
            break
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and everything it started in its session
    proc.wait()
    time.sleep(3)
    # Ray's own processes share the driver's fate (they die with it); any left in that session
    # are counted and ended by their pid (they were started by this study)
    left = [int(p) for p, sid in (ln.split() for ln in subprocess.run(
        ["ps", "-eo", "pid=,sid="], capture_output=True, text=True).stdout.splitlines()) if int(sid) == proc.pid]
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    raw = steps.read_bytes()
    kept_lines = raw.count(b"\n")
    torn = not raw.endswith(b"\n")
    wall = run_cli(cli(run_dir, "-o", out, *common, "--workers", 2), env)
    after = records(out)
    names = {r["window"] for r in after}
    same = canon(after) == canon([r for r in records(work / "out_full") if r["window"] in names])
    return {"processes_left_after_kill": len(left), "lines_at_kill": kept_lines, "torn_tail_at_kill": torn, "resume_wall": wall, "lines_after": len(after),
            "identical_to_uninterrupted": same, "duplicates": len(after) - len({r["window"] for r in after})}


def overhead(work: Path) -> dict:
    import ray

    from routepack_opt.integrations.ray import task_overhead
    from routepack_opt.report_run import append_step

    t0 = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    start = time.perf_counter() - t0
    try:
        ov = task_overhead(200)
    finally:
        ray.shutdown()
    p = work / "append_probe.jsonl"
    p.unlink(missing_ok=True)
    rec = json.loads((work / "out_w2" / "steps.jsonl").read_text().splitlines()[0])
    t0 = time.perf_counter()
    for _ in range(100):
        append_step(p, rec)
    ov["append_fsync"] = (time.perf_counter() - t0) / 100
    ov["ray_start"] = start
    return ov


def cost_model(times: list[float], ov: dict, start: float, workers: list[int]) -> dict:
    """T(W) = start + max(Σt / W + n·o_task / W, n·o_driver) + t_max (the last window's tail),
    with o_task the serial round trip of an empty task and o_driver the driver's cost per window
    (Ray's batch submit + the append's fsync)."""
    t = np.asarray(times)
    n = t.size
    o_task, o_drv = ov["serial"], ov["batch"] + ov["append_fsync"]
    out = {}
    for W in workers:
        out[W] = start + max((t.sum() + n * o_task) / W, n * o_drv) + (t.max() if W > 1 else 0.0)
    return out


def planner_loop(run_dir: Path, steps: int = 20) -> dict:
    import ray

    from routepack_opt.core.window import load_window
    from routepack_opt.integrations.ray import RayPlanner

    window = load_window(sorted(run_dir.glob("*.npz"))[0])
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    try:
        def alive():
            from ray._private import state

            return sum(1 for a in state.actors().values() if a["State"] != "DEAD")

        threads0 = threading.active_count()
        rows = []
        with RayPlanner(grace=0.2) as planner:
            for k in range(steps):
                t0 = time.perf_counter()
                planner.submit(window.lengths, window.counts, deadline=0.02, dp_size=32, ep_size=8,
                               max_tokens=16384, max_sweeps=20)
                t_submit = time.perf_counter() - t0
                try:
                    mb = planner.result()
                except Exception as exc:  # the contract says this never happens: counted, not hidden
                    rows.append({"step": k, "raised": f"{exc.__class__.__name__}: {exc}", "valid": False,
                                 "driver_fallback": False, "submit_ms": 1e3 * t_submit, "result_ms": float("nan"),
                                 "actors_alive": alive(), "driver_threads": threading.active_count(),
                                 "actor_threads": -1})
                    continue
                t_result = time.perf_counter() - t0
                errs = mb.plan.validate(window)
                seen = sorted(i for d in mb.micro_batches for m in d for i in m)
                rows.append({"step": k, "submit_ms": 1e3 * t_submit, "result_ms": 1e3 * t_result,
                             "valid": not errs and seen == list(range(window.num_samples)),
                             "fallback": mb.report.get("fallback"), "driver_fallback": "error" in mb.report,
                             "rows": mb.num_micro_batches, "actors_alive": alive(),
                             "driver_threads": threading.active_count(), "actor_threads": planner.actor_threads()})
        time.sleep(1.0)
        after = {"actors_alive": alive(), "driver_threads": threading.active_count(), "threads_before": threads0}
    finally:
        ray.shutdown()
    return {"steps": rows, "after_close": after}


def figures(res: dict, out: Path) -> None:
    plt = report.pyplot()
    t = res["time"]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.bar(["1 worker", "2 workers"], [t["1"]["wall"], t["2"]["wall"]], color=["tab:gray", "tab:blue"])
    ax.set(ylabel="wall s (incl. Ray start)", title=f"{res['time_windows']} windows: speed-up {t['speedup']:.2f}×")
    report.save_fig(fig, out / "speedup.png")
    fig, ax = plt.subplots(figsize=(5, 3.2))
    cpu = (res.get("full") or t["1"])["window_cpu"]
    ax.hist([c for c in cpu if c == c], bins=30, color="tab:blue")
    ax.set(xlabel="CPU seconds per window", ylabel="windows", title="Per-window work")
    report.save_fig(fig, out / "window_times.png")
    cm = res["cost_model"]
    Ws = sorted(int(w) for w in cm)
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot(Ws, [cm[str(w)] if str(w) in cm else cm[w] for w in Ws], marker="o")
    ax.set(xscale="log", yscale="log", xlabel="workers", ylabel="predicted wall s", title="Cost model")
    report.save_fig(fig, out / "cost_model.png")


def render(res: dict) -> list[str]:
    t, r, ov, pl = res["time"], res.get("resume"), res["overhead"], res.get("planner")
    s = res["summary"]
    lines = ["# Replay report on Ray (issue 28)", "",
             f"{res['windows']} windows of {res['samples']} samples ({PRESET}: L=48, E=128, top-8; D=32, P=8, "
             f"C=16,384), calibrated trace, routing drifting every step and the median response length "
             f"{RESP_LO:.0%}→{RESP_HI:.0%} of the cap over the run; `--max-sweeps {res['max_sweeps']}`, seed 0. "
             "Machine: 2 cores shared with other jobs (load average in the table).", "",
             *([f"Full run: {res['full']['windows']} windows on 2 workers in {res['full']['wall']:.0f} s "
                f"(load average {res['full']['load_before']:.1f} → {res['full']['load_after']:.1f}; "
                f"{np.nansum(res['full']['window_cpu']):.0f} CPU s of work, {np.nanmean(res['full']['window_cpu']):.2f} "
                f"CPU s per window; errors {res['full']['errors']}). Its report: `report.html`, its lines: `steps.jsonl`.", ""]
               if "full" in res else []),
             f"## 1 worker vs 2 workers ({res['time_windows']} windows)", "",
             "| workers | wall s (incl. Ray start) | mean wall s / window | mean CPU s / window | "
             "CPU / wall in a window | cores used (Σ CPU s / wall) | load avg before → after |",
             "|---|---|---|---|---|---|---|"]
    for w in ("1", "2"):
        cpu, wl = np.asarray(t[w]["window_cpu"]), np.asarray(t[w]["window_seconds"])
        lines.append(f"| {w} | {t[w]['wall']:.1f} | {wl.mean():.2f} | {np.nanmean(cpu):.2f} | "
                     f"{np.nanmean(cpu / wl):.2f} | {np.nansum(cpu) / t[w]['wall']:.2f} | "
                     f"{t[w]['load_before']:.1f} → {t[w]['load_after']:.1f} |")
    c1 = np.nansum(t["1"]["window_cpu"]) / t["1"]["wall"]
    c2 = np.nansum(t["2"]["window_cpu"]) / t["2"]["wall"]
    shared = c2 < 1.5  # 2 workers had less than 1.5 cores: the other jobs' load, not Ray, set the wall time
    lines += ["", f"The runs used about {c1:.2f} and {c2:.2f} cores (Σ CPU s / wall)"
              + (": with 2 workers each window ran at a fraction of a core, so the wall-time speed-up below "
                 "measures the machine's load, not Ray; the cost model gives the idle-core figure." if shared else
                 ". The windows most likely to be slow (the rows' fill nearest 1) start first, so no slow "
                 "window starts last behind an idle worker."), ""]
    lines += [f"Speed-up {t['speedup']:.2f}× (goal ≥ 1.7×{', not verifiable on these shared cores' if shared else ''}). "
              "Records identical without timings: "
              f"**{t['identical']}**" + (f"; and identical to the same windows' lines of the full run: "
                                         f"**{t['identical_to_full_run']}**" if "identical_to_full_run" in t else "")
              + ".", ""]
    if r:
        lines += [f"## Killed and resumed ({r['lines_after']} windows, 2 workers)", "",
                  f"Killed (SIGKILL to the driver's session) with {r['lines_at_kill']} lines in `steps.jsonl` "
                  f"(torn last line at the kill: {r['torn_tail_at_kill']}; Ray processes left running after the "
                  f"kill: {r['processes_left_after_kill']}); the same command again took "
                  f"{r['resume_wall']:.1f} s and left {r['lines_after']} lines ({r['duplicates']} duplicates). "
                  f"Equal to the same windows' lines of the uninterrupted full run, line for line up to order: "
                  f"**{r['identical_to_uninterrupted']}**.", ""]
    lines += ["## The run's numbers (from `steps.jsonl`, as in report.html)", "",
              f"Saving over the best cap-keeping baseline: mean {100 * s['mean_saving']:+.2f} %, median "
              f"{100 * s['median_saving']:+.2f} %, min {100 * s['min_saving']:+.2f} %, max "
              f"{100 * s['max_saving']:+.2f} %; rows saved {s['rows_saved']}; mean gap to LB {s['mean_gap']:.4f}.", "",
              "| baseline | mean saving vs it | cap violations | windows over cap | extra rows | mean gap |",
              "|---|---|---|---|---|---|"]
    for n, b in sorted(s["baselines"].items()):
        lines.append(f"| {n} | {100 * b['mean_saving']:+.2f} % | {b['cap_violations']} | {b['windows_over_cap']} | "
                     f"{b['extra_rows']} | {b['mean_gap']:.4f} |")
    n = res.get("notes")
    if n:
        lines += ["", "Best cap-keeping baseline per window: "
                  + ", ".join(f"{k} {v}" for k, v in sorted(n["best"].items(), key=lambda kv: -kv[1])) + ". "
                  f"RoutePack is slower than it on {n['negative']} of {res['windows']} windows; on "
                  f"{n['negative_best_has_extra_rows']} of them that baseline used more rows than R* (verl adds "
                  "micro-batches until every one fits the cap): more, smaller micro-batches cut the quadratic "
                  "attention of long samples, and R* is the fewest rows, not the fastest count. Our gap to the "
                  f"bound at R* is {n['negative_mean_gap']:.3f} on those windows against {n['mean_gap']:.3f} on "
                  f"average. Lines that had to use the certifier's time-bounded packing: {n['not_deterministic']}."]
    lines += ["", "## Cost model for a cluster", "",
              f"Ray's measured overhead here: {1e3 * ov['serial']:.2f} ms per empty task round trip, "
              f"{1e3 * ov['batch']:.2f} ms per task submitted in a batch; the driver's append + fsync per "
              f"line {1e3 * ov['append_fsync']:.2f} ms; Ray start {ov['ray_start']:.1f} s. With t_i the per-window "
              "CPU seconds of the run (the work; wall times here are stretched by the other jobs), T(W) = start + max((Σt + n·o_task) / W, n·o_driver) + max t "
              "(the last window's tail):", "",
              "| workers | predicted wall s (idle cores) |", "|---|---|"]
    for w, v in sorted(res["cost_model"].items(), key=lambda kv: int(kv[0])):
        lines.append(f"| {w} | {v:.1f} |")
    cm = res["cost_model"]
    lines += ["", f"Predicted on idle cores: 2 workers {cm['1'] / cm['2']:.2f}× faster than 1 (a lower bound: T(2) "
              f"is an upper bound), windows alone (without Ray's start) {(cm['1'] - ov['ray_start']) / (cm['2'] - ov['ray_start']):.2f}×."]
    lines += ["", "The max t term is Graham's list-scheduling bound (any window can be the last to start), so "
              "the prediction is an upper bound for W > 1. Measured here on shared cores: "
              + (f"{res['full']['windows']} windows on 2 workers {res['full']['wall']:.0f} s; " if "full" in res else "")
              + f"{res['time_windows']} windows on 1 / 2 workers {t['1']['wall']:.0f} / {t['2']['wall']:.0f} s."]
    lines += ["", res["cost_note"], ""]
    if pl:
        st = pl["steps"]
        lines += ["## RayPlanner, deadline always missed", "",
                  f"{len(st)} steps, deadline 0.02 s, grace 0.2 s, a {res['samples']}-sample window: result() raised "
                  f"{sum('raised' in x for x in st)} times; "
                  f"valid plan every step: **{all(x['valid'] for x in st)}**; fallbacks: actor's "
                  f"{sum(not x['driver_fallback'] for x in st)}, driver's {sum(x['driver_fallback'] for x in st)}; "
                  f"submit {max(x['submit_ms'] for x in st):.1f} ms at most, result() "
                  f"{np.nanmedian([x['result_ms'] for x in st]):.0f} ms median. Actors alive during the loop: "
                  f"{sorted({x['actors_alive'] for x in st})}; driver threads {sorted({x['driver_threads'] for x in st})}; "
                  f"actor threads {sorted({x['actor_threads'] for x in st})}. After close(): actors alive "
                  f"{pl['after_close']['actors_alive']}, driver threads {pl['after_close']['driver_threads']} "
                  f"(before the planner: {pl['after_close']['threads_before']}).", ""]
    lines += ["## Files", "", "`report.html` (the 2-worker run's report), `report_screenshot.png` (headless "
              "Chromium: `chromium --headless --no-sandbox --screenshot=report_screenshot.png "
              "--window-size=1200,4300 report.html`), `speedup.png`, `window_times.png`, `cost_model.png`, "
              "`replay_report.json` (everything above)."]
    return lines


def main(argv=None) -> int:
    ap = settings.parser(__doc__)
    ap.add_argument("--windows", type=int, default=200)
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--max-sweeps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--run-dir", type=Path, default=Path("/tmp/routepack-replay-run"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/routepack-replay-work"))
    ap.add_argument("--parts", default="gen,full,time,resume,overhead,planner")
    ap.add_argument("--time-windows", type=int, default=None,
                    help="windows (the first K) for 1 vs 2 workers (default: all)")
    ap.add_argument("--resume-windows", type=int, default=40, help="windows (the first K) for kill/resume")
    ap.add_argument("--render", action="store_true", help="rewrite the markdown and figures from the record")
    settings.add_out(ap, STUDY)
    args = ap.parse_args(argv)
    parts = set() if args.render else set(args.parts.split(","))
    out = settings.results_dir(STUDY, args.out)
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(settings.ROOT))
    common = ["--cost", PRESET, "--max-sweeps", args.max_sweeps, "--seed", args.seed]
    rec_path = out / "replay_report.json"
    res = json.loads(rec_path.read_text()) if rec_path.exists() else {}
    if not args.render:
        res.update(windows=args.windows, samples=args.samples, max_sweeps=args.max_sweeps)
    if "gen" in parts:
        res["gen_seconds"] = gen(args.run_dir, args.windows, args.samples, args.seed)
        print(f"generated {args.windows} windows in {res['gen_seconds']:.0f} s", file=sys.stderr)
    if parts & {"time", "resume"}:
        small = subset(args.run_dir, work, args.time_windows)
        res["time_windows"] = len(list(small.glob("*.npz")))
    if "full" in parts:
        res["full"] = full_run(args.run_dir, work, common, env)
        shutil.copy(work / "out_full" / "report.html", out / "report.html")
        shutil.copy(work / "out_full" / "steps.jsonl", out / "steps.jsonl")
        from routepack_opt.report_run import summarize

        res["summary"] = summarize(records(work / "out_full"))
    if "full" in parts or "notes" in parts:
        recs = records(work / "out_full")
        neg = [r for r in recs if r.get("saving") is not None and r["saving"] < 0]
        res["notes"] = {"negative": len(neg),
                        "negative_best_has_extra_rows": sum(r["baselines"][r["best_baseline"]]["extra_rows"] > 0
                                                            for r in neg),
                        "negative_mean_gap": float(np.mean([r["gap"] for r in neg])) if neg else None,
                        "mean_gap": float(np.mean([r["gap"] for r in recs if "gap" in r])),
                        "not_deterministic": sum(not r.get("deterministic", True) for r in recs),
                        "best": {k: sum(r.get("best_baseline") == k for r in recs)
                                 for k in sorted({r.get("best_baseline") for r in recs if r.get("best_baseline")})}}
    if "time" in parts:
        res["time"] = {str(k): v for k, v in time_runs(small, work, common, env).items()}
    if "resume" in parts:
        first = subset(args.run_dir, work, args.resume_windows)
        res["resume"] = resume_run(first, work, common, env, len(list(first.glob("*.npz"))))
    if "overhead" in parts:
        res["overhead"] = overhead(work)
    if "time" in res and "overhead" in res and not args.render:
        # the work per window: CPU seconds of the worker (single-threaded), not its wall time, which
        # the other jobs on this shared machine stretch
        src = res.get("full") or res["time"]["1"]
        times = [c for c in src["window_cpu"] if c == c]
        res["cost_model"] = {str(k): v for k, v in
                             cost_model(times, res["overhead"], res["overhead"]["ray_start"], [1, 2, 8, 64]).items()}
        res["cost_note"] = (f"At 64 workers the {len(times)} windows ({np.sum(times):.0f} s of work, "
                            f"longest {np.max(times):.1f} s; CPU seconds per window) would take about {res['cost_model']['64']:.1f} s: "
                            "Ray start and the slowest window dominate; the driver's serial cost "
                            f"({len(times)} × {1e3 * (res['overhead']['batch'] + res['overhead']['append_fsync']):.1f} ms) "
                            "is far below the work per worker, so scaling stays near-linear until W ≈ "
                            f"{np.sum(times) / max(np.max(times), 1e-9):.0f} (total work / longest window). "
                            "Per-worker warm-up (import + numba cache, ~2 s) is paid once per worker, in parallel.")
    if "planner" in parts:
        res["planner"] = planner_loop(args.run_dir)
    if not args.render:
        report.write_json(rec_path, res)
    if "time" in res and "overhead" in res and "summary" in res:
        figures(res, out)
        report.write_md(out / "replay_report.md", render(res))
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Hostile-input sweep, round 5 (issue 50, "Must show"): round 4's profile (tests/fuzz_support.py,
experiments/hostile_sweep_r4.py) extended with ≥ 500 new cases over the public API and the
surfaces added since round 4, all in-process, each under an alarm, classified into the issue's
outcome table:

- ``api``: every public target of ``fuzz_support.api_targets`` (routepack_opt.__all__, replay,
  integrations' rollout hook, models' decide_bins / bin packing, certify) × each argument × the
  fuzzer's hostile list (wrong types, bools, NaN/inf, huge and negative ints, empty and ragged
  containers, numpy scalars, a small array of every dtype);
- ``bp``: branch-and-price ``decide_bins`` against brute force on tiny instances, K from one
  below the optimum to two above it (slack bins: the empty pattern);
- ``rows``: row limits (``--max-rows`` below R*, ``--min-rows`` above ``--max-rows``,
  ``--row-multiple 3 --max-rows 5``, ``[rows] max_rows``, ``plan_micro_batches(max_micro_batches=…)``);
- ``json``: every ``--json`` command's stdout (file descriptor 1, so a solver banner counts) must
  be exactly one JSON object;
- ``writers``: outputs through symlinks onto inputs, FIFOs, devices (plan ``-o``, replay-report's
  ``report.html`` / ``summary.json`` / ``steps.jsonl``);
- ``lines``: replay-report resuming a ``steps.jsonl`` with lines no run writes (a window not in
  RUN_DIR, negative or huge makespans, float steps);
- ``overlap``: verl's ``overlap=True`` with the batch changed between ``_balance_batch`` and
  ``_update_actor`` (equal-length samples swapped, routes rewritten): the old plan must not be
  applied without a word;
- ``hook``: the rollout hook's installers and counts;
- ``limits``: ``--time-limit`` on inputs whose stages grow faster than linearly.

Outcome rows (the issue's table): ``clean exit 2``, ``clean InputError``, ``clean correct
result``, ``accepted-but-wrong``, ``wrong exception type``, ``accepted without a check``,
``--json not one object``, ``memory blow-up``, ``hang or far over limit``, ``over the limit``,
``data loss``, ``crash by signal``, plus round 4's ``exit 1 / traceback``, ``warning noise`` and
``temp file left``.

    PYTHONPATH=<tree> python3 experiments/hostile_sweep_r5.py [--out DIR] [--quick]

writes ``DIR/summary.md`` (the table, per group), ``DIR/summary.json`` and ``DIR/cases.jsonl``
(one line per case that is not clean) — default DIR experiments/results/hostile_sweep_r5/.
The API groups run with the address space capped (``RLIMIT_AS``, 12 GiB) so that a memory
blow-up is a MemoryError here, not the machine's OOM killer. A few minutes on a quiet machine.
"""

from __future__ import annotations

import collections
import contextlib
import io
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import fuzz_support as fs  # noqa: E402
import numpy as np  # noqa: E402

ROWS = ("clean exit 2", "clean InputError", "clean correct result", "accepted-but-wrong", "wrong exception type",
        "accepted without a check", "--json not one object", "memory blow-up", "hang or far over limit",
        "over the limit", "data loss", "crash by signal", "exit 1 / traceback", "warning noise", "temp file left")
BAD = ROWS[3:]


# --- running ------------------------------------------------------------------------------------
def run_cli(argv: list[str], timeout: float = 30.0) -> tuple[str, int | None, str, str]:
    """``routepack ARGV`` in-process with file descriptor 1 captured too (a C library's banner
    counts): (outcome as fs.run_cli, exit code, stderr, stdout)."""
    sys.stdout.flush()
    buf = io.StringIO()
    with tempfile.TemporaryFile() as cap:
        saved = os.dup(1)
        os.dup2(cap.fileno(), 1)
        try:
            with contextlib.redirect_stdout(buf):
                outcome, code, err = _cli_raw(argv, timeout)
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
        cap.seek(0)
        fd_out = cap.read().decode("utf-8", "replace")
    return outcome, code, err, fd_out + buf.getvalue()


def run_cli_json(argv: list[str], timeout: float = 30.0) -> tuple[str, str]:
    """A --json command: its stdout (Python's and fd 1's) must be one JSON object."""
    outcome, code, err, text = run_cli(argv, timeout)
    if outcome != "ok":
        return outcome, err
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return "json", f"stdout is not one JSON object: {text[:160]!r}"
    return ("ok" if isinstance(obj, dict) else "json"), ""


def _cli_raw(argv, timeout):
    """fs.run_cli without its own stdout capture (the caller holds it)."""
    import warnings

    from routepack_opt.cli import main

    err = io.StringIO()
    try:
        with fs.time_limit(timeout), contextlib.redirect_stderr(err), warnings.catch_warnings():
            warnings.simplefilter("default")
            code = main(argv)
    except fs.Hang:
        return "hang", None, err.getvalue()
    except BaseException as exc:  # noqa: BLE001
        return "traceback", None, f"{exc.__class__.__name__}: {exc}"
    # progress lines of a long command ("replay-report: 1/3 windows, ...") and its "note:" lines
    # (replay-report: a steps.jsonl line it ignored, and why) are its own output, not noise
    lines = [x for x in err.getvalue().splitlines()
             if x.strip() and not x.startswith(("replay-report: ", "note: "))]
    if code == 0:
        return ("ok" if not lines else "noise"), code, err.getvalue()
    if code == 2:
        return ("clean2" if len(lines) == 1 and lines[0].startswith("error: ") else "noise"), code, err.getvalue()
    return ("exit1" if code == 1 else "traceback"), code, err.getvalue()


def row_of(group: str, outcome: str, detail: str = "") -> str:
    """The issue's table row of an outcome."""
    if outcome == "clean2":
        return "clean InputError" if group in ("api", "bp", "hook") else "clean exit 2"
    if outcome == "ok":
        return "clean correct result"
    if outcome == "wrong":
        return "accepted without a check" if "outside the argument's kind" in detail else "accepted-but-wrong"
    if outcome == "traceback":
        return "wrong exception type" if group in ("api", "bp", "hook", "overlap") else "exit 1 / traceback"
    return {"exit1": "exit 1 / traceback", "json": "--json not one object", "memory": "memory blow-up",
            "hang": "hang or far over limit", "over": "over the limit", "changed": "data loss",
            "signal": "crash by signal", "noise": "warning noise", "leftover": "temp file left"}[outcome]


# --- groups -------------------------------------------------------------------------------------
def g_api(tmp: Path, record, quick: bool) -> None:
    targets = [t for t in fs.api_targets(tmp) if t is not None]
    values = fs.hostile_values()
    for t in targets:
        vals = values if t.cheap else [v for v in values if v[0] in (
            "None", "True", "-1", "0", "2.5", "nan", "inf", "2**64+3", "'bogus'", "ragged", "array[f8]", "array[O]")]
        if quick:
            vals = vals[::4]
        for arg in t.kinds:
            for label, value in vals:
                outcome, detail = fs.run_target(t, arg, value, timeout=30)
                record("api", f"api/{t.name}/{arg}={label}", outcome, detail)


def g_bp(tmp: Path, record, quick: bool) -> None:
    from routepack_opt.models.branch_price import decide_bins
    for w, b, C, K, opt in fs.tiny_bin_decisions(np.random.default_rng(50), 25 if quick else 120, 16, 4):
        name = f"bp/w={w.tolist()} b={b.tolist()} C={C} K={K}"

        def call(w=w, b=b, C=C, K=K, opt=opt):
            res = decide_bins(w, b, C, K, time_limit=5.0)
            want = "feasible" if opt <= K else "infeasible"
            if res.status != want:
                raise AssertionError(f"{res.status}, brute force says {want}")
            if res.bins is not None:
                A = np.array(res.bins)
                if len(A) > K or (A.sum(axis=0) != b).any() or (A @ w > C).any():
                    raise AssertionError("not a packing")
        outcome, detail = _api(call)
        record("bp", name, outcome, detail)


def _api(fn, timeout: float = 30.0) -> tuple[str, str]:
    """fs.run_api with a failed check as accepted-but-wrong and a MemoryError as a blow-up."""
    try:
        with fs.time_limit(timeout):
            outcome, detail = fs.run_api(fn, timeout)
    except fs.Hang:
        return "hang", ""
    if outcome == "traceback" and detail.startswith("AssertionError"):
        return "wrong", detail
    if outcome == "traceback" and detail.startswith("MemoryError"):
        return "memory", detail
    return outcome, detail


def _plan_rows(path: Path) -> int | None:
    try:
        return int(json.loads(path.read_text())["rows"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def g_rows(files, tmp: Path, record, quick: bool) -> None:
    from routepack_opt import api

    w = str(files["window"])
    topo = ["--dp", "2", "--ep", "2", "--capacity", "256"]  # R* = 3 or more on the good window
    cases = [("--max-rows 1", ["--max-rows", "1"], dict(hi=1)),
             ("--max-rows 2", ["--max-rows", "2"], dict(hi=2)),
             ("--min-rows 6 --max-rows 4", ["--min-rows", "6", "--max-rows", "4"], dict(lo=6, hi=4)),
             ("--row-multiple 3 --max-rows 5", ["--row-multiple", "3", "--max-rows", "5"], dict(hi=5, mult=3)),
             ("--row-multiple 2 --max-rows 7", ["--row-multiple", "2", "--max-rows", "7"], dict(hi=7, mult=2)),
             ("--rows 1", ["--rows", "1"], dict(hi=1, lo=1)),
             ("--rows 9 --max-rows 4", ["--rows", "9", "--max-rows", "4"], dict(hi=4)),
             ("--min-rows 8", ["--min-rows", "8"], dict(lo=8)),
             ("--max-rows 0", ["--max-rows", "0"], dict(hi=0)),
             ("--max-rows -1", ["--max-rows", "-1"], dict(hi=-1)),
             ("--max-rows 2.5", ["--max-rows", "2.5"], dict(hi=2)),
             ("--max-rows 99999999999", ["--max-rows", "99999999999"], dict(hi=99999999999))]
    cfg_rows = tmp / "rows_cfg.toml"
    cfg_rows.write_text("[rows]\nmax_rows = 1\n")
    cases.append(("[rows] max_rows = 1", ["--config", str(cfg_rows)], dict(hi=1)))
    for k, (label, extra, lim) in enumerate(cases):
        out = tmp / f"rows{k}.json"
        outcome, code, err, _ = run_cli(["plan", w, *topo, "--cost", fs.COST, "--max-sweeps", "2", "-o", str(out),
                                         *extra])
        if outcome == "ok":
            R = _plan_rows(out)
            if R is None or R > lim.get("hi", R) or R < lim.get("lo", R) or R % lim.get("mult", 1):
                outcome, err = "wrong", f"planned {R} rows for {label}"
        record("rows", f"rows/plan {label}", outcome, err)
        topo_extra = [x for i, x in enumerate(extra) if extra[i - (i % 2)] in ("--min-rows", "--row-multiple")]
        if topo_extra:  # certify takes the topology's row rules, not the search's maximum
            outcome, code, err, _ = run_cli(["certify", w, *topo, *topo_extra, "--time-limit", "2"])
            record("rows", f"rows/certify {' '.join(topo_extra)}", outcome, err)
    lengths, counts, _ = fs._window_arrays(0)
    for mmb in (1, 2, 0, -1, 2.5, True):
        def call(m=mmb):
            mb = api.plan_micro_batches(lengths, counts, dp_size=2, ep_size=2, max_tokens=256, cost=fs.COST,
                                        max_sweeps=2, max_micro_batches=m)
            if mb.plan.rows > m:
                raise AssertionError(f"planned {mb.plan.rows} rows with max_micro_batches={m}")
        outcome, detail = _api(call)
        record("rows", f"rows/plan_micro_batches max_micro_batches={mmb!r}", outcome, detail)


def g_json(files, tmp: Path, record, quick: bool) -> None:
    w, p = str(files["window"]), str(files["plan"])
    t = fs.TOPO
    cmds = {
        "certify": ["certify", w, *t, "--time-limit", "2", "--json"],
        "certify arcflow": ["certify", w, *t, "--time-limit", "2", "--method", "arcflow", "--json"],
        "certify cpsat": ["certify", w, "--dp", "2", "--ep", "2", "--capacity", "256", "--method", "cpsat",
                          "--time-limit", "2", "--json"],
        "certify tight": ["certify", w, "--dp", "2", "--ep", "2", "--capacity", "210", "--time-limit", "2", "--json"],
        "stats": ["stats", w, "--json"],
        "evaluate": ["evaluate", w, p, "--cost", fs.COST, "--json"],
        "plan": ["plan", w, *t, "--cost", fs.COST, "--max-sweeps", "2", "--json", "-o", str(tmp / "j_plan.json")],
        "compare": ["compare", w, *t, "--cost", fs.COST, "--time-limit", "2", "--json"],
        "exact": ["exact", w, "--dp", "2", "--ep", "2", "--capacity", "1024", "--cost", fs.COST, "--time-limit", "2",
                  "--json"],
        "exact highs": ["exact", w, "--dp", "2", "--ep", "2", "--capacity", "1024", "--cost", fs.COST,
                        "--solver", "highs", "--time-limit", "2", "--json"],
        "certify bad window": ["certify", str(tmp), *t, "--json"],
    }
    # a window whose R* needs column generation (HiGHS' LP) and the exact models: sizes near C/3
    from routepack_opt.core.window import Window, save_window

    rng = np.random.default_rng(3)
    sizes = rng.integers(251, 500, 60)
    hard = tmp / "j_hard.npz"
    save_window(Window(sizes, sizes[:, None, None], top_k=1), hard)
    for method in ("auto", "arcflow", "cpsat"):
        cmds[f"certify colgen {method}"] = ["certify", str(hard), "--dp", "1", "--ep", "1", "--capacity", "1000",
                                            "--method", method, "--time-limit", "3", "--json"]
    for label, argv in cmds.items():
        outcome, detail = run_cli_json(argv, timeout=60)
        record("json", f"json/{label}", outcome, detail)


def _same(a: Path, digest: str | None) -> bool:
    return fs._digest(a) == digest


def g_writers(files, tmp: Path, record, quick: bool) -> None:
    w = files["window"]
    t = fs.TOPO
    k = 0
    for kind in ("symlink-to-input", "symlink-to-other", "fifo", "devnull-link", "dangling", "hardlink-to-input",
                 "dir"):
        k += 1
        d = tmp / f"wr{k}"
        d.mkdir()
        win = d / "w.npz"
        win.write_bytes(w.read_bytes())
        other = d / "other.txt"
        other.write_text("keep me\n")
        out = d / "plan.json"
        if kind == "symlink-to-input":
            out.symlink_to(win)
        elif kind == "symlink-to-other":
            out.symlink_to(other)
        elif kind == "fifo":
            os.mkfifo(out)
        elif kind == "devnull-link":
            out.symlink_to("/dev/null")
        elif kind == "dangling":
            out.symlink_to(d / "missing.json")
        elif kind == "hardlink-to-input":
            os.link(win, out)
        else:
            out.mkdir()
        before = {n: fs._digest(d / n) for n in ("w.npz", "other.txt")}
        outcome, code, err, _ = run_cli(["plan", str(win), *t, "--cost", fs.COST, "--max-sweeps", "1", "-o", str(out)],
                                        timeout=20)
        if any(not _same(d / n, h) for n, h in before.items()):
            outcome, err = "changed", "an input or another file changed"
        elif outcome == "ok" and kind not in ("dangling",):
            outcome, err = "wrong", f"wrote through {kind}"
        record("writers", f"writers/plan -o {kind}", outcome, err)
    # replay-report: OUT_DIR/report.html, summary.json, steps.jsonl as links into RUN_DIR
    for name in ("report.html", "summary.json", "steps.jsonl", "run.json"):
        for kind in ("symlink-to-window", "fifo"):
            k += 1
            d = tmp / f"rr{k}"
            run, out = d / "run", d / "out"
            run.mkdir(parents=True)
            out.mkdir()
            (run / "step_0.npz").write_bytes(w.read_bytes())
            target = out / name
            if kind == "fifo":
                os.mkfifo(target)
            else:
                target.symlink_to(run / "step_0.npz")
            before = fs._digest(run / "step_0.npz")
            outcome, code, err, _ = run_cli(["replay-report", str(run), "-o", str(out), *t, "--cost", fs.COST,
                                             "--max-sweeps", "1", "--time-limit", "1"], timeout=25)
            if not _same(run / "step_0.npz", before):
                outcome, err = "changed", "the window in RUN_DIR changed"
            elif outcome == "ok":
                outcome, err = "wrong", f"{name} as a {kind} was written through"
            if fs.leftovers(out):
                outcome = "leftover"
            if "-v" in sys.argv:
                print(f"  writers/replay-report {name} {kind}: {outcome}: {err.strip().splitlines()[-1:]}")
            record("writers", f"writers/replay-report {name} {kind}", outcome, err)


def _report_dir(files, tmp: Path, k: int) -> tuple[Path, Path]:
    run, out = tmp / f"ln{k}" / "run", tmp / f"ln{k}" / "out"
    run.mkdir(parents=True)
    for i in range(3):
        (run / f"step_{i}.npz").write_bytes(files["window"].read_bytes())
    return run, out


def g_lines(files, tmp: Path, record, quick: bool) -> None:
    """A first run writes its steps.jsonl; a hostile line is appended; the resumed run must not count it."""
    t = [*fs.TOPO, "--cost", fs.COST, "--max-sweeps", "1", "--time-limit", "1"]
    run0, out0 = _report_dir(files, tmp, 0)
    outcome, code, err, _ = run_cli(["replay-report", str(run0), "-o", str(out0), *t], timeout=120)
    if outcome != "ok":
        print(f"lines: the first run failed: {err[:300]}")
        record("lines", "lines/first run", outcome, err)
        return
    lines = (out0 / "steps.jsonl").read_text().splitlines()
    good = json.loads(lines[0])
    summary0 = json.loads((out0 / "summary.json").read_text())
    hostile = {
        "ghost window": {**good, "window": "ghost.npz"},
        "window ../../etc/passwd": {**good, "window": "../../etc/passwd"},
        "makespan -5": {**good, "makespan": -5.0},
        "makespan -1.7e308": {**good, "makespan": -1.7e308},
        "saving 1e300": {**good, "saving": 1e300},
        "step 2**70": {**good, "step": 2**70},
        "rows 2**40": {**good, "rows": 2**40},
        "gap -1": {**good, "gap": -1.0},
        "lower_bound 1e300": {**good, "lower_bound": 1e300},
        "duplicate window": dict(good),
    }
    for k, (label, line) in enumerate(hostile.items(), start=1):
        run, out = _report_dir(files, tmp, k)
        out.mkdir(parents=True)
        for n in ("run.json", "steps.jsonl"):
            (out / n).write_bytes((out0 / n).read_bytes())
        with open(out / "steps.jsonl", "a") as fh:
            fh.write(json.dumps(line) + "\n")
        outcome, code, err, _ = run_cli(["replay-report", str(run), "-o", str(out), *t], timeout=120)
        if outcome == "ok":
            try:
                summary = json.loads((out / "summary.json").read_text())
                html = (out / "report.html").read_text()
            except (OSError, ValueError):
                summary, html = {}, ""
            # the resumed run plans nothing (every window is in steps.jsonl): the summary is the lines'
            keys = ("windows", "ok", "failed", "mean_saving", "median_saving", "rows_saved", "seconds_saved",
                    "planning_seconds", "net_seconds_saved")
            changed = {k2: (summary0.get(k2), summary.get(k2)) for k2 in keys if summary.get(k2) != summary0.get(k2)}
            if changed or "ghost" in html or "passwd" in html:
                outcome, err = "wrong", f"the line changed the report: {changed}"[:300]
            elif "note: " not in err and label != "duplicate window":
                # ignored, but with a note that says so (issue 50, item 8); a window's line written
                # again (a retried window) is a line a run writes: the newest counts, no note
                outcome, err = "wrong", "the line was ignored without a note"
        record("lines", f"lines/{label}", outcome, err)
    # "seed": 0.0 in run.json resumes a run of seed 0
    run, out = _report_dir(files, tmp, 99)
    out.mkdir(parents=True)
    cfg = json.loads((out0 / "run.json").read_text())
    if "seed" in cfg:
        cfg["seed"] = 0.0
    (out / "run.json").write_text(json.dumps(cfg))
    (out / "steps.jsonl").write_bytes((out0 / "steps.jsonl").read_bytes())
    outcome, code, err, _ = run_cli(["replay-report", str(run), "-o", str(out), *t], timeout=120)
    if outcome == "ok":
        outcome, err = "wrong", "run.json with seed 0.0 resumed"
    record("lines", "lines/run.json seed 0.0", outcome, err)


def g_overlap(tmp: Path, record, quick: bool) -> None:
    sys.path.insert(0, str(ROOT / "tests" / "integrations"))
    try:
        from test_verl_trainer_hook import _batch, _classes, _trainer  # verl's real RayPPOTrainer

        from routepack_opt.integrations import verl as rp_verl
    except Exception as exc:  # noqa: BLE001 - verl not installed: the group is skipped
        print(f"overlap: skipped ({exc.__class__.__name__}: {exc})")
        return

    def mutate_swap_equal(data, lens):
        order = data.non_tensor_batch["uid"]
        same = [(a, b) for a in range(len(lens)) for b in range(a + 1, len(lens)) if lens[a] == lens[b]]
        a, b = same[0]
        for key in data.batch.keys():
            v = data.batch[key].clone()
            v[[a, b]] = v[[b, a]]
            data.batch[key] = v
        order[[a, b]] = order[[b, a]]

    def mutate_routes(data, lens):
        if "routed_experts" in data.batch.keys():
            r = data.batch["routed_experts"].clone()
            r[0] = r[0].flip(-1).roll(1, dims=-1)
            data.batch["routed_experts"] = r

    def mutate_mask(data, lens):
        m = data.batch["attention_mask"].clone()
        m[0, : max(1, int(m[0].sum()) // 2)] = 0
        data.batch["attention_mask"] = m

    cases = {"swap equal-length samples": mutate_swap_equal, "rewrite routed_experts": mutate_routes,
             "change a mask length": mutate_mask, "nothing changed": None}
    for label, mutate in cases.items():
        def call(mutate=mutate):
            lens = [64, 64, 96, 96, 128, 128, 160, 160] * 2
            Tr, _ = _classes(max_token_len=1000, num_experts=8, ep_size=2, max_sweeps=3, time_limit=None,
                             overlap=True)
            t = _trainer(Tr, mini=8)
            data = _batch(lens)
            metrics: dict = {}
            t._balance_batch(data, metrics)
            if mutate is not None:
                mutate(data, lens)
            rp_verl.pop_records()
            t._update_actor(data)
            recs = rp_verl.pop_records()
            # "records why" (issue 50, item 7): a record on the quick path or with a fallback, or
            # a metric naming the change (the warning alone is logged once per process)
            words = ("changed", "stale", "mismatch", "fingerprint", "replan", "re-plan")
            said = any(getattr(r, "quick", None) or getattr(r, "fallback", None) for r in recs) or \
                any(any(wd in str(k).lower() for wd in words) for k in metrics)
            if mutate is not None and not said:
                raise AssertionError(f"the old plan was applied without a word after '{label}'")
        outcome, detail = _api(call, timeout=60)
        record("overlap", f"overlap/{label}", outcome, detail)


def g_hook(tmp: Path, record, quick: bool) -> None:
    from routepack_opt.integrations import rollout_hook as hook

    class Worker:
        async def _agent_loop_postprocess(self, *a, **k):
            return None

    class Sample:
        rollout_routed_experts = np.zeros((3, 2, 2), dtype=np.int64)
        metadata = None

    for label, fn in (
        ("install num_experts=0", lambda: hook.install_verl_agent_loop_counts(type("W", (Worker,), {}), 0)),
        ("install num_experts=2.5", lambda: hook.install_verl_agent_loop_counts(type("W", (Worker,), {}), 2.5)),
        ("install num_experts='8'", lambda: hook.install_verl_agent_loop_counts(type("W", (Worker,), {}), "8")),
        ("install key=3", lambda: hook.install_verl_agent_loop_counts(type("W", (Worker,), {}), 8, key=3)),
        ("install freq=0", lambda: hook.install_verl_agent_loop_counts(type("W", (Worker,), {}), 8, moe_layer_freq=0)),
        ("install on object", lambda: hook.install_verl_agent_loop_counts(object, 8)),
        ("slime sample num_experts=-1", lambda: hook.slime_sample_counts(Sample(), -1)),
        ("slime sample duplicate ids", lambda: hook.slime_sample_counts(Sample(), 4)),
        ("counts_from_non_tensor key=None", lambda: hook.counts_from_non_tensor({}, None)),
        ("counts_from_non_tensor ragged", lambda: hook.counts_from_non_tensor(
            {hook.COUNTS_KEY: np.array([np.zeros((2, 2), int), np.zeros((3, 2), int)], dtype=object)})),
        ("counts_from_non_tensor negative", lambda: hook.counts_from_non_tensor(
            {hook.COUNTS_KEY: [np.array([[-1, 2]])]})),
        ("window_from_counts N mismatch", lambda: hook.window_from_counts([np.array([[2, 0]])], [2, 2])),
    ):
        outcome, detail = _api(fn)
        if outcome == "ok":
            outcome, detail = "wrong", "accepted a value outside the argument's kind"
        record("hook", f"hook/{label}", outcome, detail)


def g_limits(tmp: Path, record, quick: bool) -> None:
    """--time-limit on inputs that grow faster than linearly: wall within max(0.25 s, 5 %) of the
    limit (plus the process's fixed start), far over at 3× (the alarm at 3× + 5 s)."""
    from routepack_opt.core.window import Window, save_window

    rng = np.random.default_rng(7)
    cases = []
    n = 20_000 if quick else 200_000
    lengths = rng.integers(1, 2**23, n)
    w = Window(lengths, lengths[:, None, None] * np.array([[[1, 0]]]) + np.array([[[0, 0]]]), top_k=1)
    big = tmp / "big.npz"
    save_window(w, big)
    cases.append(("certify 2e5 at C=2^23", ["certify", str(big), "--dp", "8", "--ep", "1", "--capacity", str(2**23)]))
    cases.append(("plan 2e5 at C=2^23", ["plan", str(big), "--dp", "8", "--ep", "1", "--capacity", str(2**23),
                                         "--cost", fs.COST, "-o", str(tmp / "big_plan.json")]))
    for label, argv in cases:
        limit = 1.0
        t0 = time.perf_counter()
        outcome, code, err, _ = run_cli([*argv, "--time-limit", str(limit)], timeout=3 * limit + 5)
        wall = time.perf_counter() - t0
        if outcome == "hang" or wall > 3 * limit + 2:
            outcome = "hang"
        elif outcome in ("ok", "clean2") and wall > limit + max(0.25, 0.05 * limit) + 1.0:
            outcome = "over"
        record("limits", f"limits/{label} --time-limit 1 ({wall:.1f} s)", outcome, err)


def main() -> None:
    args = sys.argv[1:]
    quick = "--quick" in args
    out_dir = Path(args[args.index("--out") + 1]) if "--out" in args else ROOT / "experiments/results/hostile_sweep_r5"
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = min(12 << 30, hard) if hard != resource.RLIM_INFINITY else 12 << 30
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    bad = []

    def record(group, name, outcome, detail):
        row = row_of(group, outcome, str(detail))
        counts[group][row] += 1
        counts["all"][row] += 1
        if row in BAD:
            bad.append({"case": name, "row": row, "detail": str(detail)[:400]})
            print(f"{row}: {name}: {str(detail)[:200]}", flush=True)

    t0 = time.perf_counter()
    times = {}
    # json first: HiGHS prints its banner once per process, at its first construction
    groups = ["json", "api", "bp", "rows", "writers", "lines", "overlap", "hook", "limits"]
    only = [g for g in groups if f"--{g}" in args] or groups
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        files = fs.good_files(tmp / "good")
        run = {"api": lambda: g_api(tmp, record, quick), "bp": lambda: g_bp(tmp, record, quick),
               "rows": lambda: g_rows(files, tmp, record, quick), "json": lambda: g_json(files, tmp, record, quick),
               "writers": lambda: g_writers(files, tmp, record, quick),
               "lines": lambda: g_lines(files, tmp, record, quick), "overlap": lambda: g_overlap(tmp, record, quick),
               "hook": lambda: g_hook(tmp, record, quick), "limits": lambda: g_limits(tmp, record, quick)}
        for g in only:
            t1 = time.perf_counter()
            # the API's cases run under an address-space cap, so that a size that allocates
            # without a guard is a MemoryError here, not the machine's OOM killer (the CLI groups
            # run without: Ray and the report's plots reserve more address space than they use)
            resource.setrlimit(resource.RLIMIT_AS, (cap if g in ("api", "bp", "hook") else soft, hard))
            try:
                run[g]()
            finally:
                resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
            times[g] = round(time.perf_counter() - t1, 1)
            print(f"{g}: {sum(counts[g].values())} cases, {times[g]} s", flush=True)
    total = sum(counts["all"].values())
    summary = {"cases": total, "wall_s": round(time.perf_counter() - t0, 1), "wall_s_per_group": times,
               "quick": quick, "rows": {g: {r: counts[g][r] for r in ROWS} for g in ["all", *only]}}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out_dir / "cases.jsonl").write_text("".join(json.dumps(b) + "\n" for b in bad))
    head = "| outcome | all | " + " | ".join(only) + " |\n|---|" + "---|" * (len(only) + 1) + "\n"
    body = "".join(f"| {r} | {counts['all'][r]} | " + " | ".join(str(counts[g][r]) for g in only) + " |\n"
                   for r in ROWS)
    (out_dir / "summary.md").write_text(
        f"# Hostile sweep, round 5 (issue 50)\n\n{total} cases in {summary['wall_s']} s "
        f"({'quick profile, ' if quick else ''}groups: {', '.join(f'{g} {times[g]} s' for g in only)}). "
        "Rows 4 and below are findings; each is listed in cases.jsonl.\n\n" + head + body)
    print((out_dir / "summary.md").read_text())


if __name__ == "__main__":
    main()

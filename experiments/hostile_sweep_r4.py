"""Hostile-input sweep, round 4 (issue 39): the fuzzer's long profile plus targeted cases, all
in-process (the CLI's ``main``, the API), each under a timeout, classified by
tests/fuzz_support.py:

- ``fuzz``: every reader (window .npz, plan JSON ± replicas, cost/config TOML, routes .npz / .npy /
  .pt / .safetensors, lengths .npy, steps.jsonl, run.json) × every mutation × ``--seeds`` seeds;
- ``special``: every file argument of every command (plan's window, --cost, --config,
  --placement, --placement-from; compare, certify, exact, evaluate, import-replay, replay-report's
  RUN_DIR, -o, --cost, --config) given a FIFO, a directory, a socket, /dev/zero, a symlink loop, a
  dangling link, a 300-byte name or a non-UTF-8 name — refused before any work;
- ``api``: the environment (``ROUTEPACK_COST`` / ``ROUTEPACK_TIME_LIMIT`` / ``ROUTEPACK_THREADS``),
  ``cost=`` / ``params`` / ``load_plan`` / ``solve`` / ``import_replay`` / ``plan_micro_batches`` /
  ``AsyncPlanner.submit`` arguments of the wrong type or range;
- ``schema``: replicated plans and resume state of the wrong shape (values not in the issue).

Outcomes: ``clean2`` (exit 2, one ``error:`` line / an InputError), ``ok`` (a clean result, where
a result is right), ``exit1``, ``traceback``, ``hang``, ``wrong`` (accepted but wrong: a case that
must be refused returned), ``leftover`` (a temporary file), ``changed`` (an input or an old output
changed: data loss), ``noise`` (more than the one line on stderr: warnings).

    PYTHONPATH=<tree> python3 experiments/hostile_sweep_r4.py [--seeds 4] [--out DIR]

writes ``DIR/summary.json`` (counts per outcome and per group) and ``DIR/cases.jsonl`` (one line
per case that is not clean) — default DIR experiments/results/hostile_sweep/.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import fuzz_support as fs  # noqa: E402
import numpy as np  # noqa: E402

from routepack_opt.core.errors import InputError  # noqa: E402

OUTCOMES = ("clean2", "ok", "exit1", "traceback", "hang", "wrong", "leftover", "changed", "noise")
SPECIALS = ("fifo", "dir", "socket", "devzero", "loop", "dangling", "long_name", "nonutf8_name")


def fuzz_cases(files, seeds: int):
    for case in fs.reader_cases(files):
        for kind in fs.mutations_for(case[0]):
            for seed in range(seeds):
                yield f"fuzz/{case[0]}/{kind}/{seed}", case, kind, seed


def run_fuzz(files, seeds, tmp: Path, record):
    for k, (name, case, kind, seed) in enumerate(fuzz_cases(files, seeds)):
        work = tmp / f"f{k}"
        work.mkdir()
        outcome, detail = fs.one_case(case, kind, seed, work)
        record("fuzz", name, outcome, detail)


def special_cases(files):
    """(name, argv template with {P} for the special path, good file it replaces): every file
    argument of the commands."""
    w, p, c, cfg = (str(files[k]) for k in ("window", "plan", "cost", "config"))
    t = fs.TOPO
    return [
        ("plan/window", ["plan", "{P}", *t, "--cost", fs.COST, "-o", "{O}"], files["window"]),
        ("plan/--cost", ["plan", w, *t, "--cost", "{P}", "-o", "{O}"], files["cost"]),
        ("plan/--config", ["plan", w, *t, "--cost", fs.COST, "--config", "{P}", "-o", "{O}"], files["config"]),
        ("plan/--placement", ["plan", w, *t, "--cost", fs.COST, "--placement", "{P}", "-o", "{O}"], files["plan"]),
        ("plan/--placement-from", ["plan", w, *t, "--cost", fs.COST, "--placement-from", "{P}", "-o", "{O}"],
         files["plan"]),
        ("compare/window", ["compare", "{P}", *t, "--cost", fs.COST], files["window"]),
        ("certify/window", ["certify", "{P}", *t], files["window"]),
        ("exact/window", ["exact", "{P}", *t, "--cost", fs.COST], files["window"]),
        ("evaluate/plan", ["evaluate", w, "{P}", "--cost", fs.COST], files["plan"]),
        ("evaluate/--cost", ["evaluate", w, p, "--cost", "{P}"], files["cost"]),
        ("stats/window", ["stats", "{P}"], files["window"]),
        ("import-replay/routes", ["import-replay", "{P}", "--num-experts", str(fs.E), "-o", "{O}"],
         files["routes_npz"]),
        ("import-replay/--lengths", ["import-replay", str(files["routes_npy"]), "--num-experts", str(fs.E),
                                     "--lengths", "{P}", "-o", "{O}"], files["lengths"]),
        ("replay-report/RUN_DIR", ["replay-report", "{P}", "-o", "{O}.d", *t, "--cost", fs.COST], None),
        ("replay-report/--cost", ["replay-report", "{R}", "-o", "{O}.d", *t, "--cost", "{P}"], files["cost"]),
        ("replay-report/--config", ["replay-report", "{R}", "-o", "{O}.d", *t, "--cost", fs.COST, "--config", "{P}"],
         files["config"]),
        ("gen-trace/-o", ["gen-trace", "--preset", fs.COST, "--samples", "8", "--layers", "2", "--experts", "8",
                          "-o", "{P}"], None),
    ] + [(f"unused/{k}", None, None) for k in ()]  # (keeps the list's type)


def run_special(files, tmp: Path, record):
    run_dir = tmp / "rundir"
    run_dir.mkdir()
    (run_dir / "step_0.npz").write_bytes(files["window"].read_bytes())
    k = 0
    for name, argv, good in special_cases(files):
        if argv is None:
            continue
        for kind in SPECIALS:
            k += 1
            work = tmp / f"s{k}"
            work.mkdir()
            src = good if good is not None else files["window"]
            path = fs.mutate(src, work, kind, k)
            out = work / "out.npz"
            out.write_bytes(b"old output\n")
            before = fs.snapshot(work)
            args = [a.replace("{P}", str(path)).replace("{O}", str(out)).replace("{R}", str(run_dir)) for a in argv]
            if kind == "nonutf8_name" and name.startswith(("plan/", "compare/", "certify/", "exact/", "replay-report/")):
                continue  # a good file under an odd name: the command would plan it (import-replay, stats check names)
            outcome, code, err = fs.run_cli(args, timeout=30)
            after = fs.snapshot(work)
            if outcome == "ok" and kind not in ("dangling", "nonutf8_name") and name != "gen-trace/-o":
                outcome = "wrong"  # a special input must be refused (a non-UTF-8 name is a fine name)
            is_output = name == "gen-trace/-o"  # the special path is the output: written on success
            if any(after.get(n) != h for n, h in before.items() if h is not None and n != "out.npz"
                   and not (is_output and outcome == "ok")) or \
                    (outcome != "ok" and after.get("out.npz") != before.get("out.npz")):
                outcome = "changed"
            if fs.leftovers(work):
                outcome = "leftover"
            record("special", f"special/{name}/{kind}", outcome, err)
            if kind == "noperm":
                os.chmod(path, 0o644)


def _window_args():
    lengths, counts, routes = fs._window_arrays(1)
    return lengths, counts, routes


def api_cases(files, tmp: Path):
    """(name, callable, must_refuse)."""
    from routepack_opt import api
    from routepack_opt.core.cost import resolve_cost
    from routepack_opt.core.plan import load_plan
    from routepack_opt.core.topology import Topology
    from routepack_opt.core.window import Window
    from routepack_opt.integrations._seam import seam_settings
    from routepack_opt.integrations.replay import import_replay
    from routepack_opt.params import PlannerParams
    from routepack_opt.pipeline import solve

    lengths, counts, routes = _window_args()
    opts = dict(dp_size=2, ep_size=2, max_tokens=1024, cost=fs.COST, max_sweeps=1)
    special = {}
    for kind in SPECIALS:
        d = tmp / f"api_{kind}"
        d.mkdir()
        special[kind] = fs.mutate(files["cost"], d, kind, 1)
    out = []

    def env(var, value, seam="verl"):
        def call():
            old = os.environ.get(var)
            os.environ[var] = value
            try:
                seam_settings(seam)
            finally:
                if old is None:
                    os.environ.pop(var, None)
                else:
                    os.environ[var] = old
        return call

    for kind, path in special.items():
        out.append((f"api/env ROUTEPACK_COST={kind}", env("ROUTEPACK_COST", str(path)), kind != "nonutf8_name"))
        out.append((f"api/cost={kind}", lambda p=path: resolve_cost(str(p)), kind != "nonutf8_name"))
        out.append((f"api/plan_micro_batches cost={kind}",
                    lambda p=path: api.PlanOptions.of({**opts, "cost": str(p)}), kind != "nonutf8_name"))
        out.append((f"api/PlannerParams.from_toml {kind}", lambda p=path: PlannerParams.from_toml(p), True))
        out.append((f"api/load_plan {kind}", lambda p=path: load_plan(p), True))
        out.append((f"api/import_replay {kind}", lambda p=path: import_replay(str(p), num_experts=8), True))
    for value in ("nan", "-inf", "+inf", "INF", "1e999", "-1", "0", "abc", "1e-400", "2**10", "∞", "0x10"):
        out.append((f"api/env ROUTEPACK_TIME_LIMIT={value}", env("ROUTEPACK_TIME_LIMIT", value), True))
    for value in ("0", "-2", "1.5", "99999999999999999999", "two", "nan"):
        out.append((f"api/env ROUTEPACK_THREADS={value}", env("ROUTEPACK_THREADS", value), True))
    for value in ("max_sum", "MAXSUM", "", "sum-max;"):
        out.append((f"api/env ROUTEPACK_OBJECTIVE={value!r}", env("ROUTEPACK_OBJECTIVE", value), value != ""))
    for ns in (-5, 2**40, 1.5, True, "3", np.int64(-1), np.uint64(2**63), float("nan"), None.__class__):
        out.append((f"api/load_plan num_samples={ns!r}", lambda n=ns: load_plan(files["plan"], num_samples=n), True))
    w = Window(lengths, counts, top_k=fs.K)
    topo = Topology(dp=2, ep=2, capacity=1024)
    cost = resolve_cost(fs.COST)
    for label, args in (("window=counts", (counts, topo, cost)), ("topology=dict", (w, {"dp": 2}, cost)),
                        ("cost=str", (w, topo, fs.COST)), ("cost=None", (w, topo, None)),
                        ("window=str", ("w.npz", topo, cost)), ("topology=None", (w, None, cost))):
        out.append((f"api/solve {label}", lambda a=args: solve(*a, max_sweeps=1), True))
    bad_opts = [dict(dp_size=0), dict(dp_size=2**62), dict(max_tokens=-1), dict(max_tokens=1.5),
                dict(seed=-1), dict(seed=2.0), dict(time_limit=float("inf")), dict(time_limit=0),
                dict(max_sweeps=0), dict(num_micro_batches=10**9), dict(redundant_experts=-2),
                dict(redundant_experts=9), dict(redundant_experts=2, max_replica_bytes=-1.0),
                dict(redundant_experts=2, max_replica_bytes=float("nan")), dict(pp_multiple=0),
                dict(placement=np.zeros((3, 3))), dict(placement="best"), dict(current_placement=np.eye(2)),
                dict(objective="min"), dict(params={"anneal": {}}), dict(cost=3), dict(cost=b"olmoe-1b-7b"),
                dict(unknown_option=1), dict(min_micro_batches=10**6), dict(redundant_experts=True),
                dict(equal_samples_per_slot="yes")]
    for bad in bad_opts:
        o = {**opts, **bad}
        out.append((f"api/plan_micro_batches {bad!r:.60}", lambda o=o: api.plan_micro_batches(lengths, counts, **o), True))

        def submit(o=o):
            planner = api.AsyncPlanner(warm=False)
            try:
                planner.submit(lengths, counts, deadline=5.0, **o)
            finally:
                planner.close()
        out.append((f"api/AsyncPlanner.submit {bad!r:.60}", submit, True))
        out.append((f"api/quick_fallback {bad!r:.60}", lambda o=o: api.quick_fallback(lengths, counts, options=o), True))
    for label, lc in (("lengths=None", (None, counts)), ("counts 2-D", (lengths, counts[:, 0])),
                      ("lengths float", (lengths + 0.5, counts)), ("counts bool", (lengths, counts > 0)),
                      ("counts complex", (lengths, counts.astype(complex))),
                      ("lengths str", (lengths.astype(str), counts)), ("counts object", (lengths, counts.astype(object))),
                      ("lengths 0", (np.zeros_like(lengths), counts)), ("counts negative", (lengths, -counts))):
        out.append((f"api/plan_micro_batches {label}", lambda a=lc: api.plan_micro_batches(*a, **opts), True))
    return out


def run_api(files, tmp: Path, record):
    for name, fn, must_refuse in api_cases(files, tmp):
        outcome, detail = fs.run_api(fn, timeout=60)
        if outcome == "ok" and must_refuse:
            outcome = "wrong"
        record("api", name, outcome, detail)


def schema_cases(files):
    """Plan JSON / run.json / steps.jsonl of the wrong shape, not the issue's examples."""
    plan = json.loads(files["plan_rep"].read_text())
    E = fs.E
    variants = {
        "phy2log -1": {"phy2log": [[-1] + list(range(1, E)) + [0, 1]] * 2},
        "phy2log 2**31": {"phy2log": [[2**31] + list(range(1, E)) + [0, 1]] * 2},
        "phy2log ragged": {"phy2log": [list(range(E)) + [0, 1], list(range(E))]},
        "phy2log nested": {"phy2log": [[[0]] * (E + 2)] * 2},
        "phy2log null": {"phy2log": None},
        "phy2log dict": {"phy2log": {"0": 1}},
        "phy2log bools": {"phy2log": [[True] * (E + 2)] * 2},
        "logcnt 0": {"logcnt": [[0, 2, 2] + [1] * (E - 3)] * 2},
        "logcnt negative": {"logcnt": [[-2, 2] + [1] * (E - 2)] * 2},
        "logcnt one row": {"logcnt": [[2, 2] + [1] * (E - 2)]},
        "logcnt null": {"logcnt": None},
        "logcnt nested str": {"logcnt": [["2", "2"] + ["1"] * (E - 2)] * 2},
        "logcnt 2.0": {"logcnt": [[2.0, 2] + [1] * (E - 2)] * 2},
        "logcnt 2**64": {"logcnt": [[2**64, 2] + [1] * (E - 2)] * 2},
        "replica_rule 3": {"replica_rule": 3},
        "cells float id": {"cells": [[[0.0]]]},
        "placement 2**63": {"placement": [[2**63] * E] * 2},
        "placement empty rows": {"placement": [[], []]},
        "topology redundant -1": {"topology": {**plan["topology"], "redundant_experts": -1}},
        "topology dp str": {"topology": {**plan["topology"], "dp": "2"}},
    }
    for label, change in variants.items():
        yield f"schema/plan {label}", json.dumps({**plan, **change}), "plan"
    for label, text in (("run.json null", "null"), ("run.json string", '"x"'), ("run.json number", "3"),
                        ("run.json nested list", "[[]]"), ("run.json NaN", '{"seed": NaN}'),
                        ("run.json bytes", "\udcff".encode("utf-8", "surrogateescape").decode("latin-1"))):
        yield f"schema/{label}", text, "run_json"
    rec = json.loads(files["steps"].read_text().splitlines()[0])
    for label, change in (("window 3", {"window": 3}), ("window ''", {"window": ""}), ("rows 0", {"rows": 0}),
                          ("rows '2'", {"rows": "2"}), ("makespan null", {"makespan": None}),
                          ("baselines list", {"baselines": []}), ("ep_imbalance str", {"ep_imbalance": "x"}),
                          ("time_split missing", {"time_split": None}), ("best_baseline unknown", {"best_baseline": "z"}),
                          ("step -1", {"step": -1}), ("error 5", {"error": 5}), ("saving 'x'", {"saving": "x"}),
                          ("gap true", {"gap": True})):
        yield f"schema/steps {label}", json.dumps({**rec, **change}) + "\n", "steps"


def run_schema(files, tmp: Path, record):
    cases = {c[0]: c for c in fs.reader_cases(files)}
    by_fmt = {"plan": ("plan", files["plan_rep"]), "run_json": ("run_json", None), "steps": ("steps", None)}
    readers = {fmt: next(c for c in fs.reader_cases(files) if c[0] == fmt and (fmt != "plan" or c[1] == files["plan_rep"]))
               for fmt in by_fmt}
    del cases
    for k, (name, text, fmt) in enumerate(schema_cases(files)):
        work = tmp / f"sc{k}"
        work.mkdir()
        path = work / ("p.json" if fmt == "plan" else "run.json" if fmt == "run_json" else "steps.jsonl")
        path.write_text(text)
        outcome, detail = readers[fmt][2](path, work)
        if outcome == "ok":
            outcome = "wrong"
        record("schema", name, outcome, detail)


def main() -> None:
    args = sys.argv[1:]
    seeds = int(args[args.index("--seeds") + 1]) if "--seeds" in args else 4
    out_dir = Path(args[args.index("--out") + 1]) if "--out" in args else ROOT / "experiments/results/hostile_sweep"
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    bad = []

    def record(group, name, outcome, detail):
        counts[group][outcome] += 1
        counts["all"][outcome] += 1
        if outcome not in ("clean2", "ok"):
            bad.append({"case": name, "outcome": outcome, "detail": str(detail)[:400]})
            print(f"{outcome}: {name}: {str(detail)[:200]}", flush=True)

    t0 = time.perf_counter()
    times = {}
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        files = fs.good_files(tmp / "good")
        for group, fn in (("fuzz", lambda: run_fuzz(files, seeds, tmp, record)),
                          ("special", lambda: run_special(files, tmp, record)),
                          ("api", lambda: run_api(files, tmp, record)),
                          ("schema", lambda: run_schema(files, tmp, record))):
            t1 = time.perf_counter()
            fn()
            times[group] = round(time.perf_counter() - t1, 1)
    summary = {"seeds": seeds, "cases": sum(counts["all"].values()), "wall_s": round(time.perf_counter() - t0, 1),
               "wall_s_per_group": times,
               "outcomes": {g: {o: counts[g][o] for o in OUTCOMES} for g in ("all", "fuzz", "special", "api", "schema")}}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out_dir / "cases.jsonl").write_text("".join(json.dumps(b) + "\n" for b in bad))
    print(json.dumps(summary, indent=1))
    _ = InputError  # (imported for readers of this script: the API's one refusal type)


if __name__ == "__main__":
    main()

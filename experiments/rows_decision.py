"""Rows as a decision (issue 42): R* is the fewest micro-batches, not the fastest step.

    python experiments/rows_decision.py [--parts table,sweep,exact,replay] [--max-sweeps 16]
        [--windows 32] [--run-dir /tmp/routepack-rows-run] [--quick] [--out DIR]

- table: per preset (qwen3-30b-a3b, olmoe-1b-7b, deepseek-v3: its DeepSeek-V3-shaped cost), cap
  (8,192, 16,384), EP (8, 32; D = EP, one shard) and replicas (none, one redundant slot per
  rank): a generated window (``routepack_opt.trace``, the preset's shape, lengths within the
  cap) planned twice with the same sweep budget and seed — rows forced to R*, and the default
  row search — with R*, the chosen R, both makespans, both gaps to the layout bound and both
  planning times. N = 1,024 for every combination; N = 512, 2,048 and 4,096 only for qwen3 at
  cap 16,384, EP 8 (sized to run in ~10 min on a shared 2-core host).
- sweep: the issue's seed-14 qwen3 window (768 samples, DP = EP = 8, cap 16,384) and a
  1,024-sample window at cap 8,192, planned with ``row_overhead`` from 50 µs to 50 ms, and on
  to 1 s to show where more rows stop paying (R_max = R* + 8): where the chosen R moves.
- exact: tiny windows (N = 10 and 8, D = P = 2, quadratic attention, 3 seeds), both
  objectives, with and without replicas: ``models.layout_rows.solve_best_rows`` (CP-SAT) proves the best R and its
  layout over [R*, N/D]; the heuristic's chosen R and makespan against it.
- replay: ``--windows`` qwen3 windows (``gen-trace --preset qwen3-30b-a3b --samples 768``,
  seeds 0..W−1) through ``routepack replay-report`` (DP = EP = 8, cap 16,384), once with the
  row count fixed at R* (``[rows] extra = 0``: the behaviour before) and once with the default
  search: steps where a cap-keeping baseline beats the plan.

Writes ``experiments/results/rows_decision/``: ``rows_decision_<part>.json`` per part and
``rows_decision.md`` (every part written so far).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from _lib import report, settings

from routepack_opt.core.cost import CostModel, Stage, get_preset
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.core.testing import random_window
from routepack_opt.core.topology import Topology
from routepack_opt.models.layout_rows import solve_best_rows
from routepack_opt.params import PlannerParams, RowParams
from routepack_opt.pipeline import row_candidates, solve
from routepack_opt.trace import generate_window, write_trace
from routepack_opt.warmup import warm

STUDY = "rows_decision"
PRESETS = ("qwen3-30b-a3b", "olmoe-1b-7b", "deepseek-v3")


def plan_pair(window, topo, cost, sweeps, seed, redundant=0, params=None):
    """(plan at R* forced, plan with the row search), same budget and seed."""
    base = solve(window, topo, cost, max_sweeps=sweeps, seed=seed, redundant_experts=redundant,
                 params=PlannerParams(rows=RowParams(extra=0)))
    srch = solve(window, topo, cost, max_sweeps=sweeps, seed=seed, redundant_experts=redundant,
                 params=params or PlannerParams())
    return base, srch


def _row(p):
    e = p.report.evaluation
    return e.makespan, e.gap, p.report.timings["total"]


def part_table(args, out):
    configs = []
    for preset in PRESETS:
        for cap in (8192, 16384):
            for ep in (8, 32):
                for red in (0, ep):
                    configs.append((preset, cap, 1024, ep, red))
    for n in (512, 2048, 4096):
        for red in (0, 8):
            configs.append(("qwen3-30b-a3b", 16384, n, 8, red))
    if args.quick:
        configs = [c for c in configs if c[2] == 1024 and c[3] == 8 and c[4] == 0][:2]
    rows, recs = [], []
    for preset, cap, n, ep, red in configs:
        cost = get_preset(preset).cost
        w = generate_window(preset, n, seed=1, capacity=cap)
        topo = Topology(dp=ep, ep=ep, capacity=cap)
        base, srch = plan_pair(w, topo, cost, args.max_sweeps, 0, red)
        mb, gb, tb = _row(base)
        ms, gs, ts = _row(srch)
        rs = srch.info["row_search"]
        bc = srch.info["baseline_check"]
        rec = dict(preset=preset, cap=cap, N=n, ep=ep, redundant=red, r_star=base.rows, chosen=srch.rows,
                   makespan_r_star=mb, makespan_chosen=ms, gap_r_star=gb, gap_chosen=gs,
                   seconds_r_star=tb, seconds_search=ts, why=rs["why"], baseline_taken=bc.get("taken"),
                   best_baseline=bc.get("best"), baseline_saving=bc.get("saving"))
        recs.append(rec)
        rows.append((preset, f"{cap:,}", f"{n:,}", ep, red, base.rows, srch.rows, mb / 1e6, ms / 1e6, ms / mb - 1,
                     gb, gs, tb, ts))
        print(rows[-1], flush=True)
    md = report.table(["preset", "cap", "N", "EP", "red.", "R*", "R", "M at R* (s)", "M at R (s)", "change",
                       "gap R*", "gap R", "t R* (s)", "t search (s)"], rows,
                      formats={"M at R* (s)": ".3f", "M at R (s)": ".3f", "change": report.pct, "gap R*": ".4f",
                               "gap R": ".4f", "t R* (s)": ".1f", "t search (s)": ".1f"})
    return md, recs


SWEEP_WINDOWS = {  # name → (samples, seed, cap)
    "seed-14, N=768, cap 16,384": (768, 14, 16384),
    "seed-1, N=1,024, cap 8,192": (1024, 1, 8192),
}


def part_sweep(args, out):
    preset = get_preset("qwen3-30b-a3b").cost
    rows, recs = [], []
    overheads = (50.0, 500.0, 2000.0, 5000.0, preset.row_overhead, 50000.0, 200000.0, 1e6)
    params = PlannerParams(rows=RowParams(extra=8))
    for wname, (n, wseed, cap) in SWEEP_WINDOWS.items():
        w = generate_window("qwen3-30b-a3b", n, seed=wseed, capacity=cap)
        topo = Topology(dp=8, ep=8, capacity=cap)
        for ovh in overheads[:3] if args.quick else overheads:
            r, rec = _sweep_point(args, w, topo, preset, ovh, params)
            rows.append((wname, *r))
            recs.append({"window": wname, **rec})
            print(rows[-1], flush=True)
    md = report.table(["window", "row_overhead (ms)", "R*", "chosen R", "M at R* (s)", "M at R (s)", "change",
                       "pruned", "why"], rows,
                      formats={"row_overhead (ms)": ".3g", "M at R* (s)": ".3f", "M at R (s)": ".3f",
                               "change": report.pct})
    return md, recs


def _sweep_point(args, w, topo, preset, ovh, params):
    cost = dataclasses.replace(preset, row_overhead=ovh)
    base, srch = plan_pair(w, topo, cost, args.max_sweeps, 0, params=params)
    mb, gb, _ = _row(base)
    ms, gs, _ = _row(srch)
    rs = srch.info["row_search"]
    screened = {c["rows"]: c["status"] for c in rs["candidates"]}
    rec = dict(row_overhead=ovh, r_star=base.rows, chosen=srch.rows, makespan_r_star=mb, makespan_chosen=ms,
               gap_r_star=gb, gap_chosen=gs, candidates=rs["candidates"])
    return (ovh / 1e3, base.rows, srch.rows, mb / 1e6, ms / 1e6, ms / mb - 1,
            sum(s == "pruned" for s in screened.values()), rs["why"]), rec


EXACT_COST = CostModel((Stage("attn", 0.02, 4e-3),), gamma=0.3, row_overhead=1.0)
EXACT_FAMILIES = {  # name → (N, cap, longest sample); D = P = 2, L = 2, E = 4, top-2
    "N=10, cap 90": (10, 90, 60),
    "N=8, cap 60": (8, 60, 40),  # the test's regime (tests/models/test_exact_best_rows.py): more rows can pay
}


def part_exact(args, out):
    rows, recs = [], []
    seeds = range(1 if args.quick else 3)
    for fam, (n, cap, max_len), seed in ((f, v, sd) for f, v in EXACT_FAMILIES.items() for sd in seeds):
        w = random_window(n, 2, 4, 2, max_len=max_len, min_len=8, seed=seed, skew=1.5)
        for red in (0, 2):
            topo = Topology(dp=2, ep=2, capacity=cap, redundant_experts=red)
            for obj in ("max-sum", "sum-max"):
                p = solve(w, topo, EXACT_COST, objective=obj, max_sweeps=8, seed=0,
                          params=PlannerParams(rows=RowParams(extra=3)))
                r_star = p.info["row_search"]["r_star"]
                cands = row_candidates(w.num_samples, topo, r_star, RowParams(extra=3))
                if red:
                    ex = solve_best_rows(w, topo, EXACT_COST, cands, objective=obj, replicas=True,
                                         time_limit=args.exact_time)
                else:
                    ex = solve_best_rows(w, topo, EXACT_COST, cands, objective=obj, placement=p.placement,
                                         time_limit=args.exact_time)
                # every claimed objective re-scored by the evaluator
                ev = Evaluator(w, topo, EXACT_COST)
                assert ev.score(ex.placement, ex.row, ex.slot, ex.rows, obj).makespan == ex.objective
                h = ev.evaluate_plan(p).score.makespan
                statuses = "/".join(f"{e['rows']}:{e['status'][:4]}" for e in ex.per_rows)
                recs.append(dict(family=fam, seed=seed, redundant=red, objective=obj, r_star=r_star, heuristic_rows=p.rows,
                                 heuristic=h, exact_rows=ex.rows, exact=ex.objective, status=ex.status, bound=ex.bound,
                                 per_rows=ex.per_rows, seconds=ex.seconds))
                rows.append((fam, seed, red, obj, r_star, p.rows, ex.rows, ex.status, h, ex.objective, h / ex.objective - 1,
                             statuses, ex.seconds))
                print(rows[-1], flush=True)
    md = report.table(["window", "seed", "red.", "objective", "R*", "heuristic R", "exact R", "status", "heuristic M",
                       "exact M", "heur. − exact", "per R", "exact (s)"], rows,
                      formats={"heuristic M": ".2f", "exact M": ".2f", "heur. − exact": report.pct, "exact (s)": ".1f"})
    return md, recs


def _replay(run_dir: Path, out: Path, sweeps: int, config: Path | None):
    cmd = [sys.executable, "-m", "routepack_opt", "replay-report", str(run_dir), "-o", str(out), "--dp", "8",
           "--ep", "8", "--capacity", "16384", "--cost", "qwen3-30b-a3b", "--max-sweeps", str(sweeps), "--seed", "0"]
    if config is not None:
        cmd += ["--config", str(config)]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    steps = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines() if x.strip()]
    return steps, wall


def part_replay(args, out):
    run = Path(args.run_dir)
    run.mkdir(parents=True, exist_ok=True)
    for s in range(args.windows):
        path = run / f"step_{s:03d}.npz"
        if not path.exists():
            write_trace(path, "qwen3-30b-a3b", 768, seed=s)
    work = Path(args.run_dir + "-reports")
    work.mkdir(parents=True, exist_ok=True)
    cfg = work / "at_r_star.toml"
    cfg.write_text("[rows]\nextra = 0\n")
    res = {}
    for name, config in (("R* (before)", cfg), ("row search", None)):
        o = work / name.split()[0].replace("*", "star").lower()
        if o.exists():
            for f in o.iterdir():
                f.unlink()
            o.rmdir()
        steps, wall = _replay(run, o, args.max_sweeps, config)
        ok = [s for s in steps if "makespan" in s]
        losses = [s for s in ok if s.get("saving") is not None and s["saving"] < 0]
        res[name] = dict(steps=len(ok), losses=len(losses), wall=wall,
                         loss_range=[min((-s["saving"] for s in losses), default=0.0),
                                     max((-s["saving"] for s in losses), default=0.0)],
                         mean_saving=float(np.mean([s["saving"] for s in ok if s.get("saving") is not None])),
                         rows_above_r_star=sum(s["rows"] > s["certificate"]["rows"] for s in ok),
                         reasons=[s.get("baseline_wins") for s in losses],
                         per_step=[dict(window=s.get("window"), r_star=s["certificate"]["rows"], rows=s["rows"],
                                        makespan=s["makespan"], best_baseline=s["best_baseline"],
                                        saving=s["saving"]) for s in ok])
        print(name, {k: v for k, v in res[name].items() if k != "per_step"}, flush=True)
    rows = [(k, v["steps"], v["losses"], f"{100 * v['loss_range'][0]:.1f}–{100 * v['loss_range'][1]:.1f} %"
             if v["losses"] else "—", v["mean_saving"], v["rows_above_r_star"], v["wall"]) for k, v in res.items()]
    md = report.table(["planner", "steps", "steps a baseline beats", "by", "mean saving", "steps with R > R*",
                       "wall (s)"], rows, formats={"mean saving": report.pct, "wall (s)": ".0f"})
    return md, res


def main() -> None:
    ap = settings.parser(__doc__)
    ap.add_argument("--parts", default="table,sweep,exact,replay")
    ap.add_argument("--max-sweeps", type=int, default=16)
    ap.add_argument("--windows", type=int, default=32)
    ap.add_argument("--exact-time", type=float, default=60.0)
    ap.add_argument("--run-dir", default="/tmp/routepack-rows-run")
    settings.add_quick(ap)
    settings.add_out(ap, STUDY)
    args = ap.parse_args()
    out = settings.results_dir(STUDY, args.out)
    warm()
    for part in [p for p in args.parts.split(",") if p]:
        t0 = time.perf_counter()
        md, recs = {"table": part_table, "sweep": part_sweep, "exact": part_exact, "replay": part_replay}[part](args, out)
        report.write_json(out / f"{STUDY}_{part}.json", {"records": recs, "seconds": time.perf_counter() - t0,
                                                          "max_sweeps": args.max_sweeps, "md": md})
    mds = {}
    for part in ("table", "sweep", "exact", "replay"):  # every part written so far, by this run or an earlier one
        f = out / f"{STUDY}_{part}.json"
        if f.exists():
            mds[part] = json.loads(f.read_text())["md"]
    titles = {"table": "Chosen R against R* (same sweep budget and seed)",
              "sweep": "Overhead sweep: two qwen3-30b-a3b windows, DP = EP = 8, R_max = R* + 8 (50 µs → 50 ms, then 0.2 and 1 s)",
              "exact": "Exact check of the best R (CP-SAT per R with bound pruning, tiny windows)",
              "replay": f"Replay report: {args.windows} qwen3 windows (N = 768, DP = EP = 8, cap 16,384)"}
    lines = [f"# {STUDY}", "", "Command: `python experiments/rows_decision.py` (see its docstring). "
             f"Sweep budget {args.max_sweeps} per plan, seed 0; M = makespan (predicted step time, s), gap = M / layout "
             "lower bound; costs are the presets' (row_overhead from DeepEP's published all-to-all latency, "
             "docs/model.md).", ""]
    for part in ("table", "sweep", "exact", "replay"):
        if part in mds:
            lines += [f"## {titles[part]}", "", *mds[part], ""]
    report.write_md(out / f"{STUDY}.md", lines)


if __name__ == "__main__":
    main()

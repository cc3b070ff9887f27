"""A/B of the redesign (issue 13): the tree before it (commit b86d510: flat modules,
``pipeline.plan``, ``heuristics/annealing.py``) against this one (the layered package, ``solve()``,
``heuristics/anneal/``), interleaved on the production window.

    git worktree add --detach /work/wt/old b86d510    # the old tree, read-only
    python experiments/bench_redesign.py --old /work/wt/old [--rounds 5]

Writes ``experiments/results/bench_redesign/results.md`` (+ ``results.json``);
``anneal_split_vs_e82ae2a.*`` there is the first A/B, of the annealer split alone.

Window: ``routepack gen-trace --preset qwen3-30b-a3b --samples 1024 --seed 0`` planned with
``--dp 32 --ep 8 --capacity 16384 --cost qwen3-30b-a3b`` (max-sum, LPT, default budget, seed 0:
deterministic). Each round runs one child process per tree, alternating which goes first; a child
warms the kernels (off the clock), then plans the window ``--plans`` times and reports, per
plan, the wall time (``info.timings.total``), the annealer's move evaluations per CPU second
(all threads together, i.e. per core) and per wall second, and a hash of the cells; then it
times the move loop alone (one thread, 4 replicas from the plan, a fixed temperature). The machine
is shared, so interleaving matters more than the number of rounds: both trees see the same load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "experiments" / "results" / "bench_redesign"

CHILD = r"""
import hashlib, json, sys, time
import numpy as np
import os
# which tree this is, from its files (an editable install of the other tree could otherwise
# answer an import that this tree does not have)
NEW = os.path.isdir("routepack_opt/core")
if NEW:  # the package since issue 13
    from routepack_opt.core.cost import get_preset
    from routepack_opt.core.evaluate import Evaluator
    from routepack_opt.core.topology import Topology
    from routepack_opt.core.window import load_window
    from routepack_opt.pipeline import solve
    def plan(window, topo, cost, objective, placement, seed):
        return solve(window, topo, cost, objective=objective, placement=placement, seed=seed)
else:  # before it (b86d510)
    from routepack_opt.cost import get_preset
    from routepack_opt.evaluate import Evaluator
    from routepack_opt.topology import Topology
    from routepack_opt.window import load_window
    from routepack_opt.pipeline import plan
from routepack_opt.warmup import warm

window = load_window(sys.argv[1])
topo = Topology(dp=32, ep=8, capacity=16384)
cost = get_preset("qwen3-30b-a3b").cost
warm()
out = []
for _ in range(int(sys.argv[2])):
    t = time.perf_counter()
    p = plan(window, topo, cost, "max-sum", "lpt", seed=0)
    wall = time.perf_counter() - t
    s = p.info["search"]
    cells = hashlib.sha1(json.dumps(p.to_json()["cells"]).encode()).hexdigest()[:12]
    out.append({"plan_wall": wall, "plan_total": p.info["timings"]["total"],
                "anneal": p.info["timings"]["anneal"],
                "moves_per_cpu_second": s["moves_per_cpu_second"],
                "moves_per_second": s["moves_per_second"], "moves_evaluated": s["moves_evaluated"],
                "score": p.to_json()["score"], "cells": cells})
# the move loop alone: one thread, 4 replicas from the plan's layout, a fixed mid-ladder
# temperature, default move mix (evaluations per CPU second, best of 3)
import numba
if NEW:
    from routepack_opt.heuristics.anneal import AnnealConfig
    from routepack_opt.heuristics.anneal.moves import run
    from routepack_opt.heuristics.anneal.problem import Instance
    from routepack_opt.heuristics.anneal.rng import rng_states
    from routepack_opt.heuristics.anneal.state import Population
    counters = lambda pop: pop.walk.counters
else:  # the old module
    from routepack_opt.heuristics.annealing import AnnealConfig, _Population as Population, _Problem as Instance, _rng_states as rng_states
    run = lambda pop, n, t, cfg: pop.run(pop.pb, n, t, cfg)
    counters = lambda pop: pop.counters
cfg = AnnealConfig()
b = Evaluator(window, topo, cost).rank_loads(p.placement)
inst = Instance(window.lengths, b, topo, cost, p.rows, "max-sum", cfg.tie_eps)
r32, s32 = inst.check_layout(p.row, p.slot, "plan")
pop = Population(inst, 4)
pop.pb = inst
if hasattr(pop, "walk"):
    pop.init(np.stack([r32] * 4), np.stack([s32] * 4))
    pop.walk.rng[:] = rng_states(0, 0, 4)
else:
    pop.init(inst, np.stack([r32] * 4), np.stack([s32] * 4))
    pop.rng[:] = rng_states(0, 0, 4)
temp = 1e-3 * float(pop.energy.mean()) / inst.R
numba.set_num_threads(1)
rates = []
for _ in range(3):
    c0 = counters(pop)[:, 0].sum()
    t = time.process_time()
    run(pop, int(sys.argv[3]), temp, cfg)
    rates.append((counters(pop)[:, 0].sum() - c0) / (time.process_time() - t))
for x in out:
    x["loop_moves_per_cpu_second"] = max(rates)
print("RESULT " + json.dumps(out))
"""


def child(tree: Path, window: Path, plans: int, loop_moves: int) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    p = subprocess.run([sys.executable, "-c", CHILD, str(window), str(plans), str(loop_moves)],
                       cwd=tree, env=env,
                       capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"{tree}: {p.stderr[-2000:]}")
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def summary(xs: list[float]) -> dict:
    xs = sorted(xs)
    q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [xs[0]] * 3
    return {"median": statistics.median(xs), "min": xs[0], "max": xs[-1], "q1": q[0], "q3": q[2],
            "n": len(xs)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="worktree of the old tree (e.g. b86d510, before issue 13)")
    ap.add_argument("--old-label", default="b86d510", help="the old tree's commit, for the report")
    ap.add_argument("--out", default=str(OUT), help="results folder")
    ap.add_argument("--new", default=str(ROOT), help="worktree of the new tree (default: this one)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--plans", type=int, default=3, help="plans per child process")
    ap.add_argument("--window", default="/tmp/anneal_w.npz")
    ap.add_argument("--loop-moves", type=int, default=100_000,
                    help="proposals per replica in each timing of the move loop alone")
    args = ap.parse_args()
    trees = {"old": Path(args.old).resolve(), "new": Path(args.new).resolve()}
    window = Path(args.window)
    if not window.exists():
        subprocess.run([sys.executable, "-m", "routepack_opt", "gen-trace", "--preset", "qwen3-30b-a3b",
                        "--samples", "1024", "--seed", "0", "-o", str(window)], check=True,
                       cwd=trees["new"], env=dict(os.environ, PYTHONPATH=str(trees["new"])))
    for name, tree in trees.items():  # compile both (numba caches beside the sources)
        child(tree, window, 1, 1000)
    runs = {name: [] for name in trees}
    load = [os.getloadavg()[0]]
    for r in range(args.rounds):
        order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
        for name in order:
            res = child(trees[name], window, args.plans, args.loop_moves)
            runs[name].append(res)
            print(f"round {r} {name}: " + ", ".join(f"{x['plan_wall']:.3f}s {x['moves_per_cpu_second'] / 1e6:.3f}M"
                                                   for x in res), flush=True)
        load.append(os.getloadavg()[0])
    metrics = ("plan_wall", "plan_total", "anneal", "moves_per_cpu_second", "moves_per_second",
               "loop_moves_per_cpu_second")
    # per round: the child's median (its plans share one process and one load level)
    stats = {name: {m: summary([statistics.median(x[m] for x in res) for res in runs[name]])
                    for m in metrics} for name in trees}
    ratio = {m: [statistics.median(x[m] for x in n) / statistics.median(x[m] for x in o)
                 for o, n in zip(runs["old"], runs["new"])] for m in metrics}
    identical = len({x["cells"] for res in runs["old"] + runs["new"] for x in res}) == 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"args": vars(args), "load_average": load,
                                                  "stats": stats, "ratio_new_over_old": ratio,
                                                  "identical_plans": identical, "runs": runs},
                                                 indent=1) + "\n")
    lines = ["# Redesign A/B (issue 13): old tree vs new tree", "",
             f"`python experiments/bench_redesign.py --rounds {args.rounds} --plans {args.plans}` "
             f"on {time.strftime('%Y-%m-%d')}; old = {args.old_label}, new = the tree of this script "
             "(the layered package, `solve()`, `heuristics/anneal/`). Production window (qwen3-30b-a3b trace, N=1024, L=48, E=128, "
             "top-8), D=32, P=8, C=16384, max-sum, LPT, default budget, seed 0. Child processes "
             f"alternate old/new each round; 2 cores shared with other work (load average "
             f"{min(load):.1f}–{max(load):.1f}).", "",
             f"Plans identical (cells hash) across all old and new runs: **{identical}**.", "",
             "Per round the child's median of its plans; then median [q1, q3] (min–max) over rounds.", "",
             "| metric | old | new | new/old per round: median (min–max) |", "|---|---|---|---|"]
    unit = {"plan_wall": ("s", 1), "plan_total": ("s", 1), "anneal": ("s", 1),
            "moves_per_cpu_second": ("M/s", 1e-6), "moves_per_second": ("M/s", 1e-6),
            "loop_moves_per_cpu_second": ("M/s", 1e-6)}
    label = {"plan_wall": "plan wall time", "plan_total": "plan time (info.timings.total)",
             "anneal": "annealer time (timings.anneal)",
             "moves_per_cpu_second": "move evaluations per CPU second (per core)",
             "moves_per_second": "move evaluations per wall second",
             "loop_moves_per_cpu_second": "move loop alone, 1 thread, fixed T: evaluations per CPU second"}
    for m in metrics:
        u, f = unit[m]

        def cell(s):
            return (f"{s['median'] * f:.3f} {u} [{s['q1'] * f:.3f}, {s['q3'] * f:.3f}] "
                    f"({s['min'] * f:.3f}–{s['max'] * f:.3f})")
        rs = ratio[m]
        lines.append(f"| {label[m]} | {cell(stats['old'][m])} | {cell(stats['new'][m])} | "
                     f"{statistics.median(rs):.3f} ({min(rs):.3f}–{max(rs):.3f}) |")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

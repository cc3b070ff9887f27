"""Interleaved A/B of planning time between two trees of the project, through the public API only
(``routepack_opt.solve``), so it survives any reorganisation of the internals (issue 40's check:
"interleaved A/B planning times within ±3 %, plans bit-identical").

    git worktree add --detach /work/wt/old <commit>       # the tree before the change, read-only
    python experiments/bench_ab.py --old /work/wt/old --old-label <commit> [--rounds 6]

Cases, all on the production window (``routepack gen-trace --preset qwen3-30b-a3b --samples 1024
--seed 0``: N = 1,024, L = 48, E = 128, top-8), D = 32, P = 8, C = 16,384, the qwen3-30b-a3b cost:

- ``max-sum/lpt``: the default planner (row search, LPT, population annealing);
- ``sum-max/lpt``: the same under the other objective;
- ``max-sum/replicas``: 8 redundant expert slots per layer (one per rank);
- ``max-sum/joint``: the joint placement search.

Each case runs with a fixed sweep budget and seed, so the plan is deterministic: the report says
whether both trees gave the same plan (a hash of rows, placement, replica slots and cells). Each
round runs one child process per tree, alternating which goes first; a child compiles or loads
its kernels (``warm()``, off the clock), then plans each case ``--plans`` times and reports the
wall time of each. Per round the child's median; the verdict is the median over rounds of the
per-round new/old ratio. The machine is shared, so interleaving matters more than the number of
rounds: both trees see the same load.

Writes ``<out>/results.md`` and ``results.json`` (default ``experiments/results/bench_ab/``).
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
OUT = ROOT / "experiments" / "results" / "bench_ab"
CASES = {  # name: solve() keywords
    "max-sum/lpt": dict(objective="max-sum", placement="lpt"),
    "sum-max/lpt": dict(objective="sum-max", placement="lpt"),
    "max-sum/replicas": dict(objective="max-sum", placement="lpt", redundant_experts=8),
    "max-sum/joint": dict(objective="max-sum", placement="joint"),
}

CHILD = r"""
import hashlib, json, sys, time
from routepack_opt.core.cost import get_preset
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import load_window
from routepack_opt.pipeline import solve
from routepack_opt.warmup import warm

window = load_window(sys.argv[1])
cases = json.loads(sys.argv[2])
plans, sweeps = int(sys.argv[3]), int(sys.argv[4])
topo = Topology(dp=32, ep=8, capacity=16384)
cost = get_preset("qwen3-30b-a3b").cost
warm()
out = {}
for name, kw in cases.items():
    rec = []
    for _ in range(plans):
        t = time.perf_counter()
        p = solve(window, topo, cost, max_sweeps=sweeps, seed=0, **kw)
        wall = time.perf_counter() - t
        d = p.to_json()
        key = {k: d.get(k) for k in ("rows", "placement", "phy2log", "logcnt", "cells")}
        rec.append({"wall": wall, "makespan": d["score"]["makespan"],
                    "plan": hashlib.sha1(json.dumps(key).encode()).hexdigest()[:12]})
    out[name] = rec
print("RESULT " + json.dumps(out))
"""


def child(tree: Path, window: Path, cases: dict, plans: int, sweeps: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    p = subprocess.run([sys.executable, "-c", CHILD, str(window), json.dumps(cases), str(plans), str(sweeps)],
                       cwd=tree, env=env, capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        raise RuntimeError(f"{tree}: {p.stderr[-2000:]}")
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="a worktree of the tree before the change")
    ap.add_argument("--old-label", default="old", help="the old tree's commit, for the report")
    ap.add_argument("--new", default=str(ROOT), help="a worktree of the tree after it (default: this one)")
    ap.add_argument("--out", default=str(OUT), help="results folder")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--plans", type=int, default=3, help="plans per case in each child")
    ap.add_argument("--sweeps", type=int, default=64, help="the annealer's sweep budget (fixed: deterministic plans)")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    ap.add_argument("--window", default="/tmp/bench_ab_window.npz")
    args = ap.parse_args(argv)
    cases = {c: CASES[c] for c in args.cases.split(",")}
    trees = {"old": Path(args.old).resolve(), "new": Path(args.new).resolve()}
    window = Path(args.window)
    if not window.exists():
        subprocess.run([sys.executable, "-m", "routepack_opt", "gen-trace", "--preset", "qwen3-30b-a3b",
                        "--samples", "1024", "--seed", "0", "-o", str(window)], check=True,
                       cwd=trees["new"], env=dict(os.environ, PYTHONPATH=str(trees["new"])))
    for tree in trees.values():  # compile both (numba caches beside the sources)
        child(tree, window, cases, 1, 2)
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    load = [os.getloadavg()[0]]
    for r in range(args.rounds):
        for name in (["old", "new"] if r % 2 == 0 else ["new", "old"]):
            res = child(trees[name], window, cases, args.plans, args.sweeps)
            runs[name].append(res)
            print(f"round {r} {name}: " + ", ".join(f"{c} {statistics.median(x['wall'] for x in v):.3f}s"
                                                   for c, v in res.items()), flush=True)
        load.append(os.getloadavg()[0])
    rows = []
    for c in cases:
        med = {n: [statistics.median(x["wall"] for x in res[c]) for res in runs[n]] for n in trees}
        ratios = [b / a for a, b in zip(med["old"], med["new"])]
        hashes = {n: {x["plan"] for res in runs[n] for x in res[c]} for n in trees}
        rows.append({"case": c, "old_s": statistics.median(med["old"]), "new_s": statistics.median(med["new"]),
                     "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                     "identical": len(hashes["old"] | hashes["new"]) == 1,
                     "makespan": runs["new"][0][c][0]["makespan"]})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"args": vars(args), "load_average": load, "rows": rows,
                                                  "runs": runs}, indent=1) + "\n")
    lines = [f"# A/B of planning time: {args.old_label} (old) vs this tree (new)", "",
             f"`python experiments/bench_ab.py --rounds {args.rounds} --plans {args.plans} --sweeps {args.sweeps}` "
             f"on {time.strftime('%Y-%m-%d')}. Production window (qwen3-30b-a3b trace, N=1024, L=48, E=128, top-8), "
             f"D=32, P=8, C=16384, seed 0, {args.sweeps} sweeps. Child processes alternate old/new each round; "
             f"2 cores (load average {min(load):.1f}–{max(load):.1f}).", "",
             "| case | old (s) | new (s) | new/old: median of rounds (min–max) | same plan |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['old_s']:.3f} | {r['new_s']:.3f} | {r['ratio']:.3f} "
                     f"({r['ratio_min']:.3f}–{r['ratio_max']:.3f}) | {'yes' if r['identical'] else 'NO'} |")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Does the annealer's three-sample rotation pay (``AnnealConfig.p_rotate``,
``routepack_opt/heuristics/anneal/move_rotate.py``, docs/annealer.md)?

    python experiments/rotation_move.py            # writes experiments/results/rotation_move/rotation_move.md

The production window (``routepack gen-trace --preset qwen3-30b-a3b --samples 1024 --seed 0``)
planned by ``solve()`` as ``routepack plan --dp 32 --ep 8 --capacity 16384 --cost
qwen3-30b-a3b`` does, with ``[anneal] p_rotate`` in {0, …}: at equal sweeps (the default budget,
bit-identical for a seed) and at equal time (``--time-limit``, ``fill_time = true``: every
setting fills the same seconds), for several planner seeds. The makespan is the evaluator's.
"""

from __future__ import annotations

import argparse
import os
import statistics

from _lib import report, settings

from routepack_opt.core.cost import get_preset
from routepack_opt.core.topology import Topology
from routepack_opt.heuristics.anneal import AnnealConfig
from routepack_opt.params import PlannerParams
from routepack_opt.pipeline import solve
from routepack_opt.trace import generate_window
from routepack_opt.warmup import default_jobs, groups_for, warm


def plan_makespan(window, topo, cost, p_rotate: float, seed: int, time_limit: float | None) -> tuple[float, float]:
    """(evaluator makespan, seconds) of one plan with ``p_rotate``."""
    anneal = AnnealConfig(p_rotate=p_rotate, fill_time=time_limit is not None)
    p = solve(window, topo, cost, params=PlannerParams(anneal=anneal), seed=seed, time_limit=time_limit)
    return p.report.evaluation.makespan, p.report.timings["total"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3, help="planner seeds 0 .. seeds-1")
    ap.add_argument("--p", default="0.1,0.3", help="p_rotate values compared with 0")
    ap.add_argument("--time-limit", type=float, default=4.0, help="seconds of the equal-time plans")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    ps = [0.0] + [float(v) for v in args.p.split(",") if v]
    window = generate_window("qwen3-30b-a3b", 1024, seed=0)
    topo = Topology(dp=32, ep=8, capacity=16384)
    cost = get_preset("qwen3-30b-a3b").cost
    warm(groups_for("lpt", 0), jobs=default_jobs())
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = ["# The three-sample rotation at a fixed budget", "",
             f"`python experiments/rotation_move.py --seeds {args.seeds} --p {args.p} --time-limit {args.time_limit:g}`", "",
             "Production window (qwen3-30b-a3b, N = 1,024, seed 0), D = 32, P = 8, C = 16,384, max-sum;",
             "makespan by the evaluator; Δ against p_rotate = 0 with the same seed and budget.",
             f"Load average at start: {load:.1f} on {os.cpu_count()} cores (shared machine: the",
             "equal-time rows carry its noise; the equal-sweep rows are exact).", ""]
    table = report.Table(["budget", "seed", "p_rotate", "makespan", "Δ vs 0 (%)", "seconds"],
                         formats={"makespan": ",.1f", "Δ vs 0 (%)": "+.3f", "seconds": ".2f"})
    deltas: dict[tuple[str, float], list[float]] = {}
    for budget, limit in (("sweeps", None), (f"{args.time_limit:g} s", args.time_limit)):
        for seed in range(args.seeds):
            base = None
            for p in ps:
                ms, secs = plan_makespan(window, topo, cost, p, seed, limit)
                base = ms if base is None else base
                d = 100.0 * (ms / base - 1.0)
                deltas.setdefault((budget, p), []).append(d)
                print(table.add(budget, seed, p, ms, d, secs), flush=True)
    lines += table.lines()
    lines += ["", "Median Δ over seeds: " + ", ".join(
        f"{b}, p_rotate {p:g}: {statistics.median(v):+.3f} %" for (b, p), v in deltas.items() if p > 0), ""]
    out = settings.results_dir("rotation_move", args.out) / "rotation_move.md"
    report.write_text(out, "\n".join(lines))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

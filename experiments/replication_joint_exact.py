"""The heuristic's replicated plans against the joint exact optimum (layout and replica placement
together) on tiny windows (issue 26, "Exact").

    python experiments/replication_joint_exact.py [--seeds 10] [--time-limit 20] [--out DIR] [--report-only]

Per seed: a random window (N=8, L=2, E=4, top-2, skewed lengths and routing), D = P = 2, two
redundant slots per layer (S = 6, so an expert can have two replicas), R = 2 rows, capacity 10 000
(not binding). ``solve(..., redundant_experts=2, max_sweeps=4)`` plans it (the heuristic: LPT
replicas, packing against the surrogate, re-scored exactly); then the joint models
(:func:`routepack_opt.models.layout.solve_layout_replicas`, CP-SAT hinted with the heuristic's
plan, and HiGHS without a start) find the optimum over every layout and every replica placement
under the even-local rule, each re-scored by the evaluator. ``ratio`` = heuristic / exact optimum
(≥ 1; the whole gap: packing and replicas). ``fixed-layout ratio`` = heuristic / the best replica
placement for the heuristic's own layout (:mod:`routepack_opt.models.replica_placement`): the
replicas' share of the gap. Writes
``experiments/results/replication/replication_joint_exact.{md,jsonl}``.
"""

from __future__ import annotations

import json
import statistics
import time

from _lib import report, settings

from routepack_opt.core.cost import CostModel, Stage
from routepack_opt.core.testing import random_window
from routepack_opt.core.topology import Topology
from routepack_opt.models.layout import solve_layout_replicas
from routepack_opt.models.replica_placement import solve_replicas_cpsat
from routepack_opt.pipeline import solve

COST = CostModel((Stage("attn", 0.01, 1e-4),), gamma=1.0, row_overhead=2.0)
N, L, E, TOP_K, D, P, RED, ROWS = 8, 2, 4, 2, 2, 2, 2, 2


def main() -> None:
    ap = settings.parser(__doc__)
    ap.add_argument("--time-limit", type=float, default=20.0, help="per exact solve (s)")
    ap.add_argument("--report-only", action="store_true",
                    help="re-render the markdown from the existing .jsonl (no solving)")
    settings.add_seeds(ap, 10)
    settings.add_out(ap, "replication")
    args = ap.parse_args()
    out = settings.results_dir("replication", args.out)
    if args.report_only:
        records = [json.loads(line) for line in (out / "replication_joint_exact.jsonl").read_text().splitlines()]
        write_report(records, out)
        return
    records = []
    for seed in range(args.seeds):
        w = random_window(num_samples=N, num_layers=L, num_experts=E, top_k=TOP_K, max_len=60, seed=seed, skew=2.5)
        topo = Topology(dp=D, ep=P, capacity=10_000)
        t = time.perf_counter()
        p = solve(w, topo, COST, rows=ROWS, max_sweeps=4, seed=seed, redundant_experts=RED)
        h_s = time.perf_counter() - t
        h = p.score["makespan"]
        start = (p.layout.row, p.layout.slot, p.replicas)
        cp = solve_layout_replicas(w, p.topology, COST, ROWS, solver="cpsat", time_limit=args.time_limit,
                                   warm_start=start, num_workers=1)
        hi = solve_layout_replicas(w, p.topology, COST, ROWS, solver="highs", time_limit=args.time_limit,
                                   num_workers=1)
        fixed = solve_replicas_cpsat(w, p.topology, COST, p.layout, time_limit=args.time_limit, hint=p.replicas)
        best = min(cp.objective, hi.objective)
        bound = max(cp.bound, hi.bound)
        rec = {"seed": seed, "heuristic": h, "heuristic_s": h_s, "cpsat": cp.objective, "cpsat_status": cp.status,
               "cpsat_s": cp.seconds, "cpsat_bound": cp.bound, "highs": hi.objective, "highs_status": hi.status,
               "highs_s": hi.seconds, "highs_bound": hi.bound, "exact": best, "bound": bound,
               "ratio": h / best, "fixed_layout_exact": fixed.objective, "fixed_layout_status": fixed.status,
               "fixed_layout_ratio": h / fixed.objective,
               "heuristic_logcnt": p.replicas.logcnt.tolist() if p.replicas is not None else None,
               "exact_logcnt": cp.placement.logcnt.tolist() if cp.placement is not None else None}
        records.append(rec)
        print({k: rec[k] for k in ("seed", "heuristic", "exact", "bound", "cpsat_status", "highs_status", "ratio")},
              flush=True)
    with open(out / "replication_joint_exact.jsonl", "w") as f:
        for rec in records:
            f.write(json.dumps(rec) + "\n")
    write_report(records, out)


def write_report(records: list[dict], out) -> None:
    rows = [[r["seed"], r["heuristic"], r["exact"], r["bound"], r["cpsat_status"], r["highs_status"], r["ratio"],
             r["fixed_layout_ratio"], r["heuristic_s"], r["cpsat_s"], r["highs_s"]] for r in records]
    ratios = [r["ratio"] for r in records]
    fixed_ratios = [r["fixed_layout_ratio"] for r in records]
    proved = [r for r in records if "optimal" in (r["cpsat_status"], r["highs_status"])]
    proved_ratios = [r["ratio"] for r in proved]
    cp_opt = sum(r["cpsat"] <= r["exact"] * (1 + 1e-9) for r in proved)
    lines = ["# Heuristic replicated plans vs the joint exact optimum (tiny windows)", "",
             "Generated by `experiments/replication_joint_exact.py` (setting in its docstring). `exact` = the "
             "best plan over every layout and every replica placement found by CP-SAT (hinted with the "
             "heuristic) or HiGHS, re-scored by the evaluator; `bound` = the better proved bound; `ratio` = "
             "heuristic / exact; `fixed-layout ratio` = heuristic / the best replicas for the heuristic's own "
             "layout. Where neither model proved optimality, `exact` is only the best plan found: the true "
             "ratio is then at least the one shown and at most heuristic / bound. Times in seconds (one "
             "worker or thread each, on a shared 2-core machine).", ""]
    lines += report.table(["seed", "heuristic", "exact", "bound", "CP-SAT", "HiGHS", "ratio", "fixed-layout ratio",
                           "heuristic s", "CP-SAT s", "HiGHS s"], rows,
                          {"heuristic": report.num(",.2f"), "exact": report.num(",.2f"), "bound": report.num(",.2f"),
                           "ratio": report.num(".4f"), "fixed-layout ratio": report.num(".4f"),
                           "heuristic s": report.num(".2f"), "CP-SAT s": report.num(".1f"),
                           "HiGHS s": report.num(".1f")})
    lines += ["", f"Optimum proved at {len(proved)} of {len(records)} seeds (CP-SAT "
                  f"{sum(r['cpsat_status'] == 'optimal' for r in records)}, HiGHS "
                  f"{sum(r['highs_status'] == 'optimal' for r in records)}); on those, ratio median "
                  f"{statistics.median(proved_ratios):.4f}, worst {max(proved_ratios):.4f}, and CP-SAT's answer "
                  f"(within its limit, hinted) was the optimum at {cp_opt} of {len(proved)}. Over all seeds: ratio "
                  f"median {statistics.median(ratios):.4f}, worst {max(ratios):.4f}; fixed-layout ratio median "
                  f"{statistics.median(fixed_ratios):.4f}, worst {max(fixed_ratios):.4f}. Solve times: heuristic "
                  f"median {statistics.median(r['heuristic_s'] for r in records):.2f} s; CP-SAT median "
                  f"{statistics.median(r['cpsat_s'] for r in records):.1f} s (max "
                  f"{max(r['cpsat_s'] for r in records):.1f}); HiGHS median "
                  f"{statistics.median(r['highs_s'] for r in records):.1f} s (max "
                  f"{max(r['highs_s'] for r in records):.1f})."]
    report.write_md(out / "replication_joint_exact.md", lines)


if __name__ == "__main__":
    main()

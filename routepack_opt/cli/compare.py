"""``routepack compare``: baseline / reorder / routepack (/ joint / exact) side by side."""

from __future__ import annotations

import sys

from routepack_opt.cli.common import add_cost, add_json, add_objective, add_topology, add_window, emit, positive_float
from routepack_opt.cli.plan import add_search_args, planning_inputs, progress_bar


def register(sub) -> None:
    p = sub.add_parser("compare", help="baseline / reorder / routepack (and joint, exact) side by side")
    add_window(p)
    add_topology(p)
    add_cost(p)
    add_objective(p)
    add_search_args(p)
    p.add_argument("--placement-from", metavar="PLAN.json", help="materialized placement (adds joint-sticky)")
    p.add_argument("--exact", choices=["auto", "yes", "no"], default="auto",
                   help="add the exact row (auto: at any size; the model where it fits, else the certified bound)")
    p.add_argument("--exact-time-limit", type=positive_float, default=30.0)
    add_json(p)
    p.set_defaults(func=run)


def run(args) -> None:
    from rich.console import Console

    from routepack_opt.compare import compare_plans, format_table

    window, topo, cost, current, params = planning_inputs(args)
    exact = {"auto": None, "yes": True, "no": False}[args.exact]
    from routepack_opt.warmup import default_jobs, warm

    # a cold cache compiles in parallel workers
    warm(("plan", "joint") + (("replicas",) if topo.redundant_experts else ()), jobs=default_jobs())
    with progress_bar(sys.stderr.isatty() and not args.json, "planning") as cb:
        table, _ = compare_plans(window, topo, cost, objective=args.objective, rows=args.rows,
                                 params=params, time_limit=args.time_limit, max_sweeps=args.max_sweeps,
                                 seed=args.seed, exact=exact, exact_time_limit=args.exact_time_limit,
                                 current_placement=current, progress=cb,
                                 max_replica_bytes=args.max_replica_bytes)
    if args.json:
        emit(args, {"objective": args.objective, "rows": table})
    else:
        Console(width=140).print(format_table(table, args.objective))

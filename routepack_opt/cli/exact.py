"""``routepack exact``: the exact layout model at fixed placement and rows (default R*)."""

from __future__ import annotations

import time

from routepack_opt.cli.common import (
    add_cost,
    add_json,
    add_objective,
    add_topology,
    add_window,
    cost_from_args,
    emit,
    nonneg_float,
    output_path,
    positive_float,
    positive_int,
    topology_from_args,
)
from routepack_opt.core.errors import InputError
from routepack_opt.core.layout import Layout
from routepack_opt.core.report import PlanReport
from routepack_opt.core.window import load_window


def register(sub) -> None:
    p = sub.add_parser("exact", help="exact layout model (CP-SAT or HiGHS) at fixed placement and rows: "
                       "status, objective, proved bound")
    add_window(p)
    add_topology(p)
    add_cost(p)
    add_objective(p)
    p.add_argument("--solver", choices=["cpsat", "highs"], default="cpsat",
                   help="CP-SAT (default) or a Pyomo MILP solved by HiGHS")
    p.add_argument("--placement", default="lpt",
                   help="lpt (default), identity, or PLAN.json to reuse that plan's placement")
    p.add_argument("--rows", type=positive_int, help="rows R (default: the certified minimum R*)")
    p.add_argument("--time-limit", type=positive_float, default=60.0, help="solver time limit in seconds (default 60)")
    p.add_argument("--lexicographic", action="store_true",
                   help="second stage: fix the makespan, minimise the total")
    p.add_argument("--warm-time", type=nonneg_float, default=None,
                   help="seconds of annealing for the warm start (default: 10%% of --time-limit, ≤ 10)")
    p.add_argument("-o", "--output", metavar="PLAN.json", help="write the layout as a plan")
    add_json(p)
    p.set_defaults(func=run)


def _placement(value: str, window, topology):
    from routepack_opt.core.plan import load_plan
    from routepack_opt.pipeline import resolve_placement

    if value in ("lpt", "identity"):
        return resolve_placement(window, topology, value)
    if value.endswith(".json"):
        return resolve_placement(window, topology, load_plan(value).placement)[0], "plan"
    raise InputError(f"--placement must be lpt, identity or a PLAN.json, got {value!r}")


def warm_start(window, topology, cost, placement, rows, objective, seconds, evaluator):
    """The best of the length-only baselines and a short population-annealing run (by the
    evaluator's lexicographic score): (layout, name)."""
    from routepack_opt.pipeline import baseline_layouts

    cands = dict(baseline_layouts(window, topology, rows, time_limit=max(seconds, 0.05)))
    if seconds > 0:
        try:
            from routepack_opt.heuristics.anneal import anneal

            res = anneal(window.lengths, evaluator.rank_loads(placement), topology, cost, rows,
                         objective, [c.arrays() for c in cands.values()], seed=0, time_limit=seconds)
            cands["anneal"] = Layout(res.row, res.slot, rows)
        except ImportError:
            pass
    scored = {k: evaluator.score_layout(placement, c, objective).key for k, c in cands.items()}
    best = min(scored, key=scored.get)
    return cands[best], best


def run(args) -> dict:
    from routepack_opt.core.evaluate import Evaluator, check_objective
    from routepack_opt.models.layout import solve_layout
    from routepack_opt.pipeline import build_plan, resolve_rows

    out = output_path(args.output, args.window, args.cost,
                      args.placement if args.placement.endswith(".json") else None)
    window = load_window(args.window)
    topo = topology_from_args(args)
    cost = cost_from_args(args)
    from routepack_opt.pipeline import with_replicas

    topo = with_replicas(topo, window.num_experts, cost, None, args.max_replica_bytes)
    if topo.redundant_experts:
        raise InputError(f"--redundant-experts {topo.redundant_experts}: the exact layout models "
                         "(CP-SAT, HiGHS) do not model replicas; use routepack plan or compare (the exact replica "
                         "placement at a fixed layout is routepack_opt.models.replica_placement)")
    objective = check_objective(args.objective)
    if not (args.time_limit and args.time_limit > 0):
        raise InputError(f"--time-limit must be > 0 seconds, got {args.time_limit}")
    # One clock for the whole command, started after the numba kernels are compiled or loaded:
    # R* and the warm start take their shares of --time-limit, the exact model (its
    # construction included) the rest.
    from routepack_opt.warmup import warm

    warm(("plan",))
    t_start = time.perf_counter()
    placement, pl_kind = _placement(args.placement, window, topo)
    rows, cert = resolve_rows(window, topo, args.rows, min(10.0, 0.1 * args.time_limit))
    ev = Evaluator(window, topo, cost)
    warm_s = min(10.0, 0.1 * args.time_limit) if args.warm_time is None else max(0.0, args.warm_time)
    layout0, warm_name = warm_start(window, topo, cost, placement, rows, objective, warm_s, ev)
    warm_score = ev.score_layout(placement, layout0, objective)
    left = max(0.05 * args.time_limit, args.time_limit - (time.perf_counter() - t_start))
    res = solve_layout(window, topo, cost, placement, rows, objective, solver=args.solver,
                       time_limit=left, warm_start=layout0.arrays(),
                       lexicographic=args.lexicographic, evaluator=ev)
    if res.status == "infeasible":
        raise InputError(f"no feasible layout with {rows} rows × {topo.dp} slots under capacity "
                         f"{topo.capacity}" + (f" ({res.info['reason']})" if "reason" in res.info else ""))
    result = {"status": res.status, "objective": res.objective, "bound": res.bound, "gap": res.gap,
              "seconds": res.seconds, "solver": args.solver, "objective_name": objective,
              "rows": rows, "placement": pl_kind, "lexicographic": args.lexicographic,
              "score": None if res.score is None else res.score.as_dict(),
              "lower_bound": ev.lower_bound(placement, rows),
              "rounding_error": res.rounding_error,
              "warm_start": {"method": warm_name, "makespan": warm_score.makespan},
              "certificate": cert}
    if out is not None and res.row is not None:
        notes = {"method": f"exact-{args.solver}", "exact_status": res.status,
                 "exact_bound": res.bound, "exact_gap": res.gap, "exact_seconds": res.seconds}
        plan = build_plan(ev, placement, Layout(res.row, res.slot, rows), objective,
                          report=PlanReport(placement_kind=pl_kind, notes=notes), certificate=cert)
        plan.save(out)
        result["plan"] = str(out)
    text = (f"exact ({args.solver}, {objective}, R={rows}, placement {pl_kind}): {res.status}\n"
            f"  makespan  {_fmt(res.objective)} µs\n  bound     {_fmt(res.bound)} µs\n"
            f"  gap       {res.gap:.3%}\n  time      {res.seconds:.2f} s\n"
            f"  warm start ({warm_name}) {_fmt(warm_score.makespan)} µs")
    if "plan" in result:
        text += f"\n  plan      {result['plan']}"
    emit(args, result, text)
    return result


def _fmt(x) -> str:
    return "—" if x is None else f"{x:,.1f}"

"""``routepack exact``: the exact layout model at fixed placement and rows (default R*); with
``--redundant-experts N`` the joint model that chooses the layout and the replica placement
together (routepack_opt.models.layout_replicas)."""

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
from routepack_opt.core.checks import check_time_limit
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
    p.add_argument("--placement", default=None,
                   help="lpt (default), identity, or PLAN.json to reuse that plan's placement; not with "
                   "--redundant-experts (the joint model chooses the placement)")
    p.add_argument("--rows", type=positive_int, help="rows R (default: the certified minimum R*)")
    p.add_argument("--time-limit", type=positive_float, default=60.0, help="solver time limit in seconds (default 60)")
    p.add_argument("--lexicographic", action="store_true",
                   help="second stage: fix the makespan, minimise the total")
    p.add_argument("--warm-time", type=nonneg_float, default=None,
                   help="seconds for the warm start, `plan`'s own plan at these settings (default: half "
                   "of --time-limit)")
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


def warm_start(window, topology, cost, placement, rows, objective, seconds, evaluator, certificate=None):
    """``routepack plan``'s own plan at the same settings (this placement, these rows, seed 0,
    the default sweep budget; at most ``seconds``), or the best length-only baseline where it
    scores better (by the evaluator's lexicographic key): (layout, name)."""
    from routepack_opt.pipeline import baseline_layouts, solve

    cands = dict(baseline_layouts(window, topology, rows, time_limit=max(min(seconds, 10.0), 0.05)))
    if seconds > 0:
        plan = solve(window, topology, cost, objective=objective, placement=placement, rows=rows,
                     time_limit=seconds, seed=0, certificate=certificate)
        cands["plan"] = plan.layout
    scored = {k: evaluator.score_layout(placement, c, objective).key for k, c in cands.items()}
    best = min(scored, key=scored.get)
    return cands[best], best


def run(args) -> dict:
    from routepack_opt.core.evaluate import Evaluator, check_objective
    from routepack_opt.models.layout import ExactOptions, solve_layout
    from routepack_opt.pipeline import certified_rows

    placement_arg = args.placement or "lpt"
    out = output_path(args.output, args.window, args.cost,
                      placement_arg if placement_arg.endswith(".json") else None)
    window = load_window(args.window)
    topo = topology_from_args(args)
    cost = cost_from_args(args)
    from routepack_opt.pipeline import with_replicas

    topo = with_replicas(topo, window.num_experts, cost, None, args.max_replica_bytes)
    objective = check_objective(args.objective)
    check_time_limit(args.time_limit, "--time-limit")
    if topo.redundant_experts:
        if args.placement is not None:
            raise InputError(f"--placement {args.placement}: with --redundant-experts the exact model chooses "
                             "the placement (replica counts and ranks); leave --placement out")
        if args.lexicographic:
            raise InputError("--lexicographic: the exact replica model minimises the makespan only; leave "
                             "--lexicographic out with --redundant-experts")
        return run_replicas(args, window, topo, cost, objective, out)
    # One clock for the whole command, started after the numba kernels are compiled or loaded:
    # R* and the warm start take their shares of --time-limit, the exact model (its
    # construction included) the rest.
    from routepack_opt.models import _solvers
    from routepack_opt.warmup import warm

    t_warm = time.perf_counter()
    warm(("plan", "exact"))
    _solvers.cp_model(), _solvers.highspy()  # their imports (seconds, once) are no part of the limit
    warmup_s = time.perf_counter() - t_warm
    t_start = time.perf_counter()
    placement, pl_kind = _placement(placement_arg, window, topo)
    rows, full_cert = certified_rows(window, topo, args.rows, min(10.0, 0.1 * args.time_limit), "auto")
    cert = full_cert.as_dict()
    ev = Evaluator(window, topo, cost)
    spent = time.perf_counter() - t_start
    warm_s = 0.5 * args.time_limit if args.warm_time is None else max(0.0, args.warm_time)
    warm_s = min(warm_s, max(0.0, 0.9 * args.time_limit - spent))
    layout0, warm_name = warm_start(window, topo, cost, placement, rows, objective, warm_s, ev, full_cert)
    warm_score = ev.score_layout(placement, layout0, objective)
    left = max(0.05 * args.time_limit, args.time_limit - (time.perf_counter() - t_start))
    res = solve_layout(window, topo, cost, placement, rows, objective, solver=args.solver,
                       time_limit=left, warm_start=layout0.arrays(),
                       options=ExactOptions(lexicographic=args.lexicographic), evaluator=ev)
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
              "decomposition": res.info.get("decomposition"), "model": res.info.get("model", "solved"),
              "certificate": cert, "warmup_seconds": warmup_s,
              "command_seconds": time.perf_counter() - t_start}
    if out is not None and res.row is not None:
        result["plan"] = _save_plan(out, ev, placement, res, rows, objective, pl_kind, f"exact-{args.solver}", cert)
    text = (f"exact ({args.solver}, {objective}, R={rows}, placement {pl_kind}): {res.status}\n"
            f"  makespan  {_fmt(res.objective)} µs\n  bound     {_fmt(res.bound)} µs\n"
            f"  gap       {res.gap:.3%}\n  time      {res.seconds:.2f} s (command "
            f"{result['command_seconds']:.2f} s; kernel warm-up before the clock {warmup_s:.2f} s)\n"
            f"  warm start ({warm_name}) {_fmt(warm_score.makespan)} µs")
    if result["decomposition"]:
        d = result["decomposition"]
        text += f"\n  cheap bound {_fmt(d['cheap_bound'])} µs, decomposition bound {_fmt(d['bound'])} µs"
    if result["model"] != "solved":
        text += f"\n  model     {result['model']}: the warm start with its certified bound"
    if "plan" in result:
        text += f"\n  plan      {result['plan']}"
    emit(args, result, text)
    return result


def run_replicas(args, window, topo, cost, objective, out) -> dict:
    """``exact --redundant-experts N``: the joint layout + replica placement model at rows R
    (default R*), warm-started from the heuristic's replicated plan (``solve(...,
    redundant_experts=N)`` for ``--warm-time`` seconds)."""
    from routepack_opt.core.evaluate import Evaluator
    from routepack_opt.models.layout import solve_layout_replicas
    from routepack_opt.pipeline import resolve_rows, solve
    from routepack_opt.warmup import warm

    warm(("plan", "replicas"))
    t_start = time.perf_counter()
    rows, cert = resolve_rows(window, topo, args.rows, min(10.0, 0.1 * args.time_limit))
    ev = Evaluator(window, topo, cost)
    warm_s = min(10.0, 0.1 * args.time_limit) if args.warm_time is None else max(0.0, args.warm_time)
    start, warm_makespan = None, None
    if warm_s > 0:
        hp = solve(window, topo, cost, objective=objective, rows=rows, time_limit=warm_s, certificate=cert,
                   redundant_experts=topo.redundant_experts)
        if hp.replicas is not None:
            start = (hp.layout.row, hp.layout.slot, hp.replicas)
            warm_makespan = ev.score_layout(hp.replicas, hp.layout, objective).makespan
    left = max(0.05 * args.time_limit, args.time_limit - (time.perf_counter() - t_start))
    res = solve_layout_replicas(window, topo, cost, rows, objective, solver=args.solver, time_limit=left,
                                warm_start=start, evaluator=ev)
    if res.status == "infeasible":
        raise InputError(f"no feasible layout with {rows} rows × {topo.dp} slots under capacity "
                         f"{topo.capacity}" + (f" ({res.info['reason']})" if "reason" in res.info else ""))
    result = {"status": res.status, "objective": res.objective, "bound": res.bound, "gap": res.gap,
              "seconds": res.seconds, "solver": args.solver, "objective_name": objective,
              "rows": rows, "placement": "exact-replicas", "lexicographic": False,
              "redundant_experts": topo.redundant_experts,
              "score": None if res.score is None else res.score.as_dict(),
              "lower_bound": ev.placement_free_lower_bound(rows, topo.redundant_experts),
              "rounding_error": res.rounding_error, "solver_makespan": res.claimed,
              "warm_start": {"method": "routepack" if start is not None else None, "makespan": warm_makespan},
              "certificate": cert, "command_seconds": time.perf_counter() - t_start}
    if res.placement is not None:
        result.update(res.placement.to_json())
    if out is not None and res.row is not None and res.slot is not None:
        result["plan"] = _save_plan(out, ev, res.placement, res, rows, objective, "exact-replicas",
                                    f"exact-replicas-{args.solver}", cert)
    text = (f"exact ({args.solver}, {objective}, R={rows}, {topo.redundant_experts} redundant experts, "
            f"layout and replicas): {res.status}\n"
            f"  makespan  {_fmt(res.objective)} µs\n  bound     {_fmt(res.bound)} µs\n"
            f"  gap       {res.gap:.3%}\n  time      {res.seconds:.2f} s\n"
            f"  warm start (routepack) {_fmt(warm_makespan)} µs")
    if "plan" in result:
        text += f"\n  plan      {result['plan']}"
    emit(args, result, text)
    return result


def _save_plan(out, ev, placement, res, rows: int, objective, kind: str, method: str, cert) -> str:
    """Write the exact layout as a plan (the one evaluator scores it; atomic write); its path."""
    from routepack_opt.pipeline import build_plan

    notes = {"method": method, "exact_status": res.status, "exact_bound": res.bound, "exact_gap": res.gap,
             "exact_seconds": res.seconds}
    if "decomposition" in res.info:  # the certified bound, and the cheap one it improves on
        notes["decomposition_bound"] = res.info["decomposition"]["bound"]
        notes["cheap_bound"] = res.info["decomposition"]["cheap_bound"]
    plan = build_plan(ev, placement, Layout(res.row, res.slot, rows), objective,
                      report=PlanReport(placement_kind=kind, notes=notes), certificate=cert)
    plan.save(out)
    return str(out)


def _fmt(x) -> str:
    return "—" if x is None else f"{x:,.1f}"

"""``routepack plan``: the full pipeline → PLAN.json."""

from __future__ import annotations

import contextlib
import os
import sys

from routepack_opt.cli.common import (
    add_cost,
    add_json,
    add_objective,
    add_topology,
    add_window,
    cost_from_args,
    emit,
    nonneg_int,
    output_path,
    positive_float,
    positive_int,
    topology_from_args,
)
from routepack_opt.core.errors import InputError
from routepack_opt.core.plan import check_placement, load_plan
from routepack_opt.core.window import load_window


def add_search_args(p) -> None:
    p.add_argument("--rows", type=positive_int,
                   help="force the rows R (default: chosen in [R*, R_max], R* the certified minimum)")
    p.add_argument("--time-limit", type=positive_float, help="search time limit in seconds (anytime)")
    p.add_argument("--max-sweeps", type=positive_int, help="sweep budget: with --seed, a bit-identical plan")
    p.add_argument("--seed", type=nonneg_int, default=0)
    p.add_argument("--config", metavar="PARAMS.toml",
                   help="planner parameters: [anneal], [joint], [refine], [certify], [seeds] (docs/cli.md)")


def load_params(args):
    """The ``--config`` file's :class:`PlannerParams` (the defaults without one)."""
    from routepack_opt.params import PlannerParams

    if not getattr(args, "config", None):
        return PlannerParams()
    return PlannerParams.from_toml(args.config)


def placement_arg(value: str, window):
    if value in ("lpt", "lpt-plain", "identity", "joint"):
        return value
    if value.endswith(".json") or os.path.lexists(value):  # lexists: never raises (a 300-byte name)
        return load_plan(value).expert_placement  # a Placement when the plan has replicas
    raise InputError(f"--placement must be lpt, lpt-plain, identity, joint or a PLAN.json, got {value!r}")


def planning_inputs(args):
    """(window, topology, cost, materialized placement or None, planner parameters) from the
    flags shared by ``plan`` and ``compare``."""
    window = load_window(args.window)
    topo = topology_from_args(args)
    cost = cost_from_args(args)
    current = load_plan(args.placement_from).placement if args.placement_from else None
    if current is not None:
        errs = check_placement(current, window.num_layers, window.num_experts)
        if errs:
            raise InputError(f"--placement-from {args.placement_from}: does not fit the window: {errs[0]}")
    return window, topo, cost, current, load_params(args)


@contextlib.contextmanager
def progress_bar(enabled: bool, label: str = "annealing"):
    """A rich progress bar on a terminal; a no-op callback otherwise."""
    if not enabled:
        yield None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn(label), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                  TimeElapsedColumn(), transient=True, console=None) as prog:
        task = prog.add_task(label, total=1.0)
        yield lambda frac: prog.update(task, completed=float(frac))


def register(sub) -> None:
    p = sub.add_parser("plan", help="the full pipeline: placement, R*, packing search → PLAN.json")
    add_window(p)
    add_topology(p)
    add_cost(p)
    add_objective(p)
    p.add_argument("--placement", default="lpt",
                   help="lpt (default: LPT + swap refinement), lpt-plain (Graham's LPT alone), identity, "
                   "joint (row-aware, searched with the packing), or PLAN.json to keep its placement")
    p.add_argument("--placement-from", metavar="PLAN.json",
                   help="the placement currently materialized: joint placement pays migration cost against it")
    add_search_args(p)
    p.add_argument("--max-rows", type=positive_int, metavar="R_MAX",
                   help="the most rows the plan may have (default R* + 4 row multiples, at most "
                   "N/D; [rows] in --config): below R*, or with no valid count under it, is exit 2, "
                   "never planned over; --rows above it is exit 2")
    p.add_argument("-o", "--output", metavar="PLAN.json", help="write the plan here")
    add_json(p)
    p.set_defaults(func=run)


def run(args) -> None:
    from routepack_opt.pipeline import solve

    out = output_path(args.output, args.window, args.cost, args.placement_from, args.config,
                      args.placement if args.placement.endswith(".json") else None)
    window, topo, cost, current, params = planning_inputs(args)
    placement = placement_arg(args.placement, window)
    from routepack_opt.warmup import default_jobs, groups_for, warm

    # a cold cache compiles in parallel workers
    warm(groups_for(placement, topo.redundant_experts), jobs=default_jobs())
    with progress_bar(sys.stderr.isatty() and not args.json) as cb:
        p = solve(window, topo, cost, objective=args.objective, placement=placement, rows=args.rows,
                  params=params, time_limit=args.time_limit, max_sweeps=args.max_sweeps,
                  seed=args.seed, progress=cb, current_placement=current,
                  max_replica_bytes=args.max_replica_bytes,
                  max_rows=args.max_rows)
    if out:
        p.save(out)
    r = p.report
    e = r.evaluation
    assert e is not None and r.timings is not None and p.certificate is not None  # solve() fills them
    seconds, warmup = r.timings["total"], r.timings.get("warmup", 0.0)
    res = {"path": str(out) if out else None, "rows": p.rows, "objective": p.objective,
           "makespan": e.makespan, "total": e.total, "peak": e.peak,
           "other_objective": e.other_objective, "other_makespan": e.other_makespan,
           "lower_bound": e.lower_bound, "gap": e.gap, "certificate": p.certificate,
           "force_balanced_lower_bound": e.force_balanced_lower_bound,
           "gap_force_balanced": e.gap_force_balanced, "redundant_experts": e.redundant_experts,
           "replica_bytes_per_rank": e.replica_bytes_per_rank,
           "rank_imbalance_median": e.rank_imbalance_median, "maxvio_mean": e.maxvio_mean,
           "placement": r.placement_kind, "seconds": seconds, "warmup_seconds": warmup,
           "fallback": r.fallback, "row_search": r.notes.get("row_search"),
           "baseline_check": r.notes.get("baseline_check")}
    cert = p.certificate
    rs, bc = res["row_search"], res["baseline_check"]
    rows_line = ""
    if rs:
        at_star = "" if rs["makespan_r_star"] is None else f", at R* {rs['makespan_r_star']:,.1f} µs"
        rows_line = (f"\n  rows: chose {rs['chosen']} of R*={rs['r_star']}..{rs['r_max']}: {rs['why']} "
                     f"(makespan {rs['makespan_chosen']:,.1f} µs{at_star})")
    if bc and bc.get("taken"):
        rows_line += f"\n  baseline taken: {bc['reason']}"
    text = (f"plan: R={p.rows} ({cert['status']} R*={cert['rows']} by {cert['method']}), "
            f"placement {r.placement_kind}, objective {p.objective}\n"
            f"  makespan {e.makespan:,.1f} µs  ({e.other_objective}: {e.other_makespan:,.1f})  "
            f"LB {e.lower_bound:,.1f}  gap {e.gap:.4f}  in {seconds:.2f} s"
            + (f" (+ {warmup:.1f} s numba warm-up, see routepack warmup)" if warmup >= 1.0 else "") + "\n"
            f"  force-balanced LB {e.force_balanced_lower_bound or 0:,.1f}  gap {e.gap_force_balanced or 0:.4f}  "
            f"EP-rank imbalance (max/mean per row and layer) median {e.rank_imbalance_median or 1:.4f}"
            + (f"\n  replicas: {e.redundant_experts} redundant slots per layer, "
               f"{e.replica_bytes_per_rank:,.0f} bytes of expert state added per rank"
               if e.redundant_experts else "")
            + rows_line
            + (f"\n  note: {r.fallback}" if r.fallback else "")
            + (f"\n  wrote {out}" if out else ""))
    emit(args, res, text)

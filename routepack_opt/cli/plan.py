"""``routepack plan``: the full pipeline → PLAN.json."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from routepack_opt.cli.common import (nonneg_int, positive_float, positive_int, add_cost, add_json, add_objective, add_topology, add_window,
                                      cost_from_args, emit, output_path, topology_from_args)
from routepack_opt.core.errors import InputError
from routepack_opt.core.plan import load_plan
from routepack_opt.core.window import load_window


def add_search_args(p) -> None:
    p.add_argument("--rows", type=positive_int, help="rows R (default: the certified minimum R*)")
    p.add_argument("--time-limit", type=positive_float, help="search time limit in seconds (anytime)")
    p.add_argument("--max-sweeps", type=positive_int, help="sweep budget: with --seed, a bit-identical plan")
    p.add_argument("--seed", type=nonneg_int, default=0)
    p.add_argument("--config", metavar="ANNEAL.toml", help="population-annealing parameters (TOML)")


def load_config(args):
    if not getattr(args, "config", None):
        return None
    from routepack_opt.heuristics.anneal import AnnealConfig

    return AnnealConfig.from_toml(args.config)


def placement_arg(value: str, window):
    if value in ("lpt", "lpt-plain", "identity", "joint"):
        return value
    if value.endswith(".json") or Path(value).exists():
        return load_plan(value).placement
    raise InputError(f"--placement must be lpt, lpt-plain, identity, joint or a PLAN.json, got {value!r}")


def planning_inputs(args):
    """(window, topology, cost, materialized placement or None, anneal config or None) from the
    flags shared by ``plan`` and ``compare``."""
    window = load_window(args.window)
    topo = topology_from_args(args)
    cost = cost_from_args(args)
    current = load_plan(args.placement_from).placement if args.placement_from else None
    if current is not None:
        from routepack_opt.core.plan import check_placement

        errs = check_placement(current, window.num_layers, window.num_experts)
        if errs:
            raise InputError(f"--placement-from {args.placement_from}: does not fit the window: {errs[0]}")
    return window, topo, cost, current, load_config(args)


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
    p.add_argument("--placement", default="lpt", help="lpt (default: LPT + swap refinement), lpt-plain (Graham's LPT alone), identity, "
                   "joint (row-aware, searched with the packing), or PLAN.json to keep its placement")
    p.add_argument("--placement-from", metavar="PLAN.json",
                   help="the placement currently materialized: joint placement pays migration cost against it")
    add_search_args(p)
    p.add_argument("-o", "--output", metavar="PLAN.json", help="write the plan here")
    add_json(p)
    p.set_defaults(func=run)


def run(args) -> None:
    from routepack_opt.pipeline import plan

    out = output_path(args.output, args.window, args.cost, args.placement_from, args.config,
                      args.placement if args.placement.endswith(".json") else None)
    window, topo, cost, current, cfg = planning_inputs(args)
    placement = placement_arg(args.placement, window)
    with progress_bar(sys.stderr.isatty() and not args.json) as cb:
        p = plan(window, topo, cost, args.objective, placement, args.rows, args.time_limit,
                 args.max_sweeps, args.seed, cfg, progress=cb, current_placement=current)
    if out:
        p.save(out)
    i = p.info
    res = {"path": str(out) if out else None, "rows": p.rows, "objective": p.objective,
           "makespan": i["makespan"], "total": i["total"], "peak": i["peak"],
           "other_objective": i["other_objective"], "other_makespan": i["other_makespan"],
           "lower_bound": i["lower_bound"], "gap": i["gap"], "certificate": p.certificate,
           "placement": i.get("placement_kind"), "seconds": i["timings"]["total"],
           "warmup_seconds": i["timings"].get("warmup", 0.0),
           "fallback": i.get("fallback")}
    text = (f"plan: R={p.rows} ({p.certificate['status']} R*={p.certificate['rows']} by {p.certificate['method']}), "
            f"placement {i.get('placement_kind')}, objective {p.objective}\n"
            f"  makespan {i['makespan']:,.1f} µs  ({i['other_objective']}: {i['other_makespan']:,.1f})  "
            f"LB {i['lower_bound']:,.1f}  gap {i['gap']:.4f}  in {i['timings']['total']:.2f} s"
            + (f" (+ {i['timings']['warmup']:.1f} s numba warm-up, see routepack warmup)"
               if i["timings"].get("warmup", 0.0) >= 1.0 else "")
            + (f"\n  note: {i['fallback']}" if i.get("fallback") else "")
            + (f"\n  wrote {out}" if out else ""))
    emit(args, res, text)

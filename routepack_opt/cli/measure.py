"""``routepack measure``: run a plan's kernels with torch and compare with the cost model."""

from __future__ import annotations

from routepack_opt.cli.common import add_json, emit, positive_int, scale_float
from routepack_opt.core.cost import resolve_cost
from routepack_opt.core.errors import InputError
from routepack_opt.core.plan import load_plan
from routepack_opt.core.window import load_window


def register(sub) -> None:
    p = sub.add_parser("measure", help="time every cell and expert workload of a plan with torch; "
                       "measured vs predicted makespan",
                       description="Executes every cell's attention and every (row, shard, layer, rank) "
                       "expert workload with real torch kernels on a scaled-down window, composes the "
                       "step time under both objectives, and compares with the evaluator's prediction.")
    p.add_argument("window", metavar="W.npz")
    p.add_argument("plan", metavar="PLAN.json")
    p.add_argument("--cost", metavar="COST.toml",
                   help="cost from `routepack calibrate` on the same device and --layers "
                   "(default: calibrate now)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--layers", type=positive_int, default=2, help="MoE layers measured (the first ones; default 2)")
    p.add_argument("--scale", type=scale_float, help="divide lengths and counts by this (default: chosen "
                   "so the scaled window stays small)")
    p.add_argument("--quick", action="store_true", help="a smaller model (seconds; for tests)")
    add_json(p)
    p.set_defaults(func=run)


def run(args) -> None:
    from routepack_opt.runtime.bench import bench_config, measure_plan, resolve_device

    window = load_window(args.window)
    plan = load_plan(args.plan, num_samples=window.num_samples)
    if args.layers < 1:
        raise InputError(f"--layers must be ≥ 1, got {args.layers}")
    if args.scale is not None and not args.scale >= 1:
        raise InputError(f"--scale must be ≥ 1, got {args.scale}")
    cost = resolve_cost(args.cost) if args.cost else None
    dev = resolve_device(args.device)
    cfg = bench_config(dev.type, quick=args.quick, layers=args.layers)
    rep = measure_plan(window, plan, cost, str(dev), cfg, scale=args.scale, layers=args.layers)
    lines = [f"measured plan on {rep['device']}: R={rep['rows']} × D={rep['dp']} cells, "
             f"{rep['expert_workloads']} expert workloads, {rep['layers']} layers, scale 1/{rep['scale']:g} "
             f"({rep['scaled_tokens']:,} tokens), {rep['seconds']} s"]
    for obj, o in rep["objectives"].items():
        lines.append(f"  {obj:8s} measured {o['measured_us']:,.0f} µs  predicted {o['predicted_us']:,.0f} µs  "
                     f"ratio {o['ratio']:.3f}")
    lines.append(f"  J[r,g] R² {rep['J_r2']:.4f} (mean |rel err| {rep['J_rel_err_mean']:.3f}); "
                 f"corr² measured vs model: attention cells {rep['attention_cell_corr2']:.4f}, "
                 f"expert workloads {rep['expert_workload_corr2']:.4f}")
    if rep.get("calibration"):
        c = rep["calibration"]
        lines.append(f"  calibrated now: attention R² {c['attention_r2']:.4f}, experts R² {c['expert_r2']:.4f}")
    lines += [f"  note: {n}" for n in rep["notes"]]
    emit(args, rep, "\n".join(lines))

"""``routepack calibrate``: fit the cost coefficients from torch measurements on a device."""

from __future__ import annotations

import math

from routepack_opt.cli.common import add_json, emit, nonneg_int, output_path, positive_int
from routepack_opt.core.cost import save_cost
from routepack_opt.core.errors import InputError


def register(sub) -> None:
    p = sub.add_parser("calibrate", help="fit alpha, beta, gamma, row_overhead from torch kernels",
                       description="Time attention (per-sample causal SDPA over packed micro-batches) "
                       "and expert SwiGLU GEMMs, forward + backward, on a small model; fit the cost "
                       "model by non-negative least squares; write it as TOML.")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("-o", "--output", required=True, metavar="COST.toml")
    p.add_argument("--layers", type=positive_int, default=2,
                   help="transformer layers the cost file describes (alpha, beta, row_overhead scale with it)")
    p.add_argument("--experts-per-rank", type=positive_int, default=4,
                   help="local experts per EP rank (E/P of the plans to be measured; default 4)")
    p.add_argument("--all-to-all-us", type=float, default=0.0, metavar="US",
                   help="latency of one EP dispatch + combine pair (µs), added twice per layer to the measured "
                   "row_overhead: one process cannot measure it (DeepEP's published low-latency figure at EP 8 "
                   "is 77 + 114 = 191; default 0: kernels only)")
    p.add_argument("--quick", action="store_true", help="a smaller model and grid (seconds; for tests)")
    p.add_argument("--seed", type=nonneg_int, default=0)
    add_json(p)
    p.set_defaults(func=run)


def run(args) -> None:
    from routepack_opt.runtime.bench import bench_config, calibrate, resolve_device

    if args.layers < 1:
        raise InputError(f"--layers must be ≥ 1, got {args.layers}")
    if args.experts_per_rank < 1:
        raise InputError(f"--experts-per-rank must be ≥ 1, got {args.experts_per_rank}")
    if not (math.isfinite(args.all_to_all_us) and args.all_to_all_us >= 0):
        raise InputError(f"--all-to-all-us must be a finite number ≥ 0, got {args.all_to_all_us}")
    out = output_path(args.output)
    dev = resolve_device(args.device)
    cfg = bench_config(dev.type, quick=args.quick, layers=args.layers, seed=args.seed,
                       experts_per_rank=args.experts_per_rank)
    cost, rep = calibrate(str(dev), cfg, all_to_all_us=args.all_to_all_us)
    save_cost(cost, out)
    rep["output"] = str(out)
    a, e, ro = rep["attention"], rep["expert"], rep["row_overhead"]
    text = (f"calibrated on {rep['device']} ({rep['dtype']}, {rep['clock']}, {rep['seconds']} s) → {out}\n"
            f"  attention: alpha {a['coef']['alpha']:.4g} µs/token, beta {a['coef']['beta']:.4g} µs/token², "
            f"intercept {a['coef']['intercept']:.4g} µs per layer; R² {a['r2']:.4f}, "
            f"|rel. residual| median {a['rel_residual_median']:.3f} max {a['rel_residual_max']:.3f} "
            f"({a['points']} points)\n"
            f"  experts:   gamma {e['coef']['gamma']:.4g} µs/routed token, intercept {e['coef']['intercept']:.4g} µs "
            f"per rank-layer; R² {e['r2']:.4f}, |rel. residual| median {e['rel_residual_median']:.3f} "
            f"max {e['rel_residual_max']:.3f} ({e['points']} points)\n"
            f"  row_overhead: measured {ro['measured_kernels_us']:.4g} µs (a one-token micro-batch's kernels "
            f"× {cfg.layers} layers; fit intercepts {ro['fit_intercepts_us']:.4g})"
            f" + all-to-all {ro['all_to_all_total_us']:.4g} µs (given)\n"
            f"  cost file ({cfg.layers} layers): alpha {cost.stages[0].alpha:.4g}, beta {cost.stages[0].beta:.4g}, "
            f"gamma {cost.gamma:.4g}, row_overhead {cost.row_overhead:.4g}")
    emit(args, rep, text)

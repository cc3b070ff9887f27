"""``routepack gen-trace``: a synthetic routing-replay window, streamed to disk."""

from __future__ import annotations

import time

from routepack_opt.cli.common import add_json, emit, nonneg_float, nonneg_int, output_path, positive_float, positive_int
from routepack_opt.core.cost import PRESETS
from routepack_opt.core.errors import InputError
from routepack_opt.trace import DEFAULT_DISPERSION, write_trace


def register(sub) -> None:
    p = sub.add_parser("gen-trace", help="synthetic routing-replay window (.npz)",
                       description="Generate a synthetic RL routing-replay window shaped like a preset "
                       "model. Defaults are the calibrated single-task setting: routing dispersion "
                       f"{DEFAULT_DISPERSION} at 64 tokens, per-layer skew of real models.")
    p.add_argument("--preset", default="qwen3-30b-a3b", help=f"model preset ({', '.join(PRESETS)})")
    p.add_argument("--samples", type=positive_int, default=1024, help="samples N (default 1024)")
    p.add_argument("--seed", type=nonneg_int, default=0)
    p.add_argument("--step", type=nonneg_int, default=0, help="optimizer step (routing drifts with it)")
    p.add_argument("--staleness", type=nonneg_int, default=0, help="route with the policy of step - K")
    p.add_argument("--layers", type=positive_int, help="override MoE layers L")
    p.add_argument("--experts", type=positive_int, help="override experts E")
    p.add_argument("--top-k", type=positive_int, help="override router top-k")
    p.add_argument("--capacity", type=positive_int, help="override capacity (max sample length)")
    p.add_argument("--skew", type=positive_float, help="median busiest/mean expert load per layer "
                   "(default: the preset's real-data figure)")
    p.add_argument("--dispersion", type=positive_float, metavar="TARGET",
                   help=f"routing dispersion at 64 tokens to hit (co-activation; default {DEFAULT_DISPERSION}, "
                   "≈1 = samples route like the aggregate; see `routepack stats`)")
    p.add_argument("--domains", metavar="olmoe|mixtral|K",
                   help="mixture of domains: real OLMoE (E=64) / Mixtral (E=8) per-domain profiles, "
                   "or K synthetic domains")
    p.add_argument("--length-sigma", type=nonneg_float, help="log-normal spread of response lengths")
    p.add_argument("--uniform", action="store_true", help="control: uniform routing, equal lengths")
    p.add_argument("-o", "--output", required=True, metavar="W.npz")
    add_json(p)
    p.set_defaults(func=run)


def run(args) -> None:
    if args.preset not in PRESETS:
        raise InputError(f"unknown preset '{args.preset}' (known: {', '.join(PRESETS)})")
    for name in ("samples", "seed", "step", "staleness"):
        if getattr(args, name) < (1 if name == "samples" else 0):
            raise InputError(f"--{name} must be ≥ {1 if name == 'samples' else 0}, got {getattr(args, name)}")
    out = output_path(args.output)
    if out.is_dir():
        raise InputError(f"{out}: is a directory, not an output file")
    domains = args.domains
    if domains is not None and domains.isdigit():
        domains = int(domains)
    overrides = {k: v for k, v in dict(num_layers=args.layers, num_experts=args.experts,
                                        top_k=args.top_k, capacity=args.capacity, skew=args.skew,
                                        dispersion=args.dispersion, domains=domains,
                                        length_sigma=args.length_sigma).items()
                 if v is not None}
    if args.uniform:
        overrides["uniform"] = True
    t0 = time.perf_counter()
    res = write_trace(out, args.preset, args.samples, args.seed, step=args.step,
                      routing_step=max(args.step - args.staleness, 0), **overrides)
    res["seconds"] = time.perf_counter() - t0
    emit(args, res, f"wrote {out}: N={res['samples']} L={res['layers']} E={res['experts']} "
         f"k={res['top_k']} tokens={res['tokens']} len mean {res['mean_length']:.0f} max "
         f"{res['max_length']} expert-load CV {res['expert_load_cv']:.2f} busiest/mean "
         f"{res['skew_max_over_mean']:.2f} ({res['seconds']:.2f} s)")

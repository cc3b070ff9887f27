"""``routepack gen-trace``: a synthetic routing-replay window."""

from __future__ import annotations

import time

import numpy as np

from routepack_opt.cli.common import nonneg_float, nonneg_int, positive_int, add_json, emit, output_path
from routepack_opt.cost import PRESETS
from routepack_opt.errors import InputError
from routepack_opt.trace import generate_window
from routepack_opt.window import save_window


def register(sub) -> None:
    p = sub.add_parser("gen-trace", help="synthetic routing-replay window (.npz)",
                       description="Generate a synthetic RL routing-replay window shaped like a preset model.")
    p.add_argument("--preset", default="qwen3-30b-a3b", help=f"model preset ({', '.join(PRESETS)})")
    p.add_argument("--samples", type=positive_int, default=1024, help="samples N (default 1024)")
    p.add_argument("--seed", type=nonneg_int, default=0)
    p.add_argument("--step", type=nonneg_int, default=0, help="optimizer step (routing drifts with it)")
    p.add_argument("--staleness", type=nonneg_int, default=0, help="route with the policy of step - K")
    p.add_argument("--layers", type=positive_int, help="override MoE layers L")
    p.add_argument("--experts", type=positive_int, help="override experts E")
    p.add_argument("--top-k", type=positive_int, help="override router top-k")
    p.add_argument("--capacity", type=positive_int, help="override capacity (max sample length)")
    p.add_argument("--skew", type=nonneg_float, help="expert popularity skew (sd of log popularity)")
    p.add_argument("--length-sigma", type=nonneg_float, help="log-normal spread of response lengths")
    p.add_argument("--uniform", action="store_true", help="control: uniform routing, equal lengths")
    p.add_argument("-o", "--output", required=True, metavar="W.npz")
    add_json(p)
    p.set_defaults(func=run)


def run(args) -> None:
    if args.preset not in PRESETS:
        raise InputError(f"unknown preset '{args.preset}' (known: {', '.join(PRESETS)})")
    out = output_path(args.output)
    overrides = {k: v for k, v in dict(num_layers=args.layers, num_experts=args.experts,
                                        top_k=args.top_k, capacity=args.capacity,
                                        expert_skew=args.skew, length_sigma=args.length_sigma).items()
                 if v is not None}
    if args.uniform:
        overrides["uniform"] = True
    t0 = time.perf_counter()
    w = generate_window(args.preset, args.samples, args.seed, step=args.step,
                        routing_step=max(args.step - args.staleness, 0), **overrides)
    save_window(w, out)
    load = w.expert_loads()
    cv = float((load.std(axis=1) / load.mean(axis=1)).mean())
    res = {"path": str(out), "samples": w.num_samples, "layers": w.num_layers,
           "experts": w.num_experts, "top_k": w.top_k, "tokens": w.total_tokens,
           "max_length": int(w.lengths.max()), "mean_length": float(w.lengths.mean()),
           "expert_load_cv": cv, "seconds": time.perf_counter() - t0}
    emit(args, res, f"wrote {out}: N={w.num_samples} L={w.num_layers} E={w.num_experts} k={w.top_k} "
         f"tokens={w.total_tokens} len mean {np.mean(w.lengths):.0f} max {w.lengths.max()} "
         f"expert-load CV {cv:.2f} ({res['seconds']:.2f} s)")

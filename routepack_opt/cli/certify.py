"""``routepack certify``: the certified minimum rows R* of a window (docs/pipeline.md, step 2)."""

from __future__ import annotations

from routepack_opt.cli.common import (
    add_json,
    add_topology,
    add_window,
    emit,
    positive_float,
    topology_from_args,
    window_from_args,
)
from routepack_opt.core.checks import check_time_limit


def register(sub) -> None:
    p = sub.add_parser("certify", help="certified minimum rows R* (micro-batches per DP slot)",
                       description="Least R with R ≥ min_rows, R % row_multiple == 0 and a layout of "
                       "the window's samples into R rows × D slots under the token cap: bounds "
                       "(L1, L2, DFF) and FFD/BFD/MBS' first, exact bin packing (arc-flow MILP / "
                       "CP-SAT) only where they do not close.")
    add_window(p)
    add_topology(p)
    p.add_argument("--time-limit", type=positive_float, default=10.0, metavar="S",
                   help="seconds for the exact models (default 10)")
    p.add_argument("--method", choices=["auto", "cpsat", "arcflow"], default="auto",
                   help="exact model where bounds do not close (default auto)")
    add_json(p)
    p.set_defaults(func=run)


def run(args) -> dict:
    from routepack_opt.certify import certify_rows

    check_time_limit(args.time_limit, "--time-limit")
    topo = topology_from_args(args)
    window = window_from_args(args)
    from routepack_opt.warmup import warm

    warm(("plan", "exact"))  # compile/load the bounds, packings, arc-flow and knapsack pricing off the clock
    cert = certify_rows(window, topo, time_limit=args.time_limit, method=args.method)
    result = cert.as_dict()
    proved = "proved optimal" if cert.status == "optimal" else f"best known; proved ≥ {cert.lower_bound}"
    text = (f"R* = {cert.rows} rows ({proved}) by {cert.method} in {cert.seconds * 1e3:.1f} ms\n"
            f"  N={window.num_samples} samples, D={topo.dp}, capacity {topo.capacity:,}; "
            f"bins: lower bound {cert.bins_lower_bound}, best packing {cert.bins_upper_bound}; "
            f"{cert.detail}")
    emit(args, result, text)
    return result

"""``routepack replay-report``: what RoutePack would save on every step of a recorded run, in
parallel on Ray (``routepack_opt.report_run``, ``routepack_opt.integrations.ray``)."""

from __future__ import annotations

import sys

from routepack_opt.cli.common import (
    add_cost,
    add_json,
    add_objective,
    add_topology,
    cost_from_args,
    emit,
    nonneg_int,
    positive_float,
    positive_int,
    topology_from_args,
)
from routepack_opt.core.errors import InputError


def register(sub) -> None:
    p = sub.add_parser("replay-report", help="a whole run: saving per step over the frameworks' packers (Ray)",
                       description="Plan every window of RUN_DIR (one per optimizer step, in name order) and "
                       "judge it against the frameworks' own packers (verl, NeMo-RL FFD/MFFD, slime) with the "
                       "one evaluator; windows run in parallel on Ray. Writes OUT_DIR/steps.jsonl (one line "
                       "per window, appended as each finishes; a rerun skips the windows already there) "
                       "OUT_DIR/summary.json (seconds saved, planning seconds, net, options) and OUT_DIR/report.html. "
                       "Without a terminal, progress goes to stderr as 'k/N windows' lines with the time left.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="one window per step: .npz windows, or replay files "
                   "with --format")
    p.add_argument("-o", "--output", required=True, metavar="OUT_DIR", help="report directory (created)")
    add_topology(p)
    add_cost(p)
    add_objective(p)
    g = p.add_argument_group("search (per window)")
    g.add_argument("--time-limit", type=positive_float, help="search time limit per window (anytime; results "
                   "then depend on the machine's speed); default: the seams' per-step budget (0.1 s as verl's "
                   "seam, 0.25 s with --format slime), unless --max-sweeps is given")
    g.add_argument("--max-sweeps", type=positive_int, help="sweep budget per window: with --seed and no "
                   "--time-limit, the same numbers on any number of workers")
    g.add_argument("--seed", type=nonneg_int, default=0)
    g.add_argument("--config", metavar="PARAMS.toml", help="planner parameters (as for plan)")
    r = p.add_argument_group("Ray")
    r.add_argument("--workers", type=positive_int, help="start a local Ray cluster of N CPUs (default 1)")
    r.add_argument("--address", metavar="ADDR", help="join a running Ray cluster (auto, host:port, "
                   "ray://host:port); RUN_DIR and OUT_DIR's parent must be at the same path on its nodes")
    f = p.add_argument_group("input format")
    f.add_argument("--format", choices=["window", "slime", "verl", "routes"], default="window",
                   help="window: our .npz (default); else the routes import-replay reads")
    f.add_argument("--num-experts", type=positive_int, help="logical experts E (replay formats)")
    f.add_argument("--moe-layer-freq", help="Megatron's moe_layer_freq (replay formats; as import-replay)")
    f.add_argument("--top-k", type=positive_int, help="expected router top-k (replay formats; checked)")
    p.add_argument("--retry-errors", action="store_true", help="plan again the windows recorded with an error")
    add_json(p)
    p.set_defaults(func=run)


def search_budget(args) -> tuple[float | None, str]:
    """(time limit per window, where it came from): ``--time-limit`` as given; with neither it nor
    ``--max-sweeps``, the per-step budget the seams plan with by default
    (:data:`routepack_opt.integrations._seam.DEFAULT_TIME_LIMIT`: verl's, or slime's for
    ``--format slime``), so that the report predicts what a seam would save; with ``--max-sweeps``
    alone, no time limit (the numbers do not depend on the machine)."""
    if args.time_limit is not None:
        return args.time_limit, "given with --time-limit"
    if args.max_sweeps is not None:
        return None, "given with --max-sweeps"
    from routepack_opt.integrations._seam import DEFAULT_TIME_LIMIT

    seam = "slime" if args.format == "slime" else "verl"
    return DEFAULT_TIME_LIMIT[seam], (f"the {seam} seam's default per-step budget (give --time-limit or "
                                      "--max-sweeps to change it)")


def run(args) -> None:
    from routepack_opt.cli.import_replay import _freq
    from routepack_opt.cli.plan import load_params
    from routepack_opt.report_run import ReportConfig, check_dirs, list_windows

    if args.workers is not None and args.address is not None:
        raise InputError("give --workers N (a local cluster) or --address ADDR (a running one), not both")
    time_limit, source = search_budget(args)
    cfg = ReportConfig(topology=topology_from_args(args), cost=cost_from_args(args), objective=args.objective,
                       params=load_params(args), time_limit=time_limit, max_sweeps=args.max_sweeps,
                       seed=args.seed, format=args.format, num_experts=args.num_experts,
                       moe_layer_freq=_freq(args.moe_layer_freq), top_k=args.top_k, cost_name=args.cost,
                       budget_source=source)
    check_dirs(args.run_dir, args.output)  # before Ray starts: bad paths cost nothing
    paths = list_windows(args.run_dir, args.format)
    if cfg.topology.redundant_experts or args.max_replica_bytes is not None:
        # E + N divisible by P and the replicas' bytes per rank, on the first readable window,
        # before Ray starts (an unreadable window, or a later one with another E, is recorded with
        # its error, as any bad window)
        from routepack_opt.pipeline import with_replicas
        from routepack_opt.report_run import load_step_window

        for path in paths:
            try:
                num_experts = load_step_window(path, cfg).num_experts
            except InputError:
                continue
            with_replicas(cfg.topology, num_experts, cfg.cost, None, args.max_replica_bytes)
            break
    from routepack_opt.integrations._ray_cluster import _check_reachable
    from routepack_opt.integrations.ray import run_report

    if args.address is not None:
        _check_reachable(args.address)

    res = run_report(args.run_dir, args.output, cfg, workers=args.workers, address=args.address,
                     retry_errors=args.retry_errors,
                     progress="bar" if (sys.stderr.isatty() and not args.json) else "lines")
    s = res["summary"]
    pct = lambda x: "–" if x is None else f"{100 * x:+.2f}%"
    rs = res["run_summary"]
    text = (f"replay-report: net {rs['net_seconds_saved']:+.2f} s over the run ({rs['seconds_saved']:.2f} s "
            f"predicted saved − {rs['planning_seconds']:.2f} s planning)\n"
            f"  {res['windows']} windows ({res['planned']} planned now, {res['skipped']} already in "
            f"steps.jsonl, {s['failed']} failed) in {res['seconds']:.1f} s\n"
            f"  saving over the best cap-keeping baseline: mean {pct(s['mean_saving'])}, median "
            f"{pct(s['median_saving'])}; rows saved {s['rows_saved']}\n"
            f"  wrote {res['steps']}, {res['summary_json']} and {res['report']}")
    text += f"\n  budget: {cfg.budget()}"
    emit(args, res, text)
    for note in res.get("notes", []):
        print(f"note: {note}", file=sys.stderr)
    if s["failed"]:
        print(f"note: {s['failed']} window(s) failed; their error is in steps.jsonl "
              "(--retry-errors plans them again)", file=sys.stderr)

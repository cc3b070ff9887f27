"""``routepack evaluate``: validate a plan and score it with the one evaluator."""

from __future__ import annotations

import dataclasses

from routepack_opt.cli.common import add_cost, add_json, add_window, cost_from_args, emit, nonneg_int
from routepack_opt.core.errors import InputError
from routepack_opt.core.evaluate import evaluate_plan
from routepack_opt.core.plan import load_plan
from routepack_opt.core.window import load_window


def register(sub) -> None:
    p = sub.add_parser("evaluate", help="validate a plan and score it (both objectives, LB, gap)")
    add_window(p)
    p.add_argument("plan", metavar="PLAN.json")
    add_cost(p)
    p.add_argument("--objective", choices=["max-sum", "sum-max"],
                   help="objective to report first (default: the plan's)")
    p.add_argument("--equal-samples-per-slot", action="store_true",
                   help="also require every DP slot to hold N/D samples (on anyway when the plan's "
                        "topology says so)")
    p.add_argument("--redundant-experts", type=nonneg_int, metavar="N",
                   help="require the plan to have N redundant expert slots per layer (the plan's "
                        "topology says how many it has)")
    add_json(p)
    p.set_defaults(func=run)


def run(args) -> None:
    window = load_window(args.window)
    plan = load_plan(args.plan, num_samples=window.num_samples)
    plan.topology.check_experts(window.num_experts)
    if args.redundant_experts is not None and args.redundant_experts != plan.topology.redundant_experts:
        raise InputError(f"--redundant-experts {args.redundant_experts}: the plan has "
                         f"{plan.topology.redundant_experts} redundant expert slots per layer")
    if args.equal_samples_per_slot and not plan.topology.equal_samples_per_slot:
        plan = dataclasses.replace(plan, topology=dataclasses.replace(plan.topology, equal_samples_per_slot=True))
    plan.topology.check_samples(window.num_samples)
    ev = evaluate_plan(window, plan, cost_from_args(args), args.objective)
    rep = ev.report()
    rep.update(rows=plan.rows, valid=True)
    text = (f"valid plan: R={plan.rows} rows × D={plan.topology.dp} slots, objective {rep['objective']}\n"
            f"  makespan {rep['makespan']:,.1f} µs   total {rep['total']:,.1f}   peak {rep['peak']:,.1f}\n"
            f"  {rep['other_objective']} makespan {rep['other_makespan']:,.1f} µs\n"
            f"  lower bound {rep['lower_bound']:,.1f} µs (placement-free {rep['placement_free_lower_bound']:,.1f})"
            f"   gap {rep['gap']:.4f}\n"
            f"  force-balanced bound {rep['force_balanced_lower_bound']:,.1f} µs   gap "
            f"{rep['gap_force_balanced']:.4f}   EP-rank imbalance median {rep['rank_imbalance_median']:.4f} "
            f"(MaxVio mean {rep['maxvio_mean']:.4f})"
            + (f"\n  replicas: {rep['redundant_experts']} redundant slots per layer, "
               f"{rep['replica_bytes_per_rank']:,.0f} bytes added per rank" if rep['redundant_experts'] else ""))
    emit(args, rep, text)

"""Side-by-side comparison of plans (``routepack compare`` and the demo).

Rows: ``baseline`` (identity placement + length-only packing), ``reorder`` (LPT + the same
packing), ``routepack`` (LPT + population annealing), and where available ``joint`` /
``joint-sticky`` (row-aware placement searched with packing, without / with migration cost) and
``exact`` (the exact layout model seeded with routepack's plan: proved on small windows; at any
size the best plan with its certified bound). Every number comes from the one evaluator; with the
exact row, every plan also shows its gap to the certified decomposition bound for its own
placement (``models/layout_dw.py``: its attention part holds for every placement).
"""

from __future__ import annotations

import numpy as np
from rich.table import Table

from routepack_opt.core.cost import CostModel
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.core.layout import Layout
from routepack_opt.core.objective import Objective
from routepack_opt.core.plan import Plan
from routepack_opt.core.report import PlanReport
from routepack_opt.core.timing import Timings
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import Window
from routepack_opt.heuristics.baselines import BASELINES
from routepack_opt.heuristics.placement.lpt import rank_load_cv
from routepack_opt.models.layout import solve_layout  # its solver libraries load on first solve
from routepack_opt.models.layout_dw import bound_with_attention
from routepack_opt.params import PlannerParams
from routepack_opt.pipeline import (
    DEFAULT_PARAMS,
    SharedPacker,
    build_plan,
    certified_rows,
    resolve_placement,
    solve,
    with_replicas,
)

__all__ = ["plan_metrics", "compare_plans", "format_table"]


def plan_metrics(ev: Evaluator, plan: Plan, objective: Objective, seconds: float) -> dict:
    """Makespans under both objectives, LB gap, EP-rank CV, worst row-local EP peak, attention tail."""
    pl = plan.placement
    e = ev.evaluate_layout(pl, plan.layout, objective)
    J, A_SRG, M_RGL = ev.costs(pl, plan.row, plan.slot, plan.rows, parts=True)
    if plan.replicas is None:
        cv = rank_load_cv(ev.window.expert_loads(), plan.placement.first_slots, ev.topology.ep)
    else:  # the ranks' window totals under the replica rule
        Lagg_LP = ev.block_loads(pl, plan.row, plan.slot, plan.rows).reshape(
            -1, ev.window.num_layers, ev.topology.ep).sum(axis=0).astype(float)
        cv = float((Lagg_LP.std(axis=1) / np.maximum(Lagg_LP.mean(axis=1), 1e-12)).mean())
    return {"makespan_max_sum": e.scores["max-sum"].makespan,
            "makespan_sum_max": e.scores["sum-max"].makespan,
            "makespan": e.score.makespan, "lower_bound": e.lower_bound, "gap": e.gap,
            "ep_rank_cv": cv, "force_balanced_lower_bound": e.force_balanced_lower_bound,
            "gap_force_balanced": e.gap_force_balanced,
            "rank_imbalance_median": e.imbalance.median if e.imbalance else None,
            "row_ep_peak": float(M_RGL.max()),
            "expert_tail": float(ev.cost.gamma * M_RGL.sum()),
            "attention_tail": float(A_SRG.sum(axis=0).max()),
            "rows": plan.rows, "plan_seconds": seconds}


def compare_plans(window: Window, topology: Topology, cost: CostModel, *, objective: str = "max-sum",
                  rows: int | None = None, params: PlannerParams = DEFAULT_PARAMS,
                  time_limit: float | None = None, max_sweeps: int | None = None, seed: int = 0,
                  exact: bool | None = None, exact_time_limit: float = 30.0, joint: bool = True,
                  current_placement=None, progress=None, redundant_experts: int | None = None,
                  max_replica_bytes: float | None = None) -> tuple[list[dict], dict[str, Plan]]:
    """Plans for every row of the comparison and their metrics (first row = baseline). Every
    searched row is :func:`routepack_opt.solve` with the same ``params``, budget and seed, at the
    same R (certified once; its time is added to every row's). With redundant expert slots
    (``redundant_experts`` or ``topology.redundant_experts``) every row's placement has replicas,
    an ``eplb`` row (DeepSeek EPLB's replicas + the length-only packing) is added, and the exact
    row is left out (its layout model has no replicas). ``exact=None`` (auto) adds the exact row
    at any size: the exact model where it fits, else routepack's plan with the certified bound,
    within ``exact_time_limit``."""
    topology = with_replicas(topology, window.num_experts, cost, redundant_experts, max_replica_bytes)
    ev = Evaluator(window, topology, cost)
    timings = Timings()
    with timings.stage("certify"):
        R, full = certified_rows(window, topology, rows, 10.0, "auto")
        cert = full.as_dict()
    plans: dict[str, Plan] = {}
    base_fn = BASELINES["verl-kk"]
    # on tight windows the baselines' last resort is the certificate's packing, not a new one
    exact_pack = SharedPacker(window.lengths, topology.capacity, full.packing_N)
    fixed = [("baseline", "identity"), ("reorder", "lpt")]
    if topology.redundant_experts:
        fixed.append(("eplb", "eplb"))
        exact = False
    for name, kind in fixed:
        with timings.stage(name):
            pl, _ = resolve_placement(window, topology, kind)
            layout = Layout(*base_fn(window.lengths, topology, R, exact_pack=exact_pack), R)
            plans[name] = build_plan(ev, pl, layout, objective,
                                     report=PlanReport(notes={"packing": "verl-kk"}), certificate=cert)
    searched = {"routepack": dict(placement="lpt", progress=progress)}
    if joint:
        searched["joint"] = dict(placement="joint")
        if current_placement is not None:
            searched["joint-sticky"] = dict(placement="joint", current_placement=current_placement)
    for name, options in searched.items():
        with timings.stage(name):
            plans[name] = solve(window, topology, cost, objective=objective, rows=R, params=params,
                                time_limit=time_limit, max_sweeps=max_sweeps, seed=seed,
                                certificate=full, **options)
    secs = {name: timings.seconds[name] + timings.seconds["certify"] for name in plans}
    if exact is None:
        exact = True
    certified_attention = None
    if exact:
        rp = plans["routepack"]
        with timings.stage("exact"):
            res = solve_layout(window, topology, cost, rp.placement, R, objective, solver="cpsat",
                               time_limit=exact_time_limit, warm_start=rp.layout.arrays())
        if res.row is not None:
            plans["exact"] = build_plan(ev, rp.placement, Layout(res.row, res.slot, R), objective,
                                        report=PlanReport(notes={"status": res.status, "bound": res.bound}),
                                        certificate=cert)
            secs["exact"] = timings.seconds["exact"]
        dw = res.info.get("decomposition")
        if dw is not None:
            certified_attention = max(dw["attention"], dw["cheap_attention"])
    table = []
    base = None
    for name, p in plans.items():
        m = plan_metrics(ev, p, objective, secs[name])
        base = base or m["makespan"]
        m["gain"] = (base - m["makespan"]) / base
        m["name"] = name
        if name == "exact":
            m["status"] = p.report.notes.get("status")
        m["certified_bound"] = _certified_bound(ev, p, m, certified_attention)
        m["gap_certified"] = None if m["certified_bound"] is None else m["makespan"] / m["certified_bound"]
        if p.report.joint is not None and p.report.joint.migration:
            m["experts_moved"] = p.report.joint.migration.get("experts_moved")
            m["bytes_moved"] = p.report.joint.migration.get("bytes_total")
        table.append(m)
    return table, plans


def _certified_bound(ev: Evaluator, plan: Plan, metrics: dict, attention: float | None) -> float | None:
    """The certified bound for ``plan``'s own placement at its rows (the exact row: the model's
    bound, which may be stronger), never below the plan's docs/model.md bound; None without the
    decomposition or with replicas."""
    if attention is None or plan.replicas is not None:
        return None
    bound = bound_with_attention(attention, ev.rank_loads(plan.placement), plan.rows, ev.topology, ev.cost)
    if metrics["name"] == "exact":
        bound = max(bound, float(plan.report.notes.get("bound", bound)))
    return max(bound, metrics["lower_bound"])


def format_table(table: list[dict], objective: Objective):
    """A rich Table of the comparison."""
    t = Table(title=f"RoutePack comparison (objective {objective}, times in ms)")
    certified = any(m.get("gap_certified") is not None for m in table)
    cols = ["plan", "max-sum", "sum-max", f"gain ({objective})", "gap to LB"]
    cols += ["gap to cert. bound"] if certified else []
    for col in cols + ["EP-rank CV", "row EP peak", "attn tail", "plan time"]:
        t.add_column(col, justify="right" if col != "plan" else "left")
    for m in table:
        cert = [] if not certified else ["—" if m.get("gap_certified") is None else f"{m['gap_certified']:.4f}"]
        t.add_row(m["name"] + (f" [{m['status']}]" if m.get("status") else ""),
                  f"{m['makespan_max_sum'] / 1e3:,.2f}", f"{m['makespan_sum_max'] / 1e3:,.2f}",
                  f"{100 * m['gain']:+.2f}%", f"{m['gap']:.4f}", *cert, f"{m['ep_rank_cv']:.3f}",
                  f"{m['row_ep_peak']:,.0f}", f"{m['attention_tail'] / 1e3:,.2f}",
                  f"{m['plan_seconds']:.2f} s")
    return t

"""Side-by-side comparison of plans (``routepack compare`` and the demo).

Rows: ``baseline`` (identity placement + length-only packing), ``reorder`` (LPT + the same
packing), ``routepack`` (LPT + population annealing), and where available ``joint`` /
``joint-sticky`` (row-aware placement searched with packing, without / with migration cost) and
``exact`` (proved layout on small windows). Every number comes from the one evaluator.
"""

from __future__ import annotations

import time


from routepack_opt.core.cost import CostModel
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.core.plan import Plan
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import Window

__all__ = ["plan_metrics", "compare_plans", "format_table"]

EXACT_MAX_SAMPLES = 24


def plan_metrics(ev: Evaluator, plan: Plan, objective: str, seconds: float) -> dict:
    """Makespans under both objectives, LB gap, EP-rank CV, worst row-local EP peak, attention tail."""
    from routepack_opt.heuristics.placement.lpt import rank_load_cv

    e = ev.evaluate(plan.placement, plan.row, plan.slot, plan.rows, objective)
    J, A_SRG, M_RGL = ev.costs(plan.placement, plan.row, plan.slot, plan.rows, parts=True)
    return {"makespan_max_sum": e.scores["max-sum"].makespan,
            "makespan_sum_max": e.scores["sum-max"].makespan,
            "makespan": e.score.makespan, "lower_bound": e.lower_bound, "gap": e.gap,
            "ep_rank_cv": rank_load_cv(ev.window.expert_loads(), plan.placement, ev.topology.ep),
            "row_ep_peak": float(M_RGL.max()),
            "expert_tail": float(ev.cost.gamma * M_RGL.sum()),
            "attention_tail": float(A_SRG.sum(axis=0).max()),
            "rows": plan.rows, "plan_seconds": seconds}


def compare_plans(window: Window, topology: Topology, cost: CostModel, objective: str = "max-sum",
                  rows: int | None = None, time_limit: float | None = None, seed: int = 0,
                  max_sweeps: int | None = None, exact: bool | None = None,
                  exact_time_limit: float = 30.0, joint: bool = True, current_placement=None,
                  progress=None, config=None) -> tuple[list[dict], dict[str, Plan]]:
    """Plans for every row of the comparison and their metrics (first row = baseline)."""
    from routepack_opt.certify import pack_into_bins
    from routepack_opt.heuristics.baselines import BASELINES
    from routepack_opt.pipeline import layout_plan, plan, resolve_placement, resolve_rows

    ev = Evaluator(window, topology, cost)
    t0 = time.perf_counter()
    R, cert = resolve_rows(window, topology, rows)
    t_cert = time.perf_counter() - t0
    plans: dict[str, Plan] = {}
    secs: dict[str, float] = {}
    base_fn = BASELINES["verl-kk"]
    for name, kind in (("baseline", "identity"), ("reorder", "lpt")):
        t0 = time.perf_counter()
        pl, _ = resolve_placement(window, topology, kind)
        row, slot = base_fn(window.lengths, topology, R, exact_pack=pack_into_bins)
        plans[name] = layout_plan(window, topology, cost, pl, row, slot, R, objective,
                                  {"packing": "verl-kk"}, cert, ev)
        secs[name] = time.perf_counter() - t0 + t_cert
    t0 = time.perf_counter()
    plans["routepack"] = plan(window, topology, cost, objective, "lpt", R, time_limit, max_sweeps,
                              seed, config, progress=progress, certificate=cert)
    secs["routepack"] = time.perf_counter() - t0 + t_cert
    if joint:
        try:
            import routepack_opt.heuristics.placement.joint  # noqa: F401
        except ImportError:
            joint = False
    if joint:
        t0 = time.perf_counter()
        plans["joint"] = plan(window, topology, cost, objective, "joint", R, time_limit, max_sweeps, seed, config,
                              certificate=cert)
        secs["joint"] = time.perf_counter() - t0 + t_cert
        if current_placement is not None:
            t0 = time.perf_counter()
            plans["joint-sticky"] = plan(window, topology, cost, objective, "joint", R, time_limit,
                                         max_sweeps, seed, config, current_placement=current_placement,
                                         certificate=cert)
            secs["joint-sticky"] = time.perf_counter() - t0 + t_cert
    if exact is None:
        exact = window.num_samples <= EXACT_MAX_SAMPLES
    if exact:
        try:
            from routepack_opt.models.layout import solve_layout
        except ImportError:
            exact = False
    if exact:
        t0 = time.perf_counter()
        rp = plans["routepack"]
        res = solve_layout(window, topology, cost, rp.placement, R, objective, solver="cpsat",
                           time_limit=exact_time_limit, warm_start=(rp.row, rp.slot))
        if res.row is not None:
            plans["exact"] = layout_plan(window, topology, cost, rp.placement, res.row, res.slot, R,
                                         objective, {"status": res.status, "bound": res.bound}, cert, ev)
            secs["exact"] = time.perf_counter() - t0
    table = []
    base = None
    for name, p in plans.items():
        m = plan_metrics(ev, p, objective, secs[name])
        base = base or m["makespan"]
        m["gain"] = (base - m["makespan"]) / base
        m["name"] = name
        if name == "exact":
            m["status"] = p.info.get("status")
        mig = p.info.get("joint", {}).get("migration")
        if mig:
            m["experts_moved"] = mig.get("experts_moved")
            m["bytes_moved"] = mig.get("bytes_total")
        table.append(m)
    return table, plans


def format_table(table: list[dict], objective: str):
    """A rich Table of the comparison."""
    from rich.table import Table

    t = Table(title=f"RoutePack comparison (objective {objective}, times in ms)")
    for col in ("plan", "max-sum", "sum-max", f"gain ({objective})", "gap to LB", "EP-rank CV",
                "row EP peak", "attn tail", "plan time"):
        t.add_column(col, justify="right" if col != "plan" else "left")
    for m in table:
        t.add_row(m["name"] + (f" [{m['status']}]" if m.get("status") else ""),
                  f"{m['makespan_max_sum'] / 1e3:,.2f}", f"{m['makespan_sum_max'] / 1e3:,.2f}",
                  f"{100 * m['gain']:+.2f}%", f"{m['gap']:.4f}", f"{m['ep_rank_cv']:.3f}",
                  f"{m['row_ep_peak']:,.0f}", f"{m['attention_tail'] / 1e3:,.2f}",
                  f"{m['plan_seconds']:.2f} s")
    return t

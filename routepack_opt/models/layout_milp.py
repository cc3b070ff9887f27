"""Exact layout model as a MILP built in Pyomo and solved by HiGHS (docs/pipeline.md, step 4).

Legend: N samples, L layers, P EP ranks, D DP slots, G shards, R rows, S stages, c = r·D + d.

The same model as :mod:`routepack_opt.models.layout_cpsat`, with continuous costs (no integer
scaling): binaries ``x[i,c]``; coverage, capacity, nonempty; epigraph variables for the attention
stage maxima ``A[s,r,g]`` (with the single-sample cuts ``A[s,r,g] ≥ a_si Σ_{d∈g} x[i,(r,d)]``) and
the per-layer EP-rank maxima ``M[r,g,l]``; ``max-sum`` minimises
``Z ≥ Σ_r J[r,g]``, ``sum-max`` minimises ``Σ_r K[r]`` with ``K[r] ≥ J[r,g]``; an optional
lexicographic second stage fixes the makespan and minimises ``Σ J``; min-index symmetry breaking
(:mod:`routepack_opt.models.layout_common`).

Costs are expressed in units of ``LB/1000`` (the docs/model.md bound without the row overhead) so the
objective is O(10³) whatever the preset: HiGHS's absolute tolerances then mean the same thing on
every instance. ``mip_rel_gap`` is 1e-9 (HiGHS's default 1e-4 would call a 0.01 % gap optimal).
The MIP start is the heuristic layout with every auxiliary variable at its implied value.

HiGHS 1.16 mis-maps a MIP start through its presolve on this model ("MIP start solution is
feasible in the reduced space: objective value is ..." reports a *lower* value than the start's
true objective), and then claims optimality below the true optimum — on about two thirds of 24
tiny test windows. So presolve is switched off whenever a MIP start is given (every one of those
windows then agrees with brute force), and every answer is checked: if HiGHS's objective differs
from the makespan recomputed from its own solution, the claim is not trusted (status
``feasible``, bound = docs/model.md bound, ``info["highs_inconsistent"]``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from routepack_opt.core.objective import Objective
from routepack_opt.models import _solvers
from routepack_opt.models.layout_common import (
    BuildClock,
    BuildTimeout,
    LayoutInstance,
    LayoutResult,
    canonical_layout,
    lex_better,
    prefeasibility,
    solver_result,
    symmetry_groups,
)

if TYPE_CHECKING:
    import pyomo.environ as pyo
    from pyomo.contrib.appsi.solvers import Highs

__all__ = ["solve_milp", "build_milp"]

MIP_REL_GAP = 1e-9


BUILD_SHARE = 0.5  # of the time limit, at most, for building the Pyomo model


def build_milp(inst: LayoutInstance, symmetry: bool = True,
               deadline: float | None = None, experts=None,
               slot_symmetry: bool = True) -> tuple[pyo.ConcreteModel, float]:
    """The Pyomo model and its cost unit (µs per model unit). Past ``deadline`` (a
    ``time.perf_counter()`` value) the build stops with :class:`BuildTimeout`.

    ``experts(m, inst, cells_RGP, clock) -> layers`` builds the expert term instead of the fixed
    placement's ``M[r,g,l]`` (it must define ``m.M[r, g, l]`` for the returned layers): the joint
    replica model (:mod:`routepack_opt.models.layout_replicas_milp`) does, with
    ``slot_symmetry=False``."""
    pyo = _solvers.pyomo()
    clock = BuildClock(deadline)
    topo = inst.topology
    R, D, G, P = inst.rows, topo.dp, topo.num_shards, topo.ep
    lb = inst.lower_bound() - inst.constant()
    unit = lb / 1000.0 if lb > 0 else 1.0
    coef_SN = inst.coef_SN / unit
    gamma = inst.cost.gamma / unit
    cells_RGP = [[[r * D + int(inst.slots_GP[g, j]) for j in range(P)] for g in range(G)]
                 for r in range(R)]

    m = pyo.ConcreteModel(name="layout")
    _add_assignment(m, inst)
    clock.check()
    stages = _add_attention(m, inst, coef_SN, cells_RGP, clock)
    if experts is not None:
        layers = experts(m, inst, cells_RGP, clock) if gamma > 0 else []
    else:
        layers = _fixed_experts(m, inst, cells_RGP, clock, gamma)
    _add_objectives(m, inst, stages, layers, gamma)
    m.symmetry = pyo.ConstraintList()
    if symmetry:
        _add_symmetry_breaking(m, inst, slot_symmetry, clock)
    m._unit = unit
    m._stages, m._layers, m._cells_RGP = stages, layers, cells_RGP
    m._coef_SN, m._gamma = coef_SN, gamma
    return m, unit


def _add_assignment(m, inst: LayoutInstance) -> None:
    """The cell binaries ``x[i, c]`` and the rules every layout keeps."""
    pyo = _solvers.pyomo()
    topo = inst.topology
    N, R, D = inst.num_samples, inst.rows, topo.dp
    lengths = inst.window.lengths.tolist()
    m.I = pyo.RangeSet(0, N - 1)
    m.Cc = pyo.RangeSet(0, R * D - 1)
    m.x = pyo.Var(m.I, m.Cc, domain=pyo.Binary)
    x = m.x
    # Coverage: every sample sits in exactly one cell.
    m.coverage = pyo.Constraint(m.I, rule=lambda m, i: sum(x[i, c] for c in m.Cc) == 1)
    # Capacity: the tokens of a cell stay within the micro-batch cap.
    m.capacity = pyo.Constraint(m.Cc, rule=lambda m, c: sum(lengths[i] * x[i, c] for i in m.I)
                                <= topo.capacity)
    # Nonempty: equal micro-batch counts on every slot.
    m.nonempty = pyo.Constraint(m.Cc, rule=lambda m, c: sum(x[i, c] for i in m.I) >= 1)
    # Equal counts (equal_samples_per_slot): every slot holds N / D samples over its rows.
    if topo.equal_samples_per_slot:
        m.equal_counts = pyo.Constraint(
            range(D), rule=lambda m, d: sum(x[i, r * D + d] for i in m.I for r in range(R)) == N // D)


def _add_attention(m, inst: LayoutInstance, coef_SN, cells_RGP, clock: BuildClock) -> list[int]:
    """Attention: ``A[s,r,g]`` ≥ each cell's stage cost in shard g, row r (with the single-sample
    cuts). Returns the stages with a nonzero cost."""
    pyo = _solvers.pyomo()
    N, R, G = inst.num_samples, len(cells_RGP), len(cells_RGP[0])
    x = m.x
    stages = [s for s in range(coef_SN.shape[0]) if coef_SN[s].any()]
    m.A = pyo.Var(stages, range(R), range(G), domain=pyo.NonNegativeReals)
    m.attention = pyo.ConstraintList()
    for s in stages:
        cs = coef_SN[s].tolist()
        for r in range(R):
            clock.check()
            for g in range(G):
                cells = cells_RGP[r][g]
                for c in cells:
                    m.attention.add(m.A[s, r, g] >= sum(cs[i] * x[i, c] for i in range(N)))
                if len(cells) > 1:  # single-sample cuts: valid, not implied by the LP relaxation
                    for i in range(N):
                        m.attention.add(m.A[s, r, g] >= cs[i] * sum(x[i, c] for c in cells))
    return stages


def _add_objectives(m, inst: LayoutInstance, stages, layers, gamma: float) -> None:
    """The block costs ``J[r,g]``, the makespan under the objective (``obj``, active) and ``Σ J``
    (``total``, the lexicographic second stage, inactive)."""
    pyo = _solvers.pyomo()
    R, G = inst.rows, inst.topology.num_shards

    def J(r, g):
        return (sum(m.A[s, r, g] for s in stages) + gamma * sum(m.M[r, g, l] for l in layers))

    m.J = pyo.Expression(range(R), range(G), rule=lambda m, r, g: J(r, g))
    if inst.objective == Objective.MAX_SUM:
        m.Z = pyo.Var(domain=pyo.NonNegativeReals)
        m.epi = pyo.Constraint(range(G), rule=lambda m, g: m.Z >= sum(m.J[r, g] for r in range(R)))
        m.makespan = pyo.Expression(expr=m.Z)
    else:
        m.K = pyo.Var(range(R), domain=pyo.NonNegativeReals)
        m.epi = pyo.Constraint(range(R), range(G), rule=lambda m, r, g: m.K[r] >= m.J[r, g])
        m.makespan = pyo.Expression(expr=sum(m.K[r] for r in range(R)))
    m.obj = pyo.Objective(expr=m.makespan, sense=pyo.minimize)
    m.total = pyo.Objective(expr=sum(m.J[r, g] for r in range(R) for g in range(G)),
                            sense=pyo.minimize)
    m.total.deactivate()


def _add_symmetry_breaking(m, inst: LayoutInstance, slot_symmetry: bool, clock: BuildClock) -> None:
    """Min-index ordering of interchangeable units (:func:`symmetry_groups`)."""
    x = m.x
    order = inst.order_N.tolist()
    for units in symmetry_groups(inst.topology, inst.rows, inst.objective, slot_symmetry):
        for j in range(1, len(units)):
            cur, prev = units[j], units[j - 1]
            for n, i in enumerate(order):
                if n % 16 == 0:
                    clock.check()
                lhs = sum(x[i, c] for c in cur)
                if n == 0:
                    m.symmetry.add(lhs <= 0)
                else:
                    m.symmetry.add(lhs <= sum(x[k, c] for c in prev for k in order[:n]))


def _fixed_experts(m, inst: LayoutInstance, cells_RGP, clock: BuildClock, gamma: float) -> list[int]:
    """Experts at the fixed placement: M[r,g,l] ≥ tokens the (row, shard) block sends to each EP
    rank at layer l."""
    pyo = _solvers.pyomo()
    b_NLP = inst.b_NLP
    N, L, P = b_NLP.shape
    R, G = len(cells_RGP), len(cells_RGP[0])
    x = m.x
    layers = [l for l in range(L) if gamma > 0 and b_NLP[:, l, :].any()]
    m.M = pyo.Var(range(R), range(G), layers, domain=pyo.NonNegativeReals)
    m.experts = pyo.ConstraintList()
    for r in range(R):
        for g in range(G):
            clock.check()
            cells = cells_RGP[r][g]
            for l in layers:
                for p in range(P):
                    w = b_NLP[:, l, p].tolist()
                    if any(w):
                        m.experts.add(m.M[r, g, l] >= sum(w[i] * x[i, c] for c in cells
                                                           for i in range(N) if w[i]))
    return layers


def _set_start(m, inst: LayoutInstance, row_N, slot_N) -> None:
    """Load a layout and every implied auxiliary value into the variables (the MIP start)."""
    D = inst.topology.dp
    cell_N = np.asarray(row_N) * D + np.asarray(slot_N)
    N = inst.num_samples
    C = inst.num_cells
    onehot = np.zeros((N, C))
    onehot[np.arange(N), cell_N] = 1.0
    for i in range(N):
        for c in range(C):
            m.x[i, c].set_value(float(onehot[i, c]))
    R, G = len(m._cells_RGP), len(m._cells_RGP[0])
    J = np.zeros((R, G))
    for s in m._stages:
        for r in range(R):
            for g in range(G):
                v = max(float(m._coef_SN[s] @ onehot[:, c]) for c in m._cells_RGP[r][g])
                m.A[s, r, g].set_value(v)
                J[r, g] += v
    for r in range(R):
        for g in range(G):
            y = onehot[:, m._cells_RGP[r][g]].sum(axis=1)
            for l in m._layers:
                v = float((y @ inst.b_NLP[:, l, :]).max())
                m.M[r, g, l].set_value(v)
                J[r, g] += m._gamma * v
    if inst.objective == Objective.MAX_SUM:
        m.Z.set_value(float(J.sum(axis=0).max()))
    else:
        for r in range(R):
            m.K[r].set_value(float(J[r].max()))


def _layout(m, inst: LayoutInstance) -> tuple[np.ndarray, np.ndarray]:
    pyo = _solvers.pyomo()
    D = inst.topology.dp
    N, C = inst.num_samples, inst.num_cells
    vals = np.array([[pyo.value(m.x[i, c]) for c in range(C)] for i in range(N)])
    cell_N = vals.argmax(axis=1).astype(np.int64)
    return cell_N // D, cell_N % D


def _highs(time_limit: float, threads: int | None, presolve: bool = True) -> Highs:
    Highs, _ = _solvers.appsi_highs()
    opt = Highs()
    opt.config.time_limit = float(max(time_limit, 0.01))
    opt.config.mip_gap = MIP_REL_GAP
    opt.config.load_solution = False
    opt.config.stream_solver = False
    opt.config.warmstart = True
    opt.highs_options = {"mip_abs_gap": 1e-7, "random_seed": 0}
    if not presolve:
        opt.highs_options["presolve"] = "off"
    opt.highs_options["threads"] = _solvers.highs_threads(threads)
    return opt


def solve_milp(inst: LayoutInstance, time_limit: float = 60.0, warm_start=None,
               lexicographic: bool = False, symmetry: bool = True, threads: int | None = None
               ) -> LayoutResult:
    """Solve the layout MILP with HiGHS through Pyomo's appsi interface."""
    pyo = _solvers.pyomo()
    _, TerminationCondition = _solvers.appsi_highs()
    t0 = time.perf_counter()
    reason = prefeasibility(inst)
    if reason is not None:
        return _result(inst, "infeasible", None, float("inf"), t0, None, lexicographic, {"reason": reason})
    try:
        # half of the limit at most: handing the model to HiGHS costs about as much again
        m, unit = build_milp(inst, symmetry, t0 + BUILD_SHARE * time_limit)
        if warm_start is not None:
            row_N, slot_N = (np.asarray(a, dtype=np.int64) for a in warm_start)
            if symmetry:
                row_N, slot_N = canonical_layout(row_N, slot_N, inst.topology, inst.rows, inst.objective,
                                                 inst.order_N)
            _set_start(m, inst, row_N, slot_N)
    except BuildTimeout as exc:
        return _result(inst, "unknown", None, inst.lower_bound(), t0, None, lexicographic,
                       {"build_timeout": str(exc), "build_seconds": time.perf_counter() - t0})
    build_s = time.perf_counter() - t0
    presolve = warm_start is None  # see the module docstring: HiGHS presolve + MIP start is unsafe
    opt = _highs(max(0.01, time_limit - build_s), threads, presolve)
    with _solvers.quiet_appsi_highs():
        res = opt.solve(m)
    info = {"stage1_status": str(res.termination_condition.name), "model_unit_us": unit, "build_seconds": build_s,
            "num_binaries": inst.num_samples * inst.num_cells, "symmetry_breaking": symmetry}
    status, bound, makespan_model, claimed = read_answer(res, m, inst, unit, info)
    if status in ("infeasible", "unknown"):
        return _result(inst, status, None, bound, t0, None, lexicographic, info)
    optimal = status == "optimal"
    layout = _layout(m, inst)
    if lexicographic:
        remaining = max(time_limit - (time.perf_counter() - t0), 0.1 * time_limit)
        # a relative slack on the fixed makespan absorbs HiGHS's feasibility tolerance
        m.fix = pyo.Constraint(expr=m.makespan <= makespan_model * (1 + 1e-9) + 1e-7)
        m.obj.deactivate()
        m.total.activate()
        opt2 = _highs(remaining, threads, presolve=False)  # stage 2 starts from stage 1
        with _solvers.quiet_appsi_highs():
            res2 = opt2.solve(m)
        info["stage2_status"] = str(res2.termination_condition.name)
        if res2.best_feasible_objective is not None:
            res2.solution_loader.load_vars()
            layout2 = _layout(m, inst)
            # keep stage 2 only if the evaluator agrees it is lexicographically better
            if not inst.violations(*layout2) and lex_better(inst.score(*layout2), inst.score(*layout), 0.0):
                layout = layout2
        optimal = optimal and res2.termination_condition == TerminationCondition.optimal
    info["solver_makespan"] = claimed
    return _result(inst, "optimal" if optimal else "feasible", layout, bound, t0, claimed,
                   lexicographic, info)


def read_answer(res, m, inst, unit: float, info: dict) -> tuple[str, float, float | None, float | None]:
    """HiGHS's answer to a layout model ``m``: (status, proved bound in µs, the model's makespan
    in model units, the claimed makespan in µs). "infeasible" and "unknown" (no solution) carry no
    makespan; otherwise the solution is loaded into ``m`` and the status is "optimal" or
    "feasible" — "feasible", with the docs/model.md bound, also when HiGHS's objective disagrees
    with its own solution (module docstring)."""
    _, TerminationCondition = _solvers.appsi_highs()
    tc = res.termination_condition
    if tc in (TerminationCondition.infeasible, TerminationCondition.infeasibleOrUnbounded):
        return "infeasible", float("inf"), None, None
    bound = _bound(inst, unit, res.best_objective_bound)
    if res.best_feasible_objective is None:
        return "unknown", bound, None, None
    res.solution_loader.load_vars()
    makespan_model, claimed, consistent = _claimed(res, m, inst, unit, info)
    if not consistent:
        return "feasible", inst.lower_bound(), makespan_model, claimed
    return ("optimal" if tc == TerminationCondition.optimal else "feasible"), bound, makespan_model, claimed


def _claimed(res, m, inst, unit: float, info: dict) -> tuple[float, float, bool]:
    """(the model's makespan in model units, the solver's claimed makespan in µs, whether HiGHS's
    reported objective agrees with the model's value; a disagreement is recorded in ``info``)."""
    makespan_model = float(_solvers.pyomo().value(m.makespan))
    consistent = abs(res.best_feasible_objective - makespan_model) <= 1e-6 * max(1.0, abs(makespan_model))
    if not consistent:
        info["highs_inconsistent"] = (res.best_feasible_objective, makespan_model)
    return makespan_model, makespan_model * unit + inst.constant(), consistent


def _bound(inst: LayoutInstance, unit: float, model_bound) -> float:
    """Proved bound on the makespan: HiGHS's dual bound, never below the docs/model.md bound."""
    spec = inst.lower_bound()
    if model_bound is None or not np.isfinite(model_bound):
        return spec
    return max(float(model_bound) * unit + inst.constant(), spec)


def _result(inst, status, layout, bound, t0, claimed, lexicographic, info) -> LayoutResult:
    return solver_result(inst, "highs", status, layout, bound, t0, claimed, 0.0, lexicographic, info)

"""Exact layout model in CP-SAT (docs/pipeline.md, step 4): the whole packing at fixed placement and rows R,
for ``max-sum`` and ``sum-max``, with an optional lexicographic second stage.

Legend: N samples, L layers, P EP ranks, D DP slots, G shards, R rows, S stages, c = r·D + d.

Model (one constraint family per function below):
    x[i,c] ∈ {0,1}                   sample i in cell c
    coverage  Σ_c x[i,c] = 1;  capacity  Σ_i len_i x[i,c] ≤ C;  nonempty  Σ_i x[i,c] ≥ 1
    counts    Σ_{r,i} x[i,(r,d)] = N / D  for every slot d (only with equal_samples_per_slot)
    attention A[s,r,g] ≥ Σ_i a_si x[i,(r,d)]            for d in shard g   (stage max, epigraph)
              A[s,r,g] ≥ a_si Σ_{d∈g} x[i,(r,d)]        for every sample i (a sample in the block
                                                         bounds its max; not implied by the LP)
    experts   M[r,g,l] ≥ Σ_i b[i,l,p] Σ_{d∈g} x[i,(r,d)]  for every rank p (rank max, epigraph)
    J[r,g]  = Σ_s A[s,r,g] + γ Σ_l M[r,g,l]              (+ row_overhead, a constant)
    max-sum   Z ≥ Σ_r J[r,g]  ∀g;  minimise Z
    sum-max   K[r] ≥ J[r,g]  ∀g;  minimise Σ_r K[r]
    lexicographic stage 2: makespan ≤ stage-1 value; minimise Σ_{r,g} J[r,g]
plus min-index symmetry breaking (:mod:`routepack_opt.models.layout_common`).

:func:`solve_cpsat` runs this model inside a fixed sequence (block decomposition where it
applies, then one fixed-search worker, then the portfolio; see its docstring).

Integer scaling. CP-SAT needs integer coefficients. The unit is ``u = γ/K`` µs for an integer K
(so the expert term ``K · M`` is exact: M counts tokens), chosen so that ``u`` ≤ the target
``2·rel_error·LB / (S·n)``; attention coefficients are rounded, ``a'_si = round(a_si/u)``.
With ``δ_s = max_i |a_si − u·a'_si|`` (≤ u/2) and ``n = N − R·(D−1)`` (the most samples the R
largest cells of any shard can hold, since every other cell holds one), every layout's scaled
makespan is within ``ε = n·Σ_s δ_s`` of its true makespan (a stage max moves by at most its
largest cell's error; both objectives sum one max per row). Hence the reported bound is
``u·bound' + R·row_overhead − ε``, and a solution CP-SAT proves optimal is within ``2ε`` of the
true optimum (``ε / LB`` ≈ ``rel_error`` = 1e-7 by default). Every solution is re-scored exactly
by the evaluator.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import TYPE_CHECKING

import numpy as np

from routepack_opt.core.objective import Objective
from routepack_opt.models import _solvers, layout_blocks
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
    from ortools.sat.python.cp_model import CpSolver

__all__ = ["solve_cpsat", "CpsatScaling"]


# Share of the time limit the block decomposition may use before CP-SAT takes over, and share of
# what is left that one CP-SAT worker spends on the fixed heaviest-first search before the
# multi-worker portfolio (only when num_workers > 1).
DECOMPOSE_SHARE = 0.75
FIXED_SHARE = 1 / 3


class CpsatScaling:
    """Integer scaling of the costs (see the module docstring)."""

    def __init__(self, inst: LayoutInstance, rel_error: float = 1e-7):
        S = len(inst.cost.stages)
        N, R, D = inst.num_samples, inst.rows, inst.topology.dp
        self.n_eff = max(1, N - R * (D - 1))
        lb = max(inst.lower_bound() - inst.constant(), 0.0)
        gamma = inst.cost.gamma
        target = 2.0 * rel_error * lb / (S * self.n_eff) if lb > 0 else 1.0
        if target <= 0 or not math.isfinite(target):
            target = 1.0
        if gamma > 0:
            self.K = int(math.ceil(gamma / target))
            self.unit = gamma / self.K
        else:
            self.K = 0
            self.unit = target
        self.coef_SN = np.rint(inst.coef_SN / self.unit).astype(np.int64)
        self.delta_S = np.abs(inst.coef_SN - self.unit * self.coef_SN).max(axis=1, initial=0.0)
        self.error = float(self.n_eff * self.delta_S.sum())  # ε, µs

    def to_us(self, value: float) -> float:
        return float(value) * self.unit


def solve_cpsat(inst: LayoutInstance, time_limit: float = 60.0, warm_start=None,
                lexicographic: bool = False, symmetry: bool = True, num_workers: int = 2,
                seed: int = 0, rel_error: float = 1e-7, params: dict | None = None,
                branching: bool = True, decompose: bool = True) -> LayoutResult:
    """Solve the layout model with CP-SAT. ``warm_start`` = (row_N, slot_N) becomes a full hint
    (canonicalised when symmetry breaking is on). ``params``: extra CP-SAT parameters by name.
    ``branching``: a decision strategy, heaviest samples first into their lowest cell (with one
    worker, CP-SAT follows it strictly: fixed search) — it proved a 16-sample window where the
    default search stalled at a 2 % gap for 60 s, in 11 s.

    The default procedure (one call, ``time_limit`` in all):
    1. ``decompose``: where the block decomposition applies (P ≤ 2, every block enumerable, a
       warm start given, makespan only), it runs first for at most ``DECOMPOSE_SHARE`` of the
       limit (:func:`routepack_opt.models.layout_blocks.solve_blocks`); a proof ends the call.
    2. With ``num_workers`` > 1 (and ``branching``, makespan only): one worker on the fixed
       heaviest-first search for ``FIXED_SHARE`` of the time left; a proof ends the call.
    3. The ``num_workers`` portfolio for the rest, hinted with the best layout so far.
    The answer is the best layout of all phases, its bound the best of all phases' bounds
    (optimal when they meet); ``info["method"]`` names the phases that ran.
    """
    t0 = time.perf_counter()
    reason = prefeasibility(inst)
    if reason is not None:
        return _result(inst, "infeasible", None, float("inf"), t0, None, 0.0, lexicographic,
                       {"reason": reason})
    done: list[dict] = []  # earlier phases: layout, bound, info
    if decompose and warm_start is not None and not lexicographic:
        if layout_blocks.applicable(inst):
            pre = layout_blocks.solve_blocks(inst, DECOMPOSE_SHARE * time_limit, warm_start)
            if pre["status"] == "optimal":
                return _result(inst, "optimal", pre["layout"], pre["bound"], t0, None, 0.0,
                               lexicographic, {"method": "blocks", "decomposition": pre["info"]})
            done.append({"phase": "blocks", "layout": pre["layout"], "bound": pre["bound"],
                         "info": pre["info"]})
            warm_start = pre["layout"]
    args = (symmetry, seed, rel_error, params, branching)
    if num_workers > 1 and branching and not lexicographic and FIXED_SHARE > 0:
        # one worker strictly following the heaviest-first strategy, then the portfolio
        left = time_limit - (time.perf_counter() - t0)
        res = _solve_model(inst, t0, FIXED_SHARE * left, warm_start, False, 1, *args)
        if res.status == "optimal" or res.status == "infeasible":
            return _combine(inst, res, done, t0, "fixed")

        if res.layout is not None:
            done.append({"phase": "fixed", "layout": res.layout, "bound": res.bound,
                         "info": {"status": res.status, "seconds": res.seconds}})
            warm_start = _better(inst, res.layout, warm_start)
    left = max(time_limit - (time.perf_counter() - t0), 0.0)
    res = _solve_model(inst, t0, left, warm_start, lexicographic, num_workers, *args)
    return _combine(inst, res, done, t0, "portfolio")


def _better(inst: LayoutInstance, a, b):
    """The layout with the smaller makespan (``a`` on ties; either may be None)."""
    if b is None:
        return a
    if a is None:
        return b
    return a if inst.score(*a).makespan <= inst.score(*b).makespan else b


def _combine(inst: LayoutInstance, res: LayoutResult, done: list[dict], t0: float,
             last: str) -> LayoutResult:
    """The last CP-SAT phase's answer with the earlier phases': the best layout, the best bound;
    optimal when they meet (within CP-SAT's rounding error)."""
    info = dict(res.info, method="+".join([d["phase"] for d in done] + [last]))
    if not done or res.status == "infeasible":
        return dataclasses.replace(res, info=info)
    for d in done:
        info[d["phase"]] = d["info"]
    layout = res.layout
    for d in done:
        layout = _better(inst, layout, d["layout"])
    bound = max([res.bound] + [d["bound"] for d in done])
    objective = inst.score(*layout).makespan
    tol = 2 * res.rounding_error + 1e-9 * abs(objective)
    status = res.status
    if status != "optimal":
        status = "optimal" if bound >= objective - tol else "feasible"
    return solver_result(inst, "cpsat", status, layout, bound, t0, res.claimed, res.rounding_error,
                         res.lexicographic, info)


def _solve_model(inst, t0, time_limit, warm_start, lexicographic, num_workers, symmetry, seed,
                 rel_error, params, branching) -> LayoutResult:
    """The CP-SAT model itself (module docstring). Building it counts against ``time_limit``:
    past it the build stops and the result is ``unknown`` with ``info["build_timeout"]``."""
    cp_model = _solvers.cp_model()
    t_phase = time.perf_counter()
    sc = CpsatScaling(inst, rel_error)
    try:
        m = _Model(inst, sc, t_phase + time_limit)
        if symmetry:
            m.add_symmetry_breaking()
        m.minimise_makespan()
        if branching:
            m.add_branching()
        if warm_start is not None:
            row_N, slot_N = (np.asarray(a, dtype=np.int64) for a in warm_start)
            if symmetry:
                row_N, slot_N = canonical_layout(row_N, slot_N, inst.topology, inst.rows, inst.objective,
                                                 inst.order_N)
            m.hint(row_N, slot_N)
    except BuildTimeout as exc:
        return _result(inst, "unknown", None, inst.lower_bound(), t0, None, sc.error, lexicographic,
                       {"build_timeout": str(exc), "build_seconds": time.perf_counter() - t_phase})
    build_s = time.perf_counter() - t_phase

    if branching and num_workers == 1:
        fixed_search = type(cp_model.CpSolver().parameters.search_branching).FIXED_SEARCH
        params = {"search_branching": fixed_search, **(params or {})}
    solver = _solver(time_limit - build_s, num_workers, seed, params)
    status = solver.solve(m.model)
    info = {"stage1_status": solver.status_name(status), "scale_unit_us": sc.unit,
            "num_binaries": int(m.x.size), "symmetry_breaking": symmetry, "build_seconds": build_s}
    if status == cp_model.INFEASIBLE:
        return _result(inst, "infeasible", None, float("inf"), t0, None, sc.error, lexicographic, info)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        bound = _bound(inst, sc, solver.best_objective_bound)
        return _result(inst, "unknown", None, bound, t0, None, sc.error, lexicographic, info)
    optimal = status == cp_model.OPTIMAL
    bound = _bound(inst, sc, solver.best_objective_bound)
    makespan_scaled = int(round(solver.objective_value))
    layout = m.layout(solver)
    claimed = sc.to_us(makespan_scaled) + inst.constant()

    if lexicographic:
        remaining = max(time_limit - (time.perf_counter() - t0), 0.1 * time_limit)
        m.fix_makespan_minimise_total(makespan_scaled)
        m.hint(*layout)
        solver2 = _solver(remaining, num_workers, seed, params)
        status2 = solver2.solve(m.model)
        info["stage2_status"] = solver2.status_name(status2)
        if status2 in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            layout2 = m.layout(solver2)
            # the scaled makespan is fixed, the true one may move within the rounding error:
            # keep stage 2 only if the evaluator agrees it is lexicographically better
            if lex_better(inst.score(*layout2), inst.score(*layout), 2 * sc.error):
                layout = layout2
        optimal = optimal and status2 == cp_model.OPTIMAL
    info["solver_makespan"] = claimed
    return _result(inst, "optimal" if optimal else "feasible", layout, bound, t0, claimed,
                   sc.error, lexicographic, info)


def _solver(time_limit, num_workers, seed, params) -> CpSolver:
    cp_model = _solvers.cp_model()
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(max(time_limit, 0.01))
    solver.parameters.num_workers = int(num_workers)
    solver.parameters.random_seed = int(seed)
    for key, value in (params or {}).items():
        if isinstance(value, (list, tuple)):  # repeated fields (e.g. subsolvers)
            getattr(solver.parameters, key).extend(value)
        else:
            setattr(solver.parameters, key, value)
    return solver


def _bound(inst: LayoutInstance, sc: CpsatScaling, scaled_bound: float) -> float:
    """Proved bound on the true makespan: the solver's, less the rounding error, never below
    the docs/model.md bound."""
    solver_bound = sc.to_us(scaled_bound) + inst.constant() - sc.error
    return max(solver_bound, inst.lower_bound())


def _result(inst, status, layout, bound, t0, claimed, error, lexicographic, info) -> LayoutResult:
    return solver_result(inst, "cpsat", status, layout, bound, t0, claimed, error, lexicographic, info)


class _Model:
    """Variables and constraint families of the CP-SAT layout model. A subclass may replace the
    expert term (``add_expert_maxima``, ``hint``): the replica model of
    :mod:`routepack_opt.models.layout_replicas_cpsat` does, and keeps the slot order
    (``SLOT_SYMMETRY = False``)."""

    SLOT_SYMMETRY = True  # break the symmetry of slots inside a block (layout_common)

    def __init__(self, inst: LayoutInstance, sc: CpsatScaling, deadline: float | None = None):
        cp_model = _solvers.cp_model()
        self.inst, self.sc = inst, sc
        topo = inst.topology
        N, R, D, G, P = inst.num_samples, inst.rows, topo.dp, topo.num_shards, topo.ep
        L = inst.window.num_layers
        self.clock = clock = BuildClock(deadline)
        self.model = model = cp_model.CpModel()
        x_rows = []
        for i in range(N):  # ~10 µs a variable: at N = 512 on 176 cells, seconds — on the clock
            x_rows.append([model.new_bool_var(f"x[{i},{c}]") for c in range(R * D)])
            if i % 16 == 15:
                clock.check()
        self.x = np.array(x_rows, dtype=object).reshape(N, R * D)
        self.cells_RGP = np.array([[[r * D + int(inst.slots_GP[g, j]) for j in range(P)]
                                    for g in range(G)] for r in range(R)])
        clock.check()
        self.add_coverage()
        self.add_capacity()
        self.add_nonempty()
        self.add_equal_counts()
        clock.check()
        self.A = self.add_attention()  # dict (s, r, g) -> var
        self.M = self.add_expert_maxima()  # dict (r, g, l) -> var
        self.J = {(r, g): self._row_shard_cost(r, g) for r in range(R) for g in range(G)}
        self.L = L
        self.obj_vars: dict = {}

    # --- constraint families ----------------------------------------------------------------
    def add_coverage(self):
        """Every sample sits in exactly one cell."""
        for i in range(self.x.shape[0]):
            self.model.add_exactly_one(self.x[i].tolist())

    def add_capacity(self):
        """Tokens of a cell stay within the micro-batch capacity."""
        cp_model = _solvers.cp_model()
        lengths = self.inst.window.lengths.tolist()
        for c in range(self.x.shape[1]):
            self.model.add(cp_model.LinearExpr.weighted_sum(self.x[:, c].tolist(), lengths)
                           <= self.inst.topology.capacity)

    def add_nonempty(self):
        """Every cell holds at least one sample (equal micro-batch counts on every slot)."""
        for c in range(self.x.shape[1]):
            self.model.add_bool_or(self.x[:, c].tolist())

    def add_equal_counts(self):
        """With equal_samples_per_slot: every slot d holds N / D samples over its rows,
        Σ_{r,i} x[i,(r,d)] = N / D."""
        cp_model = _solvers.cp_model()
        topo = self.inst.topology
        if not topo.equal_samples_per_slot:
            return
        N, D, R = self.x.shape[0], topo.dp, self.inst.rows
        for d in range(D):
            self.model.add(cp_model.LinearExpr.sum([self.x[i, r * D + d] for i in range(N)
                                                    for r in range(R)]) == N // D)

    def add_attention(self) -> dict:
        """A[s,r,g] ≥ the scaled attention cost of every cell of shard g in row r."""
        cp_model = _solvers.cp_model()
        A = {}
        coef_SN = self.sc.coef_SN
        R, G, P = self.cells_RGP.shape
        for s in range(coef_SN.shape[0]):
            coefs = coef_SN[s].tolist()
            if not any(coefs):
                continue
            ub = int(_cell_max(coef_SN[s], self.inst.window.lengths, self.inst.topology.capacity))
            for r in range(R):
                self.clock.check()
                for g in range(G):
                    a = self.model.new_int_var(0, ub, f"A[{s},{r},{g}]")
                    cells = self.cells_RGP[r, g]
                    for c in cells:
                        self.model.add(a >= cp_model.LinearExpr.weighted_sum(self.x[:, c].tolist(), coefs))
                    if len(cells) > 1:  # single-sample cuts: valid, not implied by the LP
                        for i in range(len(coefs)):
                            if coefs[i]:
                                self.model.add(a >= coefs[i] * cp_model.LinearExpr.sum(
                                    [self.x[i, c] for c in cells]))
                    A[s, r, g] = a
        return A

    def add_expert_maxima(self) -> dict:
        """M[r,g,l] ≥ the tokens the (row, shard) block sends to each EP rank at layer l."""
        cp_model = _solvers.cp_model()
        M = {}
        if self.sc.K == 0:
            return M
        b_NLP = self.inst.b_NLP
        N, L, P = b_NLP.shape
        R, G, _ = self.cells_RGP.shape
        for r in range(R):
            for g in range(G):
                self.clock.check()
                cells = self.cells_RGP[r, g]
                xs = [self.x[i, c] for c in cells for i in range(N)]
                for l in range(L):
                    self.clock.check()  # one layer of one block: P sums of P·N terms (~0.05 s at N = 512)
                    ranks = [p for p in range(P) if b_NLP[:, l, p].any()]
                    if not ranks:
                        continue
                    ub = int(b_NLP[:, l, :].sum(axis=0).max())
                    m = self.model.new_int_var(0, ub, f"M[{r},{g},{l}]")
                    for p in ranks:
                        w = b_NLP[:, l, p].tolist() * len(cells)
                        self.model.add(m >= cp_model.LinearExpr.weighted_sum(xs, w))
                    M[r, g, l] = m
        return M

    def _row_shard_cost(self, r, g):
        cp_model = _solvers.cp_model()
        terms = [a for (s, rr, gg), a in self.A.items() if rr == r and gg == g]
        weights = [1] * len(terms)
        ms = [m for (rr, gg, l), m in self.M.items() if rr == r and gg == g]
        return cp_model.LinearExpr.weighted_sum(terms + ms, weights + [self.sc.K] * len(ms))

    def add_symmetry_breaking(self):
        """Min-index ordering of interchangeable units (valid for the objective, see
        :mod:`routepack_opt.models.layout_common`)."""
        cp_model = _solvers.cp_model()
        order = self.inst.order_N.tolist()
        for units in symmetry_groups(self.inst.topology, self.inst.rows, self.inst.objective,
                                     self.SLOT_SYMMETRY):
            for j in range(1, len(units)):
                cur, prev = units[j], units[j - 1]
                for n, i in enumerate(order):
                    if n % 16 == 0:
                        self.clock.check()
                    lhs = [self.x[i, c] for c in cur]
                    rhs = [self.x[k, c] for c in prev for k in order[:n]]
                    if not rhs:
                        for v in lhs:
                            self.model.add(v == 0)
                    else:
                        self.model.add(cp_model.LinearExpr.sum(lhs) <= cp_model.LinearExpr.sum(rhs))

    def add_branching(self):
        """Search heaviest samples first, each into its lowest feasible cell (the order the
        symmetry breaking uses)."""
        cp_model = _solvers.cp_model()
        xs = [self.x[i, c] for i in self.inst.order_N for c in range(self.x.shape[1])]
        self.model.add_decision_strategy(xs, cp_model.CHOOSE_FIRST, cp_model.SELECT_MAX_VALUE)

    def minimise_makespan(self):
        R, G = self.cells_RGP.shape[:2]
        ub = sum(int(_cell_max(self.sc.coef_SN[s], self.inst.window.lengths, self.inst.topology.capacity))
                 for s in range(self.sc.coef_SN.shape[0])) + self.sc.K * int(self.inst.b_NLP.sum())
        ub *= R
        # The docs/model.md bound in scaled units (valid for every layout up to the rounding error).
        lb = self.inst.lower_bound() - self.inst.constant() - self.sc.error
        lb_scaled = max(0, int(math.floor(lb / self.sc.unit)))
        if self.inst.objective == Objective.MAX_SUM:
            z = self.model.new_int_var(min(lb_scaled, ub), ub, "Z")
            for g in range(G):
                self.model.add(z >= sum(self.J[r, g] for r in range(R)))
            self.makespan = z
            self.obj_vars = {"Z": z}
        else:
            k = [self.model.new_int_var(0, ub, f"K[{r}]") for r in range(R)]
            for r in range(R):
                for g in range(G):
                    self.model.add(k[r] >= self.J[r, g])
            self.makespan = sum(k)
            self.model.add(self.makespan >= lb_scaled)
            self.obj_vars = {"K": k}
        self.model.minimize(self.makespan)

    def fix_makespan_minimise_total(self, makespan_scaled: int):
        """Lexicographic stage 2: keep the makespan, minimise the summed row-shard cost."""
        self.model.add(self.makespan <= makespan_scaled)
        self.model.minimize(sum(self.J.values()))

    # --- hints and solutions ----------------------------------------------------------------
    def hint(self, row_N, slot_N):
        """A complete hint: assignment and every auxiliary variable at its implied value."""
        m = self.model
        m.clear_hints()
        inst = self.inst
        D = inst.topology.dp
        cell_N = row_N * D + slot_N
        N, C = self.x.shape
        onehot = np.zeros((N, C), dtype=np.int64)
        onehot[np.arange(N), cell_N] = 1
        for i in range(N):
            if i % 64 == 0:
                self.clock.check()
            for c in range(C):
                m.add_hint(self.x[i, c], int(onehot[i, c]))
        R, G, P = self.cells_RGP.shape
        Aval = {}
        for (s, r, g), a in self.A.items():
            Aval[s, r, g] = int(max(self.sc.coef_SN[s] @ onehot[:, c] for c in self.cells_RGP[r, g]))
            m.add_hint(a, Aval[s, r, g])
        Mval = {}
        for (r, g, l), mv in self.M.items():
            y = onehot[:, self.cells_RGP[r, g]].sum(axis=1)
            Mval[r, g, l] = int((y @ inst.b_NLP[:, l, :]).max())
            m.add_hint(mv, Mval[r, g, l])
        J = np.zeros((R, G), dtype=np.int64)
        for (_s, r, g), v in Aval.items():
            J[r, g] += v
        for (r, g, _l), v in Mval.items():
            J[r, g] += self.sc.K * v
        if "Z" in self.obj_vars:
            m.add_hint(self.obj_vars["Z"], int(J.sum(axis=0).max()))
        else:
            for r, k in enumerate(self.obj_vars["K"]):
                m.add_hint(k, int(J[r].max()))

    def layout(self, solver: CpSolver) -> tuple[np.ndarray, np.ndarray]:
        D = self.inst.topology.dp
        N, C = self.x.shape
        cell_N = np.array([next(c for c in range(C) if solver.boolean_value(self.x[i, c]))
                           for i in range(N)], dtype=np.int64)
        return cell_N // D, cell_N % D


def _cell_max(coef_N: np.ndarray, lengths_N: np.ndarray, capacity: int) -> float:
    """An upper bound on one cell's cost: no cell holds more than k samples, k = how many of the
    shortest samples fit in the capacity, so its cost is at most the k largest coefficients."""
    k = int(np.searchsorted(np.cumsum(np.sort(lengths_N)), capacity, side="right"))
    k = max(k, 1)
    return float(np.sort(coef_N)[::-1][:k].sum())

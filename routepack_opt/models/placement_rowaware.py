"""Exact row-aware placement of ONE layer (CP-SAT), the other layers and the layout held fixed —
the exact counterpart of one layer step of :mod:`routepack_opt.heuristics.placement.refine`,
used to prove how far the swap local search is from the per-layer optimum.

Legend: E experts, P EP ranks, K = R·G (row, shard) pairs, k = r·G + g.

With the layout fixed, ``J_k = base_k + γ·M_k`` where ``base_k`` = attention + row overhead +
γ·(the other layers' peaks) and ``M_k = max_p Σ_{e on p} V[e,k]``. The model minimises the first
objective component (the makespan; migration is not modelled):

    x[e,p] ∈ {0,1}     expert e on rank p
    assignment   Σ_p x[e,p] = 1;   cardinality   Σ_e x[e,p] = E/P
    peaks        M_k ≥ Σ_e V[e,k]·x[e,p]                           ∀k, p (epigraph of the max)
    max-sum      Z ≥ Σ_{k∈g} (base'_k + s·M_k) ∀g;  minimise Z
    sum-max      Y_r ≥ base'_k + s·M_k  ∀k∈r;      minimise Σ_r Y_r
    symmetry     ranks are interchangeable: expert 0 sits on rank 0

Integer scaling: the unit is ``γ/s`` µs, so ``s·M_k`` is exact and ``base'_k = round(base_k·s/γ)``
errs by ≤ 1/2 unit. A makespan sums at most R of the ``base'`` terms in every objective (a shard
sum has R terms; a sum of row maxima has R), so every placement's scaled value is within
``ε = R/2`` units of its true value: the reported bound subtracts ε, and every returned placement
is re-scored exactly in floating point (:func:`layer_objective`).
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from routepack_opt.core.errors import InputError
from routepack_opt.core.objective import Objective, check_objective
from routepack_opt.models import _solvers

__all__ = ["LayerProblem", "LayerPlacementResult", "layer_objective", "solve_layer_cpsat",
           "brute_force_layer", "layer_problem", "layer_gaps"]


@dataclasses.dataclass(frozen=True)
class LayerProblem:
    """One layer's placement problem: ``V_EK`` loads, ``base_K`` the rest of J (µs)."""

    V_EK: np.ndarray
    base_K: np.ndarray
    gamma: float
    ep: int
    G: int
    R: int
    objective: Objective

    def __post_init__(self):  # a string is parsed here, once
        object.__setattr__(self, "objective", check_objective(self.objective))

    @property
    def num_experts(self) -> int:
        return int(self.V_EK.shape[0])


def layer_problem(state, l: int) -> LayerProblem:
    """The layer-l problem of a :class:`~routepack_opt.heuristics.placement.refine.RowAwareState`
    with every other layer at its current placement."""
    base = state.Abase_K + state.gamma * (state.Mtot_K - state.M_LK[l]) + state.ro
    return LayerProblem(V_EK=np.asarray(state.V_LEK[l]), base_K=np.asarray(base, dtype=np.float64),
                        gamma=state.gamma, ep=state.P, G=state.G, R=state.R,
                        objective=state.objective)


def layer_objective(prob: LayerProblem, ranks_E) -> float:
    """The makespan of the layer problem for a rank assignment (exact, floating point)."""
    ranks_E = np.asarray(ranks_E, dtype=np.int64)
    W_KP = np.zeros((prob.V_EK.shape[1], prob.ep), dtype=np.int64)
    for p in range(prob.ep):
        W_KP[:, p] = prob.V_EK[ranks_E == p].sum(axis=0)
    J_RG = (prob.base_K + prob.gamma * W_KP.max(axis=1)).reshape(prob.R, prob.G)
    return prob.objective.makespan(J_RG)


def _balanced_assignments(E: int, P: int):
    """Every assignment of E experts to P ranks with E/P each, expert 0 on rank 0 (symmetry)."""
    per = E // P
    ranks = np.full(E, -1, dtype=np.int64)
    fill = np.zeros(P, dtype=np.int64)

    def rec(e):
        if e == E:
            yield ranks.copy()
            return
        # rank symmetry: the first expert opens rank 0, and a new rank opens only in order
        opened = int(ranks[:e].max(initial=-1)) + 1
        for p in range(min(P, opened + 1)):
            if fill[p] < per:
                ranks[e] = p
                fill[p] += 1
                yield from rec(e + 1)
                fill[p] -= 1
        ranks[e] = -1

    yield from rec(0)


def brute_force_layer(prob: LayerProblem) -> tuple[float, np.ndarray]:
    """Optimal (makespan, ranks) by enumeration (tiny E only)."""
    if math.comb(prob.num_experts, prob.num_experts // prob.ep) ** 2 > 10**7:
        raise InputError("brute force: too many assignments")
    best, arg = math.inf, None
    for ranks in _balanced_assignments(prob.num_experts, prob.ep):
        v = layer_objective(prob, ranks)
        if v < best:
            best, arg = v, ranks
    return best, arg


@dataclasses.dataclass(frozen=True)
class LayerPlacementResult:
    ranks: np.ndarray | None  # [E] rank of each expert (None if no solution)
    status: str  # optimal / feasible / infeasible / unknown
    objective: float  # exact makespan of ``ranks``
    bound: float  # proved lower bound on the true optimum (scaling error subtracted)
    wall_s: float


class _LayerModel:
    """The CP-SAT model of one layer (module doc), one method per constraint family, on the
    integer-scaled costs: ``base_i`` = round(base_K·s/γ), every M_k counted ``scale`` times."""

    def __init__(self, cp_model, prob: LayerProblem, base_i: np.ndarray, scale: int):
        self.prob, self.base_i, self.scale = prob, base_i, scale
        E, K = prob.V_EK.shape
        P = prob.ep
        self.V = np.asarray(prob.V_EK, dtype=np.int64)
        self.m = m = cp_model.CpModel()
        self.x = {(e, p): m.new_bool_var(f"x[{e},{p}]") for e in range(E) for p in range(P)}
        self.colmax = self.V.sum(axis=0)
        self.M = [m.new_int_var(0, int(self.colmax[k]), f"M[{k}]") for k in range(K)]

    def add_assignment(self):
        """Each expert on exactly one rank, each rank holding E/P experts."""
        E, P, x = self.prob.num_experts, self.prob.ep, self.x
        for e in range(E):
            self.m.add_exactly_one(x[e, p] for p in range(P))
        for p in range(P):
            self.m.add(sum(x[e, p] for e in range(E)) == E // P)

    def add_peaks(self):
        """M_k is at least every rank's load (epigraph of the max; minimisation makes it tight)."""
        for k in range(self.V.shape[1]):
            nz = np.flatnonzero(self.V[:, k])
            for p in range(self.prob.ep):
                if nz.size:
                    self.m.add(self.M[k] >= sum(int(self.V[e, k]) * self.x[e, p] for e in nz))

    def add_symmetry(self):
        """Ranks are interchangeable: expert 0 sits on rank 0."""
        self.m.add(self.x[0, 0] == 1)

    def _J(self, k):
        return int(self.base_i[k]) + self.scale * self.M[k]

    def minimize_makespan(self):
        """The objective's makespan of the scaled J_k = base'_k + s·M_k (module doc)."""
        G, R, m, base_i = self.prob.G, self.prob.R, self.m, self.base_i
        top = self.scale * int(self.colmax.max(initial=0))
        if self.prob.objective is Objective.MAX_SUM:
            lo, hi = int(base_i.min()) * R, int(base_i.max()) * R + top * R
            Z = m.new_int_var(min(lo, 0), max(hi, 0), "Z")
            for g in range(G):
                m.add(Z >= sum(self._J(r * G + g) for r in range(R)))
            m.minimize(Z)
        elif self.prob.objective is Objective.SUM_MAX:
            Y = []
            for r in range(R):
                y = m.new_int_var(int(base_i.min()), int(base_i.max()) + top, f"Y[{r}]")
                for g in range(G):
                    m.add(y >= self._J(r * G + g))
                Y.append(y)
            m.minimize(sum(Y))
        else:
            raise InputError(f"unknown objective {self.prob.objective!r}")

    def add_hint(self, hint_ranks):
        """The caller's ranks as a hint, relabelled so that expert 0 is on rank 0 (the symmetry)."""
        P = self.prob.ep
        hint = np.asarray(hint_ranks, dtype=np.int64)
        perm = np.arange(P)
        perm[[0, hint[0]]] = perm[[hint[0], 0]]
        hint = perm[hint]
        for e in range(self.prob.num_experts):
            for p in range(P):
                self.m.add_hint(self.x[e, p], int(hint[e] == p))

    def ranks(self, solver) -> np.ndarray:
        P = self.prob.ep
        return np.array([next(p for p in range(P) if solver.value(self.x[e, p]))
                         for e in range(self.prob.num_experts)], dtype=np.int64)


def _scale(prob: LayerProblem, base_u: np.ndarray) -> int:
    """s as large as keeps every coefficient well inside 2^50, up to 10^6."""
    top = float(np.abs(base_u).max(initial=0.0)) + float(np.asarray(prob.V_EK).sum(axis=0).max(initial=0))
    return int(max(1, min(10**6, 2**40 / max(top * prob.R, 1.0))))


def solve_layer_cpsat(prob: LayerProblem, time_limit: float = 10.0, hint_ranks=None,
                      scale: int | None = None, workers: int = 1,
                      params: dict | None = None) -> LayerPlacementResult:
    """Solve one layer's row-aware placement exactly (module doc)."""
    cp_model = _solvers.cp_model()
    t0 = time.perf_counter()
    if prob.num_experts % prob.ep:
        raise InputError(f"E={prob.num_experts} is not divisible by ep={prob.ep}")
    gamma = prob.gamma if prob.gamma > 0 else 1.0
    base_u = prob.base_K / gamma  # base in units of γ
    scale = _scale(prob, base_u) if scale is None else scale
    model = _LayerModel(cp_model, prob, np.rint(base_u * scale).astype(np.int64), scale)
    model.add_assignment()
    model.add_peaks()
    model.add_symmetry()
    model.minimize_makespan()
    if hint_ranks is not None:
        model.add_hint(hint_ranks)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit)
    solver.parameters.num_workers = int(workers)
    for key, val in (params or {}).items():
        setattr(solver.parameters, key, val)
    st = solver.solve(model.m)
    status = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible",
              cp_model.INFEASIBLE: "infeasible"}.get(st, "unknown")
    eps = prob.R / 2.0  # scaling error in units (module doc)
    bound = (solver.best_objective_bound - eps) * gamma / scale if status != "infeasible" else math.inf
    ranks = None
    obj = math.inf
    if st in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        ranks = model.ranks(solver)
        obj = layer_objective(prob, ranks)  # re-scored exactly, in floating point
    return LayerPlacementResult(ranks=ranks, status=status, objective=obj, bound=bound,
                                wall_s=time.perf_counter() - t0)


def layer_gaps(state, layers=None, time_limit: float = 10.0) -> list[dict]:
    """Per layer: the local search's makespan (the state's current ranks, other layers fixed),
    the exact optimum / proved bound of that layer's problem, and the gap (LS / bound − 1)."""
    out = []
    for l in (range(state.V_LEK.shape[0]) if layers is None else layers):
        prob = layer_problem(state, l)
        ls = layer_objective(prob, state.rank_LE[l])
        res = solve_layer_cpsat(prob, time_limit=time_limit, hint_ranks=state.rank_LE[l])
        out.append({"layer": int(l), "local_search": ls, "exact": res.objective,
                    "bound": res.bound, "status": res.status,
                    "gap": ls / res.bound - 1.0 if res.bound > 0 else math.inf,
                    "wall_s": res.wall_s})
    return out

"""Exact per-layer expert placement (docs/pipeline.md, step 1, optional): CP-SAT, with LPT as its hint.

Legend: L MoE layers, E logical experts, P EP ranks, M = E / P expert slots per rank,
j = index of an expert in decreasing-load order.

Per layer the problem is balanced multiway number partitioning (the "k-partitioning" problem,
Babel, Kellerer & Kotov 1998): split the E expert loads into P groups of exactly M, minimising the
largest group sum (the busiest rank). The model:

    x[j, p] ∈ {0, 1}                  expert j on rank p
    Σ_p x[j, p] = 1                   every expert on one rank
    Σ_j x[j, p] = M                   every rank holds M experts
    Σ_j load[j] · x[j, p] ≤ z         z is the busiest rank's load
    symmetry: ranks are interchangeable, so order them by their heaviest expert
    minimise z,  z ∈ [combinatorial lower bound, hint makespan]

The hint is the caller's (the CLI and the experiments pass LPT improved by pairwise swaps off the
busiest rank, :func:`routepack_opt.heuristics.placement.lpt.swap_refine`; the models import no
heuristic). A layer whose hint already meets the combinatorial lower bound (average, and the
pigeonhole/cardinality bounds below) is proved optimal without calling the solver. Every returned
placement is re-checked through :func:`routepack_opt.core.evaluate.expert_rank_loads`. The bound is
:func:`routepack_opt.core.bounds.layer_lower_bound`.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from routepack_opt.core.bounds import layer_lower_bound
from routepack_opt.core.checks import INT32_MAX, MAX_WORKERS, check_int, check_time_limit, int_array
from routepack_opt.core.errors import InputError
from routepack_opt.core.evaluate import expert_rank_loads
from routepack_opt.core.plan import check_placement, placement_from_ranks
from routepack_opt.models import _solvers

__all__ = ["PlacementReport", "exact_placement", "solve_layer", "layer_lower_bound"]

@dataclasses.dataclass(frozen=True)
class _LayerResult:
    ranks_E: np.ndarray  # rank of each expert (logical order)
    makespan: int
    bound: int
    status: str
    method: str
    seconds: float


def solve_layer(load_E, ep: int, hint_ranks_E, time_limit: float = 1.0, num_workers: int = 1,
                seed: int = 0) -> _LayerResult:
    """Minimise the busiest rank of one layer. ``hint_ranks_E`` (each expert's rank, E/P per rank;
    e.g. LPT + swaps) is the start and the fallback; the result is never worse than the hint."""
    load_E = int_array(load_E, "load_E", ndim=1, lo=0)
    ep = check_int(ep, "ep", 1, max(1, load_E.size))
    if load_E.size % ep:
        raise InputError(f"placement: E={load_E.size} experts is not divisible by ep={ep}")
    check_time_limit(time_limit, "placement: time_limit")
    num_workers = check_int(num_workers, "num_workers", 1, MAX_WORKERS)
    seed = check_int(seed, "seed", 0, INT32_MAX)
    hint_ranks_E = int_array(hint_ranks_E, "hint_ranks_E", ndim=1, lo=0, hi=ep - 1)
    if hint_ranks_E.size != load_E.size:
        raise InputError(f"hint_ranks_E: {hint_ranks_E.size} ranks for {load_E.size} experts")
    cp_model = _solvers.cp_model()
    t0 = time.perf_counter()
    E = load_E.size
    M = E // ep
    hint_ranks_E = np.asarray(hint_ranks_E, dtype=np.int64)
    hint_ms = int(np.bincount(hint_ranks_E, weights=load_E, minlength=ep).max())
    lb = layer_lower_bound(load_E, ep)
    if hint_ms <= lb or ep == 1:
        return _LayerResult(hint_ranks_E, hint_ms, hint_ms, "optimal", "bounds", time.perf_counter() - t0)

    order = np.argsort(-load_E, kind="stable")  # j -> expert
    a = load_E[order]
    # Hint relabelled to the symmetry-breaking order: ranks by their heaviest expert.
    hint_j = hint_ranks_E[order]
    first = {}
    for j, p in enumerate(hint_j.tolist()):
        first.setdefault(p, j)
    relabel = {p: q for q, p in enumerate(sorted(first, key=first.get))}

    model = cp_model.CpModel()
    x = {(j, p): model.new_bool_var(f"x[{j},{p}]") for j in range(E) for p in range(ep)}
    z = model.new_int_var(lb, hint_ms, "z")
    # every expert on exactly one rank
    for j in range(E):
        model.add_exactly_one(x[j, p] for p in range(ep))
    # every rank holds exactly M experts, and its load is at most z
    for p in range(ep):
        model.add(sum(x[j, p] for j in range(E)) == M)
        model.add(sum(int(a[j]) * x[j, p] for j in range(E)) <= z)
    # symmetry: rank p may take expert j only if rank p-1 already holds an expert heavier than j
    # (ranks ordered by their heaviest expert). y[j, p] = rank p holds one of experts 0..j.
    y = {}
    for p in range(ep):
        for j in range(E):
            y[j, p] = model.new_bool_var(f"y[{j},{p}]")
            prev = [y[j - 1, p]] if j else []
            model.add_bool_or(prev + [x[j, p]]).only_enforce_if(y[j, p])
            model.add_implication(x[j, p], y[j, p])
            if prev:
                model.add_implication(prev[0], y[j, p])
            if p > 0:
                if j == 0:
                    model.add(x[j, p] == 0)
                else:
                    model.add_implication(x[j, p], y[j - 1, p - 1])
    model.minimize(z)
    for j in range(E):
        for p in range(ep):
            model.add_hint(x[j, p], int(relabel[int(hint_j[j])] == p))

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit)
    solver.parameters.num_workers = int(num_workers)
    solver.parameters.random_seed = int(seed)
    code = solver.solve(model)
    status = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible",
              cp_model.INFEASIBLE: "infeasible", cp_model.MODEL_INVALID: "invalid"}.get(code, "unknown")
    bound = max(lb, int(np.ceil(solver.best_objective_bound - 1e-9))) if status in ("optimal", "feasible") else lb
    ranks_E, makespan = hint_ranks_E, hint_ms
    if status in ("optimal", "feasible"):
        ranks_j = np.array([[solver.value(x[j, p]) for p in range(ep)] for j in range(E)]).argmax(axis=1)
        cand = np.empty(E, dtype=np.int64)
        cand[order] = ranks_j
        ms = int(np.bincount(cand, weights=load_E, minlength=ep).max())
        if ms < makespan:
            ranks_E, makespan = cand, ms
    if status == "optimal":
        bound = makespan
    elif makespan <= bound:  # the hint met the solver's bound
        status, bound = "optimal", makespan
    else:
        status = "feasible"
    return _LayerResult(ranks_E, makespan, bound, status, "cpsat", time.perf_counter() - t0)


@dataclasses.dataclass(frozen=True)
class PlacementReport:
    """Exact placement of every layer with its certificate, and LPT's proved gap.

    ``objective_L[l]`` is the busiest rank's load of ``placement`` at layer l, ``bound_L[l]`` a
    proved lower bound on it for any placement, ``status_L[l]`` ``optimal`` (objective = bound)
    or ``feasible``; ``lpt_gap_L = lpt_makespan_L / bound_L`` (≥ 1; 1 = LPT proved optimal);
    ``hint_makespan_L`` is LPT after swap refinement (the solver's start).
    """

    placement: np.ndarray
    objective_L: np.ndarray
    bound_L: np.ndarray
    status_L: tuple[str, ...]
    method_L: tuple[str, ...]
    lpt_makespan_L: np.ndarray
    hint_makespan_L: np.ndarray
    seconds: float
    time_limit: float

    @property
    def lpt_gap_L(self) -> np.ndarray:
        return _ratio(self.lpt_makespan_L, self.bound_L)

    @property
    def hint_gap_L(self) -> np.ndarray:
        """LPT + swap refinement's proved gap per layer."""
        return _ratio(self.hint_makespan_L, self.bound_L)

    @property
    def gap_L(self) -> np.ndarray:
        """The returned placement's own proved gap per layer."""
        return _ratio(self.objective_L, self.bound_L)

    @property
    def proved(self) -> bool:
        return all(s == "optimal" for s in self.status_L)

    def summary(self) -> dict:
        lg = self.lpt_gap_L
        return {"layers": int(self.objective_L.size), "proved_layers": sum(s == "optimal" for s in self.status_L),
                "objective": int(self.objective_L.sum()), "bound": int(self.bound_L.sum()),
                "lpt_makespan": int(self.lpt_makespan_L.sum()),
                "lpt_gap_mean": float(lg.mean()), "lpt_gap_max": float(lg.max()),
                "swap_gap_mean": float(self.hint_gap_L.mean()), "swap_gap_max": float(self.hint_gap_L.max()),
                "gap_max": float(self.gap_L.max()), "seconds": self.seconds,
                "time_limit_per_layer": self.time_limit}


def _ratio(num, den) -> np.ndarray:
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    return np.divide(num, den, out=np.ones_like(num), where=den > 0)


def exact_placement(load_LE, ep: int, hint_LE, lpt_LE=None, time_limit: float = 1.0,
                    num_workers: int = 1, seed: int = 0) -> PlacementReport:
    """Per-layer exact placement (CP-SAT, ``time_limit`` seconds per layer, ``hint_LE`` as hint).

    ``hint_LE`` is a heuristic placement [L, E] (the CLI and experiments pass LPT + swaps,
    :func:`routepack_opt.heuristics.placement.lpt.swap_refine`); ``lpt_LE`` the plain LPT one the
    report's ``lpt_*`` figures describe (default: the hint). Returns the best placement found
    (never worse than the hint at any layer), each layer's status, objective and proved bound,
    and LPT's proved gap. Loads must be integers ≥ 0.
    """
    load_LE = int_array(load_LE, "placement: loads [L, E]", ndim=2)
    L, E = load_LE.shape
    ep = check_int(ep, "ep", 1)
    num_workers = check_int(num_workers, "num_workers", 1, MAX_WORKERS)
    seed = check_int(seed, "seed", 0, INT32_MAX)
    if ep < 1 or E % ep:
        raise InputError(f"placement: E={E} experts is not divisible by ep={ep}")
    if (load_LE < 0).any():
        raise InputError("placement: expert loads must be ≥ 0")
    check_time_limit(time_limit, "placement: time_limit")
    t0 = time.perf_counter()
    M = E // ep
    hint_LE = np.asarray(hint_LE, dtype=np.int64)
    errs = check_placement(hint_LE, L, E)
    if errs:
        raise InputError("placement hint: " + errs[0])
    lpt_LE = hint_LE if lpt_LE is None else np.asarray(lpt_LE, dtype=np.int64)
    lpt_ms_L = expert_rank_loads(load_LE, lpt_LE, ep).max(axis=1).astype(np.int64)
    hint_ms_L = expert_rank_loads(load_LE, hint_LE, ep).max(axis=1).astype(np.int64)
    placement = np.empty((L, E), dtype=np.int64)
    obj, bnd, status, method = [], [], [], []
    for l in range(L):
        res = solve_layer(load_LE[l], ep, hint_LE[l] // M, time_limit, num_workers, seed)
        placement[l] = placement_from_ranks(res.ranks_E[None], load_LE[l][None], ep)[0]
        obj.append(res.makespan)
        bnd.append(res.bound)
        status.append(res.status)
        method.append(res.method)
    objective_L = np.asarray(obj, dtype=np.int64)
    # Independent re-check through the evaluator's projection.
    check_L = expert_rank_loads(load_LE, placement, ep).max(axis=1)
    if not np.array_equal(check_L.astype(np.int64), objective_L):
        raise RuntimeError("exact placement: evaluator disagrees with the claimed busiest-rank loads")
    return PlacementReport(placement=placement, objective_L=objective_L,
                           bound_L=np.asarray(bnd, dtype=np.int64), status_L=tuple(status),
                           method_L=tuple(method), lpt_makespan_L=lpt_ms_L, hint_makespan_L=hint_ms_L,
                           seconds=time.perf_counter() - t0, time_limit=float(time_limit))


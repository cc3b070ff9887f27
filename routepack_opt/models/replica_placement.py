"""Exact replica placement at a fixed layout (CP-SAT), under the even-local rule the runtime
applies — replica counts and their ranks are the variables; used on tiny windows to prove how far
the heuristic's replicas are from the optimum for its packing.

Legend: L layers, E logical experts, P EP ranks, S = E + redundant slots per layer (S/P per
rank), x a cell (r, d) with EP rank q_x inside its shard, k = r·G + g a row-shard block,
``c[x, l, e]`` the cell's tokens of expert e (fixed by the layout).

With the layout fixed, the even-local rule sends replica j of an expert with n replicas
``a(c, n, j, q) = ⌊c/n⌋ + [(j − q) mod n < c mod n]`` tokens from cell x (core.placement), and
replica j sits on the j-th lowest rank holding the expert (replicas of one expert on distinct
ranks; slots ascend with ranks). So every rank's load is linear in indicator variables:

    y[l,e,p] ∈ {0,1}     a replica of e on rank p            Σ_e y = S/P ∀p;  Σ_p y ≥ 1 ∀e
    u[l,e,n] ∈ {0,1}     e has n replicas                     Σ_n u = 1;  Σ_n n·u = Σ_p y
    v[l,e,p,j] ∈ {0,1}   e's replica on p is its j-th         Σ_j v = y[l,e,p];  Σ_j j·v = Σ_{p'<p} y[l,e,p']
    b[l,e,p,n,j] ∈ {0,1} y ∧ u[n] ∧ v[p,j]                   b ≤ u[n], b ≤ v[p,j], Σ_{n,j} b = y
    W[k,l,p] = Σ_e Σ_{n,j} b[l,e,p,n,j] · Σ_{x∈k} a(c[x,l,e], n, j, q_x)
    M[k,l] ≥ W[k,l,p];  max-sum: Z ≥ Σ_{k∈g} (base_k + γ Σ_l M[k,l]);  sum-max: Y_r ≥ ...

(b is exact: with y = 1 exactly one u[n] and one v[p,j] are 1, so only that b may be 1 and the sum
forces it; with y = 0 every b is 0.) Integer scaling as in :mod:`routepack_opt.models.placement_rowaware`:
the unit is γ/s µs, the attention and overhead terms ``base_k`` round by ≤ 1/2 unit, a makespan
sums ≤ R of them, so the reported bound subtracts R/2 units; every returned placement is re-scored
by the one evaluator. :func:`brute_force_replicas` enumerates every placement (tiny cases).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time

import numpy as np

from routepack_opt.core.cost import CostModel
from routepack_opt.core.errors import InputError
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.core.layout import Layout
from routepack_opt.core.objective import Objective, check_objective
from routepack_opt.core.placement import Placement, split_counts
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import Window
from routepack_opt.models import _solvers

__all__ = ["ReplicaResult", "solve_replicas_cpsat", "brute_force_replicas", "placement_from_y", "layer_choices"]


@dataclasses.dataclass(frozen=True)
class ReplicaResult:
    placement: Placement | None
    status: str  # optimal / feasible / infeasible / unknown
    objective: float  # the evaluator's makespan of ``placement`` at the layout
    bound: float  # proved lower bound (scaling error subtracted)
    wall_s: float


def placement_from_y(y_LEP: np.ndarray, ep: int) -> Placement:
    """The :class:`Placement` with a replica of e on every rank p where ``y[l, e, p]``."""
    y = np.asarray(y_LEP, dtype=np.int64)
    L, E, P = y.shape
    cnt = y.sum(axis=2)
    K = int(cnt.max())
    rank_LEK = np.full((L, E, K), -1, dtype=np.int64)
    for l in range(L):
        for e in range(E):
            r = np.flatnonzero(y[l, e])
            rank_LEK[l, e, :r.size] = r
    return Placement.from_ranks(rank_LEK, cnt, ep)


def _cell_counts(window: Window, layout: Layout, topology: Topology) -> tuple[np.ndarray, np.ndarray]:
    D = topology.dp
    c_XLE = np.zeros((layout.rows * D, window.num_layers, window.num_experts), dtype=np.int64)
    np.add.at(c_XLE, layout.row * D + layout.slot, window.counts)
    q_D = np.empty(D, dtype=np.int64)
    q_D[topology.slots_of_shard()] = np.arange(topology.ep)[None, :]
    return c_XLE, q_D


def _block_shares(window: Window, topology: Topology, layout: Layout, nmax: int) -> np.ndarray:
    """``A[k, l, e, n, j]``: tokens replica j of an n-replica expert e gets from block k under the
    even-local rule (fixed by the layout)."""
    L, E, G, R, D = window.num_layers, window.num_experts, topology.num_shards, layout.rows, topology.dp
    c_XLE, q_D = _cell_counts(window, layout, topology)
    blk_X = (np.arange(R * D) // D) * G + topology.shard_array()[np.arange(R * D) % D]
    A = np.zeros((R * G, L, E, nmax + 1, nmax), dtype=np.int64)
    for x in range(R * D):
        for l in range(L):
            for e in range(E):
                c = int(c_XLE[x, l, e])
                if c:
                    for n in range(1, nmax + 1):
                        A[blk_X[x], l, e, n, :n] += split_counts(c, n, int(q_D[x % D]))
    return A


def _add_placement(m, L: int, E: int, P: int, nmax: int, per: int) -> tuple[dict, dict]:
    """y[l,e,p], u[l,e,n], v[l,e,p,j] and their product b[l,e,p,n,j] (module docstring), with
    S/P replicas a rank and one replica count an expert. Returns (y, b)."""
    y = {(l, e, p): m.new_bool_var(f"y[{l},{e},{p}]") for l in range(L) for e in range(E) for p in range(P)}
    u = {(l, e, n): m.new_bool_var(f"u[{l},{e},{n}]") for l in range(L) for e in range(E) for n in range(1, nmax + 1)}
    v = {(l, e, p, j): m.new_bool_var(f"v[{l},{e},{p},{j}]")
         for l in range(L) for e in range(E) for p in range(P) for j in range(min(nmax, p + 1))}
    b = {}
    for l, e, p in itertools.product(range(L), range(E), range(P)):
        # slots: every rank holds S/P replicas; every expert ≥ 1 (≤ nmax) of them
        for n in range(1, nmax + 1):
            for j in range(min(n, p + 1)):
                b[l, e, p, n, j] = m.new_bool_var(f"b[{l},{e},{p},{n},{j}]")
                m.add_implication(b[l, e, p, n, j], u[l, e, n])
                m.add_implication(b[l, e, p, n, j], v[l, e, p, j])
        m.add(sum(b[l, e, p, n, j] for n in range(1, nmax + 1) for j in range(min(n, p + 1))) == y[l, e, p])
        # index: the replica on p is the j-th, j = replicas on lower ranks
        m.add(sum(v[l, e, p, j] for j in range(min(nmax, p + 1))) == y[l, e, p])
        m.add(sum(j * v[l, e, p, j] for j in range(min(nmax, p + 1)))
              == sum(y[l, e, pp] for pp in range(p))).only_enforce_if(y[l, e, p])
    for l in range(L):
        for p in range(P):
            m.add(sum(y[l, e, p] for e in range(E)) == per)
        for e in range(E):
            m.add_exactly_one(u[l, e, n] for n in range(1, nmax + 1))
            m.add(sum(n * u[l, e, n] for n in range(1, nmax + 1)) == sum(y[l, e, p] for p in range(P)))
    return y, b


def _add_peaks(m, A: np.ndarray, b: dict, P: int) -> dict:
    """``M[k, l]`` ≥ every rank's load under the rule."""
    K, L, E, n1, _ = A.shape
    Mx = {}
    for k in range(K):
        for l in range(L):
            hi = int(A[k, l].max(axis=(1, 2)).sum()) if A[k, l].size else 0
            Mx[k, l] = m.new_int_var(0, max(hi, 0), f"M[{k},{l}]")
            for p in range(P):
                terms = [int(A[k, l, e, n, j]) * b[l, e, p, n, j] for e in range(E) for n in range(1, n1)
                         for j in range(min(n, p + 1)) if A[k, l, e, n, j]]
                if terms:
                    m.add(Mx[k, l] >= sum(terms))
    return Mx


def _minimise_makespan(m, objective: Objective, base_i: np.ndarray, Mx: dict, span: int, scale: int,
                       R: int, G: int, L: int) -> None:
    """The objective over blocks k = r·G + g of cost ``base_k + scale · Σ_l M[k, l]``."""
    if objective is Objective.MAX_SUM:
        Z = m.new_int_var(min(0, int(base_i.min()) * R), span, "Z")
        for g in range(G):
            m.add(Z >= sum(int(base_i[r * G + g]) + scale * sum(Mx[r * G + g, l] for l in range(L))
                           for r in range(R)))
        m.minimize(Z)
    else:
        Y = []
        for r in range(R):
            yr = m.new_int_var(min(0, int(base_i.min())), span, f"Y[{r}]")
            for g in range(G):
                m.add(yr >= int(base_i[r * G + g]) + scale * sum(Mx[r * G + g, l] for l in range(L)))
            Y.append(yr)
        m.minimize(sum(Y))


def solve_replicas_cpsat(window: Window, topology: Topology, cost: CostModel, layout: Layout,
                         objective: Objective | str = Objective.MAX_SUM, time_limit: float = 10.0,
                         hint: Placement | None = None, workers: int = 1,
                         scale: int | None = None) -> ReplicaResult:
    """The optimal replica placement for ``layout`` (module docstring)."""
    cp_model = _solvers.cp_model()
    objective = check_objective(objective)
    t0 = time.perf_counter()
    topology.check_experts(window.num_experts)
    L, E, P, G, R = window.num_layers, window.num_experts, topology.ep, topology.num_shards, layout.rows
    S = topology.num_slots(E)
    if S > E * P:
        raise InputError("replicas: more slots than one replica per (expert, rank)")
    nmax = min(P, S - E + 1)
    A = _block_shares(window, topology, layout, nmax)
    ev = Evaluator(window, topology, cost)
    base_RG = ev.costs(Placement.identity(L, E, P, S - E), layout.row, layout.slot, R, parts=True)[1].sum(axis=0)
    base_K = base_RG.reshape(-1) + cost.row_overhead
    gamma = cost.gamma if cost.gamma > 0 else 1.0
    top = float(base_K.max() / gamma) + float(A.sum(axis=(2, 3, 4)).max()) * L
    if scale is None:
        scale = int(max(1, min(10**6, 2**40 / max(top * R, 1.0))))
    base_i = np.rint(base_K / gamma * scale).astype(np.int64)

    m = cp_model.CpModel()
    y, b = _add_placement(m, L, E, P, nmax, S // P)
    Mx = _add_peaks(m, A, b, P)
    span = int(base_i.max()) * R + scale * int(sum(A[k].sum() for k in range(R * G))) + 1
    _minimise_makespan(m, objective, base_i, Mx, span, scale, R, G, L)
    if hint is not None:
        hr = hint.replica_ranks()
        for (l, e, p), var in y.items():
            m.add_hint(var, int(p in hr[l, e].tolist()))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit)
    solver.parameters.num_workers = int(workers)
    st = solver.solve(m)
    status = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible",
              cp_model.INFEASIBLE: "infeasible"}.get(st, "unknown")
    bound = (solver.best_objective_bound - R / 2.0) * gamma / scale if status != "infeasible" else math.inf
    pl, obj = None, math.inf
    if st in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        y_LEP = np.array([[[solver.value(y[l, e, p]) for p in range(P)] for e in range(E)] for l in range(L)])
        pl = placement_from_y(y_LEP, P)
        obj = ev.score_layout(pl, layout, objective).makespan
    return ReplicaResult(placement=pl, status=status, objective=obj, bound=bound,
                         wall_s=time.perf_counter() - t0)


def layer_choices(E: int, P: int, per: int):
    """Every y[E, P] (0/1) with column sums S/P and every row ≥ 1."""
    cols = list(itertools.combinations(range(E), per))
    for choice in itertools.product(cols, repeat=P):
        y = np.zeros((E, P), dtype=np.int64)
        for p, es in enumerate(choice):
            y[list(es), p] = 1
        if y.sum(axis=1).min() >= 1:
            yield y


def brute_force_replicas(window: Window, topology: Topology, cost: CostModel, layout: Layout,
                         objective: Objective | str = Objective.MAX_SUM) -> tuple[float, Placement]:
    """(optimal makespan, placement) over every replica placement with replicas of one expert on
    distinct ranks, each scored by the one evaluator at ``layout`` (tiny cases only)."""
    L, E, P = window.num_layers, window.num_experts, topology.ep
    per = topology.num_slots(E) // P
    layers = list(layer_choices(E, P, per))
    if len(layers) ** L > 20_000:
        raise InputError("brute force: too many replica placements")
    ev = Evaluator(window, topology, cost)
    best, arg = math.inf, None
    for combo in itertools.product(layers, repeat=L):
        pl = placement_from_y(np.stack(combo), P)
        val = ev.score_layout(pl, layout, objective).makespan
        if val < best:
            best, arg = val, pl
    assert arg is not None
    return best, arg

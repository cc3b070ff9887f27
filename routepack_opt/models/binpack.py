"""Exact one-dimensional bin-packing models behind one interface (:func:`solve_bin_packing`).

- ``"cpsat"``: OR-Tools CP-SAT over item *types* (distinct sizes): ``y[j, k]`` copies of type j
  in bin k. Symmetry breaking: items larger than C/2 are fixed one per bin in bins 0..L-1; the
  other bins are ordered by non-increasing load (and used bins form a prefix). FFD gives the hint.
- ``"arcflow"``: the arc-flow integer program of Valério de Carvalho (1999), "Exact solution of
  bin-packing problems using column generation and branch-and-bound", Annals of OR 86:629–659.
  Nodes are partial bin loads 0..C; an item arc (d, d+w_j) for type j only leaves loads reachable
  by items of larger types (items enter a bin by non-increasing size, at most b_j copies), plus a
  loss arc from every node to the sink. ``z`` bins = flow out of node 0; min z. Built in Pyomo,
  solved by HiGHS (``appsi_highs``), warm-started from FFD. Its LP relaxation equals the
  Gilmore–Gomory bound, so the MIP proves most optima quickly.

Every packing a model returns is re-checked in integer arithmetic (:func:`is_packing`) before
it is reported; the arc-flow *lower* bound rests on HiGHS' floating-point dual bound.

Legend: ``sizes_N`` item sizes, ``bin_N`` bin per item, ``w_M``/``b_M`` distinct sizes
(decreasing) and their multiplicities, ``type_N`` the type of each item.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numba
import numpy as np

from routepack_opt.core.bounds import bin_lower_bound, check_sizes, is_packing
from routepack_opt.core.checks import MAX_WORKERS, check_bool, check_choice, check_int, check_time_limit, int_array
from routepack_opt.core.errors import InputError, RoutePackError
from routepack_opt.core.sizing import too_costly
from routepack_opt.models import _solvers

__all__ = ["BinPackResult", "solve_bin_packing", "arcflow_graph", "arcflow_cost", "METHODS", "warm_kernels"]

METHODS = ("auto", "cpsat", "arcflow")
# "auto" uses arc-flow while its graph stays this small, else CP-SAT.
ARCFLOW_MAX_ARCS = 100_000
CPSAT_MAX_VARS = 1_000_000  # (distinct sizes × bins) of the CP-SAT model; larger is not built
_ARCFLOW_BUILD_S_PER_ARC = 3e-5  # Pyomo build + copy into HiGHS, per arc
# The graph itself (before any model): two passes over (types × loads 0..C), ~1 ns a cell each,
# and arrays over the loads (reach, counts, alive, node lists: ~26 bytes a load); its item arcs
# (16 bytes each) stop growing past ARCFLOW_MAX_RAW_ARCS (no model that large is ever built).
_ARCFLOW_S_PER_CELL, _ARCFLOW_BYTES_PER_LOAD = 2e-9, 26
ARCFLOW_MAX_RAW_ARCS = 4_000_000
_CPSAT_BUILD_S_PER_VAR = 2e-5  # the CP-SAT model's construction in Python, per (type, bin) variable


@dataclasses.dataclass(frozen=True)
class BinPackResult:
    """Outcome of an exact model.

    ``status``: ``optimal`` (``bins`` is the proved minimum), ``feasible`` (a packing in ``bins``
    bins, optimum ≥ ``lower_bound``), ``infeasible`` (proved: no packing in ≤ ``max_bins`` bins;
    ``lower_bound`` > max_bins), ``unknown`` (nothing decided in time). ``bin_N`` is the packing
    (item order of the input) or None.
    """

    status: str
    bins: int | None
    lower_bound: int
    bin_N: np.ndarray | None
    method: str
    seconds: float


def _types(sizes_N: np.ndarray):
    """Distinct sizes in decreasing order, their multiplicities and each item's type."""
    w_asc, inv, b_asc = np.unique(sizes_N, return_inverse=True, return_counts=True)
    m = w_asc.size
    return w_asc[::-1].copy(), b_asc[::-1].copy(), (m - 1 - inv).astype(np.int64)


def _unpack(counts_MK: np.ndarray, type_N: np.ndarray) -> np.ndarray:
    """Turn per-bin type counts into a bin per item (extra copies are dropped)."""
    bin_N = np.full(type_N.size, -1, dtype=np.int64)
    for j in range(counts_MK.shape[0]):
        items = np.flatnonzero(type_N == j)
        bins = np.repeat(np.arange(counts_MK.shape[1]), np.maximum(counts_MK[j], 0))
        k = min(items.size, bins.size)
        bin_N[items[:k]] = bins[:k]
    return bin_N


def _compact(bin_N: np.ndarray) -> np.ndarray:
    """Renumber used bins 0..B-1 (in order of first use by bin id)."""
    _, inv = np.unique(bin_N, return_inverse=True)
    return inv.astype(np.int64)


# ---------------------------------------------------------------- CP-SAT


def cpsat_solver(time_limit: float, num_workers: int):
    """A CP-SAT solver with the time limit (10 ms at least), workers and fixed seed these
    bin-packing models use."""
    cp_model = _solvers.cp_model()
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, float(time_limit))
    solver.parameters.num_workers = int(num_workers)
    solver.parameters.random_seed = 0
    return solver


def _solve_cpsat(sizes_N, C, lb, max_bins, hint_N, time_limit, num_workers, decision):
    cp_model = _solvers.cp_model()
    w, b, type_N = _types(sizes_N)
    m, K = w.size, max_bins
    model = cp_model.CpModel()
    large = np.flatnonzero(2 * w > C)                       # types whose items need a bin each
    L = int(b[large].sum()) if large.size else 0
    # y[j, k]: copies of type j in bin k (bounded by demand and by what fits).
    y = {(j, k): model.new_int_var(0, int(min(b[j], C // w[j])), f"y[{j},{k}]")
         for j in range(m) for k in range(K)}
    # Items larger than C/2 each get their own bin 0..L-1, in decreasing size (symmetry).
    k = 0
    fixed = np.zeros((m, K), dtype=np.int64)
    for j in large:
        for _ in range(int(b[j])):
            fixed[j, k] = 1
            k += 1
    for j in large:
        for kk in range(K):
            model.add(y[j, kk] == int(fixed[j, kk]))
    # Demand: every item packed exactly once.
    for j in range(m):
        model.add(sum(y[j, kk] for kk in range(K)) == int(b[j]))
    load = [model.new_int_var(0, C, f"load[{kk}]") for kk in range(K)]
    for kk in range(K):
        model.add(load[kk] == sum(int(w[j]) * y[j, kk] for j in range(m)))
    # Redundant: the loads add up to the total volume.
    model.add(sum(load) == int(sizes_N.sum()))
    # Symmetry: bins without a large item are interchangeable → non-increasing loads.
    for kk in range(L, K - 1):
        model.add(load[kk] >= load[kk + 1])
    if not decision:
        used = [model.new_bool_var(f"used[{kk}]") for kk in range(K)]
        for kk in range(K):
            model.add(load[kk] <= C * used[kk])
            if kk < L:
                model.add(used[kk] == 1)
        for kk in range(K - 1):
            model.add(used[kk] >= used[kk + 1])
        model.add(sum(used) >= lb)
        model.minimize(sum(used))
    # Hint: a heuristic packing, bins renumbered as the symmetry breaking expects.
    if hint_N is not None and int(hint_N.max()) < K:
        hc = np.zeros((m, K), dtype=np.int64)
        np.add.at(hc, (type_N, hint_N), 1)
        loads = (w[:, None] * hc).sum(0)
        has_large = hc[large].sum(0) > 0 if large.size else np.zeros(K, bool)
        lb_bins = [kk for kk in range(K) if has_large[kk]]
        # large bins ordered by their large item's type, then the rest by load
        lb_bins.sort(key=lambda kk: (int(np.flatnonzero(hc[large, kk])[0]) if large.size else 0))
        rest = sorted((kk for kk in range(K) if not has_large[kk]), key=lambda kk: -loads[kk])
        order = lb_bins + rest
        if len(lb_bins) == L:
            for new, old in enumerate(order):
                for j in range(m):
                    model.add_hint(y[j, new], int(hc[j, old]))
    solver = cpsat_solver(time_limit, num_workers)
    st = solver.solve(model)
    if st in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        counts = np.array([[solver.value(y[j, kk]) for kk in range(K)] for j in range(m)])
        bin_N = _compact(_unpack(counts, type_N))
        nb = int(bin_N.max()) + 1 if bin_N.size else 0
        if decision:  # no objective: only the bound we came with is proved
            return ("optimal" if nb <= lb else "feasible"), nb, min(lb, nb), bin_N
        bound = max(lb, int(math.ceil(solver.best_objective_bound - 1e-6)))
        return ("optimal" if st == cp_model.OPTIMAL or bound >= nb else "feasible"), nb, min(bound, nb), bin_N
    if st == cp_model.INFEASIBLE:
        return "infeasible", None, K + 1, None
    return "unknown", None, lb, None


# ---------------------------------------------------------------- arc-flow


@numba.njit(cache=True)
def _arcflow_arcs(w, b, C, max_arcs):
    """Item arcs (tail, type) of the reduced arc-flow graph; see the module docstring. Stops
    (returning ``max_arcs`` + 1 arcs) once there are more than ``max_arcs``."""
    m = w.size
    reach = np.zeros(C + 1, dtype=np.bool_)
    reach[0] = True
    cnt = np.empty(C + 1, dtype=np.int64)
    n_arcs = 0
    cap = 1024
    tails = np.empty(cap, dtype=np.int64)
    types = np.empty(cap, dtype=np.int64)
    for j in range(m):
        wj = w[j]
        # cnt[x]: fewest copies of type j on top of a load reachable by larger types
        for x in range(C + 1):
            if reach[x]:
                cnt[x] = 0
            elif x >= wj and cnt[x - wj] >= 0 and cnt[x - wj] < b[j]:
                cnt[x] = cnt[x - wj] + 1
            else:
                cnt[x] = -1
        for x in range(C + 1 - wj):
            if cnt[x] >= 0 and cnt[x] < b[j]:
                if n_arcs == cap:
                    cap *= 2
                    t2 = np.empty(cap, dtype=np.int64)
                    y2 = np.empty(cap, dtype=np.int64)
                    t2[:n_arcs] = tails[:n_arcs]
                    y2[:n_arcs] = types[:n_arcs]
                    tails, types = t2, y2
                tails[n_arcs] = x
                types[n_arcs] = j
                n_arcs += 1
                if n_arcs > max_arcs:
                    return tails[:n_arcs], types[:n_arcs], reach
        for x in range(C + 1):
            if cnt[x] >= 0:
                reach[x] = True
    return tails[:n_arcs], types[:n_arcs], reach


@numba.njit(cache=True)
def _alive_loads(tail_A, head_A, reach, C, slack):
    """Loads that can still end a bin with waste ≤ ``slack`` (backward pass, heads > tails)."""
    alive = np.zeros(C + 1, dtype=np.bool_)
    for d in range(C + 1):
        alive[d] = reach[d] and C - d <= slack
    order = np.argsort(-tail_A)
    for a in order:
        if alive[head_A[a]]:
            alive[tail_A[a]] = True
    return alive


def arcflow_cost(sizes, capacity) -> tuple[float, float]:
    """(bytes, seconds) that building :func:`arcflow_graph` takes at most: what a caller checks
    (:func:`routepack_opt.core.sizing.too_costly`) before asking for it."""
    sizes_N, C = check_sizes(sizes, capacity)
    cells = float(np.unique(sizes_N).size) * (C + 1)
    return _ARCFLOW_BYTES_PER_LOAD * (C + 1.0) + 32.0 * ARCFLOW_MAX_RAW_ARCS, _ARCFLOW_S_PER_CELL * cells


def arcflow_graph(sizes, capacity, max_bins: int | None = None) -> dict | None:
    """The reduced arc-flow graph: item arcs ``tail_A``, ``type_A`` (head = tail + w[type]),
    loads ``nodes`` (each with a loss arc to the sink), ``w``, ``b``, ``type_N``.

    With ``max_bins`` = K, a bin can waste at most ``slack`` = K·C − Σ s, so loss arcs only
    leave loads ≥ C − slack and loads that cannot reach one are dropped (for K = Σ s / C only
    exactly full bins remain). ``alive_source`` False proves no packing into K bins exists.
    None when the graph has more than ``ARCFLOW_MAX_RAW_ARCS`` item arcs before pruning (the
    search stops there). Its cost grows with types × C: see :func:`arcflow_cost`.
    """
    sizes_N, C = check_sizes(sizes, capacity)
    if max_bins is not None:
        max_bins = check_int(max_bins, "max_bins", 1)
    w, b, type_N = _types(sizes_N)
    tail_A, type_A, reach = _arcflow_arcs(w, b, C, ARCFLOW_MAX_RAW_ARCS)
    if tail_A.size > ARCFLOW_MAX_RAW_ARCS:
        return None
    slack = C if max_bins is None else int(max_bins) * C - int(sizes_N.sum())
    alive_source = slack >= 0
    loss_from = np.flatnonzero(reach)
    if max_bins is not None and slack < C:
        head_A = tail_A + w[type_A]
        alive = _alive_loads(tail_A, head_A, reach, C, max(slack, -1))
        keep = alive[tail_A] & alive[head_A]
        tail_A, type_A = tail_A[keep], type_A[keep]
        alive_source = bool(alive[0]) and slack >= 0
        loss_from = np.flatnonzero(reach & alive & (C - np.arange(C + 1) <= slack))
        nodes = np.flatnonzero(alive)
    else:
        nodes = np.flatnonzero(reach)
    return {"tail_A": tail_A, "type_A": type_A, "nodes": nodes, "loss_from": loss_from, "w": w,
            "b": b, "type_N": type_N, "capacity": C, "alive_source": alive_source}


def _solve_arcflow(sizes_N, C, lb, max_bins, hint_N, time_limit, graph=None):
    t0 = time.perf_counter()
    g = graph if graph is not None else arcflow_graph(sizes_N, C, max_bins)
    if g is None:  # too many arcs to build a model of
        return "unknown", None, lb, None
    if not g["alive_source"]:  # no bin path wastes little enough: K bins are impossible
        return "infeasible", None, max_bins + 1, None
    built = _arcflow_model(g, lb, max_bins)
    if built is None:  # some item fits in no bin wasting ≤ slack
        return "infeasible", None, max_bins + 1, None
    mdl, tails, heads = built
    Highs, _ = _solvers.appsi_highs()
    opt = Highs()
    if hint_N is not None and int(hint_N.max()) < max_bins and _arcflow_warm_start(mdl, g, hint_N):
        opt.config.warmstart = True
    opt.config.load_solution = False
    opt.config.mip_gap = 0.0
    opt.highs_options = {"threads": _solvers.highs_threads(1), "random_seed": 0, "mip_abs_gap": 1 - 1e-6}
    # appsi copies the model into HiGHS inside solve() (about as long as building it took) and
    # loading the solution costs as much again: keep the whole call within the time limit.
    built_s = time.perf_counter() - t0
    if 3.0 * built_s > time_limit:
        return "unknown", None, lb, None
    # HiGHS checks its clock between LP solves and nodes: on Hard28's arc-flow models it stopped
    # 0.42-0.45 s past its limit (1.5 s and 3.3 s limits), so it gets 90 % of what is left, less 0.4 s
    opt.config.time_limit = max(0.05, float(0.9 * (time_limit - 3.0 * built_s) - 0.4))
    with _solvers.quiet_appsi_highs():
        res = opt.solve(mdl)
    tc = res.termination_condition.name
    if tc in ("infeasible", "infeasibleOrUnbounded"):
        return "infeasible", None, max_bins + 1, None
    bound = res.best_objective_bound
    proved = lb if bound is None or not math.isfinite(bound) else max(lb, int(math.ceil(bound - 1e-6)))
    if res.best_feasible_objective is None:
        return "unknown", None, proved, None
    res.solution_loader.load_vars()
    x = mdl.x
    flow = np.array([int(round(x[a].value or 0)) for a in range(tails.size)], dtype=np.int64)
    bin_N = _decompose(flow, tails, heads, g["type_A"], g["tail_A"].size, g["type_N"])
    if bin_N is None:
        return "unknown", None, proved, None
    bin_N = _compact(bin_N)
    nb = int(bin_N.max()) + 1 if bin_N.size else 0
    proved = min(proved, nb)
    return ("optimal" if proved >= nb else "feasible"), nb, proved, bin_N


def _arcflow_model(g: dict, lb: int, max_bins: int):
    """The arc-flow MILP of graph ``g`` in Pyomo: (model, arc tails, arc heads), item arcs first,
    then the loss arcs (load → sink, head −1; node 0's is an empty bin, harmless); None when an
    item type has no arc."""
    pyo = _solvers.pyomo()
    w, b = g["w"], g["b"]
    tail_A, type_A, nodes, loss_from = g["tail_A"], g["type_A"], g["nodes"], g["loss_from"]
    A, V = tail_A.size, loss_from.size
    SINK = -1
    tails = np.concatenate([tail_A, loss_from])
    heads = np.concatenate([tail_A + w[type_A], np.full(V, SINK)])
    ub_A = np.concatenate([b[type_A], np.full(V, max_bins)])
    mdl = pyo.ConcreteModel()
    mdl.x = pyo.Var(range(A + V), domain=pyo.NonNegativeIntegers,
                    bounds=lambda _m, a: (0, int(ub_A[a])))
    mdl.z = pyo.Var(domain=pyo.NonNegativeIntegers, bounds=(int(lb), int(max_bins)))
    out_of = {int(v): [] for v in nodes}
    into = {int(v): [] for v in nodes}
    for a in range(A + V):
        out_of[int(tails[a])].append(a)
        if heads[a] != SINK:
            into[int(heads[a])].append(a)
    x = mdl.x
    mdl.source = pyo.Constraint(expr=pyo.quicksum(x[a] for a in out_of[0]) == mdl.z)
    # Flow conservation at every load except the source (the sink is implicit).
    inner = [int(v) for v in nodes if v != 0]
    mdl.flow = pyo.Constraint(inner, rule=lambda _m, v: pyo.quicksum(x[a] for a in into[v])
                              == pyo.quicksum(x[a] for a in out_of[v]))
    # Demand: at least b_j items of each type (surplus copies are dropped when unpacking).
    by_type = [[] for _ in range(w.size)]
    for a in range(A):
        by_type[int(type_A[a])].append(a)
    if any(not arcs for arcs in by_type):
        return None
    mdl.demand = pyo.Constraint(range(w.size), rule=lambda _m, j: pyo.quicksum(x[a] for a in by_type[j])
                                >= int(b[j]))
    mdl.obj = pyo.Objective(expr=mdl.z, sense=pyo.minimize)
    return mdl, tails, heads


def _arcflow_warm_start(mdl, g: dict, hint_N) -> bool:
    """Set the model's values to the packing ``hint_N``: each bin a path of non-increasing items
    from load 0, then a loss arc. False (nothing set) when a bin is no path of the graph."""
    w, type_N, tail_A, type_A, loss_from = g["w"], g["type_N"], g["tail_A"], g["type_A"], g["loss_from"]
    A, V = tail_A.size, loss_from.size
    arc_of = {(int(t), int(j)): a for a, (t, j) in enumerate(zip(tail_A, type_A))}
    loss_of = {int(v): A + i for i, v in enumerate(loss_from)}
    flow = np.zeros(A + V, dtype=np.int64)
    for k in np.unique(hint_N):
        d = 0
        for j in sorted(type_N[hint_N == k].tolist()):
            a = arc_of.get((d, j))
            if a is None:
                return False
            flow[a] += 1
            d += int(w[j])
        if d not in loss_of:
            return False
        flow[loss_of[d]] += 1
    for a in range(A + V):
        mdl.x[a].set_value(int(flow[a]))
    mdl.z.set_value(int(np.unique(hint_N).size))
    return True


def _decompose(flow, tails, heads, type_A, A, type_N):
    """Split an integral arc flow into bins (paths source → sink) and assign items to them."""
    out_of: dict[int, list[int]] = {}
    for a in np.flatnonzero(flow > 0):
        out_of.setdefault(int(tails[a]), []).append(int(a))
    flow = flow.copy()
    bin_N = np.full(type_N.size, -1, dtype=np.int64)
    pools = {int(j): list(np.flatnonzero(type_N == j)) for j in np.unique(type_N)}
    k = 0
    while True:
        arcs0 = [a for a in out_of.get(0, []) if flow[a] > 0]
        if not arcs0:
            break
        d, placed = 0, False
        while d != -1:
            nxt = next((a for a in out_of.get(d, []) if flow[a] > 0), None)
            if nxt is None:
                return None  # broken conservation (should not happen)
            flow[nxt] -= 1
            if nxt < A:
                pool = pools.get(int(type_A[nxt]))
                if pool:
                    bin_N[pool.pop()] = k
                    placed = True
            d = int(heads[nxt])
        k += placed
    if (bin_N < 0).any():
        return None
    return bin_N


# ---------------------------------------------------------------- interface


def solve_bin_packing(sizes, capacity, *, max_bins: int | None = None, method: str = "auto",
                      time_limit: float = 10.0, lower_bound_hint: int | None = None,
                      hint=None, decision: bool = False, num_workers: int = 1,
                      presolve: bool = True) -> BinPackResult:
    """Minimise the bins of a packing of ``sizes`` into bins of ``capacity`` (≤ ``max_bins``).

    ``hint`` is a packing ``bin_N`` to warm-start from: the caller's heuristic packing, e.g.
    :func:`routepack_opt.heuristics.binpack.best_packing` (FFD/BFD) — the models import no
    heuristic; without one, one item per bin. ``max_bins`` defaults to the hint's bin count.
    ``decision=True`` only asks whether a packing
    into ``max_bins`` bins exists (CP-SAT drops the objective; arc-flow still minimises, which
    costs little). ``lower_bound_hint`` is a bound already proved (default: L1/L2/DFF).
    ``method`` is one of
    ``auto``, ``cpsat``, ``arcflow``; ``num_workers`` is CP-SAT's thread count. With
    ``presolve=False`` the model runs even when the bounds already close (for tests).
    """
    t0 = time.perf_counter()
    check_choice(method, "method", METHODS)
    time_limit = check_time_limit(time_limit, "time_limit")
    if max_bins is not None:
        max_bins = check_int(max_bins, "max_bins", 1)
    if lower_bound_hint is not None:
        lower_bound_hint = check_int(lower_bound_hint, "lower_bound_hint", 0)
    check_bool(decision, "decision")
    check_bool(presolve, "presolve")
    num_workers = check_int(num_workers, "num_workers", 1, MAX_WORKERS)
    sizes_N, C = check_sizes(sizes, capacity)
    if hint is not None:
        hint = int_array(hint, "hint", ndim=1, lo=0)
        if hint.size != sizes_N.size:
            raise InputError(f"hint: {hint.size} bin ids for {sizes_N.size} items")
    n = sizes_N.size
    if n == 0:
        return BinPackResult("optimal", 0, 0, np.zeros(0, np.int64), "bounds", 0.0)
    # with a bound given, L1/L2 only (the DFF family is O(64 · 20 · N): 5 s at N = 10⁶)
    lb, _ = bin_lower_bound(sizes_N, C, thresholds=64 if lower_bound_hint is None else 0)
    if lower_bound_hint is not None:
        lb = max(lb, int(lower_bound_hint))
    heur_N, heur_bins = np.arange(n, dtype=np.int64), n  # one item per bin: always a packing
    if hint is not None:
        hint_N = np.asarray(hint, dtype=np.int64)
        if is_packing(sizes_N, C, hint_N) and np.unique(hint_N).size <= heur_bins:
            heur_N, heur_bins = _compact(hint_N), int(np.unique(hint_N).size)
    K = heur_bins if max_bins is None else int(max_bins)
    if K < 0:
        raise InputError(f"max_bins must be ≥ 0, got {max_bins}")
    elapsed = lambda: time.perf_counter() - t0  # noqa: E731
    if lb > K:
        return BinPackResult("infeasible", None, lb, None, "bounds", elapsed())
    if presolve and heur_bins <= K and (decision or heur_bins <= lb):
        status = "optimal" if heur_bins <= lb else "feasible"
        return BinPackResult(status, heur_bins, min(lb, heur_bins), heur_N, "bounds", elapsed())
    graph = None
    chosen = method
    skipped = None  # why no model ran
    if method in ("auto", "arcflow"):
        # the graph is O(types × C): sized against the memory budget and the time left first
        nbytes, seconds = arcflow_cost(sizes_N, C)
        skipped = too_costly("arc-flow graph", nbytes=nbytes, seconds=seconds, time_left=time_limit - elapsed())
        graph = arcflow_graph(sizes_N, C, K) if skipped is None else None
        if graph is None and skipped is None:
            skipped = f"arc-flow graph skipped: over {ARCFLOW_MAX_RAW_ARCS:,} arcs"
        if method == "auto":
            chosen = "arcflow" if graph is not None and graph["tail_A"].size <= ARCFLOW_MAX_ARCS else "cpsat"
    hint_N = heur_N if heur_bins <= K else None
    library = "pyomo" if chosen == "arcflow" else "cp_model"
    if chosen == "arcflow" and graph is None:
        chosen = f"arcflow ({skipped})"
    elif not _solvers.loaded(library) and _solvers.IMPORT_SECONDS[library] > time_limit - elapsed():
        # the solver's first import in this process would outrun the limit by itself
        chosen = f"{chosen} (skipped: no time to load the solver)"
    elif library == "pyomo":  # the import happens here, on the clock: it counts
        _solvers.appsi_highs()
    else:
        _solvers.cp_model()
    remaining = max(0.01, time_limit - elapsed())
    m = np.unique(sizes_N).size
    if chosen not in ("arcflow", "cpsat"):
        status, nb, proved, bin_N = "unknown", None, lb, None
    elif chosen == "arcflow" and _ARCFLOW_BUILD_S_PER_ARC * (graph["tail_A"].size + graph["nodes"].size) > remaining:
        # building the Pyomo model alone would outrun the time left (about 30 µs an arc): no start
        status, nb, proved, bin_N = "unknown", None, lb, None
        chosen = "arcflow (skipped: no time to build)"
    elif chosen == "arcflow":
        status, nb, proved, bin_N = _solve_arcflow(sizes_N, C, lb, K, hint_N, remaining, graph)
    elif m * K > CPSAT_MAX_VARS:
        # one integer per (distinct size, bin): at N = 32,768 that is ~10⁸ variables and tens
        # of GB before CP-SAT starts; the bounds and heuristic packings stand as they are
        status, nb, proved, bin_N = "unknown", None, lb, None
        chosen = "cpsat (skipped: model too large)"
    elif _CPSAT_BUILD_S_PER_VAR * m * K > 0.5 * remaining:
        # its construction (Python, ~15 µs a variable) would take most of the time left
        status, nb, proved, bin_N = "unknown", None, lb, None
        chosen = "cpsat (skipped: no time to build)"
    else:
        status, nb, proved, bin_N = _solve_cpsat(sizes_N, C, lb, K, hint_N, remaining,
                                                 num_workers, decision)
    if bin_N is not None:
        if not is_packing(sizes_N, C, bin_N, nb) or nb > K:
            raise RoutePackError(f"{chosen}: the solver returned an invalid packing")
    elif heur_bins <= K and status != "infeasible":
        # the solver found nothing better in time: keep the heuristic packing
        status, nb, bin_N = ("optimal" if proved >= heur_bins else "feasible"), heur_bins, heur_N
    return BinPackResult(status, nb, int(proved), bin_N, chosen, elapsed())


def warm_kernels() -> None:
    """Compile (or load) the arc-flow graph's kernels on a tiny instance (:mod:`routepack_opt.warmup`)."""
    sizes = np.array([35, 35, 34, 33, 30, 30, 29, 28, 27, 25, 24, 20], dtype=np.int64)
    arcflow_graph(sizes, 64)
    arcflow_graph(sizes, 64, max_bins=7)
    arcflow_graph(sizes, 64, max_bins=6)  # slack 34 < C: the live-load pass

"""The joint layout + replica placement model as a Pyomo MILP solved by HiGHS (the model:
:mod:`routepack_opt.models.layout_replicas`).

Legend: N samples, L layers, E experts, P EP ranks, D DP slots, G shards, R rows, x a cell,
k = r·G + g a row-shard block, n a replica count, j a replica index, t a remainder threshold.

The layout part is :func:`routepack_opt.models.layout_milp.build_milp`'s (continuous costs in units
of LB/1000, the attention epigraphs, both objectives); its expert term is replaced through the
``experts`` hook by the replica variables and the exact even-local split. The implications of the
CP-SAT model become big-M rows: the replica index ``Σ_j j·v[l,e,p,j] = Σ_{p'<p} y[l,e,p']`` holds
within ``±P·(1 − y[l,e,p])``, and ``z[k,l,e,p] ≥ share(n, j) − U·(2 − u[l,e,n] − v[l,e,p,j])`` with
``U`` = the layer's tokens of e (no share exceeds it).

No MIP start is given to HiGHS: the layout model's note on HiGHS 1.16 mis-mapping a start through
its presolve applies, and tiny windows need none; the caller's anytime guarantee (never worse
than the warm start, :func:`routepack_opt.models.layout.solve_layout_replicas`) covers the rest.
Every answer is re-scored by the evaluator, and a HiGHS objective that disagrees with the makespan
recomputed from its own solution is not trusted (status ``feasible``, the docs/model.md bound).
"""

from __future__ import annotations

import time

import numpy as np

from routepack_opt.models import _solvers
from routepack_opt.models.layout_common import BuildClock, BuildTimeout, prefeasibility
from routepack_opt.models.layout_milp import BUILD_SHARE, _highs, _layout, build_milp, read_answer
from routepack_opt.models.layout_replicas import ReplicaLayoutInstance, ReplicaLayoutResult, replica_result

__all__ = ["solve_replica_milp", "build_replica_milp"]


def _replica_experts(m, inst: ReplicaLayoutInstance, cells_RGP, clock: BuildClock) -> list[int]:
    """Placement (y, u, v), split (f, δ) and rank maxima M[r,g,l] (the ``experts`` hook)."""
    counts_NLE = inst.window.counts
    _add_placement(m, inst)
    clock.check()
    split = _add_split(m, inst, len(cells_RGP) * inst.topology.dp, clock)
    layers = [l for l in range(counts_NLE.shape[1]) if counts_NLE[:, l, :].any()]
    _add_rank_maxima(m, inst, cells_RGP, layers, split, clock)
    return layers


def _add_placement(m, inst: ReplicaLayoutInstance) -> None:
    """y[l,e,p] (a replica of e on rank p), u[l,e,n] (e has n replicas), v[l,e,p,j] (the replica
    on p is e's j-th): S/P slots a rank, one count an expert, j = replicas on lower ranks."""
    pyo = _solvers.pyomo()
    _, L, E = inst.window.counts.shape
    P, nmax, per = inst.topology.ep, inst.nmax, inst.slots_per_rank
    LEP = [(l, e, p) for l in range(L) for e in range(E) for p in range(P)]
    m.y = pyo.Var(LEP, domain=pyo.Binary)
    m.u = pyo.Var([(l, e, n) for l in range(L) for e in range(E) for n in range(1, nmax + 1)], domain=pyo.Binary)
    vidx = [(l, e, p, j) for (l, e, p) in LEP for j in range(min(nmax, p + 1))]
    m.v = pyo.Var(vidx, domain=pyo.Binary)
    y, u, v = m.y, m.u, m.v
    m.placement = pyo.ConstraintList()
    for l in range(L):
        for p in range(P):  # every rank holds S/P slots
            m.placement.add(sum(y[l, e, p] for e in range(E)) == per)
        for e in range(E):  # one count n per expert, n = its ranks
            ns = range(1, nmax + 1)
            m.placement.add(sum(u[l, e, n] for n in ns) == 1)
            m.placement.add(sum(n * u[l, e, n] for n in ns) == sum(y[l, e, p] for p in range(P)))
            for p in range(P):  # index j = replicas on lower ranks, when the replica exists
                js = range(min(nmax, p + 1))
                m.placement.add(sum(v[l, e, p, j] for j in js) == y[l, e, p])
                diff = sum(j * v[l, e, p, j] for j in js) - sum(y[l, e, pp] for pp in range(p))
                m.placement.add(diff <= P * (1 - y[l, e, p]))
                m.placement.add(diff >= -P * (1 - y[l, e, p]))


def _add_split(m, inst: ReplicaLayoutInstance, X: int, clock: BuildClock) -> tuple[dict, dict, dict]:
    """The split of every cell's tokens of an expert: c = n·f + Σ_t δ_t with δ unary, for every
    replica count n ≥ 2. Returns (c, f, d): the cells' token expressions and the split's terms."""
    pyo = _solvers.pyomo()
    counts_NLE = inst.window.counts
    N, L, E = counts_NLE.shape
    nmax = inst.nmax
    x = m.x
    c, f, d = {}, {}, {}
    fidx, didx = [], []
    for xc in range(X):
        for l in range(L):
            for e in range(E):
                if counts_NLE[:, l, e].any():
                    for n in range(2, nmax + 1):
                        fidx.append((xc, l, e, n))
                        didx += [(xc, l, e, n, t) for t in range(n - 1)]
    m.f = pyo.Var(fidx, domain=pyo.NonNegativeIntegers)
    m.d = pyo.Var(didx, domain=pyo.Binary)
    m.split = pyo.ConstraintList()
    for xc in range(X):
        clock.check()
        for l in range(L):
            for e in range(E):
                w = counts_NLE[:, l, e].tolist()
                if not any(w):
                    continue
                c[xc, l, e] = sum(w[i] * x[i, xc] for i in range(N) if w[i])
                for n in range(2, nmax + 1):
                    m.split.add(c[xc, l, e] == n * m.f[xc, l, e, n] + sum(m.d[xc, l, e, n, t] for t in range(n - 1)))
                    for t in range(n - 2):
                        m.split.add(m.d[xc, l, e, n, t + 1] <= m.d[xc, l, e, n, t])
                    f[xc, l, e, n] = m.f[xc, l, e, n]
                    d[xc, l, e, n] = [m.d[xc, l, e, n, t] for t in range(n - 1)]
    return c, f, d


def _add_rank_maxima(m, inst: ReplicaLayoutInstance, cells_RGP, layers, split, clock: BuildClock) -> None:
    """z[k,l,e,p] ≥ the share replica j of n on rank p receives from block k (big-M on u, v);
    M[r,g,l] ≥ Σ_e z on every rank, and P·M ≥ the block's tokens of the layer."""
    pyo = _solvers.pyomo()
    counts_NLE = inst.window.counts
    E = counts_NLE.shape[2]
    P, D, nmax = inst.topology.ep, inst.topology.dp, inst.nmax
    R, G = len(cells_RGP), len(cells_RGP[0])
    q_D = inst.q_D()
    c, f, d = split
    u, v = m.u, m.v

    def share(cells, l, e, n, j):
        if n == 1:
            return sum(c[xc, l, e] for xc in cells)
        terms = []
        for xc in cells:
            terms.append(f[xc, l, e, n])
            t = (j - int(q_D[xc % D])) % n
            if t <= n - 2:
                terms.append(d[xc, l, e, n][t])
        return sum(terms)

    zidx = [(r * G + g, l, e, p) for r in range(R) for g in range(G) for l in layers for e in range(E)
            for p in range(P) if counts_NLE[:, l, e].any()]
    m.z = pyo.Var(zidx, domain=pyo.NonNegativeReals)
    m.M = pyo.Var(range(R), range(G), layers, domain=pyo.NonNegativeReals)
    m.experts = pyo.ConstraintList()
    for r in range(R):
        for g in range(G):
            clock.check()
            k = r * G + g
            cells = cells_RGP[r][g]
            for l in layers:
                es = [e for e in range(E) if counts_NLE[:, l, e].any()]
                for p in range(P):
                    for e in es:
                        U = int(counts_NLE[:, l, e].sum())
                        for n in range(1, nmax + 1):
                            for j in range(min(n, p + 1)):
                                m.experts.add(m.z[k, l, e, p] >= share(cells, l, e, n, j)
                                              - U * (2 - u[l, e, n] - v[l, e, p, j]))
                    m.experts.add(m.M[r, g, l] >= sum(m.z[k, l, e, p] for e in es))
                m.experts.add(P * m.M[r, g, l] >= sum(c[xc, l, e] for xc in cells for e in es))


def build_replica_milp(inst: ReplicaLayoutInstance, symmetry: bool = True, deadline: float | None = None):
    """The Pyomo model of the joint problem and its cost unit (µs per model unit)."""
    return build_milp(inst, symmetry, deadline, experts=_replica_experts, slot_symmetry=False)


def solve_replica_milp(inst: ReplicaLayoutInstance, time_limit: float = 60.0, symmetry: bool = True,
                       threads: int | None = None) -> ReplicaLayoutResult:
    """Solve the joint MILP with HiGHS (module docstring); the result is re-scored by the evaluator."""
    pyo = _solvers.pyomo()
    t0 = time.perf_counter()
    reason = prefeasibility(inst)
    if reason is not None:
        return replica_result(inst, "highs", "infeasible", None, None, float("inf"), t0, None, 0.0,
                              {"reason": reason})
    try:
        m, unit = build_replica_milp(inst, symmetry, t0 + BUILD_SHARE * time_limit)
    except BuildTimeout as exc:
        return replica_result(inst, "highs", "unknown", None, None, inst.lower_bound(), t0, None, 0.0,
                              {"build_timeout": str(exc)})
    build_s = time.perf_counter() - t0
    opt = _highs(max(0.01, time_limit - build_s), threads, presolve=True)
    with _solvers.quiet_appsi_highs():
        res = opt.solve(m)
    info = {"status_name": str(res.termination_condition.name), "model_unit_us": unit, "build_seconds": build_s,
            "symmetry_breaking": symmetry}
    status, bound, _, claimed = read_answer(res, m, inst, unit, info)
    if status in ("infeasible", "unknown"):
        return replica_result(inst, "highs", status, None, None, bound, t0, None, 0.0, info)
    L, E, P = inst.window.num_layers, inst.window.num_experts, inst.topology.ep
    y_LEP = np.array([[[int(round(pyo.value(m.y[l, e, p]))) for p in range(P)] for e in range(E)]
                      for l in range(L)], dtype=np.int64)
    info["solver_makespan"] = claimed
    return replica_result(inst, "highs", status, _layout(m, inst), y_LEP,
                          bound, t0, claimed, 0.0, info)

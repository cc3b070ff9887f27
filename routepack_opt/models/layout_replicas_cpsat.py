"""The joint layout + replica placement model in CP-SAT (the model: :mod:`routepack_opt.models.layout_replicas`).

Legend: N samples, L layers, E experts, P EP ranks, D DP slots, G shards, R rows, x a cell,
k = r·G + g a row-shard block, n a replica count, j a replica index, t a remainder threshold.

The layout part (assignment, coverage, capacity, nonempty, equal counts, attention epigraphs, the
objectives, the integer scaling and its error bound) is the layout model's
(:mod:`routepack_opt.models.layout_cpsat`, ``_Model``); this module replaces its expert term —
``M[r,g,l]`` from fixed per-sample rank loads — by the replica variables and the exact
even-local split, and keeps the slot order out of the symmetry breaking. The expert term counts
tokens, so the scaling error is the layout model's (attention only).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from routepack_opt.core.placement import Placement
from routepack_opt.models import _solvers
from routepack_opt.models.layout_common import BuildTimeout, canonical_layout, gap_of, prefeasibility
from routepack_opt.models.layout_cpsat import CpsatScaling, _bound, _Model, _solver
from routepack_opt.models.layout_replicas import (
    ReplicaLayoutInstance,
    ReplicaLayoutResult,
    cell_counts,
    model_loads,
    replica_result,
)

__all__ = ["solve_replica_cpsat"]


class _ReplicaModel(_Model):
    """The layout model with the replica placement and the even-local split as variables."""

    SLOT_SYMMETRY = False  # q rotates the split: slots of a block are not interchangeable
    inst: ReplicaLayoutInstance

    def add_expert_maxima(self) -> dict:
        """Placement (y, u, v), the split of every cell's tokens (f, δ) and the rank maxima
        M[r,g,l] (module docstring of layout_replicas)."""
        self._add_replica_placement()
        self.clock.check()
        self._add_split()
        self.z = {}
        if self.sc.K == 0:
            return {}
        return self._add_rank_maxima()

    def _add_replica_placement(self) -> None:
        """y (replica on rank), u (replica count), v (replica index): every rank holds S/P slots,
        one count n per expert, and the replica on p is the j-th, j = replicas on lower ranks."""
        inst, m = self.inst, self.model
        _, L, E = inst.window.counts.shape
        P, nmax, per = inst.topology.ep, inst.nmax, inst.slots_per_rank
        self.y = y = {(l, e, p): m.new_bool_var(f"y[{l},{e},{p}]")
                      for l in range(L) for e in range(E) for p in range(P)}
        self.u = u = {(l, e, n): m.new_bool_var(f"u[{l},{e},{n}]")
                      for l in range(L) for e in range(E) for n in range(1, nmax + 1)}
        self.v = v = {(l, e, p, j): m.new_bool_var(f"v[{l},{e},{p},{j}]")
                      for l in range(L) for e in range(E) for p in range(P) for j in range(min(nmax, p + 1))}
        for l in range(L):
            for p in range(P):  # every rank holds S/P slots
                m.add(sum(y[l, e, p] for e in range(E)) == per)
            for e in range(E):  # one count n per expert, n = its ranks
                m.add_exactly_one(u[l, e, n] for n in range(1, nmax + 1))
                m.add(sum(n * u[l, e, n] for n in range(1, nmax + 1)) == sum(y[l, e, p] for p in range(P)))
                for p in range(P):  # the replica on p is the j-th, j = replicas on lower ranks
                    js = range(min(nmax, p + 1))
                    m.add(sum(v[l, e, p, j] for j in js) == y[l, e, p])
                    m.add(sum(j * v[l, e, p, j] for j in js)
                          == sum(y[l, e, pp] for pp in range(p))).only_enforce_if(y[l, e, p])

    def _add_split(self) -> None:
        """The split of every cell's tokens of an expert: c = n·f + Σ_t δ_t, δ unary
        (δ_t = [t < c mod n]), for every replica count n ≥ 2."""
        cp_model = _solvers.cp_model()
        inst, m = self.inst, self.model
        counts_NLE = inst.window.counts
        _, L, E = counts_NLE.shape
        X = self.cells_RGP.shape[0] * inst.topology.dp
        self.c = {}
        self.f, self.d = {}, {}
        for x in range(X):
            self.clock.check()
            for l in range(L):
                for e in range(E):
                    w = counts_NLE[:, l, e]
                    if not w.any():
                        continue
                    c = cp_model.LinearExpr.weighted_sum(self.x[:, x].tolist(), w.tolist())
                    self.c[x, l, e] = c
                    ub = int(w.sum())
                    for n in range(2, inst.nmax + 1):
                        f = m.new_int_var(0, ub // n, f"f[{x},{l},{e},{n}]")
                        ds = [m.new_bool_var(f"d[{x},{l},{e},{n},{t}]") for t in range(n - 1)]
                        m.add(c == n * f + sum(ds))
                        for t in range(n - 2):
                            m.add_implication(ds[t + 1], ds[t])
                        self.f[x, l, e, n] = f
                        self.d[x, l, e, n] = ds

    def _add_rank_maxima(self) -> dict:
        """Loads: z ≥ the selected share; M ≥ Σ_e z on every rank; P·M ≥ the block's tokens."""
        inst, m = self.inst, self.model
        counts_NLE = inst.window.counts
        _, L, E = counts_NLE.shape
        P, nmax = inst.topology.ep, inst.nmax
        R, G, _ = self.cells_RGP.shape
        q_D = inst.q_D()
        u, v = self.u, self.v
        M: dict = {}
        for r in range(R):
            for g in range(G):
                self.clock.check()
                k = r * G + g
                cells = [int(x) for x in self.cells_RGP[r, g]]
                for l in range(L):
                    es = [e for e in range(E) if counts_NLE[:, l, e].any()]
                    if not es:
                        continue
                    tot = int(counts_NLE[:, l, :].sum())
                    mk = m.new_int_var(0, tot, f"M[{r},{g},{l}]")
                    for p in range(P):
                        zs = []
                        for e in es:
                            z = m.new_int_var(0, int(counts_NLE[:, l, e].sum()), f"z[{k},{l},{e},{p}]")
                            self.z[k, l, e, p] = z
                            zs.append(z)
                            U = int(counts_NLE[:, l, e].sum())
                            for n in range(1, nmax + 1):
                                for j in range(min(n, p + 1)):
                                    m.add(z >= self._share(cells, l, e, n, j, q_D)
                                          - U * (2 - u[l, e, n] - v[l, e, p, j]))
                        m.add(mk >= sum(zs))
                    m.add(P * mk >= sum(self.c[x, l, e] for x in cells for e in es))
                    M[r, g, l] = mk
        return M

    def _share(self, cells, l, e, n, j, q_D):
        """Σ over the block's cells of what replica j of n receives (even-local rule)."""
        if n == 1:
            return sum(self.c[x, l, e] for x in cells)
        D = self.inst.topology.dp
        terms = []
        for x in cells:
            terms.append(self.f[x, l, e, n])
            t = (j - int(q_D[x % D])) % n
            if t <= n - 2:
                terms.append(self.d[x, l, e, n][t])
        return sum(terms)

    def hint_replicas(self, row_N, slot_N, placement: Placement) -> None:
        """A complete hint: layout, placement, split and every epigraph at its implied value."""
        m, inst = self.model, self.inst
        m.clear_hints()
        D = inst.topology.dp
        cell_N = np.asarray(row_N) * D + np.asarray(slot_N)
        N, C = self.x.shape
        onehot = np.zeros((N, C), dtype=np.int64)
        onehot[np.arange(N), cell_N] = 1
        for i in range(N):
            for c in range(C):
                m.add_hint(self.x[i, c], int(onehot[i, c]))
        ranks = placement.replica_ranks()
        cnt = placement.logcnt
        for (l, e, p), var in self.y.items():
            m.add_hint(var, int(p in ranks[l, e, :cnt[l, e]].tolist()))
        for (l, e, n), var in self.u.items():
            m.add_hint(var, int(cnt[l, e] == n))
        for (l, e, p, j), var in self.v.items():
            m.add_hint(var, int(j < cnt[l, e] and ranks[l, e, j] == p))
        c_XLE = cell_counts(inst, row_N, slot_N)
        for (x, l, e, n), f in self.f.items():
            q, rem = divmod(int(c_XLE[x, l, e]), n)
            m.add_hint(f, q)
            for t, dv in enumerate(self.d[x, l, e, n]):
                m.add_hint(dv, int(t < rem))
        z_KLEP = model_loads(inst, row_N, slot_N, placement)
        for (k, l, e, p), var in self.z.items():
            m.add_hint(var, int(z_KLEP[k, l, e, p]))
        R, G, _ = self.cells_RGP.shape
        J = np.zeros((R, G), dtype=np.int64)
        for (s, r, g), a in self.A.items():
            val = int(max(self.sc.coef_SN[s] @ onehot[:, c] for c in self.cells_RGP[r, g]))
            m.add_hint(a, val)
            J[r, g] += val
        for (r, g, l), mv in self.M.items():
            val = int(z_KLEP[r * G + g, l].sum(axis=0).max())
            m.add_hint(mv, val)
            J[r, g] += self.sc.K * val
        if "Z" in self.obj_vars:
            m.add_hint(self.obj_vars["Z"], int(J.sum(axis=0).max()))
        else:
            for r, kv in enumerate(self.obj_vars["K"]):
                m.add_hint(kv, int(J[r].max()))

    def y_values(self, solver) -> np.ndarray:
        L, E, P = self.inst.window.num_layers, self.inst.window.num_experts, self.inst.topology.ep
        return np.array([[[int(solver.boolean_value(self.y[l, e, p])) for p in range(P)] for e in range(E)]
                         for l in range(L)], dtype=np.int64)


# Share of the time limit one CP-SAT worker spends on the fixed search (samples heaviest first
# into their lowest cell, then the replicas) before the portfolio, when num_workers > 1. The fixed
# search proves tiny windows the portfolio does not (a 6-sample, 4-cell, 2-layer window with two
# redundant slots: 2 s against no proof in 20 s).
FIXED_SHARE = 0.5


def solve_replica_cpsat(inst: ReplicaLayoutInstance, time_limit: float = 60.0, warm_start=None,
                        symmetry: bool = True, num_workers: int = 2, seed: int = 0,
                        rel_error: float = 1e-7, params: dict | None = None,
                        branching: bool = True) -> ReplicaLayoutResult:
    """Solve the joint model with CP-SAT within ``time_limit`` (construction included).
    ``warm_start`` = (row_N, slot_N, Placement) becomes a complete hint (the layout canonicalised
    for the row/shard symmetry breaking). ``branching``: one worker first follows the fixed
    strategy (heaviest samples into their lowest cell, then the replica indicators) for
    ``FIXED_SHARE`` of the limit (all of it with one worker); a proof ends the call, else the
    ``num_workers`` portfolio continues from its best answer. The answer is the best of both
    phases (by the evaluator), its bound the larger of theirs."""
    t0 = time.perf_counter()
    reason = prefeasibility(inst)
    if reason is not None:
        return replica_result(inst, "cpsat", "infeasible", None, None, float("inf"), t0, None, 0.0,
                              {"reason": reason})
    args = (symmetry, seed, rel_error, params)
    if not branching:
        return _solve_once(inst, t0, time_limit, warm_start, num_workers, False, *args)
    share = 1.0 if num_workers <= 1 else FIXED_SHARE
    first = _solve_once(inst, t0, share * time_limit, warm_start, 1, True, *args)
    left = time_limit - (time.perf_counter() - t0)
    if first.status in ("optimal", "infeasible") or share >= 1.0 or left <= 0.01:
        return dataclasses.replace(first, seconds=time.perf_counter() - t0)
    start = warm_start if first.placement is None else (first.row, first.slot, first.placement)
    second = _solve_once(inst, t0, left, start, num_workers, False, *args)
    best = first if second.score is None or (first.score is not None and first.score.key <= second.score.key) \
        else second
    bound = max(first.bound, second.bound)
    if best.objective is not None:
        bound = min(bound, best.objective)
    optimal = second.status == "optimal" or (best.objective is not None and best.objective - bound
                                            <= 2 * best.rounding_error + 1e-9 * best.objective)
    info = dict(best.info, phases={"fixed": first.info.get("status_name"),
                                   "portfolio": second.info.get("status_name")})
    status = "optimal" if optimal and best.score is not None else best.status
    return dataclasses.replace(best, status=status, bound=bound, gap=gap_of(best.objective, bound),
                               seconds=time.perf_counter() - t0, info=info)


def _solve_once(inst: ReplicaLayoutInstance, t0: float, time_limit: float, warm_start, num_workers: int,
                fixed: bool, symmetry: bool, seed: int, rel_error: float, params) -> ReplicaLayoutResult:
    """One CP-SAT solve of a freshly built model; ``fixed``: one worker on the fixed strategy."""
    cp_model = _solvers.cp_model()
    t_phase = time.perf_counter()
    sc = CpsatScaling(inst, rel_error)
    try:
        mdl = _ReplicaModel(inst, sc, t_phase + time_limit)
        if symmetry:
            mdl.add_symmetry_breaking()
        mdl.minimise_makespan()
        if fixed:
            xs = [mdl.x[i, c] for i in inst.order_N for c in range(mdl.x.shape[1])]
            mdl.model.add_decision_strategy(xs + list(mdl.y.values()), cp_model.CHOOSE_FIRST,
                                            cp_model.SELECT_MAX_VALUE)
            fixed_search = type(cp_model.CpSolver().parameters.search_branching).FIXED_SEARCH
            params = {"search_branching": fixed_search, **(params or {})}
        if warm_start is not None:
            row_N, slot_N, pl = warm_start
            if symmetry:
                row_N, slot_N = canonical_layout(row_N, slot_N, inst.topology, inst.rows, inst.objective,
                                                 inst.order_N, slots=False)
            mdl.hint_replicas(row_N, slot_N, pl)
    except BuildTimeout as exc:
        return replica_result(inst, "cpsat", "unknown", None, None, inst.lower_bound(), t0, None, sc.error,
                              {"build_timeout": str(exc)})
    build_s = time.perf_counter() - t_phase
    solver = _solver(time_limit - build_s, num_workers, seed, params)
    status = solver.solve(mdl.model)
    info = {"status_name": solver.status_name(status), "scale_unit_us": sc.unit, "build_seconds": build_s,
            "num_binaries": int(mdl.x.size), "symmetry_breaking": symmetry}
    if status == cp_model.INFEASIBLE:
        return replica_result(inst, "cpsat", "infeasible", None, None, float("inf"), t0, None, sc.error, info)
    bound = _bound(inst, sc, solver.best_objective_bound)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return replica_result(inst, "cpsat", "unknown", None, None, bound, t0, None, sc.error, info)
    claimed = sc.to_us(round(solver.objective_value)) + inst.constant()
    info["solver_makespan"] = claimed
    return replica_result(inst, "cpsat", "optimal" if status == cp_model.OPTIMAL else "feasible",
                          mdl.layout(solver), mdl.y_values(solver), bound, t0, claimed, sc.error, info)

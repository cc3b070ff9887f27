"""A decomposition lower bound for the layout at fixed placement and rows (issue 53, item 1),
valid for both objectives and checked in exact integer arithmetic.

Legend: N samples, S attention stages, P EP ranks, G shards, R rows, C capacity; a block is one
(row, shard) pair: P cells, B = R·G blocks; ``a_SN[s, i] = α_s·len_i + β_s·len_i²``.

**Why it bounds the makespan.** Under both objectives the makespan is at least the mean over
shards of the summed block costs, ``Σ_{r,g} J[r,g] / G`` (``max_g Σ_r J ≥ mean_g Σ_r J`` and
``Σ_r max_g J ≥ Σ_r mean_g J``). ``J`` of a block is its attention ``Σ_s max_{d} a_s(cell d)``,
its expert peaks ``γ Σ_l max_p W`` and the row overhead. Summed over blocks the expert peaks are
at least ``γ Σ_l max_p Lagg[l,p]`` (docs/model.md); the attention is where the cheap bound is
loose: it charges the longest sample in one block only. Here every block is charged: a cell's
attention is additive over its samples, so a block b's largest cell costs at least its most
expensive sample and at least its cells' mean,

    f(b) = Σ_s max( max_{i∈b} a_si,  a_s(b) / P ),    b = P cells of ≤ C tokens each,

and ``Σ_b f(b)`` over the B blocks of any layout bounds its attention from below.

**The set-partitioning relaxation and its Lagrangian.** ``min Σ_b f(b)`` over partitions of the
samples into B blocks is a Dantzig–Wolfe master over block patterns (Desrosiers & Lübbecke 2005,
"A primer in column generation"). For any duals ρ_i (one per sample), every layout satisfies

    Σ_b f(b)  =  Σ_i ρ_i + Σ_b (f(b) − ρ(b))  ≥  Σ_i ρ_i + B · min_b (f(b) − ρ(b)),

because it has exactly B blocks — so any *lower bound* on the pricing problem ``min_b f(b) − ρ(b)``
makes a valid bound, whatever ρ is. The pricing is bounded class by class: order the samples by
decreasing attention (``order``), let a block's class be its first sample h (the first ``K``
positions each have a class, the rest share one generic class whose blocks are charged their
mean only). A block of class h holds h and some later samples ``x ∈ {0,1}``, with at most
``P·C − len_h`` further tokens, at least P − 1 further samples (nonempty cells), and at most
``P − [h big]`` further samples longer than C/2 (no cell holds two). For any θ_s ∈ [0, 1] and
μ, σ, κ ≥ 0 (weak Lagrangian duality on those three constraints, ``max ≥`` a convex combination),

    f(b) − ρ(b)  ≥  Σ_s (θ_s + (1 − θ_s)/P) a_sh − ρ_h − μ (P·C − len_h) + σ (P − 1) − κ (P − [h big])
                    + Σ_{j>h} min(0, Σ_s (1 − θ_s) a_sj / P − ρ_j + μ len_j − σ + κ [j big]).

The multipliers come from the compact LP of this relaxation (one fractional block of each
class, solved by HiGHS, its row duals); the *bound* does not trust them: it is recomputed from
them by the inequality above in integer arithmetic (costs floored to a unit ``2^-k`` µs, which
only lowers ``f``; θ on a grid of 1/2^16, the other multipliers rounded to the same fine
unit), so a solver tolerance, a time limit or a wrong dual can only weaken it, never make it
invalid (:func:`certified_attention`). The layout bound is ``(max(attention, the cheap
attention bound) + γ Σ_l max_p Lagg + B·row_overhead) / G``, rounded down.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from fractions import Fraction

import numpy as np

from routepack_opt.core.bounds import attention_lower_bound
from routepack_opt.models import _solvers
from routepack_opt.models.layout_common import LayoutInstance

__all__ = ["BlockBound", "BlockData", "Multipliers", "block_bound", "certified_attention",
           "bound_with_attention", "THETA_GRID", "MAX_LP_TERMS"]

THETA_GRID = 1 << 16  # θ_s = t_s / THETA_GRID
COST_BITS = 26  # the largest sample cost is about 2^COST_BITS units (int64-safe sums)
MAX_EXPERT_TERMS = 200_000  # expert rows' nonzeros (classes × later samples × layers × ranks)
MAX_LP_TERMS = 30_000  # assignment columns of the compact LP (K classes × later samples): ~10 s at N = 512


@dataclasses.dataclass(frozen=True)
class BlockData:
    """The integer data of the relaxation, samples in ``order`` (decreasing attention).

    ``A_SN``: costs in units of ``unit`` µs, floored; ``len_N``; ``big_N`` (2·len > C)."""

    order: np.ndarray
    A_SN: np.ndarray  # int64
    len_N: np.ndarray  # int64
    big_N: np.ndarray  # int64 0/1
    unit: float  # µs per cost unit (a power of two)
    P: int
    C: int
    blocks: int
    classes: int  # K: positions 0..K-1 have their own class; the rest share the generic one
    E_NM: np.ndarray | None = None  # int64 γ·b[i, l, p] in cost units (m = l·P + p), floored; or None

    @classmethod
    def build(cls, lengths_N, a_SN, P: int, C: int, blocks: int, classes: int | None = None,
              expert_NLP=None) -> BlockData:
        """``expert_NLP``: γ·b_NLP (µs) to charge every block its expert peaks too (small windows)."""
        lengths_N = np.asarray(lengths_N, dtype=np.int64)
        a_SN = np.atleast_2d(np.asarray(a_SN, dtype=np.float64))
        N = lengths_N.size
        order = np.lexsort((np.arange(N), -a_SN.sum(axis=0))).astype(np.int64)
        top = float(a_SN.max(initial=0.0))
        if expert_NLP is not None:
            expert_NLP = np.asarray(expert_NLP, dtype=np.float64)
            top = max(top, float(expert_NLP.max(initial=0.0)))
        unit = math.ldexp(1.0, (math.frexp(top)[1] if top > 0 else 0) - COST_BITS)
        A_SN = np.floor(a_SN[:, order] / unit).astype(np.int64)  # exact: unit is a power of two
        E_NM = None
        if expert_NLP is not None:
            E_NM = np.floor(expert_NLP[order].reshape(N, -1) / unit).astype(np.int64)
        len_N = lengths_N[order]
        big_N = (2 * len_N > C).astype(np.int64)
        K = N if classes is None else max(0, min(N, int(classes)))
        return cls(order, A_SN, len_N, big_N, unit, int(P), int(C), int(blocks), K, E_NM)

    @property
    def num_samples(self) -> int:
        return int(self.len_N.size)


@dataclasses.dataclass(frozen=True)
class Multipliers:
    """Integer multipliers of the bound, in the fine unit ``unit / (P·THETA_GRID)`` µs.

    ``rho_N`` per sample (in ``order``); per class k (K own classes, then the generic one):
    ``t_KS`` (θ·THETA_GRID, 0..THETA_GRID; the generic class ignores it), ``mu_K`` (per token),
    ``sigma_K``, ``kappa_K`` (all ≥ 0); with expert costs, ``q_KM`` (per layer l, the weights
    φ_lp·THETA_GRID of its P ranks, m = l·P + p: ≥ 0, Σ_p ≤ THETA_GRID)."""

    rho_N: np.ndarray
    t_KS: np.ndarray
    mu_K: np.ndarray
    sigma_K: np.ndarray
    kappa_K: np.ndarray
    q_KM: np.ndarray | None = None


def _rank_weights(q_KM, P: int) -> np.ndarray:
    """``q_KM`` clipped to φ ≥ 0 with Σ_p φ_lp ≤ 1 per layer (``max_p W ≥ Σ_p φ_p W_p``)."""
    q = np.maximum(np.asarray(q_KM, dtype=np.int64), 0)
    K, M = q.shape
    q3 = q.reshape(K, M // P, P)
    tot = q3.sum(axis=2, keepdims=True)
    over = tot > THETA_GRID
    q3 = np.where(over, (q3 * THETA_GRID) // np.maximum(tot, 1), q3)
    return q3.reshape(K, M)


def certified_attention(data: BlockData, mult: Multipliers) -> Fraction:
    """The bound of ``mult`` on Σ over the blocks of every layout of the block's attention,
    f summed over blocks (module docstring) — with ``data.E_NM``, of attention plus expert peaks
    ``γ Σ_l max_p W`` — as an exact rational in µs. Valid for any integer multipliers with
    t ∈ [0, THETA_GRID] and μ, σ, κ ≥ 0 (they are clipped to that domain)."""
    N, K, P, Th = data.num_samples, data.classes, data.P, THETA_GRID
    E_NM = data.E_NM
    q_KM = None
    if E_NM is not None:
        q_KM = _rank_weights(mult.q_KM if mult.q_KM is not None else np.zeros((K + (K < N), E_NM.shape[1])), P)
    t_KS = np.clip(np.asarray(mult.t_KS, dtype=np.int64), 0, Th)
    mu_K, sigma_K, kappa_K = (np.maximum(np.asarray(v, dtype=np.int64), 0)
                              for v in (mult.mu_K, mult.sigma_K, mult.kappa_K))
    rho_N = np.asarray(mult.rho_N, dtype=np.int64)
    A_SN, len_N, big_N = data.A_SN, data.len_N, data.big_N
    cap = P * data.C
    worst = None
    for k in range(K + (1 if K < N else 0)):
        generic = k == K
        h = -1 if generic else k
        t_S = np.zeros(A_SN.shape[0], np.int64) if generic else t_KS[k]
        later = slice(K, N) if generic else slice(h + 1, N)
        coef = ((Th - t_S)[:, None] * A_SN[:, later]).sum(axis=0) - rho_N[later] \
            + mu_K[k] * len_N[later] - sigma_K[k] + kappa_K[k] * big_N[later]
        own = 0
        if q_KM is not None and E_NM is not None:  # expert peaks, φ-weighted: P·q·E fine units
            coef = coef.astype(object) + P * (E_NM[later].astype(object) @ q_KM[k].astype(object))
            if not generic:
                own = P * int(E_NM[h].astype(object) @ q_KM[k].astype(object))
        neg = int(np.minimum(coef, 0).astype(object).sum())
        if generic:  # P cells, no sample of its own
            const = -int(mu_K[k]) * cap + int(sigma_K[k]) * P - int(kappa_K[k]) * P
        else:
            A_S = A_SN[:, h].astype(object)
            const = int(sum(int(t) * P * a + (Th - int(t)) * a for t, a in zip(t_S.tolist(), A_S.tolist()))) \
                - int(rho_N[h]) - int(mu_K[k]) * (cap - int(len_N[h])) + int(sigma_K[k]) * (P - 1) \
                - int(kappa_K[k]) * (P - int(big_N[h]))
        m = const + own + neg
        worst = m if worst is None else min(worst, m)
    if worst is None:  # no sample
        worst = 0
    total = int(rho_N.astype(object).sum()) + data.blocks * worst
    return Fraction(total) * Fraction(data.unit) / (P * Th)


def mean_multipliers(data: BlockData) -> Multipliers:
    """The multipliers of the mean bound (ρ_i = a_i / P, nothing else): A/P, what any layout's
    blocks cost at least; the fallback when the LP gives nothing."""
    N, K = data.num_samples, data.classes
    nk = K + (1 if K < N else 0)
    rho = data.A_SN.sum(axis=0) * THETA_GRID  # a/P in fine units: A·P·Θ/P
    z = np.zeros(nk, np.int64)
    return Multipliers(rho, np.zeros((nk, data.A_SN.shape[0]), np.int64), z, z, z)



def _lp_multipliers(data: BlockData, time_limit: float) -> tuple[Multipliers | None, dict]:
    """Solve the compact LP of the relaxation (one fractional block per class, module docstring)
    with HiGHS and turn its row duals into integer multipliers; building the LP counts against
    ``time_limit`` too."""
    t_end = time.perf_counter() + time_limit
    N, K, P, S = data.num_samples, data.classes, data.P, data.A_SN.shape[0]
    a_SN = data.A_SN.astype(np.float64)  # in cost units
    lenf = data.len_N.astype(np.float64)
    bigf = data.big_N.astype(np.float64)
    classes = list(range(K)) + ([K] if K < N else [])
    # columns: per class y, t_S (own classes), x_j (later samples)
    col_cost, rows_i, rows_j, rows_v = [], [], [], []
    row_lo, row_hi = [float(data.blocks)], [float(data.blocks)]  # row 0: Σ y = B
    row_lo += [1.0] * N
    row_hi += [1.0] * N  # rows 1..N: cover
    ncol = 0
    nrow = 1 + N
    meta = []

    def add_row(lo, hi):
        nonlocal nrow
        row_lo.append(lo)
        row_hi.append(hi)
        nrow += 1
        return nrow - 1

    for k in classes:
        generic = k == K
        later = np.arange(K, N) if generic else np.arange(k + 1, N)
        y = ncol
        ncol += 1
        col_cost.append(0.0)
        t = np.arange(ncol, ncol + (0 if generic else S))
        ncol += t.size
        col_cost += [1.0] * t.size
        x = np.arange(ncol, ncol + later.size)
        ncol += x.size
        col_cost += ((a_SN[:, later].sum(axis=0) / P) if generic else np.zeros(later.size)).tolist()
        rows_i += [0]
        rows_j += [y]
        rows_v += [1.0]
        if not generic:  # y_h covers h
            rows_i.append(1 + k)
            rows_j.append(y)
            rows_v.append(1.0)
        rows_i += (1 + later).tolist()
        rows_j += x.tolist()
        rows_v += [1.0] * x.size
        t1 = t2 = None
        if not generic:
            t1, t2 = [], []
            for s in range(S):  # a_sh y − t ≤ 0;  (a_sh y + Σ a_sj x_j)/P − t ≤ 0
                r = add_row(-np.inf, 0.0)
                t1.append(r)
                rows_i += [r, r]
                rows_j += [y, int(t[s])]
                rows_v += [float(a_SN[s, k]), -1.0]
                r = add_row(-np.inf, 0.0)
                t2.append(r)
                rows_i += [r] * (2 + x.size)
                rows_j += [y, int(t[s])] + x.tolist()
                rows_v += [float(a_SN[s, k]) / P, -1.0] + (a_SN[s, later] / P).tolist()
        cap = P * data.C - (0 if generic else int(data.len_N[k]))
        card = P - (0 if generic else 1)
        bigcap = P - (0 if generic else int(data.big_N[k]))
        r_cap = add_row(-np.inf, 0.0)
        rows_i += [r_cap] * (1 + x.size)
        rows_j += [y] + x.tolist()
        rows_v += [-float(cap)] + lenf[later].tolist()
        r_card = add_row(-np.inf, 0.0)
        rows_i += [r_card] * (1 + x.size)
        rows_j += [y] + x.tolist()
        rows_v += [float(card)] + [-1.0] * x.size
        r_big = add_row(-np.inf, 0.0)
        rows_i += [r_big] * (1 + x.size)
        rows_j += [y] + x.tolist()
        rows_v += [-float(bigcap)] + bigf[later].tolist()
        u_rows = []
        if data.E_NM is not None:  # u_l ≥ W[l, p] for every rank p (γ-weighted, cost units)
            E = data.E_NM.astype(np.float64)
            M = E.shape[1]
            u = np.arange(ncol, ncol + M // P)
            ncol += u.size
            col_cost += [1.0] * u.size
            for m in range(M):
                r = add_row(-np.inf, 0.0)
                u_rows.append(r)
                own = [] if generic else [y]
                rows_i += [r] * (len(own) + 1 + x.size)
                rows_j += own + [int(u[m // P])] + x.tolist()
                rows_v += ([] if generic else [float(E[k, m])]) + [-1.0] + E[later, m].tolist()
        for xj in x.tolist():  # x_j − y ≤ 0
            r = add_row(-np.inf, 0.0)
            rows_i += [r, r]
            rows_j += [xj, y]
            rows_v += [1.0, -1.0]
        meta.append((k, t1, t2, r_cap, r_card, r_big, u_rows))
    highspy = _solvers.highspy()
    h = _new_highs(highspy)
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", _solvers.highs_threads(1))
    h.setOptionValue("random_seed", 0)
    h.setOptionValue("time_limit", float(max(time_limit, 0.01)))
    h.setOptionValue("solver", "ipm")
    h.setOptionValue("run_crossover", "off")
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = ncol, nrow
    lp.col_cost_ = np.asarray(col_cost, np.float64)
    lp.col_lower_ = np.zeros(ncol)
    lp.col_upper_ = np.full(ncol, np.inf)
    lp.row_lower_ = np.asarray(row_lo, np.float64)
    lp.row_upper_ = np.asarray(row_hi, np.float64)
    ri, rj = np.asarray(rows_i, np.int64), np.asarray(rows_j, np.int64)
    by_col = np.lexsort((ri, rj))  # column-wise storage, rows ascending inside a column
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.r_[0, np.cumsum(np.bincount(rj, minlength=ncol))].astype(np.int32)
    lp.a_matrix_.index_ = ri[by_col].astype(np.int32)
    lp.a_matrix_.value_ = np.asarray(rows_v, np.float64)[by_col]
    h.passModel(lp)
    h.setOptionValue("time_limit", float(max(t_end - time.perf_counter(), 0.01)))
    h.run()
    status = h.modelStatusToString(h.getModelStatus())
    if status != "Optimal" and t_end - time.perf_counter() > 0.05:
        # the interior point without crossover may stop short of optimal (HiGHS 1.8 on small
        # LPs ends 'Unknown' with poor duals): the dual simplex, in the time left, gives exact ones
        h.setOptionValue("solver", "simplex")
        h.setOptionValue("time_limit", float(max(t_end - time.perf_counter(), 0.01)))
        h.run()
        status = h.modelStatusToString(h.getModelStatus())
    sol = h.getSolution()
    info = {"lp_status": status, "lp_columns": ncol, "lp_rows": nrow}
    if not sol.dual_valid:
        return None, info
    info["lp_value_units"] = float(h.getInfo().objective_function_value)
    ydual = np.asarray(sol.row_dual, dtype=np.float64)
    fine = P * THETA_GRID  # fine units per cost unit
    rho = np.rint(ydual[1:1 + N] * fine).astype(np.int64)
    nk = len(classes)
    t_KS = np.zeros((nk, S), np.int64)
    mu, sigma, kappa = (np.zeros(nk, np.int64) for _ in range(3))
    q_KM = None if data.E_NM is None else np.zeros((nk, data.E_NM.shape[1]), np.int64)
    for idx, (_k, t1, t2, r_cap, r_card, r_big, u_rows) in enumerate(meta):
        if q_KM is not None:
            q_KM[idx] = np.rint(np.maximum(-ydual[u_rows], 0.0) * THETA_GRID).astype(np.int64)
        if t1 is not None:
            l1 = np.maximum(-ydual[t1], 0.0)
            l2 = np.maximum(-ydual[t2], 0.0)
            tot = l1 + l2
            theta = np.where(tot > 0, l1 / np.where(tot > 0, tot, 1.0), 0.0)
            t_KS[idx] = np.rint(theta * THETA_GRID).astype(np.int64)
        mu[idx] = int(round(max(-ydual[r_cap], 0.0) * fine))
        sigma[idx] = int(round(max(-ydual[r_card], 0.0) * fine))
        kappa[idx] = int(round(max(-ydual[r_big], 0.0) * fine))
    return Multipliers(rho, t_KS, mu, sigma, kappa, q_KM), info


def _new_highs(highspy):
    """A HiGHS object whose one-off banner (printed on the first one a process creates) goes to
    standard error, not into ``--json`` output on standard output."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no real descriptor 1 (captured): nothing to redirect
        return highspy.Highs()
    try:
        os.dup2(2, 1)
        return highspy.Highs()
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


@dataclasses.dataclass(frozen=True)
class BlockBound:
    """The decomposition bound of one instance (µs).

    ``bound``: a proved lower bound on the optimal makespan under both objectives (never below
    ``cheap``, the docs/model.md bound); ``attention``: its certified attention part (Σ over
    blocks); ``lp_value``: the LP's own attention value (µs, not certified: for diagnosis)."""

    bound: float
    cheap: float
    attention: float
    cheap_attention: float
    lp_value: float | None
    classes: int
    seconds: float
    info: dict

    def report(self) -> dict:
        return {"bound": self.bound, "cheap_bound": self.cheap, "attention": self.attention,
                "cheap_attention": self.cheap_attention, "lp_value": self.lp_value,
                "classes": self.classes, "seconds": self.seconds, **self.info}


def _down(x: Fraction) -> float:
    """The largest float ≤ x."""
    f = float(x)
    return math.nextafter(f, -math.inf) if Fraction(f) > x else f


def num_classes(N: int, blocks: int, max_terms: int = MAX_LP_TERMS) -> int:
    """K: the most own classes whose LP has at most ``max_terms`` assignment columns (all N on
    small windows), and at least one per block."""
    def terms(K: int) -> int:
        return K * (N - 1) - K * (K - 1) // 2 + (N - K)

    lo, hi = 0, N
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if terms(mid) <= max_terms else (lo, mid - 1)
    return max(lo, min(N, blocks))


def bound_with_attention(attention, b_NLP, rows: int, topology, cost) -> float:
    """``(attention + γ Σ_l max_p Lagg[l,p] + R·G·row_overhead) / G`` rounded down, for a bound
    ``attention`` (µs) on Σ over the blocks of the attention term and the per-rank loads
    ``b_NLP`` of a placement without replicas. The attention part does not depend on the
    placement: one :func:`block_bound` serves every placement at the same rows."""
    G = topology.num_shards
    expert = Fraction(cost.gamma) * int(np.asarray(b_NLP).sum(axis=0).max(axis=1).sum())
    overhead = Fraction(cost.row_overhead) * (rows * G)
    return _down((Fraction(attention) + expert + overhead) / G)


def block_bound(inst: LayoutInstance, time_limit: float = 30.0, classes: int | None = None,
                expert: bool | None = None) -> BlockBound:
    """The decomposition bound of ``inst`` (fixed placement and rows) within ``time_limit``
    seconds (each LP stops at its share; the bound of whatever duals it has is still valid).

    ``expert`` (default: where the LP stays small, ``MAX_EXPERT_TERMS``): a second relaxation
    that also charges every block its expert peaks ``γ Σ_l max_p W`` (one row per class, layer
    and rank); the bound is the better of the two. The attention-only one is always computed
    (``attention``: it holds for every placement)."""
    t0 = time.perf_counter()
    topo, cost = inst.topology, inst.cost
    P, G = topo.ep, topo.num_shards
    B = inst.rows * G
    N = inst.num_samples
    K = num_classes(N, B) if classes is None else classes
    M = inst.window.num_layers * P
    if expert is None:
        expert = (K * N - K * (K - 1) // 2) * M <= MAX_EXPERT_TERMS
    share = time_limit / (2 if expert else 1)
    data = BlockData.build(inst.window.lengths, inst.coef_SN, P, topo.capacity, B, K)
    cheap_att = attention_lower_bound(inst.window.lengths, topo, cost)
    mult, info = _lp_multipliers(data, share) if N else (None, {"lp_status": "empty"})
    att = certified_attention(data, mean_multipliers(data))
    if mult is not None:
        att = max(att, certified_attention(data, mult))
    lp_value = info.pop("lp_value_units", None)
    lp_value = None if lp_value is None else lp_value * data.unit
    bound = bound_with_attention(max(att, Fraction(cheap_att)), inst.b_NLP, inst.rows, topo, cost)
    if expert and N:
        full = BlockData.build(inst.window.lengths, inst.coef_SN, P, topo.capacity, B, K,
                               expert_NLP=cost.gamma * inst.b_NLP)
        fmult, finfo = _lp_multipliers(full, max(0.01, time_limit - (time.perf_counter() - t0)))
        info["expert_lp_status"] = finfo["lp_status"]
        if fmult is not None:
            total = certified_attention(full, fmult) + Fraction(cost.row_overhead) * B
            info["expert_bound"] = _down(total / G)
            bound = max(bound, info["expert_bound"])
    cheap = inst.lower_bound()
    return BlockBound(bound=max(bound, cheap), cheap=cheap, attention=_down(att),
                      cheap_attention=cheap_att, lp_value=lp_value, classes=K,
                      seconds=time.perf_counter() - t0, info=info)

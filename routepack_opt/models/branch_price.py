"""Branch-and-price on the decision "do the types fit in K bins?" (Ryan–Foster branching).

The question is the one :func:`routepack_opt.models.colgen.lp_pack` can only answer yes to: a
packing of the types (``w_M`` decreasing, counts ``b_M``) into at most ``K`` bins of capacity
``C``, or a proof that none exists. It decides the instances where ⌈LP⌉ = K but the optimum is
K + 1 (the non-IRUP ones), which no bound and no heuristic settles.

Model at a node: the pattern LP min Σ x_p s.t. Σ_p a_jp x_p = b_j (every item in one bin), plus
the node's branching rows (below), x ≥ 0, over the patterns that waste at most the slack
S = K·C − Σ b w (a packing into K bins wastes S in all, so no bin of it wastes more) and that the
node's rows do not bar. Each row has an artificial column of cost
``_BIG`` so that every restricted master is feasible. Columns come from an exact pricing
(:func:`_price`, compiled): a bounded knapsack DP over the types no branching row names, and an
enumeration of the counts of the types that one does.

Branching (Ryan & Foster 1981, on types): for two types i ≠ j, Q_ij = Σ_{p ∋ i, j} x_p is the
number of bins holding both, and Q_ii the number holding type i; in a packing both are integers.
The node branches on the most fractional Q (ties: the larger sizes) into Q ≤ ⌊Q⌋ and Q ≥ ⌈Q⌉,
the nearer side first, depth first. When every Q is integral (x itself is then integral in the
classical case, all counts 1), it branches on the bins holding ≥ k copies of a type, and last on
one fractional pattern's count: the search is complete.

A row Q_ij ≤ 0 bars the patterns holding both types, and Q_ij ≥ 1 on two types of one item each
bars the patterns holding one without the other (Ryan–Foster's "apart" and "together"); the
pricing skips them and the pool's copies get an upper bound of 0 at that node.

Reduced-cost fixing at the root (the listing): with the root's integer duals u, their pricing
maximum U and D = Σ b u (below), every bin of a packing into K bins has u·a ≥ D − (K − 1)·U, and
where the root's LP is tight (the hard cases: ⌈LP⌉ = K) few patterns do (Hard28: 400–1,000 of
billions), listed exactly by a compiled depth-first enumeration with a knapsack bound. When at most
``_LIST_MAX`` are, they become the only patterns: CP-SAT first decides the set partitioning over
them (Σ a x = b, Σ x ≤ K, integer x; exact, for ``_LIST_CPSAT_S`` units of its deterministic
time, so that the answer does not depend on the load), then, if undecided,
the tree below runs over them, priced as a list.

Pruning is proved in integer arithmetic: the duals are rounded to integers u (cover rows, any
sign) and ν (branching rows, with the sign their sense allows), U is the exact pricing maximum of
(u, ν) over the admissible patterns, and D = Σ b u + Σ_r rhs_r ν_r. Every x of the node satisfies
Σ x ≥ D / U (Farley's bound), so D > K·U proves that the node holds no packing into K bins, and
so does U < 0 (no admissible pattern) when D > 0. A node is only pruned on that test, so an
``infeasible`` answer rests on integer checks, not on the LP solver's tolerances. A packing is
returned as count vectors; the caller re-checks it item by item.
"""

from __future__ import annotations

import dataclasses
import time

import numba
import numpy as np

from routepack_opt.core.checks import INT32_MAX, check_int, check_time_limit, int_array
from routepack_opt.core.errors import InputError
from routepack_opt.core.sizing import too_costly
from routepack_opt.models import _solvers
from routepack_opt.models.colgen import MAX_TOTAL, SCALE, bins_of_counts, check_types

__all__ = ["BranchAndPrice", "BranchPriceResult", "decide_bins", "warm_kernels"]

_BIG = 1e4  # cost of an artificial column: any positive value keeps pruning valid; larger prunes more
_NEG = -(1 << 62)
_LIST_MAX = 5_000  # the root's reduced-cost enumeration is used when it lists at most this many patterns
# CP-SAT on the listed patterns first, for this much deterministic time (about seconds; Hard28:
# decided within 0.3 s, or not in 60 s), and at most this share of the wall time left
_LIST_CPSAT_S, _LIST_CPSAT_SHARE = 0.4, 0.25
_FRAC = 1e-6  # a branching quantity this far from an integer is fractional
_S_PER_STEP = 1e-9  # the pricing DP and the listing's table: about a nanosecond an inner step


@dataclasses.dataclass
class BranchPriceResult:
    """``status``: ``feasible`` (``bins`` is a packing into ≤ K bins, as count vectors),
    ``infeasible`` (proved: no packing into K bins), ``unknown`` (time or a node left open).
    ``nodes``: nodes solved; ``columns``: patterns generated; ``reason``: why a stage did not
    run (its tables over the memory budget or past the time left), else empty."""

    status: str
    bins: list | None
    nodes: int
    columns: int
    seconds: float
    reason: str = ""


@numba.njit(cache=True)
def _price(w_M, b_M, u_M, free_M, C, min_load, bt_T, rows_i, rows_j, rows_k, rows_e, E_QM, rows_v, kinds):
    """Exact pricing: max of Σ_j u_j a_j + Σ_r v_r [a in row r] over the patterns 0 ≤ a ≤ b with
    ``min_load`` ≤ Σ w a ≤ C that no row bars (``kinds``: see :func:`_kind`). Row r holds the
    patterns with a_{i_r} ≥ k_r and (j_r < 0 or a_{j_r} > 0), or, when e_r ≥ 0, the pattern
    ``E_QM[e_r]`` alone (its types are among ``bt_T``). Types with ``free_M`` go through a
    bounded-knapsack DP over the exact weight; the types ``bt_T`` (those the rows name) are
    enumerated, each combination completed by the best DP weight in its range. Returns (value,
    a_M); value < −2^61 when no pattern qualifies."""
    m = w_M.size
    f = np.full(C + 1, _NEG, dtype=np.int64)
    f[0] = 0
    choice = np.zeros((m, C + 1), dtype=np.int32)
    for j in range(m):
        if not free_M[j]:
            continue
        wj = w_M[j]
        kmax = min(b_M[j], C // wj)
        if kmax == 0:
            continue
        uj = u_M[j]
        g = f.copy()
        for x in range(wj, C + 1):
            best = g[x]
            bk = 0
            for k in range(1, kmax + 1):
                y = x - k * wj
                if y < 0:
                    break
                if f[y] > _NEG and f[y] + k * uj > best:
                    best = f[y] + k * uj
                    bk = k
            g[x] = best
            choice[j, x] = bk
        f = g
    # best completion for a combination of load L: max f over [max(min_load − L, 0), C − L]; the
    # window has the fixed width C − min_load while min_load ≥ L (sliding maximum, monotone
    # deque), else it starts at 0 (prefix maximum)
    width = C - max(min_load, 0)
    win = np.full(C + 1, -1, dtype=np.int64)
    pre = np.full(C + 1, -1, dtype=np.int64)
    dq = np.empty(C + 1, dtype=np.int64)
    head = 0
    tail = 0
    for hi in range(C + 1):
        if f[hi] > _NEG:
            while tail > head and f[dq[tail - 1]] <= f[hi]:
                tail -= 1
            dq[tail] = hi
            tail += 1
        while tail > head and dq[head] < hi - width:
            head += 1
        win[hi] = dq[head] if tail > head else -1
        if f[hi] > _NEG and (hi == 0 or pre[hi - 1] < 0 or f[hi] > f[pre[hi - 1]]):
            pre[hi] = hi
        else:
            pre[hi] = pre[hi - 1] if hi > 0 else -1
    T = bt_T.size
    cnt = np.full(T, -1, dtype=np.int64)
    best_cnt = np.zeros(T, dtype=np.int64)
    count = np.zeros(m, dtype=np.int64)
    best_val = _NEG
    best_x = -1
    # depth-first over the counts of the enumerated types (odometer with a capacity cut)
    t = 0
    load = 0
    val = 0
    while t >= 0:
        if t == T:
            hi = C - load
            x = win[hi] if min_load >= load else pre[hi]
            # the best completion, and the empty one (exact-pattern rows hold only that)
            for cand in range(2):
                if cand == 1:
                    if x == 0 or min_load > load or rows_e.size == 0:
                        break
                    x = 0
                if x < 0:
                    continue
                bonus = 0
                barred = False
                for r in range(rows_i.size):
                    if rows_e[r] >= 0:
                        member = x == 0
                        for q in range(T):
                            if E_QM[rows_e[r], bt_T[q]] != count[bt_T[q]]:
                                member = False
                                break
                    else:
                        member = count[rows_i[r]] >= rows_k[r] and (rows_j[r] < 0 or count[rows_j[r]] > 0)
                    if member:
                        bonus += rows_v[r]
                        barred |= kinds[r] == 1
                    elif kinds[r] == 2 and (count[rows_i[r]] > 0) != (count[rows_j[r]] > 0):
                        barred = True
                tot = val + f[x] + bonus
                if not barred and tot > best_val:
                    best_val = tot
                    best_x = x
                    best_cnt[:] = cnt
            t -= 1
            continue
        j = bt_T[t]
        if cnt[t] < 0:
            cnt[t] = 0
        else:
            load -= cnt[t] * w_M[j]
            val -= cnt[t] * u_M[j]
            cnt[t] += 1
        if cnt[t] > b_M[j] or load + cnt[t] * w_M[j] > C:
            cnt[t] = -1
            count[j] = 0
            t -= 1
            continue
        load += cnt[t] * w_M[j]
        val += cnt[t] * u_M[j]
        count[j] = cnt[t]
        t += 1
        if t < T:
            cnt[t] = -1
    a_M = np.zeros(m, dtype=np.int64)
    if best_x < 0:
        return best_val, a_M
    for q in range(T):
        a_M[bt_T[q]] = best_cnt[q]
    x = best_x
    for j in range(m - 1, -1, -1):
        if free_M[j]:
            k = choice[j, x]
            a_M[j] += k
            x -= k * w_M[j]
    return best_val, a_M


@numba.njit(cache=True)
def _enumerate(w_M, b_M, u_M, C, min_load, theta, limit):
    """Every pattern 0 ≤ a ≤ b with ``min_load`` ≤ Σ w a ≤ C and Σ u a ≥ ``theta``, depth first
    over the types with an exact bound: ``ex[j, c]``, the most Σ u a the types j.. reach at weight
    exactly c, maximised over the weights a completion may still add. Returns (count, patterns);
    stops at ``limit`` + 1 (too many)."""
    m = w_M.size
    ex = np.full((m + 1, C + 1), _NEG, dtype=np.int64)
    ex[m, 0] = 0
    for j in range(m - 1, -1, -1):
        for c in range(C + 1):
            v = ex[j + 1, c]
            for k in range(1, min(b_M[j], c // w_M[j]) + 1):
                prev = ex[j + 1, c - k * w_M[j]]
                if prev > _NEG and prev + k * u_M[j] > v:
                    v = prev + k * u_M[j]
            ex[j, c] = v
    # win[j, h]: max ex[j, c] over c in [h − width, h] (completions of a load below min_load);
    # pre[j, h]: over [0, h]
    width = C - max(min_load, 0)
    win = np.full((m + 1, C + 1), _NEG, dtype=np.int64)
    pre = np.full((m + 1, C + 1), _NEG, dtype=np.int64)
    dq = np.empty(C + 1, dtype=np.int64)
    for j in range(m + 1):
        head = 0
        tail = 0
        for h in range(C + 1):
            v = ex[j, h]
            pre[j, h] = v if h == 0 else max(pre[j, h - 1], v)
            if v > _NEG:
                while tail > head and ex[j, dq[tail - 1]] <= v:
                    tail -= 1
                dq[tail] = h
                tail += 1
            while tail > head and dq[head] < h - width:
                head += 1
            win[j, h] = ex[j, dq[head]] if tail > head else _NEG
    out = np.zeros((64, m), dtype=np.int64)
    n = 0
    a = np.zeros(m, dtype=np.int64)
    cnt = np.full(m + 1, -1, dtype=np.int64)
    load = np.zeros(m + 1, dtype=np.int64)
    val = np.zeros(m + 1, dtype=np.int64)
    d = 0
    while d >= 0 and n <= limit:
        if d == m:
            if load[m] >= min_load and val[m] >= theta:
                if n == out.shape[0]:
                    grown = np.zeros((2 * n, m), dtype=np.int64)
                    grown[:n] = out
                    out = grown
                out[n] = a
                n += 1
            d -= 1
            continue
        if cnt[d] < 0:
            hi = C - load[d]
            bound = win[d, hi] if min_load >= load[d] else pre[d, hi]
            if bound == _NEG or val[d] + bound < theta:
                d -= 1
                continue
            cnt[d] = min(b_M[d], hi // w_M[d])
        else:
            cnt[d] -= 1
        if cnt[d] < 0:
            a[d] = 0
            d -= 1
            continue
        a[d] = cnt[d]
        load[d + 1] = load[d] + cnt[d] * w_M[d]
        val[d + 1] = val[d] + cnt[d] * u_M[d]
        d += 1
        if d < m:
            cnt[d] = -1
    return n, out[:n]


@dataclasses.dataclass(frozen=True)
class _Row:
    """A branching row: the bins holding ≥ ``k`` copies of type ``i`` (and type ``j`` when
    j ≥ 0) — or, with ``exact``, the bins packed as that pattern — number ≥ ``rhs`` (``ge``) or
    ≤ ``rhs``."""

    i: int
    j: int
    ge: bool
    rhs: int
    k: int = 1
    exact: tuple | None = None

    def types(self) -> set[int]:
        if self.exact is not None:
            return {q for q, c in enumerate(self.exact) if c}
        return {self.i} | ({self.j} if self.j >= 0 else set())


# what a row rules out in every packing of its node, beyond its own inequality
_BONUS, _NOT_BOTH, _NOT_ONE = 0, 1, 2


def _kind(row: _Row, b_M) -> int:
    """``_NOT_BOTH``: no bin holds the row's types (≤ 0); ``_NOT_ONE``: two single items in one
    bin (≥ 1 with b_i = b_j = 1), so no bin holds one without the other; else ``_BONUS``."""
    if not row.ge and row.rhs <= 0:
        return _NOT_BOTH
    if row.ge and row.exact is None and row.j >= 0 and row.rhs >= 1 and b_M[row.i] == 1 and b_M[row.j] == 1:
        return _NOT_ONE
    return _BONUS


class _Pool:
    """Every pattern generated so far, rows of ``A`` (all are patterns of the instance; a node
    bars those its rows rule out)."""

    def __init__(self, m: int):
        self.A = np.zeros((256, m), dtype=np.int64)
        self.n = 0
        self.keys: set[bytes] = set()

    def add(self, a_M) -> bool:
        a_M = np.asarray(a_M, dtype=np.int64)
        key = a_M.tobytes()
        if key in self.keys or not a_M.any():
            return False
        self.keys.add(key)
        if self.n == self.A.shape[0]:
            self.A = np.concatenate([self.A, np.zeros_like(self.A)])
        self.A[self.n] = a_M
        self.n += 1
        return True

    @property
    def cols(self) -> np.ndarray:
        return self.A[:self.n]


def _member(A_PM: np.ndarray, r: _Row) -> np.ndarray:
    """(P,) bool: the patterns row ``r`` counts."""
    if r.exact is not None:
        return np.all(A_PM == np.array(r.exact, dtype=np.int64), axis=1)
    return (A_PM[:, r.i] >= r.k) & ((A_PM[:, r.j] > 0) if r.j >= 0 else True)


def _membership(A_PM: np.ndarray, rows: list[_Row]) -> np.ndarray:
    """(P, R) bool: pattern p counts in row r."""
    out = np.zeros((A_PM.shape[0], len(rows)), dtype=np.bool_)
    for q, r in enumerate(rows):
        out[:, q] = _member(A_PM, r)
    return out


def _barred(A_PM: np.ndarray, rows: list[_Row], kinds: list[int]) -> np.ndarray:
    """(P,) bool: patterns the node's rows rule out (see :func:`_kind`)."""
    pres = A_PM > 0
    out = np.zeros(A_PM.shape[0], dtype=np.bool_)
    for r, k in zip(rows, kinds):
        if k == _NOT_BOTH:
            out |= _member(A_PM, r)
        elif k == _NOT_ONE:
            out |= pres[:, r.i] != pres[:, r.j]
    return out


class _NodeLP:
    """The restricted master of one node in HiGHS: cover rows and the node's branching rows;
    the pool's patterns (those the node bars at 0), an artificial column per row, then the
    patterns added as they price out. Warm-started from the parent's basis (the new row's
    slack basic) when one is given."""

    def __init__(self, b_M, rows: list[_Row], kinds: list[int], pool: _Pool, basis=None):
        self.hs = _solvers.highspy()
        self.h = h = _solvers.simplex_lp()
        m, R = b_M.size, len(rows)
        self.m, self.rows, self.kinds = m, rows, kinds
        lo = np.concatenate([b_M.astype(np.float64), [r.rhs if r.ge else -np.inf for r in rows]])
        hi = np.concatenate([b_M.astype(np.float64), [np.inf if r.ge else r.rhs for r in rows]])
        h.addRows(m + R, lo, hi, 0, np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, np.float64))
        self.P0 = pool.n
        self._add_cols(pool.cols, np.where(_barred(pool.cols, rows, kinds), 0.0, np.inf))
        sign = np.array([1.0] * m + [1.0 if r.ge else -1.0 for r in rows])
        h.addCols(m + R, np.full(m + R, _BIG), np.zeros(m + R), np.full(m + R, np.inf), m + R,
                  np.arange(m + R, dtype=np.int32), np.arange(m + R, dtype=np.int32), sign)
        self.n_art = m + R
        if basis is not None:
            self._set_basis(basis)

    def _add_cols(self, A_PM: np.ndarray, ub: np.ndarray) -> None:
        P = A_PM.shape[0]
        if P == 0:
            return
        M = np.concatenate([A_PM.astype(np.float64), _membership(A_PM, self.rows).astype(np.float64)], axis=1)
        nz_p, nz_r = np.nonzero(M)  # row-major: grouped by column p, as HiGHS' CSC wants
        starts = np.searchsorted(nz_p, np.arange(P)).astype(np.int32)
        self.h.addCols(P, np.ones(P), np.zeros(P), ub, nz_p.size, starts, nz_r.astype(np.int32),
                       M[nz_p, nz_r])

    def add(self, a_M: np.ndarray) -> None:
        self._add_cols(a_M[None, :], np.array([np.inf]))

    def pool_index(self, x: np.ndarray) -> np.ndarray:
        """LP column values → (pattern values in pool order, artificial values)."""
        return np.concatenate([x[:self.P0], x[self.P0 + self.n_art:]]), x[self.P0:self.P0 + self.n_art]

    def _set_basis(self, basis) -> None:
        col_p, art, row = basis
        hs = self.hs
        lower = hs.HighsBasisStatus.kLower
        n_pool = self.h.getNumCol() - self.n_art
        col_p = list(col_p[:n_pool]) + [lower] * (n_pool - len(col_p))
        art = list(art) + [lower] * (self.n_art - len(art))
        row = list(row) + [hs.HighsBasisStatus.kBasic] * (self.m + len(self.rows) - len(row))
        b = hs.HighsBasis()
        b.col_status = col_p[:self.P0] + art + col_p[self.P0:]
        b.row_status = row
        b.valid = True
        self.h.setBasis(b)

    def basis(self):
        """The final basis in pool order: (pattern statuses, artificial statuses, row statuses)."""
        b = self.h.getBasis()
        cs = list(b.col_status)
        return (cs[:self.P0] + cs[self.P0 + self.n_art:], cs[self.P0:self.P0 + self.n_art], list(b.row_status))

    def solve(self, time_limit: float):
        """(row duals, pattern x in pool order, artificial x) or None when HiGHS stops short of optimal."""
        h = self.h
        h.setOptionValue("time_limit", float(max(time_limit, 0.01)))
        h.run()
        if h.getModelStatus() != self.hs.HighsModelStatus.kOptimal:
            return None
        sol = h.getSolution()
        x, art = self.pool_index(np.asarray(sol.col_value, dtype=np.float64))
        return np.asarray(sol.row_dual, dtype=np.float64), x, art


def _integer_duals(pi, rows: list[_Row], m: int):
    """Duals rounded to integers at scale SCALE, with the signs the rows allow."""
    u_M = np.floor(pi[:m] * SCALE).astype(np.int64)
    nu = []
    for q, r in enumerate(rows):
        v = int(np.floor(pi[m + q] * SCALE))
        nu.append(max(v, 0) if r.ge else min(v, 0))
    return u_M, nu


class _Pricer:
    """The node's exact pricing (:func:`_price`) with its rows' data laid out for the kernel."""

    def __init__(self, w_M, b_M, C: int, min_load: int, rows: list[_Row], kinds: list[int]):
        self.w_M, self.b_M, self.C, self.min_load = w_M, b_M, C, min_load
        named = sorted(set().union(*[r.types() for r in rows]))
        self.bt_T = np.array(named, dtype=np.int64)
        self.free_M = np.ones(w_M.size, dtype=np.bool_)
        self.free_M[self.bt_T] = False
        self.rows_i = np.array([r.i for r in rows], dtype=np.int64)
        self.rows_j = np.array([r.j for r in rows], dtype=np.int64)
        self.rows_k = np.array([r.k for r in rows], dtype=np.int64)
        exact = [r.exact for r in rows if r.exact is not None]
        self.E_QM = np.array(exact, dtype=np.int64).reshape(len(exact), w_M.size)
        self.rows_e = np.cumsum([r.exact is not None for r in rows], dtype=np.int64) - 1
        self.rows_e[[r.exact is None for r in rows]] = -1
        self.kinds = np.array(kinds, dtype=np.int64)

    def price(self, u_M, nu) -> tuple[int, np.ndarray]:
        v, a_M = _price(self.w_M, self.b_M, u_M, self.free_M, self.C, self.min_load, self.bt_T,
                        self.rows_i, self.rows_j, self.rows_k, self.rows_e, self.E_QM,
                        np.array(nu, dtype=np.int64), self.kinds)
        return int(v), a_M


class _ListPricer:
    """Exact pricing over an explicit list of every admissible pattern (after the root's
    reduced-cost enumeration, :func:`_enumerate`): one integer product per pattern."""

    def __init__(self, E_PM: np.ndarray, rows: list[_Row], kinds: list[int]):
        self.E_PM = E_PM
        self.member = _membership(E_PM, rows).astype(np.int64)
        self.barred = _barred(E_PM, rows, kinds)

    def price(self, u_M, nu) -> tuple[int, np.ndarray]:
        v_P = self.E_PM @ u_M + self.member @ np.array(nu, dtype=np.int64)
        v_P[self.barred] = _NEG
        if v_P.size == 0 or int(v_P.max()) == _NEG:
            return _NEG, np.zeros(self.E_PM.shape[1], dtype=np.int64)
        p = int(np.argmax(v_P))
        return int(v_P[p]), self.E_PM[p].copy()


def _node(w_M, b_M, C, K, min_load, rows, pool, deadline, basis, listed=None):
    """Column generation at one node (``listed``: every admissible pattern, priced as a list).
    Returns (kind, payload, basis): ("pruned", None), ("packing", bins), ("branch", (x over the
    pool, the last (u, U, D))) or ("time", None)."""
    m = w_M.size
    kinds = [_kind(r, b_M) for r in rows]
    lp = _NodeLP(b_M, rows, kinds, pool, basis)
    pricer = _Pricer(w_M, b_M, C, min_load, rows, kinds) if listed is None else _ListPricer(listed, rows, kinds)
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            return "time", None, None
        out = lp.solve(left)
        if out is None:
            return "time", None, None
        pi, x, art = out
        u_M, nu = _integer_duals(pi, rows, m)
        U, a_M = pricer.price(u_M, nu)
        D = sum(int(b) * int(u) for b, u in zip(b_M.tolist(), u_M.tolist()))
        D += sum(r.rhs * nu[q] for q, r in enumerate(rows))
        if (U < 0 and D > 0) or (U > 0 and D > K * U):
            return "pruned", None, None
        if U > SCALE and pool.add(a_M):
            lp.add(a_M)
            continue
        # converged: no pattern prices out at the rounded duals
        xi = np.rint(x)
        if art.max(initial=0.0) < 1e-9 and np.all(np.abs(x - xi) < 1e-6) and xi.sum() <= K:
            bins = bins_of_counts(xi.astype(np.int64), pool.cols, b_M)
            if bins is not None:
                return "packing", bins, None
        return "branch", (x, (u_M, U, D)), lp.basis()


def _branch_on(x_P, pool: _Pool, w_M, b_M) -> _Row | None:
    """The row to branch on (its ``rhs`` = the fractional value's floor), or None when x is
    integral. In order: the most fractional Q_ij (the bins holding types i and j; Q_ii: holding
    i), ties to the larger sizes; then the bins holding ≥ k copies of a type; then a fractional
    pattern itself (always there when x is fractional, so the search is complete)."""
    sup = np.flatnonzero(x_P > 1e-9)
    if sup.size == 0:
        return None
    A = pool.cols[sup]
    xs = x_P[sup]
    # only types in a fractional pattern can have a fractional Q
    frac_p = np.abs(xs - np.rint(xs)) > 1e-9
    cand = np.flatnonzero((A[frac_p] > 0).any(axis=0))
    if cand.size:
        pres = (A[:, cand] > 0).astype(np.float64)
        Q = np.einsum("p,pi,pj->ij", xs, pres, pres)  # no BLAS: its threads cost more than this
        F = np.triu(np.abs(Q - np.rint(Q)))
        if F.max() >= _FRAC:
            # most fractional first, then the larger sizes (smaller type indices)
            c, m = cand.size, w_M.size
            key = np.round(F, 9) * 4 * m - (cand[:, None] + cand[None, :]) / (m * m)
            a, b = np.unravel_index(int(np.argmax(np.where(F >= _FRAC, key, -np.inf))), (c, c))
            i, j = int(cand[a]), int(cand[b])
            return _Row(i, j if j != i else -1, False, int(np.floor(Q[a, b] + _FRAC)))
    for i in np.flatnonzero(b_M > 1):
        for k in range(2, int(A[:, i].max(initial=0)) + 1):
            v = float(xs[A[:, i] >= k].sum())
            if abs(v - round(v)) >= _FRAC:
                return _Row(int(i), -1, False, int(np.floor(v + _FRAC)), k=k)
    frac = np.abs(xs - np.rint(xs))
    if frac.max() < _FRAC:
        return None
    p = int(np.argmax(frac))
    return _Row(-1, -1, False, int(np.floor(x_P[sup[p]] + _FRAC)), exact=tuple(int(c) for c in A[p]))


class BranchAndPrice:
    """The search of :func:`decide_bins`, resumable: :meth:`run` continues the depth-first
    search where the last call's time ran out (the pool of patterns and the open nodes kept).

    ``columns``: patterns to start the pool with (e.g. the root LP's); those wasting more than
    the slack are dropped."""

    def __init__(self, w_M, b_M, C: int, K: int, *, columns=()):
        w_M, b_M, C, K, columns = _check_decision(w_M, b_M, C, K, columns)
        self.w_M = np.asarray(w_M, dtype=np.int64)
        self.b_M = np.asarray(b_M, dtype=np.int64)
        self.C, self.K = int(C), int(K)
        self.min_load = int((self.w_M * self.b_M).sum()) - (self.K - 1) * self.C
        self.pool = _Pool(self.w_M.size)
        for a in columns:
            a = np.minimum(np.asarray(a, dtype=np.int64), self.b_M)
            if self.min_load <= int((a * self.w_M).sum()) <= self.C:
                self.pool.add(a)
        self.stack: list[tuple[list[_Row], object]] = [([], None)]
        self.listed: np.ndarray | None = None  # every admissible pattern, once enumerated
        self.nodes, self.seconds = 0, 0.0
        self.status, self.bins = ("infeasible" if self.min_load > self.C else "unknown"), None
        self.reasons: list[str] = []
        # what one pricing (_price) and the root's listing (_enumerate) allocate and cost: tables
        # over (types × loads 0..C), and a pass of Σ_j min(b_j, C // w_j) steps per load
        m, loads = self.w_M.size, float(self.C + 1)
        steps = float(np.minimum(self.b_M, self.C // np.maximum(self.w_M, 1)).sum()) * loads
        self.price_cost = (4.0 * m * loads + 48.0 * loads, _S_PER_STEP * steps)
        self.list_cost = (24.0 * (m + 1) * loads, _S_PER_STEP * steps)

    def _reason(self, reason: str | None) -> bool:
        if reason is not None and reason not in self.reasons:
            self.reasons.append(reason)
        return reason is not None

    def run(self, time_limit: float, max_nodes: int = 1_000_000) -> BranchPriceResult:
        """Search for at most ``time_limit`` more seconds (or until ``max_nodes`` nodes in all).
        Nothing runs when one pricing's tables pass the memory budget or its estimated time the
        limit: ``unknown`` with the ``reason``."""
        time_limit = check_time_limit(time_limit, "time_limit")
        max_nodes = check_int(max_nodes, "max_nodes", 1)
        t0 = time.perf_counter()
        deadline = t0 + time_limit
        w_M, b_M, C, K = self.w_M, self.b_M, self.C, self.K
        if self.status == "unknown" and self._reason(too_costly(
                "branch-and-price pricing", nbytes=self.price_cost[0], seconds=self.price_cost[1],
                time_left=time_limit)):
            return BranchPriceResult(self.status, None, self.nodes, len(self.pool.cols), self.seconds,
                                     "; ".join(self.reasons))
        while self.status == "unknown" and self.stack and self.nodes < max_nodes:
            rows, basis = self.stack.pop()
            pool = self.pool
            kind, out, child_basis = _node(w_M, b_M, C, K, self.min_load, rows, pool, deadline, basis,
                                           self.listed)
            if kind == "time":
                self.stack.append((rows, basis))  # solved again on the next run
                break
            self.nodes += 1
            if kind == "packing" and out is not None:
                self.status, self.bins = "feasible", out
            elif kind == "branch" and not rows and self.listed is None and \
                    self._enumerate(*out[1], time_left=deadline - time.perf_counter()):
                wall = _LIST_CPSAT_SHARE * (deadline - time.perf_counter())
                self.status, self.bins = _decide_listed(self.listed, b_M, K, _LIST_CPSAT_S, wall)
                self.stack.append(([], None))  # if undecided: the root again, over the listed patterns alone
            elif kind == "branch":
                x = out[0]
                down = _branch_on(x, pool, w_M, b_M)
                if down is None:  # x integral yet no packing read off (cannot happen: covers are equalities)
                    self.stack.clear()
                    break
                up = dataclasses.replace(down, ge=True, rhs=down.rhs + 1)
                # depth first, the nearer side first (pushed last)
                q = float(x @ _member(pool.cols, down))
                pair = [(rows + [down], child_basis), (rows + [up], child_basis)]
                self.stack.extend(pair if q - down.rhs > 0.5 else pair[::-1])
            if self.status == "unknown" and not self.stack and kind != "branch":
                self.status = "infeasible"  # every node pruned
        self.seconds += time.perf_counter() - t0
        return BranchPriceResult(self.status, self.bins, self.nodes, len(self.pool.cols), self.seconds,
                                 "; ".join(self.reasons))

    def _enumerate(self, u_M, U: int, D: int, time_left: float | None = None) -> bool:
        """Reduced-cost fixing at the root: with the root's integer duals (u, U, D), a packing
        into K bins has Σ_p (U − u·a_p) = K·U − D − (K − Σ x)·U ≤ K·U − D over its bins, so each of
        its bins has u·a ≥ D − (K − 1)·U. When at most ``_LIST_MAX`` patterns (that waste at most
        the slack) do, they replace the pool and every later pricing is over them alone. True
        when that happened."""
        if U <= 0 or self._reason(too_costly("the root's pattern listing", nbytes=self.list_cost[0],
                                              seconds=self.list_cost[1], time_left=time_left)):
            return False
        n, E = _enumerate(self.w_M, self.b_M, u_M, self.C, self.min_load, D - (self.K - 1) * U, _LIST_MAX)
        if n > _LIST_MAX:
            return False
        self.listed = E
        self.pool = _Pool(self.w_M.size)
        for a in E:
            self.pool.add(a)
        return True


def _decide_listed(E_PM: np.ndarray, b_M, K: int, work: float, time_limit: float):
    """CP-SAT on the set partitioning over the listed patterns: Σ_p a_p x_p = b, Σ x ≤ K, x
    integer. Its answer is exact (integer arithmetic): ("feasible", bins), ("infeasible",
    None), or ("unknown", None) when it stops first. It stops after ``work`` units of CP-SAT's
    deterministic time (so the answer does not depend on the machine's speed or load), or at
    ``time_limit`` seconds of wall time, whichever comes first."""
    if time_limit <= 0.01 or work <= 0:
        return "unknown", None
    from routepack_opt.models.binpack import cpsat_solver

    cp_model = _solvers.cp_model()
    model = cp_model.CpModel()
    P = E_PM.shape[0]
    # a pattern's copies: at most K, and b_j / a_j for each type it holds (the empty pattern,
    # listed when K leaves a bin of slack, holds none: K alone bounds it)
    ub = [int(min([K, *(b_M[j] // E_PM[p, j] for j in np.flatnonzero(E_PM[p]))])) for p in range(P)]
    x = [model.new_int_var(0, ub[p], f"x[{p}]") for p in range(P)]
    for j in range(b_M.size):
        model.add(sum(int(E_PM[p, j]) * x[p] for p in np.flatnonzero(E_PM[:, j])) == int(b_M[j]))
    model.add(sum(x) <= K)
    solver = cpsat_solver(time_limit, 1)
    solver.parameters.max_deterministic_time = float(work)
    st = solver.solve(model)
    if st == cp_model.INFEASIBLE:
        return "infeasible", None
    if st in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        bins = bins_of_counts(np.array([solver.value(x[p]) for p in range(P)]), E_PM, b_M)
        return ("feasible", bins) if bins is not None else ("unknown", None)
    return "unknown", None


def decide_bins(w_M, b_M, C: int, K: int, *, columns=(), time_limit: float = 10.0,
                max_nodes: int = 1_000_000) -> BranchPriceResult:
    """Decide whether the types fit in ``K`` bins by branch-and-price (module docstring).

    ``columns``: patterns to start the pool with (e.g. the root LP's); those wasting more than
    the slack are dropped. Deterministic for its input up to the time limit. Memory: (distinct
    sizes) × (C + 1) cells of 4 bytes for each pricing's choice table and of 24 bytes for the
    root's listing (certify skips the search above 5 M cells); both are sized before they are
    allocated (:mod:`routepack_opt.core.sizing`): a pricing past the memory budget or the time
    limit is ``unknown`` at once, a listing past them is left out (``reason`` says which).

    Checked at entry (InputError naming the argument): ``w_M`` sizes ≥ 1 and ``b_M`` counts ≥ 0,
    two equally long 1-D integer vectors; ``C`` ≥ 1 and ``K`` ≥ 1 integers; ``columns`` count
    vectors of the types; ``time_limit`` > 0 seconds; ``max_nodes`` ≥ 1."""
    check_time_limit(time_limit, "time_limit")
    check_int(max_nodes, "max_nodes", 1)
    bp = BranchAndPrice(w_M, b_M, C, K, columns=columns)
    _warm_once()  # the first call in a process: its kernels compiled or loaded before the clock
    return bp.run(time_limit, max_nodes)


_WARMED: list[bool] = []


def _warm_once() -> None:
    if not _WARMED:
        warm_kernels()
        _WARMED.append(True)


def _check_decision(w_M, b_M, C, K, columns):
    """The arguments of :func:`decide_bins` / :class:`BranchAndPrice`, checked: the types as
    :func:`~routepack_opt.models.colgen.check_types` takes them, K ≥ 1 (a K of −1 or 2.5 is
    refused, not answered or truncated), K·C < 2⁶², the columns count vectors of the types."""
    w_M, b_M, C = check_types(w_M, b_M, C)
    K = check_int(K, "K", 1, INT32_MAX)
    if K * C > MAX_TOTAL:
        raise InputError(f"K, C: K·C = {K * C:,} must stay below 2^62")
    if isinstance(columns, np.ndarray) and columns.size == 0 or not isinstance(columns, np.ndarray) and \
            len(columns) == 0:
        return w_M, b_M, C, K, ()
    cols = int_array(columns, "columns", ndim=2, lo=0)
    if cols.shape[1] != w_M.size:
        raise InputError(f"columns: each pattern counts the {w_M.size} types; got patterns of {cols.shape[1]}")
    return w_M, b_M, C, K, cols


def warm_kernels() -> None:
    """Compile (or load from numba's cache) the pricing and the root listing on a tiny instance,
    so that no time limit pays for it (:mod:`routepack_opt.warmup`, group ``exact``)."""
    w_M, b_M = np.array([35, 30, 20], dtype=np.int64), np.array([2, 3, 1], dtype=np.int64)
    rows = [_Row(0, 1, False, 0)]
    _Pricer(w_M, b_M, 64, 40, rows, [_kind(r, b_M) for r in rows]).price(w_M, [0])
    _enumerate(w_M, b_M, w_M, 64, 40, 0, 10)

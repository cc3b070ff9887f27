"""The Gilmore–Gomory LP bound by column generation, and LP-guided packings into K bins.

Bin packing over item *types* (distinct sizes ``w_M``, decreasing, with counts ``b_M``). The
pattern LP (Gilmore & Gomory 1961) is min Σ_p x_p s.t. Σ_p a_jp x_p ≥ b_j, x ≥ 0, over the
patterns a (0 ≤ a_j ≤ b_j, Σ_j w_j a_j ≤ C). Its restricted master is solved by HiGHS' simplex
(``highspy``, warm-started after each added column); the pricing is the bounded knapsack
:func:`routepack_opt.core.bounds.knapsack_max`, a compiled DP over the capacity.

Safe bound: the master's duals π are rounded down to integers u = ⌊π·2^30⌋ and the exact
integer knapsack maximum U of u is computed; u/U is a feasible dual of the full LP whatever the
floating-point error, so ⌈Σ b u / U⌉ (:func:`routepack_opt.core.bounds.dual_bound`) is a proved
lower bound (Farley's bound when the LP has not converged yet). Column generation stops when no
pattern prices out (U ≤ 2^30), when that bound reaches ⌈master value⌉ (the rounded LP cannot rise
further) or a target, or at the time limit.

Primal side (:func:`lp_pack`), for a packing into exactly K bins with K ≥ ⌈LP⌉:

1. *residual rounding and diving* (after Belov & Scheithauer): take the LP solution's patterns
   with x ≥ 1 (⌊x⌋ copies each) or else the one of largest x, fix them as bins, lower the demands,
   re-solve the LP of the residual by column generation (columns carried over, cut to the
   residual demands) and repeat while ⌈LP⌉ + fixed bins ≤ K; after every step the residual is
   tried by FFD/BFD into the bins left. A dive that fails is retried with its first choice forbidden.
   After ``_DIVE_NODES`` LP solves the dive restarts (``_DIVE_RESTART_NODES`` each) with the order
   of its fractional moves perturbed by a seeded factor in [0.5, 1] (seed 1, 2, …): other roundings
   near the top of the tree, where a plain dive's backtracking never returns;
2. the restricted master as an integer program over every column generated, the root's and every
   dive node's (price-and-branch, HiGHS MIP), with Σ x ≤ K;
3. CP-SAT on the residual of the deepest dive with the bin count fixed to the bins left.

Every packing returned is re-checked in integer arithmetic by the caller.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from routepack_opt.core.bounds import knapsack_max, knapsack_top
from routepack_opt.core.checks import INT32_MAX, check_bool, check_int, check_time_limit, int_array
from routepack_opt.core.errors import InputError
from routepack_opt.models import _solvers

__all__ = ["LPBound", "gilmore_gomory", "check_types", "lp_pack", "types_of", "assignment", "bins_of_counts", "SCALE",
           "pricing_cost", "warm_kernels"]

SCALE = 1 << 30  # duals are rounded down to multiples of 1/SCALE before the exact knapsack
_EPS = 1e-9
_ALPHA = 0.7  # Wentges smoothing weight of the stability centre
_TOP = 8  # columns per pricing on large capacities
_DIVE_STOP_AT_CEILING = False  # the dive re-solves each residual LP to optimality (better x to round)
_DIVE_SHARE = 0.7  # of lp_pack's time: the dive; the master IP and the CP-SAT residual share the rest
# LP solves of the first dive (the successful dives on Hard28 took 26–133) and of each restart
_DIVE_NODES, _DIVE_RESTART_NODES = 150, 50


def types_of(sizes_N: np.ndarray):
    """Distinct sizes in decreasing order, their counts and each item's type."""
    w_asc, inv, b_asc = np.unique(sizes_N, return_inverse=True, return_counts=True)
    m = w_asc.size
    return w_asc[::-1].astype(np.int64), b_asc[::-1].astype(np.int64), (m - 1 - inv).astype(np.int64)


def pricing_cost(w_M: np.ndarray, b_M: np.ndarray, C: int) -> int:
    """Cells of the pricing DP (0/1 items after binary splitting × capacity): what one pricing costs."""
    k = np.minimum(b_M, C // np.maximum(w_M, 1))
    return int(np.ceil(np.log2(k + 1)).sum()) * (C + 1)


@dataclasses.dataclass
class LPBound:
    """Outcome of :func:`gilmore_gomory`.

    ``bound``: the proved ⌈Σ b u / U⌉ (0 if none); ``lp_value``: the last master value (an upper
    estimate of the LP optimum); ``converged``: no column prices out; ``u_M``, ``U``: the integer
    duals and their knapsack maximum that certify ``bound``; ``cols_PM``, ``x_P``: the master's
    columns and last solution; ``iterations``: pricing rounds.
    """

    bound: int
    lp_value: float
    converged: bool
    u_M: np.ndarray
    U: int
    cols_PM: np.ndarray
    x_P: np.ndarray
    iterations: int
    seconds: float


class _Master:
    """The restricted master LP in HiGHS: one ≥ row per type, one column per pattern, after the
    m−1 zero-cost exchange columns (−1 on type j, +1 on the next smaller type j+1): dual-optimal
    inequalities π_j ≥ π_{j+1} (Valério de Carvalho 2005) that leave the LP value unchanged and
    cut column generation's iterations (a larger item's slot can always take a smaller one)."""

    def __init__(self, b_M: np.ndarray, dual_cuts: bool = True):
        self.h = h = _solvers.simplex_lp()
        m = b_M.size
        h.addRows(m, b_M.astype(np.float64), np.full(m, np.inf), 0,
                  np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, np.float64))
        self.n_exch = max(m - 1, 0) if dual_cuts else 0
        for j in range(self.n_exch):
            h.addCol(0.0, 0.0, np.inf, 2, np.array([j, j + 1], np.int32), np.array([-1.0, 1.0]))
        self.cols: list[np.ndarray] = []
        self.keys: set[bytes] = set()

    def add(self, a_M: np.ndarray) -> bool:
        a_M = np.asarray(a_M, dtype=np.int64)
        key = a_M.tobytes()
        if key in self.keys or not a_M.any():
            return False
        self.keys.add(key)
        self.cols.append(a_M.copy())
        idx = np.flatnonzero(a_M).astype(np.int32)
        self.h.addCol(1.0, 0.0, np.inf, idx.size, idx, a_M[idx].astype(np.float64))
        return True

    def solve(self, time_limit: float):
        """(value, duals, pattern x) or None when HiGHS stops short of optimal."""
        h = self.h
        h.setOptionValue("time_limit", float(max(time_limit, 0.01)))
        h.run()
        if h.getModelStatus() != _solvers.highspy().HighsModelStatus.kOptimal:
            return None
        sol = h.getSolution()
        return (float(h.getInfo().objective_function_value), np.asarray(sol.row_dual, dtype=np.float64),
                np.asarray(sol.col_value, dtype=np.float64)[self.n_exch:])


def _seed_columns(w_M, b_M, C, packs) -> list[np.ndarray]:
    """Single-type columns (always feasible) and the bins of the given packings as patterns."""
    m = w_M.size
    cols = []
    for j in range(m):
        a = np.zeros(m, dtype=np.int64)
        a[j] = min(int(b_M[j]), C // int(w_M[j]))
        cols.append(a)
    for counts_MK in packs:
        for k in range(counts_MK.shape[1]):
            a = np.minimum(counts_MK[:, k], b_M)
            if a.any() and int((a * w_M).sum()) <= C:
                cols.append(a.astype(np.int64))
    return cols


class _Pricing:
    """Exact pricing of the master's duals (rounded down to multiples of 1/SCALE), keeping the
    best proved bound ⌈Σ b u / U⌉ with its integer duals and the stability centre ``pi_in`` (the
    duals of the best Σ b u / U so far). With ``min_load`` > 0 only patterns loading at least
    that much count. On large capacities (few items a bin) the next best Pareto states of a
    pricing go to ``extra`` as columns too."""

    def __init__(self, w_M, b_M, C: int, min_load: int):
        self.w_M, self.b_M, self.C, self.min_load = w_M, b_M, C, min_load
        self.extra: list[np.ndarray] = []
        self.best, self.best_u, self.best_U = 0, np.zeros(w_M.size, dtype=np.int64), 0
        self.pi_in = None
        self.best_frac = -1.0
        self.iterations = 0

    def price(self, pi):
        """(U, the best column) at ``pi``; records the bound it proves."""
        w_M, b_M, C = self.w_M, self.b_M, self.C
        u = np.floor(np.maximum(pi, 0.0) * SCALE).astype(np.int64)
        if C > 4096 and self.min_load <= 0:
            v_T, a_TM = knapsack_top(w_M, b_M, u, C, _TOP)
            self.extra.extend(a_TM[q] for q in range(1, v_T.size) if v_T[q] > SCALE)
            U, a_M = int(v_T[0]), a_TM[0]
        else:
            U, a_M = knapsack_max(w_M, b_M, u, C, self.min_load)
        num = int((b_M * u).sum())
        self.iterations += 1
        if U > 0 and num / U > self.best_frac:
            self.best_frac, self.pi_in = num / U, pi
            if -(-num // U) > self.best:
                self.best, self.best_u, self.best_U = -(-num // U), u, U
        return U, a_M


def _cg_round(master: _Master, pricing: _Pricing, pi_out) -> str:
    """One pricing round at the master's duals ``pi_out``: Wentges smoothing (price at a point
    between the stability centre and ``pi_out``), and on a misprice (or with no centre yet) at
    ``pi_out`` itself. Returns ``added`` (a column entered the master), ``converged`` (none
    prices out) or ``stuck`` (the column was there already: cannot happen with exact pricing)."""
    added = False
    if pricing.pi_in is not None:
        pi_sep = _ALPHA * pricing.pi_in + (1 - _ALPHA) * pi_out
        _, a_M = pricing.price(pi_sep)
        if float(pi_out @ a_M) > 1 + 1e-9:
            added = master.add(a_M)
    if not added:
        U, a_M = pricing.price(pi_out)
        if U <= SCALE:
            return "converged"
        if not master.add(a_M):
            return "stuck"
    for a in pricing.extra:
        master.add(a)
    pricing.extra.clear()
    return "added"


# Σ b·w and K·C stay far inside int64 (the pricing's tables and loads are int64)
MAX_TOTAL = 1 << 62


def check_types(w_M, b_M, C):
    """Item types as the LP and branch-and-price take them, checked (exact integers: a size 2.5
    is refused, not truncated; a zero or negative size is refused): sizes ``w_M`` ≥ 1 and
    counts ``b_M`` ≥ 0, two equally long non-empty vectors, capacity ``C`` ≥ 1, Σ b·w < 2⁶²."""
    w_M = int_array(w_M, "w_M", ndim=1, lo=1)
    b_M = int_array(b_M, "b_M", ndim=1, lo=0)
    if w_M.size == 0 or b_M.size != w_M.size:
        raise InputError(f"w_M, b_M: expected two equally long, non-empty vectors (sizes and counts of the types), "
                         f"got {w_M.size} sizes and {b_M.size} counts")
    C = check_int(C, "C", 1, MAX_TOTAL)
    total = sum(int(w) * int(b) for w, b in zip(w_M.tolist(), b_M.tolist(), strict=True))
    if total > MAX_TOTAL:
        raise InputError(f"w_M, b_M: Σ b·w = {total:,} must stay below 2^62")
    return w_M, b_M, C


def gilmore_gomory(w_M, b_M, C: int, *, columns=(), time_limit: float = 10.0, target: int | None = None,
                   stop_at_ceiling: bool = True, dual_cuts: bool = True, max_bins: int | None = None) -> LPBound:
    """The Gilmore–Gomory LP bound of the types (``w_M``, ``b_M``) in bins of capacity ``C``.

    ``columns``: patterns to start from (count vectors; cut to ``b_M``), e.g. the bins of a
    heuristic packing. Stops early once the proved bound reaches ``target`` or (with
    ``stop_at_ceiling``) ⌈master value⌉; see the module docstring. ``dual_cuts=False`` leaves
    out the exchange columns, so that the primal ``x_P`` alone covers the demands (for rounding).
    With ``max_bins`` = K the pricing only counts patterns wasting at most the slack of K bins
    (see :func:`routepack_opt.core.bounds.dual_bound`): ``bound`` is then min(K + 1, the bound),
    and K + 1 proves K bins impossible.
    Deterministic for its input up to the time limit."""
    t0 = time.perf_counter()
    w_M, b_M, C = check_types(w_M, b_M, C)
    time_limit = check_time_limit(time_limit, "time_limit", allow_inf=True)
    if target is not None:
        check_int(target, "target", 0)
    if max_bins is not None:
        max_bins = check_int(max_bins, "max_bins", 0, INT32_MAX)  # 0: a dive's node with no bin left
    check_bool(stop_at_ceiling, "stop_at_ceiling")
    check_bool(dual_cuts, "dual_cuts")
    m = w_M.size
    master = _Master(b_M, dual_cuts)
    min_load = 0 if max_bins is None else int((w_M * b_M).sum()) - (int(max_bins) - 1) * C
    cap = np.inf if max_bins is None else int(max_bins) + 1
    for a in _seed_columns(w_M, b_M, C, []):
        master.add(a)
    for a in columns:
        a = np.minimum(np.asarray(a, dtype=np.int64), b_M)
        if int((a * w_M).sum()) <= C:
            master.add(a)
    if max_bins is not None and knapsack_max(w_M, b_M, np.zeros(m, np.int64), C, min_load)[0] < 0:
        # no bin can load as much as K bins need
        return LPBound(bound=int(cap), lp_value=float("inf"), converged=True, u_M=np.zeros(m, np.int64), U=0,
                       cols_PM=np.zeros((0, m), np.int64), x_P=np.zeros(0), iterations=0,
                       seconds=time.perf_counter() - t0)
    pricing = _Pricing(w_M, b_M, C, min_load)
    value, x_P, converged = float("inf"), np.zeros(0), False
    while True:
        left = time_limit - (time.perf_counter() - t0)
        if left <= 0:
            break
        out = master.solve(left)
        if out is None:
            break
        value, pi_out, x_P = out
        ceiling = int(np.ceil(value - 1e-6))
        step = _cg_round(master, pricing, pi_out)
        converged = step == "converged"
        best = pricing.best
        if step != "added" or best >= cap or (target is not None and best >= target) or \
                (stop_at_ceiling and best >= ceiling):
            break
    cols = np.array(master.cols, dtype=np.int64).reshape(-1, m)
    if x_P.size < cols.shape[0]:  # columns added after the last master solve are at zero
        x_P = np.concatenate([x_P, np.zeros(cols.shape[0] - x_P.size)])
    return LPBound(bound=int(min(pricing.best, cap)), lp_value=value, converged=converged, u_M=pricing.best_u,
                   U=int(pricing.best_U), cols_PM=cols, x_P=x_P, iterations=pricing.iterations,
                   seconds=time.perf_counter() - t0)


# ---------------------------------------------------------------- primal side


def _ffd_types(w_M, r_M, C, max_bins):
    """FFD on the residual type counts: a list of count vectors (≤ max_bins) or None.

    Copies of one size go, in first fit, into the open bins in order as far as each has room
    and then into new bins of ⌊C / w⌋ copies: one vectorised step per type, O(types × bins)
    (not per item: a residual can hold most of the window)."""
    m = w_M.size
    counts_KM = np.zeros((0, m), dtype=np.int64)
    loads = np.zeros(0, dtype=np.int64)
    for j in range(m):  # w_M decreasing
        r, w = int(r_M[j]), int(w_M[j])
        if r <= 0:
            continue
        if loads.size:
            cap = (C - loads) // w
            take = np.clip(r - (np.cumsum(cap) - cap), 0, cap)  # first fit: earlier bins fill first
            counts_KM[:, j] += take
            loads += take * w
            r -= int(take.sum())
        if r > 0:
            per = C // w
            nb = -(-r // per)
            if loads.size + nb > max_bins:
                return None
            new = np.full(nb, per, dtype=np.int64)
            new[-1] = r - per * (nb - 1)
            add = np.zeros((nb, m), dtype=np.int64)
            add[:, j] = new
            counts_KM = np.concatenate([counts_KM, add])
            loads = np.concatenate([loads, new * w])
    return list(counts_KM)


def _residual_cpsat(w_M, r_M, C, K, time_limit):
    """CP-SAT on the residual: a packing of the counts ``r_M`` into ``K`` bins (list of count
    vectors), None if proved impossible or undecided."""
    from routepack_opt.models.binpack import solve_bin_packing

    sizes = np.repeat(w_M, r_M)
    if sizes.size == 0:
        return []
    if K <= 0:
        return None
    res = solve_bin_packing(sizes, C, max_bins=K, method="cpsat", time_limit=time_limit, decision=True)
    if res.bin_N is None or res.bins is None or res.bins > K:
        return None
    type_of = np.repeat(np.arange(w_M.size), r_M)
    bins = []
    for k in range(int(res.bins)):
        bins.append(np.bincount(type_of[res.bin_N == k], minlength=w_M.size).astype(np.int64))
    return bins


def _dive(w_M, b_M, C, K, columns, deadline, width: int = 3, max_nodes: int = 100_000, pool=None, seed: int = 0):
    """Diving with backtracking: depth-first over roundings of the residual's LP solution.

    At each node the residual LP is re-solved by column generation (columns carried over, cut to
    the residual demands; no exchange columns, so x alone covers the demands). The node's moves,
    tried in order: all columns with x ≥ 1 at ⌊x⌋ copies together (if any), then single copies of
    the ``width`` columns of largest fractional x. A node whose ⌈LP⌉ plus its fixed bins exceeds K
    is pruned; FFD/BFD closing the residual into the bins left ends the search. ``seed`` > 0
    perturbs the order of the fractional moves (x · a seeded factor in [0.5, 1]); ``pool`` (a dict)
    collects every column of every node's LP. Returns (bins or None, deepest LP-feasible residual,
    its fixed bins)."""
    m = w_M.size
    rng = np.random.default_rng(seed)
    cols0 = [np.asarray(a) for a in columns]
    best_depth, deepest = -1, (b_M.copy(), [])
    # stack of [r_M, fixed, moves, next move index]
    stack: list[list] = []
    r_M, fixed, cols = b_M.copy(), [], cols0
    nodes = 0
    while True:
        # expand the node (r_M, fixed)
        nodes += 1
        if not r_M.any():
            return fixed, r_M, fixed
        ffd = _ffd_types(w_M, r_M, C, K - len(fixed))
        if ffd is not None:
            return fixed + ffd, r_M, fixed
        left = deadline - time.perf_counter()
        if left <= 0 or nodes > max_nodes:
            return None, *deepest
        live = np.flatnonzero(r_M > 0)
        k_left = K - len(fixed)
        lp = gilmore_gomory(w_M[live], r_M[live], C, columns=[a[live] for a in cols], time_limit=left,
                            dual_cuts=False, max_bins=k_left, stop_at_ceiling=_DIVE_STOP_AT_CEILING)
        ok = lp.x_P.size > 0 and np.isfinite(lp.lp_value) and lp.bound <= k_left and \
            int(np.ceil(lp.lp_value - 1e-6)) <= k_left
        min_load = int((w_M * r_M).sum()) - (k_left - 1) * C
        if ok:
            full = np.zeros((lp.cols_PM.shape[0], m), dtype=np.int64)
            full[:, live] = lp.cols_PM
            cols = list(full)
            if pool is not None:  # every residual's pattern is a pattern of the whole instance
                for a in cols:
                    pool.setdefault(a.tobytes(), a)
            # only patterns that can be a bin of a packing into the bins left
            x = np.where(lp.cols_PM @ w_M[live] >= min_load, lp.x_P, 0.0)
            if len(fixed) > best_depth:
                best_depth, deepest = len(fixed), (r_M.copy(), list(fixed))
            moves = []
            whole = np.floor(x + 1e-6).astype(np.int64)
            if whole.any():
                moves.append([(p, int(whole[p])) for p in np.argsort(-x, kind="stable") if whole[p] > 0])
            frac = x - whole
            rank = frac if seed == 0 else frac * rng.uniform(0.5, 1.0, frac.size)
            for p in np.argsort(-rank, kind="stable")[:width]:
                if frac[p] > 1e-6:
                    moves.append([(p, 1)])
            stack.append([r_M, fixed, moves, 0, cols])
        # take the next move of the deepest node with one left
        while stack and stack[-1][3] >= len(stack[-1][2]):
            stack.pop()
        if not stack:
            return None, *deepest
        top = stack[-1]
        move = top[2][top[3]]
        top[3] += 1
        r_M, fixed, cols = top[0].copy(), list(top[1]), top[4]
        for p, k in move:
            for _ in range(k):
                a = np.minimum(cols[p], r_M)
                if a.any() and len(fixed) < K:
                    fixed.append(a)
                    r_M = r_M - a


def _master_ip(w_M, b_M, C, K, cols_PM, time_limit):
    """The restricted master as an integer program (price-and-branch): bins as count vectors or None."""
    hs = _solvers.highspy()
    P, m = cols_PM.shape
    if P == 0:
        return None
    h = hs.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", _solvers.highs_threads(1))
    h.setOptionValue("random_seed", 0)
    h.setOptionValue("time_limit", float(max(time_limit, 0.01)))
    h.setOptionValue("mip_abs_gap", 1 - 1e-6)
    h.addRows(m, b_M.astype(np.float64), np.full(m, np.inf), 0,
              np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, np.float64))
    for a in cols_PM:
        idx = np.flatnonzero(a).astype(np.int32)
        h.addCol(1.0, 0.0, float(K), idx.size, idx, a[idx].astype(np.float64))
    idx = np.arange(P, dtype=np.int32)
    h.addRow(-np.inf, float(K), P, idx, np.ones(P))
    h.changeColsIntegrality(P, idx, np.full(P, hs.HighsVarType.kInteger))
    h.run()
    sol = h.getSolution()
    if not sol.value_valid:
        return None
    x = np.rint(np.asarray(sol.col_value)).astype(np.int64)
    if x.sum() > K:
        return None
    return bins_of_counts(x, cols_PM, b_M)


def bins_of_counts(x_P: np.ndarray, cols_PM: np.ndarray, b_M: np.ndarray):
    """Integral pattern counts ``x_P`` over the patterns ``cols_PM`` → one count vector per bin,
    copies beyond the demands ``b_M`` cut (a covering solution may over-cover); None when the
    patterns do not cover every demand."""
    r_M = np.asarray(b_M, dtype=np.int64).copy()
    bins = []
    for p in np.flatnonzero(x_P > 0):
        for _ in range(int(x_P[p])):
            a = np.minimum(cols_PM[p], r_M)
            r_M -= a
            if a.any():
                bins.append(a)
    return None if r_M.any() else bins


def lp_pack(w_M, b_M, C: int, K: int, lp: LPBound, *, time_limit: float = 5.0):
    """A packing of the types into at most ``K`` bins guided by the LP ``lp`` (see the module
    docstring): a list of count vectors (one per bin) and the step that found it, or (None, "")."""
    t0 = time.perf_counter()
    deadline = t0 + time_limit
    cols = list(lp.cols_PM)
    pool = {a.tobytes(): a for a in cols}
    # 1. diving with backtracking, then restarts with their moves' order perturbed (seeded)
    dive_end = t0 + _DIVE_SHARE * time_limit
    bins, r_M, fixed = _dive(w_M, b_M, C, K, cols, dive_end, max_nodes=_DIVE_NODES, pool=pool)
    seed = 1
    while bins is None and time.perf_counter() < dive_end - 0.05:
        bins, r2_M, fixed2 = _dive(w_M, b_M, C, K, cols, dive_end, max_nodes=_DIVE_RESTART_NODES, pool=pool,
                                   seed=seed)
        if len(fixed2) > len(fixed):  # the deepest residual goes to CP-SAT below
            r_M, fixed = r2_M, fixed2
        seed += 1
    if bins is not None:
        return bins, "LP diving"
    # 2. price-and-branch on the columns generated (the root's and every dive node's)
    left = deadline - time.perf_counter()
    if left > 0.05:
        bins = _master_ip(w_M, b_M, C, K, np.array(list(pool.values()), dtype=np.int64).reshape(-1, w_M.size),
                          0.5 * left)
        if bins is not None:
            return bins, "restricted master IP"
    # 3. CP-SAT on the deepest dive's residual, bins fixed to what is left
    left = deadline - time.perf_counter()
    if left > 0.05:
        rest = _residual_cpsat(w_M, r_M, C, K - len(fixed), left)
        if rest is not None:
            return fixed + rest, "LP diving + CP-SAT residual"
    return None, ""


def assignment(bins, type_N: np.ndarray) -> np.ndarray:
    """Bins as type-count vectors → a bin per item (``type_N``: each item's type). Items a
    bin's counts do not cover stay at −1 (the caller's packing check then fails)."""
    bin_N = np.full(type_N.size, -1, dtype=np.int64)
    if not bins:
        return bin_N
    counts_KM = np.array(bins, dtype=np.int64)
    for j in range(counts_KM.shape[1]):
        items = np.flatnonzero(type_N == j)
        ks = np.repeat(np.arange(counts_KM.shape[0]), np.maximum(counts_KM[:, j], 0))
        k = min(items.size, ks.size)
        bin_N[items[:k]] = ks[:k]
    return bin_N


def warm_kernels() -> None:
    """Compile (or load) the pricing's knapsack kernels: the dense DP and, for large capacities,
    the sparse Pareto DP (:mod:`routepack_opt.warmup`)."""
    w_M, b_M = np.array([35, 30, 20], dtype=np.int64), np.array([2, 3, 1], dtype=np.int64)
    for C in (64, 5000):
        knapsack_max(w_M, b_M, w_M, C)
        knapsack_max(w_M, b_M, w_M, C, min_load=40)
        knapsack_top(w_M, b_M, w_M, C, 4)

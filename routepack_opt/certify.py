"""Certified minimum rows R* (docs/pipeline.md, step 2) and packing into a fixed number of bins.

Any sample fits alone in a cell, so a layout with R rows on D slots exists iff the lengths fit in
R·D bins of capacity C and R·D ≤ N (every cell nonempty). R* is the least R with
R ≥ min_rows, R % row_multiple == 0 and binpack_optimum ≤ R·D ≤ N.

Only the *decision* "do the lengths fit in K = R·D bins" is needed, for the least valid R with
K ≥ the bin lower bound, so the certifier escalates and stops as soon as that is decided:

1. bounds: L1, Martello–Toth L2, Fekete–Schepers DFF bounds vs. FFD/BFD, then a short overflow
   tabu search on exactly K bins, MBS' with seeded restarts and the tabu search again from MBS'
   (``method="bounds"``: a lower bound met by a heuristic packing);
2. the Gilmore–Gomory LP bound by column generation (:mod:`routepack_opt.models.colgen`;
   certified by integer duals and an exact knapsack, :func:`routepack_opt.core.bounds.dual_bound`),
   which may raise K, then a second bound on K itself (only patterns wasting at most K bins'
   slack), an LP-guided search for a packing into K bins (diving with backtracking, the
   restricted master as an integer program, CP-SAT on the residual), then branch-and-price on
   "K bins?" (Ryan–Foster branching, :mod:`routepack_opt.models.branch_price`), which proves K
   impossible where ⌈LP⌉ < the optimum or finds the packing; ``method="colgen"``.
   Skipped when one pricing DP would exceed ``_CG_MAX_CELLS`` cells or the sizes
   ``_CG_MAX_TYPES`` distinct values (production windows, where the heuristics above close);
3. an exact model (``auto``: arc-flow MILP in Pyomo/HiGHS when its graph is small, else
   CP-SAT) on the decision; if it proves K bins impossible, the next valid R is tried.

If the time limit runs out first, the result is the best known R (from the best packing) with
status ``feasible`` and the proved lower bound on rows.

Equal sample counts per slot (``Topology.equal_samples_per_slot``, m = N / D): R rows are
feasible iff the samples split into D groups of m samples, each packable into R nonempty bins of
capacity C (so R ≤ m). Every equal-count layout is a layout, so the unconstrained certificate's
proved lower bound R_lo is a lower bound here too (bounds). From R_lo up (valid R only): the
count-keeping constructions of :mod:`routepack_opt.heuristics.equal_counts` (verl's KK split,
count-limited FFD/BFD); where none succeeds at the lower bound, the CP-SAT decision of
:mod:`routepack_opt.models.equal_counts` proves R infeasible (the bound rises) or finds a layout.
``optimal`` only when the lower bound is met by a layout; if time runs out, ``feasible`` with the
least R a construction fills and the proved lower bound.
"""

from __future__ import annotations

import dataclasses
import functools
import time

import numpy as np

from routepack_opt.core.bounds import (
    bin_lower_bound,
    check_sizes,
    dual_bound,
    is_packing,
    lower_bound_dff,
    lower_bound_l1,
    lower_bound_l2,
)
from routepack_opt.core.checks import (
    MAX_CAPACITY,
    MAX_WORKERS,
    check_choice,
    check_int,
    check_time_limit,
    check_type,
    int_array,
)
from routepack_opt.core.errors import BinPackUndecided, InfeasibleError, InputError
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import Window
from routepack_opt.heuristics import binpack as binpack_heuristics
from routepack_opt.heuristics.binpack import best_packing, fixed_bins_search, minimum_bin_slack
from routepack_opt.heuristics.equal_counts import equal_count_layout
from routepack_opt.models import binpack as exact_binpack
from routepack_opt.models import branch_price, colgen
from routepack_opt.models.binpack import METHODS, arcflow_graph, solve_bin_packing
from routepack_opt.models.equal_counts import decide_equal_counts

__all__ = ["Certificate", "certify_rows", "pack_into_bins", "spread_to_nonempty", "BinPackUndecided"]

# Share of the time limit the MBS' restarts may use before the exact models run: 40 %, up to 4 s
# (at N = 16,384 the 1.5 s it had left R* one row short; the pass is O(N) per bin).
_MBS_SHARE, _MBS_MAX_S = 0.4, 4.0
# ... and the overflow tabu search on exactly K bins after them.
_TABU_SHARE, _TABU_MAX_S = 0.2, 2.0
_TABU_FIRST_S = 0.5  # the first, short tabu run straight from FFD/BFD
# Column generation: share of the time limit for the LP bound(s) and for the LP-guided packing,
# and the largest pricing it is run for: DP cells (0/1 items × capacity, ~1 ns each) and
# distinct sizes (the master's rows; production windows have thousands and close before).
_CG_BOUND_SHARE, _CG_PACK_SHARE = 0.4, 0.2
# the LP-guided search's CP-SAT residual builds its model outside its limit: up to 0.3 s on Hard28
_LP_PACK_MARGIN_S = 0.4
_MBS_MAX_LP_S, _TABU_MAX_LP_S = 1.5, 1.0  # MBS' and the tabu search when an LP is at hand
# The exact model straight after the LP bound when the arc-flow graph on K has at most this many arcs.
_SMALL_ARCFLOW_ARCS, _SMALL_ARCFLOW_MAX_CELLS = 10_000, 5_000_000
_EXACT_MIN_S = 0.25  # the exact model is not started with less time left (its build alone overruns)
# branch-and-price leaves this much of the limit (its last node, or the CP-SAT model over the
# listed patterns, is built before its clock is checked)
_BP_RESERVE_S = 0.3
# its tables: the pricing's choice table (4 bytes a cell) and the listing's three (24 bytes a cell)
_BP_MAX_CELLS = 5_000_000
_CG_MAX_CELLS, _CG_MAX_TYPES = 25_000_000, 600
# BFD may use half of the limit (FFD is always there); the DFF bound a tenth, at ~12–20 ns per
# (threshold, k, item) (numpy temporaries: 3 s for 64 thresholds at N = 200,000 on a loaded machine)
_BFD_SHARE, _DFF_SHARE, _DFF_S_PER_CELL = 0.5, 0.1, 2e-8
_PASS_S_PER_ITEM = 3e-7  # one O(N log N) pass over the items (a sort, np.unique): 0.3 s at N = 10⁶


def _mbs_nodes(n: int) -> int:
    """Search nodes per MBS' bin: 20k on benchmark sizes, fewer on production windows (N·nodes ≈ 4M)."""
    return int(min(20_000, max(500, 4_000_000 // max(n, 1))))


@dataclasses.dataclass(frozen=True)
class Certificate:
    """R* with how it is known.

    ``rows``: R* if ``status == "optimal"`` (proved least), else the best known valid rows
    (``status == "feasible"``) with ``lower_bound`` the proved least possible rows. ``method``:
    ``bounds`` (a lower bound met by FFD/BFD/MBS'/tabu search), ``cpsat`` or ``arcflow`` (the exact model
    that decided). ``bins_lower_bound`` / ``bins_upper_bound`` are on the bin-packing optimum;
    ``packing_N`` is a bin per sample into at most ``rows·D`` bins (see
    :func:`spread_to_nonempty`); ``detail`` a human note (which bound, which packing);
    ``skipped`` the stages too large for the memory budget or the time left, each with why.
    """

    rows: int
    status: str
    lower_bound: int
    method: str
    seconds: float
    bins_lower_bound: int = 0
    bins_upper_bound: int = 0
    detail: str = ""
    packing_N: np.ndarray | None = dataclasses.field(default=None, repr=False, compare=False)
    skipped: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        """The certificate as stored in a plan / printed by ``routepack certify --json``
        (``skipped``: the stages sized out, with why, when there are any)."""
        out = {"rows": int(self.rows), "status": self.status, "lower_bound": int(self.lower_bound),
               "method": self.method, "seconds": round(float(self.seconds), 4)}
        if self.skipped:
            out["skipped"] = list(self.skipped)
        return out


def _lengths_of(window) -> np.ndarray:
    if isinstance(window, Window):
        return np.asarray(window.lengths, dtype=np.int64)
    arr = int_array(window, "lengths", ndim=1)  # exact: an inf length is quoted, never −2⁶³
    if arr.size == 0:
        raise InputError("lengths: the window holds no samples")
    bad = np.flatnonzero(arr < 1)
    if bad.size:
        raise InputError(f"lengths: every sample needs at least 1 token; samples {bad[:5].tolist()} "
                         f"have {arr[bad[:5]].tolist()}")
    return arr


@functools.cache
def _load_kernels() -> None:
    """Every numba kernel the certifier may run, compiled or loaded from the cache once per
    process before the first clock starts (a cold load is about a second: it must not count
    against a limit of 0.05 s)."""
    binpack_heuristics.warm_kernels()
    exact_binpack.warm_kernels()
    colgen.warm_kernels()
    branch_price.warm_kernels()


def _next_valid(r: int, topology: Topology) -> int:
    """Least R ≥ max(r, min_rows) with R % row_multiple == 0."""
    r = max(int(r), topology.min_rows)
    k = topology.row_multiple
    return -(-r // k) * k


def certify_rows(window, topology: Topology, time_limit: float = 10.0, *, method: str = "auto",
                 num_workers: int = 1) -> Certificate:
    """R* for ``window`` (a :class:`Window` or a plain lengths array) on ``topology``.

    Raises :class:`InputError` when a sample is longer than the capacity (naming the samples),
    when N < D·min_rows, or when no valid R has R·D ≤ N. ``method`` picks the exact model
    (``auto``, ``cpsat``, ``arcflow``) used where bounds and constructive packings do not close.
    The numba kernels are compiled or loaded before ``time_limit`` starts counting (the first
    call in a process; :mod:`routepack_opt.warmup`); a solver library's first import counts.
    Every stage that grows faster than N (tables over C, the arc-flow graph, the exact models)
    is sized first (:mod:`routepack_opt.core.sizing`) and skipped when it does not fit the
    memory budget or the time left: ``Certificate.skipped`` says which and why.
    """
    _load_kernels()
    t0 = time.perf_counter()
    check_type(topology, "topology", Topology)
    time_limit = check_time_limit(time_limit, "time_limit")
    check_choice(method, "method", METHODS)
    num_workers = check_int(num_workers, "num_workers", 1, MAX_WORKERS)
    lengths_N = _lengths_of(window)
    if topology.equal_samples_per_slot:
        topology.check_samples(lengths_N.size)
        return _certify_equal(lengths_N, topology, time_limit, t0, method, num_workers)
    r_max = _check_rows_input(lengths_N, topology)
    sizes_N, _ = check_sizes(lengths_N, topology.capacity)
    s = _Search(sizes_N, topology.capacity, topology, r_max, time_limit, t0, method, num_workers)
    # The steps of the module docstring, each returning a certificate once K is decided.
    for step in (_by_bounds, _by_lp_bound, _by_heuristics, _by_lp_packing, _by_branch_price, _by_exact_model):
        cert = step(s)
        if cert is not None:
            return cert
    return s.undecided()


def _check_rows_input(lengths_N, topology: Topology) -> int:
    """The largest valid R (R·D ≤ N, a multiple of row_multiple); InputError when a sample is
    longer than the capacity, N < D·min_rows, or no valid R exists."""
    N, D, C = lengths_N.size, topology.dp, topology.capacity
    long_ = np.flatnonzero(lengths_N > C)
    if long_.size:
        more = f" (and {long_.size - 5} more)" if long_.size > 5 else ""
        raise InputError(
            f"samples {long_[:5].tolist()}{more} are longer than the capacity: lengths "
            f"{lengths_N[long_[:5]].tolist()} > capacity {C}; they fit in no micro-batch "
            "(raise --capacity or drop them)"
        )
    if N < D * topology.min_rows:
        raise InputError(
            f"N={N} samples cannot fill D·min_rows = {D}·{topology.min_rows} = "
            f"{D * topology.min_rows} cells (every cell needs a sample)"
        )
    r_max = (N // D) // topology.row_multiple * topology.row_multiple  # largest valid R·D ≤ N
    if r_max < topology.min_rows:
        raise InputError(
            f"no valid rows: R must be ≥ min_rows={topology.min_rows}, a multiple of "
            f"row_multiple={topology.row_multiple} and have R·D ≤ N (D={D}, N={N}); "
            f"the largest R with R·D ≤ N is {N // D}"
        )
    return r_max


class _Search:
    """What :func:`certify_rows` knows so far about the bins of ``sizes_N``: the proved lower
    bound (``lb_bins``, ``lb_name``), the best packing (``pack_N``, ``ub_bins``, ``ub_name``),
    the least valid rows ``r_lo`` for the bound and its cells ``K`` (the decision "K bins?"),
    and the LP of column generation once it has run."""

    def __init__(self, sizes_N, C: int, topology: Topology, r_max: int, time_limit: float, t0: float,
                 method: str, num_workers: int):
        self.sizes_N, self.C, self.topology, self.r_max = sizes_N, C, topology, r_max
        self.time_limit, self.t0, self.method, self.num_workers = time_limit, t0, method, num_workers
        self.skipped: list[str] = []  # stages sized out, with why (Certificate.skipped)
        # Cheap bounds first (L1, L2 are O(N log N) and usually close with FFD/BFD); the DFF
        # family only when they do not.
        l1, l2 = lower_bound_l1(sizes_N, C), lower_bound_l2(sizes_N, C)
        self.lb_bins, self.lb_name = (l1, "L1") if l1 >= l2 else (l2, "L2")
        # FFD, and BFD unless it outruns half the limit (O(N log N), ~1 µs an item at 10⁶)
        self.pack_N, self.ub_bins, self.ub_name = best_packing(sizes_N, C, deadline=t0 + _BFD_SHARE * time_limit)
        self.r_lo, self.K = self.rows_for(self.lb_bins)
        self.lp = None
        self.small_exact = False
        self.used = "bounds"  # the exact model that ran last (for an undecided certificate)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float:
        return self.time_limit - self.elapsed()

    def has_time(self, stage: str, passes: float = 3.0) -> bool:
        """Whether ``stage`` can start: its setup alone is a few O(N log N) passes over the
        items (``passes``, ~0.3 µs an item each), and at least 10 ms of search must be left
        after them; else it is skipped, and said so."""
        need = 0.01 + passes * _PASS_S_PER_ITEM * self.sizes_N.size
        return not self.skip(None if self.left() > need else
                             f"{stage} skipped: {max(self.left(), 0.0):.2f} s left, its setup alone "
                             f"takes about {need:.2f} s at N = {self.sizes_N.size:,}")

    def rows_for(self, lb: int) -> tuple[int, int]:
        """The least valid row count for ``lb`` bins (InputError when none is) and its cells."""
        D = self.topology.dp
        r = _next_valid(-(-lb // D), self.topology)
        if r > self.r_max:
            raise InputError(
                f"no valid rows: the lengths need at least {lb} micro-batches of capacity {self.C}, but "
                f"the valid R ≤ {self.r_max} (min_rows={self.topology.min_rows}, row_multiple="
                f"{self.topology.row_multiple}) give at most {self.r_max * D} ≤ N={self.sizes_N.size} cells"
            )
        return r, r * D

    def raise_bound(self, lb: int, name: str) -> None:
        self.lb_bins, self.lb_name = lb, name
        self.r_lo, self.K = self.rows_for(lb)

    def take_tabu(self, ts_N) -> bool:
        """Adopt a packing of the tabu search (None: it found none)."""
        if ts_N is None:
            return False
        self.pack_N, self.ub_bins, self.ub_name = ts_N, int(np.unique(ts_N).size), "tabu search"
        return True

    def cert(self, rows, status, how, detail) -> Certificate:
        if how == "bounds" and self.lb_name.startswith("LP"):  # the bound came from column generation
            how = "colgen"
        if self.skipped:
            detail = f"{detail}; " + "; ".join(self.skipped)
        return Certificate(rows=int(rows), status=status, lower_bound=int(self.r_lo), method=how,
                           seconds=self.elapsed(), bins_lower_bound=int(self.lb_bins),
                           bins_upper_bound=int(self.ub_bins), detail=detail, packing_N=self.pack_N,
                           skipped=tuple(self.skipped))

    def skip(self, reason: str | None) -> bool:
        """Record ``reason`` (a stage sized out; None: it fits); True when it was one."""
        if reason is not None and reason not in self.skipped:
            self.skipped.append(reason)
        return reason is not None

    def proved(self, how: str, detail: str | None = None) -> Certificate:
        """R* = r_lo: the bound met by the best packing."""
        if detail is None:
            detail = f"{self.lb_name}={self.lb_bins} bins, {self.ub_name}={self.ub_bins} bins"
        return self.cert(self.r_lo, "optimal", how, detail)

    def undecided(self) -> Certificate:
        """Undecided within the limit: best known rows from the best packing."""
        r_ub = _next_valid(-(-self.ub_bins // self.topology.dp), self.topology)
        if r_ub > self.r_max:  # neither a valid R proved impossible nor a packing that fits one
            raise BinPackUndecided(
                f"undecided in {self.time_limit:g}s: the best packing needs {self.ub_bins} bins > "
                f"{self.r_max * self.topology.dp} valid cells and no proof rules them out (lower bound "
                f"{self.lb_bins} bins)")
        return self.cert(r_ub, "feasible", self.used, f"undecided in {self.time_limit:g}s: {self.lb_name} ≥ "
                         f"{self.lb_bins} bins, {self.ub_name}={self.ub_bins} bins")


def _by_bounds(s: _Search) -> Certificate | None:
    """Step 1's start: L1/L2 (the DFF family when they do not close) against FFD/BFD, then a
    short overflow tabu search on exactly K bins from FFD/BFD: milliseconds on production
    windows (many small bins), often enough on the benchmarks too."""
    if s.ub_bins > s.K:
        # the DFF family costs O(thresholds · N): as many thresholds (≤ 64) as a tenth of the
        # limit pays for (L1 and L2 are known)
        thresholds = _dff_thresholds(s.sizes_N.size, min(_DFF_SHARE * s.time_limit, s.left()))
        if thresholds < 64:
            s.skip(f"DFF bound on at most {thresholds} of 64 thresholds (the time left)")
        dff = lower_bound_dff(s.sizes_N, s.C, thresholds=thresholds)
        if dff > s.lb_bins:
            s.raise_bound(dff, "DFF")
    if s.ub_bins <= s.K:
        return s.proved("bounds")
    if s.has_time("tabu search") and s.take_tabu(fixed_bins_search(
            s.sizes_N, s.C, s.K, start=s.pack_N, time_limit=min(_TABU_FIRST_S, _TABU_SHARE * s.time_limit, s.left()))):
        return s.proved("bounds")
    return None


def _dff_thresholds(n: int, seconds: float) -> int:
    """How many DFF thresholds (≤ 64, each 20 passes over the n sizes) ``seconds`` pay for."""
    return max(0, int(min(64, seconds / (_DFF_S_PER_CELL * 20 * max(n, 1)))))


def _by_lp_bound(s: _Search) -> Certificate | None:
    """Step 2's bound: the Gilmore–Gomory LP bound by column generation, which may rule K out.
    A small arc-flow graph on K (little slack: e.g. triplets filling every bin exactly) skips it
    and goes straight to the exact model (its LP is the Gilmore–Gomory LP), which then decides
    quickly."""
    s.small_exact = s.method in ("auto", "arcflow") and _arcflow_arcs(s.sizes_N, s.C, s.K) <= _SMALL_ARCFLOW_ARCS
    if s.small_exact or not s.has_time("column generation", passes=2.0):
        return None
    w_M, b_M, _ = colgen.types_of(s.sizes_N)
    cells = colgen.pricing_cost(w_M, b_M, s.C)
    if s.skip(None if cells <= _CG_MAX_CELLS and w_M.size <= _CG_MAX_TYPES else
              f"column generation skipped: {w_M.size} sizes, pricing DP of {cells:,} cells (at most "
              f"{_CG_MAX_TYPES} and {_CG_MAX_CELLS:,})"):
        return None
    lp_res = _lp_bound(s.sizes_N, s.C, s.K, s.pack_N, s.ub_bins, s.time_limit, s.elapsed)
    if lp_res is None:
        return None
    lp_lb, lp_name, s.lp = lp_res
    if lp_lb > s.lb_bins:
        s.raise_bound(lp_lb, lp_name)
    if s.ub_bins <= s.K:
        return s.proved("colgen")
    return None


def _by_heuristics(s: _Search) -> Certificate | None:
    """Step 1's rest: MBS' restarts (cheap and usually enough when the bound is tight), then the
    overflow tabu search on exactly K bins again, from the MBS' packing. With an LP at hand they
    get less time: the LP-guided search follows."""
    mbs_max, tabu_max = (_MBS_MAX_S, _TABU_MAX_S) if s.lp is None else (_MBS_MAX_LP_S, _TABU_MAX_LP_S)
    if s.small_exact:
        mbs_max, tabu_max = 0.1, 0.1
    tl = s.time_limit
    if not s.has_time("MBS'"):
        return None
    mbs_N, mbs_bins = minimum_bin_slack(s.sizes_N, s.C, restarts=200, target=s.K,
                                        node_limit=_mbs_nodes(s.sizes_N.size),
                                        time_limit=max(0.01, min(mbs_max, _MBS_SHARE * tl, s.left())))
    if mbs_bins < s.ub_bins:
        s.pack_N, s.ub_bins, s.ub_name = mbs_N, mbs_bins, "MBS'"
    if s.ub_bins <= s.K:
        return s.proved("bounds")
    tabu_s = max(0.01, min(tabu_max, _TABU_SHARE * tl, s.left()))
    if s.has_time("tabu search") and s.take_tabu(fixed_bins_search(s.sizes_N, s.C, s.K, start=s.pack_N, seed=1,
                                                                   time_limit=tabu_s)):
        return s.proved("bounds")
    return None


def _by_lp_packing(s: _Search) -> Certificate | None:
    """Step 2's packing: the LP-guided search for a packing into K bins (the columns of the LP).
    Then, with D > 1 slots, fewer rows than the best packing's (:func:`_fewer_rows`)."""
    if s.lp is not None and not s.small_exact:
        lp_N = _lp_packing(s.sizes_N, s.C, s.K, s.lp, s.time_limit, s.elapsed)
        if lp_N is not None:
            s.pack_N, s.ub_bins, s.ub_name = lp_N, int(np.unique(lp_N).size), "LP-guided search"
            return s.proved("colgen")
    # K is still open. With D > 1 slots a row is D bins, so the rows between r_lo and the best
    # packing's leave the tabu search D bins of slack each: it often fills one of them when K
    # itself stays undecided (N = 32,768, D = 32: 363 rows in 0.7 s, against FFD's 364 and
    # K's 362), and the plan then gets that many rows whatever the exact model below decides
    # (one micro-batch fewer per slot; there the predicted step stayed within 0.003 %).
    if s.topology.dp > 1:
        s.pack_N, s.ub_bins, s.ub_name = _fewer_rows(
            s.sizes_N, s.C, s.topology, s.r_lo, s.pack_N, s.ub_bins, s.ub_name,
            min(_TABU_MAX_S, _TABU_SHARE * s.time_limit, s.time_limit - s.elapsed()))
    return None


def _by_branch_price(s: _Search) -> Certificate | None:
    """Step 2's decision: branch-and-price on "K bins?" (:mod:`routepack_opt.models.branch_price`)
    with the time left, less ``_BP_RESERVE_S``: it settles the instances whose optimum is
    ⌈LP⌉ + 1 (a proof) and finds the packings the heuristics and the dive miss. When it proves K
    impossible, the next valid R is tried (a new search). Skipped where its DP tables would pass
    ``_BP_MAX_CELLS`` (distinct sizes × capacity)."""
    if s.lp is None or s.small_exact:
        return None
    w_M, b_M, type_N = colgen.types_of(s.sizes_N)
    if s.skip(None if w_M.size * (s.C + 1) <= _BP_MAX_CELLS else
              f"branch-and-price skipped: {w_M.size} sizes × {s.C + 1:,} loads over {_BP_MAX_CELLS:,} cells"):
        return None
    while (left := s.time_limit - s.elapsed() - _BP_RESERVE_S) > _EXACT_MIN_S:
        res = branch_price.decide_bins(w_M, b_M, s.C, s.K, columns=s.lp.cols_PM, time_limit=left)
        if res.status == "feasible":
            bin_N = colgen.assignment(res.bins, type_N)
            if is_packing(s.sizes_N, s.C, bin_N, s.K):  # re-checked item by item
                s.pack_N, s.ub_bins, s.ub_name = bin_N, int(np.unique(bin_N).size), "branch-and-price"
                return s.proved("colgen")
        if res.status != "infeasible":
            return None
        s.raise_bound(s.K + 1, f"branch-and-price on {s.K} bins ({res.nodes} nodes)")
        if s.ub_bins <= s.K:
            return s.proved("colgen")
    return None


def _by_exact_model(s: _Search) -> Certificate | None:
    """Step 3: the exact model on "K bins?"; when it proves K impossible, the next valid R (and
    the tabu search on its K) until a packing meets the bound or the time is spent."""
    while True:
        left = s.time_limit - s.elapsed()
        if left <= _EXACT_MIN_S or not s.has_time("exact model"):
            return None
        K = s.K
        res = solve_bin_packing(s.sizes_N, s.C, max_bins=K, method=s.method, time_limit=left,
                                lower_bound_hint=s.lb_bins, hint=s.pack_N, decision=True,
                                num_workers=s.num_workers)
        s.used = res.method
        if "skipped" in res.method:
            s.skip(res.method)
        if res.bins is not None and res.bins <= K:
            if res.bins < s.ub_bins:
                s.pack_N, s.ub_bins, s.ub_name = res.bin_N, res.bins, res.method
            return s.proved(res.method, f"{s.lb_name}={s.lb_bins} bins, {res.method} packing in "
                                        f"{res.bins} ≤ {K} bins")
        if res.status != "infeasible":
            s.lb_bins = max(s.lb_bins, res.lower_bound)
            return None
        # K bins proved impossible: next valid R.
        s.raise_bound(max(s.lb_bins, K + 1, res.lower_bound), f"{res.method} proof")
        if s.ub_bins > s.K and s.has_time("tabu search"):  # the tabu search again, on the new K
            s.take_tabu(fixed_bins_search(s.sizes_N, s.C, s.K, start=s.pack_N, seed=1,
                                          time_limit=min(_TABU_MAX_S, _TABU_SHARE * s.time_limit, s.left())))
        if s.ub_bins <= s.K:
            return s.proved(res.method, f"{res.method} proved > {s.lb_bins - 1} bins, "
                                        f"{s.ub_name}={s.ub_bins} bins")


def _arcflow_arcs(sizes_N, C: int, K: int) -> int:
    """Item arcs of the reduced arc-flow graph on K bins (``models.binpack.arcflow_graph``)."""
    if K * C - int(sizes_N.sum()) >= C or np.unique(sizes_N).size * C > _SMALL_ARCFLOW_MAX_CELLS:
        return 1 << 62  # no slack pruning, or a graph too costly to build just to measure it
    g = arcflow_graph(sizes_N, C, K)
    return 1 << 62 if g is None else int(g["tail_A"].size)


def _lp_bound(sizes_N, C: int, K: int, pack_N, ub_bins: int, time_limit: float, elapsed):
    """Column generation on the decision "K bins?" (the module docstring, step 2): None when
    skipped, else (a lower bound on bins, its name, the LP for the packing step). The bound is
    the LP's ⌈Σ b u / U⌉, re-derived from its integer duals by :func:`dual_bound`; if it leaves K
    open and K bins have less than one bin of slack, the LP over the patterns that waste at most
    that slack may prove K + 1."""
    w_M, b_M, type_N = colgen.types_of(sizes_N)  # sized by the caller (_CG_MAX_CELLS, _CG_MAX_TYPES)
    budget = _CG_BOUND_SHARE * time_limit
    left = min(budget, time_limit - elapsed())
    if left <= 0.05:
        return None
    counts_MB = np.zeros((w_M.size, ub_bins), dtype=np.int64)
    _, compact = np.unique(pack_N, return_inverse=True)
    np.add.at(counts_MB, (type_N, compact), 1)
    lp = colgen.gilmore_gomory(w_M, b_M, C, columns=list(counts_MB.T), time_limit=left, target=K + 1)
    lb, name = 0, "LP"
    if lp.U > 0:
        lb = dual_bound(sizes_N, C, w_M, lp.u_M)[0]
        name = "LP (column generation)"
    K_lp = max(K, lb)
    if K_lp >= ub_bins:  # the bound meets the packing we have
        return lb, name, lp
    if int(sizes_N.sum()) > (K_lp - 1) * C:
        left = min(0.5 * budget, time_limit - elapsed())
        if left > 0.05:
            lpk = colgen.gilmore_gomory(w_M, b_M, C, columns=list(lp.cols_PM), time_limit=left, max_bins=K_lp,
                                        stop_at_ceiling=False)
            if lpk.bound > K_lp:
                proved = dual_bound(sizes_N, C, w_M, lpk.u_M, max_bins=K_lp)[0] if lpk.U > 0 else lpk.bound
                if proved > K_lp:  # K_lp bins are impossible
                    return K_lp + 1, f"LP on {K_lp} bins (column generation)", lp
    return lb, name, lp


def _lp_packing(sizes_N, C: int, K: int, lp, time_limit: float, elapsed):
    """The LP-guided search (:func:`colgen.lp_pack`) for a packing into ≤ K bins, checked; or None."""
    left = min(_CG_PACK_SHARE * time_limit, time_limit - elapsed() - _LP_PACK_MARGIN_S)
    if left <= _EXACT_MIN_S:
        return None
    w_M, b_M, type_N = colgen.types_of(sizes_N)
    bins, _how = colgen.lp_pack(w_M, b_M, C, K, lp, time_limit=left)
    if bins is None:
        return None
    bin_N = colgen.assignment(bins, type_N)
    if not is_packing(sizes_N, C, bin_N, K):
        return None
    _, bin_N = np.unique(bin_N, return_inverse=True)
    return bin_N.astype(np.int64)


def _fewer_rows(sizes_N, C, topology: Topology, r_lo: int, pack_N, ub_bins: int, ub_name: str,
                time_limit: float):
    """The best packing improved to fewer rows, still above ``r_lo``, by the overflow tabu
    search within ``time_limit`` seconds: from one valid row below the packing's down (the
    easiest first, each from the last packing found), until a row count does not fill or the
    time is spent. Returns (packing, bins, name)."""
    D, k = topology.dp, topology.row_multiple
    t0 = time.perf_counter()
    r = _next_valid(-(-ub_bins // D), topology) - k
    while r > r_lo:
        left = time_limit - (time.perf_counter() - t0)
        if left <= 0.01:
            break
        found = fixed_bins_search(sizes_N, C, r * D, start=pack_N, seed=1, time_limit=left)
        if found is None:
            break
        pack_N, ub_bins, ub_name = found, int(np.unique(found).size), "tabu search"
        r = _next_valid(-(-ub_bins // D), topology) - k
    return pack_N, ub_bins, ub_name


# Share of the time limit the unconstrained certificate (the lower bound) may use under equal counts.
_EQUAL_BASE_SHARE = 0.4
# Largest N·R·D for which the equal-count CP-SAT decision is built (its construction is Python).
_EQUAL_EXACT_MAX_BINARIES = 200_000


def _certify_equal(lengths_N, topology: Topology, time_limit: float, t0: float, method: str,
                   num_workers: int) -> Certificate:
    """R* with N / D samples per slot (see the module docstring)."""
    N, D, C = lengths_N.size, topology.dp, topology.capacity
    m = N // D
    free = dataclasses.replace(topology, equal_samples_per_slot=False)
    try:
        base = certify_rows(lengths_N, free, _EQUAL_BASE_SHARE * time_limit, method=method,
                            num_workers=num_workers)
    except BinPackUndecided:  # no valid R decided without counts: the plain bin bound is all we have
        base = None
    lb_rows = base.lower_bound if base is not None else _next_valid(
        -(-bin_lower_bound(*check_sizes(lengths_N, C))[0] // D), topology)
    r_max = m // topology.row_multiple * topology.row_multiple  # R ≤ m: every cell nonempty
    elapsed = lambda: time.perf_counter() - t0  # noqa: E731
    how = base.method if base is not None else "bounds"
    detail = [f"unconstrained R ≥ {lb_rows} ({base.method if base is not None else 'bin bound'})"]
    exact_open = True  # the CP-SAT decision may still run at the lower bound

    def cert(rows, status, lb, used, layout):
        row_N, slot_N = layout
        return Certificate(rows=int(rows), status=status, lower_bound=int(lb), method=used,
                           seconds=elapsed(), bins_lower_bound=int(base.bins_lower_bound if base else 0),
                           bins_upper_bound=int(rows) * D, detail="; ".join(detail),
                           packing_N=row_N * D + slot_N)

    R = lb_rows
    while R <= r_max:
        info: dict = {}
        left = max(0.05, time_limit - elapsed())
        try:
            layout = equal_count_layout(lengths_N, topology, R, time_limit=min(left, 0.25 * time_limit + 0.05),
                                        info=info, exact_pack=pack_into_bins)
        except InfeasibleError:
            layout = None
        if layout is not None:
            detail.append(f"{info['construction']} layout at R={R}")
            return cert(R, "optimal" if R == lb_rows else "feasible", lb_rows, how if R == lb_rows else "bounds",
                        layout)
        if exact_open and (N * R * D > _EQUAL_EXACT_MAX_BINARIES):
            exact_open = False  # the model's construction alone would outrun any time limit
            detail.append(f"exact decision skipped ({N}×{R}×{D} binaries)")
        if exact_open and R == lb_rows and time_limit - elapsed() > 0.05:
            status, row_N, slot_N = decide_equal_counts(lengths_N, D, R, C, time_limit - elapsed(),
                                                        num_workers=num_workers)
            if status == "feasible":
                detail.append(f"cpsat layout at R={R}")
                return cert(R, "optimal", lb_rows, "cpsat", (row_N, slot_N))
            if status == "infeasible":
                detail.append(f"cpsat proved R={R} infeasible")
                lb_rows = _next_valid(R + 1, topology)
                how = "cpsat"
                R = lb_rows
                continue
            exact_open = False  # undecided: look for the least R a construction fills
        R = _next_valid(R + 1, topology)
    if lb_rows > r_max:
        raise InputError(
            f"no valid rows with equal samples per slot: each slot holds N/D = {m} samples, so "
            f"R ≤ {r_max}, and R ≥ {lb_rows} is needed (capacity {C}, min_rows={topology.min_rows}, "
            f"row_multiple={topology.row_multiple})")
    raise BinPackUndecided(
        f"undecided in {time_limit:g}s: no equal-count layout found for R in {lb_rows}..{r_max} "
        f"and none proved impossible beyond R < {lb_rows}")


def spread_to_nonempty(sizes, bin_N, num_bins: int) -> np.ndarray:
    """Make a packing into ≤ ``num_bins`` bins use *every* bin (needs N ≥ num_bins).

    Empty bins take one item each from bins holding two or more (a lone item always fits), so
    capacity is kept. Returns a new ``bin_N`` with ids 0..num_bins-1.
    """
    sizes_N = int_array(sizes, "sizes", ndim=1)
    bin_N = int_array(bin_N, "bin_N", ndim=1, lo=0).copy()
    num_bins = check_int(num_bins, "num_bins", 1)
    if bin_N.size != sizes_N.size:
        raise InputError(f"bin_N: {bin_N.size} bin ids for {sizes_N.size} items")
    if sizes_N.size < num_bins:
        raise InputError(f"{sizes_N.size} items cannot fill {num_bins} bins (one item each at least)")
    _, bin_N = np.unique(bin_N, return_inverse=True)
    bin_N = bin_N.astype(np.int64)
    used = int(bin_N.max()) + 1 if bin_N.size else 0
    if used > num_bins:
        raise InputError(f"the packing uses {used} bins > {num_bins}")
    counts = np.bincount(bin_N, minlength=num_bins)
    # Take the smallest items of multi-item bins first (keeps big bins' structure).
    for i in np.argsort(sizes_N, kind="stable"):
        if used >= num_bins:
            break
        if counts[bin_N[i]] >= 2:
            counts[bin_N[i]] -= 1
            bin_N[i] = used
            counts[used] = 1
            used += 1
    return bin_N


def pack_into_bins(sizes, capacity, num_bins: int, time_limit: float = 10.0, *,
                   method: str = "auto", num_workers: int = 1) -> np.ndarray | None:
    """A bin id (0..num_bins-1) per item using at most ``num_bins`` bins of ``capacity``.

    FFD/BFD first, then MBS', the overflow tabu search, then an exact model (``method``). Returns None when proved
    impossible (an item larger than the capacity, a lower bound above ``num_bins``, or the
    exact model's proof); raises :class:`BinPackUndecided` when nothing is decided within
    ``time_limit`` seconds. Bins may be left empty (see :func:`spread_to_nonempty`).
    """
    t0 = time.perf_counter()
    sizes = int_array(sizes, "sizes", ndim=1)
    capacity = check_int(capacity, "capacity", 1, MAX_CAPACITY)
    num_bins = check_int(num_bins, "num_bins", 0)
    time_limit = check_time_limit(time_limit, "time_limit")
    check_choice(method, "method", METHODS)
    num_workers = check_int(num_workers, "num_workers", 1, MAX_WORKERS)
    sizes_N = np.asarray(sizes, dtype=np.int64)
    if sizes_N.ndim == 1 and sizes_N.size and int(sizes_N.max()) > capacity:
        return None
    sizes_N, C = check_sizes(sizes_N, capacity)
    num_bins = int(num_bins)
    if sizes_N.size == 0:
        return np.zeros(0, dtype=np.int64)
    if num_bins < 1:
        return None
    lb, _ = bin_lower_bound(sizes_N, C, thresholds=_dff_thresholds(sizes_N.size, _DFF_SHARE * time_limit))
    if lb > num_bins:
        return None
    pack_N, ub, _ = best_packing(sizes_N, C, deadline=t0 + _BFD_SHARE * time_limit)
    if ub <= num_bins:
        return pack_N
    ts_N = fixed_bins_search(sizes_N, C, num_bins, start=pack_N,
                             time_limit=min(_TABU_FIRST_S, _TABU_SHARE * time_limit))
    if ts_N is not None:
        return ts_N
    mbs_N, mbs = minimum_bin_slack(sizes_N, C, restarts=200, target=num_bins,
                                   node_limit=_mbs_nodes(sizes_N.size),
                                   time_limit=min(_MBS_MAX_S, _MBS_SHARE * time_limit))
    if mbs <= num_bins:
        return mbs_N
    ts_N = fixed_bins_search(sizes_N, C, num_bins, start=mbs_N if mbs < ub else pack_N, seed=1,
                             time_limit=min(_TABU_MAX_S, _TABU_SHARE * time_limit))
    if ts_N is not None:
        return ts_N
    left = max(0.05, time_limit - (time.perf_counter() - t0))
    res = solve_bin_packing(sizes_N, C, max_bins=num_bins, method=method, time_limit=left,
                            lower_bound_hint=lb, hint=mbs_N if mbs < ub else pack_N,
                            decision=True, num_workers=num_workers)
    if res.bins is not None and res.bins <= num_bins:
        assert is_packing(sizes_N, C, res.bin_N, num_bins)
        return res.bin_N
    if res.status == "infeasible":
        return None
    raise BinPackUndecided(
        f"could not decide within {time_limit:g}s whether {sizes_N.size} items fit in "
        f"{num_bins} bins of {C} (lower bound {max(lb, res.lower_bound)}, best packing {min(ub, mbs)})"
    )

"""Row-aware expert placement: given a packing, choose each layer's placement against the
row-local EP peaks themselves (issue 8).

Legend: N samples, L layers, E experts, P EP ranks, G shards, R rows, K = R·G (row, shard) pairs
indexed ``k = r·G + g``.

Why: LPT (Graham 1969) balances *aggregate* loads, and the paper's Eq. (4) says packing cannot
beat the aggregate skew. But the step is paid on row-local peaks ``max_p W[r,g,l,p]``: within one
(row, shard), experts that the same samples use heavily pile up on one rank even when aggregate
loads are balanced. With the layout fixed, ``W[k,l,p] = Σ_{e on p} V[k,l,e]`` where
``V[k,l,e]`` = counts of the samples of (row, shard) k — so the per-layer placement can be
searched directly against the true objective.

Search: first-improvement local search over *swaps* of two experts on different ranks of one
layer (keeps E/P experts per rank, so every π[l] stays a permutation). Layers are coupled through
the shard totals (max-sum) and row maxima (sum-max), so the search cycles over layers with the
other layers' contributions held fixed, and accepts a swap only when the *true* lexicographic
objective — (makespan [+ migration time], total, peak), recomputed in O(K) from the integer state
— strictly decreases. The attention part does not depend on placement and is a constant per k.
A swap is evaluated in O(K) with per-k top-3 rank loads (the max over the other ranks).

With a current (materialized) placement, the first key component adds the migration time
``w · per_expert_time · max_p (experts received by rank p)`` (see :mod:`routepack_opt.heuristics.placement.migration`),
so a swap is taken only when it pays for the traffic it causes.
"""

from __future__ import annotations

import dataclasses
import time
from typing import NamedTuple

import numba
import numpy as np

from routepack_opt.core.cost import CostModel
from routepack_opt.core.cost_kernel import BlockCosts, key_of, less, peak_after_swap, top3
from routepack_opt.core.errors import InputError
from routepack_opt.core.evaluate import Score, row_shard_costs
from routepack_opt.core.objective import Objective, check_objective
from routepack_opt.core.plan import check_placement
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import Window
from routepack_opt.heuristics.placement.migration import align_slots, per_expert_time

__all__ = ["RefineConfig", "RefineResult", "RowAwareState", "refine_placement",
           "row_shard_expert_loads", "attention_base"]



# ----------------------------------------------------------------------------------------------
# numba kernels
# ----------------------------------------------------------------------------------------------


@numba.njit(cache=True)
def _row_shard_expert_loads(counts_NLE, k_N, K):
    N, L, E = counts_NLE.shape
    V_LEK = np.zeros((L, E, K), dtype=np.int64)
    for i in range(N):
        k = k_N[i]
        for l in range(L):
            for e in range(E):
                V_LEK[l, e, k] += counts_NLE[i, l, e]
    return V_LEK


@numba.njit(cache=True)
def _rank_sums(V_LEK, rank_LE, P):
    L, E, K = V_LEK.shape
    W_LKP = np.zeros((L, K, P), dtype=np.int64)
    for l in range(L):
        for e in range(E):
            p = rank_LE[l, e]
            for k in range(K):
                W_LKP[l, k, p] += V_LEK[l, e, k]
    return W_LKP


# The kernels below read their arrays through named tuples. They run without numba's reference
# counting (_nrt=False: they allocate nothing): with it, every call increfs and decrefs each
# array of each record, and the swap scan ran 3× slower than with loose array arguments.


class SearchArrays(NamedTuple):
    """The search's state for one fixed layout (changed in place by :func:`_apply_swap`)."""

    V_LEK: np.ndarray    # [L, E, K] int64: tokens of expert e at layer l in block k
    rank_LE: np.ndarray  # [L, E] int64: rank of each expert
    W_LKP: np.ndarray    # [L, K, P] int64: rank loads
    M_LK: np.ndarray     # [L, K] int64: max_p W
    Mtot_K: np.ndarray   # [K] int64: Σ_l M


class Migration(NamedTuple):
    """Traffic to a current placement: experts each rank receives, priced in the first key
    component at ``coef`` per expert of the busiest receiver (``coef`` = 0: no current one)."""

    home_LE: np.ndarray  # [L, E] int64: rank of each expert in the current placement
    recv_P: np.ndarray   # [P] int64: experts rank p receives
    coef: float


class SwapScratch(NamedTuple):
    """One layer's top three rank loads per block and a swap's per-block peak changes."""

    tv_K3: np.ndarray  # [K, 3] int64
    ti_K3: np.ndarray  # [K, 3] int64
    dM_K: np.ndarray   # [K] int64
    S_buf: np.ndarray  # [max(G, R)] float64 (cost_kernel.key_of)


def _scratch(K: int, G: int, R: int) -> SwapScratch:
    return SwapScratch(np.empty((K, 3), dtype=np.int64), np.empty((K, 3), dtype=np.int64),
                       np.zeros(K, dtype=np.int64), np.empty(max(G, R), dtype=np.float64))


@numba.njit(cache=True, _nrt=False)
def _max_recv(recv_P, p, dp, q, dq):
    m = 0
    for j in range(recv_P.shape[0]):
        v = recv_P[j]
        if j == p:
            v += dp
        elif j == q:
            v += dq
        if v > m:
            m = v
    return m


@numba.njit(cache=True, _nrt=False)
def _recv_delta(home_LE, l, a, b, p, q):
    """Change of experts received by ranks p and q when a (on p) and b (on q) swap."""
    dp = 0
    dq = 0
    ha = home_LE[l, a]
    hb = home_LE[l, b]
    if ha != p:
        dp -= 1  # a had been received by p
    if ha != q:
        dq += 1  # q receives a
    if hb != q:
        dq -= 1
    if hb != p:
        dp += 1
    return dp, dq


@numba.njit(cache=True, _nrt=False)
def _eval_swap(l, a, b, sa, bk, mig, sc, skip_unchanged):
    """Key after swapping experts a and b of layer l (on different ranks); fills sc.dM_K. With
    ``skip_unchanged``, a swap that changes no peak and no traffic returns +inf keys unscored."""
    V_LEK, W_LKP, M_LK, dM_K = sa.V_LEK, sa.W_LKP, sa.M_LK, sc.dM_K
    K = sa.Mtot_K.shape[0]
    p = sa.rank_LE[l, a]
    q = sa.rank_LE[l, b]
    changed = False
    for k in range(K):
        d = V_LEK[l, b, k] - V_LEK[l, a, k]
        m = peak_after_swap(sc.tv_K3, sc.ti_K3, k, p, q, W_LKP[l, k, p] + d, W_LKP[l, k, q] - d)
        dM_K[k] = m - M_LK[l, k]
        if dM_K[k] != 0:
            changed = True
    mig_t = 0.0
    mig_changed = False
    if mig.coef > 0.0:
        dp, dq = _recv_delta(mig.home_LE, l, a, b, p, q)
        mig_t = mig.coef * _max_recv(mig.recv_P, p, dp, q, dq)
        mig_changed = dp != 0 or dq != 0
    if skip_unchanged and not (changed or mig_changed):
        return np.inf, np.inf, np.inf, False
    m, t, pk = key_of(bk, sa.Mtot_K, dM_K, sc.S_buf)
    return m + mig_t, t, pk, changed or mig_changed


@numba.njit(cache=True, _nrt=False)
def _apply_swap(l, a, b, sa, mig, sc):
    """Swap experts a and b of layer l with the peak changes sc.dM_K of :func:`_eval_swap`."""
    K = sa.Mtot_K.shape[0]
    p = sa.rank_LE[l, a]
    q = sa.rank_LE[l, b]
    if mig.coef > 0.0:
        dp, dq = _recv_delta(mig.home_LE, l, a, b, p, q)
        mig.recv_P[p] += dp
        mig.recv_P[q] += dq
    for k in range(K):
        d = sa.V_LEK[l, b, k] - sa.V_LEK[l, a, k]
        sa.W_LKP[l, k, p] += d
        sa.W_LKP[l, k, q] -= d
        sa.M_LK[l, k] += sc.dM_K[k]
        sa.Mtot_K[k] += sc.dM_K[k]
    sa.rank_LE[l, a] = q
    sa.rank_LE[l, b] = p
    top3(sa.W_LKP[l], sc.tv_K3, sc.ti_K3)


@numba.njit(cache=True)
def _scan_layer(l, order_E, sa, bk, mig, sc, cur):
    """One first-improvement scan over all swaps of layer l; ``cur``, the key, updated in place.
    Returns the number of swaps."""
    E = order_E.shape[0]
    top3(sa.W_LKP[l], sc.tv_K3, sc.ti_K3)
    m0 = cur[0]; t0 = cur[1]; p0 = cur[2]
    swaps = 0
    for ia in range(E):
        a = order_E[ia]
        for ib in range(ia + 1, E):
            b = order_E[ib]
            if sa.rank_LE[l, a] == sa.rank_LE[l, b]:
                continue
            m1, t1, p1, changed = _eval_swap(l, a, b, sa, bk, mig, sc, True)
            if changed and less(m1, t1, p1, m0, t0, p0):
                _apply_swap(l, a, b, sa, mig, sc)
                m0 = m1; t0 = t1; p0 = p1
                swaps += 1
    cur[0] = m0; cur[1] = t0; cur[2] = p0
    return swaps


# ----------------------------------------------------------------------------------------------
# Python API
# ----------------------------------------------------------------------------------------------


def row_shard_expert_loads(counts_NLE, row_N, slot_N, rows: int, topology: Topology) -> np.ndarray:
    """``V_LEK[l, e, k]`` = Σ over the samples of (row, shard) k = r·G + g of counts[i, l, e]."""
    G = topology.num_shards
    k_N = np.asarray(row_N, dtype=np.int64) * G + topology.shard_array()[np.asarray(slot_N, dtype=np.int64)]
    return _row_shard_expert_loads(np.ascontiguousarray(counts_NLE), k_N, rows * G)


def attention_base(lengths_N, row_N, slot_N, rows: int, topology: Topology, cost: CostModel) -> np.ndarray:
    """``Abase_K[k]`` = Σ_s max_{d∈g} (α_s T + β_s Q) of (row, shard) k — the placement-free part
    of J, computed by the evaluator itself (with no experts)."""
    N = len(lengths_N)
    _, A_SRG, _ = row_shard_costs(lengths_N, np.zeros((N, 1, topology.ep), dtype=np.int64), row_N, slot_N,
                                  rows, topology, cost, parts=True)
    return np.ascontiguousarray(A_SRG.sum(axis=0).reshape(-1))


@dataclasses.dataclass(frozen=True)
class RefineConfig:
    """``max_passes``: passes over all layers (a pass scans every swap of every layer once);
    the search stops earlier at a pass without a swap (a swap-local optimum).
    ``migration_weight``: multiplies the migration time in the first key component (1 = the
    move is paid within this one step; 1/k = amortized over k steps the placement stays)."""

    max_passes: int = 8
    migration_weight: float = 1.0

    def __post_init__(self):
        if not isinstance(self.max_passes, int) or self.max_passes < 0:
            raise InputError(f"refine: max_passes must be an integer ≥ 0, got {self.max_passes!r}")
        if not np.isfinite(self.migration_weight) or self.migration_weight < 0:
            raise InputError(f"refine: migration_weight must be finite and ≥ 0, got {self.migration_weight!r}")


class RowAwareState:
    """Incremental state of the row-aware placement search for one fixed layout.

    Holds V (per (row,shard) expert loads), the current ranks, W, M = max_p W, Σ_l M, the constant
    attention part, and — with a current placement — the experts each rank receives. ``key()`` is
    the lexicographic (makespan + w·migration time, total, peak) of the state; ``try_swap`` and
    ``swap`` evaluate / apply one swap in O(K).
    """

    def __init__(self, window: Window, topology: Topology, cost: CostModel, placement_LE,
                 row_N, slot_N, rows: int, objective: Objective, current_placement=None,
                 migration_weight: float = 1.0):
        objective = check_objective(objective)
        topology.check_experts(window.num_experts)
        placement_LE = np.asarray(placement_LE, dtype=np.int64)
        errs = check_placement(placement_LE, window.num_layers, window.num_experts)
        if errs:
            raise InputError("; ".join(errs[:3]))
        L, E = placement_LE.shape
        P, G = topology.ep, topology.num_shards
        self.window, self.topology, self.cost, self.rows = window, topology, cost, rows
        self.objective = objective
        self.P, self.G, self.R, self.K = P, G, rows, rows * G
        self.per_rank = E // P
        self.start_placement = placement_LE.copy()
        self.V_LEK = row_shard_expert_loads(window.counts, row_N, slot_N, rows, topology)
        self.rank_LE = np.ascontiguousarray(placement_LE // self.per_rank)
        self.W_LKP = _rank_sums(self.V_LEK, self.rank_LE, P)
        self.M_LK = self.W_LKP.max(axis=2)
        self.Mtot_K = self.M_LK.sum(axis=0)
        self.Abase_K = attention_base(window.lengths, row_N, slot_N, rows, topology, cost)
        k = np.arange(self.K)
        self.shard_K, self.row_K = k % G, k // G
        self.gamma, self.ro = float(cost.gamma), float(cost.row_overhead)
        self.current_placement = None
        if current_placement is not None:
            cur = np.asarray(current_placement, dtype=np.int64)
            errs = check_placement(cur, L, E)
            if errs:
                raise InputError("current placement: " + "; ".join(errs[:3]))
            self.current_placement = cur
            self.home_LE = np.ascontiguousarray(cur // self.per_rank)
            self.mig_coef = float(migration_weight) * per_expert_time(cost)
        else:
            self.home_LE = self.rank_LE.copy()
            self.mig_coef = 0.0
        moved = self.rank_LE != self.home_LE
        self.recv_P = np.bincount(self.rank_LE[moved], minlength=P).astype(np.int64)
        # the kernels' records: the same arrays as the attributes above, changed in place
        self._arrays = SearchArrays(self.V_LEK, self.rank_LE, self.W_LKP, self.M_LK, self.Mtot_K)
        self._blocks = BlockCosts(self.Abase_K, self.gamma, self.ro, self.shard_K, self.row_K, G, rows,
                                  objective.code)
        self._mig = Migration(self.home_LE, self.recv_P, self.mig_coef)
        self._sc = _scratch(self.K, G, rows)

    # ---- scoring ----------------------------------------------------------------------------
    def key(self) -> tuple[float, float, float]:
        self._sc.dM_K[:] = 0
        m, t, pk = key_of(self._blocks, self.Mtot_K, self._sc.dM_K, self._sc.S_buf)
        return (m + self.migration_time(), t, pk)

    def migration_time(self) -> float:
        return self.mig_coef * float(self.recv_P.max(initial=0))

    def try_swap(self, l: int, a: int, b: int) -> tuple[float, float, float]:
        """Key after swapping experts a and b of layer l (state unchanged)."""
        self._check_pair(l, a, b)
        top3(self.W_LKP[l], self._sc.tv_K3, self._sc.ti_K3)
        m, t, pk, _ = _eval_swap(l, a, b, self._arrays, self._blocks, self._mig, self._sc, False)
        return (m, t, pk)

    def swap(self, l: int, a: int, b: int) -> None:
        self.try_swap(l, a, b)  # fills the scratch's dM_K and top three
        _apply_swap(l, a, b, self._arrays, self._mig, self._sc)

    def _check_pair(self, l, a, b):
        if self.rank_LE[l, a] == self.rank_LE[l, b]:
            raise ValueError(f"experts {a} and {b} of layer {l} are on the same rank")

    # ---- search -----------------------------------------------------------------------------
    def scan_layer(self, l: int, order_E: np.ndarray, cur: np.ndarray) -> int:
        return int(_scan_layer(l, order_E, self._arrays, self._blocks, self._mig, self._sc, cur))

    def placement(self) -> np.ndarray:
        """A placement with the state's per-rank expert sets; slots aligned to the current
        placement (when given) or to the start placement, so unchanged ranks keep their slots."""
        ref = self.current_placement if self.current_placement is not None else self.start_placement
        # align_slots needs a permutation: give each expert a distinct slot on its rank first
        L, E = self.rank_LE.shape
        out = np.empty_like(self.rank_LE)
        for l in range(L):
            order = np.argsort(self.rank_LE[l], kind="stable")
            out[l, order] = np.arange(E)
        # no relabelling: the search's traffic accounting uses the reference's rank labels
        return align_slots(out, ref, self.P, relabel=False)


@dataclasses.dataclass(frozen=True)
class RefineResult:
    """``key`` = (makespan + migration time, total, peak) of the refined placement on the given
    layout; ``score`` the evaluator-style score without migration."""

    placement: np.ndarray
    key: tuple[float, float, float]
    start_key: tuple[float, float, float]
    score: Score
    migration_time: float
    passes: int
    swaps: int
    converged: bool
    wall_s: float


def refine_placement(window: Window, topology: Topology, cost: CostModel, placement_LE, row_N,
                     slot_N, rows: int, objective: Objective = Objective.MAX_SUM, current_placement=None,
                     config: RefineConfig = RefineConfig(), seed: int = 0,
                     time_limit: float | None = None) -> RefineResult:
    """Swap-local search of the per-layer placements against the true objective on a fixed
    layout (module doc). Never worse than its start; deterministic for a seed and ``max_passes``
    (``time_limit`` cuts between layers, anytime)."""
    t0 = time.perf_counter()
    st = RowAwareState(window, topology, cost, placement_LE, row_N, slot_N, rows, objective,
                       current_placement, config.migration_weight)
    start = st.key()
    cur = np.array(start, dtype=np.float64)  # the kernel updates it in place
    rng = np.random.default_rng(seed)
    L, E = window.num_layers, window.num_experts
    passes = swaps = 0
    converged = st.P == 1
    deadline = None if time_limit is None else t0 + time_limit
    while passes < config.max_passes and not converged:
        n = 0
        for l in rng.permutation(L):
            if deadline is not None and time.perf_counter() > deadline:
                break
            n += st.scan_layer(int(l), rng.permutation(E).astype(np.int64), cur)
        else:
            passes += 1
            swaps += n
            converged = n == 0
            continue
        swaps += n
        break
    key = st.key()
    m = key[0] - st.migration_time()
    return RefineResult(placement=st.placement(), key=key, start_key=start,
                        score=Score(objective, m, key[1], key[2]), migration_time=st.migration_time(),
                        passes=passes, swaps=swaps, converged=converged,
                        wall_s=time.perf_counter() - t0)

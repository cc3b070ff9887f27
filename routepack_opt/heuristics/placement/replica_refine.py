"""Row-aware replica moves: improve a placement with replicas for a fixed packing.

Legend: L layers, E logical experts, S physical slots per layer, P EP ranks, K = R·G row-shard
blocks, ``V[l, e, k]`` the tokens of expert e at layer l in block k (the packing's), ``cnt[e]``
e's replica count, ``n[e, p]`` its replicas on rank p.

Under the search's linear surrogate of the even-local rule, rank p's load in block k is

    W[k, p] = Σ_e V[k, e] · n[e, p] / cnt[e]

and the expert part of the cost is γ Σ_{k,l} max_p W (exactly the objective with one shard under
max-sum or sum-max; with several shards a proxy: the evaluator decides). Layers are independent,
so each is searched on its own (in parallel), by best-improvement local search over two moves
that keep S/P slots per rank and replicas of one expert on distinct ranks:

- **swap** the experts of two slots on different ranks (moves a replica, or two);
- **reassign** a slot from an expert with ≥ 2 replicas to another expert with < P replicas and
  none on that rank (drops a replica of one expert and adds one of another: changes the counts).

The row-aware part: a hot expert's tokens are not spread evenly over the rows, so which experts
share a rank — and how many replicas each gets — matters per row, not only in aggregate. Each move's
cost is recomputed over the K blocks of the ranks it touches (O(K·P) per reassign, O(K) per swap
with the three largest loads per block kept). :func:`refine_replicas` returns the placement; the
caller keeps it only if the one evaluator scores it better.
"""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np

from routepack_opt.core.cost_kernel import expert_peak_sum, peak_after_swap, top3
from routepack_opt.core.placement import Placement
from routepack_opt.core.topology import Topology
from routepack_opt.heuristics.placement.refine import row_shard_expert_loads

__all__ = ["refine_replicas", "block_expert_loads", "ReplicaLayer", "replica_layer", "swap_legal", "swap_cost",
           "apply_swap", "reassign_legal", "reassign_cost", "apply_reassign"]


# The moves read the layer through a named tuple and allocate nothing: they run without numba's
# reference counting (_nrt=False), which would incref and decref every array of the record on
# each call (refine.py measured 3× on its swap scan).


class ReplicaLayer(NamedTuple):
    """One layer's search state (every array changed in place by the moves)."""

    V_EK: np.ndarray   # [E, K] float64: the packing's tokens of expert e in block k
    p2l_S: np.ndarray  # [S] int64: expert of each slot
    P: int             # EP ranks
    M: int             # slots per rank (S / P)
    cnt_E: np.ndarray  # [E] int64: replicas of e
    n_EP: np.ndarray   # [E, P] int64: replicas of e on rank p
    tot_E: np.ndarray  # [E] float64: Σ_k V[e, k]
    U_EK: np.ndarray   # [E, K] float64: one replica's share V[e, k] / cnt[e]
    W_KP: np.ndarray   # [K, P] float64: rank loads (the surrogate)
    tv_K3: np.ndarray  # [K, 3] float64: each block's three largest rank loads
    ti_K3: np.ndarray  # [K, 3] int64: and their ranks


@numba.njit(cache=True)
def replica_layer(V_EK, p2l_S, P):
    """The search state of one layer's slots ``p2l_S`` (kept, and changed by the moves)."""
    E, K = V_EK.shape
    S = p2l_S.shape[0]
    M = S // P
    cnt = np.zeros(E, dtype=np.int64)
    n_EP = np.zeros((E, P), dtype=np.int64)
    for s in range(S):
        cnt[p2l_S[s]] += 1
        n_EP[p2l_S[s], s // M] += 1
    tot = np.zeros(E)
    for e in range(E):
        for k in range(K):
            tot[e] += V_EK[e, k]
    # U[e, k] = V[e, k] / cnt[e], one replica's share, read by the loads and the swap scan (its
    # two divisions per block were most of its time); rebuilt when a reassign changes the counts
    U = np.empty((E, K))
    _shares(V_EK, cnt, U)
    W = np.empty((K, P))
    _loads(U, p2l_S, M, W)
    return ReplicaLayer(V_EK, p2l_S, P, M, cnt, n_EP, tot, U, W, np.empty((K, 3)),
                        np.empty((K, 3), dtype=np.int64))


@numba.njit(cache=True, _nrt=False)
def _hot_ranks(ti_K3, h, wins_P, hot_P):
    """``hot_P[p]``: p is among the ``h`` ranks that are the busiest of the most blocks (ties
    to the lower rank), and the busiest of at least one."""
    wins_P[:] = 0
    for k in range(ti_K3.shape[0]):
        wins_P[ti_K3[k, 0]] += 1
    hot_P[:] = False
    for _ in range(h):
        b = -1
        for p in range(wins_P.shape[0]):
            if not hot_P[p] and wins_P[p] > 0 and (b < 0 or wins_P[p] > wins_P[b]):
                b = p
        if b < 0:
            break
        hot_P[b] = True


@numba.njit(cache=True, _nrt=False)
def _loads(U_EK, p2l_S, M, W_KP):
    """Rank loads W[k, p] from the replicas' shares ``U`` (:func:`_shares`), into W_KP."""
    K = U_EK.shape[1]
    W_KP[:, :] = 0.0
    for s in range(p2l_S.shape[0]):
        e = p2l_S[s]
        p = s // M
        for k in range(K):
            W_KP[k, p] += U_EK[e, k]


@numba.njit(cache=True, _nrt=False)
def _shares(V_EK, cnt_E, U_EK):
    E, K = V_EK.shape
    for e in range(E):
        for k in range(K):
            U_EK[e, k] = V_EK[e, k] / cnt_E[e]


@numba.njit(cache=True, _nrt=False)
def swap_legal(ly, s, t):
    """Slots s and t may swap: different ranks and experts, and neither expert already on the
    other's rank."""
    e = ly.p2l_S[s]
    f = ly.p2l_S[t]
    p = s // ly.M
    q = t // ly.M
    return not (q == p or f == e or ly.n_EP[e, q] > 0 or ly.n_EP[f, p] > 0)


@numba.njit(cache=True, _nrt=False)
def swap_cost(ly, s, t, best):
    """Σ_k max_p W after swapping the experts of slots s and t, in O(K) from the blocks' top
    three (:func:`~routepack_opt.core.cost_kernel.peak_after_swap`); stops early, with a value
    ≥ ``best``, once the partial sum reaches ``best``. Needs ly.tv_K3 / ti_K3 current."""
    e = ly.p2l_S[s]
    f = ly.p2l_S[t]
    p = s // ly.M
    q = t // ly.M
    W, U = ly.W_KP, ly.U_EK
    c = 0.0
    for k in range(W.shape[0]):
        d = U[f, k] - U[e, k]
        c += peak_after_swap(ly.tv_K3, ly.ti_K3, k, p, q, W[k, p] + d, W[k, q] - d)
        if c >= best:
            break
    return c


@numba.njit(cache=True, _nrt=False)
def apply_swap(ly, s, t):
    """Swap the experts of slots s and t (the loads by increments; the caller refreshes the
    top three)."""
    e = ly.p2l_S[s]
    f = ly.p2l_S[t]
    p = s // ly.M
    q = t // ly.M
    for k in range(ly.W_KP.shape[0]):
        d = ly.U_EK[f, k] - ly.U_EK[e, k]
        ly.W_KP[k, p] += d
        ly.W_KP[k, q] -= d
    ly.n_EP[e, p] -= 1
    ly.n_EP[f, q] -= 1
    ly.p2l_S[s] = f
    ly.p2l_S[t] = e
    ly.n_EP[f, p] += 1
    ly.n_EP[e, q] += 1


@numba.njit(cache=True, _nrt=False)
def reassign_legal(ly, s, f):
    """Slot s may go from its expert (≥ 2 replicas) to f (< P replicas, none on s's rank)."""
    e = ly.p2l_S[s]
    return ly.cnt_E[e] >= 2 and f != e and ly.cnt_E[f] < ly.P and ly.n_EP[f, s // ly.M] == 0


@numba.njit(cache=True, _nrt=False)
def reassign_cost(ly, s, f, Wn_KP):
    """Σ_k max_p W after slot s goes from its expert e to f: e's other replicas gain, f's
    replicas lose a share (O(S·K)); the new loads into the scratch ``Wn_KP``."""
    V, cnt, M = ly.V_EK, ly.cnt_E, ly.M
    e = ly.p2l_S[s]
    K = V.shape[1]
    for k in range(K):
        for p in range(ly.P):
            Wn_KP[k, p] = ly.W_KP[k, p]
    for u in range(ly.p2l_S.shape[0]):
        g = ly.p2l_S[u]
        r = u // M
        if u == s:
            for k in range(K):
                Wn_KP[k, r] += V[f, k] / (cnt[f] + 1) - V[e, k] / cnt[e]
        elif g == e:
            for k in range(K):
                Wn_KP[k, r] += V[e, k] / (cnt[e] - 1) - V[e, k] / cnt[e]
        elif g == f:
            for k in range(K):
                Wn_KP[k, r] += V[f, k] / (cnt[f] + 1) - V[f, k] / cnt[f]
    return expert_peak_sum(Wn_KP)


@numba.njit(cache=True, _nrt=False)
def apply_reassign(ly, s, f):
    """Give slot s to expert f; the shares and the loads rebuilt from the new counts."""
    e = ly.p2l_S[s]
    p = s // ly.M
    ly.n_EP[e, p] -= 1
    ly.cnt_E[e] -= 1
    ly.p2l_S[s] = f
    ly.n_EP[f, p] += 1
    ly.cnt_E[f] += 1
    _shares(ly.V_EK, ly.cnt_E, ly.U_EK)
    _loads(ly.U_EK, ly.p2l_S, ly.M, ly.W_KP)


@numba.njit(cache=True, _nrt=False)
def _swap_pass(ly, hot_ranks, hot, wins, cur):
    """Every slot on the ``hot_ranks`` ranks that are the busiest of the most blocks (fresh for
    each rank) makes its best improving swap, if any (``hot``, ``wins``: [P] scratch). Returns
    (swaps, cost)."""
    S = ly.p2l_S.shape[0]
    swapped = 0
    for s in range(S):
        if s % ly.M == 0:  # the hot ranks and the blocks' largest loads, fresh for each rank
            top3(ly.W_KP, ly.tv_K3, ly.ti_K3)
            _hot_ranks(ly.ti_K3, hot_ranks, wins, hot)
        if not hot[s // ly.M]:
            continue
        best = cur * (1.0 - 1e-12)
        bt = -1
        for t in range(S):
            if swap_legal(ly, s, t):
                c = swap_cost(ly, s, t, best)
                if c < best:
                    best = c
                    bt = t
        if bt < 0:
            continue
        apply_swap(ly, s, bt)
        cur = expert_peak_sum(ly.W_KP)
        top3(ly.W_KP, ly.tv_K3, ly.ti_K3)
        swapped += 1
    return swapped, cur


@numba.njit(cache=True)
def _best_reassign(ly, num_targets, cur, Wn_KP):
    """The reassign of least cost below ``cur`` (to one of the ``num_targets`` hottest experts
    per replica): (slot, expert), or (−1, −1)."""
    E = ly.V_EK.shape[0]
    order = np.argsort(-(ly.tot_E / ly.cnt_E))
    best = cur * (1.0 - 1e-12)
    bs = -1
    bf = -1
    for s in range(ly.p2l_S.shape[0]):
        if ly.cnt_E[ly.p2l_S[s]] < 2:
            continue
        for fi in range(min(num_targets, E)):
            f = order[fi]
            if not reassign_legal(ly, s, f):
                continue
            c = reassign_cost(ly, s, f, Wn_KP)
            if c < best:
                best = c
                bs = s
                bf = f
    return bs, bf


@numba.njit(cache=True)
def _search_layer(V_EK, p2l_S, P, max_passes, num_targets, hot_ranks):
    """Local search on one layer's ``p2l_S`` (changed in place): each pass makes the hot ranks'
    best improving swaps (:func:`_swap_pass`); a pass without a swap makes the best reassign
    instead. Returns the number of moves made."""
    ly = replica_layer(V_EK, p2l_S, P)
    cur = expert_peak_sum(ly.W_KP)
    Wn = np.empty_like(ly.W_KP)
    hot = np.zeros(P, dtype=np.bool_)
    wins = np.zeros(P, dtype=np.int64)
    moves = 0
    for _ in range(max_passes):
        swapped, cur = _swap_pass(ly, hot_ranks, hot, wins, cur)
        moves += swapped
        if swapped:
            _loads(ly.U_EK, ly.p2l_S, ly.M, ly.W_KP)  # drop the increments' rounding
            cur = expert_peak_sum(ly.W_KP)
            continue
        # no swap helps: reassign a slot of an expert with ≥ 2 replicas
        bs, bf = _best_reassign(ly, num_targets, cur, Wn)
        if bs < 0:
            break
        apply_reassign(ly, bs, bf)
        cur = expert_peak_sum(ly.W_KP)
        moves += 1
    return moves


@numba.njit(cache=True, parallel=True)
def _search_all(V_LEK, p2l_LS, P, max_passes, num_targets, hot_ranks):
    L = p2l_LS.shape[0]
    moves = np.zeros(L, dtype=np.int64)
    for l in numba.prange(L):
        moves[l] = _search_layer(V_LEK[l].astype(np.float64), p2l_LS[l], P, max_passes, num_targets,
                                 hot_ranks)
    return moves


def block_expert_loads(counts_NLE, row_N, slot_N, rows: int, topology: Topology) -> np.ndarray:
    """``V[l, e, k]``: the packing's tokens of expert e at layer l in row-shard block k."""
    return np.ascontiguousarray(row_shard_expert_loads(counts_NLE, row_N, slot_N, rows, topology))


def refine_replicas(V_LEK: np.ndarray, placement: Placement, topology: Topology,
                    max_passes: int = 16, num_targets: int = 8, hot_ranks: int = 4) -> tuple[Placement, int]:
    """(improved placement, moves made) for a packing's block loads ``V_LEK``
    (:func:`block_expert_loads`; module docstring). Deterministic. ``max_passes`` bounds the
    passes per layer (call again to go on: a call that makes no move is a local optimum);
    ``num_targets``: how many of the hottest experts per replica a reassign may give a slot to;
    ``hot_ranks``: how many of the ranks that are most often a block's busiest a swap starts from."""
    p2l = np.array(placement.phy2log, dtype=np.int64)
    moves = _search_all(np.ascontiguousarray(V_LEK), p2l, int(topology.ep), int(max_passes), int(num_targets),
                        int(hot_ranks))
    return Placement(p2l, placement.ep, placement.num_experts), int(moves.sum())

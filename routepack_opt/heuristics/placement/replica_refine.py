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

import numba
import numpy as np

from routepack_opt.core.placement import Placement
from routepack_opt.core.topology import Topology
from routepack_opt.heuristics.placement.refine import row_shard_expert_loads

__all__ = ["refine_replicas", "block_expert_loads"]


@numba.njit(cache=True)
def _layer_cost(W_KP):
    K, P = W_KP.shape
    c = 0.0
    for k in range(K):
        m = W_KP[k, 0]
        for p in range(1, P):
            if W_KP[k, p] > m:
                m = W_KP[k, p]
        c += m
    return c


@numba.njit(cache=True)
def _top3(W_KP, tv_K3, ti_K3):
    """Per block the three largest rank loads and their ranks (−1 where P < 3)."""
    K, P = W_KP.shape
    for k in range(K):
        a = b = c = -1.0
        ia = ib = ic = -1
        for p in range(P):
            w = W_KP[k, p]
            if w > a:
                c, ic = b, ib
                b, ib = a, ia
                a, ia = w, p
            elif w > b:
                c, ic = b, ib
                b, ib = w, p
            elif w > c:
                c, ic = w, p
        tv_K3[k, 0], tv_K3[k, 1], tv_K3[k, 2] = a, b, c
        ti_K3[k, 0], ti_K3[k, 1], ti_K3[k, 2] = ia, ib, ic


@numba.njit(cache=True)
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


@numba.njit(cache=True)
def _loads(U_EK, p2l_S, M, P):
    """Rank loads W[k, p] from the replicas' shares ``U`` (:func:`_shares`)."""
    K = U_EK.shape[1]
    W = np.zeros((K, P))
    for s in range(p2l_S.shape[0]):
        e = p2l_S[s]
        p = s // M
        for k in range(K):
            W[k, p] += U_EK[e, k]
    return W


@numba.njit(cache=True)
def _shares(V_EK, cnt_E, U_EK):
    E, K = V_EK.shape
    for e in range(E):
        for k in range(K):
            U_EK[e, k] = V_EK[e, k] / cnt_E[e]


@numba.njit(cache=True)
def _search_layer(V_EK, p2l_S, P, max_passes, num_targets, hot_ranks):
    """Local search on one layer's ``p2l_S`` (changed in place): each pass takes every slot on
    the ``hot_ranks`` ranks that are the busiest of the most blocks and makes its best improving
    swap, if any; a pass without a swap tries the reassigns (best first). Returns the number of
    moves made."""
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
    W = _loads(U, p2l_S, M, P)
    cur = _layer_cost(W)
    moves = 0
    Wn = np.empty((K, P))
    tv = np.empty((K, 3))
    ti = np.empty((K, 3), dtype=np.int64)
    hot = np.zeros(P, dtype=np.bool_)
    wins = np.zeros(P, dtype=np.int64)
    for _ in range(max_passes):
        swapped = 0
        for s in range(S):
            p = s // M
            if s % M == 0:  # the hot ranks and the blocks' largest loads, fresh for each rank
                _top3(W, tv, ti)
                _hot_ranks(ti, hot_ranks, wins, hot)
            if not hot[p]:
                continue
            e = p2l_S[s]
            best = cur * (1.0 - 1e-12)
            bt = -1
            for t in range(S):
                f = p2l_S[t]
                q = t // M
                if q == p or f == e or n_EP[e, q] > 0 or n_EP[f, p] > 0:
                    continue
                c = 0.0
                for k in range(K):
                    d = U[f, k] - U[e, k]
                    m = W[k, p] + d
                    x = W[k, q] - d
                    if x > m:
                        m = x
                    for j in range(3):
                        r = ti[k, j]
                        if r != p and r != q:
                            if r >= 0 and tv[k, j] > m:
                                m = tv[k, j]
                            break
                    c += m
                    if c >= best:
                        break
                if c < best:
                    best = c
                    bt = t
            if bt < 0:
                continue
            f = p2l_S[bt]
            q = bt // M
            for k in range(K):
                d = U[f, k] - U[e, k]
                W[k, p] += d
                W[k, q] -= d
            n_EP[e, p] -= 1
            n_EP[f, q] -= 1
            p2l_S[s] = f
            p2l_S[bt] = e
            n_EP[f, p] += 1
            n_EP[e, q] += 1
            cur = _layer_cost(W)
            _top3(W, tv, ti)
            swapped += 1
            moves += 1
        if swapped:
            W = _loads(U, p2l_S, M, P)  # drop the increments' rounding
            cur = _layer_cost(W)
            continue
        # --- no swap helps: reassign slot s (expert e, cnt ≥ 2) to one of the hottest experts
        # per replica (f with < P replicas and none on s's rank)
        order = np.argsort(-(tot / cnt))
        best = cur * (1.0 - 1e-12)
        bs = -1
        bf = -1
        for s in range(S):
            e = p2l_S[s]
            p = s // M
            if cnt[e] < 2:
                continue
            for fi in range(min(num_targets, E)):
                f = order[fi]
                if f == e or cnt[f] >= P or n_EP[f, p] > 0:
                    continue
                Wn[:, :] = W
                for u in range(S):  # e's other replicas gain, f's replicas lose a share
                    g = p2l_S[u]
                    r = u // M
                    if u == s:
                        for k in range(K):
                            Wn[k, r] += V_EK[f, k] / (cnt[f] + 1) - V_EK[e, k] / cnt[e]
                    elif g == e:
                        for k in range(K):
                            Wn[k, r] += V_EK[e, k] / (cnt[e] - 1) - V_EK[e, k] / cnt[e]
                    elif g == f:
                        for k in range(K):
                            Wn[k, r] += V_EK[f, k] / (cnt[f] + 1) - V_EK[f, k] / cnt[f]
                c = _layer_cost(Wn)
                if c < best:
                    best = c
                    bs = s
                    bf = f
        if bs < 0:
            break
        e = p2l_S[bs]
        n_EP[e, bs // M] -= 1
        cnt[e] -= 1
        p2l_S[bs] = bf
        n_EP[bf, bs // M] += 1
        cnt[bf] += 1
        _shares(V_EK, cnt, U)
        W = _loads(U, p2l_S, M, P)
        cur = _layer_cost(W)
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

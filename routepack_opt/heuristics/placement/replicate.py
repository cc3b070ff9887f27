"""Replica placement (docs/pipeline.md, step 1 with ``--redundant-experts``).

Legend: L MoE layers, E logical experts, S = E + redundant physical slots per layer, P EP ranks,
M = S / P slots per rank, K the most replicas of one expert.

Two steps per layer, from the aggregate loads ``load[l, e]``:

1. **How many replicas** (:func:`replica_counts`): start from one each and give every redundant
   slot to the expert with the largest load per replica, ``load / logcnt`` (the greedy of
   DeepSeek's EPLB, ``replicate_experts``: it minimises the largest per-replica load, since each
   step lowers the current maximum and a replica more never hurts it), never more than P replicas
   of one expert (more could not sit on distinct ranks).
2. **Where** (:func:`place_replicas`): Graham's LPT (1969) over the S replicas with weight
   ``load / logcnt`` (the token share the even-split rule sends each of them), by decreasing
   weight, each to the least-loaded rank that has a free slot *and does not hold that expert
   yet*; then pairwise swaps off the busiest rank that keep that rule (as
   :func:`routepack_opt.heuristics.placement.lpt.swap_refine` does without replicas).

:func:`eplb_placement` re-implements DeepSeek's EPLB global policy (``rebalance_experts`` with
one group and one node: ``replicate_experts`` then ``balanced_packing``; github.com/deepseek-ai/EPLB,
MIT licence) as the baseline the experiments compare with. Its packing does not keep replicas of
one expert on distinct ranks.
"""

from __future__ import annotations

import numba
import numpy as np

from routepack_opt.core.errors import InputError
from routepack_opt.core.placement import Placement

__all__ = ["replica_counts", "place_replicas", "replicated_placement", "eplb_placement"]


def _check(load_LE, ep: int, num_slots: int) -> np.ndarray:
    load_LE = np.asarray(load_LE, dtype=np.float64)
    if load_LE.ndim != 2:
        raise InputError(f"loads: expected [L, E], got shape {list(load_LE.shape)}")
    E = load_LE.shape[1]
    if num_slots < E or num_slots % ep:
        raise InputError(f"replicas: S={num_slots} slots must be ≥ E={E} and divisible by ep={ep}")
    if num_slots > E * ep:
        raise InputError(f"replicas: S={num_slots} slots exceed E·ep={E * ep}: an expert can have at "
                         "most one replica per rank")
    return load_LE


def replica_counts(load_LE, num_slots: int, max_replicas: int) -> np.ndarray:
    """``logcnt[l, e]``: EPLB's greedy (see module docstring), capped at ``max_replicas``. Ties go
    to the lower expert id."""
    load_LE = np.asarray(load_LE, dtype=np.float64)
    L, E = load_LE.shape
    cnt = np.ones((L, E), dtype=np.int64)
    ar = np.arange(L)
    for _ in range(num_slots - E):
        w = np.where(cnt < max_replicas, load_LE / cnt, -1.0)
        e = w.argmax(axis=1)
        cnt[ar, e] += 1
    return cnt


@numba.njit(cache=True)
def _layer_replicas(load_E, cnt_E):
    """The layer's replicas as items: (expert, replica index, weight load / count) each."""
    E = load_E.shape[0]
    S = 0
    for e in range(E):
        S += cnt_E[e]
    item_e = np.empty(S, dtype=np.int64)
    item_j = np.empty(S, dtype=np.int64)
    w = np.empty(S)
    t = 0
    for e in range(E):
        for j in range(cnt_E[e]):
            item_e[t] = e
            item_j[t] = j
            w[t] = load_E[e] / cnt_E[e]
            t += 1
    return item_e, item_j, w


@numba.njit(cache=True)
def _lpt_distinct(item_e, w, E, ep, per_rank):
    """LPT: replicas by decreasing weight (ties by expert id then replica index), each to the
    least-loaded rank with a free slot that does not hold its expert yet. Returns (rank of each
    item, rank loads, holds[e, p])."""
    S = item_e.shape[0]
    order = np.argsort(-w, kind="mergesort")  # a stable sort of -w
    acc = np.zeros(ep)
    used = np.zeros(ep, dtype=np.int64)
    holds = np.zeros((E, ep), dtype=np.bool_)
    item_rank = np.empty(S, dtype=np.int64)
    for t in range(S):
        it = order[t]
        e = item_e[it]
        best = -1
        for p in range(ep):
            if used[p] < per_rank and not holds[e, p] and (best < 0 or acc[p] < acc[best]):
                best = p
        if best < 0:  # every rank with room holds e already: relax (cannot happen if cnt ≤ P)
            for p in range(ep):
                if used[p] < per_rank and (best < 0 or acc[p] < acc[best]):
                    best = p
        item_rank[it] = best
        acc[best] += w[it]
        used[best] += 1
        holds[e, best] = True
    return item_rank, acc, holds


@numba.njit(cache=True)
def _swap_off_busiest(item_e, w, item_rank, acc, holds, max_rounds):
    """While a swap of a replica on the busiest rank with a lighter one elsewhere lowers the
    larger of the two loads and keeps every expert's replicas on distinct ranks, make the best
    such swap (in place)."""
    S = item_e.shape[0]
    for _ in range(max_rounds):
        p = 0
        for q in range(1, acc.shape[0]):
            if acc[q] > acc[p]:
                p = q
        best_val = acc[p]
        ba = -1
        bb = -1
        for a in range(S):
            if item_rank[a] != p:
                continue
            ea = item_e[a]
            for b in range(S):
                q = item_rank[b]
                if q == p:
                    continue
                d = w[a] - w[b]
                if d <= 0:
                    continue
                eb = item_e[b]
                if ea != eb and (holds[ea, q] or holds[eb, p]):
                    continue
                v = max(acc[p] - d, acc[q] + d)
                if v < best_val:
                    best_val = v
                    ba = a
                    bb = b
        if ba < 0:
            break
        q = item_rank[bb]
        d = w[ba] - w[bb]
        acc[p] -= d
        acc[q] += d
        holds[item_e[ba], p] = False
        holds[item_e[bb], q] = False
        holds[item_e[ba], q] = True
        holds[item_e[bb], p] = True
        item_rank[ba] = q
        item_rank[bb] = p


@numba.njit(cache=True, parallel=True)
def _lpt_replicas(load_LE, cnt_LE, ep, per_rank, max_rounds, rank_LEK):
    """LPT with distinct ranks per expert, then swaps off the busiest rank (module docstring).
    Writes ``rank_LEK[l, e, j]``. Layers are independent and run in parallel."""
    L, E = load_LE.shape
    for l in numba.prange(L):
        item_e, item_j, w = _layer_replicas(load_LE[l], cnt_LE[l])
        item_rank, acc, holds = _lpt_distinct(item_e, w, E, ep, per_rank)
        _swap_off_busiest(item_e, w, item_rank, acc, holds, max_rounds)
        for t in range(item_e.shape[0]):
            rank_LEK[l, item_e[t], item_j[t]] = item_rank[t]
    return rank_LEK


def place_replicas(load_LE, logcnt_LE, ep: int, max_rounds: int = 10_000) -> Placement:
    """The :class:`Placement` of given replica counts: LPT on distinct ranks, then swaps."""
    load_LE = np.asarray(load_LE, dtype=np.float64)
    cnt = np.asarray(logcnt_LE, dtype=np.int64)
    L, E = cnt.shape
    S = int(cnt[0].sum())
    _check(load_LE, ep, S)
    if cnt.min() < 1 or cnt.max() > ep or (cnt.sum(axis=1) != S).any():
        raise InputError(f"replicas: counts must be 1..{ep} and sum to S={S} in every layer")
    K = int(cnt.max())
    rank_LEK = np.full((L, E, K), -1, dtype=np.int64)
    rank_LEK = _lpt_replicas(np.ascontiguousarray(load_LE), np.ascontiguousarray(cnt), int(ep), S // ep,
                             int(max_rounds), rank_LEK)
    return Placement.from_ranks(rank_LEK, cnt, ep, load_LE)


def replicated_placement(load_LE, ep: int, num_slots: int) -> Placement:
    """Replicate the hottest experts (:func:`replica_counts`), then place the replicas
    (:func:`place_replicas`). With ``num_slots = E`` this is LPT + swaps on experts."""
    load_LE = _check(load_LE, ep, num_slots)
    cnt = replica_counts(load_LE, num_slots, ep)
    return place_replicas(load_LE, cnt, ep)


def eplb_placement(load_LE, ep: int, num_slots: int) -> Placement:
    """DeepSeek EPLB's global policy, re-implemented (module docstring): ``replicate_experts``
    (the same greedy as :func:`replica_counts`, uncapped) and ``balanced_packing`` of the
    physical experts (weight ``load / logcnt``, decreasing, each to the lightest rank with a free
    slot, ties to the lower rank; replicas of one expert may share a rank)."""
    load_LE = _check(load_LE, ep, num_slots)
    L, E = load_LE.shape
    cnt = replica_counts(load_LE, num_slots, num_slots)
    M = num_slots // ep
    p2l = np.empty((L, num_slots), dtype=np.int64)
    for l in range(L):
        # EPLB's physical order: the E originals, then the replicas in the order they were added
        phy = list(range(E))
        c = np.ones(E, dtype=np.int64)
        for _ in range(num_slots - E):
            e = int(np.argmax(load_LE[l] / c))
            phy.append(e)
            c[e] += 1
        w = load_LE[l, phy] / cnt[l, phy]
        order = np.argsort(-w, kind="stable")
        acc = np.zeros(ep)
        used = np.zeros(ep, dtype=np.int64)
        for t in order.tolist():
            free = np.flatnonzero(used < M)
            p = int(free[np.argmin(acc[free])])
            p2l[l, p * M + used[p]] = phy[t]
            acc[p] += w[t]
            used[p] += 1
    return Placement(p2l, ep, E)

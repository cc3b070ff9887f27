"""Migration cost of changing the materialized expert placement (docs/pipeline.md, step 5).

Legend: L layers, E logical experts, P EP ranks, G shards.

**What moves.** The runtime copies an expert's weights *and* optimizer state into its new physical
slot whenever the expert's slot changes (``π_new[l,e] != π_cur[l,e]``), even when the new slot is
on the same rank (an intra-rank copy still rewrites the slot tensors). A placement whose only
change is *which slot inside the same rank* holds an expert costs nothing in step time, so before
materializing a new placement its slots should be aligned to the current one
(:func:`align_slots`): an expert whose rank does not change keeps its slot, and then slot changes
equal rank changes — the least number of moves for the new per-rank expert sets.

**Rank labels.** Per layer the cost model is symmetric in the P rank labels (only the per-rank
expert *sets* matter), so before aligning slots :func:`align_slots` also relabels the new ranks
to keep as many experts as possible where they are — a P×P assignment problem on the overlap
counts, solved exactly (Hungarian method, Kuhn 1955 / Munkres 1957). LPT placements of two
consecutive windows differ much less after this than their raw labels suggest.

**Bytes.** Each moved expert carries ``cost.expert_bytes`` (weights + optimizer state, derived
from the model preset). Expert weights are replicated across the G EDP shards, so every shard
moves its own copy: ``bytes_per_shard`` is what one EP group moves, ``bytes_total = G ·
bytes_per_shard`` is the cluster-wide traffic.

**Time.** All ranks of all shards copy at once over links of ``cost.migration_bandwidth``
bytes/µs, full duplex. Per layer a rank sends exactly as many experts as it receives (every rank
holds E/P experts before and after), so the time is set by the busiest rank:
``time_us = max_p (experts received by rank p, all layers) · expert_bytes / bandwidth``.
Intra-rank slot changes are counted as moves (bytes) but as rank traffic only if
``intra_rank_counts`` is set; after :func:`align_slots` there are none.
"""

from __future__ import annotations

import dataclasses

import numba
import numpy as np

from routepack_opt.core.cost import CostModel
from routepack_opt.core.errors import InputError
from routepack_opt.core.plan import check_placement
from routepack_opt.core.topology import Topology

__all__ = ["Migration", "migration_cost", "align_slots", "per_expert_time", "rank_traffic",
           "relabel_ranks"]


@dataclasses.dataclass(frozen=True)
class Migration:
    """Experts moved going from the current placement to a new one, and what it costs."""

    experts_moved: int  # Σ_l #{e : slot changes}
    moved_per_layer: np.ndarray  # [L]
    rank_changes: int  # Σ_l #{e : rank changes} (≤ experts_moved)
    max_rank_received: int  # busiest rank's experts received, all layers
    bytes_per_shard: float
    bytes_total: float  # G shards each move their own copy
    time_us: float

    def as_dict(self) -> dict:
        return {"experts_moved": self.experts_moved, "rank_changes": self.rank_changes,
                "max_rank_received": self.max_rank_received,
                "bytes_per_shard": self.bytes_per_shard, "bytes_total": self.bytes_total,
                "time_us": self.time_us, "moved_per_layer": self.moved_per_layer.tolist()}


def per_expert_time(cost: CostModel) -> float:
    """µs to move one expert's state over one rank's link (0 when the cost model has no
    migration figures, i.e. migration is free)."""
    if cost.expert_bytes <= 0 or cost.migration_bandwidth <= 0:
        return 0.0
    return cost.expert_bytes / cost.migration_bandwidth


def _check(placement, name: str, shape=None) -> np.ndarray:
    pl = np.asarray(placement, dtype=np.int64)
    errs = check_placement(pl)
    if errs:
        raise InputError(f"{name}: " + "; ".join(errs[:3]))
    if shape is not None and pl.shape != shape:
        raise InputError(f"{name}: shape {list(pl.shape)} does not match {list(shape)}")
    return pl


def rank_traffic(current_LE, new_LE, ep: int, intra_rank_counts: bool = False) -> np.ndarray:
    """``received_P[p]``: experts that rank p receives over all layers."""
    cur = np.asarray(current_LE, dtype=np.int64)
    new = np.asarray(new_LE, dtype=np.int64)
    per_rank = cur.shape[1] // ep
    rank_cur, rank_new = cur // per_rank, new // per_rank
    moved = rank_cur != rank_new
    if intra_rank_counts:
        moved |= cur != new
    return np.bincount(rank_new[moved], minlength=ep).astype(np.int64)


def migration_cost(current_LE, new_LE, topology: Topology, cost: CostModel,
                   intra_rank_counts: bool = False) -> Migration:
    """What materializing ``new_LE`` costs when ``current_LE`` is materialized (see module doc)."""
    cur = _check(current_LE, "current placement")
    new = _check(new_LE, "new placement", cur.shape)
    topology.check_experts(cur.shape[1])
    per_rank = cur.shape[1] // topology.ep
    moved_LE = cur != new
    moved_L = moved_LE.sum(axis=1).astype(np.int64)
    rank_changes = int(((cur // per_rank) != (new // per_rank)).sum())
    received = rank_traffic(cur, new, topology.ep, intra_rank_counts)
    max_recv = int(received.max(initial=0))
    n = int(moved_L.sum())
    per_shard = float(n * cost.expert_bytes)
    return Migration(experts_moved=n, moved_per_layer=moved_L, rank_changes=rank_changes,
                     max_rank_received=max_recv, bytes_per_shard=per_shard,
                     bytes_total=per_shard * topology.num_shards,
                     time_us=max_recv * per_expert_time(cost))


@numba.njit(cache=True)
def _hungarian_max(w_PP):
    """Permutation σ maximising Σ_i w[i, σ(i)] (Hungarian method, O(P³); potentials form)."""
    n = w_PP.shape[0]
    INF = 1e300
    u = np.zeros(n + 1)
    v = np.zeros(n + 1)
    match = np.zeros(n + 1, dtype=np.int64)  # match[j] = row matched to column j (1-based)
    way = np.zeros(n + 1, dtype=np.int64)
    for i in range(1, n + 1):
        match[0] = i
        j0 = 0
        minv = np.full(n + 1, INF)
        used = np.zeros(n + 1, dtype=np.bool_)
        while True:
            used[j0] = True
            i0 = match[j0]
            delta = INF
            j1 = 0
            for j in range(1, n + 1):
                if not used[j]:
                    cur = -w_PP[i0 - 1, j - 1] - u[i0] - v[j]
                    if cur < minv[j]:
                        minv[j] = cur
                        way[j] = j0
                    if minv[j] < delta:
                        delta = minv[j]
                        j1 = j
            for j in range(n + 1):
                if used[j]:
                    u[match[j]] += delta
                    v[j] -= delta
                else:
                    minv[j] -= delta
            j0 = j1
            if match[j0] == 0:
                break
        while True:
            j1 = way[j0]
            match[j0] = match[j1]
            j0 = j1
            if j0 == 0:
                break
    sigma = np.empty(n, dtype=np.int64)
    for j in range(1, n + 1):
        sigma[match[j] - 1] = j - 1
    return sigma


def relabel_ranks(new_LE, reference_LE, ep: int) -> np.ndarray:
    """``rank_LE`` of ``new_LE`` with each layer's rank labels permuted to maximise the experts
    that keep their ``reference_LE`` rank (exact assignment per layer)."""
    new = np.asarray(new_LE, dtype=np.int64)
    ref = np.asarray(reference_LE, dtype=np.int64)
    per_rank = new.shape[1] // ep
    rn, rr = new // per_rank, ref // per_rank
    out = np.empty_like(rn)
    for l in range(new.shape[0]):
        overlap = np.zeros((ep, ep))
        np.add.at(overlap, (rn[l], rr[l]), 1.0)
        sigma = _hungarian_max(overlap)  # new label i → reference label sigma[i]
        out[l] = sigma[rn[l]]
    return out


def align_slots(new_LE, reference_LE, ep: int, relabel: bool = True) -> np.ndarray:
    """An equivalent of ``new_LE`` (same per-rank expert *sets*; with ``relabel`` the rank labels
    permuted per layer to keep the most experts in place) whose slots agree with
    ``reference_LE`` wherever an expert stays on its rank, so slot changes = rank changes =
    the fewest moves for those sets. Movers take their new rank's free slots in ascending order."""
    new = np.asarray(new_LE, dtype=np.int64)
    ref = np.asarray(reference_LE, dtype=np.int64)
    if new.shape != ref.shape:
        raise InputError(f"align_slots: shapes {list(new.shape)} and {list(ref.shape)} differ")
    L, E = new.shape
    per_rank = E // ep
    ranks = relabel_ranks(new, ref, ep) if relabel else new // per_rank
    out = np.empty_like(new)
    for l in range(L):
        rank_new = ranks[l]
        stay = rank_new == ref[l] // per_rank
        out[l, stay] = ref[l, stay]
        used = np.zeros(E, dtype=bool)
        used[ref[l, stay]] = True
        for p in range(ep):
            movers = np.flatnonzero((rank_new == p) & ~stay)
            if movers.size:
                free = np.arange(p * per_rank, (p + 1) * per_rank)
                free = free[~used[free]]
                out[l, movers] = free[: movers.size]
    return out

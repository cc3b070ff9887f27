"""Expert placement heuristics (docs/pipeline.md, step 1) and load-balance metrics.

Legend: L MoE layers, E logical experts, P EP ranks, M = E / P expert slots per rank.

A placement ``placement_LE[l, e]`` is the physical slot (0..E-1) of logical expert e at layer l;
the rank of a slot is ``slot // M``. Slots inside a rank are interchangeable for the cost model, so
the heuristics fill a rank's slots in the order its experts are assigned.

LPT is Graham's (1969) longest-processing-time rule with a cardinality constraint: per layer,
experts by decreasing aggregate load, each to the least-loaded rank that still has a free slot
(each rank takes exactly M experts). Ties are broken deterministically: equal loads by the lower
expert id first, equal rank loads by the lower rank id.
"""

from __future__ import annotations

import numba
import numpy as np

from routepack_opt.core.errors import InputError
from routepack_opt.core.placement import as_placement
from routepack_opt.core.plan import placement_from_ranks

__all__ = ["identity_placement", "lpt_placement", "lpt_assign", "placement_ranks",
           "swap_refine", "rank_load_matrix", "rank_load_cv",
           "rank_peak_ratio"]


def identity_placement(num_layers: int, num_experts: int) -> np.ndarray:
    """``placement[l, e] = e`` (the framework default: expert e on rank e // M)."""
    if num_layers < 1 or num_experts < 1:
        raise InputError(f"placement: need ≥ 1 layer and ≥ 1 expert, got L={num_layers}, E={num_experts}")
    return np.tile(np.arange(num_experts, dtype=np.int64), (num_layers, 1))


@numba.njit(cache=True)
def _lpt_kernel(weight_BM, num_bins, per_bin):
    """Cardinality-constrained LPT for each row b: items by decreasing weight (stable), each to
    the least-loaded bin with fewer than ``per_bin`` items. Returns (bin_BM, pos_BM, load_BK)."""
    B, M = weight_BM.shape
    bin_BM = np.empty((B, M), dtype=np.int64)
    pos_BM = np.empty((B, M), dtype=np.int64)
    load_BK = np.zeros((B, num_bins), dtype=np.float64)
    fill = np.zeros(num_bins, dtype=np.int64)
    for b in range(B):
        # argsort of -w with kind="mergesort" is stable: equal weights keep ascending item ids.
        order = np.argsort(-weight_BM[b], kind="mergesort")
        fill[:] = 0
        for j in range(M):
            item = order[j]
            best = -1
            best_load = 0.0
            for k in range(num_bins):
                if fill[k] < per_bin and (best < 0 or load_BK[b, k] < best_load):
                    best = k
                    best_load = load_BK[b, k]
            bin_BM[b, item] = best
            pos_BM[b, item] = fill[best]
            fill[best] += 1
            load_BK[b, best] += weight_BM[b, item]
    return bin_BM, pos_BM, load_BK


def lpt_assign(weight_BM, num_bins: int, per_bin: int) -> tuple[np.ndarray, np.ndarray]:
    """Cardinality-constrained LPT (Graham 1969), batched over rows.

    For every row b, assigns its M = ``num_bins · per_bin`` items to ``num_bins`` bins of exactly
    ``per_bin`` items each, items by decreasing weight to the least-loaded bin with a free place.
    Returns ``bin_BM`` (bin of each item) and ``pos_BM`` (its place 0..per_bin-1 inside the bin,
    in assignment order).
    """
    w = np.asarray(weight_BM, dtype=np.float64)
    if w.ndim != 2:
        raise InputError(f"lpt: expected a 2-d weight array, got shape {w.shape}")
    if w.shape[1] != num_bins * per_bin:
        raise InputError(f"lpt: {w.shape[1]} items do not fill {num_bins} bins × {per_bin} places")
    bin_BM, pos_BM, _ = _lpt_kernel(np.ascontiguousarray(w), int(num_bins), int(per_bin))
    return bin_BM, pos_BM


def _check_loads(load_LE, ep: int) -> np.ndarray:
    load_LE = np.asarray(load_LE)
    if load_LE.ndim != 2:
        raise InputError(f"placement: loads must be [L, E], got shape {load_LE.shape}")
    if ep < 1 or load_LE.shape[1] % ep:
        raise InputError(f"placement: E={load_LE.shape[1]} experts is not divisible by ep={ep}")
    if (load_LE < 0).any():
        raise InputError("placement: expert loads must be ≥ 0")
    return load_LE


def lpt_placement(load_LE, ep: int) -> np.ndarray:
    """LPT placement per layer from aggregate loads ``load_LE[l, e] = Σ_i counts[i, l, e]``.

    Rank p's experts take slots ``p·M .. p·M + M - 1`` in the order they were assigned, so
    ``placement[l, e] // M`` is the rank LPT chose. Runs in about a millisecond at L=58, E=256.
    """
    load_LE = _check_loads(load_LE, ep)
    E = load_LE.shape[1]
    M = E // ep
    rank_LE, pos_LE = lpt_assign(load_LE, ep, M)
    return rank_LE * M + pos_LE


def placement_ranks(placement_LE, ep: int) -> np.ndarray:
    """``rank_LE[l, e]``: the EP rank that holds logical expert e at layer l."""
    placement_LE = np.asarray(placement_LE, dtype=np.int64)
    return placement_LE // (placement_LE.shape[1] // ep)


@numba.njit(cache=True, parallel=True)
def _swap_kernel(load_LE, rank_LE, ep, max_rounds):
    """Per layer: while some swap of an expert on the busiest rank with a lighter expert on
    another rank lowers the busiest rank without creating a new one at least as busy, make the
    best such swap (the one minimising the larger of the two new loads). Layers are independent
    (each reads and writes its own row), so they run in parallel with the same result."""
    L, E = load_LE.shape
    for l in numba.prange(L):
        acc = np.zeros(ep)
        for e in range(E):
            acc[rank_LE[l, e]] += load_LE[l, e]
        for _ in range(max_rounds):
            p = 0
            for q in range(1, ep):
                if acc[q] > acc[p]:
                    p = q
            best_val = acc[p]
            best_e = -1
            best_f = -1
            for e in range(E):
                if rank_LE[l, e] != p:
                    continue
                for f in range(E):
                    q = rank_LE[l, f]
                    if q == p:
                        continue
                    d = load_LE[l, e] - load_LE[l, f]
                    if d <= 0:
                        continue
                    v = max(acc[p] - d, acc[q] + d)
                    if v < best_val:
                        best_val = v
                        best_e = e
                        best_f = f
            if best_e < 0:
                break
            q = rank_LE[l, best_f]
            d = load_LE[l, best_e] - load_LE[l, best_f]
            acc[p] -= d
            acc[q] += d
            rank_LE[l, best_e] = q
            rank_LE[l, best_f] = p
    return rank_LE


def swap_refine(load_LE, placement_LE, ep: int, max_rounds: int = 10_000) -> np.ndarray:
    """Improve a placement by pairwise swaps off the busiest rank (a 2-exchange local search for
    multiway partitioning; keeps E/P experts per rank). Never raises any layer's busiest rank;
    deterministic. Used as the exact model's hint; LPT alone is the bare ``lpt-plain`` rule."""
    load_LE = _check_loads(load_LE, ep)
    rank_LE = placement_ranks(placement_LE, ep).copy()
    rank_LE = _swap_kernel(np.ascontiguousarray(load_LE, dtype=np.float64), rank_LE, int(ep), int(max_rounds))
    return placement_from_ranks(rank_LE, load_LE, ep)


def rank_load_matrix(load_LE, placement_LE, ep: int) -> np.ndarray:
    """``Lagg_LP[l, p]``: the window's tokens on rank p at layer l (float64; exact for integer
    loads below 2^53). ``placement_LE``: a :class:`~routepack_opt.core.placement.Placement` (or
    a permutation ``π[l, e]``); with replicas each expert's tokens split evenly over its copies
    (its surrogate rank matrix, 0/1 without replicas)."""
    load_LE = _check_loads(load_LE, ep)
    pl = as_placement(placement_LE, ep)
    if pl.ep != ep or (pl.num_layers, pl.num_experts) != load_LE.shape:
        raise InputError(f"placement: L={pl.num_layers}, E={pl.num_experts}, "
                         f"ep={pl.ep} does not match loads {load_LE.shape} and ep={ep}")
    return np.einsum("le,lep->lp", load_LE.astype(np.float64), pl.surrogate_rank_matrix())


def rank_load_cv(load_LE, placement_LE, ep: int, per_layer: bool = False) -> float:
    """Coefficient of variation (std / mean) of EP-rank loads.

    Default (``per_layer=False``, the "global EP-rank load CV"): one CV over all L·P
    (layer, rank) loads, each layer's loads taken relative to that layer's mean rank load, i.e.
    ``sqrt(mean_l CV_l²)`` (root-mean-square of per-layer CVs). For a real window every layer
    routes the same k·Σlen tokens, so this equals the plain CV over all ``Lagg[l, p]``; the
    normalisation only keeps layers with different totals from counting as imbalance.
    ``per_layer=True`` returns the plain mean of the per-layer CVs instead. Zero load gives 0.
    """
    Lagg_LP = rank_load_matrix(load_LE, placement_LE, ep)
    mean_L = Lagg_LP.mean(axis=1)
    std_L = Lagg_LP.std(axis=1)
    cv_L = np.divide(std_L, mean_L, out=np.zeros_like(std_L), where=mean_L > 0)
    if per_layer:
        return float(cv_L.mean())
    return float(np.sqrt((cv_L ** 2).mean()))


def rank_peak_ratio(load_LE, placement_LE, ep: int, per_layer: bool = False) -> float:
    """Busiest-rank inflation of the expert tail: ``Σ_l max_p Lagg[l,p] / Σ_l mean_p Lagg[l,p]``.

    This is the factor by which the placement's expert term of the docs/model.md lower bound exceeds a
    perfectly balanced one (1.0 = perfect). ``per_layer=True`` returns the mean over layers of
    ``max_p / mean_p`` instead. Zero load gives 1.
    """
    Lagg_LP = rank_load_matrix(load_LE, placement_LE, ep)
    if per_layer:
        mean_L = Lagg_LP.mean(axis=1)
        r_L = np.divide(Lagg_LP.max(axis=1), mean_L, out=np.ones_like(mean_L), where=mean_L > 0)
        return float(r_L.mean())
    den = Lagg_LP.mean(axis=1).sum()
    return float(Lagg_LP.max(axis=1).sum() / den) if den > 0 else 1.0

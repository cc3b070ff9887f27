"""Lower bounds, shared by the heuristics, the exact models and the certifier.

Bin packing (docs/pipeline.md, step 2: R rows exist iff the lengths fit in R·D bins of capacity
C). Legend: ``sizes_N`` item sizes (ints, 1 ≤ s ≤ C), ``bin_N`` the bin of each item (0..B-1).
All exact integer arithmetic, O(N log N):

- :func:`lower_bound_l1` — ⌈Σ s / C⌉;
- :func:`lower_bound_l2` — Martello & Toth (1990), *Knapsack Problems*, §8.3.1, bound L2;
- :func:`lower_bound_dff` — dual feasible functions of Fekete & Schepers (2001), "New classes
  of fast lower bounds for bin packing problems", Math. Programming 91:11–31 (u^(k)), applied to
  the sizes and composed with the large-item threshold of L2;
- :func:`bin_lower_bound` — the best of them;
- :func:`dual_bound` — the bound of any nonnegative integer dual vector of the Gilmore–Gomory
  LP, made feasible by scaling: ⌈Σ b_j u_j / U⌉ with U the exact (integer) knapsack maximum of
  the duals over the bin patterns (:func:`knapsack_max`). The column-generation bound
  (:mod:`routepack_opt.models.colgen`) is certified through it, in integer arithmetic only;
- with them, the checks every packing code shares: :func:`check_sizes` (the input) and
  :func:`is_packing` (an independent check of a returned packing).

Layouts (docs/model.md; N samples, L layers, E experts, P EP ranks, G shards, R rows):

- :func:`layout_lower_bound` — for a given placement and R, valid for both objectives;
- :func:`attention_lower_bound` — its attention term: the blocks' largest cells, for any layout;
- :func:`placement_free_lower_bound` — the same for any placement (with or without replicas);
- :func:`force_balanced_lower_bound` — every rank gets 1/P of every layer's expert tokens in
  every row: valid for any placement and any number of replicas;
- :func:`layer_lower_bound` — the busiest rank of one layer's placement (average and pigeonhole).
"""

from __future__ import annotations

import numpy as np

from routepack_opt.core.checks import MAX_CAPACITY, check_int, int_array
from routepack_opt.core.cost import CostModel
from routepack_opt.core.errors import InputError
from routepack_opt.core.topology import Topology

__all__ = ["check_sizes", "is_packing", "lower_bound_l1", "lower_bound_l2", "lower_bound_dff",
           "bin_lower_bound", "knapsack_max", "knapsack_top", "dual_bound",
           "layout_lower_bound", "attention_lower_bound", "placement_free_lower_bound",
           "layer_lower_bound", "force_balanced_lower_bound"]


# ---------------------------------------------------------------- bin packing


def check_sizes(sizes, capacity) -> tuple[np.ndarray, int]:
    """Validate ``sizes`` (1-D positive ints) and ``capacity`` (positive int); return int64 copies.

    An item larger than the capacity is an :class:`InputError` naming the items.
    """
    # exact integers (a NaN or 2⁶⁴ size is refused, never cast into −2⁶³ or wrapped)
    sizes_N = int_array(sizes, "sizes", ndim=1).copy()
    capacity = check_int(capacity, "capacity", 1, MAX_CAPACITY)
    bad = np.flatnonzero(sizes_N < 1)
    if bad.size:
        raise InputError(f"sizes: items {bad[:5].tolist()} have non-positive sizes {sizes_N[bad[:5]].tolist()}")
    big = np.flatnonzero(sizes_N > capacity)
    if big.size:
        more = f" (and {big.size - 5} more)" if big.size > 5 else ""
        raise InputError(
            f"items {big[:5].tolist()}{more} have sizes {sizes_N[big[:5]].tolist()} larger than "
            f"the capacity {capacity}: they fit in no bin"
        )
    return sizes_N, capacity


def lower_bound_l1(sizes, capacity) -> int:
    """L1 = ⌈Σ s / C⌉ (the continuous bound)."""
    sizes_N, C = check_sizes(sizes, capacity)
    return int(-(-int(sizes_N.sum()) // C))


def _l2_sorted(s_asc: np.ndarray, C: int) -> int:
    """Martello–Toth L2 on ascending sizes (see :func:`lower_bound_l2`)."""
    n = s_asc.size
    if n == 0:
        return 0
    prefix = np.concatenate([[0], np.cumsum(s_asc)])  # prefix[i] = Σ of the i smallest
    # Candidate thresholds K: 0 and every distinct size ≤ C/2 (L(K) only changes there).
    small = s_asc[2 * s_asc <= C]  # ascending: its distinct values without a hash (np.unique)
    first = np.ones(small.size, dtype=bool)
    first[1:] = small[1:] != small[:-1]
    K = np.concatenate([[0], small[first]]).astype(np.int64)
    half = np.searchsorted(s_asc, C // 2, side="right")     # items with s ≤ ⌊C/2⌋ ⇔ 2s ≤ C
    lo3 = np.searchsorted(s_asc, K, side="left")             # first item with s ≥ K
    hi2 = np.searchsorted(s_asc, C - K, side="right")        # items with s ≤ C-K
    n1 = n - hi2                                             # J1: s > C-K
    n2 = hi2 - half                                          # J2: C/2 < s ≤ C-K
    sum2 = prefix[hi2] - prefix[half]
    sum3 = prefix[half] - prefix[lo3]                        # J3: K ≤ s ≤ C/2
    spill = sum3 - (n2 * C - sum2)                           # J3 volume not absorbed by J2 bins
    extra = np.where(spill > 0, -(-spill // C), 0)
    return int((n1 + n2 + extra).max())


def lower_bound_l2(sizes, capacity) -> int:
    """Martello & Toth (1990) bound L2 = max over K ∈ [0, C/2] of

    |J1| + |J2| + max(0, ⌈(Σ J3 − (|J2|·C − Σ J2)) / C⌉),
    J1 = {s > C−K}, J2 = {C/2 < s ≤ C−K}, J3 = {K ≤ s ≤ C/2}.

    Vectorised over the distinct candidate K; O(N log N).
    """
    sizes_N, C = check_sizes(sizes, capacity)
    return _l2_sorted(np.sort(sizes_N), C)


def _dff_fs(s: np.ndarray, C: int, k: int) -> tuple[np.ndarray, int]:
    """Fekete–Schepers u^(k) scaled to integers: returns (u·C·k per item, C·k)."""
    q = (k + 1) * s
    exact = q % C == 0
    return np.where(exact, s * k, (q // C) * C), C * k


def lower_bound_dff(sizes, capacity, max_k: int = 20, thresholds: int = 64) -> int:
    """Bound from dual feasible functions (Fekete & Schepers 2001).

    For each k ≤ ``max_k``: ⌈Σ u^(k)(s/C)⌉ with u^(k)(x) = x if (k+1)x ∈ ℤ else ⌊(k+1)x⌋/k;
    composed with the L2 threshold map U^ε (items > C−ε count as full bins, items < ε vanish)
    for ε ∈ the distinct sizes ≤ C/2, at most ``thresholds`` of them (0: the bound is 0). Exact
    integer arithmetic; O(thresholds · max_k · N).
    """
    sizes_N, C = check_sizes(sizes, capacity)
    if sizes_N.size == 0 or thresholds < 1:
        return 0
    s = np.sort(sizes_N)
    best = 0
    eps_list = np.unique(np.concatenate([[0], s[2 * s <= C]]))
    if eps_list.size > thresholds:  # thin the thresholds: bound stays valid, cost stays O(thresholds·k·N)
        eps_list = eps_list[np.linspace(0, eps_list.size - 1, thresholds).astype(np.int64)]
    for eps in eps_list.tolist():
        # U^ε: x > C-ε → C; ε ≤ x ≤ C-ε → x; x < ε → 0.
        t = np.where(s > C - eps, C, np.where(s < eps, 0, s))
        t = t[t > 0]
        if t.size == 0:
            continue
        for k in range(1, max_k + 1):
            u, denom = _dff_fs(t, C, k)
            best = max(best, int(-(-int(u.sum()) // denom)))
    return best


def bin_lower_bound(sizes, capacity, thresholds: int = 64) -> tuple[int, str]:
    """The best of L1, L2 and the DFF bound (over at most ``thresholds`` thresholds), with its
    name (``"L1"``, ``"L2"``, ``"DFF"``)."""
    sizes_N, C = check_sizes(sizes, capacity)
    l1 = lower_bound_l1(sizes_N, C)
    l2 = _l2_sorted(np.sort(sizes_N), C)
    best, name = (l1, "L1") if l1 >= l2 else (l2, "L2")
    dff = lower_bound_dff(sizes_N, C, thresholds=thresholds)
    if dff > best:
        best, name = dff, "DFF"
    return best, name


def knapsack_max(w_M, b_M, v_M, capacity, min_load: int = 0) -> tuple[int, np.ndarray]:
    """The most a bin can hold in value: max Σ v_j a_j over patterns 0 ≤ a_j ≤ b_j with
    ``min_load`` ≤ Σ w_j a_j ≤ ``capacity`` (integer values v ≥ 0, exact). Returns (value, a_M),
    (−1, zeros) when no pattern loads ``min_load``. O(C·Σ log b_j)."""
    w_M = np.ascontiguousarray(w_M, dtype=np.int64)
    b_M = np.ascontiguousarray(b_M, dtype=np.int64)
    v_M = np.ascontiguousarray(v_M, dtype=np.int64)
    if not (w_M.shape == b_M.shape == v_M.shape) or w_M.ndim != 1:
        raise InputError("knapsack_max: w, b and v must be 1-D arrays of one length")
    if v_M.size and int(v_M.min()) < 0:
        raise InputError("knapsack_max: values must be nonnegative")
    from routepack_opt.core._knapsack import _knapsack_dp, _knapsack_pareto  # numba: not at import

    C = int(capacity)
    if C > 4096 and min_load <= 0:  # the sparse DP first: few states where few items fill a bin
        best, a_TM, _, finished = _knapsack_pareto(w_M, b_M, v_M, C, 4 * C, 1)
        if finished:
            return int(best), a_TM[0]
    best, a_M = _knapsack_dp(w_M, b_M, v_M, C, int(min_load))
    return int(best), a_M


def knapsack_top(w_M, b_M, v_M, capacity, top: int) -> tuple[np.ndarray, np.ndarray]:
    """Up to ``top`` patterns of the bounded knapsack, the optimum first, then the most valuable
    other states of the Pareto list (for column generation, several columns per pricing).
    Returns (v_T, a_TM); exact in its first row."""
    w_M = np.ascontiguousarray(w_M, dtype=np.int64)
    b_M = np.ascontiguousarray(b_M, dtype=np.int64)
    v_M = np.ascontiguousarray(v_M, dtype=np.int64)
    from routepack_opt.core._knapsack import _knapsack_dp, _knapsack_pareto  # numba: not at import

    C = int(capacity)
    _, a_TM, v_T, finished = _knapsack_pareto(w_M, b_M, v_M, C, 4 * C + 1024, int(top))
    if finished:
        return v_T, a_TM
    best, a_M = _knapsack_dp(w_M, b_M, v_M, C, 0)
    return np.array([best], dtype=np.int64), a_M[None, :]


def dual_bound(sizes, capacity, w_M, u_M, max_bins: int | None = None) -> tuple[int, int, int]:
    """The Gilmore–Gomory bound of integer duals ``u_M`` ≥ 0 on the distinct sizes ``w_M``.

    With U the knapsack maximum of u over the bin patterns (at most b_j copies of size w_j,
    b_j their count in ``sizes``), u/U is a feasible dual of the pattern LP min Σ x_p,
    Σ_p a_jp x_p ≥ b_j, x ≥ 0, so every packing needs ≥ Σ_j b_j u_j / U bins. All integer
    arithmetic. Returns (⌈Σ b u / U⌉, Σ b u, U); (0, 0, 0) when u is all zero.

    With ``max_bins`` = K the question is only whether K bins suffice: in a packing into K bins
    no bin wastes more than the total slack K·C − Σ s, so only patterns loading at least
    Σ s − (K−1)·C count in U. A result > K then proves K bins impossible (a result ≤ K says
    nothing more than that)."""
    sizes_N, C = check_sizes(sizes, capacity)
    w_M = np.asarray(w_M, dtype=np.int64)
    u_M = np.asarray(u_M, dtype=np.int64)
    if w_M.shape != u_M.shape or (u_M.size and int(u_M.min()) < 0):
        raise InputError("dual_bound: one nonnegative integer dual per distinct size")
    vals, counts = np.unique(sizes_N, return_counts=True)
    b_M = np.zeros(w_M.size, dtype=np.int64)
    pos = np.searchsorted(vals, w_M)
    hit = (pos < vals.size) & (vals[np.minimum(pos, vals.size - 1)] == w_M)
    b_M[hit] = counts[pos[hit]]
    min_load = 0 if max_bins is None else int(sizes_N.sum()) - (int(max_bins) - 1) * C
    U, _ = knapsack_max(w_M, b_M, u_M, C, min_load)
    if U < 0:  # no bin can load that much: K bins are impossible (unless there is nothing to pack)
        return (int(max_bins) + 1, 0, 0) if sizes_N.size else (0, 0, 0)
    num = sum(int(b) * int(u) for b, u in zip(b_M.tolist(), u_M.tolist()))  # Python ints: no overflow
    if U <= 0:
        return 0, 0, 0
    return -(-num // U), num, U


def is_packing(sizes, capacity, bin_N, num_bins: int | None = None) -> bool:
    """Independent check: every item in one bin id in [0, num_bins), no bin over capacity."""
    sizes_N = np.asarray(sizes, dtype=np.int64)
    bin_N = np.asarray(bin_N)
    if bin_N.shape != sizes_N.shape or (bin_N.size and bin_N.min() < 0):
        return False
    if num_bins is not None and bin_N.size and bin_N.max() >= num_bins:
        return False
    if bin_N.size == 0:
        return True
    loads = np.zeros(int(bin_N.max()) + 1, dtype=np.int64)
    np.add.at(loads, bin_N.astype(np.int64), sizes_N)
    return bool(np.all(loads <= capacity))


# ---------------------------------------------------------------- layouts


def layout_lower_bound(lengths_N, Lagg_LP, rows: int, topology: Topology, cost: CostModel, *,
                       attention: float | None = None) -> float:
    """docs/model.md bound for a given placement and R (valid for both objectives):
    (attention_lower_bound + γ Σ_l max_p Lagg[l,p] + R·G·row_overhead) / G. ``attention``: that
    first term when the caller already has it (it does not depend on R or the placement; at
    N = 10^6 it is a sort of the lengths, tens of milliseconds per call)."""
    G = topology.num_shards
    expert = cost.gamma * float(np.asarray(Lagg_LP, dtype=np.float64).max(axis=1).sum())
    if attention is None:
        attention = attention_lower_bound(lengths_N, topology, cost)
    return float((attention + expert + rows * G * cost.row_overhead) / G)


def attention_lower_bound(lengths_N, topology: Topology, cost: CostModel) -> float:
    """A lower bound on Σ over the (row, shard) blocks of the attention term Σ_s max_{d∈g} a_s(cell),
    a_s(cell) = α_s·T + β_s·Q (the cell's Σ length and Σ length²), for any layout: per stage the
    larger of

    - the mean, A_s / P (A_s = Σ_i a_s(l_i)): a block's largest cell is at least its P cells' mean;
    - a_s(l_max) + max(0, A_s − K_s) / P: the block holding the longest sample pays at least that
      sample's cost, every other block at least its mean, and no block holds more than K_s, the
      most stage-s cost P cells of C tokens can take (the longest samples first, the last one in
      part: a_s(l)/l = α_s + β_s·l grows with l, so that is the fractional knapsack's optimum).

    The second term matters on wide blocks with long samples: a DeepSeek-V3 window of N = 512 on
    D = P = 64 (R* = 3, 9 samples of 8,192 tokens) has it 7.6 % above the mean."""
    lengths_N = np.sort(np.asarray(lengths_N, dtype=np.float64))[::-1]
    P, C = topology.ep, float(topology.capacity)
    cum = np.cumsum(lengths_N)
    k = int(np.searchsorted(cum, P * C, side="right"))  # the longest k samples fit in one block
    total = 0.0
    for s in cost.stages:
        a_N = s.alpha * lengths_N + s.beta * lengths_N ** 2
        A = float(a_N.sum())
        if a_N.size == 0:
            continue
        K = float(a_N[:k].sum())
        if k < a_N.size:  # the next sample, in part
            K += (P * C - (float(cum[k - 1]) if k else 0.0)) / lengths_N[k] * float(a_N[k])
        total += max(A / P, float(a_N[0]) + max(0.0, A - K) / P)
    return total


def placement_free_lower_bound(lengths_N, load_LE, rows: int, topology: Topology, cost: CostModel,
                               redundant: int = 0, *, attention: float | None = None) -> float:
    """The bound for any placement with ``redundant`` extra slots per layer:
    max_p Lagg[l,p] ≥ max(Σ_e load[l,e] / P, max_e load[l,e] / min(P, 1 + redundant)).

    An expert has k ≤ 1 + redundant replicas; they split its tokens, so one of them gets at least
    load/k; if k > P, some rank holds ≥ k/P of them and gets ≥ load/P. Without replicas (k = 1)
    this is the busiest expert itself."""
    load_LE = np.asarray(load_LE, dtype=np.float64)
    k = min(topology.ep, 1 + int(redundant))
    best_LP = np.maximum(load_LE.sum(axis=1) / topology.ep, load_LE.max(axis=1) / k)[:, None]
    return layout_lower_bound(lengths_N, best_LP, rows, topology, cost, attention=attention)


def force_balanced_lower_bound(lengths_N, load_LE, rows: int, topology: Topology, cost: CostModel, *,
                               attention: float | None = None) -> float:
    """The bound with every rank given 1/P of every layer's expert tokens (max_p Lagg[l,p] ≥
    Σ_e load[l,e] / P): valid for any placement and any replicas, and what perfect
    force-balancing would reach."""
    load_LE = np.asarray(load_LE, dtype=np.float64)
    return layout_lower_bound(lengths_N, (load_LE.sum(axis=1) / topology.ep)[:, None], rows, topology, cost,
                              attention=attention)


def layer_lower_bound(load_E, ep: int) -> int:
    """A lower bound on the busiest rank's load of any placement of one layer.

    With loads a_0 ≥ a_1 ≥ … and M = E/P places per rank:
    - average: ⌈Σ a / P⌉;
    - cardinality/pigeonhole, for k = 0..M-1: among the kP+1 heaviest experts some rank holds
      k+1, weighing at least the k+1 lightest of them, a_{kP-k} + … + a_{kP}; its other M-k-1
      experts weigh at least the M-k-1 lightest of all.
    """
    a = np.sort(np.asarray(load_E, dtype=np.int64))[::-1]
    E = a.size
    M = E // ep
    best = -(-int(a.sum()) // ep)
    tail = np.concatenate([[0], np.cumsum(a[::-1])])  # tail[m] = sum of the m lightest
    for k in range(M):
        top = int(a[k * ep - k: k * ep + 1].sum())
        best = max(best, top + int(tail[M - k - 1]))
    return best

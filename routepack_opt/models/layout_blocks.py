"""Block decomposition of the exact layout problem (docs/pipeline.md, step 4): exact cover by (row, shard)
blocks, with reduced-cost filtering from the set-partitioning LP, for windows small enough to
enumerate every block (P ≤ 2).

Legend: N samples, L layers, P EP ranks (= cells per block), D DP slots, G shards, R rows,
S stages; a *block* is the set of samples of one (row, shard) pair, split into its P cells.

Why. ``J[r,g]`` depends only on the samples of block (r, g) and on how they are split into the
block's P cells (docs/model.md). So a layout is: R·G disjoint blocks covering the samples, each at its
cheapest split, arranged into rows × shards. The cell-level models (CP-SAT, HiGHS) relax the
stage and rank maxima to averages and stall a fraction of a percent above their bound; here
every block cost is exact, and the search runs over whole blocks.

Method (exact; every step keeps every layout that could beat the incumbent):
1. Enumerate every feasible block B (numba): ``P ≤ |B| ≤ N − (R·G−1)·P``, tokens within
   ``[Σlen − (R·G−1)·P·C, P·C]``, and a split into P nonempty cells of ≤ C tokens. Its cost
   ``c(B) = min over splits Σ_s max_cell (α_s T + β_s Q) + γ Σ_l max_p W_B[l,p]`` (P = 1: the
   block is one cell; P = 2: every split is tried). Row overheads are a constant (R·overhead).
2. LP relaxation ``min Σ c_B λ_B`` s.t. every sample covered once, ``Σ λ_B = R·G``, solved by
   HiGHS with column generation over the enumerated blocks (:mod:`.layout_blocks_lp`); duals π, μ.
3. For *any* π, μ and any layout, ``Σ_blocks c_B = dual + Σ_blocks rc_B`` with
   ``dual = Σ_i π_i + μ·R·G`` and ``rc_B = c_B − Σ_{i∈B} π_i − μ``. Both objectives' makespans
   are at least ``Σ c_B / G`` (a max, or a sum of maxima, over G shards), so a layout of
   makespan ≤ T has ``Σ rc ≤ G·T − dual``; the LP bound is ``(dual + R·G·min(0, min rc)) / G``.
4. For a target T: keep the blocks with ``c_B ≤ T`` and ``rc_B ≤ G·T − dual − (R·G−1)·min rc``
   and enumerate every exact cover of the samples by R·G kept blocks with ``Σ rc ≤ G·T − dual``
   (depth-first, the sample with fewest candidates first, candidates by increasing rc so the
   rc test cuts a whole tail; the last block is looked up, not searched). Each cover is valued
   at its best arrangement: ``G = 1``: Σ c (both objectives); ``sum-max`` or ``R = 1``: costs
   sorted descending, G per row (optimal for a sum of row maxima); ``max-sum``: the min-max
   grouping into G shards of R blocks. The best cover ≤ T, if any, is the optimum; if none,
   T is a proved lower bound.
5. Targets climb from the LP bound to the incumbent UB (an eighth of the gap, then doubling),
   so the first searches keep few blocks; the last target is UB itself (the warm start).
The reported objective is always the evaluator's score of the returned layout.

Sources: the set-partitioning LP over enumerated columns is the Dantzig–Wolfe / Gilmore–Gomory
master (column generation); enumerating every column whose reduced cost is below the gap
between an upper bound and the dual bound, then solving over those columns only, is the exact
scheme of Baldacci, Christofides & Mingozzi (2008, set-partitioning VRP).
"""

from __future__ import annotations

import itertools
import math
import time
from collections import namedtuple

import numba as nb
import numpy as np

from routepack_opt.core.objective import Objective
from routepack_opt.models.layout_blocks_lp import block_members, set_partitioning_duals
from routepack_opt.models.layout_common import LayoutInstance, prefeasibility

__all__ = ["solve_blocks", "enumerate_blocks", "block_bounds", "applicable", "BlockSet"]

# Enumeration limits: blocks kept, and work (subsets visited + splits tried) per second of the
# time granted, before giving up.
MAX_BLOCKS = 4_000_000
WORK_PER_SECOND = 50_000_000
# Candidates scanned per second of time limit granted to the exact cover search.
NODES_PER_SECOND = 20_000_000


@nb.njit(cache=True, inline="always")
def _one_cell_cost(A_S, t, C):
    """P = 1: the block is one cell; its attention cost Σ_s A[s], or inf over the cap."""
    best = np.inf
    if t <= C:
        best = 0.0
        for s in range(A_S.shape[0]):
            best += A_S[s]
    return best


@nb.njit(cache=True, inline="always")
def _two_cell_split(items, k, t, lengths, coef_SN, A_S, C, a_cell):
    """P = 2: the cheapest split of items[0..k-1] into two nonempty cells of ≤ C tokens, item 0
    in cell 0, every subset of the others with it (Gray code order). Returns (cost, bits over
    items[1..k-1] in cell 0); cost inf when no split fits."""
    S = A_S.shape[0]
    best = np.inf
    best_split = 0
    t0 = lengths[items[0]]
    for s in range(S):
        a_cell[s] = coef_SN[s, items[0]]
    sub = 0  # bits over items[1..k-1] that are in cell 0
    ncomb = 1 << (k - 1)
    for step in range(ncomb):
        if step > 0:
            j = 0
            g = step
            while (g & 1) == 0:
                g >>= 1
                j += 1
            it = items[j + 1]
            if (sub >> j) & 1:
                sub &= ~(1 << j)
                t0 -= lengths[it]
                for s in range(S):
                    a_cell[s] -= coef_SN[s, it]
            else:
                sub |= 1 << j
                t0 += lengths[it]
                for s in range(S):
                    a_cell[s] += coef_SN[s, it]
        if sub == ncomb - 1:  # cell 1 empty
            continue
        if t0 > C or t - t0 > C:
            continue
        v = 0.0
        for s in range(S):
            o = A_S[s] - a_cell[s]
            v += a_cell[s] if a_cell[s] >= o else o
        if v < best:
            best = v
            best_split = sub
    return best, best_split


@nb.njit(cache=True, inline="always")
def _expert_peaks(W_LP):
    """Σ_l max_p W[l, p]: the block's expert tokens at its busiest rank, summed over layers."""
    ex = 0
    for l in range(W_LP.shape[0]):
        m = 0
        for p in range(W_LP.shape[1]):
            if W_LP[l, p] > m:
                m = W_LP[l, p]
        ex += m
    return ex


@nb.njit(cache=True, inline="always")
def _block_masks(items, k, best_split):
    """(bitmask of the block's samples, bitmask of its cell 0) from the split's bits."""
    mask = 0
    cell0 = 1 << items[0]
    for j in range(k):
        mask |= 1 << items[j]
        if j >= 1 and (best_split >> (j - 1)) & 1:
            cell0 |= 1 << items[j]
    return mask, cell0


@nb.njit(cache=True, inline="always")
def _push_sample(i, depth, b_NLP, coef_SN, W, A):
    """Depth d+1's running expert loads and stage sums: depth d's plus sample i's."""
    d1 = depth + 1
    for l in range(W.shape[1]):
        for p in range(W.shape[2]):
            W[d1, l, p] = W[depth, l, p] + b_NLP[i, l, p]
    for s in range(A.shape[1]):
        A[d1, s] = A[depth, s] + coef_SN[s, i]


@nb.njit(cache=True)
def _enumerate(lengths, coef_SN, b_NLP, gamma, C, P, lo, hi, kmax, max_blocks, max_nodes):
    """DFS over subsets in index order. Returns (count, masks, costs, split masks, nodes);
    count = -1 when a limit was hit."""
    N = lengths.shape[0]
    S = coef_SN.shape[0]
    L = b_NLP.shape[1]
    masks = np.empty(max_blocks, dtype=np.int64)
    costs = np.empty(max_blocks, dtype=np.float64)
    splits = np.empty(max_blocks, dtype=np.int64)
    # per-depth state
    items = np.empty(N + 1, dtype=np.int64)
    tok = np.zeros(N + 1, dtype=np.int64)
    W = np.zeros((N + 1, L, P), dtype=np.int64)
    A = np.zeros((N + 1, S), dtype=np.float64)
    nxt = np.empty(N + 1, dtype=np.int64)
    cnt = 0
    nodes = 0
    depth = 0
    nxt[0] = 0
    a_cell = np.empty(S, dtype=np.float64)
    while depth >= 0:
        i = nxt[depth]
        if i >= N or depth >= kmax:
            depth -= 1
            continue
        nxt[depth] = i + 1
        t = tok[depth] + lengths[i]
        if t > hi:
            continue
        nodes += 1
        if nodes > max_nodes:
            return -1, masks, costs, splits, nodes
        items[depth] = i
        tok[depth + 1] = t
        _push_sample(i, depth, b_NLP, coef_SN, W, A)
        depth += 1
        nxt[depth] = i + 1
        k = depth
        if k < P or t < lo:
            continue
        # a candidate block: items[0..k-1]
        best_split = 0
        if P == 1:
            best = _one_cell_cost(A[k], t, C)
        else:  # P == 2: every split is tried
            nodes += 1 << (k - 1)
            if nodes > max_nodes:
                return -1, masks, costs, splits, nodes
            best, best_split = _two_cell_split(items, k, t, lengths, coef_SN, A[k], C, a_cell)
        if best == np.inf:
            continue
        ex = _expert_peaks(W[k])
        mask, cell0 = _block_masks(items, k, best_split)
        if cnt >= max_blocks:
            return -1, masks, costs, splits, nodes
        masks[cnt] = mask
        costs[cnt] = best + gamma * ex
        splits[cnt] = cell0 if P == 2 else mask
        cnt += 1
    return cnt, masks, costs, splits, nodes


class BlockSet:
    """Every feasible block of an instance: bitmasks, exact costs (µs, without row overhead)
    and the cheapest split (bitmask of cell 0)."""

    def __init__(self, masks, costs, splits, nodes, seconds):
        self.masks, self.costs, self.splits = masks, costs, splits
        self.nodes, self.seconds = nodes, seconds

    def __len__(self):
        return self.masks.size


def applicable(inst: LayoutInstance) -> bool:
    """The decomposition handles P ≤ 2 and N ≤ 30 (bitmask blocks), and for max-sum with R, G > 1
    at most 12 blocks (each cover's min-max grouping into shards is searched exhaustively);
    never with ``equal_samples_per_slot``."""
    small = _kind(inst) != "shard" or inst.rows * inst.topology.num_shards <= 12
    # Blocks are (row, shard) cell sets chosen independently of slot totals: the decomposition
    # cannot express equal samples per slot, so it is skipped then (CP-SAT/HiGHS model it).
    return (not inst.topology.equal_samples_per_slot and inst.topology.ep <= 2 and inst.num_samples <= 30
            and small and prefeasibility(inst) is None)


def block_bounds(inst: LayoutInstance) -> tuple[int, int, int]:
    """(least tokens, most tokens, most samples) of one block in any feasible layout."""
    topo = inst.topology
    N, R, G, P, C = inst.num_samples, inst.rows, topo.num_shards, topo.ep, topo.capacity
    total = int(inst.window.lengths.sum())
    others = R * G - 1
    return max(0, total - others * P * C), P * C, N - others * P


def enumerate_blocks(inst: LayoutInstance, time_limit: float = 60.0, max_blocks: int = MAX_BLOCKS
                     ) -> BlockSet | None:
    """All feasible blocks, or None when the enumeration exceeds its limits (``max_blocks``
    blocks, or ``WORK_PER_SECOND · time_limit`` subsets and splits)."""
    max_nodes = int(WORK_PER_SECOND * time_limit) + 1000
    t0 = time.perf_counter()
    lo, hi, kmax = block_bounds(inst)
    P = inst.topology.ep
    cnt, masks, costs, splits, nodes = _enumerate(
        inst.window.lengths.astype(np.int64), np.ascontiguousarray(inst.coef_SN, dtype=np.float64),
        np.ascontiguousarray(inst.b_NLP, dtype=np.int64), float(inst.cost.gamma),
        int(inst.topology.capacity), int(P), int(lo), int(hi), int(kmax), int(max_blocks), int(max_nodes))
    if cnt < 0:
        return None
    return BlockSet(masks[:cnt].copy(), costs[:cnt].copy(), splits[:cnt].copy(), int(nodes),
                    time.perf_counter() - t0)


# --------------------------------------------------------------------------------------------
# Targets, and the exact cover search over the kept blocks
# --------------------------------------------------------------------------------------------


def solve_blocks(inst: LayoutInstance, time_limit: float, start, blocks: BlockSet | None = None):
    """The block decomposition (module docstring). ``start``: a feasible layout (row_N, slot_N),
    the first upper bound UB. Targets T between the LP bound and UB are tried in turn (step 5 of
    the module docstring). Returns a dict: ``layout`` (the best layout found, or None),
    ``status`` ("optimal" when the optimum — the returned layout or ``start`` — is proved,
    "unknown" otherwise), ``bound`` (µs, valid for every layout), ``info``."""
    t0 = time.perf_counter()
    t_end = t0 + time_limit
    if blocks is None:
        blocks = enumerate_blocks(inst, 0.5 * time_limit)
    info = {"blocks": None if blocks is None else len(blocks)}
    if blocks is None or len(blocks) == 0:
        return {"status": "unknown", "layout": None, "bound": -math.inf, "info": info}
    topo = inst.topology
    N, R, G = inst.num_samples, inst.rows, topo.num_shards
    const = inst.constant()
    unit = max(inst.lower_bound() - const, 1e-9) / 1000.0  # costs O(10³): HiGHS tolerances are absolute
    cost = blocks.costs / unit
    bits = block_members(blocks.masks, N)
    nb_ = R * G
    pi, mu = set_partitioning_duals(bits, cost, nb_, t_end)
    rc = cost - bits @ pi - mu
    dual = float(pi.sum() + mu * nb_)
    rc_min = min(0.0, float(rc.min()))
    # Σ c ≥ dual + Σ rc over the R·G blocks of any layout; makespan ≥ Σ c / G
    lo = (dual + nb_ * rc_min) / G
    best_layout = tuple(np.asarray(a, dtype=np.int64) for a in start)
    upper = inst.score(*best_layout).makespan
    ub = (upper - const) / unit
    tol = 1e-9 * (1.0 + abs(ub))
    info.update(lp_bound_us=lo * unit + const, enumerate_s=blocks.seconds, targets=[])
    status = "unknown"
    frac = 0.125
    while time.perf_counter() < t_end:
        if lo >= ub - tol:
            status = "optimal"
            break
        final = frac >= 1.0
        T = ub if final else lo + frac * (ub - lo)
        # blocks a layout of makespan ≤ T can use: rc small enough, and no block above T
        keep = np.flatnonzero((rc <= G * T - dual - (nb_ - 1) * rc_min + tol) & (cost <= T + tol))
        if keep.size == 0:  # no block fits: no layout of makespan ≤ T
            lo, frac = max(lo, T), min(1.0, 2 * frac)
            continue
        budget = max(t_end - time.perf_counter(), 0.0)
        res = _solve_cover(inst, bits[keep], blocks.masks[keep], cost[keep], rc[keep], dual, rc_min,
                           T, int(NODES_PER_SECOND * budget) + 1000)
        info["targets"].append((round(T * unit + const, 3), int(keep.size), res["complete"],
                                res["found"], res["nodes"], round(res["seconds"], 2)))
        if res["found"]:
            lay = _layout(inst, blocks, keep[res["chosen"]], cost[keep[res["chosen"]]])
            v = inst.score(*lay).makespan
            if v < upper:
                best_layout, upper = lay, v
                ub = min(ub, (v - const) / unit)
        if not res["complete"]:  # out of time: the bound stays at the last target ruled out
            break
        if res["found"]:  # the best layout of makespan ≤ T, hence the optimum
            status = "optimal"
            break
        lo, frac = max(lo, T), min(1.0, 2 * frac)  # no layout of makespan ≤ T
    bound = (ub if status == "optimal" else lo) * unit + const - 1e-9 * abs(upper)
    if status == "optimal":
        bound = upper - 1e-9 * abs(upper)
    return {"status": status, "layout": best_layout, "bound": min(bound, upper), "info": info}


def _kind(inst: LayoutInstance) -> str:
    """The master's form: "sum" (G = 1: both objectives are Σ_r J[r]), "row" (sum-max, or any
    objective with R = 1: the makespan is Σ_r max over the row's blocks), "shard" (max-sum)."""
    if inst.topology.num_shards == 1:
        return "sum"
    if inst.objective == Objective.SUM_MAX or inst.rows == 1:
        return "row"
    return "shard"


def _arrange(inst: LayoutInstance, costs: np.ndarray) -> list[tuple[int, int]]:
    """(row, shard) of each chosen block, arranged as ``_group_value`` values them."""
    R, G = inst.rows, inst.topology.num_shards
    kind = _kind(inst)
    order = np.argsort(-costs, kind="stable")
    cells = [None] * costs.size
    if kind == "sum":
        for r, k in enumerate(order):
            cells[k] = (r, 0)
    elif kind == "row":  # descending, G consecutive blocks per row
        for n, k in enumerate(order):
            cells[k] = (n // G, n % G)
    else:  # shards of R blocks: min-max grouping by enumeration (R·G is small)
        best, best_groups = math.inf, None
        idx = list(range(costs.size))

        def groups(rest):
            if not rest:
                yield []
                return
            first = rest[0]
            for comb in itertools.combinations(rest[1:], R - 1):
                grp = (first,) + comb
                for tail in groups([i for i in rest if i not in grp]):
                    yield [grp] + tail
        for gs in groups(idx):
            v = max(costs[list(g)].sum() for g in gs)
            if v < best:
                best, best_groups = v, gs
        for g, grp in enumerate(best_groups):
            for r, k in enumerate(grp):
                cells[k] = (r, g)
    return cells


def _layout(inst: LayoutInstance, blocks: BlockSet, chosen: np.ndarray, costs: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
    """Row and slot of every sample from the chosen blocks (ids into ``blocks``)."""
    topo = inst.topology
    N, P = inst.num_samples, topo.ep
    S = topo.slots_of_shard()
    row_N = np.full(N, -1, dtype=np.int64)
    slot_N = np.full(N, -1, dtype=np.int64)
    for (r, g), b in zip(_arrange(inst, costs), chosen):
        mask, cell0 = int(blocks.masks[b]), int(blocks.splits[b])
        for i in range(N):
            if (mask >> i) & 1:
                row_N[i] = r
                slot_N[i] = S[g, 0 if (P == 1 or (cell0 >> i) & 1) else 1]
    return row_N, slot_N


@nb.njit(cache=True)
def _popcount(x):
    c = 0
    while x:
        x &= x - 1
        c += 1
    return c


@nb.njit(cache=True)
def _group_value(vals, kind, G, R, best_cut):
    """Makespan of R·G block costs arranged at best: kind 0 = Σ (G = 1); 1 = Σ_r max over rows of
    G (sorted descending, consecutive chunks: optimal for a sum of group maxima); 2 = max over G
    shards of R (min-max grouping by DFS)."""
    n = vals.shape[0]
    if kind == 0:
        return vals.sum()
    v = np.sort(vals)[::-1]
    if kind == 1:
        tot = 0.0
        for r in range(n // G):
            tot += v[r * G]
        return tot
    # kind 2: shards of R blocks each, minimise the largest shard sum (DFS, largest first)
    load = np.zeros(G)
    cnt = np.zeros(G, dtype=np.int64)
    assign = np.full(n, -1, dtype=np.int64)
    best = best_cut
    k = 0
    while k >= 0:
        if k == n:
            m = load.max()
            if m < best:
                best = m
            k -= 1
            continue
        g = assign[k]
        if g >= 0:  # undo
            load[g] -= v[k]
            cnt[g] -= 1
        g += 1
        placed = False
        while g < G:
            # symmetry: an empty shard only if it is the first empty one
            if cnt[g] < R and load[g] + v[k] < best and (cnt[g] > 0 or g == 0 or cnt[g - 1] > 0):
                placed = True
                break
            g += 1
        if not placed:
            assign[k] = -1
            k -= 1
            continue
        assign[k] = g
        load[g] += v[k]
        cnt[g] += 1
        k += 1
    return best


# The kept blocks of one target, as the compiled cover search reads them.
_KeptBlocks = namedtuple("_KeptBlocks", (
    "masks", "cost", "rc",  # [m]: each block's samples (bitmask), cost and reduced cost (model units)
    "sorted_masks", "sorted_ids",  # [m]: the masks ascending and their block ids (the last block's lookup)
    "lists_start", "lists_idx",  # [N + 1], [Σ]: each sample's candidate blocks, by increasing rc
    "pick_order",  # [N]: samples by increasing number of candidates
))

# What one cover search looks for, and its limits.
_CoverTarget = namedtuple("_CoverTarget", (
    "full",        # bitmask of all N samples
    "nblocks",     # R·G blocks in a layout
    "P", "kmax",   # fewest and most samples in a block
    "slack",       # G·T − dual: the largest Σ rc of a cover worth searching (before the first)
    "dual",        # the LP dual value
    "rc_min",      # min(0, least rc): what each block still to choose may subtract
    "G", "R",      # shards, rows
    "kind",        # _group_value's kind (0 sum, 1 row, 2 shard)
    "cutoff",      # value a cover must beat (T, with tolerance)
    "node_limit",  # candidates scanned before giving up
))


@nb.njit(cache=True, inline="always")
def _last_block(kb, rest):
    """The kept block whose samples are exactly ``rest``, or -1."""
    pos = np.searchsorted(kb.sorted_masks, rest)
    if pos >= kb.sorted_masks.shape[0] or kb.sorted_masks[pos] != rest:
        return -1
    return kb.sorted_ids[pos]


@nb.njit(cache=True, inline="always")
def _first_uncovered(pick_order, cov):
    """The first sample in pick order outside ``cov`` (the next depth's branching sample)."""
    for n in range(pick_order.shape[0]):
        s = pick_order[n]
        if not (cov >> s) & 1:
            return s
    return -1


@nb.njit(cache=True)
def _cover_dfs(kb, tg):
    """Every exact cover of the samples by ``tg.nblocks`` kept blocks ``kb`` with Σ rc ≤ slack
    (each sample's candidate list sorted by rc), arranged at best by ``_group_value``. Returns
    (best value, chosen block ids, nodes, complete)."""
    nblocks, rc, rc_min = tg.nblocks, kb.rc, tg.rc_min
    chosen = np.empty(nblocks, dtype=np.int64)
    ptr = np.zeros(nblocks + 1, dtype=np.int64)
    sample_at = np.empty(nblocks + 1, dtype=np.int64)
    covered = np.zeros(nblocks + 1, dtype=np.int64)
    rcsum = np.zeros(nblocks + 1)
    best = tg.cutoff
    best_chosen = np.full(nblocks, -1, dtype=np.int64)
    vals = np.empty(nblocks)
    slack = tg.slack
    nodes = 0
    d = 0
    # first uncovered sample at depth 0
    sample_at[0] = kb.pick_order[0]
    ptr[0] = kb.lists_start[kb.pick_order[0]]
    while d >= 0:
        i = sample_at[d]
        end = kb.lists_start[i + 1]
        advanced = False
        while ptr[d] < end:
            j = kb.lists_idx[ptr[d]]
            ptr[d] += 1
            nodes += 1
            if nodes > tg.node_limit:
                return best, best_chosen, nodes, False
            if rcsum[d] + rc[j] + (nblocks - d - 1) * rc_min > slack:
                ptr[d] = end
                break
            mj = kb.masks[j]
            if mj & covered[d]:
                continue
            cov = covered[d] | mj
            left = nblocks - d - 1
            rem = _popcount(tg.full & ~cov)
            if rem < tg.P * left or rem > tg.kmax * left:
                continue
            chosen[d] = j
            if left <= 1:
                if left == 1:  # the last block is forced: the remaining samples, if a kept block
                    j2 = _last_block(kb, tg.full & ~cov)
                    if j2 < 0 or rcsum[d] + rc[j] + rc[j2] > slack:
                        continue
                    chosen[d + 1] = j2
                for k in range(nblocks):
                    vals[k] = kb.cost[chosen[k]]
                v = _group_value(vals, tg.kind, tg.G, tg.R, best)
                if v < best:
                    best = v
                    best_chosen[:] = chosen
                    slack = min(slack, tg.G * v - tg.dual)
                continue
            covered[d + 1] = cov
            rcsum[d + 1] = rcsum[d] + rc[j]
            sample_at[d + 1] = _first_uncovered(kb.pick_order, cov)
            ptr[d + 1] = kb.lists_start[sample_at[d + 1]]
            d += 1
            advanced = True
            break
        if not advanced:
            d -= 1
    return best, best_chosen, nodes, True


def _solve_cover(inst: LayoutInstance, bits, masks, cost, rc, dual, rc_min, T, node_limit):
    """Exact search for the best layout of makespan ≤ T over the kept blocks (``_cover_dfs``)."""
    t0 = time.perf_counter()
    topo = inst.topology
    N, R, G, P = inst.num_samples, inst.rows, topo.num_shards, topo.ep
    lists, start = [], [0]
    for i in range(N):
        idx = np.flatnonzero(bits[:, i])
        idx = idx[np.argsort(rc[idx], kind="stable")]
        lists.append(idx)
        start.append(start[-1] + idx.size)
    pick_order = np.argsort([len(x) for x in lists], kind="stable").astype(np.int64)
    lo, hi, kmax = block_bounds(inst)
    tol = 1e-9 * (1.0 + abs(G * T))
    sorted_ids = np.argsort(masks, kind="stable").astype(np.int64)
    kept = _KeptBlocks(masks, cost, rc, masks[sorted_ids], sorted_ids, np.array(start, dtype=np.int64),
                       np.concatenate(lists).astype(np.int64) if lists else np.zeros(0, np.int64), pick_order)
    target = _CoverTarget((1 << N) - 1, R * G, P, kmax, G * T - dual + tol, dual, rc_min, G, R,
                          {"sum": 0, "row": 1, "shard": 2}[_kind(inst)], T + tol, node_limit)
    best, chosen, nodes, complete = _cover_dfs(kept, target)
    found = bool(chosen[0] >= 0)
    return {"found": found, "value": best if found else None, "chosen": chosen if found else None,
            "complete": complete, "nodes": int(nodes), "seconds": time.perf_counter() - t0}

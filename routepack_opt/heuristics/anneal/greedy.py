"""The joint-cost greedy seed: samples by decreasing standalone cost, each into the cell that
least increases the lexicographic score (makespan, total, peak), capacity and nonempty cells kept.

Trying every cell is O(N·(R·G·L·P + R·D·G)), quadratic in N (R grows with it): a block is
scored by one vectorised pass over its expert loads and its cell of least attention (top-two
table): 2.4 s at N = 32,768, D = 128 (was 8.2 s). Past ``CANDIDATE_BLOCKS`` row-shard blocks a
sample is tried in that many blocks drawn at random (seeded), so the work is linear in N; where
that runs out of room, every block is tried. On tight windows (99 % full) the free space can end
up in pieces each too small for the next sample: a swap of two placed samples then makes room
(:func:`_make_room`) instead of giving the seed up. The compiled part places a chunk of samples
per call and the driver checks a deadline between chunks; without a deadline the result does not
depend on the chunking.
"""

from __future__ import annotations

import time

import numpy as np
from numba import njit

from routepack_opt.core.cost import CostModel
from routepack_opt.core.cost_kernel import aggregates, block_cost, delta, less
from routepack_opt.core.objective import Objective
from routepack_opt.core.topology import Topology
from routepack_opt.heuristics.anneal.kernels import attn_one, attn_top2, block_attn, msum, msum_add
from routepack_opt.heuristics.anneal.problem import Instance
from routepack_opt.heuristics.anneal.rng import below, rng_states, xo
from routepack_opt.heuristics.anneal.state import State

__all__ = ["greedy_layout", "greedy_seed", "greedy_order", "greedy_state", "greedy_place", "CHUNK_OPS",
           "CANDIDATE_BLOCKS"]

CHUNK_OPS = 5e7  # work per compiled call (~1e9 simple operations a second: ~50 ms)
# Blocks a sample is tried in once a layout has more (sampled): every window up to N ≈ 2,000
# (X = R·G ≤ 128) is placed exactly as before; larger ones in time linear in N.
CANDIDATE_BLOCKS = 128


@njit(cache=True)
def greedy_init(st, pb):
    """Empty layout state of :func:`greedy_place` (every block holds only its row overhead)."""
    st.T[:] = 0
    st.Q[:] = 0
    st.cnt[:] = 0
    st.W[:, :] = 0
    st.Msum[:] = 0
    G = pb.G
    for x in range(pb.R * G):
        st.J[x] = block_cost(block_attn(st, pb, x // G, x % G), 0, pb)  # no experts yet
    aggregates(st, pb)


@njit(cache=True, _nrt=False, inline='always')
def _best_cell(blocks, nb, i, must_fill, quota, sc, ec, m, At, atts, pb, st):
    """The cell of the blocks ``blocks[:nb]`` (ascending cells within a block) where sample i
    raises the lexicographic score least, under the constraints of :func:`greedy_place`; −1:
    none fits (ties: the first). Within a block the score is a function of the block's new cost,
    so only the block's first cell of least cost is scored: the choice is the same as scoring
    every cell. ``At``: [S·3] scratch (the block's top-two table); ``atts``: [P] scratch."""
    T, Q, cnt = st.T, st.Q, st.cnt
    li = pb.lengths[i]
    l2 = pb.len2[i]
    C, D, G, P = pb.C, pb.D, pb.G, pb.P
    best_c = -1
    b0 = np.inf
    b1 = np.inf
    b2 = np.inf
    for k in range(nb):
        x = blocks[k]
        r = x // G
        g = x - r * G
        top = False
        for jj in range(P):  # the candidate cells of the block and their attention with i
            d = g * P + jj
            c = r * D + d
            atts[jj] = np.nan
            if T[c] + li > C:
                continue
            if must_fill and cnt[c] > 0:
                continue
            if quota > 0 and (sc[d] >= quota
                              or quota - sc[d] - 1 < ec[d] - (1 if cnt[c] == 0 else 0)):
                continue
            if not top:  # the block's two largest cell costs per stage, once
                attn_top2(T, Q, r, g, P, pb.alpha, pb.beta, D, At, 0)
                top = True
            atts[jj] = attn_one(At, 0, c, T[c] + li, Q[c] + l2, pb.alpha, pb.beta)
        if not top:
            continue
        M = np.float64(msum_add(st.W, x, pb.b, i, pb.L, pb.Pp // 8, m))
        Jx = np.inf
        cx = -1
        for jj in range(P):  # the first cell of least block cost (NaN: not a candidate)
            if not np.isnan(atts[jj]):
                J = block_cost(atts[jj], M, pb)
                if J < Jx:
                    Jx = J
                    cx = r * D + g * P + jj
        dms, dtot, dpk = delta(st, pb, r, g, Jx, -1, -1, 0.0)
        if less(dms, dtot, dpk, b0, b1, b2):
            b0 = dms
            b1 = dtot
            b2 = dpk
            best_c = cx
    return best_c


@njit(cache=True, _nrt=False)
def _add(i, c, sign, pb, st, m):
    """Sample i into (sign = 1) or out of (sign = −1) cell c: the cell's sums, its block's
    loads, expert sum and cost, and the aggregates (``m``: [L] scratch)."""
    D, G = pb.D, pb.G
    r = c // D
    g = np.int64(pb.shard_D[c - r * D])
    x = r * G + g
    st.cnt[c] += sign
    st.T[c] += sign * pb.lengths[i]
    st.Q[c] += sign * pb.len2[i]
    for o in range(pb.L * pb.Pp):
        st.W[x, o] += sign * pb.b[i, o]
    st.Msum[x] = msum(st.W, x, pb.L, pb.Pp, m)
    st.J[x] = block_cost(block_attn(st, pb, r, g), st.Msum[x], pb)
    aggregates(st, pb)


@njit(cache=True, _nrt=False, inline='always')
def _merge(reach, v, val, cell, val2):
    """Fold (val at ``cell``, val2 at some other cell) into the top two of distinct cells at v."""
    a1 = reach[0, v]
    a2 = reach[2, v]
    if val > a1:
        reach[2, v] = max(val2, a1 if reach[1, v] != cell else a2)
        reach[0, v] = val
        reach[1, v] = cell
    else:
        reach[2, v] = max(a2, val if cell != reach[1, v] else val2)


@njit(cache=True, _nrt=False)
def _make_room(i, t, order, quota, sc, ec, pb, st, m, reach):
    """Room for sample i when no cell has it (a tight window whose free space is fragmented):
    swap a member s of a cell c with a shorter placed sample s2 of another cell c2 that can take
    the δ = l_s − l_s2 extra tokens, so that c then fits i (δ ≥ l_i − free(c)). The cell c with
    the most free capacity (allowed by the quota) among those where such a swap exists, then the
    smallest δ (ties: the first in ``order``). Placed samples are ``order[:t]``; the counts per
    cell and slot do not change. ``reach``: [3, C + 1] scratch. Returns c, now with room for i, or
    −1. O(t + C)."""
    C, D = pb.C, pb.D
    li = pb.lengths[i]
    # reach[0, v] = max over placed s2 with l_s2 ≤ v of l_s2 + free(cell of s2), reach[1, v] its
    # cell, reach[2, v] the same max over the other cells: a member s of cell c has a partner
    # iff that max over cells other than c, at v = l_s − need, is ≥ l_s
    reach[0, :] = -1
    reach[1, :] = -1
    reach[2, :] = -1
    for u in range(t):
        s2 = order[u]
        c2 = np.int64(st.row[s2]) * D + np.int64(st.slot[s2])
        _merge(reach, pb.lengths[s2], pb.lengths[s2] + C - st.T[c2], c2, -1)
    for v in range(1, C + 1):
        _merge(reach, v, reach[0, v - 1], reach[1, v - 1], reach[2, v - 1])
    c = -1
    bs = -1
    free_c = -1
    for u in range(t):
        s = order[u]
        cc = np.int64(st.row[s]) * D + np.int64(st.slot[s])
        f = C - st.T[cc]
        if f <= free_c:
            continue
        d = cc % D
        if quota > 0 and (sc[d] >= quota or quota - sc[d] - 1 < ec[d]):
            continue
        v = pb.lengths[s] - (li - f)
        if v >= 1 and (reach[2, v] if reach[1, v] == cc else reach[0, v]) >= pb.lengths[s]:
            c = cc
            bs = s
            free_c = f
    if c < 0:
        return -1
    need = li - free_c
    ls = pb.lengths[bs]
    best_d = C + 1
    bs2 = -1
    for u in range(t):
        s2 = order[u]
        delta = ls - pb.lengths[s2]
        if delta < need or delta >= best_d:
            continue
        c2 = np.int64(st.row[s2]) * D + np.int64(st.slot[s2])
        if c2 != c and C - st.T[c2] >= delta:
            best_d = delta
            bs2 = s2
    if bs2 < 0:
        return -1
    c2 = np.int64(st.row[bs2]) * D + np.int64(st.slot[bs2])
    # np.int64(...): plain int64 arguments, not numba literals (each literal combination would
    # compile _add once more; tests/test_warmup.py checks one signature per load storage)
    out, into = np.int64(-1), np.int64(1)
    bs, bs2, c, c2 = np.int64(bs), np.int64(bs2), np.int64(c), np.int64(c2)
    _add(bs, c, out, pb, st, m)
    _add(bs2, c2, out, pb, st, m)
    _add(bs, c2, into, pb, st, m)
    _add(bs2, c, into, pb, st, m)
    st.row[bs], st.row[bs2] = st.row[bs2], st.row[bs]
    st.slot[bs], st.slot[bs2] = st.slot[bs2], st.slot[bs]
    return c


@njit(cache=True)
def greedy_place(t_from, t_to, order, pb, st, quota, n_cand, rng, pool, repairs):
    """Place ``order[t_from:t_to]`` onto the state left by the previous call (:func:`greedy_init`
    first): each sample into the cell whose lexicographic score (makespan, total, peak) grows
    least, keeping capacity and leaving enough samples to fill every empty cell; its row and
    slot into st.row, st.slot. Returns False if some sample fits nowhere. ``quota`` > 0 (equal
    samples per slot): a slot takes at most ``quota`` samples and keeps enough of its quota to
    fill its own empty cells. Of the state it keeps T, Q, cnt, W, Msum, J and the aggregates.

    With more than ``n_cand`` row-shard blocks a sample is tried in ``n_cand`` of them drawn
    uniformly (without replacement, from the xoshiro state ``rng``, carried between calls), and
    in all of them only if none of those has room (``pool``: a permutation of the blocks, carried
    between calls with ``rng``): O(n_cand·(L·P + P·G)) per sample instead of
    O(R·G·L·P + R·D·G). When no cell has room, up to ``repairs[0]`` times (counted down, carried
    between calls) a swap of two placed samples makes some (:func:`_make_room`)."""
    cnt = st.cnt
    R, D, G, L = pb.R, pb.D, pb.G, pb.L
    N = order.shape[0]
    n_cells = R * D
    X = R * G
    empty = 0
    for c in range(n_cells):
        if cnt[c] == 0:
            empty += 1
    sc = np.zeros(D, dtype=np.int64)  # samples per slot (quota > 0 only)
    ec = np.zeros(D, dtype=np.int64)  # empty cells per slot
    if quota > 0:
        for c in range(n_cells):
            sc[c % D] += cnt[c]
            ec[c % D] += 1 if cnt[c] == 0 else 0
    m = np.empty(2 * L, dtype=st.W.dtype)
    every = np.arange(X)
    At = np.empty(3 * pb.alpha.shape[0])  # one block's top-two attention table
    atts = np.empty(pb.P)
    reach = np.empty((3, pb.C + 1), dtype=np.int64)
    sampled = X > n_cand
    s0, s1, s2, s3 = rng[0], rng[1], rng[2], rng[3]
    for t in range(t_from, t_to):
        i = order[t]
        must_fill = (N - t) <= empty
        best_c = -1
        if sampled:
            for k in range(n_cand):  # partial Fisher–Yates: pool[:n_cand] is a uniform sample
                u, s0, s1, s2, s3 = xo(s0, s1, s2, s3)
                j = k + below(u, X - k)
                tmp = pool[k]
                pool[k] = pool[j]
                pool[j] = tmp
            best_c = _best_cell(pool, n_cand, i, must_fill, quota, sc, ec, m, At, atts, pb, st)
        if best_c < 0:
            best_c = _best_cell(every, X, i, must_fill, quota, sc, ec, m, At, atts, pb, st)
        if best_c < 0 and not must_fill and repairs[0] > 0:
            # no cell has room (a tight window whose free space is fragmented): make room
            best_c = _make_room(i, t, order, quota, sc, ec, pb, st, m, reach)
            repairs[0] -= 1
        if best_c < 0:
            return False
        c = best_c
        r = c // D
        d = c - r * D
        if cnt[c] == 0:
            empty -= 1
            ec[d] -= 1
        sc[d] += 1
        _add(np.int64(i), np.int64(c), np.int64(1), pb, st, m)
        st.row[i] = r
        st.slot[i] = d
    rng[0] = s0
    rng[1] = s1
    rng[2] = s2
    rng[3] = s3
    return True


def greedy_seed(inst: Instance, deadline: float | None = None, chunk_ops: float = CHUNK_OPS,
                candidates: int = CANDIDATE_BLOCKS, repairs: int | None = None):
    """The greedy layout in internal slots (int64 row, slot), or None (capacity blocks it, or
    ``deadline`` — a ``time.perf_counter()`` value — passes first). ``chunk_ops``: work per
    compiled call, between deadline checks (the layout does not depend on it). ``candidates``:
    blocks a sample is tried in once there are more (see :func:`greedy_place`); if that runs out
    of room before the last sample, every block is tried again from the start. ``repairs``: how
    many times that exhaustive pass may make room by a swap when no cell has any
    (:func:`_make_room`; default N; 0: none). The sampled pass makes none: where it runs out of
    room (N = 32,768, D = 32 or 128 at R*, 99.4 % full) a repaired sampled layout (2,024 swaps)
    ended 0.3 % worse after the search than the exhaustive one (two seeds), so it gives way to
    the exhaustive pass, as it did before repairs existed."""
    order = greedy_order(inst)
    X = inst.R * inst.G
    n_rep = inst.N if repairs is None else max(0, int(repairs))
    if X > candidates:
        got = _greedy(inst, order, deadline, chunk_ops, max(1, int(candidates)), 0)
        if got is not None or (deadline is not None and time.perf_counter() >= deadline):
            return got
    return _greedy(inst, order, deadline, chunk_ops, X, n_rep)


def greedy_order(inst: Instance) -> np.ndarray:
    """The samples (internal indices) by decreasing standalone cost, then length, then the
    caller's order."""
    pb = inst.problem
    own = (pb.alpha[None, :] * pb.lengths[:, None] + pb.beta[None, :] * pb.len2[:, None]).sum(axis=1)
    own = own + pb.gamma * inst.b_NLP().max(axis=2).sum(axis=1)
    return np.lexsort((inst.perm, -pb.lengths, -own)).astype(np.int64)


def greedy_state(inst: Instance) -> State:
    """An empty layout state for :func:`greedy_place` (T, Q, cnt, W, Msum, J, the aggregates;
    no member lists, no attention table)."""
    pb = inst.problem
    X, n_cells = pb.R * pb.G, pb.R * pb.D
    empty_i32 = np.zeros(0, dtype=np.int32)
    st = State(row=np.zeros(pb.N, dtype=np.int32), slot=np.zeros(pb.N, dtype=np.int32),
               cnt=np.zeros(n_cells, dtype=np.int64), memb=empty_i32, pos=empty_i32,
               T=np.zeros(n_cells, dtype=np.int64), Q=np.zeros(n_cells, dtype=np.int64),
               W=np.zeros((X, pb.L * pb.Pp), dtype=inst.wdtype), Msum=np.zeros(X, dtype=np.int64),
               J=np.empty(X), colsum=np.empty(pb.G), rowmax=np.empty(pb.R), agg=np.empty(7),
               At=np.zeros(0), opn=empty_i32)
    greedy_init(st, pb)
    return st


def _greedy(inst: Instance, order, deadline: float | None, chunk_ops: float, n_cand: int,
            n_repairs: int):
    """One greedy pass over the samples in ``order``, each tried in ``n_cand`` sampled blocks
    (all of them if n_cand ≥ R·G), with up to ``n_repairs`` repairs; None: out of room or out
    of time."""
    pb = inst.problem
    X = pb.R * pb.G
    st = greedy_state(inst)
    tried = min(X, n_cand)
    step = max(1, int(chunk_ops // max(1, tried * (pb.L * pb.Pp + pb.P * pb.G) + X)))
    quota = pb.N // pb.D if pb.eq else 0
    rng = rng_states(0, -3, 1)[0]
    pool = np.arange(X, dtype=np.int64)
    repairs = np.array([n_repairs], dtype=np.int64)
    for t in range(0, pb.N, step):
        if deadline is not None and time.perf_counter() >= deadline:
            return None
        if not greedy_place(t, min(t + step, pb.N), order, pb, st, quota, n_cand, rng, pool, repairs):
            return None
    return st.row.astype(np.int64), st.slot.astype(np.int64)


def greedy_layout(lengths_N, b_NLP, topology: Topology, cost: CostModel, rows: int,
                  objective: Objective = Objective.MAX_SUM, tie_eps: float = 1e-9):
    """Joint-cost greedy layout (samples by decreasing standalone cost, each into the cell that
    least increases the lexicographic score); ``None`` if capacity blocks it."""
    inst = Instance(lengths_N, b_NLP, topology, cost, rows, objective, tie_eps)
    g = greedy_seed(inst)
    return None if g is None else inst.external(*g)

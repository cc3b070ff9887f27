"""The joint-cost greedy seed: samples by decreasing standalone cost, each into the cell that
least increases the lexicographic score (makespan, total, peak), capacity and nonempty cells kept.

Trying every cell is O(N·(R·G·L·P + R·D·G)), quadratic in N (R grows with it); past
``CANDIDATE_BLOCKS`` row-shard blocks a sample is tried in that many blocks drawn at random
(seeded), so the work is linear in N. The compiled part places a chunk of samples per call and
the driver checks a deadline between chunks; without a deadline the result does not depend on
the chunking.
"""

from __future__ import annotations

import time

import numpy as np
from numba import njit

from routepack_opt.core.cost import CostModel
from routepack_opt.core.topology import Topology
from routepack_opt.heuristics.anneal.kernels import aggregates, attn, delta, msum_swap
from routepack_opt.heuristics.anneal.problem import Instance
from routepack_opt.heuristics.anneal.rng import below, rng_states, xo
from routepack_opt.heuristics.anneal.state import State

__all__ = ["greedy_layout", "greedy_seed", "CHUNK_OPS", "CANDIDATE_BLOCKS"]

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
        st.J[x] = (attn(st.T, st.Q, x // G, x % G, pb.P, pb.alpha, pb.beta, pb.D, -1, 0, 0, -1, 0, 0)
                   + 0.0) + pb.ovh
    aggregates(st, pb)


@njit(cache=True, _nrt=False, inline='always')
def _best_cell(blocks, nb, i, must_fill, quota, sc, ec, Mnew, m, pb, st):
    """The cell of the blocks ``blocks[:nb]`` (ascending cells within a block) where sample i
    raises the lexicographic score least, under the constraints of :func:`greedy_place`; −1:
    none fits."""
    T, Q, cnt, W = st.T, st.Q, st.cnt, st.W
    li = pb.lengths[i]
    C, D, G, P = pb.C, pb.D, pb.G, pb.P
    zero = pb.b.shape[0] - 1  # block x's side of a "swap" of the zero row with i adds b[i]
    best_c = -1
    b0 = np.inf
    b1 = np.inf
    b2 = np.inf
    for k in range(nb):
        x = blocks[k]
        r = x // G
        g = x - r * G
        have_m = False
        for jj in range(P):
            d = g * P + jj
            c = r * D + d
            if T[c] + li > C:
                continue
            if must_fill and cnt[c] > 0:
                continue
            if quota > 0 and (sc[d] >= quota
                              or quota - sc[d] - 1 < ec[d] - (1 if cnt[c] == 0 else 0)):
                continue
            if not have_m:  # the block's expert sum with i, once per block that has a candidate
                Mnew[x] = msum_swap(W, x, x, pb.b, zero, i, pb.L, pb.Pp // 8, m)[0]
                have_m = True
            att = attn(T, Q, r, g, P, pb.alpha, pb.beta, D, c, T[c] + li, Q[c] + pb.len2[i], -1, 0, 0)
            Jx = (att + pb.gamma * np.float64(Mnew[x])) + pb.ovh
            dms, dtot, dpk = delta(st, pb, r, g, Jx, -1, -1, 0.0)
            if dms < b0 or (dms == b0 and (dtot < b1 or (dtot == b1 and dpk < b2))):
                b0 = dms
                b1 = dtot
                b2 = dpk
                best_c = c
    return best_c


@njit(cache=True)
def greedy_place(t_from, t_to, order, pb, st, quota, n_cand, rng, pool):
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
    O(R·G·L·P + R·D·G), which grew with N (25 s at N = 32,768, D = 512)."""
    T, Q, cnt, W, Msum, J = st.T, st.Q, st.cnt, st.W, st.Msum, st.J
    lengths, len2, b, shard_D = pb.lengths, pb.len2, pb.b, pb.shard_D
    R, D, G, L, Pp = pb.R, pb.D, pb.G, pb.L, pb.Pp
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
    Mnew = np.empty(X, dtype=np.int64)
    m = np.empty(2 * L, dtype=W.dtype)
    every = np.arange(X)
    sampled = X > n_cand
    s0, s1, s2, s3 = rng[0], rng[1], rng[2], rng[3]
    for t in range(t_from, t_to):
        i = order[t]
        li = lengths[i]
        must_fill = (N - t) <= empty
        best_c = -1
        if sampled:
            for k in range(n_cand):  # partial Fisher–Yates: pool[:n_cand] is a uniform sample
                u, s0, s1, s2, s3 = xo(s0, s1, s2, s3)
                j = k + below(u, X - k)
                tmp = pool[k]
                pool[k] = pool[j]
                pool[j] = tmp
            best_c = _best_cell(pool, n_cand, i, must_fill, quota, sc, ec, Mnew, m, pb, st)
        if best_c < 0:
            best_c = _best_cell(every, X, i, must_fill, quota, sc, ec, Mnew, m, pb, st)
        if best_c < 0:
            return False
        c = best_c
        r = c // D
        d = c - r * D
        x = r * G + shard_D[d]
        if cnt[c] == 0:
            empty -= 1
            ec[d] -= 1
        sc[d] += 1
        cnt[c] += 1
        T[c] += li
        Q[c] += len2[i]
        for o in range(L * Pp):
            W[x, o] += b[i, o]
        Msum[x] = Mnew[x]
        J[x] = (attn(T, Q, r, shard_D[d], pb.P, pb.alpha, pb.beta, D, -1, 0, 0, -1, 0, 0)
                + pb.gamma * np.float64(Msum[x])) + pb.ovh
        aggregates(st, pb)
        st.row[i] = r
        st.slot[i] = d
    rng[0] = s0
    rng[1] = s1
    rng[2] = s2
    rng[3] = s3
    return True


def greedy_seed(inst: Instance, deadline: float | None = None, chunk_ops: float = CHUNK_OPS,
                candidates: int = CANDIDATE_BLOCKS):
    """The greedy layout in internal slots (int64 row, slot), or None (capacity blocks it, or
    ``deadline`` — a ``time.perf_counter()`` value — passes first). ``chunk_ops``: work per
    compiled call, between deadline checks (the layout does not depend on it). ``candidates``:
    blocks a sample is tried in once there are more (see :func:`greedy_place`); if that runs out
    of room before the last sample (tight windows: N = 32,768, D = 128 at R*), every block is
    tried again from the start."""
    pb = inst.problem
    own = (pb.alpha[None, :] * pb.lengths[:, None] + pb.beta[None, :] * pb.len2[:, None]).sum(axis=1)
    own = own + pb.gamma * inst.b_NLP().max(axis=2).sum(axis=1)
    order = np.lexsort((inst.perm, -pb.lengths, -own)).astype(np.int64)  # ties: caller's order
    X = inst.R * inst.G
    if X > candidates:
        got = _greedy(inst, order, deadline, chunk_ops, max(1, int(candidates)))
        if got is not None or (deadline is not None and time.perf_counter() >= deadline):
            return got
    return _greedy(inst, order, deadline, chunk_ops, X)


def _greedy(inst: Instance, order, deadline: float | None, chunk_ops: float, n_cand: int):
    """One greedy pass over the samples in ``order``, each tried in ``n_cand`` sampled blocks
    (all of them if n_cand ≥ R·G); None: out of room or out of time."""
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
    tried = min(X, n_cand)
    step = max(1, int(chunk_ops // max(1, tried * (pb.L * pb.Pp + pb.P * pb.G) + X)))
    quota = pb.N // pb.D if pb.eq else 0
    rng = rng_states(0, -3, 1)[0]
    pool = np.arange(X, dtype=np.int64)
    for t in range(0, pb.N, step):
        if deadline is not None and time.perf_counter() >= deadline:
            return None
        if not greedy_place(t, min(t + step, pb.N), order, pb, st, quota, n_cand, rng, pool):
            return None
    return st.row.astype(np.int64), st.slot.astype(np.int64)


def greedy_layout(lengths_N, b_NLP, topology: Topology, cost: CostModel, rows: int,
                  objective: str = "max-sum", tie_eps: float = 1e-9):
    """Joint-cost greedy layout (samples by decreasing standalone cost, each into the cell that
    least increases the lexicographic score); ``None`` if capacity blocks it."""
    inst = Instance(lengths_N, b_NLP, topology, cost, rows, objective, tie_eps)
    g = greedy_seed(inst)
    return None if g is None else inst.external(*g)

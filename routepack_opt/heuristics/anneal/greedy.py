"""The joint-cost greedy seed: samples by decreasing standalone cost, each into the cell that
least increases the lexicographic score (makespan, total, peak), capacity and nonempty cells kept.

Its work is O(N·(R·G·L·P + R·D)), minutes at N = 65,536, so the compiled part places a chunk of
samples per call and the driver checks a deadline between chunks; without a deadline the result
does not depend on the chunking.
"""

from __future__ import annotations

import time

import numpy as np
from numba import njit

from routepack_opt.core.cost import CostModel
from routepack_opt.core.topology import Topology
from routepack_opt.heuristics.anneal.kernels import aggregates, attn, delta, msum_swap
from routepack_opt.heuristics.anneal.problem import Instance
from routepack_opt.heuristics.anneal.state import State

__all__ = ["greedy_layout", "greedy_seed", "CHUNK_OPS"]

CHUNK_OPS = 5e7  # work per compiled call (~1e9 simple operations a second: ~50 ms)


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


@njit(cache=True)
def greedy_place(t_from, t_to, order, pb, st, quota):
    """Place ``order[t_from:t_to]`` onto the state left by the previous call (:func:`greedy_init`
    first): each sample into the cell whose lexicographic score (makespan, total, peak) grows
    least, keeping capacity and leaving enough samples to fill every empty cell; its row and
    slot into st.row, st.slot. Returns False if some sample fits nowhere. ``quota`` > 0 (equal
    samples per slot): a slot takes at most ``quota`` samples and keeps enough of its quota to
    fill its own empty cells. Of the state it keeps T, Q, cnt, W, Msum, J and the aggregates."""
    T, Q, cnt, W, Msum, J = st.T, st.Q, st.cnt, st.W, st.Msum, st.J
    lengths, len2, b, shard_D = pb.lengths, pb.len2, pb.b, pb.shard_D
    C, R, D, G, L, P = pb.C, pb.R, pb.D, pb.G, pb.L, pb.Pp
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
    zero = b.shape[0] - 1  # the zero row: block x's side of a "swap" of the zero row with i adds b[i]
    for t in range(t_from, t_to):
        i = order[t]
        li = lengths[i]
        must_fill = (N - t) <= empty
        for x in range(X):
            Mnew[x] = msum_swap(W, x, x, b, zero, i, L, P // 8, m)[0]
        best_c = -1
        b0 = np.inf
        b1 = np.inf
        b2 = np.inf
        for c in range(n_cells):
            if T[c] + li > C:
                continue
            if must_fill and cnt[c] > 0:
                continue
            r = c // D
            d = c - r * D
            if quota > 0 and (sc[d] >= quota
                              or quota - sc[d] - 1 < ec[d] - (1 if cnt[c] == 0 else 0)):
                continue
            g = shard_D[d]
            x = r * G + g
            att = attn(T, Q, r, g, pb.P, pb.alpha, pb.beta, D, c, T[c] + li, Q[c] + len2[i], -1, 0, 0)
            Jx = (att + pb.gamma * np.float64(Mnew[x])) + pb.ovh
            dms, dtot, dpk = delta(st, pb, r, g, Jx, -1, -1, 0.0)
            if dms < b0 or (dms == b0 and (dtot < b1 or (dtot == b1 and dpk < b2))):
                b0 = dms
                b1 = dtot
                b2 = dpk
                best_c = c
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
        for o in range(L * P):
            W[x, o] += b[i, o]
        Msum[x] = Mnew[x]
        J[x] = (attn(T, Q, r, shard_D[d], pb.P, pb.alpha, pb.beta, D, -1, 0, 0, -1, 0, 0)
                + pb.gamma * np.float64(Msum[x])) + pb.ovh
        aggregates(st, pb)
        st.row[i] = r
        st.slot[i] = d
    return True


def greedy_seed(inst: Instance, deadline: float | None = None, chunk_ops: float = CHUNK_OPS):
    """The greedy layout in internal slots (int64 row, slot), or None (capacity blocks it, or
    ``deadline`` — a ``time.perf_counter()`` value — passes first). ``chunk_ops``: work per
    compiled call, between deadline checks (the layout does not depend on it)."""
    pb = inst.problem
    own = (pb.alpha[None, :] * pb.lengths[:, None] + pb.beta[None, :] * pb.len2[:, None]).sum(axis=1)
    own = own + pb.gamma * inst.b_NLP().max(axis=2).sum(axis=1)
    order = np.lexsort((inst.perm, -pb.lengths, -own)).astype(np.int64)  # ties: caller's order
    X, n_cells = pb.R * pb.G, pb.R * pb.D
    empty_i32 = np.zeros(0, dtype=np.int32)
    st = State(row=np.zeros(pb.N, dtype=np.int32), slot=np.zeros(pb.N, dtype=np.int32),
               cnt=np.zeros(n_cells, dtype=np.int64), memb=empty_i32, pos=empty_i32,
               T=np.zeros(n_cells, dtype=np.int64), Q=np.zeros(n_cells, dtype=np.int64),
               W=np.zeros((X, pb.L * pb.Pp), dtype=inst.wdtype), Msum=np.zeros(X, dtype=np.int64),
               J=np.empty(X), colsum=np.empty(pb.G), rowmax=np.empty(pb.R), agg=np.empty(7),
               At=np.zeros(0), opn=empty_i32)
    greedy_init(st, pb)
    step = max(1, int(chunk_ops // max(1, X * pb.L * pb.Pp + n_cells)))
    quota = pb.N // pb.D if pb.eq else 0
    for t in range(0, pb.N, step):
        if deadline is not None and time.perf_counter() >= deadline:
            return None
        if not greedy_place(t, min(t + step, pb.N), order, pb, st, quota):
            return None
    return st.row.astype(np.int64), st.slot.astype(np.int64)


def greedy_layout(lengths_N, b_NLP, topology: Topology, cost: CostModel, rows: int,
                  objective: str = "max-sum", tie_eps: float = 1e-9):
    """Joint-cost greedy layout (samples by decreasing standalone cost, each into the cell that
    least increases the lexicographic score); ``None`` if capacity blocks it."""
    inst = Instance(lengths_N, b_NLP, topology, cost, rows, objective, tie_eps)
    g = greedy_seed(inst)
    return None if g is None else inst.external(*g)

"""A replica's incremental state, the population of replicas, and the two ways the state
changes: built from a layout (:func:`init_state`) and one accepted move (:func:`apply_move`).

Legend: N samples, L layers, Pp padded EP ranks, D DP slots, G shards, R rows, S attention
stages, K replicas, C = R·D cells (cell c = r·D + d, internal shard-major slots), X = R·G
row-shard blocks (x = r·G + g).

Each replica keeps T[c], Q[c] (int64), W[x, p·L + l] (per-rank expert loads, rank-major, ranks
zero-padded to a multiple of 8), Msum[x] = Σ_l max_p W (int64), J[x] (float64), per block and
stage the two largest cell attention costs (so a move's attention is O(S)), and the aggregates
(shard sums, row maxima, total, the two largest blocks). A move touches at most two blocks; J of
a touched block is recomputed from the integer state exactly as the evaluator does, so it never
drifts; on acceptance the touched shard sums (by their change) and row maxima are updated and the
makespan and total carried, in O(G); all are recomputed exactly at every chunk of sweeps.

The arrays travel into the compiled code as named tuples (:class:`State`, :class:`Walk`,
:class:`Scratch`): one list of fields each, read by name. A :class:`Population` holds them
stacked ([K, ...]); :func:`replica_state` and :func:`replica_walk` take replica k's views.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit

from routepack_opt.heuristics.anneal.kernels import (
    aggregates,
    attn_top2,
    block_attn,
    block_cost,
    msum,
    update_aggregates,
    w_swap,
)
from routepack_opt.heuristics.anneal.problem import Instance
from routepack_opt.heuristics.anneal.proposal import ROTATE, SWAP

__all__ = ["State", "Walk", "Scratch", "LOG_SIZE", "Population", "init_state", "init_population",
           "move_members", "rotate_members", "apply_move", "replica_state", "replica_walk", "scratch", "set_open"]

# One replica's layout and everything derived from it (what resampling copies between replicas).
State = namedtuple("State", (
    "row",     # [N] int32: row of each (internal) sample
    "slot",    # [N] int32: internal slot of each sample
    "cnt",     # [C] int64: samples per cell
    "memb",    # [C·cap] int32: member-major lists, memb[t·C + c] = the t-th sample of cell c
    "pos",     # [N] int32: each sample's place in its cell's list
    "T",       # [C] int64: Σ length per cell
    "Q",       # [C] int64: Σ length² per cell
    "W",       # [X, L·Pp] int32/int64: per-rank expert loads of each block, rank-major
    "Msum",    # [X] int64: Σ_l max_p W[x]
    "J",       # [X] float64: block costs
    "colsum",  # [G] float64: Σ_r J per shard (kept under max-sum)
    "rowmax",  # [R] float64: max_g J per row (kept under sum-max)
    "agg",     # [7] float64: makespan, total, peak, energy, peak block, 2nd peak, its block
    "At",      # [X·S·3] float64: per block and stage the largest cell cost, its cell, the next
    "opn",     # [2C + 1] int32: the open-cell set (see set_open)
))

# One replica's walk: its random stream, the best state it saw, its counters.
Walk = namedtuple("Walk", (
    "rng",        # [4] uint64: xoshiro256** state
    "best_row",   # [N] int32
    "best_slot",  # [N] int32
    "best_e",     # [1] float64: best energy seen (set by the driver to the population's best)
    "counters",   # [4] int64: evaluated, accepted, recorded probes, proposals
    "last",       # [3] float64: (Δmakespan, Δtotal, Δpeak) of the last evaluated proposal
    "probe",      # [n] float64: |ΔE| of evaluated proposals, none accepted (n = 0: a real walk)
))

# Per-thread scratch of the move loop (allocated once per compiled call, not per move).
Scratch = namedtuple("Scratch", (
    "m",        # [2L] W's dtype: rows of msum_swap when Pp > 8
    "log",      # [n, 3] int32: (sample, old row, old slot) of the moves since the best state
))

LOG_SIZE = 4096  # entries of Scratch.log (one per moved sample: two per swap)


@njit(cache=True)
def scratch(L, W, log_size=LOG_SIZE):
    """A :class:`Scratch` for W's dtype."""
    return Scratch(m=np.empty(2 * L, dtype=W.dtype),
                   log=np.empty((max(log_size, 2), 3), dtype=np.int32))


@njit(cache=True, _nrt=False, inline='always')
def replica_state(S, k):
    """Replica k's :class:`State` (views) of a stacked one."""
    return State(row=S.row[k], slot=S.slot[k], cnt=S.cnt[k], memb=S.memb[k], pos=S.pos[k],
                 T=S.T[k], Q=S.Q[k], W=S.W[k], Msum=S.Msum[k], J=S.J[k], colsum=S.colsum[k],
                 rowmax=S.rowmax[k], agg=S.agg[k], At=S.At[k], opn=S.opn[k])


@njit(cache=True, _nrt=False, inline='always')
def replica_walk(V, k):
    """Replica k's :class:`Walk` (views) of a stacked one."""
    return Walk(rng=V.rng[k], best_row=V.best_row[k], best_slot=V.best_slot[k],
                best_e=V.best_e[k:k + 1], counters=V.counters[k], last=V.last[k],
                probe=V.probe[k])


@njit(cache=True, _nrt=False, inline='always')
def set_open(opn, c, is_open, n_cells):
    """Keep cell c in (or out of) the open-cell set ``opn`` = [list of open cells (n_cells),
    position of each cell in the list or −1 (n_cells), size]; open: room for the shortest
    sample. O(1), swap-with-last removal."""
    p = opn[n_cells + c]
    if is_open and p < 0:
        n = opn[2 * n_cells]
        opn[n] = c
        opn[n_cells + c] = n
        opn[2 * n_cells] = n + 1
    elif not is_open and p >= 0:
        n = opn[2 * n_cells] - 1
        last = opn[n]
        opn[p] = last
        opn[n_cells + last] = p
        opn[n_cells + c] = -1
        opn[2 * n_cells] = n


@njit(cache=True)
def init_state(st, pb):
    """Build one replica's incremental state from its layout (st.row, st.slot)."""
    row, slot, cnt, memb, pos, T, Q, W = st.row, st.slot, st.cnt, st.memb, st.pos, st.T, st.Q, st.W
    R, D, G, L = pb.R, pb.D, pb.G, pb.L
    N = row.shape[0]
    n_cells = R * D
    m = np.empty(L, dtype=W.dtype)
    T[:] = 0
    Q[:] = 0
    cnt[:] = 0
    W[:, :] = 0
    for i in range(N):
        c = row[i] * D + slot[i]
        memb[cnt[c] * n_cells + c] = i
        pos[i] = cnt[c]
        cnt[c] += 1
        T[c] += pb.lengths[i]
        Q[c] += pb.len2[i]
        x = row[i] * G + pb.shard_D[slot[i]]
        for o in range(L * pb.Pp):
            W[x, o] += pb.b[i, o]
    for r in range(R):
        for g in range(G):
            x = r * G + g
            st.Msum[x] = msum(W, x, L, pb.Pp, m)
            attn_top2(T, Q, r, g, pb.P, pb.alpha, pb.beta, D, st.At, x)
            st.J[x] = block_cost(block_attn(st, pb, r, g), st.Msum[x], pb)
    aggregates(st, pb)
    st.opn[:] = -1
    st.opn[2 * n_cells] = 0
    for c in range(n_cells):  # samples are numbered by length: lengths[0] is the shortest
        set_open(st.opn, c, pb.C - T[c] >= pb.lengths[0], n_cells)


@njit(cache=True)
def init_population(S, pb):
    """:func:`init_state` of every replica of a stacked :class:`State`. Serial: 16 replicas of a
    production window (N = 1,024, L = 48, P = 8) take about 1 ms, 0.4 ms more than a ``prange``
    on two cores, while a parallel loop took about 5 s more to compile on the warm-up's
    critical path."""
    for k in range(S.row.shape[0]):
        init_state(replica_state(S, k), pb)


@njit(cache=True, _nrt=False, inline='always')
def move_members(st, pb, p):
    """The member lists, counts and (row, slot) of the samples that a relocation or swap ``p``
    moves (a relocation takes i out of a's list by swap-with-last; a swap exchanges list places,
    so the counts stay)."""
    n_cells = pb.R * pb.D
    memb, pos = st.memb, st.pos
    i, j, a, bc = p.i, p.j, p.a, p.bc
    if p.kind == SWAP:
        pi = pos[i]
        pj = pos[j]
        memb[pi * n_cells + a] = j
        memb[pj * n_cells + bc] = i
        pos[i] = pj
        pos[j] = pi
        st.row[j] = p.ra
        st.slot[j] = p.da
    else:
        tail = memb[(st.cnt[a] - 1) * n_cells + a]
        memb[pos[i] * n_cells + a] = tail
        pos[tail] = pos[i]
        st.cnt[a] -= 1
        memb[st.cnt[bc] * n_cells + bc] = i
        pos[i] = st.cnt[bc]
        st.cnt[bc] += 1
    st.row[i] = p.rb
    st.slot[i] = p.db


@njit(cache=True, _nrt=False)
def rotate_members(st, pb, p):
    """A rotation's member lists and (row, slot) — i takes j's place in bc, j takes k's in cc,
    k takes i's in a; the counts stay — and its third cell cc (token sums, open-cell entry).
    A call, not inlined: the default move loop never runs it and stays as small as without it."""
    n_cells = pb.R * pb.D
    memb, pos = st.memb, st.pos
    i, j, k = p.i, p.j, p.k
    pi = pos[i]
    pj = pos[j]
    pk = pos[k]
    memb[pi * n_cells + p.a] = k
    memb[pj * n_cells + p.bc] = i
    memb[pk * n_cells + p.cc] = j
    pos[i] = pj
    pos[j] = pk
    pos[k] = pi
    st.row[j] = p.ra
    st.slot[j] = p.dc
    st.row[k] = p.ra
    st.slot[k] = p.da
    st.row[i] = p.rb
    st.slot[i] = p.db
    st.T[p.cc] = p.Tc
    st.Q[p.cc] = p.Qc
    set_open(st.opn, p.cc, pb.C - p.Tc >= pb.lengths[0], n_cells)


@njit(cache=True, _nrt=False, inline='always')
def apply_move(st, pb, sc, p, ev):
    """Accept proposal ``p`` (a :class:`~routepack_opt.heuristics.anneal.proposal.Proposal`)
    with its :class:`~routepack_opt.heuristics.anneal.proposal.Evaluation` ``ev``: the moved
    samples' places, the cells' token sums, the open-cell set, the touched blocks' attention
    tables, expert loads, expert sums and costs, and the aggregates."""
    n_cells = pb.R * pb.D
    if p.kind == ROTATE:
        rotate_members(st, pb, p)
    else:
        move_members(st, pb, p)
    a, bc = p.a, p.bc
    st.T[a] = p.Ta
    st.Q[a] = p.Qa
    st.T[bc] = p.Tb
    st.Q[bc] = p.Qb
    set_open(st.opn, a, pb.C - p.Ta >= pb.lengths[0], n_cells)
    set_open(st.opn, bc, pb.C - p.Tb >= pb.lengths[0], n_cells)
    ra, ga, rb, gb = p.ra, p.ga, p.rb, p.gb
    A = ra * pb.G + ga
    B = rb * pb.G + gb
    dA = ev.JA - st.J[A]
    st.J[A] = ev.JA
    attn_top2(st.T, st.Q, ra, ga, pb.P, pb.alpha, pb.beta, pb.D, st.At, A)
    if A != B:
        attn_top2(st.T, st.Q, rb, gb, pb.P, pb.alpha, pb.beta, pb.D, st.At, B)
        w_swap(st.W, A, B, pb.b, p.i, p.j, pb.L * pb.Pp)
        st.Msum[A] = ev.MA
        st.Msum[B] = ev.MB
        dB = ev.JB - st.J[B]
        st.J[B] = ev.JB
        update_aggregates(st, pb, ra, ga, dA, rb, gb, dB, ev.dtot)
    else:
        update_aggregates(st, pb, ra, ga, dA, -1, -1, 0.0, ev.dtot)


class Population:
    """K replicas of one :class:`~routepack_opt.heuristics.anneal.problem.Instance`:
    :attr:`state` (a stacked :class:`State`) and :attr:`walk` (a stacked :class:`Walk`, no
    probe). The compiled walk itself is :mod:`routepack_opt.heuristics.anneal.moves`."""

    @staticmethod
    def bytes_per_replica(inst: Instance) -> int:
        """Memory of one replica (its :class:`State` and :class:`Walk` rows), as allocated below."""
        N, R, D, G, L, Pp = inst.N, inst.R, inst.D, inst.G, inst.L, inst.Pp
        C, X = R * D, R * G
        return (4 * 5 * N + 8 * 3 * C + 4 * C * inst.cap + X * L * Pp * np.dtype(inst.wdtype).itemsize
                + 8 * X * (2 + 3 * len(inst.alpha)) + 8 * (G + R) + 4 * (2 * C + 1) + 256)

    def __init__(self, inst: Instance, K: int):
        N, R, D, G, L, Pp = inst.N, inst.R, inst.D, inst.G, inst.L, inst.Pp
        C, X = R * D, R * G
        self.inst = inst
        self.K = K
        self.state = State(
            row=np.zeros((K, N), dtype=np.int32), slot=np.zeros((K, N), dtype=np.int32),
            cnt=np.zeros((K, C), dtype=np.int64),
            # member-major: the few members most cells have lie in a few KB (cell-major rows of
            # ``cap`` entries were cache misses)
            memb=np.zeros((K, C * inst.cap), dtype=np.int32), pos=np.zeros((K, N), dtype=np.int32),
            T=np.zeros((K, C), dtype=np.int64), Q=np.zeros((K, C), dtype=np.int64),
            W=np.zeros((K, X, L * Pp), dtype=inst.wdtype), Msum=np.zeros((K, X), dtype=np.int64),
            J=np.zeros((K, X)), colsum=np.zeros((K, G)), rowmax=np.zeros((K, R)),
            agg=np.zeros((K, 7)), At=np.zeros((K, X * len(inst.alpha) * 3)),
            opn=np.zeros((K, 2 * C + 1), dtype=np.int32))
        self.walk = Walk(
            rng=np.ones((K, 4), dtype=np.uint64), best_row=np.zeros((K, N), dtype=np.int32),
            best_slot=np.zeros((K, N), dtype=np.int32), best_e=np.full(K, np.inf),
            counters=np.zeros((K, 4), dtype=np.int64), last=np.zeros((K, 3)),
            probe=np.zeros((K, 0)))

    def init(self, rows_KN, slots_KN) -> None:
        """Every replica's state from its internal layout (see ``Instance.check_layout``)."""
        self.state.row[:] = rows_KN
        self.state.slot[:] = slots_KN
        init_population(self.state, self.inst.problem)

    def take(self, parents: np.ndarray) -> None:
        """Replica k becomes a copy of replica parents[k] (resampling)."""
        for arr in self.state:
            arr[:] = arr[parents]

    def layout(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Replica k's layout in the caller's order (row_N, slot_N)."""
        return self.inst.external(self.state.row[k], self.state.slot[k])

    @property
    def energy(self) -> np.ndarray:
        return self.state.agg[:, 3]

"""Karmarkar–Karp partitioning and the cap repair: the pieces the length-only baselines
(:mod:`routepack_opt.heuristics.baselines`) and the equal-count constructions
(:mod:`routepack_opt.heuristics.equal_counts`) share.

Legend: N samples, D DP slots, R rows (micro-batches per slot), C token cap of a micro-batch,
cell = (row, slot). A layout is ``(row_N, slot_N)``.
"""

from __future__ import annotations

import time

import numba
import numpy as np

from routepack_opt.core.errors import InfeasibleError, InputError
from routepack_opt.core.layout import check_rows
from routepack_opt.core.sizing import too_costly
from routepack_opt.core.topology import Topology

__all__ = ["kk_partition", "prepare_lengths", "check_layout", "repair_capacity", "order_rows"]


# ------------------------------------------------------------------ Karmarkar–Karp (k-way LDM)


@numba.njit(cache=True)
def _heap_less(spread, sid, a, b):
    # max-spread first; equal spreads: lower state id first (deterministic)
    return spread[a] > spread[b] or (spread[a] == spread[b] and sid[a] < sid[b])


@numba.njit(cache=True)
def _heap_push(heap, size, spread, sid, s):
    heap[size] = s
    i = size
    while i > 0:
        parent = (i - 1) // 2
        if _heap_less(spread, sid, heap[i], heap[parent]):
            heap[i], heap[parent] = heap[parent], heap[i]
            i = parent
        else:
            break
    return size + 1


@numba.njit(cache=True)
def _heap_pop(heap, size, spread, sid):
    top = heap[0]
    size -= 1
    heap[0] = heap[size]
    i = 0
    while True:
        left = 2 * i + 1
        if left >= size:
            break
        child = left
        if left + 1 < size and _heap_less(spread, sid, heap[left + 1], heap[left]):
            child = left + 1
        if _heap_less(spread, sid, heap[child], heap[i]):
            heap[i], heap[child] = heap[child], heap[i]
            i = child
        else:
            break
    return top, size


@numba.njit(cache=True)
def _sort_state(sums_k, head_k):
    order = np.argsort(-sums_k, kind="mergesort")
    s = sums_k[order].copy()
    h = head_k[order].copy()
    sums_k[:] = s
    head_k[:] = h


@numba.njit(cache=True)
def _kk_kernel(values_n, k, chunk):
    """k-way largest differencing. Items sorted ascending (stable) form initial states of
    ``chunk`` items, one per set (``chunk = k``: equal sizes; the partial chunk is the lightest;
    ``chunk = 1``: free sizes). Repeatedly merge the two states of largest spread, pairing the
    heaviest set of one with the lightest of the other. Returns the part of each item, parts
    numbered by decreasing sum."""
    n = values_n.size
    order = np.argsort(values_n, kind="mergesort")
    S = (n + chunk - 1) // chunk
    sums = np.zeros((S, k), dtype=np.float64)
    head = np.full((S, k), -1, dtype=np.int64)
    nxt = np.full(n, -1, dtype=np.int64)
    tail = np.arange(n)
    spread = np.zeros(S, dtype=np.float64)
    sid = np.arange(S)
    heap = np.empty(S, dtype=np.int64)
    size = np.int64(0)
    first = n - (S - 1) * chunk
    pos = 0
    for s in range(S):
        m = first if s == 0 else chunk
        for t in range(m):
            it = order[pos]
            pos += 1
            sums[s, t] = values_n[it]
            head[s, t] = it
        _sort_state(sums[s], head[s])
        spread[s] = sums[s, 0] - sums[s, k - 1]
        size = _heap_push(heap, size, spread, sid, s)
    while size > 1:
        s0, size = _heap_pop(heap, size, spread, sid)
        s1, size = _heap_pop(heap, size, spread, sid)
        for i in range(k):
            j = k - 1 - i
            sums[s0, i] += sums[s1, j]
            h0 = head[s0, i]
            h1 = head[s1, j]
            if h0 < 0:
                head[s0, i] = h1
            elif h1 >= 0:
                nxt[tail[h0]] = h1
                tail[h0] = tail[h1]
        _sort_state(sums[s0], head[s0])
        spread[s0] = sums[s0, 0] - sums[s0, k - 1]
        size = _heap_push(heap, size, spread, sid, s0)
    part = np.full(n, -1, dtype=np.int64)
    last = heap[0]
    for i in range(k):
        it = head[last, i]
        while it >= 0:
            part[it] = i
            it = nxt[it]
    return part


def kk_partition(values, k: int, equal_size: bool = False) -> np.ndarray:
    """Karmarkar–Karp k-way partition of ``values``: the part (0..k-1, by decreasing sum) of each
    item. ``equal_size``: part sizes differ by at most one (verl's ``equal_size``; exact when
    k divides n). With n ≥ k positive values every part is nonempty."""
    v = np.ascontiguousarray(values, dtype=np.float64)
    if v.ndim != 1 or k < 1:
        raise InputError(f"kk_partition: need 1-d values and k ≥ 1, got shape {v.shape}, k={k}")
    if v.size == 0 or k == 1:  # one part holds everything (the kernel's n merges would take a second at 10⁶)
        return np.zeros(v.size, dtype=np.int64)
    # the kernel keeps a k-tuple per state (16 bytes a set) and sorts one per merge: memory and
    # time grow as n × k (at 200,000 samples in 100,000 micro-batches, 320 GB); sized first
    S = -(-v.size // (int(k) if equal_size else 1))
    why = too_costly(f"kk_partition into {k} parts", nbytes=16.0 * S * k,
                     seconds=_KK_S_PER_STEP * S * k * max(1.0, np.log2(k)), time_left=_KK_MAX_S)
    if why is not None:
        raise InfeasibleError(why)
    return _kk_kernel(v, int(k), int(k) if equal_size else 1)


_KK_S_PER_STEP, _KK_MAX_S = 3e-9, 5.0  # per (state, set, log k) step; the longest KK a caller gets


# ------------------------------------------------------------------ feasibility and repair


def check_lengths(lengths, capacity: int) -> np.ndarray:
    """``lengths`` as a nonempty int64 vector of samples of 1..``capacity`` tokens (InputError for
    a bad vector, InfeasibleError naming the samples longer than the capacity)."""
    len_N = np.asarray(lengths)
    if len_N.ndim != 1 or len_N.size == 0:
        raise InputError(f"lengths: expected a nonempty 1-d array, got shape {len_N.shape}")
    len_N = len_N.astype(np.int64)
    if (len_N < 1).any():
        raise InputError("lengths: every sample needs at least 1 token")
    if len_N.max() > capacity:
        raise InfeasibleError(f"samples {np.flatnonzero(len_N > capacity)[:8].tolist()} are longer than the "
                              f"capacity {capacity}")
    return len_N


def prepare_lengths(lengths, topology: Topology, rows) -> tuple[np.ndarray, int, int, int]:
    len_N = check_lengths(lengths, topology.capacity)
    R, D, C = check_rows(rows), topology.dp, topology.capacity
    N = len_N.size
    if R * D > N:
        raise InfeasibleError(f"{R}×{D} = {R * D} cells need at least that many samples; the window has {N}")
    if -(-int(len_N.sum()) // C) > R * D:
        raise InfeasibleError(f"{int(len_N.sum())} tokens do not fit in {R}×{D} cells of capacity {C}")
    return len_N, R, D, C


def check_layout(lengths, row_N, slot_N, rows: int, dp: int, capacity: int) -> bool:
    """Coverage (each sample in one cell of the R × D grid), capacity and nonempty cells."""
    row_N = np.asarray(row_N)
    slot_N = np.asarray(slot_N)
    n = np.asarray(lengths).size
    if row_N.shape != (n,) or slot_N.shape != (n,):
        return False
    if row_N.min() < 0 or row_N.max() >= rows or slot_N.min() < 0 or slot_N.max() >= dp:
        return False
    cell = row_N * dp + slot_N
    members = np.bincount(cell, minlength=rows * dp)
    tokens = np.bincount(cell, weights=np.asarray(lengths, dtype=np.float64), minlength=rows * dp)
    return bool((members >= 1).all() and (tokens <= capacity).all())


@numba.njit(cache=True, inline='always')
def _link(i, k, head, nxt, prv):
    """Sample i into cell k's member list (at its head)."""
    q = head[k]
    nxt[i] = q
    prv[i] = -1
    if q >= 0:
        prv[q] = i
    head[k] = i


@numba.njit(cache=True, inline='always')
def _unlink(i, k, head, nxt, prv):
    """Sample i out of cell k's member list."""
    p = prv[i]
    q = nxt[i]
    if p >= 0:
        nxt[p] = q
    else:
        head[k] = q
    if q >= 0:
        prv[q] = p


@numba.njit(cache=True)
def _members(c, head, nxt, out):
    """The samples of cell c into ``out``, ascending; their count."""
    n = 0
    i = head[c]
    while i >= 0:
        out[n] = i
        n += 1
        i = nxt[i]
    for a in range(1, n):  # insertion sort: a cell holds few samples
        v = out[a]
        b = a - 1
        while b >= 0 and out[b] > v:
            out[b + 1] = out[b]
            b -= 1
        out[b + 1] = v
    return n


@numba.njit(cache=True)
def _first_fit_in_group(len_N, cell_N, tokens, C, c, by_len, lo, hi, d):
    """The first sample j of by_len[lo:hi] (one length, ascending index) outside cell c whose
    cell has room for d more tokens; −1: none."""
    for q in range(lo, hi):
        j = by_len[q]
        k = cell_N[j]
        if k != c and d <= C - tokens[k]:
            return j
    return -1


@numba.njit(cache=True, inline='always')
def _roomiest_cell(tokens, C, c, first, step):
    """(cell, room) of the cell other than c with the most room among cells first, first + step,
    … (ties: the lowest); (−1, −1) if none."""
    dest = -1
    room = -1
    for k in range(first, tokens.size, step):
        if k != c and C - tokens[k] > room:
            room = C - tokens[k]
            dest = k
    return dest, room


@numba.njit(cache=True, inline='always')
def _sample_to_move(len_N, members, nm, room, excess):
    """Of ``members[:nm]``, the smallest sample that removes the whole excess, else the largest
    that fits ``room`` (ties: the lower id); −1: none fits."""
    chosen = -1
    for t in range(nm):
        i = members[t]
        if len_N[i] > room:
            continue
        if chosen < 0:
            chosen = i
            continue
        a, b = len_N[i], len_N[chosen]
        if b >= excess:
            if excess <= a < b:
                chosen = i
        elif a > b:
            chosen = i
    return chosen


@numba.njit(cache=True, inline='always')
def _n_le(sorted_len, v):
    """How many samples have length ≤ v (``sorted_len``: the lengths ascending). A search, not a
    table over 0..max length: lengths reach 2^31 − 1 (a table was 17 GB there)."""
    return np.searchsorted(sorted_len, v, side="right")


@numba.njit(cache=True, inline='always')
def _swap_partner(len_N, cell_N, tokens, C, c, by_len, n_le, li, excess, max_room):
    """(score, partner) for a sample of length li in overfull cell c: a partner of length lv
    moves d = li − lv tokens; score 2C − d if d ≥ excess (the smallest such d: longest partner
    first), else d (the largest: shortest partner first); (0, −1): no partner."""
    p = _n_le(n_le, li - excess) - 1 if li - excess >= 1 else -1
    while p >= 0:  # lengths ≤ li − excess, longest first
        lv = len_N[by_len[p]]
        if li - lv > max_room:
            break
        g0 = _n_le(n_le, lv - 1)
        j = _first_fit_in_group(len_N, cell_N, tokens, C, c, by_len, g0, p + 1, li - lv)
        if j >= 0:
            return 2 * C - (li - lv), j
        p = g0 - 1
    lo = max(1, li - excess + 1, li - max_room)
    if lo <= li - 1:
        p = _n_le(n_le, lo - 1)
        end = _n_le(n_le, li - 1)
        while p < end:  # lengths in (li − excess, li), shortest first
            lv = len_N[by_len[p]]
            g1 = _n_le(n_le, lv)
            j = _first_fit_in_group(len_N, cell_N, tokens, C, c, by_len, p, g1, li - lv)
            if j >= 0:
                return li - lv, j
            p = g1
    return 0, -1


@numba.njit(cache=True, inline='always')
def _move_sample(i, c, k, len_N, cell_N, tokens, head, nxt, prv):
    """Sample i from cell c to cell k."""
    _unlink(i, c, head, nxt, prv)
    _link(i, k, head, nxt, prv)
    cell_N[i] = k
    tokens[c] -= len_N[i]
    tokens[k] += len_N[i]


@numba.njit(cache=True, inline='always')
def _swap_samples(i, j, c, len_N, cell_N, tokens, head, nxt, prv):
    """Sample i of cell c with sample j of another cell."""
    k = cell_N[j]
    _unlink(i, c, head, nxt, prv)
    _unlink(j, k, head, nxt, prv)
    _link(i, k, head, nxt, prv)
    _link(j, c, head, nxt, prv)
    cell_N[i] = k
    cell_N[j] = c
    d = len_N[i] - len_N[j]
    tokens[c] -= d
    tokens[k] += d


@numba.njit(cache=True)
def _repair_step(len_N, cell_N, tokens, D, c, C, head, nxt, prv, by_len, n_le, buf):
    """One overflow-lowering step on overfull cell c (in place); False if none exists.

    Move one of its samples to the cell with the most room where it fits (same slot preferred;
    the smallest sample that removes the whole excess, else the largest that fits; the source
    keeps ≥ 1 sample); if none fits anywhere, swap one of its samples with a shorter sample of
    another cell that has room for the difference (the smallest difference that removes the
    whole excess, else the largest; ties: the lowest sample ids).

    The cells' member lists (``head``, ``nxt``, ``prv``) and the samples in length order
    (``by_len``, ids ascending within a length; ``n_le``: the lengths in that order, so that
    ``_n_le(n_le, v)`` = #samples of length ≤ v) make a
    step O(K + |c|·s) with s the samples of the lengths a swap could use, instead of
    O(K + |c|·N): at N = 32,768 a few thousand swap steps took 2.4 s. ``buf``: [N] scratch."""
    excess = tokens[c] - C
    nm = _members(c, head, nxt, buf)
    # the roomiest other cell, once: the move's destination in any slot and the most a swap can move
    dest_any, room_any = _roomiest_cell(tokens, C, c, 0, 1)
    if nm >= 2:
        for same in (True, False):
            dest, room = dest_any, room_any
            if same:  # the cells of c's slot only: k ≡ c (mod D), ascending
                dest, room = _roomiest_cell(tokens, C, c, c % D, D)
            if dest < 0:
                continue
            chosen = _sample_to_move(len_N, buf, nm, room, excess)
            if chosen >= 0:
                _move_sample(chosen, c, dest, len_N, cell_N, tokens, head, nxt, prv)
                return True
    max_room = max(0, room_any)  # no swap can move more tokens than the roomiest other cell takes
    best_i = -1
    best_j = -1
    best_score = 0
    for t in range(nm):
        i = buf[t]
        score, j = _swap_partner(len_N, cell_N, tokens, C, c, by_len, n_le, len_N[i], excess, max_room)
        if score > best_score:
            best_score = score
            best_i = i
            best_j = j
    if best_i < 0:
        return False
    _swap_samples(best_i, best_j, c, len_N, cell_N, tokens, head, nxt, prv)
    return True


@numba.njit(cache=True)
def _repair_cells(len_N, cell_N, tokens, D, C, cells, head, nxt, prv, by_len, n_le, buf):
    """Repair steps on each of ``cells`` (in order) while it is overfull; True if any step."""
    progress = False
    for c in cells:
        while tokens[c] > C and _repair_step(len_N, cell_N, tokens, D, c, C, head, nxt, prv,
                                             by_len, n_le, buf):
            progress = True
    return progress


@numba.njit(cache=True)
def _member_lists(cell_N, K):
    """head [K], nxt [N], prv [N]: each cell's samples as a doubly linked list."""
    N = cell_N.size
    head = np.full(K, -1, dtype=np.int64)
    nxt = np.full(N, -1, dtype=np.int64)
    prv = np.full(N, -1, dtype=np.int64)
    for i in range(N - 1, -1, -1):
        _link(i, cell_N[i], head, nxt, prv)
    return head, nxt, prv


_REPAIR_PIECE_OPS = 2e7  # ~ work per compiled call of the repair (a few ms): clock checks between


def repair_capacity(len_N, cell_N, R: int, D: int, C: int, deadline: float | None = None) -> bool:
    """Make every cell fit the cap by moves and swaps (``cell_N`` changed in place), in passes
    over the overfull cells, worst first. Every step lowers the total overflow and creates none,
    so this ends; returns whether all cells now fit (False: a pass made no step, or the
    ``time.perf_counter()`` ``deadline`` passed). A step costs O(R·D) plus the partners a swap
    could use: with thousands of overfull cells the passes take a while, so they run in pieces
    with the clock checked."""
    len_N = np.ascontiguousarray(len_N, dtype=np.int64)
    cell_N_ = np.asarray(cell_N)
    tokens = np.bincount(cell_N_, weights=len_N, minlength=R * D).astype(np.int64)
    head, nxt, prv = _member_lists(cell_N_.astype(np.int64), R * D)
    by_len = np.argsort(len_N, kind="stable").astype(np.int64)
    n_le = len_N[by_len]  # ascending: #samples of length ≤ v by a search (_n_le), O(N) memory at any length
    buf = np.empty(len_N.size, dtype=np.int64)
    piece = max(1, int(_REPAIR_PIECE_OPS // (len_N.size + R * D)))  # cells per compiled call
    while True:
        over = np.flatnonzero(tokens > C)
        if over.size == 0:
            return True
        over = over[np.argsort(-tokens[over], kind="mergesort")]
        progress = False
        for start in range(0, over.size, piece):
            progress |= bool(_repair_cells(len_N, cell_N, tokens, D, C, over[start:start + piece],
                                           head, nxt, prv, by_len, n_le, buf))
            if deadline is not None and time.perf_counter() >= deadline:
                return False
        if not progress:
            return False


def order_rows(len_N, row_N, slot_N, R: int, D: int):
    """Renumber rows inside every slot by decreasing tokens (ties: old row)."""
    cell_N = row_N * D + slot_N
    tok_RD = np.bincount(cell_N, weights=len_N, minlength=R * D).reshape(R, D)
    rank_RD = np.empty((R, D), dtype=np.int64)
    order_RD = np.argsort(-tok_RD, axis=0, kind="stable")
    rank_RD[order_RD, np.arange(D)[None, :]] = np.arange(R)[:, None]
    return rank_RD[row_N, slot_N], slot_N

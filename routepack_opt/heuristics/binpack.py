"""One-dimensional bin packing: constructive packings and local search.

Used by the R* certifier (docs/pipeline.md, step 2): a layout with R rows exists iff the sample lengths
fit in R·D bins of capacity C. The lower bounds (L1, L2, DFF), the size check and the packing
check live in :mod:`routepack_opt.core.bounds`, shared with the exact models.

Legend: ``sizes_N`` item sizes (ints, 1 ≤ s ≤ C), ``bin_N`` the bin of each item (0..B-1).

Packings (numba, O(N log N) at every capacity): :func:`first_fit_decreasing` (segment tree over
bins) and :func:`best_fit_decreasing` (Fenwick tree over residual capacities up to 2^22, a treap of
the open bins above; Johnson 1973). Both return
``bin_N`` in the caller's item order. :func:`minimum_bin_slack` is the stronger (and slower)
MBS' heuristic of Fleszar & Hindi (2002), with seeded random restarts.
"""

from __future__ import annotations

import heapq
import time

import numba
import numpy as np

from routepack_opt.core.bounds import check_sizes

__all__ = ["first_fit_decreasing", "best_fit_decreasing", "best_packing", "minimum_bin_slack",
           "fixed_bins_search", "bins_used", "warm_kernels"]


# ---------------------------------------------------------------- constructive packings


@numba.njit(cache=True)
def _ffd_kernel(s_desc, C):
    """First fit over items in the given order; segment tree of residuals over bins."""
    n = s_desc.size
    size = 1
    while size < max(n, 1):
        size *= 2
    tree = np.zeros(2 * size, dtype=np.int64)  # max residual in subtree; unopened bins hold C
    for i in range(size):
        tree[size + i] = C if i < n else -1
    for i in range(size - 1, 0, -1):
        tree[i] = max(tree[2 * i], tree[2 * i + 1])
    out = np.empty(n, dtype=np.int64)
    used = 0
    for j in range(n):
        w = s_desc[j]
        node = 1
        while node < size:  # leftmost leaf with residual ≥ w
            node = 2 * node if tree[2 * node] >= w else 2 * node + 1
        b = node - size
        out[j] = b
        if b + 1 > used:
            used = b + 1
        tree[node] -= w
        node //= 2
        while node >= 1:
            tree[node] = max(tree[2 * node], tree[2 * node + 1])
            node //= 2
    return out, used


@numba.njit(cache=True)
def _bfd_fenwick(s_desc, C):
    """Best fit: Fenwick tree counting open bins per residual 0..C, a bin stack per residual."""
    n = s_desc.size
    fen = np.zeros(C + 2, dtype=np.int64)  # 1-based over residual r ↦ index r+1
    head = np.full(C + 1, -1, dtype=np.int64)
    nxt = np.full(n, -1, dtype=np.int64)
    out = np.empty(n, dtype=np.int64)
    LOG = 1
    while LOG * 2 <= C + 1:
        LOG *= 2
    used = 0
    for j in range(n):
        w = s_desc[j]
        # count of open bins with residual < w
        c = 0
        i = w  # residuals 0..w-1 ↦ indices 1..w
        while i > 0:
            c += fen[i]
            i -= i & (-i)
        # find the (c+1)-th open bin by residual (smallest residual ≥ w), if any
        pos = 0
        rem = c + 1
        step = LOG
        while step > 0:
            if pos + step <= C + 1 and fen[pos + step] < rem:
                pos += step
                rem -= fen[pos]
            step //= 2
        r = pos  # index pos+1 ↦ residual pos
        if r <= C:
            b = head[r]
            head[r] = nxt[b]
            i = r + 1
            while i <= C + 1:
                fen[i] -= 1
                i += i & (-i)
        else:
            b = used
            used += 1
            r = C
        out[j] = b
        r2 = r - w
        nxt[b] = head[r2]
        head[r2] = b
        i = r2 + 1
        while i <= C + 1:
            fen[i] += 1
            i += i & (-i)
    return out, used


@numba.njit(cache=True, inline='always')
def _rotate_up(x, left, right, parent, root):
    """Rotate node ``x`` above its parent (in-order kept); ``root[0]`` follows."""
    p = parent[x]
    g = parent[p]
    if left[p] == x:
        left[p] = right[x]
        if right[x] >= 0:
            parent[right[x]] = p
        right[x] = p
    else:
        right[p] = left[x]
        if left[x] >= 0:
            parent[left[x]] = p
        left[x] = p
    parent[p] = x
    parent[x] = g
    if g < 0:
        root[0] = x
    elif left[g] == p:
        left[g] = x
    else:
        right[g] = x


@numba.njit(cache=True)
def _bfd_treap(s_desc, C, deadline):
    """Best fit with the open bins in a treap keyed by residual (node = bin id; Seidel & Aragon
    1996): the fullest bin an item fits is the leftmost node with residual ≥ w, O(log bins) an
    item at any capacity. An inserted bin goes before the bins of equal residual, so ties go to
    the bin changed last, exactly as the Fenwick kernel's stacks do (same packing). The clock is
    read every 2^15 items (an object-mode call): past ``deadline`` it stops, returning used = −1."""
    n = s_desc.size
    key = np.empty(n, dtype=np.int64)
    left = np.full(n, -1, dtype=np.int64)
    right = np.full(n, -1, dtype=np.int64)
    parent = np.full(n, -1, dtype=np.int64)
    prio = np.empty(n, dtype=np.uint64)
    h = np.uint64(0x9E3779B97F4A7C15)
    for b in range(n):  # fixed pseudo-random priorities (splitmix64): deterministic
        h += np.uint64(0x9E3779B97F4A7C15)
        z = h
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        prio[b] = z ^ (z >> np.uint64(31))
    root = np.full(1, -1, dtype=np.int64)
    out = np.empty(n, dtype=np.int64)
    used = 0
    for j in range(n):
        if (j & 32767) == 0:  # from the first item on (so that a warm-up compiles this block too)
            with numba.objmode(now="float64"):
                now = time.perf_counter()
            if now > deadline:
                return out, -1
        w = s_desc[j]
        # the leftmost node with key ≥ w
        b = -1
        cur = root[0]
        while cur >= 0:
            if key[cur] >= w:
                b = cur
                cur = left[cur]
            else:
                cur = right[cur]
        if b >= 0:  # take it out: rotate it down to a leaf, then cut it off
            while left[b] >= 0 or right[b] >= 0:
                if right[b] < 0 or (left[b] >= 0 and prio[left[b]] > prio[right[b]]):
                    _rotate_up(left[b], left, right, parent, root)
                else:
                    _rotate_up(right[b], left, right, parent, root)
            p = parent[b]
            if p < 0:
                root[0] = -1
            elif left[p] == b:
                left[p] = -1
            else:
                right[p] = -1
            parent[b] = -1
        else:
            b = used
            used += 1
            key[b] = C
        out[j] = b
        key[b] -= w
        # insert b before every node of equal key
        r = key[b]
        cur = root[0]
        if cur < 0:
            root[0] = b
        else:
            while True:
                if r <= key[cur]:
                    if left[cur] < 0:
                        left[cur] = b
                        break
                    cur = left[cur]
                else:
                    if right[cur] < 0:
                        right[cur] = b
                        break
                    cur = right[cur]
            parent[b] = cur
            while parent[b] >= 0 and prio[b] > prio[parent[b]]:
                _rotate_up(b, left, right, parent, root)
    return out, used


_FENWICK_MAX_C = 1 << 22


def _decreasing(sizes_N: np.ndarray) -> np.ndarray:
    return np.argsort(-sizes_N, kind="stable")


def first_fit_decreasing(sizes, capacity) -> tuple[np.ndarray, int]:
    """FFD: items by decreasing size, each into the first open bin it fits (Johnson 1973).

    Returns ``(bin_N, bins_used)``; ``bin_N`` follows the caller's item order.
    """
    sizes_N, C = check_sizes(sizes, capacity)
    order = _decreasing(sizes_N)
    b_sorted, used = _ffd_kernel(sizes_N[order], C)
    bin_N = np.empty_like(b_sorted)
    bin_N[order] = b_sorted
    return bin_N, int(used)


def best_fit_decreasing(sizes, capacity, *, deadline: float | None = None) -> tuple[np.ndarray, int] | None:
    """BFD: items by decreasing size, each into the fullest open bin it fits.

    O(N log N) at every capacity: a Fenwick tree over the residuals up to C = 2^22 (16 bytes a
    unit of capacity), above it a treap of the open bins (the same packing). Returns
    ``(bin_N, bins_used)``; ``bin_N`` follows the caller's item order. With ``deadline`` (a
    ``time.perf_counter()`` value) the large-capacity kernel stops past it and returns None.
    """
    sizes_N, C = check_sizes(sizes, capacity)
    order = _decreasing(sizes_N)
    return _bfd_ordered(sizes_N, C, order, deadline)


def _bfd_ordered(sizes_N, C: int, order, deadline: float | None):
    if C <= _FENWICK_MAX_C:
        b_sorted, used = _bfd_fenwick(sizes_N[order], C)
    else:
        b_sorted, used = _bfd_treap(sizes_N[order], C, np.inf if deadline is None else float(deadline))
        if used < 0:
            return None
    bin_N = np.empty_like(b_sorted)
    bin_N[order] = b_sorted
    return bin_N, int(used)


def best_packing(sizes, capacity, *, deadline: float | None = None) -> tuple[np.ndarray, int, str]:
    """The better of FFD and BFD: ``(bin_N, bins_used, name)``; FFD alone when BFD does not
    finish by ``deadline`` (see :func:`best_fit_decreasing`). One sort serves both."""
    sizes_N, C = check_sizes(sizes, capacity)
    order = _decreasing(sizes_N)
    b_sorted, nf = _ffd_kernel(sizes_N[order], C)
    f = np.empty_like(b_sorted)
    f[order] = b_sorted
    bfd = _bfd_ordered(sizes_N, C, order, deadline)
    if bfd is None or nf <= bfd[1]:
        return f, int(nf), "FFD"
    return bfd[0], bfd[1], "BFD"


def bins_used(bin_N) -> int:
    """Number of distinct bins a packing uses."""
    return int(np.unique(np.asarray(bin_N)).size)




# ---------------------------------------------------------------- minimum bin slack (MBS')


@numba.njit(cache=True, inline='always')
def _least_slack_subset(cs, m, res0, suffix, node_limit, chosen, best, next_start, last_tried):
    """MBS' search for one bin: a subset of ``cs[:m]`` (sizes in order; ``suffix`` their suffix
    sums) of least slack under ``res0``, depth first, equal sizes tried once per level, pruned
    by suffix sums; stops at slack 0 or after ``node_limit`` nodes. Its positions go to
    ``best``; returns how many."""
    best_slack = res0
    best_cnt = 0
    if suffix[0] <= res0:  # everything left fits: take it all
        for p in range(m):
            best[p] = p
        return m
    res = res0
    depth = 0
    next_start[0] = 0
    last_tried[0] = -1
    nodes = 0
    while depth >= 0 and best_slack > 0 and nodes < node_limit:
        p = next_start[depth]
        while p < m and (cs[p] > res or cs[p] == last_tried[depth]):
            p += 1
        if p < m and res - suffix[p] < best_slack:
            nodes += 1
            last_tried[depth] = cs[p]
            next_start[depth] = p + 1
            chosen[depth] = p
            res -= cs[p]
            if res < best_slack:
                best_slack = res
                best_cnt = depth + 1
                for q in range(depth + 1):
                    best[q] = chosen[q]
            depth += 1
            next_start[depth] = p + 1
            last_tried[depth] = -1
        else:
            depth -= 1
            if depth >= 0:
                res += cs[chosen[depth]]
    return best_cnt


@numba.njit(cache=True)
def _mbs_kernel(s, C, node_limit, out, nbins, deadline):
    """MBS' (Fleszar & Hindi 2002) over items in the given order (roughly decreasing).

    Bin by bin: fix the first remaining item, then a depth-first search over the other
    remaining items (:func:`_least_slack_subset`) finds a subset of least slack. Continues the packing
    ``out`` (−1: not yet packed; ``nbins`` bins so far); after each bin the clock is read (an
    object-mode call, ~µs) and past ``deadline`` (a ``time.perf_counter()`` value; ``inf`` for
    none) it stops. Returns (bins, done). A bin scans every remaining item (O(N) per bin): tens
    of seconds at N = 65,536, and its search costs from nothing to ``node_limit`` nodes, so no
    count of bins sized from earlier ones bounds a call's time (that overshot 4 s by 0.9 s).
    """
    n = s.size
    alive = out < 0
    built = 0
    cand = np.empty(n, dtype=np.int64)
    cs = np.empty(n, dtype=np.int64)
    suffix = np.zeros(n + 1, dtype=np.int64)
    chosen = np.empty(n + 1, dtype=np.int64)
    best = np.empty(n + 1, dtype=np.int64)
    next_start = np.empty(n + 2, dtype=np.int64)
    last_tried = np.empty(n + 2, dtype=np.int64)
    first = 0
    while True:
        while first < n and not alive[first]:
            first += 1
        if first >= n:
            return nbins, True
        if built > 0:
            with numba.objmode(now="float64"):
                now = time.perf_counter()
            if now > deadline:
                return nbins, False
        built += 1
        alive[first] = False
        out[first] = nbins
        res0 = C - s[first]
        m = 0
        for i in range(first + 1, n):
            if alive[i] and s[i] <= res0:
                cand[m] = i
                cs[m] = s[i]
                m += 1
        suffix[m] = 0
        for p in range(m - 1, -1, -1):
            suffix[p] = suffix[p + 1] + cs[p]
        best_cnt = _least_slack_subset(cs, m, res0, suffix, node_limit, chosen, best, next_start, last_tried)
        for q in range(best_cnt):
            i = cand[best[q]]
            alive[i] = False
            out[i] = nbins
        nbins += 1


def _mbs_pass(s_sorted, C: int, node_limit: int, deadline: float | None):
    """One MBS' pass over ``s_sorted``: (bin_N, bins, done). If ``deadline`` (a
    ``time.perf_counter()`` value) passes first (checked after every bin), the items left (the
    smallest: MBS' opens each bin with the largest item left) go into new bins by the best of
    FFD/BFD and ``done`` is False — still a packing, usually far better than FFD/BFD alone."""
    out = np.full(s_sorted.size, -1, dtype=np.int64)
    nbins, done = _mbs_kernel(s_sorted, C, node_limit, out, 0, np.inf if deadline is None else deadline)
    if done:
        return out, int(nbins), True
    left = np.flatnonzero(out < 0)
    rest, used, _ = best_packing(s_sorted[left], C, deadline=deadline)  # past it: FFD alone
    out[left] = nbins + rest
    return out, int(nbins) + used, False


def minimum_bin_slack(sizes, capacity, restarts: int = 0, seed: int = 0,
                      node_limit: int = 20_000, target: int | None = None,
                      time_limit: float | None = None) -> tuple[np.ndarray, int]:
    """MBS' (Fleszar & Hindi 2002, "New heuristics for one-dimensional bin-packing",
    Computers & OR 29:821–839): bins built one at a time by a least-slack subset search.

    The first pass takes items by decreasing size; each of ``restarts`` further passes perturbs
    that order with seeded multiplicative noise (so the search meets other least-slack subsets).
    Stops early once ``target`` bins are reached or ``time_limit`` seconds pass (also inside a
    pass, which FFD/BFD then finish with the items left; never worse than FFD/BFD).
    Returns the best ``(bin_N, bins_used)`` in the caller's item order; deterministic for a seed.
    """
    sizes_N, C = check_sizes(sizes, capacity)
    if sizes_N.size == 0:
        return np.zeros(0, dtype=np.int64), 0
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    best_N, best_bins = None, None
    for r in range(restarts + 1):
        if r == 0:
            order = _decreasing(sizes_N)
        else:
            noise = rng.uniform(0.0, 0.3 * rng.uniform(), size=sizes_N.size)
            order = np.argsort(-(sizes_N * (1.0 + noise)), kind="stable")
        deadline = None if time_limit is None else t0 + time_limit
        b_sorted, used, done = _mbs_pass(sizes_N[order], C, node_limit, deadline)
        if not done and best_bins is None:  # out of time in the first pass: FFD (BFD in time) if better
            best_N, best_bins, _ = best_packing(sizes_N, C, deadline=deadline)
        if best_bins is None or used < best_bins:
            best_N = np.empty_like(b_sorted)
            best_N[order] = b_sorted
            best_bins = int(used)
        if not done or (target is not None and best_bins <= target):
            break
        if time_limit is not None and time.perf_counter() - t0 > time_limit:
            break
    return best_N, best_bins


# ---------------------------------------------------------------- overflow tabu search at fixed K


@numba.njit(cache=True)
def _ov(load, C):
    return load - C if load > C else 0


@numba.njit(cache=True)
def _group_by_bin(bin_of, K, cnt, start, members):
    """Bins → members (counting sort): bin b's items are members[start[b]:start[b + 1]]."""
    n = bin_of.size
    cnt[:] = 0
    for i in range(n):
        cnt[bin_of[i]] += 1
    start[0] = 0
    for b in range(K):
        start[b + 1] = start[b] + cnt[b]
    cnt[:] = 0
    for i in range(n):
        b = bin_of[i]
        members[start[b] + cnt[b]] = i
        cnt[b] += 1


@numba.njit(cache=True)
def _best_exchange(s, C, K, a, load, start, members, tabu, it, F, best_F, mv):
    """The best exchange between the overflowing bin ``a`` and another bin into ``mv`` (i1, i2, j1,
    j2, b; see :func:`_overflow_tabu`); a tabu move only when it reaches a new best overflow.
    Returns its change of overflow."""
    best_d = 1 << 60
    ties = 0
    for b in range(K):
        if b == a:
            continue
        before = _ov(load[a], C) + _ov(load[b], C)
        for p in range(start[a], start[a + 1]):
            i1 = members[p]
            # (1-0) and (1-1) and (1-2)
            for q in range(start[b] - 1, start[b + 1]):
                j1 = -1 if q < start[b] else members[q]
                for r in range(q, start[b + 1]):
                    j2 = -1
                    if r > q:
                        j2 = members[r]
                    elif r == q and q >= start[b]:
                        j2 = -1
                    if j1 < 0 and j2 >= 0:
                        continue
                    moved_b = (s[j1] if j1 >= 0 else 0) + (s[j2] if j2 >= 0 else 0)
                    diff = s[i1] - moved_b
                    if diff == 0:
                        continue
                    d = _ov(load[a] - diff, C) + _ov(load[b] + diff, C) - before
                    is_tabu = tabu[i1] > it or (j1 >= 0 and tabu[j1] > it) or (j2 >= 0 and tabu[j2] > it)
                    if is_tabu and F + d >= best_F:
                        continue
                    if d < best_d:
                        best_d = d
                        ties = 1
                        mv[0], mv[1], mv[2], mv[3], mv[4] = i1, -1, j1, j2, b
                    elif d == best_d:
                        ties += 1
                        if np.random.randint(ties) == 0:
                            mv[0], mv[1], mv[2], mv[3], mv[4] = i1, -1, j1, j2, b
                    if j1 < 0:
                        break
            # (2-1)
            for p2 in range(p + 1, start[a + 1]):
                i2 = members[p2]
                for q in range(start[b], start[b + 1]):
                    j1 = members[q]
                    diff = s[i1] + s[i2] - s[j1]
                    if diff == 0:
                        continue
                    d = _ov(load[a] - diff, C) + _ov(load[b] + diff, C) - before
                    is_tabu = tabu[i1] > it or tabu[i2] > it or tabu[j1] > it
                    if is_tabu and F + d >= best_F:
                        continue
                    if d < best_d:
                        best_d = d
                        ties = 1
                        mv[0], mv[1], mv[2], mv[3], mv[4] = i1, i2, j1, -1, b
                    elif d == best_d:
                        ties += 1
                        if np.random.randint(ties) == 0:
                            mv[0], mv[1], mv[2], mv[3], mv[4] = i1, i2, j1, -1, b
    return best_d


@numba.njit(cache=True)
def _overflow_tabu(s, C, K, bin_init, max_iters, seed, tenure, deadline, every):
    """Tabu search on K bins minimising total overflow Σ max(0, load − C).

    Each iteration takes a random overflowing bin a and the best exchange with another bin b:
    shift (1-0), swap (1-1), (2-1) and (1-2), scored by the change of overflow of a and b (ties
    broken at random). Moved items are tabu for ``tenure`` (+ random) iterations unless the move
    reaches a new best overflow. Every ``every`` iterations (from the first) the clock is read
    (an object-mode call, ~µs): past ``deadline`` (a ``time.perf_counter()`` value; ``inf`` for
    none) the run stops — an iteration costs milliseconds at N = 65,536, so large instances read
    it every iteration. Returns (bin_N, overflow).
    """
    np.random.seed(seed)
    n = s.size
    bin_of = bin_init.copy()
    load = np.zeros(K, dtype=np.int64)
    for i in range(n):
        load[bin_of[i]] += s[i]
    F = 0
    for b in range(K):
        F += _ov(load[b], C)
    best_F = F
    best_bin = bin_of.copy()
    tabu = np.zeros(n, dtype=np.int64)
    start = np.zeros(K + 1, dtype=np.int64)
    members = np.empty(n, dtype=np.int64)
    cnt = np.zeros(K, dtype=np.int64)
    for it in range(max_iters):
        if it % every == 0:
            with numba.objmode(now="float64"):
                now = time.perf_counter()
            if now > deadline:
                break
        if F == 0:
            break
        _group_by_bin(bin_of, K, cnt, start, members)
        # a random overflowing bin
        n_over = 0
        for b in range(K):
            if load[b] > C:
                n_over += 1
        pick = np.random.randint(n_over)
        a = -1
        for b in range(K):
            if load[b] > C:
                if pick == 0:
                    a = b
                    break
                pick -= 1
        mv = np.full(5, -1, dtype=np.int64)  # i1, i2, j1, j2, b
        best_d = _best_exchange(s, C, K, a, load, start, members, tabu, it, F, best_F, mv)
        if mv[4] < 0:
            continue
        b = mv[4]
        for k in range(2):
            i = mv[k]
            if i >= 0:
                bin_of[i] = b
                load[a] -= s[i]
                load[b] += s[i]
                tabu[i] = it + tenure + np.random.randint(tenure + 1)
        for k in range(2, 4):
            j = mv[k]
            if j >= 0:
                bin_of[j] = a
                load[b] -= s[j]
                load[a] += s[j]
                tabu[j] = it + tenure + np.random.randint(tenure + 1)
        F += best_d
        if F < best_F:
            best_F = F
            best_bin[:] = bin_of
    return best_bin, best_F


def fixed_bins_search(sizes, capacity, num_bins: int, start=None, *, max_iters: int = 20_000,
                      seed: int = 0, time_limit: float | None = None) -> np.ndarray | None:
    """Look for a packing into exactly ``num_bins`` bins by tabu search on total overflow.

    Starts from ``start`` (a packing, default the better of FFD/BFD) with its lightest bins
    dissolved into the rest (worst fit), then runs the exchange search of
    :func:`_overflow_tabu` (shifts and 1-1/2-1/1-2 swaps between an overflowing bin and any other,
    after Alvim et al. 2004, "A hybrid improvement heuristic for the one-dimensional bin packing
    problem", J. Heuristics 10:205–229). Seeded restarts until ``time_limit``. Returns a packing
    (``bin_N``) or None if none was found; deterministic for a seed and iteration budget.
    """
    t0 = time.perf_counter()
    sizes_N, C = check_sizes(sizes, capacity)
    K = int(num_bins)
    if sizes_N.size == 0:
        return np.zeros(0, dtype=np.int64)
    if K < 1 or int(sizes_N.sum()) > K * C:
        return None
    if start is None:
        start, _, _ = best_packing(sizes_N, C, deadline=None if time_limit is None else t0 + time_limit)
    _, bin_N = np.unique(np.asarray(start, dtype=np.int64), return_inverse=True)
    bin_N = bin_N.astype(np.int64)
    used = int(bin_N.max()) + 1
    if used <= K:
        return bin_N
    loads = np.bincount(bin_N, weights=sizes_N, minlength=used)
    order = np.argsort(loads, kind="stable")           # lightest bins dissolve
    keep = np.sort(order[used - K:])
    new_id = np.full(used, -1, dtype=np.int64)
    new_id[keep] = np.arange(K)
    init = new_id[bin_N]
    load = np.zeros(K, dtype=np.int64)
    np.add.at(load, init[init >= 0], sizes_N[init >= 0])
    loose = np.flatnonzero(init < 0)[np.argsort(-sizes_N[init < 0], kind="stable")].tolist()
    if len(loose) <= 32:
        for i in loose:
            b = int(np.argmin(load))                    # worst fit spreads the overflow
            init[i] = b
            load[b] += sizes_N[i]
    else:  # many items: a heap of (load, bin) makes the same choices in O(log K) each
        heap = list(zip(load.tolist(), range(K)))
        heapq.heapify(heap)
        for i in loose:
            ld, b = heapq.heappop(heap)
            init[i] = b
            heapq.heappush(heap, (ld + int(sizes_N[i]), b))
    tenure = max(3, min(20, sizes_N.size // 10))
    deadline = np.inf if time_limit is None else t0 + time_limit
    # an iteration is O(N + K): small instances read the clock every 16, large ones every time
    every = 16 if sizes_N.size + K <= 4096 else 1
    r = 0
    while True:
        found, F = _overflow_tabu(sizes_N, C, K, init, max_iters, seed + r, tenure, deadline, every)
        if F == 0:
            return found
        r += 1
        if time_limit is None or time.perf_counter() - t0 > time_limit:
            return None


def warm_kernels() -> None:
    """Compile (or load from numba's cache) every kernel here on a tiny instance, each of its
    clock reads included, so that no time limit pays for it (:mod:`routepack_opt.warmup`,
    group ``plan``; the certifier before its clock)."""
    sizes = np.array([35, 35, 34, 33, 30, 30, 29, 28, 27, 25, 24, 20], dtype=np.int64)
    best_packing(sizes, 64)
    best_packing(sizes << 20, 64 << 20)  # capacities above 2^22: BFD's treap
    minimum_bin_slack(sizes, 64, restarts=1, seed=0)
    # from one item per bin, so that the search itself runs (FFD alone meets L1 = 6 here)
    fixed_bins_search(sizes, 64, 6, start=np.arange(sizes.size), max_iters=50)
    # a triplet instance (Falkenauer's kind: 4 bins filled exactly) that FFD and BFD pack into 5
    # bins: the overflow tabu search on L1 = 4 bins runs its exchanges
    triplets = np.array([482, 431, 420, 377, 352, 345, 311, 303, 265, 258, 253, 203], dtype=np.int64)
    fixed_bins_search(triplets, 1000, 4, max_iters=200)

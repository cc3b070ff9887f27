"""The cap repair (heuristics.cells.repair_capacity) against a direct transcription of its rule:
every step scans all samples, so the indexed version (member lists, samples by length) must make
the same moves and swaps, in the same order, and end in the same layout."""

import numpy as np

from routepack_opt.heuristics import cells


def _reference_step(len_N, cell_N, tokens, D, c, C):
    """One step, as the rule reads (O(K + |c|·N))."""
    N, K = len_N.size, tokens.size
    excess = tokens[c] - C
    members = [i for i in range(N) if cell_N[i] == c]
    if len(members) >= 2:
        for same in (True, False):
            dest, room = -1, -1
            for k in range(K):
                if k != c and (not same or k % D == c % D) and C - tokens[k] > room:
                    room, dest = C - tokens[k], k
            if dest < 0:
                continue
            chosen = -1
            for i in members:  # smallest sufficient, else largest fitting (ties: lower id)
                if len_N[i] > room:
                    continue
                if chosen < 0:
                    chosen = i
                    continue
                a, b = len_N[i], len_N[chosen]
                if (b >= excess and excess <= a < b) or (b < excess and a > b):
                    chosen = i
            if chosen >= 0:
                cell_N[chosen] = dest
                tokens[c] -= len_N[chosen]
                tokens[dest] += len_N[chosen]
                return True
    best_i, best_j, best_score = -1, -1, 0
    for i in members:
        for j in range(N):
            k = cell_N[j]
            d = len_N[i] - len_N[j]
            if k == c or d <= 0 or d > C - tokens[k]:
                continue
            score = 2 * C - d if d >= excess else d
            if score > best_score:
                best_score, best_i, best_j = score, i, j
    if best_i < 0:
        return False
    k = cell_N[best_j]
    cell_N[best_i], cell_N[best_j] = k, c
    d = len_N[best_i] - len_N[best_j]
    tokens[c] -= d
    tokens[k] += d
    return True


def _reference(len_N, cell_N, R, D, C, step=_reference_step):
    tokens = np.bincount(cell_N, weights=len_N, minlength=R * D).astype(np.int64)
    while True:
        over = np.flatnonzero(tokens > C)
        if over.size == 0:
            return True
        over = over[np.argsort(-tokens[over], kind="mergesort")]
        progress = False
        for c in over:
            while tokens[c] > C and step(len_N, cell_N, tokens, D, c, C):
                progress = True
        if not progress:
            return False


def test_repair_matches_the_rule():
    """Random layouts from loose to over-full (repairable or not), slots of 1–4 cells: the same
    verdict and the same final layout as the transcription; the cases cover moves, swaps and
    failures."""
    seen = {"move": 0, "swap": 0, "fail": 0}
    step = _reference_step

    def counted(len_N, cell_N, tokens, D, c, C):
        before = cell_N.copy()
        done = step(len_N, cell_N, tokens, D, c, C)
        seen[{0: "fail", 1: "move", 2: "swap"}[int((before != cell_N).sum())]] += 1
        return done

    for seed in range(40):
        rng = np.random.default_rng(seed)
        R, D = int(rng.integers(2, 6)), int(rng.integers(1, 5))
        N = int(rng.integers(R * D, 6 * R * D))
        C = 100
        len_N = rng.integers(C // 10, C + 1, size=N)
        fill = rng.uniform(0.8, 1.05)
        len_N = np.clip((len_N * fill * R * D * C / len_N.sum()).astype(np.int64), 1, C)
        cell0 = rng.integers(0, R * D, size=N)
        want, got = cell0.copy(), cell0.copy()
        ok = _reference(len_N, want, R, D, C, counted)
        assert cells.repair_capacity(len_N, got, R, D, C) == ok
        assert np.array_equal(got, want)
    assert min(seen.values()) > 0, seen


def test_repair_with_swaps_only():
    """Every cell holds one sample too many tokens for any move (singletons and a full grid):
    only swaps can help, and they must be the transcription's."""
    rng = np.random.default_rng(7)
    for _ in range(20):
        R, D, C = 3, 4, 50
        len_N = rng.integers(20, 51, size=R * D * 2)
        cell0 = np.repeat(np.arange(R * D), 2)[rng.permutation(R * D * 2)]
        want, got = cell0.copy(), cell0.copy()
        assert cells.repair_capacity(len_N, got, R, D, C) == _reference(len_N, want, R, D, C)
        assert np.array_equal(got, want)

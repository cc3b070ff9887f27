"""Compiled projection of per-expert counts onto EP ranks (used by :func:`routepack_opt.core.evaluate.rank_loads`),
and the sum of the rank loads per (row, shard) block (:func:`routepack_opt.core.evaluate.row_shard_costs`).

A plain loop compiled with numba: one pass over ``counts[N, L, E]`` adding each expert's count
to its rank, samples split over the cores. About 9 ms at N=1024, L=48, E=256 on one core, against ~50 ms for the former
one-hot batched matmul (which also went through BLAS threads: slow on a busy machine). Integer
arithmetic, so exact. Kept in its own module so that importing the evaluator does not import
numba.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(cache=True, parallel=True)
def project_counts(counts_NLE, rank_LE, ep):
    """``b[i, l, p] = Σ_{e: rank_LE[l, e] = p} counts[i, l, e]`` (int64). Samples in parallel:
    each writes only its own row, in integers, so the result is the serial one."""
    N, L, E = counts_NLE.shape
    out = np.zeros((N, L, ep), dtype=np.int64)
    for i in prange(N):
        for l in range(L):
            for e in range(E):
                out[i, l, rank_LE[l, e]] += counts_NLE[i, l, e]
    return out


@njit(cache=True)
def block_loads(b_NLP, block_N, num_blocks):
    """``W[x, l·P + p] = Σ_{i: block_N[i] = x} b_NLP[i, l, p]`` (int64, exact; any integer dtype
    and memory layout of ``b_NLP``, so the annealer's int16 view is read in place). The caller
    checks ``0 ≤ block_N < num_blocks``. Replaces ``np.add.at`` over an int64 copy: at N = 32,768,
    L = 58, P = 64 that took 8.2 s per evaluation (the copy, and add.at's ~20 ns per element)."""
    N, L, P = b_NLP.shape
    W = np.zeros((num_blocks, L * P), dtype=np.int64)
    for i in range(N):
        x = block_N[i]
        for l in range(L):
            o = l * P
            for p in range(P):
                W[x, o + p] += b_NLP[i, l, p]
    return W


@njit(cache=True, parallel=True)
def replica_block_loads(counts_NLE, order_N, start_X, cell_of_X, q_D, rank_LEK, logcnt_LE, shard_D,
                        dp, num_shards, ep):
    """``W[r·G + g, l·P + p]``: tokens rank p receives at layer l from the micro-batches of row r
    in shard g under the even-local replica rule (routepack_opt.core.placement): cell x = (r, d)
    holding c tokens of expert e sends ``⌊c/k⌋ + [(j − q_d) mod k < c mod k]`` of them to e's
    j-th replica (k = logcnt, q_d the slot's EP rank in its shard). ``order_N`` lists the samples
    grouped by cell, cell x's being ``order_N[start_X[x]:start_X[x+1]]``; ``cell_of_X[x] = r·D + d``.
    Cells are taken in parallel per (row, shard) block: every block is written by one thread, in
    integers, so the result is the serial one."""
    N, L, E = counts_NLE.shape
    X = cell_of_X.shape[0]
    R = 0
    for x in range(X):
        R = max(R, cell_of_X[x] // dp + 1)
    W = np.zeros((R * num_shards, L * ep), dtype=np.int64)
    # cells of each block (x in ascending order inside each block)
    blk_X = np.empty(X, dtype=np.int64)
    for x in range(X):
        cx = cell_of_X[x]
        blk_X[x] = (cx // dp) * num_shards + shard_D[cx % dp]
    border = np.argsort(blk_X, kind="mergesort")
    bstart = np.zeros(R * num_shards + 1, dtype=np.int64)
    for x in range(X):
        bstart[blk_X[x] + 1] += 1
    for b in range(R * num_shards):
        bstart[b + 1] += bstart[b]
    for b in prange(R * num_shards):
        c_LE = np.zeros((L, E), dtype=np.int64)
        for t in range(bstart[b], bstart[b + 1]):
            x = border[t]
            q = q_D[cell_of_X[x] % dp]
            c_LE[:, :] = 0
            for s in range(start_X[x], start_X[x + 1]):
                i = order_N[s]
                for l in range(L):
                    for e in range(E):
                        c_LE[l, e] += counts_NLE[i, l, e]
            for l in range(L):
                o = l * ep
                for e in range(E):
                    c = c_LE[l, e]
                    if c == 0:
                        continue
                    k = logcnt_LE[l, e]
                    if k == 1:
                        W[b, o + rank_LEK[l, e, 0]] += c
                        continue
                    base = c // k
                    rem = c - base * k
                    for j in range(k):
                        extra = 1 if (j - q) % k < rem else 0
                        W[b, o + rank_LEK[l, e, j]] += base + extra
    return W


@njit(cache=True, parallel=True)
def surrogate_rank_loads(counts_NLE, rank_LEK, logcnt_LE, ep):
    """The search's linear surrogate of the replica rule: ``b[i, l, p] = round(Σ_e counts[i,l,e]
    · n_{e,p} / logcnt[l,e])`` (int64), each sample's tokens of e spread evenly over e's replicas.
    Rounded per sample (half up), so a block's surrogate load is within one token per sample of
    the fractional one; the evaluator scores the exact integer rule."""
    N, L, E = counts_NLE.shape
    K = rank_LEK.shape[2]
    out = np.zeros((N, L, ep), dtype=np.int64)
    for i in prange(N):
        f = np.zeros(ep)
        for l in range(L):
            f[:] = 0.0
            for e in range(E):
                c = counts_NLE[i, l, e]
                if c == 0:
                    continue
                k = logcnt_LE[l, e]
                share = c / k
                for j in range(min(k, K)):
                    f[rank_LEK[l, e, j]] += share
            for p in range(ep):
                out[i, l, p] = np.int64(np.floor(f[p] + 0.5))
    return out

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

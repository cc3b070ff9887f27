"""The compiled pass of routing-replay import: recorded routes → ``counts[N, L, E]`` in one read.

Legend: N samples, R rows (token positions) of the routes array, La recorded layers, L kept (MoE)
layers, K router top-k, E experts.

One pass over each sample's valid rows does everything the reference path
(:mod:`routepack_opt.replay.reference`) does in several numpy passes: ids in ``0..E-1``, no
expert picked twice by one token at one layer (a per-sample "seen" stamp per expert: one load
and one store per id, no sort), dense layers that must stay all-zero (slime's detection), verl's unrouted rows (verl #7075: a
zero-filled row inside the mask; at top-1 only the last position's zero id) imputed from the
nearest earlier routed token at that layer, else the next one, and the counts. Samples run in
parallel (``prange``); each writes only its own ``counts[i]``, so no reduction is needed.

A sample with a bad route gets a non-zero ``err[i]`` and stops there (1: id out of range, 2: an
expert picked twice or an all-zero token where padding is not allowed, 3: a layer with no routed
token, 4: a routed row at a layer taken as dense); the caller then runs the reference numpy path,
which raises the exact message. The kernels never raise and never copy the routes: the caller
hands them numpy views (torch's ``.numpy()`` on the CPU), any of ``uint8/int8/int16/uint16/
int32/uint32/int64`` ids (one compiled specialisation per dtype, cached).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

ERR_RANGE, ERR_DUPLICATE, ERR_NO_ROUTED_LAYER, ERR_ROUTED_DENSE = 1, 2, 3, 4


@njit(cache=True, inline="always")
def _sample(X, r0, r1, mask, last_row, keep, dense, E, verl, pad_LK, out_LE, seen, prev, pend):
    """One sample: rows ``r0 .. r1 - 1`` of ``X [R, La, K]`` (``mask[r] == 0`` rows skipped when
    ``mask`` is not empty) → ``out_LE`` counts; returns (error code, imputed tokens, max id)."""
    L = keep.shape[0]
    K = X.shape[2]
    imputed = 0
    mx = np.int64(-1)
    for li in range(L):
        prev[li] = -1
        pend[li] = 0
    stamp = 0
    use_mask = mask.shape[0] > 0
    for t in range(r0, r1):
        if use_mask and mask[t] == 0:
            continue
        for d in range(dense.shape[0]):
            for k in range(K):
                if X[t, dense[d], k] != 0:
                    return ERR_ROUTED_DENSE, imputed, mx
        if not verl:  # strict formats: no unrouted rows, so one pass over each row's ids
            for li in range(L):
                l = keep[li]
                stamp += 1
                for k in range(K):
                    e = np.int64(X[t, l, k])
                    if e < 0 or e >= E:
                        return ERR_RANGE, imputed, mx
                    if e > mx:
                        mx = e
                    if seen[e] == stamp:
                        return ERR_DUPLICATE, imputed, mx
                    seen[e] = stamp
                    out_LE[li, e] += 1
            continue
        tok_unrouted = False
        for li in range(L):
            l = keep[li]
            # one pass over the row's ids: checked, counted (a repeat is not), then undone if the
            # row turns out unrouted (all-zero: only expert 0 was counted, once)
            stamp += 1
            nonzero = False
            dup = False
            for k in range(K):
                e = np.int64(X[t, l, k])
                if e < 0 or e >= E:
                    return ERR_RANGE, imputed, mx
                if e > mx:
                    mx = e
                if e != 0:
                    nonzero = True
                if seen[e] == stamp:
                    dup = True
                else:
                    seen[e] = stamp
                    out_LE[li, e] += 1
            if not nonzero and (K > 1 or t == last_row):  # unrouted (verl #7075)
                out_LE[li, 0] -= 1
                tok_unrouted = True
                p = prev[li]
                if p >= 0:  # the nearest earlier routed token at this layer
                    for k in range(K):
                        out_LE[li, np.int64(X[p, l, k])] += 1
                else:       # none yet: the next routed one, counted when it comes
                    pend[li] += 1
            elif dup:
                return ERR_DUPLICATE, imputed, mx
            else:
                if pend[li] > 0:
                    for k in range(K):
                        out_LE[li, np.int64(X[t, l, k])] += pend[li]
                    pend[li] = 0
                prev[li] = t
        if tok_unrouted:
            imputed += 1
    for li in range(L):
        if pend[li] > 0:
            return ERR_NO_ROUTED_LAYER, imputed, mx
    for li in range(pad_LK.shape[0]):
        for k in range(pad_LK.shape[1]):
            out_LE[li, pad_LK[li, k]] += 1
    return 0, imputed, mx


@njit(cache=True, parallel=True)
def count_rows(X, start_N, stop_N, mask, last_N, keep, dense, E, verl, pad_LK, out_NLE, err_N, imp_N, max_N):
    """Sample i = rows ``start_N[i] .. stop_N[i] - 1`` of one routes array ``X [R, La, K]``
    (verl's ``[B·S, La, K]`` view, a padded slime tensor's, plain routes ``[ΣT, La, K]``)."""
    L = keep.shape[0]
    for i in prange(start_N.shape[0]):
        seen = np.zeros(E, np.int64)
        prev = np.empty(L, np.int64)
        pend = np.empty(L, np.int64)
        err, imp, mx = _sample(X, start_N[i], stop_N[i], mask, last_N[i], keep, dense, E, verl, pad_LK,
                               out_NLE[i], seen, prev, pend)
        err_N[i] = err
        imp_N[i] = imp
        max_N[i] = mx


@njit(cache=True, parallel=True)
def count_list(samples, keep, dense, E, pad_LK, out_NLE, err_N, max_N):
    """Sample i = ``samples[i]`` (a typed list of ``[T_i, La, K]`` arrays, one dtype): slime's
    per-sample routes and plain per-sample routes; strict (no unrouted rows)."""
    L = keep.shape[0]
    no_mask = np.zeros(0, np.uint8)
    n = np.int64(len(samples))
    for i in prange(n):
        X = samples[np.int64(i)]
        seen = np.zeros(E, np.int64)
        prev = np.empty(L, np.int64)
        pend = np.empty(L, np.int64)
        err, imp, mx = _sample(X, 0, X.shape[0], no_mask, -1, keep, dense, E, False, pad_LK,
                               out_NLE[i], seen, prev, pend)
        err_N[i] = err
        max_N[i] = mx


@njit(cache=True, parallel=True)
def last_routed_rows(X_NTLK, out_N):
    """Rows kept per sample of a padded ``[N, T, La, K]`` tensor: one past its last row with a
    non-zero id (scanned from the end: only the padding is read)."""
    N, T, La, K = X_NTLK.shape
    for i in prange(N):
        rows = 0
        for t in range(T - 1, -1, -1):
            hit = False
            for l in range(La):
                for k in range(K):
                    if X_NTLK[i, t, l, k] != 0:
                        hit = True
                        break
                if hit:
                    break
            if hit:
                rows = t + 1
                break
        out_N[i] = rows

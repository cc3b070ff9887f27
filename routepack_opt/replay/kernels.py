"""The compiled pass of routing-replay import: recorded routes → ``counts[N, L, E]`` in one read.

Legend: N samples, R rows (token positions) of the routes array, La recorded layers, L kept (MoE)
layers, K router top-k, E experts.

One pass over each sample's valid rows does everything the reference path
(:mod:`routepack_opt.replay.reference`) does in several numpy passes: ids in ``0..E-1``, no
expert picked twice by one token at one layer (a per-sample "seen" stamp per expert: one load
and one store per id, no sort), dense layers that must stay all-zero (slime's detection),
verl's unrouted rows (verl #7075: a zero-filled row inside the mask; at top-1 only the last
position's zero id) imputed from the nearest earlier routed token at that layer, else the next
one, and the counts. Samples run in
parallel (``prange``); each writes only its own ``counts[i]``, so no reduction is needed.

A sample with a bad route gets a non-zero ``err[i]`` and stops there (1: id out of range, 2: an
expert picked twice or an all-zero token where padding is not allowed, 3: a layer with no routed
token, 4: a routed row at a layer taken as dense); the caller then runs the reference numpy path,
which raises the exact message. The kernels never raise and never copy the routes: the caller
hands them numpy views (torch's ``.numpy()`` on the CPU), any of ``uint8/int8/int16/uint16/
int32/uint32/int64`` ids (one compiled specialisation per dtype, cached).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit, prange

ERR_RANGE, ERR_DUPLICATE, ERR_NO_ROUTED_LAYER, ERR_ROUTED_DENSE = 1, 2, 3, 4


class Spec(NamedTuple):
    """What every sample of one import shares."""

    keep: np.ndarray  # [L] int64: the recorded layers kept (MoE layers)
    dense: np.ndarray  # [D] int64: recorded layers taken as dense, which must stay all-zero
    E: np.int64  # experts: ids in 0..E-1
    verl: bool  # unrouted (zero-filled) rows are imputed (verl #7075), not refused
    pad_LK: np.ndarray  # [L, K] int64 route counted once more per sample (slime's last token), or [0, K]


class Scratch(NamedTuple):
    """One sample's working arrays."""

    seen: np.ndarray  # [E] int64: the stamp of the last (token, layer) that picked expert e
    prev: np.ndarray  # [L] int64: the last routed row at each layer (-1: none yet)
    pend: np.ndarray  # [L] int64: unrouted rows at each layer waiting for the next routed one


@njit(cache=True, inline="always")
def _dense_routed(X, t, dense) -> bool:
    """Row ``t`` has a non-zero id at a layer taken as dense."""
    for d in range(dense.shape[0]):
        for k in range(X.shape[2]):
            if X[t, dense[d], k] != 0:
                return True
    return False


@njit(cache=True, inline="always")
def _count_strict_row(X, t, spec, out_LE, seen, stamp, mx):
    """Row ``t`` of a strict format (no unrouted rows): each id checked and counted, one pass.
    Returns (error code or 0, stamp, max id)."""
    keep, E = spec.keep, spec.E
    for li in range(keep.shape[0]):
        l = keep[li]
        stamp += 1
        for k in range(X.shape[2]):
            e = np.int64(X[t, l, k])
            if e < 0 or e >= E:
                return ERR_RANGE, stamp, mx
            if e > mx:
                mx = e
            if seen[e] == stamp:
                return ERR_DUPLICATE, stamp, mx
            seen[e] = stamp
            out_LE[li, e] += 1
    return 0, stamp, mx


@njit(cache=True, inline="always")
def _count_verl_row(X, t, last_row, spec, out_LE, scratch, stamp, mx):
    """Row ``t`` of verl's format: an unrouted layer row (all-zero at top-k > 1; the zero id of
    the sample's last position at top-1) is imputed from the nearest earlier routed token at that
    layer, else counted as pending for the next routed one. Returns (error code or 0, stamp,
    max id, whether the token had an unrouted layer)."""
    keep, E, K = spec.keep, spec.E, X.shape[2]
    seen, prev, pend = scratch.seen, scratch.prev, scratch.pend
    tok_unrouted = False
    for li in range(keep.shape[0]):
        l = keep[li]
        # one pass over the row's ids: checked, counted (a repeat is not), then undone if the
        # row turns out unrouted (all-zero: only expert 0 was counted, once)
        stamp += 1
        nonzero = False
        dup = False
        for k in range(K):
            e = np.int64(X[t, l, k])
            if e < 0 or e >= E:
                return ERR_RANGE, stamp, mx, tok_unrouted
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
            return ERR_DUPLICATE, stamp, mx, tok_unrouted
        else:
            if pend[li] > 0:
                for k in range(K):
                    out_LE[li, np.int64(X[t, l, k])] += pend[li]
                pend[li] = 0
            prev[li] = t
    return 0, stamp, mx, tok_unrouted


@njit(cache=True)
def _sample(X, r0, r1, mask, last_row, keep, dense, E, verl, pad_LK, out_LE):
    """One sample: rows ``r0 .. r1 - 1`` of ``X [R, La, K]`` (``mask[r] == 0`` rows skipped when
    ``mask`` is not empty) → ``out_LE`` counts; returns (error code, imputed tokens, max id).

    Called once per sample from the parallel loops, with plain arrays and scalars: numba
    (0.68) loses the writes to arrays taken out of a tuple inside a ``prange`` body, so the
    records (:class:`Spec`, :class:`Scratch`) are built here, outside any parallel region."""
    spec = Spec(keep, dense, E, verl, pad_LK)
    L = keep.shape[0]
    scratch = Scratch(np.zeros(E, np.int64), np.empty(L, np.int64), np.empty(L, np.int64))
    imputed = 0
    mx = np.int64(-1)
    for li in range(L):
        scratch.prev[li] = -1
        scratch.pend[li] = 0
    stamp = 0
    use_mask = mask.shape[0] > 0
    for t in range(r0, r1):
        if use_mask and mask[t] == 0:
            continue
        if _dense_routed(X, t, spec.dense):
            return ERR_ROUTED_DENSE, imputed, mx
        if not spec.verl:  # strict formats: no unrouted rows, so one pass over each row's ids
            err, stamp, mx = _count_strict_row(X, t, spec, out_LE, scratch.seen, stamp, mx)
            if err != 0:
                return err, imputed, mx
            continue
        err, stamp, mx, tok_unrouted = _count_verl_row(X, t, last_row, spec, out_LE, scratch, stamp, mx)
        if err != 0:
            return err, imputed, mx
        if tok_unrouted:
            imputed += 1
    for li in range(L):
        if scratch.pend[li] > 0:
            return ERR_NO_ROUTED_LAYER, imputed, mx
    pad_LK = spec.pad_LK
    for li in range(pad_LK.shape[0]):
        for k in range(pad_LK.shape[1]):
            out_LE[li, pad_LK[li, k]] += 1
    return 0, imputed, mx


@njit(cache=True, parallel=True)
def count_rows(X, bounds_N3, mask, keep, dense, E, verl, pad_LK, out_NLE, stats_N3):
    """Sample i = rows ``bounds_N3[i, 0] .. bounds_N3[i, 1] - 1`` of one routes array
    ``X [R, La, K]`` (verl's ``[B·S, La, K]`` view, a padded slime tensor's, plain routes
    ``[ΣT, La, K]``), ``bounds_N3[i, 2]`` its last position in the mask (-1: none; verl's top-1
    case). ``stats_N3[i]`` = (error code, imputed tokens, max id)."""
    for i in prange(bounds_N3.shape[0]):
        err, imp, mx = _sample(X, bounds_N3[i, 0], bounds_N3[i, 1], mask, bounds_N3[i, 2], keep, dense, E, verl,
                               pad_LK, out_NLE[i])
        stats_N3[i, 0] = err
        stats_N3[i, 1] = imp
        stats_N3[i, 2] = mx


@njit(cache=True, parallel=True)
def count_list(samples, keep, dense, E, pad_LK, out_NLE, err_N, max_N):
    """Sample i = ``samples[i]`` (a typed list of ``[T_i, La, K]`` arrays, one dtype): slime's
    per-sample routes and plain per-sample routes; strict (no unrouted rows)."""
    no_mask = np.zeros(0, np.uint8)
    n = np.int64(len(samples))
    for i in prange(n):
        X = samples[np.int64(i)]
        err, imp, mx = _sample(X, 0, X.shape[0], no_mask, -1, keep, dense, E, False, pad_LK, out_NLE[i])
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

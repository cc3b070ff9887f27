"""The compiled pass of routing-replay import, driven from Python: numpy views of the routes
(CPU tensors through ``.numpy()``, nothing of the routes' size copied) handed to
:mod:`.kernels`, which check, impute (verl) and count in one read, parallel over samples.

Legend: N samples, T tokens of one sample, B batch rows, S padded sequence length, R rows of one
routes array, La all recorded layers, L MoE layers kept, K router top-k, E logical experts.
"""

from __future__ import annotations

import warnings

import numpy as np

from routepack_opt.core.errors import InputError
from routepack_opt.replay.routes import _Accumulator, _is_sequence, _lengths_vector, _np, moe_layers, slime_pad_routes

# Each _fast_* returns what its reference _from_* returns, or None: then the reference runs, on an
# input the compiled pass does not take, or on bad routes (to raise the exact message).
_FAST_DTYPES = frozenset(np.dtype(t) for t in (np.uint8, np.int8, np.int16, np.uint16, np.int32, np.uint32,
                                               np.int64))
_LIST_CHUNK = 256  # samples of a per-sample sequence handed to the compiled pass at once


def _fast_array(x) -> np.ndarray | None:
    """A C-contiguous numpy view of a CPU tensor or an array of integer ids, or None (no copy)."""
    if hasattr(x, "detach") and hasattr(x, "device"):
        if getattr(x.device, "type", None) != "cpu":
            return None
        try:
            x = x.detach().numpy()
        except (RuntimeError, TypeError):
            return None
    if not isinstance(x, np.ndarray):
        return None
    x = np.asarray(x)  # a memmap as a plain ndarray view
    if x.dtype not in _FAST_DTYPES or not x.flags.c_contiguous:
        return None
    return x


def _kernels():
    from routepack_opt.replay import kernels
    return kernels


class _threads_for:
    """numba threads for a pass over ``n`` samples: at most one per 4 samples (a parallel region
    over one sample, the rollout hook's case, costs a second thread's wait and no speed)."""

    def __init__(self, n: int):
        self.n = n

    def __enter__(self):
        import numba
        self.prev = numba.get_num_threads()
        numba.set_num_threads(max(1, min(self.prev, self.n // 4)))

    def __exit__(self, *exc):
        import numba
        numba.set_num_threads(self.prev)


def _i64(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64).reshape(-1)


def _no_pad(K: int) -> np.ndarray:
    return np.zeros((0, K), dtype=np.int64)


def _run_rows(X_RLK, start_N, stop_N, keep, dense, E: int, acc: _Accumulator, *, mask_R=None, last_N=None,
              verl: bool = False, pad_LK=None):
    """The compiled pass over row ranges of one array; (ok, imputed tokens)."""
    N = start_N.shape[0]
    # per sample: (first row, one past the last, last position in the mask); (error, imputed, max id)
    bounds_N3 = np.stack([_i64(start_N), _i64(stop_N), np.full(N, -1, np.int64) if last_N is None else _i64(last_N)],
                         axis=1)
    stats_N3 = np.zeros((N, 3), dtype=np.int64)
    stats_N3[:, 2] = -1
    with _threads_for(N):
        _kernels().count_rows(X_RLK, bounds_N3, np.zeros(0, np.uint8) if mask_R is None else mask_R,
                              _i64(keep), _i64(dense), np.int64(E), bool(verl),
                              _no_pad(X_RLK.shape[2]) if pad_LK is None else pad_LK, acc.counts_NLE, stats_N3)
    if stats_N3[:, 0].any():
        return False, 0
    acc.max_id = int(stats_N3[:, 2].max())
    return True, int(stats_N3[:, 1].sum())


def _run_list(seq, first: np.ndarray, keep, dense, E: int, acc: _Accumulator, pad_LK) -> np.ndarray | None:
    """The compiled pass over a per-sample sequence, ``_LIST_CHUNK`` samples at a time (a lazy
    sequence is read a chunk at a time); the rows of each sample, or None (fall back)."""
    from numba.core.errors import NumbaTypeSafetyWarning
    from numba.typed import List
    N, (La, K), dt = len(seq), first.shape[1:], first.dtype
    rows_N = np.zeros(N, dtype=np.int64)
    kern, keep_L, dense_D = _kernels(), _i64(keep), _i64(dense)
    for c0 in range(0, N, _LIST_CHUNK):
        chunk = List()
        for i in range(c0, min(N, c0 + _LIST_CHUNK)):
            r = first if i == 0 else _fast_array(seq[i])
            if r is None or r.ndim != 3 or r.shape[1:] != (La, K) or r.dtype != dt:
                return None
            rows_N[i] = r.shape[0]
            with warnings.catch_warnings():  # a read-only sample in a list typed writable: only read
                warnings.simplefilter("ignore", NumbaTypeSafetyWarning)
                chunk.append(r)
        n = len(chunk)
        err_N = np.zeros(n, dtype=np.int64)
        max_N = np.full(n, -1, dtype=np.int64)
        with _threads_for(n):
            kern.count_list(chunk, keep_L, dense_D, np.int64(E), pad_LK, acc.counts_NLE[c0:c0 + n], err_N, max_N)
        if err_N.any():
            return None
        acc.max_id = max(acc.max_id, int(max_N.max()))
    return rows_N


def _fast_verl(routed, attention_mask, E: int, moe_layer_freq, top_k):
    if attention_mask is None or _is_sequence(routed):
        return None
    X_BSLK = _fast_array(routed)
    if X_BSLK is None or X_BSLK.ndim != 4:
        return None
    try:
        m_BS = _np(attention_mask, "attention_mask")
    except InputError:
        return None
    B, S, La, K = X_BSLK.shape
    if tuple(m_BS.shape) != (B, S) or ((m_BS != 0) & (m_BS != 1)).any() or not 1 <= K <= E \
            or (top_k is not None and int(top_k) != K) or B == 0:
        return None
    keep = moe_layers(La, moe_layer_freq) if moe_layer_freq is not None else list(range(La))
    lengths_N = m_BS.sum(axis=1).astype(np.int64)
    if (lengths_N == 0).any():
        return None
    start_N = np.arange(B, dtype=np.int64) * S
    last_N = start_N + (S - 1 - np.argmax(m_BS[:, ::-1] != 0, axis=1))  # the last position in the mask
    acc = _Accumulator(B, len(keep), E, K)
    ok, imputed = _run_rows(X_BSLK.reshape(B * S, La, K), start_N, start_N + S, keep, (), E, acc,
                            mask_R=(m_BS != 0).astype(np.uint8).reshape(-1), last_N=last_N, verl=True)
    if not ok:
        return None
    acc.lengths_N[:] = lengths_N
    return acc, tuple(keep), tuple(l for l in range(La) if l not in keep), imputed, 0, 0, []


def _slime_keep(first_TLK: np.ndarray, La: int, moe_layer_freq):
    """Kept layers (as the reference picks them) or None."""
    if moe_layer_freq is not None:
        return moe_layers(La, moe_layer_freq)
    keep = [l for l in range(La) if first_TLK[:, l].any()] if first_TLK.shape[0] else list(range(La))
    return keep or None


def _fast_slime(samples, E: int, lengths, moe_layer_freq, top_k, pad_last: bool):
    extra = 1 if pad_last else 0
    if lengths is not None:
        lengths = _lengths_vector(lengths)
    if _is_sequence(samples):
        N = len(samples)
        if N == 0:
            return None
        first = _fast_array(samples[0])
        if first is None or first.ndim != 3:
            return None
        La, K = first.shape[1:]
        if not 1 <= K <= E or (top_k is not None and int(top_k) != K) \
                or (lengths is not None and lengths.shape[0] != N):
            return None
        keep = _slime_keep(first, La, moe_layer_freq)
        if keep is None:
            return None
        dropped = [l for l in range(La) if l not in keep]
        pad_LK = slime_pad_routes(La, K, E)[keep] if pad_last else _no_pad(K)
        acc = _Accumulator(N, len(keep), E, K)
        rows_N = _run_list(samples, first, keep, dropped if moe_layer_freq is None else (), E, acc, pad_LK)
        if rows_N is None:
            return None
        skipped, notes = 0, []
    else:
        X_NTLK = _fast_array(samples)
        if X_NTLK is None or X_NTLK.ndim != 4 or X_NTLK.shape[0] == 0:
            return None
        N, T, La, K = X_NTLK.shape
        if not 1 <= K <= E or (top_k is not None and int(top_k) != K):
            return None
        if lengths is not None:
            if lengths.shape[0] != N:
                return None
            rows_N = lengths - extra
            if ((rows_N < 0) | (rows_N > T)).any():
                return None
            how = "its length"
        else:
            rows_N = np.zeros(N, dtype=np.int64)
            _kernels().last_routed_rows(X_NTLK, rows_N)
            if K == 1 and (rows_N < T).any():
                return None
            how = "its last routed row"
        keep = _slime_keep(X_NTLK[0, :rows_N[0]], La, moe_layer_freq)
        if keep is None:
            return None
        dropped = [l for l in range(La) if l not in keep]
        pad_LK = slime_pad_routes(La, K, E)[keep] if pad_last else _no_pad(K)
        acc = _Accumulator(N, len(keep), E, K)
        start_N = np.arange(N, dtype=np.int64) * T
        ok, _ = _run_rows(X_NTLK.reshape(N * T, La, K), start_N, start_N + rows_N, keep,
                          dropped if moe_layer_freq is None else (), E, acc, pad_LK=pad_LK)
        if not ok:
            return None
        skipped = int(N * T - rows_N.sum())
        notes = [f"padded [{N}, {T}, {La}, {K}] tensor: each sample cut at {how}; {skipped} padding rows "
                 "skipped"] if skipped else []
    T_N = rows_N + extra
    if (T_N < 1).any() or (lengths is not None and (lengths != T_N).any()):
        return None
    acc.lengths_N[:] = T_N
    return acc, tuple(keep), tuple(dropped), 0, N if pad_last else 0, skipped, notes


def _fast_routes(routes, lengths, E: int, moe_layer_freq, top_k):
    if lengths is not None:
        lengths = _lengths_vector(lengths)
    if _is_sequence(routes):
        N = len(routes)
        if N == 0:
            return None
        first = _fast_array(routes[0])
        if first is None or first.ndim != 3 or (lengths is not None and lengths.shape[0] != N):
            return None
        La, K = first.shape[1:]
        if not 1 <= K <= E or (top_k is not None and int(top_k) != K):
            return None
        keep = moe_layers(La, moe_layer_freq) if moe_layer_freq is not None else list(range(La))
        acc = _Accumulator(N, len(keep), E, K)
        rows_N = _run_list(routes, first, keep, (), E, acc, _no_pad(K))
        if rows_N is None or (rows_N < 1).any() or (lengths is not None and (lengths != rows_N).any()):
            return None
        acc.lengths_N[:] = rows_N
        return acc, tuple(keep), tuple(l for l in range(La) if l not in keep), 0, 0, 0, []
    X_TLK = _fast_array(routes)
    if X_TLK is None or X_TLK.ndim != 3 or lengths is None or lengths.size == 0 or (lengths < 1).any() \
            or int(lengths.sum()) != X_TLK.shape[0]:
        return None
    La, K = X_TLK.shape[1:]
    if not 1 <= K <= E or (top_k is not None and int(top_k) != K):
        return None
    keep = moe_layers(La, moe_layer_freq) if moe_layer_freq is not None else list(range(La))
    acc = _Accumulator(lengths.size, len(keep), E, K)
    stop_N = np.cumsum(lengths)
    ok, _ = _run_rows(X_TLK, stop_N - lengths, stop_N, keep, (), E, acc)
    if not ok:
        return None
    acc.lengths_N[:] = lengths
    return acc, tuple(keep), tuple(l for l in range(La) if l not in keep), 0, 0, 0, []



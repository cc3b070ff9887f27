"""The reference path of routing-replay import: one sample at a time in numpy, per format.

It reads every input the compiled pass (:mod:`.fast`) does not take, and it is the one that
raises the exact message for bad routes. Each ``_from_*`` returns
``(accumulator, kept layers, dropped layers, imputed tokens, pad tokens, padding rows, notes)``.

Legend: N samples, T tokens of one sample, B batch rows, S padded sequence length, La all
recorded layers, K router top-k, E logical experts.
"""

from __future__ import annotations

import numpy as np

from routepack_opt.core.errors import InputError
from routepack_opt.replay.routes import (
    _Accumulator,
    _check_ids,
    _check_top_k,
    _duplicate_rows,
    _impute,
    _is_sequence,
    _lengths_vector,
    _np,
    _refuse_duplicates,
    _sample_counts,
    moe_layers,
    slime_pad_routes,
)

# --- slime -------------------------------------------------------------------------------------
_SLIME_CUT = "cut each sample to its recorded routes (slime: len - 1 rows) or pass lengths"


def _slime_unpad(R_NTLK, lengths, pad_last: bool):
    """Per-sample views of a padded ``[N, T, La, K]`` tensor, the row counts kept and a note."""
    N, T, La, K = (int(x) for x in R_NTLK.shape)
    extra = 1 if pad_last else 0
    if lengths is not None:
        len_N = _lengths_vector(lengths)
        if len_N.shape[0] != N:
            raise InputError(f"lengths: {len_N.shape[0]} entries for {N} samples of routes")
        rows_N = len_N - extra
        bad = np.flatnonzero((rows_N < 0) | (rows_N > T))
        if bad.size:
            i = int(bad[0])
            raise InputError(f"lengths: sample {i} has {int(len_N[i])} tokens, but the padded tensor holds "
                             f"0..{T} recorded routes per sample")
        how = "its length"
    else:
        rows_N = np.zeros(N, dtype=np.int64)
        for i in range(N):
            routed_T = _np(R_NTLK[i], f"routes[{i}]").reshape(T, -1).any(axis=1)
            rows_N[i] = int(np.flatnonzero(routed_T)[-1]) + 1 if routed_T.any() else 0
        if K == 1 and (rows_N < T).any():
            raise InputError(f"routes: a padded [{N}, {T}, {La}, 1] tensor: at top-1 padding cannot be told "
                             "from expert 0; pass lengths (slime's total_lengths)")
        how = "its last routed row"
    skipped = int(N * T - rows_N.sum())
    note = (f"padded [{N}, {T}, {La}, {K}] tensor: each sample cut at {how}; {skipped} padding rows "
            "skipped") if skipped else ""
    return _Rows(R_NTLK, rows_N), skipped, note


class _Rows:
    """``seq[i]`` = ``R[i, :rows[i]]``: samples of a padded tensor, read one at a time."""

    def __init__(self, R, rows_N):
        self._R, self._rows = R, rows_N

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i: int):
        return self._R[i][: int(self._rows[i])]


def _from_slime(samples, E: int, lengths, moe_layer_freq, top_k, pad_last: bool):
    skipped, notes = 0, []
    if not _is_sequence(samples):
        shape = tuple(samples.shape) if hasattr(samples, "shape") else None
        if shape is None or len(shape) != 4:
            raise InputError(f"routes: slime records a list of [T_i, layers, top_k] arrays (or one padded "
                             f"[N, T, layers, top_k] tensor), got shape {shape}")
        samples, skipped, note = _slime_unpad(samples, lengths, pad_last)
        notes += [note] if note else []
    seq = samples if _is_sequence(samples) else list(samples)
    N = len(seq)
    if N == 0:
        raise InputError("routes: no samples")
    first = _np(seq[0], "routes[0]")
    if first.ndim != 3:
        raise InputError(f"routes: sample 0 has shape {tuple(first.shape)}; slime records [T, layers, top_k]")
    La, K = first.shape[1], first.shape[2]
    _check_top_k(K, top_k, E)
    if moe_layer_freq is not None:
        keep = moe_layers(La, moe_layer_freq)
    else:  # a layer is dense iff all-zero in every recorded token (checked below for every sample)
        keep = [l for l in range(La) if first[:, l].any()] if first.shape[0] else list(range(La))
        if not keep:
            raise InputError("routes: every layer of sample 0 is all-zero; pass moe_layer_freq")
    dropped = [l for l in range(La) if l not in keep]
    if lengths is not None:
        lengths = _lengths_vector(lengths)
        if lengths.shape[0] != N:
            raise InputError(f"lengths: {lengths.shape[0]} entries for {N} samples of routes")
    pad_LK = slime_pad_routes(La, K, E)[keep]
    acc = _Accumulator(N, len(keep), E, K)
    for i in range(N):
        r = first if i == 0 else _np(seq[i], f"routes[{i}]")
        if r.ndim != 3 or r.shape[1:] != (La, K):
            raise InputError(f"routes: sample {i} has shape {tuple(r.shape)}; expected [T, {La}, {K}] "
                             "like sample 0 (ragged layers or top-k)")
        routed_dense = [l for l in dropped if moe_layer_freq is None and r[:, l].any()]
        if routed_dense:
            l = routed_dense[0]
            raise InputError(f"routes: layer {l} is all-zero in sample 0 (taken as dense) but routed in "
                             f"sample {i}; pass moe_layer_freq")
        r = r[:, keep]
        _check_ids(r, E, i)
        _refuse_duplicates(r, i, keep, _SLIME_CUT)
        T = r.shape[0] + (1 if pad_last else 0)
        if lengths is not None and int(lengths[i]) != T:
            raise InputError(f"lengths: sample {i} has {int(lengths[i])} tokens but {r.shape[0]} recorded "
                             f"routes (slime records len - 1{'' if pad_last else '; pad_last=False: len'})")
        if T < 1:
            raise InputError(f"routes: sample {i} has no tokens")
        acc.add(i, r, T)
        if pad_last:
            acc.counts_NLE[i] += _sample_counts(pad_LK[None], E).astype(np.int32)
    return acc, tuple(keep), tuple(dropped), 0, N if pad_last else 0, skipped, notes


# --- verl --------------------------------------------------------------------------------------
def _from_verl(routed, attention_mask, E: int, moe_layer_freq, top_k):
    if _is_sequence(routed):
        raise InputError("routed_experts: verl records one padded [batch, seq, layers, top_k] tensor, got a "
                         "list of per-sample arrays (use format 'slime' or 'routes')")
    R_BSLK = routed if hasattr(routed, "shape") else _np(routed, "routed_experts")
    if len(R_BSLK.shape) != 4:
        raise InputError(f"routed_experts: expected [batch, seq, layers, top_k], got shape {tuple(R_BSLK.shape)}")
    if attention_mask is None:
        raise InputError("routed_experts: verl's format needs the batch's attention_mask [batch, seq]")
    m_BS = _np(attention_mask, "attention_mask")
    B, S, La, K = (int(x) for x in R_BSLK.shape)
    if tuple(m_BS.shape) != (B, S):
        raise InputError(f"attention_mask: shape {tuple(m_BS.shape)} does not match routed_experts [{B}, {S}, ...]")
    if ((m_BS != 0) & (m_BS != 1)).any():
        raise InputError("attention_mask: expected 0/1 entries")
    _check_top_k(K, top_k, E)
    keep = moe_layers(La, moe_layer_freq) if moe_layer_freq is not None else list(range(La))
    acc = _Accumulator(B, len(keep), E, K)
    imputed = 0
    for i in range(B):
        pos = np.flatnonzero(m_BS[i])
        if pos.size == 0:
            raise InputError(f"attention_mask: sample {i} has no tokens")
        r = _np(R_BSLK[i], "routed_experts")[pos][:, keep]          # one sample, padding skipped
        _check_ids(r, E, i)
        # Zero-filled rows inside the mask are unrouted (verl #7075), not load on expert 0.
        unrouted = (r == 0).all(axis=2) if K > 1 else np.zeros(r.shape[:2], dtype=bool)
        if K == 1:  # ids cannot tell: the last position is the one the engine leaves unrouted
            unrouted[-1] = r[-1, :, 0] == 0
        dup = _duplicate_rows(r) & ~unrouted
        if dup.any():
            t, l = np.argwhere(dup)[0]
            raise InputError(f"routed_experts: sample {i} position {pos[t]} picks the same expert twice "
                             f"at layer {keep[l]}")
        if unrouted.any():
            imputed += int(unrouted.any(axis=1).sum())
            r = _impute(r, unrouted, i)
        acc.add(i, r, pos.size)
    return acc, tuple(keep), tuple(l for l in range(La) if l not in keep), imputed, 0, 0, []


# --- plain routes ------------------------------------------------------------------------------
_ROUTES_CUT = "plain routes hold T_i rows per sample, no padding"


def _from_routes(routes, lengths, E: int, moe_layer_freq, top_k):
    if _is_sequence(routes):
        return _from_routes_list(routes, lengths, E, moe_layer_freq, top_k)
    R_TLK = routes if hasattr(routes, "shape") else _np(routes, "routes")
    if len(R_TLK.shape) != 3:
        raise InputError(f"routes: expected [tokens, layers, top_k], got shape {tuple(R_TLK.shape)}")
    if lengths is None:
        raise InputError("routes: plain routes need a lengths vector")
    len_N = _lengths_vector(lengths)
    if len_N.size == 0:
        raise InputError("lengths: no samples")
    if (len_N < 1).any():
        raise InputError(f"lengths: every sample needs at least 1 token (sample {int(np.argmin(len_N))})")
    Ttot, La, K = (int(x) for x in R_TLK.shape)
    if int(len_N.sum()) != Ttot:
        raise InputError(f"routes: {Ttot} tokens but lengths sum to {int(len_N.sum())}")
    _check_top_k(K, top_k, E)
    keep = moe_layers(La, moe_layer_freq) if moe_layer_freq is not None else list(range(La))
    acc = _Accumulator(len_N.size, len(keep), E, K)
    start = 0
    for i, n in enumerate(len_N.tolist()):
        r = _np(R_TLK[start:start + n], "routes")[:, keep]
        start += n
        _check_ids(r, E, i)
        _refuse_duplicates(r, i, keep, _ROUTES_CUT)
        acc.add(i, r, n)
    return acc, tuple(keep), tuple(l for l in range(La) if l not in keep), 0, 0, 0, []


def _from_routes_list(seq, lengths, E: int, moe_layer_freq, top_k):
    """Plain routes as one ``[T_i, L, K]`` array per sample: sample i has T_i tokens."""
    N = len(seq)
    if N == 0:
        raise InputError("routes: no samples")
    if lengths is not None:
        lengths = _lengths_vector(lengths)
        if lengths.shape[0] != N:
            raise InputError(f"lengths: {lengths.shape[0]} entries for {N} samples of routes")
    first = _np(seq[0], "routes[0]")
    if first.ndim != 3:
        raise InputError(f"routes: sample 0 has shape {tuple(first.shape)}; expected [T, layers, top_k]")
    La, K = first.shape[1], first.shape[2]
    _check_top_k(K, top_k, E)
    keep = moe_layers(La, moe_layer_freq) if moe_layer_freq is not None else list(range(La))
    acc = _Accumulator(N, len(keep), E, K)
    for i in range(N):
        r = first if i == 0 else _np(seq[i], f"routes[{i}]")
        if r.ndim != 3 or r.shape[1:] != (La, K):
            raise InputError(f"routes: sample {i} has shape {tuple(r.shape)}; expected [T, {La}, {K}] "
                             "like sample 0 (ragged layers or top-k)")
        if r.shape[0] < 1:
            raise InputError(f"routes: sample {i} has no tokens")
        if lengths is not None and int(lengths[i]) != r.shape[0]:
            raise InputError(f"lengths: sample {i} has {int(lengths[i])} tokens but {r.shape[0]} routes "
                             "(plain routes: one per token)")
        r = r[:, keep]
        _check_ids(r, E, i)
        _refuse_duplicates(r, i, keep, _ROUTES_CUT)
        acc.add(i, r, r.shape[0])
    return acc, tuple(keep), tuple(l for l in range(La) if l not in keep), 0, 0, 0, []


# --- the compiled pass -------------------------------------------------------------------------

"""Routing-replay import: the per-token routes trainers record → a window (lengths, counts[N, L, E]).

Legend: N samples, T tokens of one sample, B batch rows, S padded sequence length, La all
decoder layers (dense ones included), L MoE layers, K router top-k, E logical experts.

Formats (what each framework records; the containers each is read from are in docs/formats.md):

- ``slime``: ``rollout_routed_experts``, a list of per-sample arrays ``[T_i, La, K]``. slime
  records one route fewer than the sample has tokens (``experts.shape[0] == len(tokens) - 1``,
  asserted in ``slime/backends/megatron_utils/cp_utils.py``) and pads the last token at training
  time with ``arange(La·K) % E``; we count that pad route too, because it is what the replayed
  step routes. Dense layers (``moe_layer_freq``) are recorded as all-zero rows and are dropped,
  from ``moe_layer_freq`` when given, else detected (all-zero in every token of every sample).
  The same routes stacked into one padded ``[N, T, La, K]`` tensor are cut back to samples: at
  ``lengths[i] - 1`` rows when lengths are given, else after each sample's last routed row (an
  all-zero row is padding: a top-K route with K ≥ 2 never picks expert 0 twice).
- ``verl``: ``routed_experts [B, S, La, K]`` (zero-filled outside the sample) with the batch's
  ``attention_mask [B, S]``. Padding is skipped; inside the mask, zero-filled rows (the last
  position, whose route the rollout engine does not return, verl #7075) are *unrouted*, not load
  on expert 0: they are imputed from the nearest routed token of the same sample and counted
  in the report.
- ``routes``: plain per-token routes ``[ΣT, L, K]`` with a ``lengths [N]`` vector (T_i routes
  for a sample of T_i tokens), or a list of per-sample ``[T_i, L, K]`` arrays.

Files are read without running code from them: ``.pt`` by torch's weights-only loader with numpy's
array types allowed, object ``.npy``/``.npz`` members by a restricted unpickler that builds numpy
arrays and nothing else (:class:`_NumpyOnlyUnpickler`), never ``allow_pickle=True``.

Speed: one compiled pass (:mod:`routepack_opt.integrations._replay_kernels`, numba, parallel
over samples) over the valid tokens does the checks, verl's imputation and the counts, on numpy
views of the input (CPU torch tensors through ``.numpy()``), nothing of the routes' size copied.
What it does not take (a GPU tensor, a non-contiguous array, an odd dtype, safetensors slices, a
lazy ``.npz`` chunk with a ragged sample) and every input with a bad route go through the
reference path below (``_from_*``, one sample at a time), which raises the exact message.

Memory: counts go into one ``counts[N, L, E]``, whose size is checked against the memory
available before it is allocated, and which the window takes without a copy; numeric files are memory-mapped
(``np.load`` with ``mmap_mode``, ``torch.load(mmap=True)``, safetensors slices), and ``.npz``
members are read one at a time. What cannot be mapped is read whole: an ``.npz`` member, numpy
arrays inside a ``.pt`` pickle, an object ``.npy``. In-memory inputs (a verl batch, slime's list)
are read one sample at a time.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import pickle
import re
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

from routepack_opt.core import inputs
from routepack_opt.core.errors import InputError
from routepack_opt.core.io import check_output_path
from routepack_opt.core.window import Window, available_memory, save_window
from routepack_opt.integrations import _deps

__all__ = ["ReplayImport", "import_replay", "warm_import", "window_from_replay", "FORMATS", "moe_layers",
           "slime_pad_routes", "save_window_atomic", "MAX_EXPERTS"]

FORMATS = ("slime", "verl", "routes")
MAX_EXPERTS = 2**31 - 1  # expert ids and per-expert counts are stored as int32


@dataclasses.dataclass(frozen=True)
class ReplayImport:
    """The window plus what the import did to get it (reported, never silent)."""

    window: Window
    format: str
    moe_layers: tuple[int, ...]        # indices of the recorded layers kept as MoE layers
    dropped_layers: tuple[int, ...]    # recorded layers dropped as dense
    imputed_tokens: int                # unrouted (zero-filled) token rows imputed (verl)
    pad_tokens: int                    # last-token pad routes counted (slime)
    max_expert_id: int = -1            # the largest expert id in the recorded routes (-1: none)
    padding_rows: int = 0              # rows of a padded [N, T, La, K] slime tensor skipped
    notes: tuple[str, ...] = ()        # one line each: what a user should know about this import

    def report(self) -> dict:
        w = self.window
        return {"format": self.format, "samples": w.num_samples, "layers": w.num_layers,
                "experts": w.num_experts, "top_k": w.top_k, "tokens": w.total_tokens,
                "moe_layers": list(self.moe_layers), "dropped_layers": list(self.dropped_layers),
                "imputed_tokens": self.imputed_tokens, "pad_tokens": self.pad_tokens,
                "max_expert_id": self.max_expert_id, "padding_rows": self.padding_rows,
                "notes": list(self.notes)}


# --- helpers -----------------------------------------------------------------------------------
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _brief(exc: BaseException, limit: int = 100) -> str:
    """A foreign exception as a short clause of our own message: ANSI codes stripped, the first
    line, at most ``limit`` characters."""
    text = _ANSI.sub("", str(exc)).strip()
    text = text.splitlines()[0].strip() if text else ""
    text = f"{exc.__class__.__name__}: {text}" if text else exc.__class__.__name__
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _np(x, what: str) -> np.ndarray:
    """A numpy view of an array-like or a (CPU) torch tensor, without copying where possible."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        x = inputs.tensor_to_numpy(x, what)  # bf16/fp8 exactly as float32; sparse refused
    try:
        arr = np.asarray(x)
    except Exception as exc:  # ragged nested lists
        raise InputError(f"{what}: cannot be read as an array ({_brief(exc, 60)})") from None
    if arr.dtype == object:  # np.array(equal-shape arrays, dtype=object) holds plain ints
        try:
            ints = arr.astype(np.int64)
            same = bool(np.array_equal(ints.astype(object), arr))
        except (TypeError, ValueError, OverflowError):
            same = False
        if not same:
            raise InputError(f"{what}: ragged or non-numeric array")
        arr = ints
    if arr.dtype.kind not in "iu":
        if arr.dtype.kind == "f" and arr.size and np.all(arr == np.round(arr)):
            arr = arr.astype(np.int64)
        elif arr.dtype.kind == "b" and what.endswith("mask"):
            arr = arr.astype(np.int64)
        else:
            kind = "token counts" if what.startswith(("lengths", "total_lengths")) else "expert ids"
            raise InputError(f"{what}: expected integer {kind}, got dtype {arr.dtype}")
    if arr.dtype == np.uint64:  # uint64 with int64 arithmetic is float64 in numpy: made int64 here
        if arr.size and int(arr.max()) > np.iinfo(np.int64).max:
            raise InputError(f"{what}: values beyond the int64 range")
        arr = arr.astype(np.int64)
    return arr


def _lengths_vector(lengths, what: str = "lengths") -> np.ndarray:
    """``len_N`` from a 1-D int vector (a list, array or tensor); anything else is refused."""
    len_N = _np(lengths, what)
    if len_N.ndim != 1:
        raise InputError(f"{what}: expected a 1-D vector [N] of token counts, got shape {tuple(len_N.shape)}")
    return len_N.astype(np.int64)


def moe_layers(num_layers: int, moe_layer_freq) -> list[int]:
    """Megatron's ``moe_layer_freq``: an int f (layer l is MoE iff ``l % f == 0``) or a 0/1 list of
    length ``num_layers`` (as slime's ``actor.py`` reads it)."""
    _check_freq(moe_layer_freq)
    if isinstance(moe_layer_freq, (int, np.integer)):
        return [l for l in range(num_layers) if l % int(moe_layer_freq) == 0]
    freq = [int(f) for f in moe_layer_freq]
    if len(freq) != num_layers:
        raise InputError(f"moe_layer_freq: {len(freq)} entries, but the routes record {num_layers} layers")
    return [l for l, f in enumerate(freq) if f == 1]


def _check_freq(moe_layer_freq) -> None:
    """The domain of ``moe_layer_freq``, checked before any routes are read."""
    if moe_layer_freq is None:
        return
    if isinstance(moe_layer_freq, (bool, np.bool_)):
        raise InputError(f"moe_layer_freq: expected an int ≥ 1 or a 0/1 list, got {moe_layer_freq!r}")
    if isinstance(moe_layer_freq, (int, np.integer)):
        if moe_layer_freq < 1:
            raise InputError(f"moe_layer_freq: must be ≥ 1 (every f-th layer is MoE), got {moe_layer_freq}")
        return
    try:
        freq = list(moe_layer_freq)
    except TypeError:
        raise InputError(f"moe_layer_freq: expected an int ≥ 1 or a 0/1 list, got {moe_layer_freq!r}") from None
    if not freq or any(isinstance(f, (bool, np.bool_)) or f not in (0, 1) for f in freq) or 1 not in freq:
        shown = repr(freq) if len(repr(freq)) <= 60 else repr(freq)[:59] + "…"
        raise InputError(f"moe_layer_freq: expected a list of 0/1 with at least one 1, got {shown}")


def slime_pad_routes(num_layers: int, top_k: int, num_experts: int) -> np.ndarray:
    """``[La, K]`` routes slime gives the unrecorded last token (``_pad_routed_experts`` with pad 1:
    ``arange(La·K) % E``)."""
    return (np.arange(num_layers * top_k, dtype=np.int64) % num_experts).reshape(num_layers, top_k)


def _check_ids(routes_TLK: np.ndarray, E: int, sample: int) -> None:
    if routes_TLK.size == 0:
        return
    lo, hi = int(routes_TLK.min()), int(routes_TLK.max())
    if lo < 0 or hi >= E:
        bad = np.argwhere((routes_TLK < 0) | (routes_TLK >= E))[0]
        raise InputError(f"routes: sample {sample} token {bad[0]} layer {bad[1]} has expert id "
                         f"{int(routes_TLK[tuple(bad)])}, outside 0..{E - 1} (E = {E})")


def _duplicate_rows(routes_TLK: np.ndarray) -> np.ndarray:
    """``dup_TL[t, l]``: token t picks some expert twice at layer l (impossible for top-k)."""
    if routes_TLK.shape[2] < 2:
        return np.zeros(routes_TLK.shape[:2], dtype=bool)
    srt = np.sort(routes_TLK, axis=2)
    return (srt[:, :, 1:] == srt[:, :, :-1]).any(axis=2)


def _refuse_duplicates(routes_TLK: np.ndarray, sample: int, layer_ids, hint: str) -> None:
    """A token that picks an expert twice is one error; an all-zero token is named as padding."""
    dup = _duplicate_rows(routes_TLK)
    if not dup.any():
        return
    t, l = (int(x) for x in np.argwhere(dup)[0])
    if not routes_TLK[t].any():
        raise InputError(f"routes: sample {sample} token {t} is all-zero at every layer: padding, not a "
                         f"route; {hint}")
    raise InputError(f"routes: sample {sample} token {t} picks the same expert twice at layer {layer_ids[l]}")


def _impute(routes_TLK: np.ndarray, unrouted_TL: np.ndarray, sample: int) -> np.ndarray:
    """Replace unrouted rows by the nearest earlier routed token's row at that layer (the next one
    where none precedes)."""
    T = routes_TLK.shape[0]
    ok_TL = ~unrouted_TL
    if not ok_TL.any(axis=0).all():
        l = int(np.flatnonzero(~ok_TL.any(axis=0))[0])
        raise InputError(f"routes: sample {sample} has no routed token at layer {l} (all rows zero-filled)")
    t_T1 = np.arange(T)[:, None]
    prev_TL = np.maximum.accumulate(np.where(ok_TL, t_T1, -1), axis=0)
    nxt_TL = np.flip(np.minimum.accumulate(np.flip(np.where(ok_TL, t_T1, T), axis=0), axis=0), axis=0)
    src_TL = np.where(prev_TL >= 0, prev_TL, nxt_TL)
    l_1L = np.arange(routes_TLK.shape[1])[None, :]
    return routes_TLK[src_TL, l_1L]


def _sample_counts(routes_TLK: np.ndarray, E: int) -> np.ndarray:
    T, L, K = routes_TLK.shape
    flat = (np.arange(L, dtype=np.int64)[None, :, None] * E + routes_TLK).ravel()
    return np.bincount(flat, minlength=L * E).reshape(L, E)


class _Accumulator:
    """Counts of one sample at a time into a preallocated ``counts_NLE`` (its memory checked first)."""

    def __init__(self, N: int, L: int, E: int, K: int):
        need, avail = 8 * N * L * E, available_memory()  # int32 counts and the window's int32 copy
        if avail is not None and need > avail:
            raise InputError(f"num_experts={E}: counts [N={N}, L={L}, E] need {need / 2**30:.1f} GiB, "
                             f"{avail / 2**30:.1f} GiB is available; is E the model's experts per MoE layer?")
        self.counts_NLE = np.zeros((N, L, E), dtype=np.int32)
        self.lengths_N = np.zeros(N, dtype=np.int64)
        self.E, self.K, self.L = E, K, L
        self.max_id = -1

    def add(self, i: int, routes_TLK: np.ndarray, length: int) -> None:
        if routes_TLK.shape[1:] != (self.L, self.K):
            raise InputError(f"routes: sample {i} has shape {tuple(routes_TLK.shape)}; expected "
                             f"[T, {self.L}, {self.K}] like the samples before it (ragged layers or top-k)")
        self.counts_NLE[i] = _sample_counts(routes_TLK, self.E)
        self.lengths_N[i] = length
        if routes_TLK.size:
            self.max_id = max(self.max_id, int(routes_TLK.max()))


def _check_top_k(K: int, top_k, E: int) -> None:
    if top_k is not None and int(top_k) != K:
        raise InputError(f"routes: recorded top-k is {K}, but top_k={top_k} was given")
    if not 1 <= K <= E:
        raise InputError(f"routes: top-k {K} is not in 1..{E} (E = {E})")


def _check_E(num_experts) -> int:
    if num_experts is None or isinstance(num_experts, (bool, np.bool_)) \
            or not isinstance(num_experts, (int, np.integer)) or num_experts < 1:
        raise InputError(f"num_experts: expected a positive integer, got {num_experts!r}")
    if num_experts > MAX_EXPERTS:
        raise InputError(f"num_experts: {num_experts} is more than {MAX_EXPERTS} (ids are int32); "
                         "give the model's experts per MoE layer")
    return int(num_experts)


def _is_sequence(x) -> bool:
    """A per-sample sequence (list, tuple, lazy list, 1-D object array), not one numeric array."""
    if isinstance(x, np.ndarray):
        return x.dtype == object
    return not hasattr(x, "shape") and hasattr(x, "__len__") and hasattr(x, "__getitem__")


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
    from routepack_opt.integrations import _replay_kernels
    return _replay_kernels


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
    err_N = np.zeros(N, dtype=np.int64)
    imp_N = np.zeros(N, dtype=np.int64)
    max_N = np.full(N, -1, dtype=np.int64)
    with _threads_for(N):
        _kernels().count_rows(X_RLK, _i64(start_N), _i64(stop_N),
                              np.zeros(0, np.uint8) if mask_R is None else mask_R,
                              np.full(N, -1, np.int64) if last_N is None else _i64(last_N),
                              _i64(keep), _i64(dense), np.int64(E), bool(verl),
                              _no_pad(X_RLK.shape[2]) if pad_LK is None else pad_LK,
                              acc.counts_NLE, err_N, imp_N, max_N)
    if err_N.any():
        return False, 0
    acc.max_id = int(max_N.max())
    return True, int(imp_N.sum())


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


# --- files -------------------------------------------------------------------------------------
@functools.cache
def _numpy_globals() -> dict[str, object]:
    """What a pickle of numeric numpy arrays needs, and nothing else: ``_reconstruct`` (under
    numpy 1's and numpy 2's module names), ``ndarray``, ``dtype``, numeric scalars and the
    numeric/bool/object dtype classes. None of them runs code given by the file."""
    try:
        ma = importlib.import_module("numpy._core.multiarray")
    except ImportError:  # numpy 1
        ma = importlib.import_module("numpy.core.multiarray")
    out: dict[str, object] = {"numpy.ndarray": np.ndarray, "numpy.dtype": np.dtype}
    for mod in ("numpy._core.multiarray", "numpy.core.multiarray"):
        out[f"{mod}._reconstruct"] = ma._reconstruct
        out[f"{mod}.scalar"] = ma.scalar
    for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
              np.float16, np.float32, np.float64, np.bool_, np.object_):
        cls = type(np.dtype(t))
        if cls is not np.dtype:  # numpy ≥ 1.25: one class per dtype (numpy.dtypes.Int64DType, ...)
            out[f"numpy.dtypes.{cls.__name__}"] = cls
    return out


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """The restricted unpickler of Python's docs ("Restricting Globals"): it resolves only the
    numpy names of :func:`_numpy_globals`, so an object ``.npy`` of numeric arrays loads and
    anything else (a function, a class, ``os.system``) is refused before it is called."""

    def find_class(self, module, name):
        obj = _numpy_globals().get(f"{module}.{name}")
        if obj is None:
            raise pickle.UnpicklingError(f"refused global {module}.{name}")
        return obj


_SAVE_HINT = "save each sample as a numeric array (np.savez(path, *arrays) or a .pt of tensors)"


def _read_npy(fh, where: str, mmap_path: Path | None = None):
    """One ``.npy`` (a file or an ``.npz`` member): numeric arrays memory-mapped where a path is
    given, object arrays through :class:`_NumpyOnlyUnpickler`."""
    version = np.lib.format.read_magic(fh)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
    else:
        raise InputError(f"{where}: .npy format version {version} is not supported (save with numpy's np.save)")
    if not dtype.hasobject:
        if mmap_path is not None:
            return np.load(mmap_path, mmap_mode="r", allow_pickle=False)
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        raw = fh.read(size)
        if len(raw) != size:
            raise InputError(f"{where}: truncated ({len(raw)} of {size} bytes)")
        return np.frombuffer(raw, dtype=dtype).reshape(shape, order="F" if fortran else "C")
    try:
        arr = _NumpyOnlyUnpickler(fh).load()
    except Exception as exc:
        raise InputError(f"{where}: an object array of more than numeric arrays ({_brief(exc, 50)}); "
                         f"{_SAVE_HINT}") from None
    if not isinstance(arr, np.ndarray):
        raise InputError(f"{where}: the object array did not load as an array; {_SAVE_HINT}")
    return arr


class _NpzSamples:
    """An ``.npz`` of positional members ``arr_0 .. arr_{N-1}`` (``np.savez(path, *arrays)``) as a
    per-sample sequence, each member read when its sample is."""

    def __init__(self, data, path: Path, n: int):
        self._data, self._path, self._n = data, path, n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int):
        return _npz_member(self._data, self._path, f"arr_{i}")


class _NpzMembers(Mapping):
    """The named members of an ``.npz``, each read when it is looked up."""

    def __init__(self, data, path: Path):
        self._data, self._path = data, path

    def __getitem__(self, key):
        if key not in self._data.files:
            raise KeyError(key)
        return _npz_member(self._data, self._path, key)

    def __iter__(self):
        return iter(self._data.files)

    def __len__(self) -> int:
        return len(self._data.files)


def _npz_member(data, path: Path, key: str):
    try:
        with data.zip.open(f"{key}.npy") as fh:
            return _read_npy(fh, f"{path}[{key}]")
    except InputError:
        raise
    except inputs.READ_ERRORS as exc:  # bad deflate data, CRC, truncation
        raise InputError(f"{path}[{key}]: damaged member ({_brief(exc, 60)})") from None


def _load_npz(path: Path):
    # every member's zip entry and .npy header checked, and its data decompressed once, first
    data = inputs.NpzArchive(path, "routes file", allow_object=True)
    if data.damaged:  # a member whose header's size is not what it holds
        raise InputError(next(iter(data.damaged.values())))
    names = data.files
    positional = sorted((n for n in names if re.fullmatch(r"arr_\d+", n)), key=lambda n: int(n[4:]))
    if positional and len(positional) == len(names):
        if [int(n[4:]) for n in positional] != list(range(len(positional))):
            raise InputError(f"{path}: positional arrays arr_0.. are not numbered 0..{len(positional) - 1}")
        return _NpzSamples(data, path, len(positional))
    return _NpzMembers(data, path)


def _load_pt(path: Path):
    """``torch.load`` with ``weights_only=True`` and numpy's array types allowed (never a full
    unpickle): tensors, numpy arrays, lists, tuples, dicts and numbers load; anything else is
    refused with the global that was refused."""
    torch = _deps.torch()
    allowed = [(obj, name) for name, obj in _numpy_globals().items()]
    try:
        with torch.serialization.safe_globals(allowed):
            try:
                return torch.load(path, map_location="cpu", mmap=True, weights_only=True)
            except RuntimeError as exc:  # a legacy (non-zip) .pt cannot be memory-mapped
                if "mmap" not in str(exc):
                    raise
                return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL ([\w.]+)", _ANSI.sub("", str(exc)))
        if found is None:  # torch's own reason is the line after its long preamble
            why = re.search(r"WeightsUnpickler error:\s*([^\n]+)", _ANSI.sub("", str(exc)))
            reason = why.group(1).strip()[:80] if why else _brief(exc, 80)
            raise InputError(f"{path}: not a readable .pt file ({reason})") from None
        raise InputError(f"{path}: holds '{found.group(1)}', which the safe loader refuses; save the routes "
                         "as tensors or numeric numpy arrays (in lists or dicts)") from None


def _load_file(path: Path):
    """The routes container in a file: an array, a tensor, a per-sample sequence or a mapping."""
    inputs.check_input(path, "routes file")  # a FIFO, device or directory: refused, never opened
    suf = path.suffix.lower()
    try:
        if suf == ".npy":
            inputs.check_npy_file(path, "routes file", allow_object=True)
            with inputs.open_input(path, "routes file") as fh:
                return _read_npy(fh, str(path), mmap_path=path)
        if suf == ".npz":
            return _load_npz(path)
        if suf == ".safetensors":
            return _SafetensorsMembers(inputs.SafetensorsFile(path))
        if suf in (".pt", ".pth"):
            loaded = _load_pt(path)
            inputs.check_tensors(loaded, str(path))  # sparse / quantized: refused before any slicing
            return loaded
    except InputError:
        raise
    except ImportError as exc:
        raise InputError(f"{path}: reading it needs {exc.name} (pip install {exc.name})") from None
    except Exception as exc:
        raise InputError(f"{path}: not a readable routes file ({_brief(exc)})") from None
    raise InputError(f"{path}: unknown routes file type '{suf}' (use .npy, .npz, .pt or .safetensors)")


class _SafetensorsMembers(Mapping):
    """A safetensors file's tensors; ``routes`` and ``routed_experts`` stay lazy (read by slices)."""

    def __init__(self, fh):
        self._fh = fh

    def __getitem__(self, key):
        if key not in self._fh.keys():
            raise KeyError(key)
        if key in ("routes", "routed_experts", "rollout_routed_experts"):
            return _SafetensorsSlices(self._fh, key)
        return self._fh.get_tensor(key)

    def __iter__(self):
        return iter(self._fh.keys())

    def __len__(self) -> int:
        return len(self._fh.keys())


class _SafetensorsSlices:
    """Lazy ``tensor[a:b]`` over a safetensors member (one sample read at a time)."""

    def __init__(self, fh, key: str):
        self._slice = fh.get_slice(key)
        self.shape = tuple(self._slice.get_shape())

    def __getitem__(self, key):
        return np.asarray(self._slice[key])


# Keys of a mapping, per format: (routes key(s), lengths key(s)); verl's mask is its own key.
_KEYS = {"slime": (("rollout_routed_experts", "routes"), ("total_lengths", "lengths")),
         "verl": (("routed_experts",), ()),
         "routes": (("routes",), ("lengths",))}
_FORMAT_OF_KEY = {"rollout_routed_experts": "slime", "routed_experts": "verl", "routes": "routes"}


def _unpack(loaded, format: str, where: str, lengths, attention_mask):
    """(routes, lengths, attention_mask) out of a loaded container, by the format's keys."""
    if not isinstance(loaded, Mapping):
        return loaded, lengths, attention_mask
    keys = sorted(str(k) for k in loaded)
    route_keys, length_keys = _KEYS[format]
    key = next((k for k in route_keys if k in loaded), None)
    if key is None:
        other = next((f for k, f in _FORMAT_OF_KEY.items() if k in loaded and f != format), None)
        hint = f"; it looks like format '{other}'" if other else ""
        shown = ", ".join(keys[:6]) + (", …" if len(keys) > 6 else "")
        raise InputError(f"{where}: missing '{route_keys[0]}' for format '{format}' (has {shown or 'nothing'}){hint}")
    if lengths is None:
        lengths = next((loaded[k] for k in length_keys if k in loaded), None)
    if format == "verl" and attention_mask is None and "attention_mask" in loaded:
        attention_mask = loaded["attention_mask"]
    return loaded[key], lengths, attention_mask


def _lengths_arg(lengths):
    if isinstance(lengths, (str, Path)):
        p = Path(lengths)
        try:
            return inputs.read_npy(p, "lengths file")
        except InputError:
            raise
        except Exception as exc:
            raise InputError(f"{p}: not a readable .npy lengths vector ({_brief(exc, 60)})") from None
    return lengths


# --- entry points ------------------------------------------------------------------------------
def import_replay(source, *, format: str = "routes", num_experts: int, lengths=None,
                  attention_mask=None, moe_layer_freq=None, top_k: int | None = None,
                  group_ids=None, step: int | None = None, pad_last: bool = True) -> ReplayImport:
    """Build a window from recorded routes (see the module docstring for the formats).

    ``source``: the routes in memory (a list of per-sample arrays or a padded ``[N, T, La, K]``
    tensor for slime, ``[B, S, La, K]`` for verl, ``[ΣT, L, K]`` or a per-sample list for plain
    routes) or a file path (``.pt``/``.npy``/``.npz``/``.safetensors``: a list, an array, or a
    mapping with the format's keys: ``rollout_routed_experts`` + ``total_lengths`` for slime,
    ``routed_experts`` + ``attention_mask`` for verl, ``routes`` + ``lengths``). ``moe_layer_freq``
    keeps only the MoE layers of what was recorded, in every format. Bad routes (ids ≥ E or
    negative, wrong or ragged top-k/layers, a token picking one expert twice, lengths that do not
    match) raise an :class:`InputError`.
    """
    if format not in FORMATS:
        raise InputError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    E = _check_E(num_experts)
    _check_freq(moe_layer_freq)
    lengths = _lengths_arg(lengths)
    if lengths is not None:
        lengths = _lengths_vector(lengths)
    where = str(source) if isinstance(source, (str, Path)) else "source"
    loaded = _load_file(Path(source)) if isinstance(source, (str, Path)) else source
    source, lengths, attention_mask = _unpack(loaded, format, where, lengths, attention_mask)
    # The compiled pass first; the reference numpy path for what it does not take (a lazy file
    # member, a GPU tensor, an odd dtype or layout) and for bad routes, whose exact message it raises.
    if format == "slime":
        res = _fast_slime(source, E, lengths, moe_layer_freq, top_k, pad_last) \
            or _from_slime(source, E, lengths, moe_layer_freq, top_k, pad_last)
    elif format == "verl":
        res = _fast_verl(source, attention_mask, E, moe_layer_freq, top_k) \
            or _from_verl(source, attention_mask, E, moe_layer_freq, top_k)
    else:
        res = _fast_routes(source, lengths, E, moe_layer_freq, top_k) \
            or _from_routes(source, lengths, E, moe_layer_freq, top_k)
    acc, keep, dropped, imputed, pad, skipped, notes = res
    if 0 <= acc.max_id < E - 1:
        notes.append(f"num_experts={E} but the routes' expert ids reach only {acc.max_id}: experts "
                     f"{acc.max_id + 1}..{E - 1} get no tokens (is E right?)")
    # copy=False: the window takes the counts built for it (one [N, L, E] array in memory, not two)
    window = Window(acc.lengths_N, acc.counts_NLE, top_k=acc.K, group_ids=group_ids, step=step, copy=False)
    return ReplayImport(window, format, keep, dropped, imputed, pad, acc.max_id, skipped, tuple(notes))


_WARMED: set = set()  # warm_import's kinds done in this process


def warm_import(source, *, format: str, num_experts: int, attention_mask=None, lengths=None,
                moe_layer_freq=None) -> None:
    """Compile (or load from numba's cache) the import's pass for ``source``'s dtype and layout by
    importing its first sample only, so that a seam's clock (and the import rate it measures to
    predict the next import) holds no compilation. Bad routes are left for the real call to
    report: any error here is ignored. Once per process for each (format, container, id dtype,
    rank): a seam calls it every step, and only the first of a kind compiles anything."""
    try:
        x = source[0] if _is_sequence(source) else source
        key = (format, _is_sequence(source), str(getattr(x, "dtype", type(x).__name__)), getattr(x, "ndim", None))
        if key in _WARMED:
            return
        _WARMED.add(key)
        first = source[:1]
        kw: dict = dict(format=format, num_experts=num_experts, moe_layer_freq=moe_layer_freq)
        if attention_mask is not None:
            kw["attention_mask"] = attention_mask[:1]
        if lengths is not None:
            kw["lengths"] = list(lengths)[:1]
        import_replay(first, **kw)
    except Exception:  # noqa: BLE001 - the real import raises the message
        pass


def window_from_replay(source, **kwargs) -> Window:
    """:func:`import_replay` without the report: just the window."""
    return import_replay(source, **kwargs).window


def save_window_atomic(window: Window, path: str | Path, inputs: Iterable = ()) -> Path:
    """Write a window ``.npz`` through the package's atomic writer (:mod:`routepack_opt.core.io`),
    refusing a directory, a missing directory or any of ``inputs`` as the target."""
    out = check_output_path(path, *[p for p in inputs if isinstance(p, (str, Path))])
    assert out is not None
    save_window(window, out)
    return out

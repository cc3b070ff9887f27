"""Checks and counts of recorded routes, shared by the reference path, the compiled pass and the
file readers: a numpy view of what a trainer hands over, the domain checks with their messages
(expert ids, top-k, ``num_experts``, ``moe_layer_freq``), verl's imputation of unrouted rows and
the per-sample counts into one preallocated ``counts[N, L, E]``.

Legend: N samples, T tokens of one sample, La all recorded layers, L MoE layers kept, K router
top-k, E logical experts.
"""

from __future__ import annotations

import re

import numpy as np

from routepack_opt.core import inputs
from routepack_opt.core.checks import check_int, int_array, is_integer, shown
from routepack_opt.core.errors import InputError
from routepack_opt.core.window import available_memory

MAX_EXPERTS = 2**31 - 1  # expert ids and per-expert counts are stored as int32
MAX_LAYERS = 1 << 16  # recorded decoder layers of one model (far above any real one)


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
            arr = int_array(arr, what)  # finite and in range, checked before the cast (never −2⁶³)
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
    num_layers = check_int(num_layers, "num_layers", 1, MAX_LAYERS)
    if moe_layer_freq is None:
        raise InputError("moe_layer_freq: expected an int ≥ 1 or a 0/1 list, got None")
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
    if isinstance(moe_layer_freq, (bool, np.bool_, str, bytes, dict)) or \
            (isinstance(moe_layer_freq, np.ndarray) and moe_layer_freq.ndim != 1):
        raise InputError(f"moe_layer_freq: expected an int ≥ 1 or a 0/1 list, got {shown(moe_layer_freq)}")
    if isinstance(moe_layer_freq, (int, np.integer)):
        if moe_layer_freq < 1:
            raise InputError(f"moe_layer_freq: must be ≥ 1 (every f-th layer is MoE), got {moe_layer_freq}")
        return
    try:
        freq = list(moe_layer_freq)
    except TypeError:
        raise InputError(f"moe_layer_freq: expected an int ≥ 1 or a 0/1 list, got {shown(moe_layer_freq)}") from None
    if not freq or any(not is_integer(f) or f not in (0, 1) for f in freq) or 1 not in freq:
        raise InputError(f"moe_layer_freq: expected a list of 0/1 with at least one 1, got {shown(freq)}")


def slime_pad_routes(num_layers: int, top_k: int, num_experts: int) -> np.ndarray:
    """``[La, K]`` routes slime gives the unrecorded last token (``_pad_routed_experts`` with pad 1:
    ``arange(La·K) % E``)."""
    num_layers = check_int(num_layers, "num_layers", 1, MAX_LAYERS)
    num_experts = _check_E(num_experts)
    top_k = check_int(top_k, "top_k", 1, min(num_experts, MAX_LAYERS))  # a token's top-k experts are distinct
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



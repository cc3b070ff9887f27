"""Routing-replay import: the per-token routes trainers record → a window (lengths, counts[N, L, E]).

Legend: N samples, T tokens of one sample, B batch rows, S padded sequence length, La all
decoder layers (dense ones included), L MoE layers, K router top-k, E logical experts.

Formats (what each framework records; docs in the module functions):

- ``slime``: ``rollout_routed_experts``, a list of per-sample arrays ``[T_i, La, K]``. slime
  records one route fewer than the sample has tokens (``experts.shape[0] == len(tokens) - 1``,
  asserted in ``slime/backends/megatron_utils/cp_utils.py``) and pads the last token at training
  time with ``arange(La·K) % E``; we count that pad route too, because it is what the replayed
  step routes. Dense layers (``moe_layer_freq``) are recorded as all-zero rows and are dropped,
  from ``moe_layer_freq`` when given, else detected (all-zero in every token of every sample).
- ``verl``: ``routed_experts [B, S, La, K]`` (zero-filled outside the sample) with the batch's
  ``attention_mask [B, S]``. Padding is skipped; inside the mask, zero-filled rows (the last
  position, whose route the rollout engine does not return, verl #7075) are *unrouted*, not load
  on expert 0: they are imputed from the nearest routed token of the same sample and counted
  in the report.
- ``routes``: plain per-token routes ``[ΣT, L, K]`` with a ``lengths [N]`` vector, in memory or
  in a ``.npy`` (+ lengths), ``.pt`` or ``.safetensors`` file holding ``routes`` and ``lengths``.

Memory: counts are accumulated one sample at a time; files are memory-mapped (``np.load`` with
``mmap_mode``, ``torch.load(mmap=True)``, safetensors slices), so no more than one sample's routes
are materialized beyond the counts array. The exception is ``.npz`` (a zip archive cannot be
memory-mapped: its ``routes`` array is read whole); use ``.npy``, ``.pt`` or ``.safetensors`` for
large replays. In-memory inputs (a verl batch, slime's list) are read one sample at a time.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from routepack_opt.core.errors import InputError
from routepack_opt.core.window import Window, save_window
from routepack_opt.integrations import _deps

__all__ = ["ReplayImport", "import_replay", "window_from_replay", "FORMATS", "moe_layers",
           "slime_pad_routes", "save_window_atomic"]

FORMATS = ("slime", "verl", "routes")


@dataclasses.dataclass(frozen=True)
class ReplayImport:
    """The window plus what the import did to get it (reported, never silent)."""

    window: Window
    format: str
    moe_layers: tuple[int, ...]        # indices of the recorded layers kept as MoE layers
    dropped_layers: tuple[int, ...]    # recorded layers dropped as dense
    imputed_tokens: int                # unrouted (zero-filled) token rows imputed (verl)
    pad_tokens: int                    # last-token pad routes counted (slime)

    def report(self) -> dict:
        w = self.window
        return {"format": self.format, "samples": w.num_samples, "layers": w.num_layers,
                "experts": w.num_experts, "top_k": w.top_k, "tokens": w.total_tokens,
                "moe_layers": list(self.moe_layers), "dropped_layers": list(self.dropped_layers),
                "imputed_tokens": self.imputed_tokens, "pad_tokens": self.pad_tokens}


# --- helpers -----------------------------------------------------------------------------------
def _np(x, what: str) -> np.ndarray:
    """A numpy view of an array-like or a (CPU) torch tensor, without copying where possible."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        x = x.detach().cpu().numpy()
    try:
        arr = np.asarray(x)
    except Exception as exc:  # ragged nested lists
        raise InputError(f"{what}: cannot be read as an array ({exc})") from None
    if arr.dtype == object:
        raise InputError(f"{what}: ragged or non-numeric array")
    if arr.dtype.kind not in "iu":
        if arr.dtype.kind == "f" and arr.size and np.all(arr == np.round(arr)):
            arr = arr.astype(np.int64)
        elif arr.dtype.kind == "b" and what.endswith("mask"):
            arr = arr.astype(np.int64)
        else:
            raise InputError(f"{what}: expected integer expert ids, got dtype {arr.dtype}")
    return arr


def moe_layers(num_layers: int, moe_layer_freq) -> list[int]:
    """Megatron's ``moe_layer_freq``: an int f (layer l is MoE iff ``l % f == 0``) or a 0/1 list of
    length ``num_layers`` (as slime's ``actor.py`` reads it)."""
    if isinstance(moe_layer_freq, (bool, np.bool_)):
        raise InputError(f"moe_layer_freq: expected an int or a 0/1 list, got {moe_layer_freq!r}")
    if isinstance(moe_layer_freq, (int, np.integer)):
        if moe_layer_freq < 1:
            raise InputError(f"moe_layer_freq: must be ≥ 1, got {moe_layer_freq}")
        return [l for l in range(num_layers) if l % int(moe_layer_freq) == 0]
    freq = list(moe_layer_freq)
    if len(freq) != num_layers or any(f not in (0, 1) for f in freq):
        raise InputError(f"moe_layer_freq: expected {num_layers} entries of 0/1, got {freq!r}")
    return [l for l, f in enumerate(freq) if f == 1]


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
    """Counts of one sample at a time into a preallocated ``counts_NLE``."""

    def __init__(self, N: int, L: int, E: int, K: int):
        self.counts_NLE = np.zeros((N, L, E), dtype=np.int32)
        self.lengths_N = np.zeros(N, dtype=np.int64)
        self.E, self.K, self.L = E, K, L

    def add(self, i: int, routes_TLK: np.ndarray, length: int) -> None:
        if routes_TLK.shape[1:] != (self.L, self.K):
            raise InputError(f"routes: sample {i} has shape {tuple(routes_TLK.shape)}; expected "
                             f"[T, {self.L}, {self.K}] like the samples before it (ragged layers or top-k)")
        self.counts_NLE[i] = _sample_counts(routes_TLK, self.E)
        self.lengths_N[i] = length


def _check_top_k(K: int, top_k, E: int) -> None:
    if top_k is not None and int(top_k) != K:
        raise InputError(f"routes: recorded top-k is {K}, but top_k={top_k} was given")
    if not 1 <= K <= E:
        raise InputError(f"routes: top-k {K} is not in 1..{E} (E = {E})")


def _check_E(num_experts) -> int:
    if num_experts is None or isinstance(num_experts, bool) or int(num_experts) != num_experts or num_experts < 1:
        raise InputError(f"num_experts: expected a positive integer, got {num_experts!r}")
    return int(num_experts)


# --- slime -------------------------------------------------------------------------------------
def _from_slime(samples, E: int, lengths, moe_layer_freq, top_k, pad_last: bool):
    seq = samples if isinstance(samples, (list, tuple)) else list(samples)
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
        lengths = _np(lengths, "lengths").reshape(-1)
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
        dup = _duplicate_rows(r)
        if dup.any():
            t, l = np.argwhere(dup)[0]
            raise InputError(f"routes: sample {i} token {t} picks the same expert twice at MoE layer {keep[l]}")
        T = r.shape[0] + (1 if pad_last else 0)
        if lengths is not None and int(lengths[i]) != T:
            raise InputError(f"lengths: sample {i} has {int(lengths[i])} tokens but {r.shape[0]} recorded "
                             f"routes (slime records len - 1{'' if pad_last else '; pad_last=False: len'})")
        if T < 1:
            raise InputError(f"routes: sample {i} has no tokens")
        acc.add(i, r, T)
        if pad_last:
            acc.counts_NLE[i] += _sample_counts(pad_LK[None], E).astype(np.int32)
    return acc, tuple(keep), tuple(dropped), 0, N if pad_last else 0


# --- verl --------------------------------------------------------------------------------------
def _from_verl(routed, attention_mask, E: int, moe_layer_freq, top_k):
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
    return acc, tuple(keep), tuple(l for l in range(La) if l not in keep), imputed, 0


# --- plain routes ------------------------------------------------------------------------------
def _from_routes(routes, lengths, E: int, top_k):
    R_TLK = routes if hasattr(routes, "shape") else _np(routes, "routes")
    if len(R_TLK.shape) != 3:
        raise InputError(f"routes: expected [tokens, layers, top_k], got shape {tuple(R_TLK.shape)}")
    if lengths is None:
        raise InputError("routes: plain routes need a lengths vector")
    len_N = _np(lengths, "lengths").reshape(-1).astype(np.int64)
    if len_N.size == 0:
        raise InputError("lengths: no samples")
    if (len_N < 1).any():
        raise InputError(f"lengths: every sample needs at least 1 token (sample {int(np.argmin(len_N))})")
    Ttot, L, K = (int(x) for x in R_TLK.shape)
    if int(len_N.sum()) != Ttot:
        raise InputError(f"routes: {Ttot} tokens but lengths sum to {int(len_N.sum())}")
    _check_top_k(K, top_k, E)
    acc = _Accumulator(len_N.size, L, E, K)
    start = 0
    for i, n in enumerate(len_N.tolist()):
        r = _np(R_TLK[start:start + n], "routes")
        start += n
        _check_ids(r, E, i)
        dup = _duplicate_rows(r)
        if dup.any():
            t, l = np.argwhere(dup)[0]
            raise InputError(f"routes: sample {i} token {t} picks the same expert twice at layer {l}")
        acc.add(i, r, n)
    return acc, tuple(range(L)), (), 0, 0


def _load_file(path: Path, lengths):
    """(routes, lengths) from a file, memory-mapped."""
    if not path.exists():
        raise InputError(f"{path}: no such file")
    suf = path.suffix.lower()
    try:
        if suf == ".npy":
            routes = np.load(path, mmap_mode="r", allow_pickle=False)
            return routes, lengths
        if suf == ".npz":
            data = np.load(path, allow_pickle=False)
            if "routes" not in data.files:
                raise InputError(f"{path}: missing array 'routes' (has {sorted(data.files)})")
            return data["routes"], (data["lengths"] if lengths is None and "lengths" in data.files else lengths)
        if suf == ".safetensors":
            fh = _deps.safe_open()(str(path), framework="np")
            keys = set(fh.keys())
            if "routes" not in keys:
                raise InputError(f"{path}: missing tensor 'routes' (has {sorted(keys)})")
            if lengths is None and "lengths" in keys:
                lengths = fh.get_tensor("lengths")
            return _SafetensorsRoutes(fh), lengths
        if suf in (".pt", ".pth"):
            obj = _deps.torch().load(path, map_location="cpu", mmap=True, weights_only=True)
            return obj, lengths
    except InputError:
        raise
    except ImportError as exc:
        raise InputError(f"{path}: reading it needs {exc.name} (pip install {exc.name})") from None
    except Exception as exc:
        raise InputError(f"{path}: not a readable routes file ({exc.__class__.__name__}: {exc})") from None
    raise InputError(f"{path}: unknown routes file type '{suf}' (use .npy, .npz, .pt or .safetensors)")


class _SafetensorsRoutes:
    """Lazy ``routes[a:b]`` over a safetensors file (one sample read at a time)."""

    def __init__(self, fh):
        self._slice = fh.get_slice("routes")
        self.shape = tuple(self._slice.get_shape())

    def __getitem__(self, key):
        return np.asarray(self._slice[key])


def _lengths_arg(lengths):
    if isinstance(lengths, (str, Path)):
        p = Path(lengths)
        if not p.exists():
            raise InputError(f"{p}: no such file")
        try:
            return np.load(p, allow_pickle=False)
        except Exception as exc:
            raise InputError(f"{p}: not a readable .npy lengths vector ({exc})") from None
    return lengths


# --- entry points ------------------------------------------------------------------------------
def import_replay(source, *, format: str = "routes", num_experts: int, lengths=None,
                  attention_mask=None, moe_layer_freq=None, top_k: int | None = None,
                  group_ids=None, step: int | None = None, pad_last: bool = True) -> ReplayImport:
    """Build a window from recorded routes (see the module docstring for the formats).

    ``source``: the routes in memory (a list of per-sample arrays for slime, ``[B, S, La, K]`` for
    verl, ``[ΣT, L, K]`` for plain routes) or a file path (``.pt``/``.npy``/``.npz``/``.safetensors``;
    for slime a ``.pt`` list, for verl a ``.pt`` dict with ``routed_experts`` and
    ``attention_mask``). Bad routes (ids ≥ E or negative, wrong or ragged top-k/layers, a token
    picking one expert twice, lengths that do not match) raise an :class:`InputError`.
    """
    if format not in FORMATS:
        raise InputError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    E = _check_E(num_experts)
    lengths = _lengths_arg(lengths)
    if isinstance(source, (str, Path)):
        loaded, lengths = _load_file(Path(source), lengths)
        if isinstance(loaded, dict):
            d = loaded
            if format == "verl":
                if "routed_experts" not in d:
                    raise InputError(f"{source}: missing 'routed_experts' (has {sorted(d)})")
                loaded = d["routed_experts"]
                attention_mask = d.get("attention_mask", attention_mask)
            elif format == "slime":
                key = "rollout_routed_experts" if "rollout_routed_experts" in d else "routes"
                if key not in d:
                    raise InputError(f"{source}: missing 'rollout_routed_experts' (has {sorted(d)})")
                loaded = d[key]
                lengths = d.get("total_lengths", lengths)
            else:
                if "routes" not in d:
                    raise InputError(f"{source}: missing 'routes' (has {sorted(d)})")
                loaded, lengths = d["routes"], d.get("lengths", lengths)
        source = loaded
    if format == "slime":
        acc, keep, dropped, imputed, pad = _from_slime(source, E, lengths, moe_layer_freq, top_k, pad_last)
    elif format == "verl":
        acc, keep, dropped, imputed, pad = _from_verl(source, attention_mask, E, moe_layer_freq, top_k)
    else:
        acc, keep, dropped, imputed, pad = _from_routes(source, lengths, E, top_k)
    window = Window(acc.lengths_N, acc.counts_NLE, top_k=acc.K, group_ids=group_ids, step=step)
    return ReplayImport(window, format, keep, dropped, imputed, pad)


def window_from_replay(source, **kwargs) -> Window:
    """:func:`import_replay` without the report: just the window."""
    return import_replay(source, **kwargs).window


def save_window_atomic(window: Window, path: str | Path, inputs: Iterable = ()) -> Path:
    """Write a window ``.npz`` atomically (temp file in the target directory, fsync, ``os.replace``),
    refusing to write over any of ``inputs``."""
    path = Path(path)
    if not path.parent.exists():
        raise InputError(f"{path}: directory {path.parent} does not exist")
    for src in inputs:
        if src is not None and isinstance(src, (str, Path)) and Path(src).exists() \
                and Path(src).resolve() == path.resolve():
            raise InputError(f"{path}: refusing to write the window over an input file")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_window(window, tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path

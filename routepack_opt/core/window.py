"""The window: one optimizer step's samples with their lengths and replayed routing counts.

Legend (shape suffixes): N samples, L MoE layers, E logical experts, T tokens, K router top-k.

The window is immutable and validated once, when built (PyVRP's ``ProblemData`` habit): every
array is copied, checked and made read-only; changes go through :meth:`Window.replace`.
"""

from __future__ import annotations

import dataclasses
import zipfile
from pathlib import Path

import numpy as np

from routepack_opt.core.checks import INT64_MAX, check_int, check_path, check_type, int_array
from routepack_opt.core.errors import InputError
from routepack_opt.core.inputs import NpzArchive, available_memory
from routepack_opt.core.io import atomic_open

__all__ = ["Window", "load_window", "save_window", "write_window_npz", "counts_dtype",
           "check_window_memory", "available_memory"]

# Tokens of one sample: counts are int32 (≤ length each), and token sums of a window stay exact.
MAX_LENGTH = 2**31 - 1


def _as_int_array(name: str, value, ndim: int, dtype=np.int64, copy: bool = True) -> np.ndarray:
    """``value`` as a read-only ``dtype`` array of rank ``ndim`` (a copy, unless ``copy`` is
    False and it already is a C-contiguous ``dtype`` array) or an :class:`InputError`."""
    # exact integers of ``dtype``'s range, checked before any cast (checks.int_array: a NaN, an
    # inf, 2.5 or 2⁶⁴ is refused with the value quoted, never cast and wrapped); booleans,
    # strings and complex numbers are not token counts
    arr = int_array(value, name, ndim=ndim, dtype=dtype)
    if not copy and isinstance(value, np.ndarray) and arr.dtype == dtype and arr.flags.c_contiguous:
        out = arr
    elif arr is not value and arr.base is None and arr.flags.c_contiguous:  # already a new array
        out = arr
    else:
        out = arr.astype(dtype, copy=True)
    out.setflags(write=False)
    return out


@dataclasses.dataclass(frozen=True, eq=False)
class Window:
    """Samples of one optimizer step (docs/model.md).

    ``lengths_N`` tokens per sample; ``counts_NLE[i, l, e]`` tokens of sample i routed to logical
    expert e at MoE layer l. Invariants (checked): lengths ≥ 1; counts ≥ 0;
    Σ_e counts[i, l, e] = top_k · lengths[i]; counts[i, l, e] ≤ lengths[i].

    The window holds read-only copies of ``lengths`` (int64) and ``counts`` (int32);
    ``copy=False`` takes arrays that already have those dtypes (C-contiguous) as they are, and
    marks them read-only — one copy of the counts in memory instead of two, for arrays built
    for the window (``load_window`` does it for int32 files).
    """

    lengths: np.ndarray
    counts: np.ndarray
    top_k: int
    group_ids: np.ndarray | None = None
    step: int | None = None

    def __init__(self, lengths, counts, top_k: int | None = None, group_ids=None, step=None, *,
                 copy: bool = True):
        lengths_N = _as_int_array("lengths", lengths, 1, copy=copy)
        counts_NLE = _as_int_array("counts", counts, 3, np.int32, copy=copy)
        n = lengths_N.shape[0]
        if n == 0:
            raise InputError("lengths: the window holds no samples")
        if counts_NLE.shape[0] != n:
            raise InputError(
                f"counts: first dimension {counts_NLE.shape[0]} does not match "
                f"the {n} samples of lengths"
            )
        if counts_NLE.shape[1] == 0 or counts_NLE.shape[2] == 0:
            raise InputError(f"counts: shape {tuple(counts_NLE.shape)} has no layers or no experts")
        too_long = np.flatnonzero(lengths_N > MAX_LENGTH)
        if too_long.size:
            raise InputError(f"lengths: samples {_few(too_long)} have {_few(lengths_N[too_long])} tokens; "
                             f"at most {MAX_LENGTH:,} per sample")
        bad = np.flatnonzero(lengths_N < 1)
        if bad.size:
            raise InputError(
                f"lengths: every sample needs at least 1 token; samples {_few(bad)} have "
                f"{_few(lengths_N[bad])}"
            )
        if counts_NLE.min() < 0:
            i, l, e = np.argwhere(counts_NLE < 0)[0]
            raise InputError(f"counts: negative count {counts_NLE[i, l, e]} at sample {i}, layer {l}, expert {e}")
        # counts ≤ len, checked on the per-(sample, layer) maxima: no [N, L, E] temporary
        over_NL = counts_NLE.max(axis=2) > lengths_N[:, None]
        if over_NL.any():
            i, l = np.argwhere(over_NL)[0]
            e = int(np.argmax(counts_NLE[i, l]))
            raise InputError(
                f"counts: sample {i} sends {counts_NLE[i, l, e]} tokens to expert {e} at layer {l} "
                f"but has only {lengths_N[i]} tokens (top-k experts of a token are distinct)"
            )
        sums_NL = counts_NLE.sum(axis=2, dtype=np.int64)
        E = counts_NLE.shape[2]
        if top_k is None:
            if sums_NL[0, 0] % lengths_N[0]:
                raise InputError(
                    "counts: cannot infer top_k: sample 0 layer 0 routes "
                    f"{sums_NL[0, 0]} tokens for length {lengths_N[0]} (not a multiple)"
                )
            top_k = int(sums_NL[0, 0] // lengths_N[0])
        else:
            top_k = check_int(top_k, "top_k")
        if not 1 <= top_k <= E:
            raise InputError(f"top_k: {top_k} is not in 1..{E} (E = {E} experts)")
        wrong = sums_NL != top_k * lengths_N[:, None]
        if wrong.any():
            i, l = np.argwhere(wrong)[0]
            raise InputError(
                f"counts: sample {i} layer {l} routes {sums_NL[i, l]} tokens; expected "
                f"top_k·len = {top_k}·{lengths_N[i]} = {top_k * lengths_N[i]}"
            )
        if group_ids is not None:
            group_ids = _as_int_array("group_ids", group_ids, 1)
            if group_ids.shape[0] != n:
                raise InputError(f"group_ids: {group_ids.shape[0]} entries for {n} samples")
        if step is not None:
            # an integer ≥ 0 (a 0-D integer array, as a window file stores it, too)
            step = check_int(step[()] if isinstance(step, np.ndarray) and step.ndim == 0 else step, "step", 0,
                             INT64_MAX)
        object.__setattr__(self, "lengths", lengths_N)
        object.__setattr__(self, "counts", counts_NLE)
        object.__setattr__(self, "top_k", int(top_k))
        object.__setattr__(self, "group_ids", group_ids)
        object.__setattr__(self, "step", step)

    # --- shape -------------------------------------------------------------------------------
    @property
    def num_samples(self) -> int:
        return int(self.lengths.shape[0])

    N = num_samples

    @property
    def num_layers(self) -> int:
        return int(self.counts.shape[1])

    @property
    def num_experts(self) -> int:
        return int(self.counts.shape[2])

    @property
    def total_tokens(self) -> int:
        return int(self.lengths.sum())

    def expert_loads(self) -> np.ndarray:
        """Aggregate load ``load_LE[l, e] = Σ_i counts[i, l, e]`` (docs/pipeline.md, step 1);
        read-only, computed once per window (the window is immutable: ~7 ms a pass over the
        counts at N=1,024, L=48, E=256, and a plan asks for it more than once)."""
        load_LE = self.__dict__.get("_load_LE")
        if load_LE is None:
            load_LE = self.counts.sum(axis=0, dtype=np.int64)
            load_LE.setflags(write=False)
            object.__setattr__(self, "_load_LE", load_LE)
        return load_LE

    def replace(self, **changes) -> Window:
        """A new window with some fields changed (validated again)."""
        fields = dict(lengths=self.lengths, counts=self.counts, top_k=self.top_k,
                      group_ids=self.group_ids, step=self.step)
        fields.update(changes)
        return Window(**fields)

    def subset(self, idx) -> Window:
        """The window restricted to samples ``idx`` (in that order)."""
        idx = np.asarray(idx, dtype=np.int64)
        return Window(self.lengths[idx], self.counts[idx], self.top_k,
                      None if self.group_ids is None else self.group_ids[idx], self.step)

    # --- routes ------------------------------------------------------------------------------
    @classmethod
    def from_routes(cls, lengths, routes, num_experts: int, group_ids=None, step=None) -> Window:
        """Aggregate per-token replayed routes into counts.

        ``routes_TLK[t, l, j]`` is the logical expert of token t's j-th choice at MoE layer l, for
        the tokens of all samples concatenated in sample order (T = Σ lengths) — what training
        frameworks record for routing replay.
        """
        lengths_N = _as_int_array("lengths", lengths, 1)
        routes_TLK = _as_int_array("routes", routes, 3)
        if (lengths_N < 1).any():
            raise InputError("lengths: every sample needs at least 1 token")
        T, L, K = routes_TLK.shape
        if T != int(lengths_N.sum()):
            raise InputError(f"routes: {T} tokens but lengths sum to {int(lengths_N.sum())}")
        if isinstance(num_experts, (bool, np.bool_)) or not isinstance(num_experts, (int, np.integer)) \
                or num_experts < 1:
            raise InputError(f"num_experts: expected a positive integer, got {num_experts!r}")
        check_window_memory((lengths_N.shape[0], L, num_experts), np.dtype(np.int64), f"num_experts={num_experts}")
        if routes_TLK.size and (routes_TLK.min() < 0 or routes_TLK.max() >= num_experts):
            raise InputError(f"routes: expert ids must lie in 0..{num_experts - 1}")
        srt = np.sort(routes_TLK, axis=2)
        if K > 1 and (srt[:, :, 1:] == srt[:, :, :-1]).any():
            t, l, _ = np.argwhere(srt[:, :, 1:] == srt[:, :, :-1])[0]
            raise InputError(f"routes: token {t} picks the same expert twice at layer {l}")
        N = lengths_N.shape[0]
        sample_T = np.repeat(np.arange(N), lengths_N)
        flat = ((sample_T[:, None, None] * L + np.arange(L)[None, :, None]) * num_experts + routes_TLK)
        counts = np.bincount(flat.ravel(), minlength=N * L * num_experts).reshape(N, L, num_experts)
        return cls(lengths_N, counts, top_k=K, group_ids=group_ids, step=step)


def _few(values, k: int = 5) -> str:
    vals = [str(int(v)) for v in np.asarray(values).ravel()[:k]]
    more = np.asarray(values).size - k
    return ", ".join(vals) + (f" (+{more} more)" if more > 0 else "")


# Memory of a loaded window, per (sample, layer, expert): the counts as stored in the file while
# they are read, plus the window's own int32 copy (none for an int32 file: its array is taken).
# Planning adds O(N·L·P) on top (rank loads, int64) and O(N) per replica, small beside it
# (docs/pipeline.md, "Time limits and memory").
WINDOW_COPY_BYTES = 4


def check_window_memory(shape_NLE: tuple[int, ...], stored: np.dtype, path: str = "window") -> None:
    """Raise an :class:`InputError` up front when a window of ``shape_NLE`` (stored as
    ``stored``) cannot be loaded in the memory left, instead of dying in the middle."""
    if len(shape_NLE) != 3:
        return
    N, L, E = (int(x) for x in shape_NLE)
    per_sample = L * E * (stored.itemsize + WINDOW_COPY_BYTES)
    need = N * per_sample
    avail = available_memory()
    if avail is not None and need > avail:
        raise InputError(
            f"{path}: a window of N={N} samples × L={L} × E={E} needs about {need / 2**30:.1f} GiB "
            f"to load ({per_sample / 2**10:.0f} KiB per sample); only {avail / 2**30:.1f} GiB is "
            "available: plan a smaller window or give the process more memory")


def load_window(path: str | Path) -> Window:
    """Read a window ``.npz`` (docs/formats.md): ``lengths``, ``counts``, optional ``top_k``,
    ``group_ids``, ``step``; other arrays are ignored. Read through the input boundary
    (:class:`~routepack_opt.core.inputs.NpzArchive`): a special file, a damaged archive or a bad
    member header is refused before any data is read, and the memory the window needs is checked
    against what is available before the counts are read (:func:`check_window_memory`)."""
    with NpzArchive(path, "window") as arc:
        heads = arc.headers
        for key in ("lengths", "counts"):
            if key not in heads:
                raise InputError(f"{arc.where}: missing array '{key}' (has {sorted(heads) or 'none'})"
                                 + ("; a single array (.npy) is not a window" if not heads else ""))
        check_window_memory(heads["counts"][0], heads["counts"][2], arc.where)
        arrays = {k: arc.read(k) for k in ("lengths", "counts", "top_k", "group_ids", "step") if k in heads}
        where = arc.where
    top_k = arrays.get("top_k")
    if top_k is not None:
        if np.ndim(top_k) != 0:
            raise InputError(f"{where}: top_k must be a scalar")
        top_k = top_k.item()
    step = arrays.get("step")
    try:
        # the arrays were just read for this window: an int32 file's counts are taken as they
        # are (one copy of the counts in memory, not two)
        return Window(arrays["lengths"], arrays["counts"], top_k=top_k,
                      group_ids=arrays.get("group_ids"), step=step, copy=False)
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None


def counts_dtype(max_count: int) -> np.dtype:
    """The smallest signed int dtype that holds counts up to ``max_count`` (counts ≤ len ≤ C)."""
    for dt in (np.int8, np.int16, np.int32):
        if max_count <= np.iinfo(dt).max:
            return np.dtype(dt)
    return np.dtype(np.int64)


def write_window_npz(path: str | Path, lengths_N, counts_blocks, shape_NLE, dtype, top_k: int,
                     group_ids=None, step: int | None = None) -> None:
    """Stream a window ``.npz`` (docs/formats.md) atomically: ``counts_blocks`` yields the counts
    [n_b, L, E] of consecutive samples, written into the ``counts.npy`` member as they come (the
    file never needs the whole [N, L, E] array in memory). Deflate level 1: counts compress well and
    level 6 is several times slower for little gain."""
    N, L, E = (int(x) for x in shape_NLE)
    dtype = np.dtype(dtype)
    with atomic_open(path) as fh, zipfile.ZipFile(fh, "w", zipfile.ZIP_DEFLATED,
                                                    compresslevel=1, allowZip64=True) as zf:
        small = {"lengths": np.asarray(lengths_N, dtype=np.int64), "top_k": np.int64(top_k)}
        if group_ids is not None:
            small["group_ids"] = np.asarray(group_ids, dtype=np.int64)
        if step is not None:
            small["step"] = np.int64(step)
        for name, arr in small.items():
            with zf.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(arr), allow_pickle=False)
        written = 0
        with zf.open("counts.npy", "w", force_zip64=True) as member:
            np.lib.format.write_array_header_2_0(
                member, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
                         "shape": (N, L, E)})
            for block in counts_blocks:
                block = np.ascontiguousarray(block, dtype=dtype)
                if block.shape[1:] != (L, E):
                    raise ValueError(f"counts block of shape {block.shape}, expected (*, {L}, {E})")
                member.write(block.data)
                written += block.shape[0]
        if written != N:
            raise ValueError(f"counts blocks hold {written} samples, expected {N}")


def save_window(window: Window, path: str | Path) -> None:
    """Write a window ``.npz`` atomically (docs/formats.md); counts are stored in the smallest
    sufficient int dtype."""
    check_type(window, "window", Window)
    path = check_path(path, "path")  # bytes or a PathLike as text
    cmax = int(window.counts.max()) if window.counts.size else 0
    N = window.num_samples
    step = max(1, (1 << 24) // max(1, window.num_layers * window.num_experts))
    blocks = (window.counts[lo:lo + step] for lo in range(0, N, step))
    write_window_npz(path, window.lengths, blocks, window.counts.shape, counts_dtype(cmax),
                     window.top_k, window.group_ids, window.step)

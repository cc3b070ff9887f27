"""One finished sample's routes → its ``[L, E]`` expert counts, on the device that holds them,
and the driver's window built from such counts (:func:`window_from_counts`,
:class:`StreamingCounts`). The trainer-side hooks that call these are in
:mod:`routepack_opt.integrations.rollout_hook`, which describes where they sit in a rollout.

Legend: T tokens of the sample, S padded positions, La recorded layers, L MoE layers kept,
K router top-k, E experts.

- :func:`sample_counts` — ``routes`` as the rollout holds them (a torch tensor on the GPU or the
  CPU, or a numpy array) in one of :mod:`routepack_opt.replay`'s formats, for one sample:
  ``verl`` (``[S, La, K]`` + the sample's ``attention_mask [S]``; zero-filled rows inside the
  mask are unrouted, verl #7075, and imputed as the import does), ``slime`` (``[T - 1, La, K]``;
  slime's pad route for the last token is counted) or ``routes`` (``[T, L, K]``). Tensors on an
  accelerator are counted there with ``torch.bincount`` (checks and imputation as torch ops, one
  host sync for the checks); CPU tensors (as numpy views) and numpy arrays by the import's
  compiled pass; a tensor in, a tensor out. The counts equal ``import_replay``'s ``counts[i]``
  for that sample (tested); bad routes raise :class:`InputError`.
- :func:`window_from_counts` — the driver's side: the per-sample counts (a list, or an
  ``[N, L, E]`` array) and lengths → a :class:`Window` without another copy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from routepack_opt.core.checks import INT32_MAX, check_bool, check_choice, check_int, int_array
from routepack_opt.core.errors import InputError
from routepack_opt.core.inputs import check_tensor, tensor_to_numpy
from routepack_opt.core.window import MAX_LENGTH, Window
from routepack_opt.replay import _deps

__all__ = ["sample_counts", "window_from_counts", "StreamingCounts"]


def _is_torch(x) -> bool:
    return hasattr(x, "detach") and hasattr(x, "device") and hasattr(x, "dim")


def sample_counts(routes, num_experts: int, *, format: str = "routes", attention_mask=None,
                  moe_layer_freq=None, pad_last: bool = True):
    """One sample's ``[L, E]`` expert counts (int32), on the routes' device for a torch tensor,
    a numpy array otherwise (see the module docstring for the formats)."""
    from routepack_opt.replay.routes import _check_E, _check_freq

    check_choice(format, "format", ("verl", "slime", "routes"))
    num_experts = _check_E(num_experts)
    _check_freq(moe_layer_freq)
    check_bool(pad_last, "pad_last")
    if not _is_torch(routes):
        return _numpy_counts(routes, num_experts, format, attention_mask, moe_layer_freq, pad_last)
    _check_tensor(routes, "routes")
    if routes.device.type == "cpu":  # the compiled pass on a numpy view (no copy), a tensor back
        torch = _deps.torch()
        if _is_torch(attention_mask):
            _check_tensor(attention_mask, "attention_mask")
            mask = tensor_to_numpy(attention_mask, "attention_mask")
        else:
            mask = attention_mask
        # bf16/fp8 read exactly as float32 (docs/formats.md), checked as whole numbers by the import
        return torch.from_numpy(_numpy_counts(tensor_to_numpy(routes, "routes"), num_experts, format, mask,
                                              moe_layer_freq, pad_last))
    if _is_torch(attention_mask):
        _check_tensor(attention_mask, "attention_mask")
    return _torch_counts(routes, num_experts, format, attention_mask, moe_layer_freq, pad_last)


def _check_tensor(x, name: str) -> None:
    """A tensor the counts can be read from: strided, not quantized, not nested, not on the meta
    device (no data), of an integer or float dtype; on an accelerator, floats must be whole
    (as the CPU path's check), so that ``.long()`` never truncates."""
    check_tensor(x, name)
    if x.is_complex() or (str(x.dtype) == "torch.bool" and name == "routes"):
        raise InputError(f"{name}: tensor of dtype {x.dtype}; expected integer expert ids")
    if x.device.type != "cpu" and x.is_floating_point() and x.numel():
        v = x.detach().double()
        bad = ~(v.isfinite() & (v == v.floor()) & (v.abs() < 2.0**62))
        if bool(bad.any()):
            idx = tuple(int(i) for i in bad.nonzero()[0].tolist())
            raise InputError(f"{name}: expected integers; the entry at {list(idx)} is {float(v[idx])!r}")


def _numpy_counts(routes, E, format, attention_mask, moe_layer_freq, pad_last) -> np.ndarray:
    """The import's compiled pass on one sample."""
    from routepack_opt.replay.importer import import_replay
    from routepack_opt.replay.routes import _np

    r = _np(routes, "routes")  # a ragged list or strings: an InputError, not numpy's ValueError
    if format == "verl":
        mask = None if attention_mask is None else np.asarray(attention_mask)[None]
        imp = import_replay(r[None], format="verl", num_experts=E, attention_mask=mask,
                            moe_layer_freq=moe_layer_freq)
    elif format == "slime":
        imp = import_replay([r], format="slime", num_experts=E, moe_layer_freq=moe_layer_freq, pad_last=pad_last)
    else:
        imp = import_replay([r], format="routes", num_experts=E, moe_layer_freq=moe_layer_freq)
    return np.array(imp.window.counts[0])


def _torch_counts(R, E, format, attention_mask, moe_layer_freq, pad_last):
    from routepack_opt.replay.routes import _check_E, moe_layers, slime_pad_routes

    torch = _deps.torch()
    E = _check_E(E)
    if R.dim() != 3:
        raise InputError(f"routes: one sample's routes are [tokens, layers, top_k], got shape {tuple(R.shape)}")
    R = R.detach()
    if format == "verl":
        if attention_mask is None:
            raise InputError("routed_experts: verl's format needs the sample's attention_mask [seq]")
        m = torch.as_tensor(attention_mask, device=R.device).reshape(-1)
        if m.shape[0] != R.shape[0]:
            raise InputError(f"attention_mask: {m.shape[0]} positions for {R.shape[0]} rows of routes")
        R = R[m != 0]
    T, La, K = (int(x) for x in R.shape)
    if not 1 <= K <= E:
        raise InputError(f"routes: top-k {K} is not in 1..{E} (E = {E})")
    if moe_layer_freq is not None:
        keep = moe_layers(La, moe_layer_freq)
    elif format == "slime" and T:  # dense layers are recorded all-zero (as the import detects them)
        keep = torch.nonzero(R.reshape(T, La, K).ne(0).any(dim=2).any(dim=0)).flatten().tolist()
        if not keep:
            raise InputError("routes: every layer of the sample is all-zero; pass moe_layer_freq")
    else:
        keep = list(range(La))
    R = R[:, keep].long()
    L = len(keep)
    if T == 0 and not (format == "slime" and pad_last):
        raise InputError("routes: the sample has no tokens")
    lo, hi = (int(v) for v in torch.stack([R.min(), R.max()]).tolist()) if T else (0, 0)
    if lo < 0 or hi >= E:
        raise InputError(f"routes: expert id {lo if lo < 0 else hi} outside 0..{E - 1} (E = {E})")
    unrouted = torch.zeros((T, L), dtype=torch.bool, device=R.device)
    if format == "verl":
        unrouted = R.eq(0).all(dim=2) if K > 1 else unrouted
        if K == 1 and T:
            unrouted[-1] = R[-1, :, 0].eq(0)
    if K > 1 and T:
        srt = R.sort(dim=2).values
        dup = (srt[:, :, 1:] == srt[:, :, :-1]).any(dim=2) & ~unrouted
        if bool(dup.any()):
            t, l = (int(x) for x in torch.nonzero(dup)[0].tolist())
            raise InputError(f"routes: token {t} picks the same expert twice at layer {keep[l]}")
    if format == "verl" and bool(unrouted.any()):
        ok = ~unrouted
        if not bool(ok.any(dim=0).all()):
            raise InputError("routes: the sample has a layer with no routed token (all rows zero-filled)")
        t_T1 = torch.arange(T, device=R.device)[:, None]
        prev = torch.where(ok, t_T1, -1).cummax(dim=0).values
        nxt = torch.where(ok, t_T1, T).flip(0).cummin(dim=0).values.flip(0)
        src = torch.where(prev >= 0, prev, nxt)
        R = R[src, torch.arange(L, device=R.device)[None, :]]
    flat = (torch.arange(L, device=R.device)[None, :, None] * E + R).reshape(-1)
    counts = torch.bincount(flat, minlength=L * E).reshape(L, E)
    if format == "slime" and pad_last:
        pad = torch.as_tensor(slime_pad_routes(La, K, E)[keep], device=R.device)
        counts += torch.bincount((torch.arange(L, device=R.device)[:, None] * E + pad).reshape(-1),
                                 minlength=L * E).reshape(L, E)
    return counts.to(torch.int32)


def window_from_counts(counts, lengths, *, top_k: int | None = None, group_ids=None, step=None) -> Window:
    """The driver's window from per-sample counts: a sequence of ``[L, E]`` arrays or tensors (as
    the hook returns them) or one ``[N, L, E]`` array, and ``lengths [N]`` (tokens per sample:
    verl's ``attention_mask`` sums, slime's ``total_lengths``). One ``[N, L, E]`` int32 array is
    built and handed to the window without a further copy."""
    if isinstance(counts, (str, bytes)):
        raise InputError(f"counts: expected per-sample [L, E] counts, got {type(counts).__name__}")
    if isinstance(counts, Sequence) or (isinstance(counts, np.ndarray) and counts.dtype == object):
        arr = _stack_counts(list(counts), "counts")
    else:
        arr = int_array(counts, "counts", ndim=3, lo=0, hi=INT32_MAX, dtype=np.int32)
    lengths_N = int_array(lengths, "lengths", ndim=1)  # exact: a wrapped or NaN length is refused here
    return Window(lengths_N, np.ascontiguousarray(arr), top_k=top_k, group_ids=group_ids, step=step, copy=False)


def _stack_counts(rows: list, name: str) -> np.ndarray:
    """Per-sample ``[L, E]`` counts (arrays, tensors, lists) as one ``[N, L, E]`` int32 array: each
    an exact integer array in ``0..2³¹−1`` (never cast and wrapped), all of one shape."""
    if not rows:
        raise InputError(f"{name}: no samples")
    out = [int_array(c, f"{name}[{i}]", ndim=2, lo=0, hi=INT32_MAX, dtype=np.int32) for i, c in enumerate(rows)]
    bad = next((i for i, r in enumerate(out) if r.shape != out[0].shape), None)
    if bad is not None:
        raise InputError(f"{name}: every sample's counts must be one [L, E] array of the same shape; "
                         f"{name}[0] is {list(out[0].shape)}, {name}[{bad}] is {list(out[bad].shape)}")
    return np.stack(out)



class StreamingCounts:
    """The driver's input built as samples finish (async or partial rollouts: slime's buffer,
    verl's async agent loop), so that when the batch closes the window is already there.

    ``add(i, counts_LE, length)`` (or ``add_routes``, the hook on the driver) writes sample i's
    counts into one preallocated ``[N, L, E]`` int32 buffer, checks them (``Σ_e counts[l] =
    top_k · length`` at every layer, ``0 ≤ counts ≤ length``: a sample's invariants of
    :class:`Window`, so the final window's check is the only pass left), and keeps running per-layer
    expert loads ``[L, E]`` (what the placement is computed from) and the arrived samples in
    length order. ``window()`` at close hands the buffer to the :class:`Window` without a copy;
    ``partial_window()`` is the window of what has arrived (a provisional plan while the rest
    rolls out, e.g. to warm the planner's kernels and see the micro-batch count).
    """

    def __init__(self, num_samples: int, num_layers: int, num_experts: int, top_k: int):
        from routepack_opt.core.window import available_memory

        num_samples = check_int(num_samples, "StreamingCounts: num_samples", 1)
        num_layers = check_int(num_layers, "StreamingCounts: num_layers", 1)
        num_experts = check_int(num_experts, "StreamingCounts: num_experts", 1, INT32_MAX)
        top_k = check_int(top_k, "StreamingCounts: top_k", 1, num_experts)  # a token's top-k experts are distinct
        need, avail = 4 * num_samples * num_layers * num_experts, available_memory()
        if avail is not None and need > avail:
            raise InputError(f"StreamingCounts: counts [N={num_samples}, L={num_layers}, E={num_experts}] need "
                             f"{need / 2**30:.1f} GiB, {avail / 2**30:.1f} GiB is available")
        self.counts_NLE = np.zeros((num_samples, num_layers, num_experts), dtype=np.int32)
        self.lengths_N = np.zeros(num_samples, dtype=np.int64)
        self.loads_LE = np.zeros((num_layers, num_experts), dtype=np.int64)
        self.top_k = int(top_k)
        self._arrived = np.zeros(num_samples, dtype=bool)
        self._by_length: list[tuple[int, int]] = []  # (length, index), sorted as samples arrive

    @property
    def num_arrived(self) -> int:
        return len(self._by_length)

    @property
    def complete(self) -> bool:
        return self.num_arrived == self.lengths_N.shape[0]

    def add(self, index: int, counts_LE, length: int) -> None:
        """Sample ``index``'s ``[L, E]`` counts (array or tensor) and token count."""
        import bisect

        N, L, E = self.counts_NLE.shape
        index = check_int(index, "StreamingCounts.add: index", 0, N - 1)
        if self._arrived[index]:
            raise InputError(f"StreamingCounts.add: sample {index} was already added")
        c = int_array(counts_LE, f"StreamingCounts.add: sample {index}: counts", ndim=2, lo=0, hi=INT32_MAX,
                      dtype=np.int32)
        if c.shape != (L, E):
            raise InputError(f"StreamingCounts.add: sample {index}: expected integer counts [{L}, {E}], "
                             f"got shape {list(c.shape)}")
        n = check_int(length, f"StreamingCounts.add: sample {index}: length", 1, MAX_LENGTH)
        sums = c.sum(axis=1)
        if (sums != self.top_k * n).any() or c.min() < 0 or c.max() > n:
            l = int(np.flatnonzero(sums != self.top_k * n)[0]) if (sums != self.top_k * n).any() else 0
            raise InputError(f"StreamingCounts.add: sample {index}: counts at layer {l} sum to {int(sums[l])}, "
                             f"expected top_k · length = {self.top_k * n} (each within 0..{n})")
        self.counts_NLE[index] = c
        self.lengths_N[index] = n
        self.loads_LE += c
        self._arrived[index] = True
        bisect.insort(self._by_length, (n, int(index)))

    def add_routes(self, index: int, routes, num_experts: int, *, format: str = "routes", attention_mask=None,
                   moe_layer_freq=None, pad_last: bool = True) -> None:
        """The hook on the driver's side: one finished sample's routes → :meth:`add`."""
        c = sample_counts(routes, num_experts, format=format, attention_mask=attention_mask,
                          moe_layer_freq=moe_layer_freq, pad_last=pad_last)
        r = routes.shape[0]
        if format == "verl":
            n = int(np.asarray(attention_mask.detach().cpu() if _is_torch(attention_mask) else attention_mask).sum())
        else:
            n = int(r) + (1 if format == "slime" and pad_last else 0)
        self.add(index, c, n)

    def length_order(self) -> list[int]:
        """Arrived samples, longest first (ties by index): the order packing heuristics start from."""
        return [i for _, i in sorted(self._by_length, key=lambda p: (-p[0], p[1]))]

    def partial_window(self) -> Window:
        """The window of the samples arrived so far (in index order); a copy."""
        idx = np.flatnonzero(self._arrived)
        if idx.size == 0:
            raise InputError("StreamingCounts: no sample has arrived")
        return Window(self.lengths_N[idx], self.counts_NLE[idx], top_k=self.top_k)

    def window(self, *, group_ids=None, step=None) -> Window:
        """The batch's window once every sample has arrived (the buffer, not a copy)."""
        if not self.complete:
            missing = np.flatnonzero(~self._arrived)
            raise InputError(f"StreamingCounts: {missing.size} samples have not arrived (first: {int(missing[0])})")
        return Window(self.lengths_N, self.counts_NLE, top_k=self.top_k, group_ids=group_ids, step=step,
                      copy=False)

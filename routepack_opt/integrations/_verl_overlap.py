"""The overlap modes' safety and their reorder off the critical path (``install_balance_batch(
overlap=...)``, :mod:`.verl_trainer`).

A plan made in the background is applied at the update only if the batch is still what it was
computed from. :class:`Fingerprint` is taken when ``_balance_batch`` returns: each tensor of the
batch by identity and version counter (``Tensor._version``, bumped by every in-place write, so a
rewritten or replaced ``routed_experts`` / ``input_ids`` / ``attention_mask`` is caught in O(1)
whatever its size), each non-tensor column by a digest of its contents (``uid``, the rollout
hook's counts), and a per-sample checksum of ``input_ids`` and ``attention_mask`` (one pass over
``input_ids`` at each end; it also catches samples swapped by writes that bypass the version
counter, e.g. through a numpy view; the routes have no such content check, their size would put
it on the critical path).

The background thread also gathers every tensor of the batch into the plan's order
(:func:`prereorder`) while the log-prob passes run, so the update only gathers what was added
since (log-probs, values, advantages) and the non-tensor columns (:func:`reorder_with`): no
second reorder of the padded batch on the critical path. It costs one more copy of the batch's
tensors on the driver until the update.
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from routepack_opt.integrations import _deps
from routepack_opt.integrations.rollout_hook import COUNTS_KEY

__all__ = ["Fingerprint", "fingerprint", "content_digest", "prereorder", "reorder_with"]


def _digest(arr) -> bytes:
    """A digest of a non-tensor column (numeric, strings, or per-sample arrays)."""
    h = hashlib.blake2b(digest_size=16)
    a = np.asarray(arr)
    if a.dtype != object:
        h.update(str((a.dtype.str, a.shape)).encode())
        h.update(np.ascontiguousarray(a).tobytes())
        return h.digest()
    for item in a.reshape(-1):
        if isinstance(item, np.ndarray):
            h.update(str((item.dtype.str, item.shape)).encode())
            h.update(np.ascontiguousarray(item).tobytes())
        else:
            h.update(repr(item).encode())
        h.update(b"\x00")
    return h.digest()


@dataclasses.dataclass
class Fingerprint:
    """What the background plan was computed from (see the module docstring). ``tensors``:
    ``{key: (tensor, version)}`` of every tensor at ``_balance_batch``'s end (held, so that no
    later tensor can reuse its identity); ``plan_keys``: those
    the plan depends on (their change makes the plan stale; another tensor's change only means
    its pre-gathered copy is not used); ``non_tensor``: digests of the sample-identifying columns;
    ``content``: the per-sample checksum (:func:`content_digest`)."""

    num_samples: int
    tensors: dict
    plan_keys: tuple
    non_tensor: dict
    content: np.ndarray | None = None

    def unchanged(self, batch, key) -> bool:
        """Whether tensor ``key`` is still the very tensor, unwritten, seen at ``_balance_batch``."""
        if key not in self.tensors or key not in batch.batch.keys():
            return False
        t, version = self.tensors[key]
        now = batch.batch[key]
        return now is t and getattr(now, "_version", None) == version

    def mismatch(self, batch) -> str | None:
        """Why ``batch`` is no longer what the plan was made from (None: it is). The cheap part:
        sample count, the plan's tensors, the identifying columns."""
        n = int(batch.batch.batch_size[0])
        if n != self.num_samples:
            return f"the batch has {n} samples, the plan was made for {self.num_samples}"
        for key in self.plan_keys:
            if not self.unchanged(batch, key):
                return f"{key!r} was rewritten between _balance_batch and the update"
        ntb = getattr(batch, "non_tensor_batch", None) or {}
        for key, dig in self.non_tensor.items():
            if key not in ntb or _digest(ntb[key]) != dig:
                return f"non_tensor_batch[{key!r}] changed between _balance_batch and the update"
        return None

    def content_mismatch(self, batch) -> str | None:
        """The content part: O(N·S), so checked after the cheap part passed."""
        if not np.array_equal(content_digest(batch.batch), self.content):
            return "the samples' tokens changed or moved between _balance_batch and the update"
        return None


# the non-tensor columns that identify samples or that the plan read (verl's uid; the rollout
# hook's counts, rollout_hook.COUNTS_KEY)
IDENTIFYING_COLUMNS = ("uid", COUNTS_KEY)


def fingerprint(batch, plan_keys, lens_N=None) -> Fingerprint:
    """The batch's fingerprint as it stands (on the critical path: O(keys + N) and one pass over
    ``input_ids``; ``lens_N``: its mask's sums in its current order, when known)."""
    torch = _deps.torch()
    tensors = {k: (v, getattr(v, "_version", None)) for k, v in batch.batch.items() if isinstance(v, torch.Tensor)}
    ntb = getattr(batch, "non_tensor_batch", None) or {}
    non_tensor = {k: _digest(ntb[k]) for k in IDENTIFYING_COLUMNS if k in ntb}
    return Fingerprint(int(batch.batch.batch_size[0]), tensors, tuple(k for k in plan_keys if k in tensors),
                       non_tensor, content_digest(batch.batch, lens_N))


def content_digest(tensors, lens_N=None) -> np.ndarray:
    """``[N, k]`` int64: each sample's sum of ``input_ids`` and of ``attention_mask`` (those of
    the two that ``tensors``, a TensorDict or a dict, holds; ``lens_N``: the mask's sums, when
    known already): an order- and content-sensitive checksum, O(N·S)."""
    torch = _deps.torch()
    cols = []
    for key in ("input_ids", "attention_mask"):
        if key == "attention_mask" and lens_N is not None:
            cols.append(np.asarray(lens_N, dtype=np.int64))
        elif key in tensors.keys():
            t = tensors[key]
            cols.append(t.reshape(int(t.shape[0]), -1).sum(-1, dtype=torch.int64).cpu().numpy())
    return np.stack(cols, axis=1) if cols else np.zeros((0, 0), dtype=np.int64)


def prereorder(tensors: dict, perm_N: np.ndarray, cancel=None) -> dict:
    """``{key: tensor[perm]}`` for each tensor of ``tensors`` whose first dimension is the batch
    (stops early, returning what it has, once ``cancel`` is set)."""
    torch = _deps.torch()
    idx = torch.from_numpy(np.ascontiguousarray(perm_N, dtype=np.int64))
    out = {}
    for key, t in tensors.items():
        if cancel is not None and cancel.is_set():
            break
        if isinstance(t, torch.Tensor) and t.dim() >= 1 and int(t.shape[0]) == idx.numel() and not t.is_nested:
            out[key] = t.index_select(0, idx.to(t.device))
    return out


def reorder_with(batch, perm_N: np.ndarray, pre: dict, fp: Fingerprint) -> float:
    """``batch.reorder(perm)`` (verl's ``DataProto.reorder``: tensors and non-tensor columns),
    taking each tensor from ``pre`` where it was gathered in the background and the batch still
    holds that very tensor unwritten; gathers the rest now. Returns the seconds it took."""
    import time

    torch = _deps.torch()
    t0 = time.perf_counter()
    idx = torch.from_numpy(np.ascontiguousarray(perm_N, dtype=np.int64))
    use = [k for k in pre if fp.unchanged(batch, k)]
    rest = batch.batch.exclude(*use) if use else batch.batch
    new = rest[idx]
    for key in use:
        new.set(key, pre[key])
    batch.batch = new
    batch.non_tensor_batch = {k: v[perm_N] for k, v in batch.non_tensor_batch.items()}
    return time.perf_counter() - t0

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

Speed: one compiled pass (:mod:`routepack_opt.replay.kernels`, numba, parallel
over samples) over the valid tokens does the checks, verl's imputation and the counts, on numpy
views of the input (CPU torch tensors through ``.numpy()``), nothing of the routes' size copied.
What it does not take (a GPU tensor, a non-contiguous array, an odd dtype, safetensors slices, a
lazy ``.npz`` chunk with a ragged sample) and every input with a bad route go through the
reference path (:mod:`.reference`, ``_from_*``, one sample at a time), which raises the exact message.

Memory: counts go into one ``counts[N, L, E]``, whose size is checked against the memory
available before it is allocated, and which the window takes without a copy. Files are read
into memory, never memory-mapped (a file truncated while a mapping is read kills the process with
SIGBUS): a numeric ``.npy`` and a ``.pt`` whole, safetensors tensors by the rows of one sample
(``pread``), ``.npz`` members one at a time; each size is checked against the memory left before
the read and against the bytes read after it (a file cut short meanwhile: an InputError).
In-memory inputs (a verl batch, slime's list) are read one sample at a time.

Modules: :mod:`.importer` (the entry points), :mod:`.files` (containers), :mod:`.routes` (checks
and counts), :mod:`.reference` (the numpy path), :mod:`.fast` and :mod:`.kernels` (the compiled
pass), :mod:`.sample_counts` (one sample's counts where a rollout ends). Format readers sit below
the seams (:mod:`routepack_opt.integrations`, which re-exports them) and the replay report.
"""

from __future__ import annotations

from routepack_opt.replay.importer import (
    FORMATS,
    ReplayImport,
    import_replay,
    save_window_atomic,
    warm_import,
    window_from_replay,
)
from routepack_opt.replay.routes import MAX_EXPERTS, moe_layers, slime_pad_routes

__all__ = ["ReplayImport", "import_replay", "warm_import", "window_from_replay", "FORMATS", "moe_layers",
           "slime_pad_routes", "save_window_atomic", "MAX_EXPERTS"]

"""Routing-replay import's entry points: :func:`import_replay` (routes → window plus a report of
what the import did), :func:`warm_import`, :func:`window_from_replay` and
:func:`save_window_atomic`. The formats are described in :mod:`routepack_opt.replay`."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path

from routepack_opt.core.checks import check_bool, check_choice, check_int, check_path, check_type
from routepack_opt.core.io import check_output_path
from routepack_opt.core.window import Window, save_window
from routepack_opt.replay.fast import _fast_routes, _fast_slime, _fast_verl
from routepack_opt.replay.files import _lengths_arg, _load_file, _unpack
from routepack_opt.replay.reference import _from_routes, _from_slime, _from_verl
from routepack_opt.replay.routes import _check_E, _check_freq, _is_sequence, _lengths_vector

__all__ = ["ReplayImport", "import_replay", "warm_import", "window_from_replay", "FORMATS", "save_window_atomic"]

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
    check_choice(format, "format", FORMATS)
    E = _check_E(num_experts)
    _check_freq(moe_layer_freq)
    if top_k is not None:
        check_int(top_k, "top_k", 1, E)
    check_bool(pad_last, "pad_last")
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
    check_type(window, "window", Window)
    path = check_path(path, "path")
    out = check_output_path(path, *[p for p in inputs if isinstance(p, (str, Path))])
    assert out is not None
    save_window(window, out)
    return out

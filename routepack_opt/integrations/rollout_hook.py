"""Counts where rollouts end: one finished sample's routes → its ``[L, E]`` expert counts, on the
device that holds them, so that only counts (``N·L·E`` int32: 25 MB at N = 1,024, L = 48,
E = 128) travel to the driver instead of the routes (about 3 GB at that shape).

Legend: T tokens of the sample, S padded positions, La recorded layers, L MoE layers kept,
K router top-k, E experts.

- :func:`sample_counts` — the hook: one sample's routes, in one of :mod:`routepack_opt.replay`'s
  formats, → its counts, on the routes' device (the reader itself is
  :mod:`routepack_opt.replay.sample_counts`, re-exported here with :func:`window_from_counts` and
  :class:`StreamingCounts`, the driver's side: per-sample counts and lengths → a :class:`Window`
  without another copy, what ``plan_micro_batches(lengths, counts, ...)`` and the seams plan from).
- :func:`install_verl_agent_loop_counts` — verl (0.9.x agent loop): wraps
  ``AgentLoopWorker._agent_loop_postprocess``, where verl builds each finished sample's
  ``routed_experts [1, S, La, K]`` (int16) next to its ``attention_mask [1, S]``, to put the
  sample's counts in ``extra_fields[COUNTS_KEY]``; verl's ``_postprocess`` collects extra fields
  into ``non_tensor_batch[COUNTS_KEY]`` (one ``[L, E]`` array per sample), which the driver's
  ``_balance_batch`` reads (:func:`counts_from_non_tensor`).
- slime: the place is the rollout's per-sample finish, where ``Sample.update_from_meta_info``
  (``slime/utils/types.py``) has decoded ``rollout_routed_experts [T - 1, La, K]`` (int32); call
  :func:`slime_sample_counts` on the finished ``Sample`` (e.g. in a custom
  ``generate``/``--custom-generate-function-path`` after ``await`` of the base one) to put its counts
  in ``sample.metadata[COUNTS_KEY]``.

Which samples a rank gets is the plan's (``MicroBatchPlan``/``GlobalBalance.partitions``), so
each training rank needs only the routes of its own samples for the replay itself: keep the routes
where the rollout produced them (the rollout worker, or Ray's object store, one object per sample)
and let rank d fetch ``routes[j]`` for ``j`` in its partition (slime's ``_split_train_data_by_dp``
already sends each rank ``[data[key][j] for j in partition]``; verl's dispatch sends rank d its
chunk of the reordered batch), never the whole batch's routes to the driver or to every rank.
"""

from __future__ import annotations

import functools

import numpy as np

from routepack_opt.core.checks import check_type
from routepack_opt.core.errors import InputError
from routepack_opt.replay.sample_counts import (
    StreamingCounts,
    _is_torch,
    _stack_counts,
    sample_counts,
    window_from_counts,
)

__all__ = ["COUNTS_KEY", "sample_counts", "window_from_counts", "counts_from_non_tensor", "StreamingCounts",
           "install_verl_agent_loop_counts", "slime_sample_counts"]

COUNTS_KEY = "routepack_expert_counts"


def counts_from_non_tensor(non_tensor_batch, key: str = COUNTS_KEY) -> np.ndarray | None:
    """verl's ``non_tensor_batch[key]`` (an object array of per-sample ``[L, E]`` counts, as
    verl's ``_postprocess`` collects the hook's extra field) as ``[N, L, E]`` int32, or None."""
    check_type(key, "key", str, "str (the non_tensor_batch key)")
    col = non_tensor_batch.get(key) if hasattr(non_tensor_batch, "get") else None
    if col is None or len(col) == 0 or any(c is None for c in col):
        return None
    # each sample's counts exact integers in 0..2³¹−1, never cast and wrapped (2³²+3 is not 3)
    return _stack_counts(list(col), f"non_tensor_batch[{key!r}]")


def _check_hook_args(num_experts, moe_layer_freq, key) -> None:
    """The installers' arguments, checked when installed (not in the worker at the first sample)."""
    from routepack_opt.replay.routes import _check_E, _check_freq

    _check_E(num_experts)
    _check_freq(moe_layer_freq)
    check_type(key, "key", str, "str (the extra field's name)")


def install_verl_agent_loop_counts(worker_cls, num_experts: int, *, moe_layer_freq=None, key: str = COUNTS_KEY):
    """Wrap verl's ``AgentLoopWorker._agent_loop_postprocess`` (an ``async`` method returning the
    finished sample's ``_InternalAgentLoopOutput``): when the sample has ``routed_experts
    [1, S, La, K]``, its counts (:func:`sample_counts`, format ``verl`` with the sample's
    ``attention_mask``; a numpy ``[L, E]`` int32) go into ``extra_fields[key]``. Returns the
    method it replaced. Bad routes raise in the worker, where they were produced."""
    _check_hook_args(num_experts, moe_layer_freq, key)
    if not hasattr(worker_cls, "_agent_loop_postprocess"):
        raise InputError(f"install_verl_agent_loop_counts: {getattr(worker_cls, '__name__', worker_cls)!r} has no "
                         "_agent_loop_postprocess (pass verl.experimental.agent_loop.agent_loop.AgentLoopWorker)")
    original = worker_cls._agent_loop_postprocess

    @functools.wraps(original)
    async def _agent_loop_postprocess(self, *args, **kwargs):
        out = await original(self, *args, **kwargs)
        routed = getattr(out, "routed_experts", None)
        if routed is not None:
            counts = sample_counts(routed[0], num_experts, format="verl", attention_mask=out.attention_mask[0],
                                   moe_layer_freq=moe_layer_freq)
            out.extra_fields[key] = np.asarray(counts.cpu() if _is_torch(counts) else counts)
        return out

    _agent_loop_postprocess.__routepack__ = True  # type: ignore[attr-defined]
    worker_cls._agent_loop_postprocess = _agent_loop_postprocess
    return original


def slime_sample_counts(sample, num_experts: int, *, moe_layer_freq=None, key: str = COUNTS_KEY):
    """A finished slime ``Sample``: its ``rollout_routed_experts [T - 1, La, K]`` → ``[L, E]``
    counts (slime's pad route for the last token included) in ``sample.metadata[key]`` (a numpy
    array); returns them. A sample without recorded routes is left as it is (returns None)."""
    _check_hook_args(num_experts, moe_layer_freq, key)
    routes = getattr(sample, "rollout_routed_experts", None)
    if routes is None:
        return None
    if not _is_torch(routes) and not isinstance(routes, np.ndarray):
        routes = np.asarray(routes)
    counts = sample_counts(routes, num_experts, format="slime", moe_layer_freq=moe_layer_freq)
    arr = np.asarray(counts.cpu() if _is_torch(counts) else counts)
    if getattr(sample, "metadata", None) is None:
        sample.metadata = {}
    sample.metadata[key] = arr
    return arr



"""What both sides of the verl seam share: the seam's records, the plan columns that carry the
driver's plan to the ranks, verl's pipeline-bubble order and the ``redundant_experts`` check."""

from __future__ import annotations

import itertools

import numpy as np

from routepack_opt.core.checks import check_redundant_experts
from routepack_opt.core.errors import InputError
from routepack_opt.integrations import _deps, _verl_env
from routepack_opt.integrations._seam import Recorder

__all__ = ["PLAN_COLUMNS", "PLACEMENTS_KEY", "plan_columns", "verl_own"]

_RECORDS = Recorder()

_ONE_EXPERT = np.zeros((1, 1), dtype=np.int64)  # the placement of a length-only window

# class → verl's own _balance_batch that install_balance_batch replaced on it (verl's own path,
# run to score the step verl would have run)
ORIGINAL_BALANCE: dict = {}


# The driver's plan, written by balance_batch / install_balance_batch into the batch as int64 [N]
# columns: verl's dispatch chunks them by rank, its mini-batch iterator and index_select index them
# with their samples, so every worker call sees its own samples' entries.
PLAN_COLUMNS = ("routepack_plan", "routepack_micro_batch", "routepack_micro_batch_size", "routepack_max_token_len")
_PLAN_IDS = itertools.count(1)


def plan_columns(plans: list, num_samples: int, max_token_len: int) -> dict[str, np.ndarray]:
    """The columns that carry a driver plan to the ranks. ``plans[k][d]`` is rank d's list of
    micro-batches (sample indices of the batch) in the plan of mini-batch k, in the order the
    ranks run them (:meth:`GlobalBalance.run_order`: the same row on every rank). Per sample: the id of
    its mini-batch's plan (a new one per plan in this process), its micro-batch's number within
    its rank, that micro-batch's sample count (so a rank can check it got the micro-batch whole)
    and the token cap it was planned for. Raises :class:`InputError` when a sample is in no
    micro-batch."""
    plan_N = np.full(num_samples, -1, dtype=np.int64)
    mb_N = np.full(num_samples, -1, dtype=np.int64)
    size_N = np.zeros(num_samples, dtype=np.int64)
    for rank_mbs in plans:
        pid = next(_PLAN_IDS)
        for mbs in rank_mbs:
            for r, mb in enumerate(mbs):
                ids = np.asarray(list(mb), dtype=np.int64)
                plan_N[ids], mb_N[ids], size_N[ids] = pid, r, ids.size
    if (mb_N < 0).any():
        raise InputError(f"plan_columns: sample {int(np.flatnonzero(mb_N < 0)[0])} is in no micro-batch")
    return dict(zip(PLAN_COLUMNS, (plan_N, mb_N, size_N, np.full(num_samples, int(max_token_len), dtype=np.int64))))


# where the driver's replicated placements ride to the workers (DataProto.meta_info: verl's
# dispatch hands every rank's chunk the batch's meta_info)
PLACEMENTS_KEY = "routepack_placements"


def _bubble_order(cost_R, key_R) -> list[int]:
    """verl's pipeline-bubble order of micro-batches: heaviest in the middle, lighter ones at both
    ends (ties by ``key_R``)."""
    order = sorted(range(len(cost_R)), key=lambda r: (cost_R[r], key_R[r]), reverse=True)
    return order[::2][::-1] + order[1::2]


def _redundant(value) -> int:
    return check_redundant_experts(value)


def verl_own():
    """verl's own ``rearrange_micro_batches`` (the one the plugin replaced)."""
    fn = _verl_env.ORIGINAL.get("rearrange_micro_batches")
    if fn is None:
        fn = _deps.verl_seqlen_balancing().rearrange_micro_batches
    if getattr(fn, "__routepack__", False):
        raise InputError("verl's own rearrange_micro_batches is not known (patched before the plugin saved it)")
    return fn

"""verl: a drop-in for ``verl.utils.seqlen_balancing.rearrange_micro_batches`` and the expert map
from a batch's ``routed_experts``.

verl's function picks ``ceil(tokens / max_token_len)`` micro-batches, balances an estimated FLOP
workload (``24576·s + s²``, a 7B dense model) by Karmarkar–Karp, and adds micro-batches until
every one fits the cap. Ours certifies the least micro-batch count that fits the cap (bounds, FFD,
exact bin packing where bounds do not close), agrees on it across ``dp_group`` (all-reduce MAX,
as verl does), and packs by population annealing on RoutePack's cost model (attention stages with
their linear and quadratic terms, per-micro-batch overhead). Return value and index lists are
verl's: ``(list[TensorDict], list[list[int]])``, every sample once, so ``restore_dynamic_batch``
undoes it.

Expert loads: verl calls this per DP rank on the rank's already-dispatched samples, so a local
packing cannot move tokens between ranks; what the replayed routes change here is the placement.
:func:`expert_map_from_batch` imports ``routed_experts`` (padding and zero-filled positions are
not load on expert 0, verl #7075), sums the loads over ``dp_group`` and returns one LPT
logical→physical map, the same on every rank, for :mod:`routepack_opt.integrations.megatron`.

DP balance (verl's ``RayPPOTrainer._balance_batch``): the single controller reorders the whole
global batch and the dispatch cuts it into ``dp_size`` *equal* chunks, so every rank gets the
same number of samples (verl partitions with ``equal_size=True`` and asserts N % dp_size == 0).
:func:`balance_batch_partitions` plans the whole global batch at once with
``Topology(equal_samples_per_slot=True)`` — rank d's chunk is slot d of the plan, its samples
listed micro-batch by micro-batch — and :func:`balance_batch` applies it to a ``DataProto`` the
way ``_balance_batch`` does (reorder in place, verl's balance metrics). With ``routed_experts``
(and ``num_experts``, ``ep_size``) the whole step is planned on the joint cost; otherwise on
lengths only. Patch it in with
``RayPPOTrainer._balance_batch = lambda self, batch, metrics, logging_prefix="global_seqlen",
keep_minibatch=False: balance_batch(batch, self._get_dp_size(self.actor_rollout_wg, "actor"),
metrics, max_token_len=..., logging_prefix=logging_prefix)``.

Enabling it by config: RoutePack registers a ``verl.plugins`` entry point
(:mod:`routepack_opt.integrations.verl_plugin`); with ``ROUTEPACK_VERL=1`` in the workers'
environment, ``import verl`` swaps verl's function for ours (cost preset from
``ROUTEPACK_COST``, default ``qwen3-30b-a3b``).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from routepack_opt.certify import certify_rows
from routepack_opt.core.errors import InputError
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.core.topology import Topology
from routepack_opt.heuristics.placement.lpt import lpt_placement, swap_refine
from routepack_opt.integrations import _deps
from routepack_opt.integrations._common import as_cost, length_only_window, plan_cells
from routepack_opt.integrations.replay import import_replay

__all__ = ["rearrange_micro_batches", "expert_map_from_batch", "batch_lengths",
           "balance_batch_partitions", "balance_batch", "GlobalBalance"]


def batch_lengths(batch) -> tuple[np.ndarray, int]:
    """(effective tokens per sample, padded sequence length) the way verl reads them: nested
    ``input_ids`` offsets, else ``attention_mask.sum(1)``."""
    input_ids = batch["input_ids"]
    if getattr(input_ids, "is_nested", False):
        lens = input_ids.offsets().diff()
        return lens.cpu().numpy().astype(np.int64), int(lens.max())
    mask = batch["attention_mask"]
    return mask.sum(dim=1).cpu().numpy().astype(np.int64), int(mask.shape[-1])


def _dist_reduce(values: list[int], op: str, dp_group) -> list[int]:
    torch = _deps.torch()
    dist = _deps.torch_distributed()

    if not (dist.is_available() and dist.is_initialized()) or dp_group is None:
        return values
    t = torch.tensor(values, dtype=torch.long)
    if dist.get_backend(dp_group) == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=getattr(dist.ReduceOp, op), group=dp_group)
    return [int(v) for v in t.cpu().tolist()]


def rearrange_micro_batches(batch, max_token_len, dp_group=None, num_batches_divided_by=None,
                            same_micro_num_in_dp=True, min_num_micro_batch=None,
                            use_dynamic_bsz_balance=True, force_group_size=1, *,
                            cost="qwen3-30b-a3b", objective: str = "max-sum",
                            time_limit: float | None = None, max_sweeps: int | None = None, seed: int = 0):
    """Same signature and return as verl's; the extra keyword-only options tune the planner.

    Never exceeds ``max_token_len`` effective tokens per micro-batch. ``force_group_size`` > 1
    keeps consecutive groups together (planned as one item of the group's total length, so the
    quadratic term is an over-estimate for those). Raises :class:`InputError` where verl asserts
    (a sample or forced group longer than the cap, a batch not divisible into groups, fewer
    groups than the agreed micro-batch count).
    """
    tu = _deps.verl_tensordict_utils()

    lens_N, _ = batch_lengths(batch)
    N = int(lens_N.shape[0])
    cap = int(max_token_len)
    g = int(force_group_size)
    if g < 1 or N % g:
        raise InputError(f"batch size {N} is not divisible by force_group_size {g}")
    item_len = lens_N.reshape(N // g, g).sum(axis=1)
    if (item_len < 1).any():
        raise InputError("a sample has no tokens (attention_mask all zero)")
    num_items = item_len.shape[0]
    # Agree on the fatal constraints first, so that no rank raises while its peers wait (as verl).
    sync = same_micro_num_in_dp and dp_group is not None
    longest, neg_items = _dist_reduce([int(item_len.max()), -num_items], "MAX", dp_group if sync else None)
    if longest > cap:
        raise InputError(f"a {'forced group' if g > 1 else 'sample'} of {longest} tokens exceeds "
                         f"max_token_len={cap} and cannot be split")
    topo = Topology(dp=1, ep=1, capacity=cap, min_rows=int(min_num_micro_batch or 1),
                    row_multiple=int(num_batches_divided_by or 1))
    window = length_only_window(item_len)

    rows = int(certify_rows(window, topo, time_limit=10.0).rows)
    if sync:
        rows = _dist_reduce([rows], "MAX", dp_group)[0]
    if rows > -neg_items:
        raise InputError(f"cannot keep every micro-batch under max_token_len={cap} with {rows} "
                         f"non-empty micro-batches: a rank has only {-neg_items} "
                         f"{'groups' if g > 1 else 'samples'}")
    pc = plan_cells(window, topo, cost, objective=objective, rows=rows, time_limit=time_limit,
                    max_sweeps=max_sweeps, seed=seed)
    parts = [[j for it in pc.cells[r][0] for j in range(it * g, it * g + g)] for r in range(rows)]
    if use_dynamic_bsz_balance:
        # verl's pipeline-bubble order: heaviest in the middle, lighter ones at both ends.

        pl = pc.plan
        J_R = Evaluator(window, topo, as_cost(cost)).costs(pl.placement, pl.row, pl.slot, rows)[:, 0]
        order = sorted(range(rows), key=lambda r: (J_R[r], parts[r][0]), reverse=True)
        order = order[::2][::-1] + order[1::2]
        parts = [parts[r] for r in order]
    micro_batches = [tu.index_select_tensor_dict(batch, p) for p in parts]
    return micro_batches, parts


def expert_map_from_batch(batch, num_experts: int, ep_size: int, *, dp_group=None,
                          moe_layer_freq=None, refine: bool = True) -> np.ndarray:
    """LPT logical→physical map ``[L, E]`` (Graham 1969, then swap refinement) from the batch's
    ``routed_experts [B, S, layers, top_k]`` and ``attention_mask``, loads summed over
    ``dp_group`` so every rank gets the same map."""

    if "routed_experts" not in batch.keys():
        raise InputError("batch has no 'routed_experts' (enable routing replay in the rollout)")
    w = import_replay(batch["routed_experts"], format="verl", num_experts=num_experts,
                      attention_mask=batch["attention_mask"], moe_layer_freq=moe_layer_freq).window
    load_LE = w.expert_loads()
    if dp_group is not None:
        L, E = load_LE.shape
        load_LE = np.asarray(_dist_reduce(load_LE.ravel().tolist(), "SUM", dp_group)).reshape(L, E)
    Topology(dp=ep_size, ep=ep_size, capacity=1).check_experts(num_experts)
    pl = lpt_placement(load_LE, ep_size)
    return swap_refine(load_LE, pl, ep_size) if refine else pl


@dataclasses.dataclass(frozen=True)
class GlobalBalance:
    """A global-batch plan with N / dp_size samples per rank. ``partitions[d]``: rank d's sample
    indices, micro-batch by micro-batch (what ``_balance_batch`` concatenates); ``micro_batches[d][r]``:
    rank d's r-th micro-batch (global indices); ``plan``: the RoutePack plan (slot d = rank d)."""

    partitions: list
    micro_batches: list
    plan: object

    @property
    def num_micro_batches(self) -> int:
        return int(self.plan.rows)


def _global_window(lens_N, batch, num_experts, moe_layer_freq):
    if num_experts is None or batch is None or "routed_experts" not in batch.keys():
        return length_only_window(lens_N)

    w = import_replay(batch["routed_experts"], format="verl", num_experts=num_experts,
                      attention_mask=batch["attention_mask"], moe_layer_freq=moe_layer_freq).window
    if not np.array_equal(w.lengths, lens_N):
        raise InputError("routed_experts and attention_mask disagree on the sample lengths")
    return w


def balance_batch_partitions(batch, dp_size: int, *, max_token_len: int, num_experts: int | None = None,
                             ep_size: int = 1, moe_layer_freq=None, num_batches_divided_by=None,
                             min_num_micro_batch=None, cost="qwen3-30b-a3b", objective: str = "max-sum",
                             time_limit: float | None = None, max_sweeps: int | None = None,
                             seed: int = 0) -> GlobalBalance:
    """Plan the whole global batch (a TensorDict with ``attention_mask`` and optionally
    ``routed_experts`` [B, S, layers, top_k]) over ``dp_size`` ranks with equal sample counts,
    every micro-batch ≤ ``max_token_len`` tokens. Raises :class:`InputError` when B % dp_size != 0
    (as verl asserts) or a sample is longer than the cap."""
    mask = batch["attention_mask"]
    lens_N = mask.reshape(mask.shape[0], -1).sum(-1).cpu().numpy().astype(np.int64)
    if (lens_N < 1).any():
        raise InputError("a sample has no tokens (attention_mask all zero)")
    D = int(dp_size)
    use_routes = num_experts is not None and "routed_experts" in batch.keys()
    topo = Topology(dp=D, ep=int(ep_size) if use_routes else 1, capacity=int(max_token_len),
                    min_rows=int(min_num_micro_batch or 1), row_multiple=int(num_batches_divided_by or 1),
                    equal_samples_per_slot=True)
    topo.check_samples(lens_N.size)
    window = _global_window(lens_N, batch, num_experts, moe_layer_freq)
    pc = plan_cells(window, topo, cost, objective=objective, time_limit=time_limit,
                    max_sweeps=max_sweeps, seed=seed)
    mbs = [[list(pc.cells[r][d]) for r in range(pc.rows)] for d in range(D)]
    parts = [[i for mb in mbs[d] for i in mb] for d in range(D)]
    return GlobalBalance(parts, mbs, pc.plan)


def balance_batch(batch, dp_size: int, metrics: dict | None = None, *, max_token_len: int,
                  logging_prefix: str = "global_seqlen", **options) -> GlobalBalance:
    """verl's ``_balance_batch`` on a ``DataProto``: plan (:func:`balance_batch_partitions`,
    ``options`` passed on), reorder the batch in place so that the dispatch's equal chunks are
    the planned ranks, and add verl's balance metrics to ``metrics``."""
    torch = _deps.torch()
    log_seqlen_unbalance = _deps.verl_log_seqlen_unbalance()

    gb = balance_batch_partitions(batch.batch, dp_size, max_token_len=max_token_len, **options)
    batch.reorder(torch.tensor([j for part in gb.partitions for j in part]))
    if metrics is not None:
        mask = batch.batch["attention_mask"]
        # the batch is reordered now: rank d holds positions d·m .. d·m + m − 1
        m = mask.shape[0] // dp_size
        lens_now = mask.reshape(mask.shape[0], -1).sum(-1).tolist()
        metrics.update(log_seqlen_unbalance(seqlen_list=lens_now,
                                            partitions=[list(range(d * m, d * m + m)) for d in range(dp_size)],
                                            prefix=logging_prefix))
    return gb

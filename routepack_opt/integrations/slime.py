"""slime: a drop-in for ``slime.utils.dp_schedule.build_dp_schedule`` (imported by
``slime.ray.rollout``, which calls it from ``RolloutManager._split_train_data_by_dp``).

slime packs each step's samples with one first-fit pass into micro-batches under
``max_tokens_per_gpu · cp_size`` tokens, splits bins until the count is a multiple of
``dp_size`` (× ``microbatch_group_size_per_vp_stage`` with VPP) and deals them to ranks
(round-robin, or Karmarkar–Karp on estimated FLOPs with ``balance_data``). Here each step is one
RoutePack window: certified minimum rows, LPT expert placement from the step's replayed routes,
and population annealing on the joint attention + expert cost. The return contract and every
invariant slime documents (and its ``tests/test_dp_schedule.py`` asserts) are kept:

- steps of ``global_batch_size`` rollouts; a rollout's samples stay in one step; trailing
  rollouts that do not fill a step are dropped (reported in :class:`SlimeSchedule`);
- every DP rank runs the same number of micro-batches per step, a multiple of
  ``microbatch_group_size_per_vp_stage`` when ``vpp_size > 1``;
- every micro-batch holds ≤ ``max_tokens_per_gpu · cp_size`` tokens, except a single sample
  larger than that, which is alone in its micro-batch (slime's rule);
- every kept sample is placed exactly once; ``micro_batch_indices[r]`` tiles
  ``range(len(partitions[r]))``.

Switching it on in slime (no slime code copied here):

    import slime.ray.rollout
    from routepack_opt.integrations import slime as rp_slime
    rp_slime.install(slime.ray.rollout, cost="qwen3-30b-a3b")   # length + attention aware

and, to plan with expert loads, pass the replayed routes where slime calls it
(``RolloutManager._split_train_data_by_dp``)::

    build_dp_schedule(self.args, self.train_parallel_config, total_lengths,
                      global_batch_size=..., rollout_indices=data["rollout_ids"],
                      routed_experts=data.get("rollout_routed_experts"))

Only the dynamic-batch path (``use_dynamic_batch_size``) is planned: slime's static path fixes
``micro_batch_size`` samples per micro-batch, which leaves nothing to plan.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from routepack_opt.core.errors import InputError
from routepack_opt.core.topology import Topology
from routepack_opt.integrations._common import clip_to_cap, length_only_window, plan_cells
from routepack_opt.integrations.replay import import_replay

__all__ = ["build_dp_schedule", "plan_dp_schedule", "SlimeSchedule", "install"]


@dataclasses.dataclass(frozen=True)
class SlimeSchedule:
    """slime's four return values plus what RoutePack adds: per step, the logical→physical expert
    map ``[L, E]`` (for :mod:`routepack_opt.integrations.megatron`) and the plan report; and the
    trailing rollouts' samples slime drops."""

    partitions: list[list[int]]
    micro_batch_indices: list[list[list[int]]]
    num_microbatches: list[int]
    global_batch_sizes: list[int]
    logical_to_physical: list[np.ndarray | None]
    reports: list[dict]
    dropped_samples: list[int]

    def as_slime(self):
        return self.partitions, self.micro_batch_indices, self.num_microbatches, self.global_batch_sizes


def _cfg(train_parallel_config: dict) -> tuple[int, int, int, int]:
    try:
        vals = [train_parallel_config[k] for k in ("dp_size", "cp_size", "vpp_size",
                                                   "microbatch_group_size_per_vp_stage")]
    except (KeyError, TypeError) as exc:
        raise InputError(f"train_parallel_config: missing {exc}") from None
    for name, v in zip(("dp_size", "cp_size", "vpp_size", "microbatch_group_size_per_vp_stage"), vals):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise InputError(f"train_parallel_config: {name} must be a positive integer, got {v!r}")
    return tuple(int(v) for v in vals)


def plan_dp_schedule(args: Any, train_parallel_config: dict, total_lengths, *, global_batch_size: int,
                     rollout_indices, routed_experts=None, num_experts: int | None = None,
                     ep_size: int | None = None, moe_layer_freq=None, cost="qwen3-30b-a3b",
                     objective: str = "max-sum", placement="lpt", time_limit: float | None = None,
                     max_sweeps: int | None = None, seed: int = 0) -> SlimeSchedule:
    """:func:`build_dp_schedule` with RoutePack's extras (see :class:`SlimeSchedule`).

    ``routed_experts``: slime's ``rollout_routed_experts`` (one ``[len_i - 1, layers, top_k]``
    array per sample, same order as ``total_lengths``); ``num_experts`` defaults to
    ``args.num_experts``, ``ep_size`` to ``args.expert_model_parallel_size`` (1 if absent).
    """
    dp_size, cp_size, vpp_size, mb_group = _cfg(train_parallel_config)
    if not getattr(args, "use_dynamic_batch_size", False):
        raise InputError("routepack's slime schedule plans the dynamic-batch path: set "
                         "--use-dynamic-batch-size (the static path fixes micro_batch_size samples "
                         "per micro-batch)")
    if getattr(args, "max_tokens_per_gpu", None) is None:
        raise InputError("args.max_tokens_per_gpu is required with use_dynamic_batch_size")
    cap = int(args.max_tokens_per_gpu) * cp_size
    lengths = [int(x) for x in total_lengths]
    rollout_indices = list(rollout_indices)
    if len(rollout_indices) != len(lengths):
        raise InputError(f"rollout_indices: {len(rollout_indices)} entries for {len(lengths)} samples")
    if any(n < 1 for n in lengths):
        raise InputError("total_lengths: every sample needs at least 1 token")
    if isinstance(global_batch_size, bool) or not isinstance(global_batch_size, (int, np.integer)) \
            or global_batch_size < 1:
        raise InputError(f"global_batch_size must be a positive integer, got {global_batch_size!r}")
    if routed_experts is not None:
        if len(routed_experts) != len(lengths):
            raise InputError(f"routed_experts: {len(routed_experts)} samples for {len(lengths)} lengths")
        num_experts = num_experts if num_experts is not None else getattr(args, "num_experts", None)
        if num_experts is None:
            raise InputError("routed_experts needs num_experts (or args.num_experts)")
        ep = int(ep_size if ep_size is not None else (getattr(args, "expert_model_parallel_size", None) or 1))
    else:
        ep = 1

    # Steps of global_batch_size rollouts, a rollout's samples together (first-occurrence order).
    by_rollout: dict[Any, list[int]] = {}
    for pos, rid in enumerate(rollout_indices):
        by_rollout.setdefault(rid, []).append(pos)
    rids = list(by_rollout)
    num_steps = len(rids) // int(global_batch_size)
    if num_steps < 1:
        raise InputError(f"num_rollouts ({len(rids)}) < global_batch_size ({global_batch_size}); "
                         "need at least one full step")
    dropped = [pos for rid in rids[num_steps * global_batch_size:] for pos in by_rollout[rid]]

    row_multiple = mb_group if vpp_size > 1 else 1
    partitions: list[list[int]] = [[] for _ in range(dp_size)]
    mbi: list[list[list[int]]] = [[] for _ in range(dp_size)]
    nmb: list[int] = []
    gbs: list[int] = []
    maps: list[np.ndarray | None] = []
    reports: list[dict] = []
    for s in range(num_steps):
        idx = [pos for rid in rids[s * global_batch_size:(s + 1) * global_batch_size] for pos in by_rollout[rid]]
        if len(idx) < dp_size:
            raise InputError(f"step {s}: {len(idx)} samples < dp_size {dp_size}; each step needs at "
                             "least one sample per rank")
        step_len = [lengths[i] for i in idx]
        if routed_experts is not None:
            window = import_replay([routed_experts[i] for i in idx], format="slime",
                                   num_experts=num_experts, lengths=step_len,
                                   moe_layer_freq=moe_layer_freq).window
        else:
            window = length_only_window(step_len)
        window, clipped = clip_to_cap(window, cap)
        topo = Topology(dp=dp_size, ep=ep, capacity=cap, row_multiple=row_multiple)
        pc = plan_cells(window, topo, cost, objective=objective, placement=placement,
                        time_limit=time_limit, max_sweeps=max_sweeps, seed=seed)
        for d in range(dp_size):
            for r in range(pc.rows):
                cell = pc.cells[r][d]
                start = len(partitions[d])
                partitions[d].extend(idx[i] for i in cell)
                mbi[d].append(list(range(start, start + len(cell))))
        nmb.append(pc.rows)
        gbs.append(int(global_batch_size))
        maps.append(pc.logical_to_physical.copy() if routed_experts is not None else None)
        rep = dict(pc.report)
        rep["oversize_samples"] = [idx[i] for i in clipped]
        reports.append(rep)
    return SlimeSchedule(partitions, mbi, nmb, gbs, maps, reports, dropped)


def build_dp_schedule(args: Any, train_parallel_config: dict, total_lengths, *, global_batch_size: int,
                      rollout_indices, routed_experts=None, num_experts: int | None = None,
                      cost="qwen3-30b-a3b", **planner_options):
    """slime's contract: ``(partitions, micro_batch_indices, num_microbatches, global_batch_sizes)``.
    ``planner_options``: ``ep_size``, ``moe_layer_freq``, ``objective``, ``placement``,
    ``time_limit``, ``max_sweeps``, ``seed`` (see :func:`plan_dp_schedule`)."""
    return plan_dp_schedule(args, train_parallel_config, total_lengths, global_batch_size=global_batch_size,
                            rollout_indices=rollout_indices, routed_experts=routed_experts,
                            num_experts=num_experts, cost=cost, **planner_options).as_slime()


def install(module, **options):
    """Point ``module.build_dp_schedule`` (e.g. ``slime.ray.rollout``) at ours with ``options``;
    returns the function it replaced, to restore it."""
    old = getattr(module, "build_dp_schedule", None)
    module.build_dp_schedule = functools.partial(build_dp_schedule, **options)
    return old

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

Both of slime's paths are planned:

- dynamic (``use_dynamic_batch_size``): certified minimum micro-batches under the cap
  ``max(1, int(max_tokens_per_gpu · cp_size · packing_safety_margin))`` (slime's bin size; the
  margin defaults to 1), a multiple of ``dp_size`` (× ``mb_group`` with VPP) in all;
- static: slime's ``ceil(n / micro_batch_size)`` micro-batches of ``micro_batch_size`` samples
  (the last one the remainder), which must divide over ``dp_size · mb_group`` (slime asserts so,
  and so do we, with its message). Which samples share a micro-batch and which rank runs it
  still sets the attention and expert cost: from slime's own layout (and a KK-balanced one),
  swaps of samples between micro-batches (which keep every count) search the joint cost. With
  ``micro_batch_size = 1`` and ``dp_size = 1`` nothing is left to decide and slime's layout is
  returned as it is.

Steps: ``global_batch_size`` rollouts each, or, with ``args.global_batch_tokens`` (slime's
token-budget steps), consecutive rollouts whose sample count divides by ``dp_size`` and whose
tokens come nearest the budget (slime's rule, same steps). ``sample_is_multimodal`` is accepted;
with ``args.multimodal_aware_packing`` ``"separate"`` / ``"separate_raw"`` a step holding a
multimodal sample keeps slime's own layout (RoutePack does not model the padded multimodal cost;
one warning says so). ``args.balance_by_flops`` packs slime's bins by FLOPs without the cap; ours
always keeps the cap.

Errors: where slime asserts (fewer rollouts than a step, fewer samples than ranks, a static count
that does not divide, a missing ``max_tokens_per_gpu``), ours raises
:class:`~routepack_opt.integrations._seam.FrameworkAssertionError` (an ``AssertionError`` and an
``InputError``) with slime's message.

Every step yields a :class:`~routepack_opt.integrations._seam.SeamRecord`: micro-batches and
predicted step time (one evaluator) of ours and of slime's own layout (first-fit, bin splitting,
round-robin; with ``balance_data`` KK over the rank loads, here on RoutePack's per-sample cost
instead of slime's FLOPs estimate), planning time and the saving. ``last_records()`` returns the
last call's, ``SlimeSchedule.records`` carries them.

Settings: ``cost``, ``objective``, ``time_limit`` (seconds per step; default
``DEFAULT_TIME_LIMIT["slime"]``), ``max_sweeps``, ``seed`` by keyword, else ``ROUTEPACK_COST``,
``ROUTEPACK_OBJECTIVE``, ``ROUTEPACK_TIME_LIMIT``; :func:`install` checks them when it runs.
Where to call :func:`install`: in the process that runs ``RolloutManager`` (a Ray actor), before
the actor is created; patching the driver does not reach an actor already running.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from typing import Any

import numpy as np

from routepack_opt.core.checks import check_redundant_experts
from routepack_opt.core.errors import InfeasibleError, InputError
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.core.placement import Placement
from routepack_opt.core.topology import Topology
from routepack_opt.heuristics.cells import kk_partition
from routepack_opt.integrations._common import (
    clip_to_cap,
    length_only_window,
    plan_cells,
    plan_fixed_cells,
    score_cells,
)
from routepack_opt.integrations._seam import (
    UNSET,
    FrameworkAssertionError,
    Recorder,
    SeamRecord,
    SeamSettings,
    seam_settings,
    warn_once,
)
from routepack_opt.integrations.replay import import_replay, warm_import

__all__ = ["build_dp_schedule", "plan_dp_schedule", "SlimeSchedule", "install", "last_records"]

logger = logging.getLogger("routepack_opt.integrations")
_RECORDS = Recorder()
_MULTIMODAL_SEPARATE = ("separate", "separate_raw")
_MIN_SEARCH_S = 0.002  # less than this left of a step's budget: the quick path


_LAST_CALL: list[SeamRecord] = []


def last_records() -> list[SeamRecord]:
    """The records of the last :func:`build_dp_schedule` call in this process (one per step)."""
    return list(_LAST_CALL)


@dataclasses.dataclass(frozen=True)
class SlimeSchedule:
    """slime's four return values plus what RoutePack adds: per step, the logical→physical expert
    map ``[L, E]`` (for :mod:`routepack_opt.integrations.megatron`), the plan report and the
    :class:`SeamRecord`; and the trailing rollouts' samples slime drops.

    With ``redundant_experts > 0``, ``placements[step]`` is the step's replicated
    :class:`~routepack_opt.core.placement.Placement` (``phy2log [L, E + N]``, ``logcnt [L, E]``,
    the replica ``rule``), what ``apply_expert_placement(..., source_rank=)`` and
    ``migrate_experts`` take, and ``logical_to_physical[step]`` each expert's first replica's slot
    (``log2phy[:, :, 0]``, not a permutation of 0..E−1). Without replicas ``placements`` is one
    None per step."""

    partitions: list[list[int]]
    micro_batch_indices: list[list[list[int]]]
    num_microbatches: list[int]
    global_batch_sizes: list[int]
    logical_to_physical: list[np.ndarray | None]
    reports: list[dict]
    dropped_samples: list[int]
    records: list[SeamRecord] = dataclasses.field(default_factory=list)
    placements: list[Placement | None] = dataclasses.field(default_factory=list)

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


def _positive_int(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise InputError(f"{name} must be a positive integer, got {v!r}")
    return int(v)


def _token_steps(rids: list, by_rollout: dict, lengths: list[int], budget: int, dp: int) -> list[list]:
    """slime's token-budget steps (``args.global_batch_tokens``): from each start, the prefixes of
    the remaining rollouts whose sample count is a positive multiple of ``dp`` are candidates;
    the step ends at the first candidate reaching ``budget`` tokens, or at the candidate before it
    when that one is strictly nearer the budget; without one reaching it, the step is all the rest.
    A step whose sample count is not such a multiple ends the schedule (its rollouts are dropped)."""
    if budget <= 0:
        raise InputError(f"target_tokens must be positive, got {budget}")
    n_R = np.array([len(by_rollout[r]) for r in rids], dtype=np.int64)
    t_R = np.array([sum(lengths[i] for i in by_rollout[r]) for r in rids], dtype=np.int64)
    steps, start, n = [], 0, len(rids)
    while start < n:
        cnt = np.cumsum(n_R[start:])
        tok = np.cumsum(t_R[start:])
        aligned = np.flatnonzero((cnt >= dp) & (cnt % dp == 0))
        end = n  # exclusive
        reach = aligned[tok[aligned] >= budget]
        if reach.size:
            c = int(reach[0])
            before = aligned[aligned < c]
            end = start + c + 1
            if before.size and budget - tok[before[-1]] < tok[c] - budget:
                end = start + int(before[-1]) + 1
        count = int(n_R[start:end].sum())
        if count < dp or count % dp:
            break
        steps.append(rids[start:end])
        start = end
    return steps


def _first_fit(len_n: list[int], cap: int, mm: list[bool] | None = None, padded: bool = False) -> list[list[int]]:
    """slime's first-fit: each sample into the first bin it fits (sum ≤ cap), else a new bin; an
    oversize sample opens its own. With ``mm`` (multimodal flags) a bin holds one kind only, and
    with ``padded`` a multimodal bin costs ``count · max length``."""
    bins: list[list[int]] = []
    tot: list[int] = []
    peak: list[int] = []
    kind: list[bool] = []
    for i, x in enumerate(len_n):
        m = bool(mm[i]) if mm is not None else False
        for j in range(len(bins)):
            if mm is not None and kind[j] != m:
                continue
            load = max(peak[j], x) * (len(bins[j]) + 1) if (m and padded) else tot[j] + x
            if load <= cap:
                bins[j].append(i)
                tot[j] += x
                peak[j] = max(peak[j], x)
                break
        else:
            bins.append([i])
            tot.append(x)
            peak.append(x)
            kind.append(m)
    return bins


def _split_to(bins: list[list[int]], target: int, len_n: list[int]) -> None:
    """slime's alignment: split the bin with the most tokens (among those of ≥ 2 samples; ties
    to the later bin) into two halves by LPT until there are ``target`` bins or none can split."""
    while len(bins) < target:
        cand = [(sum(len_n[i] for i in b), j) for j, b in enumerate(bins) if len(b) > 1]
        if not cand:
            return
        _, j = max(cand)
        halves: list[list[int]] = [[], []]
        sums = [0, 0]
        for i in sorted(bins[j], key=lambda i: -len_n[i]):
            h = 0 if sums[0] <= sums[1] else 1
            halves[h].append(i)
            sums[h] += len_n[i]
        bins[j] = halves[0]
        bins.append(halves[1])


def _deal(bins: list[list[int]], dp: int, weight_n=None) -> list[list[list[int]]]:
    """Bins to ranks as slime does: round-robin (bin k → rank k mod dp), or with ``weight_n`` KK
    over the bins' summed weights with equal counts; each rank's bins in index order. Returns
    ``cells[r][d]``."""
    K = len(bins)
    if weight_n is None:
        part_K = np.arange(K) % dp
    else:
        part_K = kk_partition([sum(weight_n[i] for i in b) for b in bins], dp, equal_size=True)
    per_rank = [[bins[k] for k in range(K) if part_K[k] == d] for d in range(dp)]
    R = K // dp
    return [[list(per_rank[d][r]) for d in range(dp)] for r in range(R)]


def _static_message(n: int, K: int, mbs: int, dp: int, group: int) -> str:
    return (f"static path: num_mbs ({K}) is not a multiple of dp_size * mb_group ({dp * group}); got "
            f"step_size={n}, micro_batch_size={mbs}, dp_size={dp}, mb_group={group}. Splitting static "
            "mbs would break the fixed-size invariant; adjust the config so step_size % "
            "(dp_size * micro_batch_size * mb_group) == 0.")


def _slime_layout(step_len: list[int], *, dynamic: bool, cap: int, mbs: int, dp: int, group: int,
                  weight_n=None, mm=None, mm_mode: str = "off") -> list[list[list[int]]] | None:
    """slime's own layout of one step (``cells[r][d]``, local indices), or None where slime's
    bin splitting cannot reach the aligned count (slime asserts there)."""
    align = dp * group
    n = len(step_len)
    if dynamic:
        use_mm = mm is not None and mm_mode in _MULTIMODAL_SEPARATE and any(mm)
        bins = _first_fit(step_len, cap, mm if use_mm else None, padded=mm_mode == "separate")
        target = max(-(-len(bins) // align) * align, align)
        _split_to(bins, target, step_len)
        if len(bins) != target:
            return None
    else:
        bins = [list(range(i, min(i + mbs, n))) for i in range(0, n, mbs)]
        if len(bins) % align:
            raise FrameworkAssertionError(_static_message(n, len(bins), mbs, dp, group))
    return _deal(bins, dp, weight_n)


# the last route import's seconds per token in this process (the default budget's import check)
_IMPORT_RATE: dict[str, float] = {}


def _skip_import(settings: SeamSettings, routed_experts, step_len: list[int], dynamic: bool, cap: int, mbs: int,
                 dp: int, group: int) -> str | None:
    """Why this step's route import is skipped (predicted, from the last import's rate, to cost
    more than the step's whole budget: the set one, or the default one, so planning could not pay
    for it), else None. The step is then planned on lengths. Never with ``max_sweeps`` set."""
    rate = _IMPORT_RATE.get("s_per_token")
    if routed_experts is None or rate is None or settings.max_sweeps is not None or settings.time_limit is None:
        return None  # max_sweeps: a fixed search effort asked for, the routes always used
    predicted = rate * sum(step_len)
    if not settings.time_limit_is_default:  # a set budget: skip an import predicted to overrun it
        if predicted <= settings.time_limit:
            return None
        return (f"route import: predicted {predicted * 1e3:.0f} ms, over the step's budget "
                f"({settings.time_limit * 1e3:.0f} ms); planned on lengths")
    try:
        theirs = _slime_layout(step_len, dynamic=dynamic, cap=cap, mbs=mbs, dp=dp, group=group)
    except InputError:
        return None
    if theirs is None:
        return None
    lw, _ = clip_to_cap(length_only_window(step_len), cap)
    budget = settings.step_time_limit(score_cells(lw, Topology(dp=dp, ep=1, capacity=cap, row_multiple=group),
                                                  settings.cost, theirs, settings.objective))
    if budget is None or predicted <= budget:
        return None
    return (f"route import: predicted {predicted * 1e3:.0f} ms, over the step's budget ({budget * 1e3:.0f} ms); "
            "planned on lengths")


def _sample_cost(window, cost) -> np.ndarray:
    """Each sample's cost alone in a micro-batch (attention with its linear and quadratic terms,
    and its routed tokens): the per-sample weight for KK where slime weighs by estimated FLOPs."""
    from routepack_opt.integrations._common import as_cost

    cm = as_cost(cost)
    L = window.lengths.astype(np.float64)
    att = sum(st.alpha * L + st.beta * L * L for st in cm.stages)
    return att + cm.gamma * window.counts.sum(axis=(1, 2)).astype(np.float64)


def plan_dp_schedule(args: Any, train_parallel_config: dict, total_lengths, *, global_batch_size: int,
                     rollout_indices, routed_experts=None, num_experts: int | None = None,
                     ep_size: int | None = None, moe_layer_freq=None, sample_is_multimodal=None,
                     cost=None, objective: str | None = None, placement="lpt", time_limit=UNSET,
                     max_sweeps: int | None = None, seed: int = 0, threads=UNSET,
                     settings: SeamSettings | None = None, on_record=None,
                     redundant_experts: int = 0, on_critical_path: bool = True) -> SlimeSchedule:
    """:func:`build_dp_schedule` with RoutePack's extras (see :class:`SlimeSchedule`).

    ``routed_experts``: slime's ``rollout_routed_experts`` (one ``[len_i - 1, layers, top_k]``
    array per sample, same order as ``total_lengths``); ``num_experts`` defaults to
    ``args.num_experts``, ``ep_size`` to ``args.expert_model_parallel_size`` (1 if absent).
    ``time_limit`` (seconds per step; None: unbounded), ``cost``, ``objective``, ``max_sweeps``,
    ``seed``, ``threads`` (numba threads during the call): see the module docstring; ``settings``
    passes them resolved (as :func:`install` does). ``on_record(record)`` is called once per step.
    ``redundant_experts``: extra expert slots per MoE layer (E + N divisible by ``ep_size``; needs
    ``routed_experts``): hot experts get replicas and ``SlimeSchedule.placements`` carries each
    step's replicated placement (docs/api.md, "Megatron: replicated experts").
    ``on_critical_path``: whether training waits for this call (slime's ``train.py``: yes;
    ``train_async.py``: no, rollout k + 1 is generated and scheduled while rollout k trains), so
    the records' ``net_saving_us`` subtracts the planning time only where it is paid.
    """
    check_redundant_experts(redundant_experts)
    if redundant_experts and routed_experts is None:
        raise InputError("redundant_experts needs routed_experts: replicas follow the experts' loads")
    if settings is None:
        kw = {} if time_limit is UNSET else {"time_limit": time_limit}
        if threads is not UNSET:
            kw["threads"] = threads
        settings = seam_settings("slime", cost=cost, objective=objective, max_sweeps=max_sweeps, seed=seed, **kw)
    with settings.planner_threads():
        return _plan(args, train_parallel_config, total_lengths, global_batch_size, rollout_indices,
                     routed_experts, num_experts, ep_size, moe_layer_freq, sample_is_multimodal, placement,
                     settings, on_record, int(redundant_experts), bool(on_critical_path))


def _plan(args, train_parallel_config, total_lengths, global_batch_size, rollout_indices, routed_experts,
          num_experts, ep_size, moe_layer_freq, sample_is_multimodal, placement, settings: SeamSettings,
          on_record, redundant: int = 0, on_critical_path: bool = True) -> SlimeSchedule:
    from routepack_opt.warmup import warm

    warm()  # numba's kernels compiled or loaded once per process, before any step's clock starts
    if routed_experts is not None and num_experts is not None and len(routed_experts):
        # the import's pass for these routes' dtype, off the clock (and off the measured import rate)
        warm_import([routed_experts[0]], format="slime", num_experts=num_experts, lengths=[int(total_lengths[0])],
                    moe_layer_freq=moe_layer_freq)
    t_call = time.perf_counter()
    dp_size, cp_size, vpp_size, mb_group = _cfg(train_parallel_config)
    dynamic = bool(getattr(args, "use_dynamic_batch_size", False))
    lengths = [int(x) for x in total_lengths]
    rollout_indices = list(rollout_indices)
    if len(rollout_indices) != len(lengths):
        raise InputError(f"rollout_indices: {len(rollout_indices)} entries for {len(lengths)} samples")
    if any(n < 1 for n in lengths):
        raise InputError("total_lengths: every sample needs at least 1 token")
    if sample_is_multimodal is not None and len(sample_is_multimodal) != len(lengths):
        raise FrameworkAssertionError(f"sample_is_multimodal length {len(sample_is_multimodal)} does not match "
                                      f"total_lengths length {len(lengths)}")
    mm_mode = str(getattr(args, "multimodal_aware_packing", "off") or "off")
    if dynamic:
        if getattr(args, "max_tokens_per_gpu", None) is None:
            raise FrameworkAssertionError("args.max_tokens_per_gpu is required with use_dynamic_batch_size")
        margin = getattr(args, "packing_safety_margin", None)
        margin = 1.0 if margin is None else margin
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not margin > 0:
            raise InputError(f"args.packing_safety_margin must be a positive number, got {margin!r}")
        cap = max(1, int(int(args.max_tokens_per_gpu) * cp_size * margin))
        mbs = 0
    else:
        mbs = getattr(args, "micro_batch_size", None)
        if mbs is None:
            raise FrameworkAssertionError("args.micro_batch_size is required without use_dynamic_batch_size")
        mbs = _positive_int("args.micro_batch_size", mbs)
        cap = sum(lengths)  # the static path has no token cap
    budget = getattr(args, "global_batch_tokens", None)
    if budget is None:
        global_batch_size = _positive_int("global_batch_size", global_batch_size)
    elif isinstance(budget, bool) or not isinstance(budget, (int, np.integer)):
        raise InputError(f"args.global_batch_tokens must be an integer number of tokens, got {budget!r}")
    if routed_experts is not None:
        if len(routed_experts) != len(lengths):
            raise InputError(f"routed_experts: {len(routed_experts)} samples for {len(lengths)} lengths")
        num_experts = num_experts if num_experts is not None else getattr(args, "num_experts", None)
        if num_experts is None:
            raise InputError("routed_experts needs num_experts (or args.num_experts)")
        ep = int(ep_size if ep_size is not None else (getattr(args, "expert_model_parallel_size", None) or 1))
    else:
        ep = 1

    # Steps of rollouts, a rollout's samples together (first-occurrence order).
    by_rollout: dict[Any, list[int]] = {}
    for pos, rid in enumerate(rollout_indices):
        by_rollout.setdefault(rid, []).append(pos)
    rids = list(by_rollout)
    if budget is not None:
        steps = _token_steps(rids, by_rollout, lengths, int(budget), dp_size)
        if not steps:
            raise FrameworkAssertionError(
                f"num_rollouts ({len(rids)}) cannot form a token-based global batch with dp_size "
                f"{dp_size} and global_batch_tokens {budget}")
    else:
        num_steps = len(rids) // global_batch_size
        if num_steps < 1:
            raise FrameworkAssertionError(f"num_rollouts ({len(rids)}) < global_batch_size ({global_batch_size}); "
                                          "need at least one rollout per step.")
        steps = [rids[s * global_batch_size:(s + 1) * global_batch_size] for s in range(num_steps)]
    kept = {rid for step in steps for rid in step}
    dropped = [pos for rid in rids if rid not in kept for pos in by_rollout[rid]]

    group = mb_group if vpp_size > 1 else 1
    partitions: list[list[int]] = [[] for _ in range(dp_size)]
    mbi: list[list[list[int]]] = [[] for _ in range(dp_size)]
    nmb: list[int] = []
    gbs: list[int] = []
    maps: list[np.ndarray | None] = []
    placements: list[Placement | None] = []
    reports: list[dict] = []
    records: list[SeamRecord] = []
    for s, step_rids in enumerate(steps):
        t0 = time.perf_counter()
        budget = None
        idx = [pos for rid in step_rids for pos in by_rollout[rid]]
        if len(idx) < dp_size:
            raise FrameworkAssertionError(f"step {s}: {len(idx)} samples < dp_size {dp_size}; each step needs "
                                          "at least one sample per rank.")
        step_len = [lengths[i] for i in idx]
        skip = _skip_import(settings, routed_experts, step_len, dynamic, cap, mbs, dp_size, group)
        step_ep, step_red = (ep, redundant) if skip is None else (1, 0)
        quick = skip
        if routed_experts is not None and skip is None:
            t_imp = time.perf_counter()
            window = import_replay([routed_experts[i] for i in idx], format="slime",
                                   num_experts=num_experts, lengths=step_len,
                                   moe_layer_freq=moe_layer_freq).window
            _IMPORT_RATE["s_per_token"] = (time.perf_counter() - t_imp) / max(1, sum(step_len))
        else:
            window = length_only_window(step_len)
        import_s = time.perf_counter() - t0
        step_mm = None if sample_is_multimodal is None else [bool(sample_is_multimodal[i]) for i in idx]
        weight_n = _sample_cost(window, settings.cost) if getattr(args, "balance_data", False) else None
        # slime's own layout of the step (raises slime's assertion on a static count that does not divide)
        t_ref = time.perf_counter()
        theirs = _slime_layout(step_len, dynamic=dynamic, cap=cap, mbs=mbs, dp=dp_size, group=group,
                               weight_n=weight_n, mm=step_mm, mm_mode=mm_mode)
        theirs_s = time.perf_counter() - t_ref
        plan_window, clipped = clip_to_cap(window, cap)
        topo = Topology(dp=dp_size, ep=step_ep, capacity=cap, row_multiple=group, redundant_experts=step_red)
        topo_theirs = Topology(dp=dp_size, ep=step_ep, capacity=cap, row_multiple=group)  # slime: no replicas
        if step_red:
            topo.check_experts(window.num_experts)
        t_ref = time.perf_counter()
        theirs_us = None if theirs is None else score_cells(plan_window, topo_theirs, settings.cost, theirs,
                                                            settings.objective)
        theirs_s += time.perf_counter() - t_ref
        fallback = None
        if dynamic and step_mm is not None and mm_mode in _MULTIMODAL_SEPARATE and any(step_mm):
            fallback = (f"multimodal_aware_packing={mm_mode!r} with multimodal samples: slime's own "
                        "layout (RoutePack does not model the padded multimodal cost)")
            warn_once("slime", "multimodal", fallback)
            if theirs is None:
                raise FrameworkAssertionError(f"dynamic path: could not split step {s}'s {len(idx)} samples "
                                              f"into a multiple of {dp_size * group} micro-batches")
            cells, pc = theirs, None
        elif not dynamic and mbs == 1 and dp_size == 1:
            cells, pc = theirs, None  # one sample per micro-batch on one rank: nothing to decide
        else:
            # one budget per step, from the step's start: import, slime's layout and its score,
            # the search; what is left goes to the search, and under _MIN_SEARCH_S the quick path
            # (slime's own layout) stands, unless max_sweeps asks for a fixed search effort
            budget = settings.step_time_limit(theirs_us)
            if settings.time_limit_is_default and theirs is not None and theirs_us is not None:
                # and at most SHARE_OF_GAIN of what the step can gain over slime's layout (to the
                # placement-free lower bound at slime's count)
                lb = Evaluator(plan_window, topo_theirs, settings.cost).placement_free_lower_bound(len(theirs))
                gain_budget = settings.gain_time_limit(max(0.0, theirs_us - lb))
                budget = gain_budget if budget is None else min(budget, gain_budget)
            left = None if budget is None else budget - (time.perf_counter() - t0)
            opts = dict(objective=settings.objective, placement=placement,
                        time_limit=None if left is None else max(left, 1e-3),
                        max_sweeps=settings.max_sweeps, seed=settings.seed)
            if left is not None and left < _MIN_SEARCH_S and theirs is not None and settings.max_sweeps is None:
                quick = (f"budget: {max(left, 0.0) * 1e3:.0f} ms left of {budget:.3f} s for the step "
                         f"(import {import_s * 1e3:.0f} ms); slime's own layout")
        if quick is not None and quick.startswith("budget"):
            cells, pc = theirs, None
        elif not (dynamic and step_mm is not None and mm_mode in _MULTIMODAL_SEPARATE and any(step_mm)) \
                and not (not dynamic and mbs == 1 and dp_size == 1):
            try:
                if dynamic:
                    pc = plan_cells(plan_window, topo, settings.cost, **opts)
                else:
                    seeds = [theirs]
                    if weight_n is None:
                        seeds.append(_slime_layout(step_len, dynamic=False, cap=cap, mbs=mbs, dp=dp_size,
                                                   group=group, weight_n=_sample_cost(window, settings.cost)))
                    pc = plan_fixed_cells(plan_window, topo, settings.cost, seeds, **opts)
                cells = pc.cells
            except InfeasibleError as exc:
                raise FrameworkAssertionError(f"dynamic path: step {s} has {len(idx)} samples, too few for "
                                              f"a multiple of {dp_size * group} micro-batches ({exc})") from None
            except Exception as exc:  # never break slime: its own layout for this step
                if theirs is None:
                    raise
                fallback = f"planning failed ({exc.__class__.__name__}: {exc}); slime's own layout"
                warn_once("slime", "plan", fallback)
                cells, pc = theirs, None
        t_apply = time.perf_counter()
        rows = len(cells)
        for d in range(dp_size):
            for r in range(rows):
                cell = cells[r][d]
                start = len(partitions[d])
                partitions[d].extend(idx[i] for i in cell)
                mbi[d].append(list(range(start, start + len(cell))))
        nmb.append(rows)
        gbs.append(len(step_rids))
        maps.append(pc.logical_to_physical.copy() if (pc is not None and routed_experts is not None
                                                      and skip is None) else None)
        placements.append(pc.plan.replicas if (pc is not None and step_red) else None)
        rep = dict(pc.report) if pc is not None else {"fallback": fallback or "slime's layout"}
        rep["oversize_samples"] = [idx[i] for i in clipped]
        reports.append(rep)
        ours_us = (float(pc.plan.score["makespan"]) if pc is not None
                   else score_cells(plan_window, topo_theirs, settings.cost, cells, settings.objective))
        now = time.perf_counter()
        # slime's own layout is timed inside the step (theirs_s) and left out of ours, as before
        planning_s = now - t0 - theirs_s
        rec = SeamRecord("slime", rows, None if theirs is None else len(theirs), ours_us, theirs_us,
                         planning_s, theirs_s, samples=len(idx), fallback=fallback, step=s,
                         on_critical_path=on_critical_path, import_s=import_s,
                         plan_s=t_apply - t0 - import_s - theirs_s, apply_s=now - t_apply, budget_s=budget,
                         quick=quick, redundant_experts=step_red)
        records.append(_RECORDS.add(rec, on_record))
    _LAST_CALL[:] = records
    logger.debug("routepack slime: %d steps planned in %.3f s", len(steps), time.perf_counter() - t_call)
    return SlimeSchedule(partitions, mbi, nmb, gbs, maps, reports, dropped, records, placements)


def build_dp_schedule(args: Any, train_parallel_config: dict, total_lengths, *, global_batch_size: int,
                      rollout_indices, sample_is_multimodal=None, routed_experts=None,
                      num_experts: int | None = None, **planner_options):
    """slime's contract: ``(partitions, micro_batch_indices, num_microbatches, global_batch_sizes)``.
    ``planner_options``: ``ep_size``, ``moe_layer_freq``, ``cost``, ``objective``, ``placement``,
    ``time_limit``, ``max_sweeps``, ``seed``, ``settings``, ``on_record``, ``redundant_experts``,
    ``on_critical_path`` (see :func:`plan_dp_schedule`)."""
    return plan_dp_schedule(args, train_parallel_config, total_lengths, global_batch_size=global_batch_size,
                            rollout_indices=rollout_indices, routed_experts=routed_experts,
                            num_experts=num_experts, sample_is_multimodal=sample_is_multimodal,
                            **planner_options).as_slime()


_SETTING_KEYS = ("cost", "objective", "time_limit", "max_sweeps", "seed", "threads")


def install(module, **options):
    """Point ``module.build_dp_schedule`` (``slime.ray.rollout``, in the process that runs
    ``RolloutManager``) at ours with ``options``; returns the function it replaced, to restore it.
    The settings (keywords, else ``ROUTEPACK_*``) are checked here, naming the keyword or the
    variable; a module without ``build_dp_schedule`` is an :class:`InputError`. Logs one INFO line."""
    name = getattr(module, "__name__", repr(module))
    if not hasattr(module, "build_dp_schedule"):
        raise InputError(f"install: {name} has no build_dp_schedule to replace (pass slime.ray.rollout, "
                         "the module that calls it, or slime.utils.dp_schedule)")
    unknown = sorted(set(options) - set(_SETTING_KEYS) - {"ep_size", "moe_layer_freq", "placement",
                                                            "num_experts", "on_record", "redundant_experts",
                                                            "on_critical_path"})
    if unknown:
        raise InputError(f"install: unknown option(s) {', '.join(unknown)}")
    settings = seam_settings("slime", **{k: options.pop(k) for k in _SETTING_KEYS if k in options})
    old = module.build_dp_schedule
    fn = functools.partial(build_dp_schedule, settings=settings, **options)
    fn.__routepack__ = True  # type: ignore[attr-defined]
    module.build_dp_schedule = fn
    logger.info("routepack slime: %s.build_dp_schedule replaced (objective %s, time limit %s per step)",
                name, settings.objective,
                "none" if settings.time_limit is None else f"{settings.time_limit:g} s")
    return old

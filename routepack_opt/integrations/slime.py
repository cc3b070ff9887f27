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

from routepack_opt.core.checks import check_known_options, check_redundant_experts
from routepack_opt.core.errors import InfeasibleError, InputError
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.core.placement import Placement
from routepack_opt.core.topology import Topology
from routepack_opt.integrations._common import (
    clip_to_cap,
    length_only_window,
    plan_cells,
    plan_fixed_cells,
    score_cells,
)
from routepack_opt.integrations._seam import (
    SETTING_KEYS,
    UNSET,
    CallBudget,
    FrameworkAssertionError,
    Recorder,
    SeamRecord,
    SeamSettings,
    failure_cause,
    import_skip,
    seam_settings,
    warn_once,
)
from routepack_opt.integrations._slime_layout import MULTIMODAL_SEPARATE, slime_layout, token_steps
from routepack_opt.replay import import_replay, warm_import

__all__ = ["build_dp_schedule", "plan_dp_schedule", "SlimeSchedule", "install", "last_records"]

logger = logging.getLogger("routepack_opt.integrations")
_RECORDS = Recorder()
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


# the last route import's seconds per token in this process (the default budget's import check)
_IMPORT_RATE: dict[str, float] = {}
# what the last step spent past its search's limit (the search's overrun and the apply after it),
# kept back from the next step's search so that the step's whole added time holds its budget
_RESERVE: dict[str, float] = {}
_MAX_RESERVE_S = 0.05


@dataclasses.dataclass(frozen=True)
class _Request:
    """One call's inputs as :func:`plan_dp_schedule` received them (checked by :func:`_read_shape`)."""

    args: Any
    train_parallel_config: dict
    total_lengths: Any
    global_batch_size: Any
    rollout_indices: Any
    routed_experts: Any
    num_experts: int | None
    ep_size: int | None
    moe_layer_freq: Any
    sample_is_multimodal: Any
    placement: Any
    settings: SeamSettings
    redundant: int = 0
    on_critical_path: bool = True


@dataclasses.dataclass(frozen=True)
class _Shape:
    """The call's packing rules, read from slime's ``args`` and parallel config and checked."""

    dp: int
    group: int  # micro-batches per rank are a multiple of it (mb_group with VPP, else 1)
    dynamic: bool
    cap: int  # a micro-batch's token cap (the static path has none: all the call's tokens)
    mbs: int  # samples per micro-batch on the static path (0: dynamic)
    mm_mode: str
    lengths: list[int]
    rollout_indices: list
    token_budget: int | None  # args.global_batch_tokens (token-budget steps), else None
    global_batch_size: int | None
    num_experts: int | None
    ep: int


def _packing_rules(args, cp_size: int, lengths: list[int]) -> tuple[bool, int, int]:
    """(dynamic, cap, micro_batch_size) of slime's two paths, with slime's assertions."""
    dynamic = bool(getattr(args, "use_dynamic_batch_size", False))
    if dynamic:
        if getattr(args, "max_tokens_per_gpu", None) is None:
            raise FrameworkAssertionError("args.max_tokens_per_gpu is required with use_dynamic_batch_size")
        margin = getattr(args, "packing_safety_margin", None)
        margin = 1.0 if margin is None else margin
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not margin > 0:
            raise InputError(f"args.packing_safety_margin must be a positive number, got {margin!r}")
        return True, max(1, int(int(args.max_tokens_per_gpu) * cp_size * margin)), 0
    mbs = getattr(args, "micro_batch_size", None)
    if mbs is None:
        raise FrameworkAssertionError("args.micro_batch_size is required without use_dynamic_batch_size")
    return False, sum(lengths), _positive_int("args.micro_batch_size", mbs)  # the static path has no token cap


def _expert_args(req: _Request, n: int) -> tuple[int | None, int]:
    """(num_experts, ep) for the routes; (given num_experts, 1) without them."""
    if req.routed_experts is None:
        return req.num_experts, 1
    if len(req.routed_experts) != n:
        raise InputError(f"routed_experts: {len(req.routed_experts)} samples for {n} lengths")
    num_experts = req.num_experts if req.num_experts is not None else getattr(req.args, "num_experts", None)
    if num_experts is None:
        raise InputError("routed_experts needs num_experts (or args.num_experts)")
    ep_size = req.ep_size if req.ep_size is not None else (getattr(req.args, "expert_model_parallel_size", None) or 1)
    return num_experts, int(ep_size)


def _read_shape(req: _Request) -> _Shape:
    """The call's inputs checked in slime's order (its assertions with its messages)."""
    dp_size, cp_size, vpp_size, mb_group = _cfg(req.train_parallel_config)
    lengths = [int(x) for x in req.total_lengths]
    rollout_indices = list(req.rollout_indices)
    if len(rollout_indices) != len(lengths):
        raise InputError(f"rollout_indices: {len(rollout_indices)} entries for {len(lengths)} samples")
    if any(n < 1 for n in lengths):
        raise InputError("total_lengths: every sample needs at least 1 token")
    mm = req.sample_is_multimodal
    if mm is not None and len(mm) != len(lengths):
        raise FrameworkAssertionError(f"sample_is_multimodal length {len(mm)} does not match "
                                      f"total_lengths length {len(lengths)}")
    mm_mode = str(getattr(req.args, "multimodal_aware_packing", "off") or "off")
    dynamic, cap, mbs = _packing_rules(req.args, cp_size, lengths)
    token_budget = getattr(req.args, "global_batch_tokens", None)
    global_batch_size = req.global_batch_size
    if token_budget is None:
        global_batch_size = _positive_int("global_batch_size", global_batch_size)
    elif isinstance(token_budget, bool) or not isinstance(token_budget, (int, np.integer)):
        raise InputError(f"args.global_batch_tokens must be an integer number of tokens, got {token_budget!r}")
    num_experts, ep = _expert_args(req, len(lengths))
    return _Shape(dp_size, mb_group if vpp_size > 1 else 1, dynamic, cap, mbs, mm_mode, lengths, rollout_indices,
                  None if token_budget is None else int(token_budget), global_batch_size, num_experts, ep)


def _steps(shape: _Shape) -> tuple[list[list], dict[Any, list[int]], list[int]]:
    """(steps of rollout ids, each rollout's samples, the samples of trailing rollouts dropped):
    a rollout's samples together, in first-occurrence order."""
    by_rollout: dict[Any, list[int]] = {}
    for pos, rid in enumerate(shape.rollout_indices):
        by_rollout.setdefault(rid, []).append(pos)
    rids = list(by_rollout)
    if shape.token_budget is not None:
        steps = token_steps(rids, by_rollout, shape.lengths, shape.token_budget, shape.dp)
        if not steps:
            raise FrameworkAssertionError(
                f"num_rollouts ({len(rids)}) cannot form a token-based global batch with dp_size "
                f"{shape.dp} and global_batch_tokens {shape.token_budget}")
    else:
        gbs = shape.global_batch_size
        num_steps = len(rids) // gbs
        if num_steps < 1:
            raise FrameworkAssertionError(f"num_rollouts ({len(rids)}) < global_batch_size ({gbs}); "
                                          "need at least one rollout per step.")
        steps = [rids[s * gbs:(s + 1) * gbs] for s in range(num_steps)]
    kept = {rid for step in steps for rid in step}
    dropped = [pos for rid in rids if rid not in kept for pos in by_rollout[rid]]
    return steps, by_rollout, dropped


def _skip_import(settings: SeamSettings, routed_experts, step_len: list[int], shape: _Shape) -> str | None:
    """Why this step's route import is skipped (predicted, from the last import's rate, to cost
    more than the step's whole budget: the set one, or the default one, so planning could not pay
    for it), else None. The step is then planned on lengths. Never with ``max_sweeps`` set."""
    rate = _IMPORT_RATE.get("s_per_token")
    if routed_experts is None or rate is None or settings.max_sweeps is not None or settings.time_limit is None:
        return None  # max_sweeps: a fixed search effort asked for, the routes always used
    predicted = rate * sum(step_len)
    if not settings.time_limit_is_default:  # a set budget: skip an import predicted to overrun it
        return import_skip(predicted, settings.time_limit, "the step's budget")
    try:
        theirs = slime_layout(step_len, dynamic=shape.dynamic, cap=shape.cap, mbs=shape.mbs, dp=shape.dp,
                              group=shape.group)
    except InputError:
        return None
    if theirs is None:
        return None
    lw, _ = clip_to_cap(length_only_window(step_len), shape.cap)
    topo = Topology(dp=shape.dp, ep=1, capacity=shape.cap, row_multiple=shape.group)
    return import_skip(predicted, settings.step_time_limit(score_cells(lw, topo, settings.cost, theirs,
                                                                       settings.objective)), "the step's budget")


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
    req = _Request(args, train_parallel_config, total_lengths, global_batch_size, rollout_indices, routed_experts,
                   num_experts, ep_size, moe_layer_freq, sample_is_multimodal, placement, settings,
                   int(redundant_experts), bool(on_critical_path))
    with settings.planner_threads():
        return _plan(req, on_record)


@dataclasses.dataclass
class _Step:
    """One step as it is planned: its samples, the window read for it, slime's layout and its
    score, the cells chosen and why (the seam's record is built from these)."""

    index: int
    idx: list[int]  # the step's samples (positions in the call)
    lengths: list[int]
    t0: float
    skip: str | None = None  # why the route import was skipped (the step planned on lengths)
    window: Any = None
    import_s: float = 0.0
    ep: int = 1
    redundant: int = 0
    mm: list[bool] | None = None
    weight_n: Any = None
    theirs: list | None = None  # slime's own layout, cells[r][d]
    theirs_us: float | None = None
    theirs_s: float = 0.0
    plan_window: Any = None
    clipped: Any = ()
    topo: Topology | None = None
    topo_theirs: Topology | None = None  # slime's: no replicas
    cells: list | None = None
    pc: Any = None
    fallback: str | None = None
    quick: str | None = None
    budget: float | None = None
    search_limit: float | None = None  # the search's time limit and start (None: no search)
    search_t0: float = 0.0


def _plan(req: _Request, on_record) -> SlimeSchedule:
    from routepack_opt.warmup import warm

    warm()  # numba's kernels compiled or loaded once per process, before any step's clock starts
    if req.routed_experts is not None and req.num_experts is not None and len(req.routed_experts):
        # the import's pass for these routes' dtype, off the clock (and off the measured import rate)
        warm_import([req.routed_experts[0]], format="slime", num_experts=req.num_experts,
                    lengths=[int(req.total_lengths[0])], moe_layer_freq=req.moe_layer_freq)
    t_call = time.perf_counter()
    shape = _read_shape(req)
    steps, by_rollout, dropped = _steps(shape)
    out = SlimeSchedule([[] for _ in range(shape.dp)], [[] for _ in range(shape.dp)], [], [], [], [], dropped)
    for s, step_rids in enumerate(steps):
        st = _Step(s, [pos for rid in step_rids for pos in by_rollout[rid]], [], time.perf_counter())
        if len(st.idx) < shape.dp:
            raise FrameworkAssertionError(f"step {s}: {len(st.idx)} samples < dp_size {shape.dp}; each step "
                                          "needs at least one sample per rank.")
        st.lengths = [shape.lengths[i] for i in st.idx]
        _read_step(req, shape, st)
        _score_theirs(req, shape, st)
        _choose_cells(req, shape, st)
        out.records.append(_RECORDS.add(_add_step(out, req, shape, st, len(step_rids)), on_record))
    _LAST_CALL[:] = out.records
    logger.debug("routepack slime: %d steps planned in %.3f s", len(steps), time.perf_counter() - t_call)
    return out


def _read_step(req: _Request, shape: _Shape, st: _Step) -> None:
    """The step's window: its routes imported (the import's rate kept for the next step's
    check), or its lengths alone where there are none or the import is skipped."""
    st.skip = _skip_import(req.settings, req.routed_experts, st.lengths, shape)
    st.ep, st.redundant = (shape.ep, req.redundant) if st.skip is None else (1, 0)
    st.quick = st.skip
    if req.routed_experts is not None and st.skip is None:
        t_imp = time.perf_counter()
        st.window = import_replay([req.routed_experts[i] for i in st.idx], format="slime",
                                  num_experts=shape.num_experts, lengths=st.lengths,
                                  moe_layer_freq=req.moe_layer_freq).window
        _IMPORT_RATE["s_per_token"] = (time.perf_counter() - t_imp) / max(1, sum(st.lengths))
    else:
        st.window = length_only_window(st.lengths)
    st.import_s = time.perf_counter() - st.t0
    mm = req.sample_is_multimodal
    st.mm = None if mm is None else [bool(mm[i]) for i in st.idx]
    st.weight_n = _sample_cost(st.window, req.settings.cost) if getattr(req.args, "balance_data", False) else None


def _score_theirs(req: _Request, shape: _Shape, st: _Step) -> None:
    """slime's own layout of the step (raises slime's assertion on a static count that does not
    divide) and its score by the evaluator, timed (``theirs_s``, left out of our planning time)."""
    t_ref = time.perf_counter()
    st.theirs = slime_layout(st.lengths, dynamic=shape.dynamic, cap=shape.cap, mbs=shape.mbs, dp=shape.dp,
                             group=shape.group, weight_n=st.weight_n, mm=st.mm, mm_mode=shape.mm_mode)
    st.theirs_s = time.perf_counter() - t_ref
    st.plan_window, st.clipped = clip_to_cap(st.window, shape.cap)
    st.topo = Topology(dp=shape.dp, ep=st.ep, capacity=shape.cap, row_multiple=shape.group,
                       redundant_experts=st.redundant)
    st.topo_theirs = Topology(dp=shape.dp, ep=st.ep, capacity=shape.cap, row_multiple=shape.group)
    if st.redundant:
        st.topo.check_experts(st.window.num_experts)
    t_ref = time.perf_counter()
    st.theirs_us = None if st.theirs is None else score_cells(st.plan_window, st.topo_theirs, req.settings.cost,
                                                              st.theirs, req.settings.objective)
    st.theirs_s += time.perf_counter() - t_ref


def _choose_cells(req: _Request, shape: _Shape, st: _Step) -> None:
    """Ours, or slime's own layout where ours does not apply (multimodal samples packed apart,
    one sample per micro-batch on one rank), the budget is spent, or the search fails."""
    if shape.dynamic and st.mm is not None and shape.mm_mode in MULTIMODAL_SEPARATE and any(st.mm):
        st.fallback = (f"multimodal_aware_packing={shape.mm_mode!r} with multimodal samples: slime's own "
                       "layout (RoutePack does not model the padded multimodal cost)")
        warn_once("slime", "multimodal", st.fallback)
        if st.theirs is None:
            raise FrameworkAssertionError(f"dynamic path: could not split step {st.index}'s {len(st.idx)} samples "
                                          f"into a multiple of {shape.dp * shape.group} micro-batches")
        st.cells = st.theirs
    elif not shape.dynamic and shape.mbs == 1 and shape.dp == 1:
        st.cells = st.theirs  # one sample per micro-batch on one rank: nothing to decide
    else:
        left = _spend_budget(req.settings, st)
        if st.quick is not None and st.quick.startswith("budget"):
            st.cells = st.theirs
        else:
            _search(req, shape, st, None if left is None else max(left, 1e-3))


def _spend_budget(settings: SeamSettings, st: _Step) -> float | None:
    """One budget per step, from the step's start (import, slime's layout and its score, the
    search): with the default limit at most SHARE_OF_GAIN of what the step can gain over slime's
    layout (to the placement-free lower bound at slime's count). Returns what is left for the
    search, less what the last step spent past its search's limit (``_RESERVE``: the search's
    overrun and the apply after it); under _MIN_SEARCH_S slime's own layout stands (``quick``)."""
    gain_us = None
    if settings.time_limit_is_default and st.theirs is not None and st.theirs_us is not None:
        lb = Evaluator(st.plan_window, st.topo_theirs, settings.cost).placement_free_lower_bound(len(st.theirs))
        gain_us = max(0.0, st.theirs_us - lb)
    budget = CallBudget(settings, st.t0, settings.call_budget(st.theirs_us, gain_us))
    st.budget = budget.total_s
    left = budget.left(_RESERVE.get("s", 0.0))
    short = budget.short(left, _MIN_SEARCH_S)
    if short is not None and st.theirs is not None:
        st.quick = f"{short} of {st.budget:.3f} s for the step (import {st.import_s * 1e3:.0f} ms); slime's own layout"
    return left


def _search(req: _Request, shape: _Shape, st: _Step, time_limit: float | None) -> None:
    """RoutePack's plan of the step: certified rows and the joint search on the dynamic path; on
    the static one, swaps from slime's layout (and a KK-balanced one) that keep every count."""
    settings = req.settings
    st.search_limit, st.search_t0 = time_limit, time.perf_counter()
    opts = dict(objective=settings.objective, placement=req.placement, time_limit=time_limit,
                max_sweeps=settings.max_sweeps, seed=settings.seed)
    try:
        if shape.dynamic:
            st.pc = plan_cells(st.plan_window, st.topo, settings.cost, **opts)
        else:
            seeds = [st.theirs]
            if st.weight_n is None:
                seeds.append(slime_layout(st.lengths, dynamic=False, cap=shape.cap, mbs=shape.mbs, dp=shape.dp,
                                          group=shape.group, weight_n=_sample_cost(st.window, settings.cost)))
            st.pc = plan_fixed_cells(st.plan_window, st.topo, settings.cost, seeds, **opts)
        st.cells = st.pc.cells
    except InfeasibleError as exc:
        raise FrameworkAssertionError(f"dynamic path: step {st.index} has {len(st.idx)} samples, too few for "
                                      f"a multiple of {shape.dp * shape.group} micro-batches ({exc})") from None
    except Exception as exc:  # never break slime: its own layout for this step
        if st.theirs is None:
            raise
        st.fallback = f"planning failed ({exc.__class__.__name__}: {exc}); slime's own layout"
        warn_once("slime", failure_cause(exc), st.fallback)
        st.cells, st.pc = st.theirs, None


def _add_step(out: SlimeSchedule, req: _Request, shape: _Shape, st: _Step, num_rollouts: int) -> SeamRecord:
    """The step's cells into slime's four lists (rank d's samples, micro-batch by micro-batch),
    its expert map, placement and report; returns its record."""
    t_apply = time.perf_counter()
    cells, pc = st.cells, st.pc
    rows = len(cells)
    for d in range(shape.dp):
        for r in range(rows):
            cell = cells[r][d]
            start = len(out.partitions[d])
            out.partitions[d].extend(st.idx[i] for i in cell)
            out.micro_batch_indices[d].append(list(range(start, start + len(cell))))
    out.num_microbatches.append(rows)
    out.global_batch_sizes.append(num_rollouts)
    out.logical_to_physical.append(pc.logical_to_physical.copy() if (pc is not None and req.routed_experts is not None
                                                                     and st.skip is None) else None)
    out.placements.append(pc.plan.replicas if (pc is not None and st.redundant) else None)
    rep = dict(pc.report) if pc is not None else {"fallback": st.fallback or "slime's layout"}
    rep["oversize_samples"] = [st.idx[i] for i in st.clipped]
    out.reports.append(rep)
    ours_us = (float(pc.plan.score["makespan"]) if pc is not None
               else score_cells(st.plan_window, st.topo_theirs, req.settings.cost, cells, req.settings.objective))
    now = time.perf_counter()
    over_s = 0.0 if st.search_limit is None else max(0.0, t_apply - st.search_t0 - st.search_limit)
    _RESERVE["s"] = min(_MAX_RESERVE_S, over_s + (now - t_apply))
    # slime's own layout is timed inside the step (theirs_s) and left out of ours
    return SeamRecord("slime", rows, None if st.theirs is None else len(st.theirs), ours_us, st.theirs_us,
                      now - st.t0 - st.theirs_s, st.theirs_s, samples=len(st.idx), fallback=st.fallback,
                      step=st.index, on_critical_path=req.on_critical_path, import_s=st.import_s,
                      plan_s=t_apply - st.t0 - st.import_s - st.theirs_s, apply_s=now - t_apply,
                      budget_s=st.budget, quick=st.quick, redundant_experts=st.redundant)


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


_INSTALL_KEYS = ("ep_size", "moe_layer_freq", "placement", "num_experts", "on_record", "redundant_experts",
                 "on_critical_path")


def install(module, **options):
    """Point ``module.build_dp_schedule`` (``slime.ray.rollout``, in the process that runs
    ``RolloutManager``) at ours with ``options``; returns the function it replaced, to restore it.
    The settings (keywords, else ``ROUTEPACK_*``) are checked here, naming the keyword or the
    variable; a module without ``build_dp_schedule`` is an :class:`InputError`. Logs one INFO line."""
    name = getattr(module, "__name__", repr(module))
    if not hasattr(module, "build_dp_schedule"):
        raise InputError(f"install: {name} has no build_dp_schedule to replace (pass slime.ray.rollout, "
                         "the module that calls it, or slime.utils.dp_schedule)")
    check_known_options(options, SETTING_KEYS + _INSTALL_KEYS, "install")
    settings = seam_settings("slime", **{k: options.pop(k) for k in SETTING_KEYS if k in options})
    old = module.build_dp_schedule
    fn = functools.partial(build_dp_schedule, settings=settings, **options)
    fn.__routepack__ = True  # type: ignore[attr-defined]
    module.build_dp_schedule = fn
    logger.info("routepack slime: %s.build_dp_schedule replaced (objective %s, time limit %s per step)",
                name, settings.objective,
                "none" if settings.time_limit is None else f"{settings.time_limit:g} s")
    return old

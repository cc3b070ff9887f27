"""verl's driver side: the whole global batch planned once per step on the driver
(``RayPPOTrainer._balance_batch``), equal sample counts per rank, the plan carried to the ranks in
the plan columns (:func:`~routepack_opt.integrations.verl.rearrange_micro_batches` looks them up).
Re-exported by :mod:`routepack_opt.integrations.verl`, whose docstring describes the seam."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import numpy as np

from routepack_opt.core.errors import InputError
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.core.layout import Layout
from routepack_opt.core.placement import Placement
from routepack_opt.core.topology import Topology
from routepack_opt.heuristics.placement.lpt import lpt_placement
from routepack_opt.heuristics.placement.replicate import replicated_placement
from routepack_opt.integrations import _deps
from routepack_opt.integrations._common import as_cost, length_only_window, plan_cells
from routepack_opt.integrations._seam import (
    CallBudget,
    SeamSettings,
    import_skip,
)
from routepack_opt.integrations._verl_common import (
    _ONE_EXPERT,
    _bubble_order,
    _redundant,
    plan_columns,
)
from routepack_opt.integrations.rollout_hook import COUNTS_KEY
from routepack_opt.replay import import_replay
from routepack_opt.replay.sample_counts import window_from_counts

logger = logging.getLogger("routepack_opt.integrations")

__all__ = ["balance_batch_partitions", "balance_batch", "GlobalBalance", "plan_step", "StepPlan", "BalanceOptions",
           "StepBudget"]


@dataclasses.dataclass(frozen=True)
class GlobalBalance:
    """A global-batch plan with N / dp_size samples per rank. ``partitions[d]``: rank d's sample
    indices, micro-batch by micro-batch (what ``_balance_batch`` concatenates); ``micro_batches[d][r]``:
    rank d's r-th micro-batch (global indices); ``plan``: the RoutePack plan (slot d = rank d).
    ``replicas``: with ``redundant_experts > 0``, the plan's replicated
    :class:`~routepack_opt.core.placement.Placement` (None without replicas). ``row_order``: the
    order the ranks run the rows in, verl's pipeline-bubble order (``use_dynamic_bsz_balance``) on
    each row's cost over the whole group (the evaluator's ``J[r, g]``, max over shards), the same
    on every rank, so row r of every rank still runs together; :meth:`run_order` lists them so."""

    partitions: list
    micro_batches: list
    plan: Any
    row_order: tuple = ()

    def run_order(self) -> list:
        """``[d][j]``: rank d's micro-batches in :attr:`row_order` (what the plan columns number)."""
        order = self.row_order or tuple(range(self.num_micro_batches))
        return [[mbs[r] for r in order] for mbs in self.micro_batches]

    @property
    def num_micro_batches(self) -> int:
        return int(self.plan.rows)

    @property
    def replicas(self) -> Placement | None:
        return self.plan.replicas


def _global_window(lens_N, batch, num_experts, moe_layer_freq, counts_NLE=None):
    if num_experts is not None and counts_NLE is not None:  # the rollout hook's counts: no routes to read
        w = window_from_counts(counts_NLE, lens_N)
        if w.num_experts != int(num_experts):
            raise InputError(f"{COUNTS_KEY}: counts of {w.num_experts} experts, num_experts={num_experts}")
        return w
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
                             seed: int = 0, redundant_experts: int = 0) -> GlobalBalance:
    """Plan the whole global batch (a TensorDict with ``attention_mask`` and optionally
    ``routed_experts`` [B, S, layers, top_k]) over ``dp_size`` ranks with equal sample counts,
    every micro-batch ≤ ``max_token_len`` tokens. Raises :class:`InputError` when B % dp_size != 0
    (as verl asserts) or a sample is longer than the cap. ``redundant_experts=N > 0`` (with
    ``routed_experts`` and ``num_experts``): plan with N extra expert slots per MoE layer, hot
    experts replicated; :attr:`GlobalBalance.replicas` is then the plan's ``Placement``."""
    red = _redundant(redundant_experts)
    mask = batch["attention_mask"]
    lens_N = mask.reshape(mask.shape[0], -1).sum(-1).cpu().numpy().astype(np.int64)
    if (lens_N < 1).any():
        raise InputError("a sample has no tokens (attention_mask all zero)")
    D = int(dp_size)
    use_routes = num_experts is not None and "routed_experts" in batch.keys()
    if red and not use_routes:
        raise InputError("redundant_experts needs routed_experts and num_experts: replicas follow the experts' loads")
    topo = Topology(dp=D, ep=int(ep_size) if use_routes else 1, capacity=int(max_token_len),
                    min_rows=int(min_num_micro_batch or 1), row_multiple=int(num_batches_divided_by or 1),
                    equal_samples_per_slot=True, redundant_experts=red)
    topo.check_samples(lens_N.size)
    window = _global_window(lens_N, batch, num_experts, moe_layer_freq)
    pc = plan_cells(window, topo, cost, objective=objective, time_limit=time_limit,
                    max_sweeps=max_sweeps, seed=seed)
    mbs = [[list(pc.cells[r][d]) for r in range(pc.rows)] for d in range(D)]
    parts = [[i for mb in mbs[d] for i in mb] for d in range(D)]
    p = pc.plan
    J_RG = Evaluator(window, p.topology, as_cost(cost)).costs(p.placement, p.row, p.slot, p.rows)
    order = _bubble_order(J_RG.max(axis=1), [min(min(c) for c in pc.cells[r]) for r in range(pc.rows)])
    return GlobalBalance(parts, mbs, p, tuple(order))


def balance_batch(batch, dp_size: int, metrics: dict | None = None, *, max_token_len: int,
                  logging_prefix: str = "global_seqlen", **options) -> GlobalBalance:
    """verl's ``_balance_batch`` on a ``DataProto``: plan (:func:`balance_batch_partitions`,
    ``options`` passed on), write the plan's columns (:func:`plan_columns`, which the ranks'
    :func:`rearrange_micro_batches` looks up), reorder the batch in place so that the dispatch's
    equal chunks are the planned ranks, and add verl's balance metrics to ``metrics``."""
    torch = _deps.torch()
    log_seqlen_unbalance = _deps.verl_log_seqlen_unbalance()

    gb = balance_batch_partitions(batch.batch, dp_size, max_token_len=max_token_len, **options)
    n = int(batch.batch["attention_mask"].shape[0])
    for key, col in plan_columns([gb.run_order()], n, max_token_len).items():
        batch.batch[key] = torch.from_numpy(col)
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


def _planned_mini_batch(config, N: int, keep_minibatch: bool, explicit: int | None) -> int:
    """Samples per planned mini-batch: ``explicit`` when given; with ``keep_minibatch`` verl's
    own (``actor.ppo_mini_batch_size``, as its branch reads it); else the one the actor's update
    iterates (``ppo_mini_batch_size × rollout.n``, verl 0.9.1's ``_update_actor``), or the whole
    batch when the config has none or it does not divide the batch."""
    if explicit is not None:
        size = int(explicit)
    else:
        arr = config.actor_rollout_ref
        mini = arr.actor.get("ppo_mini_batch_size")
        if mini is None:
            return N
        n = 1 if keep_minibatch else int((arr.get("rollout") or {}).get("n", 1) or 1)
        size = int(mini) * n
        if not keep_minibatch and (size < 1 or N % size):
            return N
    if size < 1 or N % size:
        raise InputError(f"batch of {N} is not a multiple of the mini-batch of {size} samples")
    return size


_MIN_SEARCH_S = 0.02  # a mini-batch's share of the budget below this takes the quick path


@dataclasses.dataclass
class StepPlan:
    """One step's driver plan (:func:`plan_step`): ``plans[k][d]``, rank d's micro-batches of
    mini-batch k in run order (global sample indices); predicted times (µs, the evaluator) of
    ours and of verl's own path, summed over the mini-batches; the micro-batches one rank runs
    over the step, ours (``rows``) and verl's (``rows_theirs``: verl 0.9.1's token-balanced DP
    split and its per-rank count, agreed MAX over the ranks); ``placements[k]``: mini-batch k's
    replicated :class:`~routepack_opt.core.placement.Placement` (None without replicas);
    ``quick``: why some mini-batch took the quick path (None: all searched); the wall-time split."""

    plans: list
    ours_us: float
    theirs_us: float
    rows: int
    rows_theirs: int
    placements: list
    quick: str | None
    import_s: float
    plan_s: float
    budget_s: float | None
    gain_us: float | None = None  # predicted gain with routes (verl's layout − our lower bound)
    import_rate_s: float | None = None  # the route import's seconds per routed_experts entry


def _run_order(ev: Evaluator, placement, lay: Layout, D: int, offset: int) -> list:
    """``[d][j]``: rank d's micro-batches (global indices) in verl's pipeline-bubble order of the
    rows' group-wide cost (:attr:`GlobalBalance.row_order`)."""
    J_RG = ev.costs(placement, lay.row, lay.slot, lay.rows)
    cell = lay.row * D + lay.slot
    order_N = np.argsort(cell, kind="stable")
    bounds = np.searchsorted(cell[order_N], np.arange(lay.rows * D + 1))
    cells = [[(offset + order_N[bounds[r * D + d]:bounds[r * D + d + 1]]).tolist() for d in range(D)]
             for r in range(lay.rows)]
    order = _bubble_order(J_RG.max(axis=1), [min(min(c) for c in cells[r]) for r in range(lay.rows)])
    return [[cells[r][d] for r in order] for d in range(D)]


def _quick_layout(len_N: np.ndarray, topo: Topology) -> Layout | None:
    """RoutePack's cap-keeping greedy at equal sample counts: count-limited first-fit decreasing
    at the fewest rows it fills (numpy, no search)."""
    from routepack_opt.heuristics.equal_counts import count_fit_decreasing

    D, C, m = topo.dp, topo.capacity, topo.row_multiple
    R = max(topo.min_rows, -(-int(len_N.sum()) // (D * C)))
    R = -(-R // m) * m
    while R * D <= len_N.size:
        got = count_fit_decreasing(len_N, R, D, C)
        if got is not None:
            return Layout(got[0], got[1], R)
        R += m
    return None


@dataclasses.dataclass(frozen=True)
class BalanceOptions:
    """The rules of the driver's plan: the workers' token cap (``max_token_len``) and row rules
    (``num_batches_divided_by``, ``min_num_micro_batch``), and the experts: with
    ``num_experts``, the joint cost from the batch's ``routed_experts`` (or the rollout hook's
    counts) over ``ep_size`` EP ranks, ``redundant_experts`` extra slots per MoE layer."""

    max_token_len: int
    num_experts: int | None = None
    ep_size: int = 1
    moe_layer_freq: Any = None
    num_batches_divided_by: int | None = None
    min_num_micro_batch: int | None = None
    redundant_experts: int = 0


@dataclasses.dataclass(frozen=True)
class StepBudget:
    """What a step's budget knows before the plan: its start (``t0`` on ``time.perf_counter``'s
    clock; None: when :func:`plan_step` is called), the seconds kept for applying the plan
    (``apply_reserve_s``), and the route import's rate measured on an earlier step
    (``import_rate_s``, seconds per ``routed_experts`` entry) with its ceiling
    (``skip_import_over_us``): an import predicted over it is skipped."""

    t0: float | None = None
    apply_reserve_s: float = 0.0
    import_rate_s: float | None = None
    skip_import_over_us: float | None = None


def plan_step(batch_td, lens_N: np.ndarray, dp_size: int, mini_batch_size: int, *, options: BalanceOptions,
              settings: SeamSettings, budget: StepBudget = StepBudget(), counts_NLE=None) -> StepPlan:
    """The driver's plan of one step under one budget (``settings``; the clock starts at
    ``budget.t0``): the route import (once, for the whole batch), then per mini-batch verl's own
    layout and RoutePack's quick one (both scored by the evaluator), then the search with the rest
    of the budget split evenly over the mini-batches left (less ``budget.apply_reserve_s`` for the
    reorder).

    The default budget (``time_limit_is_default``) is ``min(DEFAULT_TIME_LIMIT["verl_balance"],
    SHARE_OF_GAIN × predicted gain)``, the gain being verl's layout − the lower bound of ours
    summed over the mini-batches. A mini-batch takes the quick path (the better of RoutePack's
    count-limited greedy and verl's own layout, both keeping the cap, with RoutePack's expert
    placement) when its share of the budget is under 20 ms, or, with the default budget, when its
    headroom (quick − lower bound) cannot cover its share; ``StepPlan.quick`` says why (never with
    ``max_sweeps`` set: a fixed search effort, for plans that are the same on every run). With
    ``budget.import_rate_s`` and ``budget.skip_import_over_us``, a route import predicted to cost
    more than that is skipped and the step planned on lengths (recorded in ``quick``).
    ``counts_NLE`` (the rollout hook's per-sample ``[L, E]`` counts,
    :func:`~routepack_opt.integrations.rollout_hook.counts_from_non_tensor`) replaces the route
    import: the window is built from them, no routes are read."""
    t0 = time.perf_counter() if budget.t0 is None else budget.t0
    N, D, cap = int(lens_N.size), int(dp_size), int(options.max_token_len)
    window, use_routes, from_routes, red, skip = _step_window(batch_td, lens_N, options, budget, counts_NLE)
    import_s = time.perf_counter() - t0
    t_plan = time.perf_counter()
    rule = dict(capacity=cap, min_rows=int(options.min_num_micro_batch or 1),
                row_multiple=int(options.num_batches_divided_by or 1), equal_samples_per_slot=True)
    ep = int(options.ep_size) if use_routes else 1
    topo = Topology(dp=D, ep=ep, redundant_experts=red, **rule)
    topo_theirs = Topology(dp=D, ep=ep, **rule)
    topo.check_samples(mini_batch_size)
    mini = [_quick_mini_batch(window, np.arange(k * mini_batch_size, (k + 1) * mini_batch_size), topo, topo_theirs,
                              settings, use_routes) for k in range(N // mini_batch_size)]
    gain_us = sum(max(0.0, m["theirs"] - m["lb"]) for m in mini)
    spend = CallBudget(settings, t0, settings.call_budget(gain_us=gain_us))
    plans, placements, why = _search_mini_batches(mini, topo, settings, spend, budget.apply_reserve_s, import_s)
    gain_us = sum(max(0.0, m["theirs"] - m["lb"]) for m in mini) if use_routes else None
    return StepPlan(plans, float(sum(m["ours"] for m in mini)), float(sum(m["theirs"] for m in mini)),
                    int(sum(m["rows"] for m in mini)), int(sum(m["rows_theirs"] for m in mini)), placements,
                    skip or why, import_s, time.perf_counter() - t_plan, spend.total_s, gain_us,
                    import_s / max(1, int(np.prod(batch_td["routed_experts"].shape))) if from_routes else None)


def _step_window(batch_td, lens_N, options: BalanceOptions, budget: StepBudget, counts_NLE):
    """The step's window: from the rollout hook's counts, the batch's routes, or its lengths
    alone (no experts, or a route import predicted over ``budget.skip_import_over_us``). Returns
    (window, experts used, routes imported, redundant experts, why the import was skipped)."""
    red = _redundant(options.redundant_experts)
    num_experts = options.num_experts
    has_counts = num_experts is not None and counts_NLE is not None
    use_routes = has_counts or (num_experts is not None and "routed_experts" in batch_td.keys())
    if red and not use_routes:
        raise InputError("redundant_experts needs routed_experts and num_experts: replicas follow the experts' loads")
    skip = None
    if use_routes and not has_counts and budget.skip_import_over_us is not None and budget.import_rate_s is not None:
        numel = int(np.prod(batch_td["routed_experts"].shape))
        skip = import_skip(budget.import_rate_s * numel, budget.skip_import_over_us / 1e6,
                           "its share of the predicted gain")
        if skip is not None:
            use_routes, red = False, 0
    window = _global_window(lens_N, batch_td if use_routes else None, num_experts, options.moe_layer_freq,
                            counts_NLE if use_routes else None)
    return window, use_routes, use_routes and not has_counts, red, skip


def _quick_mini_batch(window, idx: np.ndarray, topo: Topology, topo_theirs: Topology, settings: SeamSettings,
                      use_routes: bool) -> dict:
    """Mini-batch ``idx``'s quick plan: the better of verl's own layout and RoutePack's
    count-limited greedy, under RoutePack's expert placement (replicated LPT, LPT, or one expert
    without routes), scored by the evaluator with its lower bound; and verl's own time (its layout
    under the identity placement, without replicas)."""
    from routepack_opt.heuristics.frameworks import verl_layout

    sub = window.subset(idx)
    load_LE = sub.expert_loads()
    red, ep = topo.redundant_experts, topo.ep
    if red:
        placement = replicated_placement(load_LE, ep, sub.num_experts + red)
    elif use_routes:
        placement = lpt_placement(load_LE, ep)
    else:
        placement = _ONE_EXPERT
    ev = Evaluator(sub, topo, settings.cost)
    ev_theirs = Evaluator(sub, topo_theirs, settings.cost) if red else ev
    vrow, vslot, vrows = verl_layout(sub.lengths, topo_theirs)
    cands = [Layout(vrow, vslot, vrows)]
    q = _quick_layout(sub.lengths, topo)
    if q is not None:
        cands.append(q)
    scored = [(ev.evaluate_layout(placement, lay, settings.objective), lay) for lay in cands]
    if use_routes:  # verl leaves the experts where they are: its layout under the identity
        identity = np.tile(np.arange(sub.num_experts, dtype=np.int64), (sub.num_layers, 1))
        theirs = ev_theirs.score(identity, vrow, vslot, vrows, settings.objective).makespan
    else:  # one expert: the identity is the placement scored above
        theirs = scored[0][0].score.makespan
    e, lay = min(scored, key=lambda t: t[0].score.key)
    return dict(sub=sub, idx=idx, ev=ev, placement=placement, layout=lay, ours=e.score.makespan,
                lb=e.lower_bound, theirs=theirs, rows_theirs=vrows)


def _quick_reason(settings: SeamSettings, spend: CallBudget, left: float | None, headroom_s: float,
                  import_s: float) -> str | None:
    """Why a mini-batch keeps its quick plan: its share of the budget is under _MIN_SEARCH_S, or
    (default budget) the search could save less than that share; None: search."""
    short = spend.short(left, _MIN_SEARCH_S)
    if short is not None:
        return f"{short} for this mini-batch (of {spend.total_s:.3f} s per step, import {import_s * 1e3:.0f} ms)"
    if settings.time_limit_is_default and left is not None and headroom_s < left and settings.max_sweeps is None:
        return (f"predicted saving: the search could save at most {headroom_s * 1e3:.1f} ms over the quick "
                f"path, under its {left * 1e3:.0f} ms")
    return None


def _search_mini_batches(mini: list[dict], topo: Topology, settings: SeamSettings, spend: CallBudget,
                         reserve_s: float, import_s: float) -> tuple[list, list, str | None]:
    """Each mini-batch's search with its share of what is left (its quick plan stands where the
    search cannot pay or fails). Returns (run orders ``plans[k][d]``, replicated placements, why
    the first mini-batch that kept its quick plan did)."""
    D, K = topo.dp, len(mini)
    quick: str | None = None
    plans, placements = [], []
    for k, m in enumerate(mini):
        left = spend.left(reserve_s, K - k)
        why = _quick_reason(settings, spend, left, max(0.0, m["ours"] - m["lb"]) / 1e6, import_s)
        ev, placement, lay = m["ev"], m["placement"], m["layout"]
        if why is None:
            try:
                pc = plan_cells(m["sub"], topo, settings.cost, objective=settings.objective,
                                time_limit=max(left, 1e-3) if left is not None else None,
                                max_sweeps=settings.max_sweeps, seed=settings.seed)
                if pc.plan.score["makespan"] <= m["ours"]:
                    p = pc.plan
                    placement = p.placement
                    lay = Layout(p.row, p.slot, p.rows)
                    m["ours"] = float(p.score["makespan"])
            except Exception as exc:  # the quick path's layout stands
                why = f"search failed ({exc.__class__.__name__}: {exc})"
        if why is not None:
            quick = quick or why
        plans.append(_run_order(ev, placement, lay, D, int(m["idx"][0])))
        placements.append(placement if topo.redundant_experts else None)
        m["rows"] = int(lay.rows)
    return plans, placements, quick

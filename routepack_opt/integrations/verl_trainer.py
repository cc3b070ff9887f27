"""verl's trainer hook: :func:`install_balance_batch` replaces ``RayPPOTrainer._balance_batch`` by
the driver's plan of each step (:func:`~routepack_opt.integrations.verl_balance.plan_step`),
applied to the batch (plan columns, placements, one reorder, verl's balance metrics) and
recorded; with ``overlap`` the plan runs behind the step's log-prob passes. Re-exported by
:mod:`routepack_opt.integrations.verl`."""

from __future__ import annotations

import logging
import time

import numpy as np

from routepack_opt.core.errors import InputError
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.core.layout import Layout
from routepack_opt.core.topology import Topology
from routepack_opt.integrations import _deps
from routepack_opt.integrations._common import as_cost, length_only_window
from routepack_opt.integrations._seam import (
    DEFAULT_COST,
    SHARE_OF_GAIN,
    SeamRecord,
    SeamSettings,
    seam_settings,
    warn_once,
)
from routepack_opt.integrations._verl_common import (
    _ONE_EXPERT,
    _RECORDS,
    ORIGINAL_BALANCE,
    PLACEMENTS_KEY,
    _redundant,
    plan_columns,
)
from routepack_opt.integrations.rollout_hook import counts_from_non_tensor
from routepack_opt.integrations.verl_balance import (
    _MIN_SEARCH_S,
    _QUICK_RATE_S,
    BalanceOptions,
    StepBudget,
    StepPlan,
    VerlStepConfig,
    _planned_mini_batch,
    _quick_layout,
    _run_order,
    plan_step,
)
from routepack_opt.replay import import_replay, warm_import

logger = logging.getLogger("routepack_opt.integrations")

__all__ = ["install_balance_batch"]


def install_balance_batch(trainer_cls, *, max_token_len: int, num_experts: int | None = None,
                          ep_size: int = 1, moe_layer_freq=None, mini_batch_size: int | None = None,
                          num_batches_divided_by: int | None = None, min_num_micro_batch: int | None = None,
                          redundant_experts: int = 0, overlap: bool | str = False, **settings_options):
    """Replace ``trainer_cls._balance_batch`` (verl's ``RayPPOTrainer``) by a driver-side plan of
    the whole global batch (equal sample counts per rank, every micro-batch ≤ ``max_token_len``,
    joint cost with ``routed_experts`` when ``num_experts`` is given); returns the method it
    replaced. Settings (``cost``, ``objective``, ``time_limit``, ``max_sweeps``, ``seed``,
    ``threads``) are checked here (keyword > ``ROUTEPACK_*`` > default).

    One budget per step: ``time_limit`` bounds the whole call (lengths, route import, every
    mini-batch's plan, reorder, plan columns, record; :func:`plan_step`). The default budget is
    sized from the step's predicted gain, at most ``DEFAULT_TIME_LIMIT["verl_balance"]``; when a
    mini-batch's predicted saving cannot cover its share, it takes the quick path, and the record
    says so (``routepack/balance/quick``).

    The plan is made per mini-batch, the unit each rank packs: rank d's chunk is its share of
    mini-batch 0, then of mini-batch 1, ..., so the actor's iterator (consecutive
    ``ppo_mini_batch_size × rollout.n / dp_size`` samples per rank, ``actor.shuffle`` off) cuts
    exactly the planned shares. On verl's default path the mini-batches are verl's own (its DP
    split re-forms them over the whole batch); with ``keep_minibatch=True`` the rollout-order
    ones; ``mini_batch_size`` (samples of the global batch) plans rollout-order blocks of that
    size. verl's own layout of the step (:func:`~routepack_opt.integrations.verl_balance.verl_step_layout`,
    its own code run) is scored with ours, and ours is applied only where the evaluator scores
    the whole step (update + forward-only passes) better; the record says which (``applied``).
    The plan reaches the ranks as the int64 columns :data:`PLAN_COLUMNS` (:func:`plan_columns`),
    which :func:`rearrange_micro_batches` looks up instead of planning when they are whole; give
    ``max_token_len`` = the workers' cap (``ppo_max_token_len_per_gpu × sp_size``) and the
    workers' ``num_batches_divided_by`` / ``min_num_micro_batch`` for that.

    ``redundant_experts=N`` (with ``num_experts``): every mini-batch is planned with N extra
    expert slots per MoE layer; its replicated ``Placement`` goes to the workers in the batch's
    ``meta_info[PLACEMENTS_KEY]`` (verl's dispatch gives every rank the batch's meta_info; read it
    with :func:`placements_from_batch`) and the record carries ``redundant_experts``.

    ``overlap=True`` (``"balanced"``) hides the plan behind the step's other work:
    ``_balance_batch`` applies RoutePack's quick length-only plan at once (so the log-prob passes
    still get balanced ranks) and starts the full plan in a background thread; the first
    ``_update_critic`` / ``_update_actor`` of the step waits for it and applies it (one more
    reorder). ``overlap="deferred"``: no reorder in ``_balance_batch`` (the log-prob passes see the
    rollout order, verl's DP token balance off for them), the plan's one reorder at the update. Between them verl
    computes the reward, the old / reference log-probs and the values, on the workers, while the
    driver waits on Ray. The record's ``added_ms`` is then only what the step waited for.

    verl's other branches are kept: with ``use_prefix_grouper`` (samples of one uid kept on one
    rank), and on any planning error, verl's own method runs (one warning per cause). The step's
    :class:`SeamRecord` goes into ``metrics`` as ``routepack/balance/...``, next to verl's
    ``global_seqlen`` balance metrics: ``rows`` is the micro-batches one rank runs over the step
    (summed over mini-batches), ``rows_theirs`` verl's own path's, ``import_ms`` / ``plan_ms`` /
    ``apply_ms`` the wall time's split, ``net_saving_ms`` the predicted saving less the whole
    time the call added over verl's own (``added_ms``: our wall time less the reorder, which verl's
    call makes as well; verl's partitioning counted as free, so the net is a lower bound)."""
    if not hasattr(trainer_cls, "_balance_batch"):
        raise InputError(f"install_balance_batch: {getattr(trainer_cls, '__name__', trainer_cls)!r} has no "
                         "_balance_batch to replace (pass verl.trainer.ppo.ray_trainer.RayPPOTrainer)")
    red = _redundant(redundant_experts)
    if red and num_experts is None:
        raise InputError("redundant_experts needs num_experts: replicas follow the experts' loads")
    if overlap not in (False, True, "balanced", "deferred"):
        raise InputError(f"overlap: expected False, True, 'balanced' or 'deferred', got {overlap!r}")
    options = BalanceOptions(max_token_len, num_experts, ep_size, moe_layer_freq, num_batches_divided_by,
                             min_num_micro_batch, red)
    hook = _BalanceHook(trainer_cls._balance_batch, seam_settings("verl_balance", **settings_options), options,
                        mini_batch_size, overlap)

    def _balance_batch(self, batch, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
        return hook.balance(self, batch, metrics, logging_prefix, keep_minibatch)

    _balance_batch.__routepack__ = True  # type: ignore[attr-defined]
    if not getattr(hook.original, "__routepack__", False):
        ORIGINAL_BALANCE[trainer_cls] = hook.original  # verl's own, run to score the step it would run
    trainer_cls._balance_batch = _balance_batch
    if overlap:
        for name in ("_update_critic", "_update_actor"):
            if hasattr(trainer_cls, name):
                setattr(trainer_cls, name, _apply_pending_before(getattr(trainer_cls, name), max_token_len, red))
    logger.info("routepack verl: %s._balance_batch replaced (objective %s, budget %s per step%s)",
                getattr(trainer_cls, "__name__", trainer_cls), hook.settings.objective,
                "none" if hook.settings.time_limit is None else f"{hook.settings.time_limit:g} s",
                ", planned behind the log-prob passes" if overlap else "")
    return hook.original


class _BalanceHook:
    """One :func:`install_balance_batch`: its settings and options, the trainer's own method, and
    what a step leaves the next (the apply time reserved in its budget, the route import's rate
    and the predicted gain, the step count)."""

    def __init__(self, original, settings: SeamSettings, options: BalanceOptions, mini_batch_size, overlap):
        self.original, self.settings, self.options = original, settings, options
        self.mini_batch_size, self.overlap = mini_batch_size, overlap
        self.mode = "balanced" if overlap is True else overlap
        self.state: dict = {"apply_s": 0.0, "rate": None, "gain": None, "step": 0, "quick_rate": None,
                             "quick_s": 0.0, "search_floor_s": 0.0, "floor_rate": None, "budget": None}

    def own(self, trainer, batch, metrics, logging_prefix, keep_minibatch):
        """verl's own ``_balance_batch``."""
        return self.original(trainer, batch, metrics, logging_prefix=logging_prefix, keep_minibatch=keep_minibatch)

    def balance(self, trainer, batch, metrics, logging_prefix, keep_minibatch):
        """The replaced ``_balance_batch``: plan the step, apply it, record it (verl's own on
        ``use_prefix_grouper`` and on any planning error)."""
        if getattr(trainer, "use_prefix_grouper", False) and "uid" in batch.non_tensor_batch:
            warn_once("verl", "prefix-grouper", "use_prefix_grouper keeps a uid's samples on one rank, which "
                      "RoutePack's balance does not model: verl's own _balance_batch runs")
            return self.own(trainer, batch, metrics, logging_prefix, keep_minibatch)
        t_warm = time.perf_counter()
        self._warm(batch)
        t0 = time.perf_counter()
        warmup_s = t0 - t_warm
        try:
            cfg = VerlStepConfig.from_trainer(trainer, keep_minibatch)
            if cfg.shuffle:
                warn_once("verl", "shuffle", "actor.shuffle reshuffles every rank's chunk into mini-batches, so the "
                          "driver cannot choose them: verl's own _balance_batch runs")
                return self.own(trainer, batch, metrics, logging_prefix, keep_minibatch)
            dp_size = trainer._get_dp_size(trainer.actor_rollout_wg, "actor")
            lens_N = _mask_lengths(batch)
            size = _planned_mini_batch(trainer.config, int(lens_N.size), keep_minibatch, self.mini_batch_size)
            short = None if self.overlap else self._floor_short(int(lens_N.size))
            if short is not None:  # nothing can pay for itself: verl's own call, at verl's own cost
                self.own(trainer, batch, metrics, logging_prefix, keep_minibatch)
                rec = SeamRecord("verl.balance_batch", 0, None, None, None, time.perf_counter() - t0,
                                 samples=int(lens_N.size), fallback=short, applied="verl", added_s=0.0,
                                 warmup_s=warmup_s, budget_s=self.state["budget"])
                metrics.update(_RECORDS.add(rec).metrics(prefix="routepack/balance"))
                return None
            if self.overlap:
                return self._start_overlap(trainer, batch, metrics, logging_prefix, lens_N, dp_size, size, t0)
            sp = self._plan(batch, lens_N, dp_size, size, t0, cfg, trainer)
        except Exception as exc:  # never break the trainer: verl's own balance
            warn_once("verl", "balance", f"balance_batch planning failed ({exc.__class__.__name__}: {exc}); "
                      "verl's own _balance_batch runs")
            return self.own(trainer, batch, metrics, logging_prefix, keep_minibatch)
        t_apply = time.perf_counter()
        reorder_s = _apply_step(batch, metrics, logging_prefix, sp, lens_N, dp_size, self.options.max_token_len)
        self.state["apply_s"] = time.perf_counter() - t_apply - reorder_s  # reserved in the next step's budget
        # added over verl's own call: all of ours but the reorder and verl's own partitioning
        # (run to get verl's layout, sp.theirs.driver_s), which verl's call makes as well
        driver_s = sp.theirs.driver_s if sp.theirs is not None else 0.0
        _record_step(metrics, sp, t0, t_apply, int(lens_N.size), self.options.redundant_experts, sp.quick,
                     added_s=time.perf_counter() - t0 - reorder_s - driver_s, warmup_s=warmup_s)
        if sp.theirs is not None:  # verl's global_seqlen balance had its own layout run
            m = int(lens_N.size) // dp_size
            tok = [int(lens_N[sp.theirs.perm[d * m:(d + 1) * m]].sum()) for d in range(dp_size)]
            metrics[f"routepack/balance/{logging_prefix}_balanced_min_theirs"] = float(min(tok))
            metrics[f"routepack/balance/{logging_prefix}_balanced_max_theirs"] = float(max(tok))

    def _warm(self, batch) -> None:
        """numba's kernels and the import's pass compiled or loaded, before the step's clock starts."""
        from routepack_opt.warmup import warm

        warm()
        num_experts = self.options.num_experts
        if num_experts is not None and "routed_experts" in batch.batch.keys():
            routes, mask = batch.batch["routed_experts"], batch.batch["attention_mask"]
            warm_import(routes, format="verl", num_experts=num_experts, attention_mask=mask,
                        moe_layer_freq=self.options.moe_layer_freq)
            if self.state["rate"] is None:  # the first step's import predicted too (off the clock)
                self.state["rate"] = self._import_rate(routes, mask)

    def _floor_short(self, N: int) -> str | None:
        """Why this step runs verl's own call without planning: the budget (a set one, or the
        default one the last step had) is under the call's floor measured on the last step
        (verl's rank side and the scorings, seconds per sample × N), so neither the quick path nor
        the search could run; every 8th step plans anyway, to re-measure. None: plan."""
        st, settings = self.state, self.settings
        if st["floor_rate"] is None or settings.max_sweeps is not None or not (st["step"] + 1) % 8:
            return None
        budget = settings.time_limit if not settings.time_limit_is_default else st["budget"]
        need = (st["floor_rate"] + (st["quick_rate"] or _QUICK_RATE_S)) * N
        if budget is None or budget >= need:
            return None
        st["step"] += 1
        return (f"budget: {budget * 1e3:.0f} ms, under the call's floor (about {need * 1e3:.0f} ms: verl's "
                "rank side, scoring, the quick path): verl's own _balance_batch runs")

    def _import_rate(self, routes, mask) -> float | None:
        """Seconds per ``routed_experts`` entry of the route import, timed at warm-up on the first
        32 samples (a two-point slope on smaller imports was off by several times on a loaded
        machine), None where that fails."""
        n = min(32, int(routes.shape[0]))
        t = time.perf_counter()
        try:
            import_replay(routes[:n], format="verl", num_experts=self.options.num_experts, attention_mask=mask[:n],
                          moe_layer_freq=self.options.moe_layer_freq)
        except Exception:  # noqa: BLE001 - the step's own import reports bad routes
            return None
        return (time.perf_counter() - t) / max(1, int(np.prod(routes[:n].shape)))

    def _skip_import_over_us(self) -> float | None:
        """The route import's ceiling this step (re-measured every 8th step; never with
        ``max_sweeps``): the default budget's share of the gain the last imported step predicted,
        or the whole of a set budget."""
        settings, state = self.settings, self.state
        state["step"] += 1
        if settings.max_sweeps is not None or not state["step"] % 8:
            return None
        if settings.time_limit_is_default and state["gain"] is not None:
            # the import must leave the quick path and one search floor per mini-batch room, or it
            # is paid for nothing (verl's layout would stand)
            return max(0.0, SHARE_OF_GAIN * state["gain"] - 1e6 * (state["quick_s"] + state["search_floor_s"]))
        if settings.time_limit_is_default and settings.time_limit is not None:  # no gain known yet: the cap
            return 1e6 * settings.time_limit
        if not settings.time_limit_is_default and settings.time_limit is not None:
            return 1e6 * settings.time_limit
        return None

    def _plan(self, batch, lens_N, dp_size: int, size: int, t0: float, config=None, trainer=None) -> StepPlan:
        state = self.state
        budget = StepBudget(t0, state["apply_s"], state["rate"], self._skip_import_over_us(), state["quick_rate"])
        with self.settings.planner_threads():
            sp = plan_step(batch.batch, lens_N, dp_size, size, options=self.options, settings=self.settings,
                           budget=budget, counts_NLE=_hook_counts(batch), config=config,
                           balance_fn=self.original, trainer=trainer)
        if sp.gain_us is not None:
            state["gain"] = sp.gain_us
        if sp.import_rate_s is not None:
            state["rate"] = sp.import_rate_s
        if sp.quick_rate_s is not None:
            state["quick_rate"] = sp.quick_rate_s
            state["quick_s"] = sp.quick_rate_s * int(lens_N.size)
        state["search_floor_s"] = _MIN_SEARCH_S * len(sp.plans)
        state["floor_rate"], state["budget"] = sp.floor_rate_s, sp.budget_s
        return sp

    def _start_overlap(self, trainer, batch, metrics, logging_prefix, lens_N, dp_size, size, t0):
        """The overlap modes: the quick order now (``"balanced"``) or none (``"deferred"``), the
        full plan in a background thread, applied before the step's first update."""
        import threading

        if self.mode == "balanced":
            quick = _quick_step(lens_N, dp_size, size, self.options, self.settings.cost)
            reorder_s = _apply_step(batch, metrics, logging_prefix, quick, lens_N, dp_size, self.options.max_token_len,
                                    columns=False)
            lens_now = lens_N[[j for part in _parts(quick.plans, dp_size) for j in part]]
        else:  # "deferred": the batch stays in its order until the update
            reorder_s, lens_now = 0.0, lens_N
        td = batch.batch  # the background plan is of this order
        counts = _hook_counts(batch)  # reordered with the batch
        box: dict = {}

        def work():
            try:
                with self.settings.planner_threads():
                    box["plan"] = plan_step(td, lens_now, dp_size, size, options=self.options, settings=self.settings,
                                            counts_NLE=counts)
            except Exception as exc:  # applied as verl's quick order at the update
                box["error"] = exc

        th = threading.Thread(target=work, name="routepack-balance", daemon=True)
        th.start()
        trainer._routepack_pending = dict(thread=th, box=box, lens=lens_now, metrics=metrics, prefix=logging_prefix,
                                          dp=dp_size, started=t0, start_s=time.perf_counter() - t0,
                                          reorder_s=reorder_s, mode=self.mode)


def _mask_lengths(batch) -> np.ndarray:
    """Tokens per sample of a ``DataProto`` (its ``attention_mask``); a sample without any is an error."""
    mask = batch.batch["attention_mask"]
    lens_N = mask.reshape(int(mask.shape[0]), -1).sum(-1).cpu().numpy().astype(np.int64)
    if (lens_N < 1).any():
        raise InputError("a sample has no tokens (attention_mask all zero)")
    return lens_N


def _hook_counts(batch):
    """The rollout hook's per-sample counts (``non_tensor_batch[COUNTS_KEY]``,
    :func:`~routepack_opt.integrations.rollout_hook.install_verl_agent_loop_counts`), or None."""
    ntb = getattr(batch, "non_tensor_batch", None)
    return None if ntb is None else counts_from_non_tensor(ntb)


def _parts(plans: list, dp_size: int) -> list:
    """Rank d's chunk: its share of mini-batch 0, then of mini-batch 1, ... (micro-batch by micro-batch)."""
    return [[i for plan in plans for mb in plan[d] for i in mb] for d in range(dp_size)]


def _apply_step(batch, metrics, logging_prefix, sp: StepPlan, lens_N, dp_size: int, max_token_len: int,
                columns: bool = True) -> float:
    """Write the plan's columns and the placements, reorder the batch once, verl's balance metrics.
    Returns the reorder's seconds (verl's own ``_balance_batch`` reorders the batch the same way)."""
    torch = _deps.torch()
    N = int(lens_N.size)
    parts = _parts(sp.plans, dp_size)
    perm = np.fromiter((j for part in parts for j in part), dtype=np.int64, count=N)
    if columns:
        for key, col in plan_columns(sp.plans, N, max_token_len).items():
            batch.batch[key] = torch.from_numpy(col)
        if any(p is not None for p in sp.placements):
            batch.meta_info[PLACEMENTS_KEY] = list(sp.placements)
    t = time.perf_counter()
    batch.reorder(torch.from_numpy(perm))
    reorder_s = time.perf_counter() - t
    metrics.update(_deps.verl_log_seqlen_unbalance()(seqlen_list=lens_N.tolist(), partitions=parts,
                                                     prefix=logging_prefix))
    return reorder_s


def _record_step(metrics, sp: StepPlan, t0: float, t_apply: float, N: int, red: int, quick,
                 added_s: float | None = None, on_critical_path: bool = True,
                 warmup_s: float | None = None) -> SeamRecord:
    now = time.perf_counter()
    wall = now - t0
    rec = SeamRecord("verl.balance_batch", sp.rows, sp.rows_theirs, sp.ours_us, sp.theirs_us, wall,
                     samples=N, quick=quick, import_s=sp.import_s, plan_s=sp.plan_s, apply_s=now - t_apply,
                     budget_s=sp.budget_s, redundant_experts=red if sp.applied == "routepack" else 0,
                     added_s=wall if added_s is None else added_s, on_critical_path=on_critical_path,
                     forward_us=sp.forward_us, forward_us_theirs=sp.forward_us_theirs,
                     applied=sp.applied if sp.theirs is not None else None, theirs_source=sp.theirs_source,
                     warmup_s=warmup_s)
    metrics.update(_RECORDS.add(rec).metrics(prefix="routepack/balance"))
    if quick:
        logger.debug("routepack verl: quick path (%s)", quick)
    return rec


def _quick_step(lens_N, dp_size: int, size: int, options: BalanceOptions, cost=DEFAULT_COST) -> StepPlan:
    """The quick length-only plan of the overlap mode's first reorder (no routes, no search),
    scored by ``cost`` (the seam's configured cost model) for its run order."""
    t = time.perf_counter()
    topo = Topology(dp=dp_size, ep=1, capacity=int(options.max_token_len),
                    min_rows=int(options.min_num_micro_batch or 1),
                    row_multiple=int(options.num_batches_divided_by or 1), equal_samples_per_slot=True)
    plans = []
    for k in range(int(lens_N.size) // size):
        idx = np.arange(k * size, (k + 1) * size)
        lay = _quick_layout(lens_N[idx], topo)
        if lay is None:
            from routepack_opt.heuristics.frameworks import verl_layout

            lay = Layout(*verl_layout(lens_N[idx], topo))
        ev = Evaluator(length_only_window(lens_N[idx]), topo, as_cost(cost))
        plans.append(_run_order(ev, _ONE_EXPERT, lay, dp_size, idx))
    return StepPlan(plans, 0.0, 0.0, 0, 0, [], "overlap: quick order", 0.0, time.perf_counter() - t, None)



def _apply_pending_before(method, max_token_len: int, red: int):
    """``method`` (``_update_actor`` / ``_update_critic``) preceded by the overlap mode's apply."""

    def wrapped(self, batch, *args, **kwargs):
        pend = getattr(self, "_routepack_pending", None)
        if pend is not None:
            self._routepack_pending = None
            t_wait = time.perf_counter()
            pend["thread"].join()
            wait_s = time.perf_counter() - t_wait
            box = pend["box"]
            mask = batch.batch["attention_mask"]
            N = int(mask.shape[0])
            lens_now = mask.reshape(N, -1).sum(-1).cpu().numpy().astype(np.int64)
            if "error" in box or not np.array_equal(lens_now, pend["lens"]):
                why = (f"{box['error'].__class__.__name__}: {box['error']}" if "error" in box
                       else "the batch changed between _balance_batch and the update")
                warn_once("verl", "overlap", f"the background plan is not applied ({why}); the quick order stays")
            else:
                sp = box["plan"]
                t_apply = time.perf_counter()
                deferred = pend["mode"] == "deferred"
                reorder_s = _apply_step(batch, pend["metrics"] if deferred else {}, pend["prefix"], sp, lens_now,
                                        pend["dp"], max_token_len)
                # what the step waited for beyond verl's own call: _balance_batch, the wait and the
                # apply, less the one reorder that stands for verl's own (the quick plan's when
                # "balanced", whose second reorder is extra; the update's when "deferred")
                added = (pend["start_s"] + wait_s + (time.perf_counter() - t_apply)
                         - (reorder_s if deferred else pend["reorder_s"]))
                _record_step(pend["metrics"], sp, pend["started"], t_apply, N, red, sp.quick, added_s=added,
                             on_critical_path=False)
                pend["metrics"]["routepack/balance/wait_ms"] = 1e3 * wait_s
        return method(self, batch, *args, **kwargs)

    wrapped.__routepack__ = True  # type: ignore[attr-defined]
    wrapped.__wrapped__ = method  # type: ignore[attr-defined]
    return wrapped

"""verl's trainer hook: :func:`install_balance_batch` replaces ``RayPPOTrainer._balance_batch`` by
the driver's plan of each step (:func:`~routepack_opt.integrations.verl_balance.plan_step`),
applied to the batch (plan columns, placements, one reorder, verl's balance metrics) and
recorded; with ``overlap`` the plan runs behind the step's log-prob passes. Re-exported by
:mod:`routepack_opt.integrations.verl`."""

from __future__ import annotations

import dataclasses
import logging
import re
import time

import numpy as np

from routepack_opt.core.checks import check_known_options, check_positive_int
from routepack_opt.core.errors import InputError
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.core.layout import Layout
from routepack_opt.core.topology import Topology
from routepack_opt.integrations import _deps, _verl_overlap
from routepack_opt.integrations._common import as_cost, length_only_window
from routepack_opt.integrations._seam import (
    DEFAULT_COST,
    OVERLAP_FIRST_S,
    OVERLAP_MAX_S,
    OVERLAP_SHARE,
    SETTING_KEYS,
    SHARE_OF_GAIN,
    SeamRecord,
    SeamSettings,
    failure_cause,
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
    _global_window,
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
                          redundant_experts: int = 0, overlap: bool | str = False, dp_size: int | None = None,
                          **settings_options):
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

    Everything that needs no batch is checked here, an :class:`InputError` naming the argument:
    the integers (``max_token_len``, ``num_experts``, ``ep_size``, ``mini_batch_size``, the row
    rules, ``redundant_experts``), E + N divisible by ``ep_size``, ``overlap``, misspelled
    keywords; with ``dp_size`` (the actor's DP size, else read from the trainer at each step)
    also ``dp_size % ep_size`` — without it a DP size the EP size does not divide is found at the
    first step and warned (verl's own method runs).

    ``redundant_experts=N`` (with ``num_experts``): every mini-batch is planned with N extra
    expert slots per MoE layer; its replicated ``Placement`` goes to the workers in the batch's
    ``meta_info[PLACEMENTS_KEY]`` (verl's dispatch gives every rank the batch's meta_info; read it
    with :func:`placements_from_batch`) and the record carries ``redundant_experts``.

    ``overlap=True`` (``"balanced"``) hides the plan behind the step's other work:
    ``_balance_batch`` applies RoutePack's quick length-only plan at once (so the log-prob passes
    still get balanced ranks) and starts, in a background thread, the synchronous mode's plan of
    the rollout-order mini-batches (the route import off the budget; the default budget from the
    last step's hidden time, :meth:`_BalanceHook._overlap_settings`) and then the gather of the
    batch's tensors into its order; the first ``_update_critic`` / ``_update_actor`` of the step
    waits for it and applies it if the batch is still what it was made from
    (:class:`~routepack_opt.integrations._verl_overlap.Fingerprint`; else, or if the thread
    raised anything, a re-plan on the quick path, the record's ``quick`` saying why), gathering
    only what was added since. ``overlap="deferred"``: no reorder in ``_balance_batch`` (the
    log-prob passes see the rollout order, verl's DP token balance off for them), the plan's one
    reorder at the update, its padded tensors gathered in the background. Between them verl
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
    check_known_options(settings_options, SETTING_KEYS, "install_balance_batch")
    options, overlap = _checked_options(max_token_len, num_experts, ep_size, moe_layer_freq, mini_batch_size,
                                        num_batches_divided_by, min_num_micro_batch, redundant_experts, overlap,
                                        dp_size)
    hook = _BalanceHook(trainer_cls._balance_batch, seam_settings("verl_balance", **settings_options), options,
                        mini_batch_size, overlap, dp_size)

    def _balance_batch(self, batch, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
        return hook.balance(self, batch, metrics, logging_prefix, keep_minibatch)

    _balance_batch.__routepack__ = True  # type: ignore[attr-defined]
    if not getattr(hook.original, "__routepack__", False):
        ORIGINAL_BALANCE[trainer_cls] = hook.original  # verl's own, run to score the step it would run
    trainer_cls._balance_batch = _balance_batch
    if overlap:
        for name in ("_update_critic", "_update_actor"):
            if hasattr(trainer_cls, name):
                setattr(trainer_cls, name, _apply_pending_before(getattr(trainer_cls, name), hook))
    logger.info("routepack verl: %s._balance_batch replaced (objective %s, budget %s per step%s)",
                getattr(trainer_cls, "__name__", trainer_cls), hook.settings.objective,
                "none" if hook.settings.time_limit is None else f"{hook.settings.time_limit:g} s",
                ", planned behind the log-prob passes" if overlap else "")
    return hook.original


def _checked_options(max_token_len, num_experts, ep_size, moe_layer_freq, mini_batch_size, num_batches_divided_by,
                     min_num_micro_batch, redundant_experts, overlap, dp_size) -> tuple[BalanceOptions, bool | str]:
    """:func:`install_balance_batch`'s arguments checked (nothing here needs a batch)."""
    cap = check_positive_int(max_token_len, "max_token_len")
    E = check_positive_int(num_experts, "num_experts", allow_none=True)
    ep = check_positive_int(ep_size, "ep_size")
    for name, value in (("mini_batch_size", mini_batch_size), ("num_batches_divided_by", num_batches_divided_by),
                        ("min_num_micro_batch", min_num_micro_batch), ("dp_size", dp_size)):
        check_positive_int(value, name, allow_none=True)
    red = _redundant(redundant_experts)
    if red and E is None:
        raise InputError("redundant_experts needs num_experts: replicas follow the experts' loads")
    if not (isinstance(overlap, bool) or overlap in ("balanced", "deferred")):
        raise InputError(f"overlap: expected False, True, 'balanced' or 'deferred', got {overlap!r}")
    Topology(dp=1, ep=1, capacity=cap, min_rows=int(min_num_micro_batch or 1),
             row_multiple=int(num_batches_divided_by or 1))  # their ranges
    if dp_size is not None and int(dp_size) % ep:
        raise InputError(f"ep_size={ep}: dp_size={dp_size} is not divisible by it (each EP group is ep_size "
                         "of the DP ranks)")
    if E is not None:
        try:
            Topology(dp=ep, ep=ep, capacity=cap, redundant_experts=red).check_experts(E)
        except InputError as exc:
            msg = str(exc).replace("--redundant-experts ", "redundant_experts=").replace("topology: ", "")
            raise InputError(f"install_balance_batch: {msg}") from None
    return BalanceOptions(cap, E, ep, moe_layer_freq, num_batches_divided_by, min_num_micro_batch, red), overlap


class _BalanceHook:
    """One :func:`install_balance_batch`: its settings and options, the trainer's own method, and
    what a step leaves the next (the apply time reserved in its budget, the route import's rate
    and the predicted gain, the step count)."""

    def __init__(self, original, settings: SeamSettings, options: BalanceOptions, mini_batch_size, overlap,
                 dp_size=None):
        self.original, self.settings, self.options = original, settings, options
        self.mini_batch_size, self.overlap, self.dp_size = mini_batch_size, overlap, dp_size
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
            dp_size = self._dp_size(trainer)
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
                return self._start_overlap(trainer, batch, metrics, logging_prefix, lens_N, dp_size, size, t0,
                                           cfg)
            sp = self._plan(batch, lens_N, dp_size, size, t0, cfg, trainer)
        except Exception as exc:  # never break the trainer: verl's own balance (one warning per cause)
            warn_once("verl", f"balance: {failure_cause(exc)}", f"balance_batch planning failed "
                      f"({exc.__class__.__name__}: {exc}); verl's own _balance_batch runs")
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

    def _dp_size(self, trainer) -> int:
        """The actor's DP size (verl's ``_get_dp_size``), checked against ``ep_size`` and the
        ``dp_size`` given at install."""
        dp = int(trainer._get_dp_size(trainer.actor_rollout_wg, "actor"))
        if self.dp_size is not None and dp != self.dp_size:
            raise InputError(f"dp_size={self.dp_size} was given at install, but the actor has {dp} DP ranks")
        if dp % self.options.ep_size:
            raise InputError(f"ep_size={self.options.ep_size}: the actor's {dp} DP ranks are not divisible by it")
        return dp

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

    def _start_overlap(self, trainer, batch, metrics, logging_prefix, lens_N, dp_size, size, t0, cfg=None):
        """The overlap modes: the quick order now (``"balanced"``) or none (``"deferred"``); the
        plan of the rollout-order mini-batches (the synchronous mode's) in a background thread,
        which then gathers the batch's tensors into its order; both applied before the step's
        first update (:meth:`apply_pending`)."""
        import threading

        old = getattr(trainer, "_routepack_pending", None)
        if old is not None:  # a step whose update never ran (e.g. critic warm-up): drop its plan
            old["cancel"].set()
        td0 = batch.batch  # the rollout order: what the synchronous mode plans
        counts = _hook_counts(batch)
        N = int(lens_N.size)
        if self.mode == "balanced":
            quick = _quick_step(lens_N, dp_size, size, self.options, self.settings.cost)
            order_N = np.fromiter((j for part in _parts(quick.plans, dp_size) for j in part), dtype=np.int64, count=N)
            reorder_s = _apply_step(batch, metrics, logging_prefix, quick, lens_N, dp_size, self.options.max_token_len,
                                    columns=False)
        else:  # "deferred": the batch stays in its order until the update
            reorder_s, order_N = 0.0, np.arange(N, dtype=np.int64)
        plan_keys = ("attention_mask", "input_ids") + (("routed_experts",) if self.options.num_experts else ())
        fp = _verl_overlap.fingerprint(batch, plan_keys, lens_N[order_N])
        cur = {k: v for k, v in batch.batch.items()}  # the tensors the update will find, if untouched
        pos_of = np.empty(N, dtype=np.int64)
        pos_of[order_N] = np.arange(N, dtype=np.int64)  # sample i (rollout order) sits at pos_of[i] now
        pend = dict(box={}, cancel=threading.Event(), fp=fp, pos_of=pos_of, lens=lens_N, metrics=metrics,
                    prefix=logging_prefix, dp=dp_size, size=size, started=t0, reorder_s=reorder_s, mode=self.mode)
        src = {"td": td0, "cur": cur, "counts": counts, "settings": self._overlap_settings(), "config": cfg,
               "trainer": trainer}
        th = threading.Thread(target=self._background, args=(pend, src), name="routepack-balance", daemon=True)
        pend["thread"] = th
        th.start()
        pend["start_s"] = time.perf_counter() - t0
        pend["returned"] = time.perf_counter()
        trainer._routepack_pending = pend

    def _overlap_settings(self) -> SeamSettings:
        """The background plan's budget: a set ``time_limit`` (or none) as it is; the default one
        is what the step's hidden time allows: :data:`OVERLAP_SHARE` of the last step's time
        between ``_balance_batch`` and the update, less the last background import and gather, at
        most ``OVERLAP_MAX_S`` (the first step: ``OVERLAP_FIRST_S``). Set, so the search runs wherever its share
        reaches the floor: hidden time costs the step nothing."""
        st, state = self.settings, self.state
        if not st.time_limit_is_default:
            return st
        hidden = state.get("hidden_s")
        if hidden is None:
            budget = OVERLAP_FIRST_S
        else:
            budget = min(OVERLAP_MAX_S,
                         OVERLAP_SHARE * hidden - state.get("overhead_s", 0.0))
        return dataclasses.replace(st, time_limit=max(budget, 1e-3), time_limit_is_default=False)

    def _background(self, pend: dict, src: dict) -> None:
        """The planning thread: the route import (off the budget), the plan of the rollout-order
        batch with :meth:`_overlap_settings`' budget, the content checksum, the gather into the
        plan's order. Any exception, ``BaseException`` included, is kept for the update."""
        box = pend["box"]
        try:
            t = time.perf_counter()
            cur = src["cur"]
            counts = src["counts"]
            opts = self.options
            if counts is None and opts.num_experts is not None and "routed_experts" in src["td"].keys():
                counts = _global_window(pend["lens"], src["td"], opts.num_experts, opts.moe_layer_freq).counts
            import_s = time.perf_counter() - t
            settings = src["settings"]
            with settings.planner_threads():
                sp = plan_step(src["td"], pend["lens"], pend["dp"], pend["size"], options=opts, settings=settings,
                               budget=StepBudget(time.perf_counter()), counts_NLE=counts, config=src["config"],
                               balance_fn=self.original, trainer=src["trainer"])
            sp.import_s = import_s
            src.pop("td")  # the rollout-order copy is not needed any more
            t_pre = time.perf_counter()
            perm_N = np.fromiter((j for part in _parts(sp.plans, pend["dp"]) for j in part), dtype=np.int64,
                                 count=int(pend["lens"].size))
            box["perm"] = perm_N
            box["pre"] = _verl_overlap.prereorder(cur, pend["pos_of"][perm_N], pend["cancel"])
            self.state["overhead_s"] = import_s + time.perf_counter() - t_pre
            box["plan"] = sp
        except BaseException as exc:  # noqa: BLE001 - SystemExit too: the update re-plans, says why
            box["error"] = exc
        finally:
            src.clear()

    def apply_pending(self, trainer, batch) -> None:
        """Before the step's first update: apply the background plan if the batch is still what
        it was made from (:class:`~routepack_opt.integrations._verl_overlap.Fingerprint`) and the
        thread gave one; else re-plan on the quick path (length-only, no search) and say why
        (the record's ``quick``, one warning per cause)."""
        pend = getattr(trainer, "_routepack_pending", None)
        if pend is None:
            return
        trainer._routepack_pending = None
        t_enter = time.perf_counter()
        self.state["hidden_s"] = t_enter - pend["returned"]
        fp, box = pend["fp"], pend["box"]
        why = fp.mismatch(batch)
        wait_s = 0.0
        if why is None:
            pend["thread"].join()
            wait_s = time.perf_counter() - t_enter
            if "error" in box:
                exc = box["error"]
                why = f"planning failed ({exc.__class__.__name__}: {exc})"
            elif "plan" not in box:
                why = "the planning thread ended without a plan"
            else:
                why = fp.content_mismatch(batch)
        else:
            pend["cancel"].set()  # a stale plan: no wait for it
        deferred = pend["mode"] == "deferred"
        red, cap = self.options.redundant_experts, self.options.max_token_len
        t_apply = time.perf_counter()
        if why is None:
            sp = box["plan"]
            reorder_s = _apply_step(batch, pend["metrics"] if deferred else {}, pend["prefix"], sp, pend["lens"],
                                    pend["dp"], cap, pos_of=pend["pos_of"], pre=box.get("pre"), fp=fp)
            quick, predicted = sp.quick, True
        else:
            cause = why if "error" not in box else f"planning failed: {failure_cause(box['error'])}"
            warn_once("verl", f"overlap: {re.sub(r'[0-9]+', '#', cause)}",
                      f"the background plan is not applied ({why}); re-planned on the quick path")
            lens_now = _mask_lengths(batch)
            sp = _quick_step(lens_now, pend["dp"], pend["size"], self.options, self.settings.cost)
            reorder_s = _apply_step(batch, pend["metrics"] if deferred else {}, pend["prefix"], sp, lens_now,
                                    pend["dp"], cap)
            quick, predicted = f"overlap: {why}; re-planned on the quick path", False
        # what the step waited for beyond verl's own call: _balance_batch, the wait and the
        # apply, less the one reorder that stands for verl's own (the quick plan's when
        # "balanced", whose gather of what was added since is extra; the update's when "deferred")
        added = (pend["start_s"] + wait_s + (time.perf_counter() - t_apply)
                 - (reorder_s if deferred else pend["reorder_s"]))
        _record_step(pend["metrics"], sp, pend["started"], t_apply, int(pend["lens"].size), red, quick,
                     added_s=added, on_critical_path=False, predicted=predicted)
        pend["metrics"]["routepack/balance/wait_ms"] = 1e3 * wait_s


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
                columns: bool = True, pos_of=None, pre=None, fp=None) -> float:
    """Reorder the batch once into the plan's order, then write the plan's columns and the
    placements, and verl's balance metrics. The plan numbers the samples as ``lens_N`` does;
    ``pos_of[i]``: where sample i sits in the batch now (None: there). With ``pre`` (the overlap
    modes' tensors gathered in the background, valid where ``fp`` says the batch still holds them)
    only the rest is gathered now. Returns the reorder's seconds (verl's own ``_balance_batch``
    reorders the batch the same way)."""
    torch = _deps.torch()
    N = int(lens_N.size)
    parts = _parts(sp.plans, dp_size)
    perm = np.fromiter((j for part in parts for j in part), dtype=np.int64, count=N)
    now_perm = perm if pos_of is None else pos_of[perm]
    t = time.perf_counter()
    if pre:
        _verl_overlap.reorder_with(batch, now_perm, pre, fp)
    else:
        batch.reorder(torch.from_numpy(now_perm))
    reorder_s = time.perf_counter() - t
    if columns:  # written in the new order: position j holds sample perm[j]
        for key, col in plan_columns(sp.plans, N, max_token_len).items():
            batch.batch[key] = torch.from_numpy(np.ascontiguousarray(col[perm]))
        if any(p is not None for p in sp.placements):
            batch.meta_info[PLACEMENTS_KEY] = list(sp.placements)
    metrics.update(_deps.verl_log_seqlen_unbalance()(seqlen_list=lens_N.tolist(), partitions=parts,
                                                     prefix=logging_prefix))
    return reorder_s


def _record_step(metrics, sp: StepPlan, t0: float, t_apply: float, N: int, red: int, quick,
                 added_s: float | None = None, on_critical_path: bool = True, predicted: bool = True,
                 warmup_s: float | None = None) -> SeamRecord:
    """The step's record into ``metrics`` (``predicted`` False: a plan without predicted times,
    the overlap mode's re-plan on the quick path)."""
    now = time.perf_counter()
    wall = now - t0
    rec = SeamRecord("verl.balance_batch", sp.rows, sp.rows_theirs if predicted else None,
                     sp.ours_us if predicted else None, sp.theirs_us if predicted else None, wall,
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
    plans, rows = [], 0
    for k in range(int(lens_N.size) // size):
        idx = np.arange(k * size, (k + 1) * size)
        lay = _quick_layout(lens_N[idx], topo)
        if lay is None:
            from routepack_opt.heuristics.frameworks import verl_layout

            lay = Layout(*verl_layout(lens_N[idx], topo))
        ev = Evaluator(length_only_window(lens_N[idx]), topo, as_cost(cost))
        plans.append(_run_order(ev, _ONE_EXPERT, lay, dp_size, idx))
        rows += int(lay.rows)
    return StepPlan(plans, 0.0, 0.0, rows, 0, [None] * len(plans), "overlap: quick order", 0.0,
                    time.perf_counter() - t, None)


def _apply_pending_before(method, hook: _BalanceHook):
    """``method`` (``_update_actor`` / ``_update_critic``) preceded by the overlap mode's apply."""

    def wrapped(self, batch, *args, **kwargs):
        hook.apply_pending(self, batch)
        return method(self, batch, *args, **kwargs)

    wrapped.__routepack__ = True  # type: ignore[attr-defined]
    wrapped.__wrapped__ = method  # type: ignore[attr-defined]
    return wrapped

"""verl: a drop-in for ``verl.utils.seqlen_balancing.rearrange_micro_batches`` and the expert map
from a batch's ``routed_experts``.

verl's function picks ``ceil(tokens / max_token_len)`` micro-batches, balances an estimated FLOP
workload (``24576·s + s²``, a 7B dense model) by Karmarkar–Karp, and adds micro-batches until
every one fits the cap. Ours certifies the least micro-batch count that fits the cap (bounds, FFD,
exact bin packing where bounds do not close), agrees on it across ``dp_group`` (all-reduce MAX,
as verl does), and packs the rank's samples into that many micro-batches with the best
length-only baseline by RoutePack's cost model. On one rank without expert loads the predicted
time of R micro-batches is the same for every packing (``Σ_i`` of each sample's own attention
and expert terms plus ``R·row_overhead``; docs/model.md), so the count is what saves time and
no search runs (``max_sweeps`` and ``seed`` are accepted for the signature and unused here).
Return value and index lists are verl's: ``(list[TensorDict], list[list[int]])``, every sample
once, so ``restore_dynamic_batch`` undoes it.

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
lengths only. :func:`install_balance_batch` patches it into ``RayPPOTrainer`` (keeping verl's
``keep_minibatch`` and ``use_prefix_grouper`` branches), planning each mini-batch the workers'
actor iterates.

The driver's plan on the ranks: both write the plan into the batch as int64 ``[N]`` columns
(:data:`PLAN_COLUMNS`, :func:`plan_columns`), which verl's dispatch, its mini-batch iterator and
``index_select`` carry with their samples. :func:`rearrange_micro_batches` returns those
micro-batches without planning when they are whole in the call (every listed micro-batch
complete, under the cap, forced groups kept, verl's row rules met) and every rank of ``dp_group``
can use its plan with the same count (agreed in the call's one all-reduce), in the driver's
run order for the whole group (:attr:`GlobalBalance.row_order`: verl's pipeline-bubble order on
each row's cost over the group, so row r of every rank still runs together); the record's
``source`` is then ``"driver"``. Otherwise it plans as below: silently for a call over several
planned mini-batches or at another cap (a log-prob pass), with one warning per cause for columns
that are not whole. Expert-aware packing on a rank alone is not done: its expert time depends on
its EP peers' micro-batches of the same row, which it does not see
(``experiments/verl_rank_expert_aware.py`` measures it worse than length-only per rank).

Enabling it by config: RoutePack registers a ``verl.plugins`` entry point
(:mod:`routepack_opt.integrations.verl_plugin`); with ``ROUTEPACK_VERL=1`` in the workers'
environment, ``import verl`` swaps verl's function for ours, with the settings of
``ROUTEPACK_COST`` (default ``qwen3-30b-a3b``), ``ROUTEPACK_OBJECTIVE`` and
``ROUTEPACK_TIME_LIMIT`` (default ``DEFAULT_TIME_LIMIT["verl"]`` seconds per call), checked when
the plugin loads.

Contract (verl 0.9.1's): every keyword verl's callers pass is accepted; where verl asserts
(``max_token_len`` below the padded sequence length, a batch not divisible into forced groups)
ours raises :class:`~routepack_opt.integrations._seam.FrameworkAssertionError` (an
``AssertionError``) with verl's message, and where verl raises ``ValueError`` (a forced group over
the cap, too few groups for the agreed count) so do we, with verl's message. A batch whose lengths
cannot be read (neither nested ``input_ids`` nor a 2-D ``attention_mask``; a sample without
tokens) goes to verl's own function, with one warning per cause; the ranks of ``dp_group`` agree
on that first (all-reduce MAX with the other fatal constraints), so they all run the same
collectives. A batch with ``attention_mask`` and no ``input_ids`` is planned from the mask.
A planning failure after the ranks agreed on the count keeps that count and uses the best
length-only baseline (one warning).

Each call yields a :class:`~routepack_opt.integrations._seam.SeamRecord` (:func:`last_record`,
:func:`pop_records`, or ``on_record=``): micro-batches and predicted time of ours and of verl's
count on the same lengths (verl's own ``rearrange_micro_batches`` run on them without the DP
sync, or, where that cannot run or would take too long, verl's rule on RoutePack's compiled KK:
the record's ``theirs_source`` says which), the planning time and the net saving.
``metrics.update(rp_verl.last_record().metrics())`` puts it in
verl's step metrics.

Modules: this one is the rank's side (and the public names of all three); the driver's plan is
:mod:`.verl_balance` (:func:`balance_batch_partitions`, :func:`balance_batch`, :func:`plan_step`)
and the trainer hook :mod:`.verl_trainer` (:func:`install_balance_batch`), both re-exported here.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import numpy as np

from routepack_opt.certify import certify_rows
from routepack_opt.core.errors import InputError
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.core.layout import Layout
from routepack_opt.core.placement import Placement
from routepack_opt.core.topology import Topology
from routepack_opt.heuristics.placement.lpt import lpt_placement, swap_refine
from routepack_opt.heuristics.placement.replicate import replicated_placement
from routepack_opt.integrations import _deps, _verl_env
from routepack_opt.integrations._common import length_only_window
from routepack_opt.integrations._seam import (
    UNSET,
    FrameworkAssertionError,
    SeamRecord,
    SeamSettings,
    seam_settings,
    warn_once,
)
from routepack_opt.integrations._verl_common import (
    _ONE_EXPERT,
    _RECORDS,
    PLACEMENTS_KEY,
    PLAN_COLUMNS,
    _bubble_order,
    _redundant,
    plan_columns,
    verl_own,
)
from routepack_opt.integrations.verl_balance import (  # the driver side, re-exported
    BalanceOptions,
    GlobalBalance,
    StepBudget,
    StepPlan,
    balance_batch,
    balance_batch_partitions,
    plan_step,
)
from routepack_opt.integrations.verl_trainer import install_balance_batch  # the trainer hook, re-exported
from routepack_opt.pipeline import baseline_layouts
from routepack_opt.replay import import_replay

logger = logging.getLogger("routepack_opt.integrations")

__all__ = ["rearrange_micro_batches", "expert_map_from_batch", "batch_lengths", "UnsupportedBatch",
           "balance_batch_partitions", "balance_batch", "GlobalBalance", "last_record", "pop_records",
           "verl_own", "install_balance_batch", "plan_columns", "PLAN_COLUMNS", "plan_step", "StepPlan",
           "BalanceOptions", "StepBudget",
           "placements_from_batch", "PLACEMENTS_KEY"]




def last_record() -> SeamRecord | None:
    """The record of the last :func:`rearrange_micro_batches` call in this process."""
    return _RECORDS.last()


def pop_records() -> list[SeamRecord]:
    """Every record since the last ``pop_records()`` (at most 1,024), oldest first."""
    return _RECORDS.pop_all()


class UnsupportedBatch(InputError):
    """A batch layout the drop-in cannot read lengths from; ``cause`` names the reason."""

    def __init__(self, cause: str, message: str):
        super().__init__(message)
        self.cause = cause


def batch_lengths(batch) -> tuple[np.ndarray, int]:
    """(effective tokens per sample, padded sequence length) the way verl reads them: nested
    ``input_ids`` offsets, else ``attention_mask.sum(1)`` (also without ``input_ids``). Raises
    :class:`UnsupportedBatch` when neither is there or the mask is not ``[B, S]``."""
    keys = set(batch.keys())
    if "input_ids" in keys and getattr(batch["input_ids"], "is_nested", False):
        lens = batch["input_ids"].offsets().diff()
        len_N = lens.cpu().numpy().astype(np.int64)
        return len_N, int(len_N.max()) if len_N.size else 0
    if "attention_mask" not in keys:
        raise UnsupportedBatch("no-attention-mask", "the batch has no attention_mask and no nested input_ids "
                               f"(keys: {', '.join(sorted(map(str, keys)))})")
    mask = batch["attention_mask"]
    if getattr(mask, "is_nested", False) or getattr(mask, "ndim", 0) != 2:
        raise UnsupportedBatch("mask-shape", f"attention_mask has shape {tuple(getattr(mask, 'shape', ()))}, "
                               "not [batch, sequence]")
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


def _verl_reference(item_len: np.ndarray, cap: int, rows_min: int, multiple: int,
                    groups: int = 1) -> tuple[int, float, str]:
    """verl's micro-batch count on this rank's items (no DP sync: the reference must not add
    collectives), from verl's own ``rearrange_micro_batches`` run on the items' lengths
    (:func:`~routepack_opt.heuristics.frameworks.verl_rank_micro_batches`); with forced groups
    (``groups`` > 1, whose workload verl sums per sample), or where verl's pure-Python KK would
    take too long (at B = 1,024 it takes seconds), or its function is not known, verl's rule on
    RoutePack's compiled KK, an estimate. Returns (count, seconds, source)."""
    from routepack_opt.heuristics.frameworks import verl_rank_micro_batches

    t0 = time.perf_counter()
    try:
        own = verl_own()
    except Exception:  # noqa: BLE001 - patched before the plugin saved it: the estimate, said in the source
        own = None
    parts, source = verl_rank_micro_batches([item_len], cap, min_rows=rows_min, row_multiple=multiple,
                                            rearrange=own, use_verl=own is not None and groups == 1)
    return len(parts[0]), time.perf_counter() - t0, source




def _first_fit_layout(item_len, cap: int, rows: int) -> Layout:
    """Items into ``rows`` nonempty micro-batches under the cap: first-fit decreasing into the
    least loaded fitting bin, every bin opened by one of the longest items (``rows`` is at least
    a feasible count, so this only fails on the tightest windows, where it raises)."""
    order = np.argsort(-np.asarray(item_len), kind="stable")
    tot = np.zeros(rows, dtype=np.int64)
    row = np.empty(len(item_len), dtype=np.int64)
    for n, i in enumerate(order):
        fits = np.flatnonzero(tot + item_len[i] <= cap) if n >= rows else np.array([n])
        if fits.size == 0:
            raise InputError(f"no packing of {len(item_len)} items into {rows} micro-batches of {cap} tokens found")
        r = int(fits[np.argmin(tot[fits])])
        row[i] = r
        tot[r] += item_len[i]
    return Layout(row, np.zeros_like(row), rows)


def _fallback_rows(item_len, cap: int, topo: Topology) -> int:
    """A feasible row count without the certifier: first-fit decreasing bins, then the row rules."""
    tot: list[int] = []
    for x in sorted(item_len, reverse=True):
        for j, t in enumerate(tot):
            if t + x <= cap:
                tot[j] += x
                break
        else:
            tot.append(int(x))
    r = max(len(tot), topo.min_rows)
    return -(-r // topo.row_multiple) * topo.row_multiple


def _driver_rows(batch, lens_N, g: int, cap: int, topo_min: int, multiple: int):
    """This call's items (groups of ``g`` samples) → micro-batch of the driver's plan, when the
    plan columns are present and whole: every listed micro-batch complete, none over ``cap``, no
    forced group split, the count within verl's row rules. Returns (row per item or None, cause,
    message); cause None with no rows: no columns (plan as before); ``"other-batch"``: the call
    is not one planned mini-batch at its cap (a log-prob pass over several mini-batches, or with
    its own cap), a different packing problem, planned on the rank without a warning."""
    keys = set(batch.keys())
    if PLAN_COLUMNS[1] not in keys:
        return None, None, ""
    N = int(lens_N.shape[0])
    try:
        plan_N, mb_N, size_N, cap_N = (batch[k].detach().cpu().numpy().astype(np.int64).reshape(-1)
                                       for k in PLAN_COLUMNS)
    except Exception as exc:
        return None, "driver-plan-columns", ("the driver's plan columns cannot be read "
                                             f"({exc.__class__.__name__}: {exc})")
    if any(a.shape != (N,) for a in (plan_N, mb_N, size_N, cap_N)):
        return None, "driver-plan-columns", f"the driver's plan columns are not one entry per sample ({N})"
    if (plan_N != plan_N[0]).any():  # e.g. a log-prob pass over the rank's whole chunk
        return None, "other-batch", "the call holds several planned mini-batches"
    if (cap_N != cap).any():
        return None, "other-batch", f"planned for max_token_len={int(cap_N[0])}, called with {cap}"
    _, inv_N, count_M = np.unique(mb_N, return_inverse=True, return_counts=True)
    if (count_M[inv_N] != size_N).any():
        return None, "driver-plan-incomplete", ("a micro-batch of the driver's plan is incomplete in this call "
                                                "(the rank's mini-batches are not the driver's: actor.shuffle, "
                                                "another ppo_mini_batch_size, or samples dropped)")
    if (np.bincount(inv_N, weights=lens_N) > cap).any():
        return None, "driver-plan-cap", f"a micro-batch of the driver's plan is over max_token_len={cap}"
    inv_IG = inv_N.reshape(-1, g)
    if (inv_IG != inv_IG[:, :1]).any():
        return None, "driver-plan-groups", f"the driver's plan splits a forced group of {g} samples"
    rows = int(count_M.size)
    if rows < topo_min or rows % multiple:
        return None, "driver-plan-rows", (f"the driver's plan has {rows} micro-batches, not a multiple of "
                                          f"{multiple} of at least {topo_min}")
    return inv_IG[:, 0].copy(), None, ""


def rearrange_micro_batches(batch, max_token_len, dp_group=None, num_batches_divided_by=None,
                            same_micro_num_in_dp=True, min_num_micro_batch=None,
                            use_dynamic_bsz_balance=True, force_group_size=1, *,
                            cost=None, objective: str | None = None, time_limit=UNSET,
                            max_sweeps: int | None = None, seed: int = 0, threads=UNSET,
                            settings: SeamSettings | None = None, compare: bool = True, on_record=None):
    """Same signature, return and errors as verl's; the extra keyword-only options tune the
    planner (``settings``: resolved ones, as the plugin passes; ``compare``: also run verl's
    partitioner on the lengths for the record; ``on_record(record)``: called once per call).

    With the driver's plan columns (:data:`PLAN_COLUMNS`) whole in the call and usable on every
    rank of ``dp_group``, returns the driver's micro-batches without planning (record
    ``source="driver"``). Never exceeds ``max_token_len`` effective tokens per micro-batch. ``force_group_size`` > 1
    keeps consecutive groups together (planned as one item of the group's total length, so the
    quadratic term is an over-estimate for those).
    """
    t0 = time.perf_counter()
    if settings is None:
        kw = {} if time_limit is UNSET else {"time_limit": time_limit}
        if threads is not UNSET:
            kw["threads"] = threads
        settings = seam_settings("verl", cost=cost, objective=objective, max_sweeps=max_sweeps, seed=seed, **kw)
    call = _Call(batch, max_token_len, dp_group, num_batches_divided_by, same_micro_num_in_dp, min_num_micro_batch,
                 use_dynamic_bsz_balance, force_group_size, settings, compare, on_record, t0)
    with settings.planner_threads():
        return _rearrange(call)


@dataclasses.dataclass(frozen=True)
class _Call:
    """One :func:`rearrange_micro_batches` call: verl's arguments, the planner's settings, the
    record's callback and the call's start on ``time.perf_counter``'s clock."""

    batch: Any
    max_token_len: Any
    dp_group: Any
    num_batches_divided_by: Any
    same_micro_num_in_dp: bool
    min_num_micro_batch: Any
    use_dynamic_bsz_balance: bool
    force_group_size: Any
    settings: SeamSettings
    compare: bool
    on_record: Any
    t0: float

    @property
    def cap(self) -> int:
        return int(self.max_token_len)

    @property
    def g(self) -> int:
        return int(self.force_group_size)


def _read_items(call: _Call) -> tuple[np.ndarray, np.ndarray, UnsupportedBatch | None]:
    """(lengths per sample, lengths per item (a forced group of ``g`` samples), why the batch is
    unsupported or None); verl's own asserts raised here, before any collective, as verl does."""
    cap, g = call.cap, call.g
    try:
        lens_N, padded = batch_lengths(call.batch)
    except UnsupportedBatch as exc:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), exc
    if cap < padded:
        raise FrameworkAssertionError("max_token_len must be greater than the sequence length. Got "
                                      f"max_token_len={cap} and max_seq_len={padded}")
    N = int(lens_N.shape[0])
    if g < 1 or N % g:
        raise FrameworkAssertionError(f"Batch size {N} must be divisible by force_group_size {g}")
    unsupported = None
    if N == 0:
        unsupported = UnsupportedBatch("empty", "the batch has no samples")
    elif (lens_N < 1).any():
        unsupported = UnsupportedBatch("empty-sample", "a sample has no tokens (attention_mask all zero)")
    return lens_N, lens_N.reshape(-1, g).sum(axis=1) if unsupported is None else lens_N, unsupported


def _rearrange(call: _Call):
    cap = call.cap
    lens_N, item_len, unsupported = _read_items(call)
    num_items = int(item_len.shape[0])
    rows_min, multiple = int(call.min_num_micro_batch or 1), int(call.num_batches_divided_by or 1)
    driver_row, cause, why_not = (None, None, "") if unsupported is not None else _driver_rows(
        call.batch, lens_N, call.g, cap, rows_min, multiple)
    lookup_rows = int(driver_row.max()) + 1 if driver_row is not None else 0
    import_s = time.perf_counter() - call.t0  # reading the batch: lengths and the driver's columns
    # Agree on the fatal constraints, on falling back and on using the driver's plan first (one
    # all-reduce), so that no rank raises, leaves or skips a collective its peers run (as verl).
    sync = call.same_micro_num_in_dp and call.dp_group is not None
    longest, neg_items, bad, no_lookup, lookup_max, neg_lookup_min = _dist_reduce(
        [int(item_len.max()) if num_items else 0, -num_items, int(unsupported is not None),
         int(driver_row is None), lookup_rows, -lookup_rows], "MAX", call.dp_group if sync else None)
    use_driver = not bad and not no_lookup and lookup_max == -neg_lookup_min
    _warn_driver_plan(cause, why_not, driver_row is not None and not use_driver)
    if bad:
        return _verl_fallback(call, unsupported, lens_N)
    if longest > cap:
        raise InputError("A forced group exceeds max_token_len and cannot be split. "
                         f"Got max_group_token_len={longest} and max_token_len={cap}.")
    topo = Topology(dp=1, ep=1, capacity=cap, min_rows=rows_min, row_multiple=multiple)
    window = length_only_window(item_len)
    ev = Evaluator(window, topo, call.settings.cost)
    if use_driver:
        assert driver_row is not None
        lay = Layout(driver_row, np.zeros_like(driver_row), lookup_rows)
        return _finish(call, lens_N, item_len, ev, lay, None, "driver", import_s)
    lay, fallback = _plan_layout(call, item_len, window, ev, sync, -neg_items)
    return _finish(call, lens_N, item_len, ev, lay, fallback, "plan", import_s)


def _warn_driver_plan(cause: str | None, why_not: str, peer_refused: bool) -> None:
    """Say once why the driver's plan columns were not used (a different batch: at debug level)."""
    if cause == "other-batch":
        logger.debug("routepack verl: driver plan not used (%s)", why_not)
    elif cause is not None:
        warn_once("verl", cause, f"{why_not}; planning on the rank")
    elif peer_refused:
        warn_once("verl", "driver-plan-peer", "another DP rank cannot use the driver's plan (or its micro-batch "
                  "count differs); planning on the rank")


def _verl_fallback(call: _Call, unsupported: UnsupportedBatch | None, lens_N: np.ndarray):
    """verl's own function on a batch some rank cannot plan (every rank agreed), recorded."""
    why = unsupported if unsupported is not None else UnsupportedBatch(
        "peer", "another DP rank's batch is unsupported")
    warn_once("verl", why.cause, f"{why}; using verl's own rearrange_micro_batches")
    out = verl_own()(call.batch, call.max_token_len, dp_group=call.dp_group,
                     num_batches_divided_by=call.num_batches_divided_by,
                     same_micro_num_in_dp=call.same_micro_num_in_dp, min_num_micro_batch=call.min_num_micro_batch,
                     use_dynamic_bsz_balance=call.use_dynamic_bsz_balance, force_group_size=call.force_group_size)
    planning = time.perf_counter() - call.t0
    _RECORDS.add(SeamRecord("verl", len(out[1]), len(out[1]), None, None, planning, planning,
                            samples=int(lens_N.shape[0]), fallback=str(why)), call.on_record)
    return out


def _plan_layout(call: _Call, item_len, window, ev: Evaluator, sync: bool, min_items: int):
    """The rank's own layout: the certified count (agreed MAX over the ranks), then the best
    length-only baseline at that count. Returns (layout, fallback or None)."""
    settings, tl, topo = call.settings, call.settings.time_limit, ev.topology
    fallback = None
    try:
        cert = certify_rows(window, topo, time_limit=10.0 if tl is None else max(0.01, 0.3 * tl))
        rows = int(cert.rows)
    except Exception as exc:  # keep to the collectives: a count every rank can still agree on
        cert, rows = None, _fallback_rows(item_len, call.cap, topo)
        fallback = f"certifying the count failed ({exc.__class__.__name__}: {exc}); first-fit count"
        warn_once("verl", "certify", fallback)
    if sync:
        rows = _dist_reduce([rows], "MAX", call.dp_group)[0]
    if rows > min_items:
        raise InputError("Cannot satisfy max_token_len while keeping forced groups atomic and using the same "
                         "micro-batch count across DP ranks. "
                         f"Requested {rows} non-empty micro-batches, but a rank has only {min_items} forced groups.")
    left = 1.0 if tl is None else max(0.01, tl - (time.perf_counter() - call.t0))
    try:
        # One slot, one EP rank, length-only: Σ_r J[r] = Σ_i (Σ_s α_s·len_i + β_s·len_i² + γ·len_i)
        # + R·row_overhead for every layout of R rows (docs/model.md), under both objectives, so
        # no search can lower the predicted time; only R (certified above) and the tie-break
        # (the peak micro-batch) differ. The best length-only baseline at R is taken as it is.
        seeds = baseline_layouts(window, topo, rows, time_limit=left,
                                 packing=cert.packing_N if (cert is not None and int(cert.rows) == rows) else None)
        return min(seeds.values(), key=lambda s_: ev.score_layout(_ONE_EXPERT, s_, settings.objective).key), fallback
    except Exception as exc:  # after the sync: keep the agreed count with any packing that fits
        fallback = f"packing failed ({exc.__class__.__name__}: {exc}); first-fit at the agreed count"
        warn_once("verl", "plan", fallback)
        return _first_fit_layout(item_len, call.cap, rows), fallback


def _finish(call: _Call, lens_N, item_len, ev: Evaluator, lay: Layout, fallback: str | None, source: str,
            import_s: float = 0.0):
    """verl's return value from a layout of the call's items: index lists (groups expanded), in
    verl's pipeline-bubble order, the micro-batch TensorDicts and the call's record."""
    settings, g, t0 = call.settings, call.g, call.t0
    rows = int(lay.rows)
    num_items = int(item_len.shape[0])
    topo = ev.topology
    cells: list[list[int]] = [[] for _ in range(rows)]
    for i in range(num_items):
        cells[int(lay.row[i])].append(i)
    parts = [[j for it in cells[r] for j in range(it * g, it * g + g)] for r in range(rows)]
    J_R = ev.costs(_ONE_EXPERT, lay.row, lay.slot, rows)[:, 0]
    ours_us = float(ev.score_layout(_ONE_EXPERT, lay, settings.objective).makespan)
    if call.use_dynamic_bsz_balance and source != "driver":
        # the driver's rows come in the order it chose for the whole group (GlobalBalance.row_order):
        # row r of every rank runs together, so a rank must not reorder them by its own costs
        parts = [parts[r] for r in _bubble_order(J_R, [p[0] for p in parts])]
    planning = time.perf_counter() - t0
    rows_theirs = theirs_us = theirs_s = theirs_source = None
    if call.compare:
        rows_theirs, theirs_s, theirs_source = _verl_reference(item_len, int(topo.capacity), topo.min_rows,
                                                               topo.row_multiple, g)
        # layout-independent at a given count (above): verl's time is ours with its count
        theirs_us = ours_us + (rows_theirs - rows) * settings.cost.row_overhead
    t_apply = time.perf_counter()
    tu = _deps.verl_tensordict_utils()
    micro_batches = [tu.index_select_tensor_dict(call.batch, p) for p in parts]
    now = time.perf_counter()
    # planning_s: up to the plan (verl's own function also cuts the micro-batches); the split:
    # reading the batch, planning (verl's reference count included), cutting the micro-batches
    _RECORDS.add(SeamRecord("verl", rows, rows_theirs, ours_us, theirs_us, planning, theirs_s,
                            samples=int(lens_N.shape[0]), fallback=fallback, source=source, import_s=import_s,
                            plan_s=t_apply - t0 - import_s, apply_s=now - t_apply,
                            budget_s=settings.time_limit, theirs_source=theirs_source), call.on_record)
    return micro_batches, parts


def expert_map_from_batch(batch, num_experts: int, ep_size: int, *, dp_group=None,
                          moe_layer_freq=None, refine: bool = True, redundant_experts: int = 0):
    """LPT logical→physical map ``[L, E]`` (Graham 1969, then swap refinement) from the batch's
    ``routed_experts [B, S, layers, top_k]`` and ``attention_mask``, loads summed over
    ``dp_group`` so every rank gets the same map.

    With ``redundant_experts=N > 0`` (E + N divisible by ``ep_size``) the hottest experts get
    replicas and the result is a :class:`~routepack_opt.core.placement.Placement`
    (``phy2log [L, E + N]``, ``logcnt [L, E]``, the even-local rule; the planners' replicated LPT
    placement, ``refine`` unused), what ``integrations.megatron.apply_expert_placement(...,
    source_rank=)`` takes."""
    red = _redundant(redundant_experts)
    if "routed_experts" not in batch.keys():
        raise InputError("batch has no 'routed_experts' (enable routing replay in the rollout)")
    w = import_replay(batch["routed_experts"], format="verl", num_experts=num_experts,
                      attention_mask=batch["attention_mask"], moe_layer_freq=moe_layer_freq).window
    load_LE = w.expert_loads()
    if dp_group is not None:
        L, E = load_LE.shape
        load_LE = np.asarray(_dist_reduce(load_LE.ravel().tolist(), "SUM", dp_group)).reshape(L, E)
    Topology(dp=ep_size, ep=ep_size, capacity=1, redundant_experts=red).check_experts(num_experts)
    if red:
        return replicated_placement(load_LE, ep_size, num_experts + red)
    pl = lpt_placement(load_LE, ep_size)
    return swap_refine(load_LE, pl, ep_size) if refine else pl




def placements_from_batch(data) -> list:
    """On a worker (or the driver): the step's replicated placements the driver's
    :func:`install_balance_batch` ``(redundant_experts=N)`` planned, one
    :class:`~routepack_opt.core.placement.Placement` per mini-batch in the order the actor
    iterates them (``[]`` when the batch carries none). ``data``: a ``DataProto`` (its
    ``meta_info``) or a TensorDict made by ``DataProto.to_tensordict`` (its non-tensor entry)."""
    meta = getattr(data, "meta_info", None)
    if meta is not None:
        raw = meta.get(PLACEMENTS_KEY)
    else:
        raw = _deps.verl_tensordict_utils().get_non_tensor_data(data, PLACEMENTS_KEY, None)
    if raw is None:
        return []
    raw = raw.tolist() if hasattr(raw, "tolist") else list(raw)
    if not all(isinstance(p, Placement) for p in raw):
        raise InputError(f"{PLACEMENTS_KEY}: expected Placement objects, got "
                         f"{sorted({type(p).__name__ for p in raw})}")
    return raw


# ROUTEPACK_VERL set while verl's plugins are off: say so where RoutePack is imported (the plugin
# itself never runs then); _verl_env, not verl_plugin, whose import would activate the plugin
_verl_env.check_environment()

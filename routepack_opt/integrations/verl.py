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
count on the same lengths (verl's rule with RoutePack's compiled KK, on lengths only), the
planning time and the net saving. ``metrics.update(rp_verl.last_record().metrics())`` puts it in
verl's step metrics.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from typing import Any

import numpy as np

from routepack_opt.certify import certify_rows
from routepack_opt.core.checks import check_redundant_experts
from routepack_opt.core.errors import InputError
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.core.layout import Layout
from routepack_opt.core.placement import Placement
from routepack_opt.core.topology import Topology
from routepack_opt.heuristics.cells import kk_partition
from routepack_opt.heuristics.placement.lpt import lpt_placement, swap_refine
from routepack_opt.heuristics.placement.replicate import replicated_placement
from routepack_opt.integrations import _deps, _verl_env
from routepack_opt.integrations._common import as_cost, length_only_window, plan_cells
from routepack_opt.integrations._seam import (
    SHARE_OF_GAIN,
    UNSET,
    FrameworkAssertionError,
    Recorder,
    SeamRecord,
    SeamSettings,
    seam_settings,
    warn_once,
)
from routepack_opt.integrations.replay import import_replay, warm_import
from routepack_opt.integrations.rollout_hook import COUNTS_KEY, counts_from_non_tensor, window_from_counts
from routepack_opt.pipeline import baseline_layouts

logger = logging.getLogger("routepack_opt.integrations")

__all__ = ["rearrange_micro_batches", "expert_map_from_batch", "batch_lengths", "UnsupportedBatch",
           "balance_batch_partitions", "balance_batch", "GlobalBalance", "last_record", "pop_records",
           "verl_own", "install_balance_batch", "plan_columns", "PLAN_COLUMNS", "plan_step", "StepPlan",
           "placements_from_batch", "PLACEMENTS_KEY"]


_RECORDS = Recorder()


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


def verl_own():
    """verl's own ``rearrange_micro_batches`` (the one the plugin replaced)."""
    fn = _verl_env.ORIGINAL.get("rearrange_micro_batches")
    if fn is None:
        fn = _deps.verl_seqlen_balancing().rearrange_micro_batches
    if getattr(fn, "__routepack__", False):
        raise InputError("verl's own rearrange_micro_batches is not known (patched before the plugin saved it)")
    return fn


def _verl_reference(item_len: np.ndarray, cap: int, rows_min: int, multiple: int) -> tuple[int, float]:
    """verl's micro-batch count on this rank's items (no DP sync): ``ceil(tokens / cap)`` (at most
    the item count, at least ``min_num_micro_batch``, rounded up to the multiple), then one more
    multiple while verl's KK partition on its workload (``24576·s + s²``) leaves a micro-batch
    over the cap. RoutePack's compiled KK replaces verl's pure-Python one (the same greedy
    differencing; they may break ties differently): at B = 1,024 verl's takes seconds. Returns
    (count, seconds)."""
    t0 = time.perf_counter()
    s = item_len.astype(np.float64)
    work = 24576.0 * s + s * s
    n = int(item_len.size)
    k = max(min(n, -(-int(item_len.sum()) // cap)), rows_min)
    k = -(-k // multiple) * multiple
    while k < n:
        part = kk_partition(work, k, equal_size=False)
        if int(np.bincount(part, weights=item_len, minlength=k).max()) <= cap:
            break
        k += multiple
    return k, time.perf_counter() - t0


_ONE_EXPERT = np.zeros((1, 1), dtype=np.int64)  # the placement of a length-only window


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
    with settings.planner_threads():
        return _rearrange(batch, max_token_len, dp_group, num_batches_divided_by, same_micro_num_in_dp,
                          min_num_micro_batch, use_dynamic_bsz_balance, force_group_size, settings, compare,
                          on_record, t0)


def _rearrange(batch, max_token_len, dp_group, num_batches_divided_by, same_micro_num_in_dp, min_num_micro_batch,
               use_dynamic_bsz_balance, force_group_size, settings: SeamSettings, compare: bool, on_record,
               t0: float):
    cap = int(max_token_len)
    g = int(force_group_size)
    unsupported: UnsupportedBatch | None = None
    try:
        lens_N, padded = batch_lengths(batch)
    except UnsupportedBatch as exc:
        unsupported, lens_N, padded = exc, np.zeros(0, dtype=np.int64), 0
    # verl's own asserts, raised before any collective as verl does
    if unsupported is None:
        if cap < padded:
            raise FrameworkAssertionError("max_token_len must be greater than the sequence length. Got "
                                          f"max_token_len={cap} and max_seq_len={padded}")
        N = int(lens_N.shape[0])
        if g < 1 or N % g:
            raise FrameworkAssertionError(f"Batch size {N} must be divisible by force_group_size {g}")
        if N == 0:
            unsupported = UnsupportedBatch("empty", "the batch has no samples")
        elif (lens_N < 1).any():
            unsupported = UnsupportedBatch("empty-sample", "a sample has no tokens (attention_mask all zero)")
    item_len = lens_N.reshape(-1, g).sum(axis=1) if unsupported is None else lens_N
    num_items = int(item_len.shape[0])
    rows_min, multiple = int(min_num_micro_batch or 1), int(num_batches_divided_by or 1)
    driver_row, cause, why_not = (None, None, "") if unsupported is not None else _driver_rows(
        batch, lens_N, g, cap, rows_min, multiple)
    lookup_rows = int(driver_row.max()) + 1 if driver_row is not None else 0
    import_s = time.perf_counter() - t0  # reading the batch: lengths and the driver's columns
    # Agree on the fatal constraints, on falling back and on using the driver's plan first (one
    # all-reduce), so that no rank raises, leaves or skips a collective its peers run (as verl).
    sync = same_micro_num_in_dp and dp_group is not None
    longest, neg_items, bad, no_lookup, lookup_max, neg_lookup_min = _dist_reduce(
        [int(item_len.max()) if num_items else 0, -num_items, int(unsupported is not None),
         int(driver_row is None), lookup_rows, -lookup_rows], "MAX", dp_group if sync else None)
    use_driver = not bad and not no_lookup and lookup_max == -neg_lookup_min
    if cause == "other-batch":
        logger.debug("routepack verl: driver plan not used (%s)", why_not)
    elif cause is not None:
        warn_once("verl", cause, f"{why_not}; planning on the rank")
    elif driver_row is not None and not use_driver:
        warn_once("verl", "driver-plan-peer", "another DP rank cannot use the driver's plan (or its micro-batch "
                  "count differs); planning on the rank")
    if bad:
        why = unsupported if unsupported is not None else UnsupportedBatch(
            "peer", "another DP rank's batch is unsupported")
        warn_once("verl", why.cause, f"{why}; using verl's own rearrange_micro_batches")
        out = verl_own()(batch, max_token_len, dp_group=dp_group, num_batches_divided_by=num_batches_divided_by,
                         same_micro_num_in_dp=same_micro_num_in_dp, min_num_micro_batch=min_num_micro_batch,
                         use_dynamic_bsz_balance=use_dynamic_bsz_balance, force_group_size=force_group_size)
        planning = time.perf_counter() - t0
        _RECORDS.add(SeamRecord("verl", len(out[1]), len(out[1]), None, None, planning, planning,
                                samples=int(lens_N.shape[0]), fallback=str(why)), on_record)
        return out
    if longest > cap:
        raise InputError("A forced group exceeds max_token_len and cannot be split. "
                         f"Got max_group_token_len={longest} and max_token_len={cap}.")
    topo = Topology(dp=1, ep=1, capacity=cap, min_rows=rows_min, row_multiple=multiple)
    window = length_only_window(item_len)
    if use_driver:
        assert driver_row is not None
        lay = Layout(driver_row, np.zeros_like(driver_row), lookup_rows)
        return _finish(batch, lens_N, item_len, g, Evaluator(window, topo, settings.cost), lay, settings,
                       use_dynamic_bsz_balance, compare, on_record, t0, None, "driver", import_s)
    tl = settings.time_limit
    fallback = None
    try:
        cert = certify_rows(window, topo, time_limit=10.0 if tl is None else max(0.01, 0.3 * tl))
        rows = int(cert.rows)
    except Exception as exc:  # keep to the collectives: a count every rank can still agree on
        cert, rows = None, _fallback_rows(item_len, cap, topo)
        fallback = f"certifying the count failed ({exc.__class__.__name__}: {exc}); first-fit count"
        warn_once("verl", "certify", fallback)
    if sync:
        rows = _dist_reduce([rows], "MAX", dp_group)[0]
    if rows > -neg_items:
        raise InputError("Cannot satisfy max_token_len while keeping forced groups atomic and using the same "
                         "micro-batch count across DP ranks. "
                         f"Requested {rows} non-empty micro-batches, but a rank has only {-neg_items} forced groups.")
    left = 1.0 if tl is None else max(0.01, tl - (time.perf_counter() - t0))
    ev = Evaluator(window, topo, settings.cost)
    try:
        # One slot, one EP rank, length-only: Σ_r J[r] = Σ_i (Σ_s α_s·len_i + β_s·len_i² + γ·len_i)
        # + R·row_overhead for every layout of R rows (docs/model.md), under both objectives, so
        # no search can lower the predicted time; only R (certified above) and the tie-break
        # (the peak micro-batch) differ. The best length-only baseline at R is taken as it is.
        seeds = baseline_layouts(window, topo, rows, time_limit=left,
                                 packing=cert.packing_N if (cert is not None and int(cert.rows) == rows) else None)
        lay = min(seeds.values(), key=lambda s_: ev.score_layout(_ONE_EXPERT, s_, settings.objective).key)
    except Exception as exc:  # after the sync: keep the agreed count with any packing that fits
        fallback = f"packing failed ({exc.__class__.__name__}: {exc}); first-fit at the agreed count"
        warn_once("verl", "plan", fallback)
        lay = _first_fit_layout(item_len, cap, rows)
    return _finish(batch, lens_N, item_len, g, ev, lay, settings, use_dynamic_bsz_balance, compare, on_record, t0,
                   fallback, "plan", import_s)


def _finish(batch, lens_N, item_len, g: int, ev: Evaluator, lay: Layout, settings: SeamSettings,
            use_dynamic_bsz_balance: bool, compare: bool, on_record, t0: float, fallback: str | None, source: str,
            import_s: float = 0.0):
    """verl's return value from a layout of the call's items: index lists (groups expanded), in
    verl's pipeline-bubble order, the micro-batch TensorDicts and the call's record."""
    rows = int(lay.rows)
    num_items = int(item_len.shape[0])
    topo = ev.topology
    cells: list[list[int]] = [[] for _ in range(rows)]
    for i in range(num_items):
        cells[int(lay.row[i])].append(i)
    parts = [[j for it in cells[r] for j in range(it * g, it * g + g)] for r in range(rows)]
    J_R = ev.costs(_ONE_EXPERT, lay.row, lay.slot, rows)[:, 0]
    ours_us = float(ev.score_layout(_ONE_EXPERT, lay, settings.objective).makespan)
    if use_dynamic_bsz_balance and source != "driver":
        # the driver's rows come in the order it chose for the whole group (GlobalBalance.row_order):
        # row r of every rank runs together, so a rank must not reorder them by its own costs
        parts = [parts[r] for r in _bubble_order(J_R, [p[0] for p in parts])]
    planning = time.perf_counter() - t0
    rows_theirs = theirs_us = theirs_s = None
    if compare:
        rows_theirs, theirs_s = _verl_reference(item_len, int(topo.capacity), topo.min_rows, topo.row_multiple)
        # layout-independent at a given count (above): verl's time is ours with its count
        theirs_us = ours_us + (rows_theirs - rows) * settings.cost.row_overhead
    t_apply = time.perf_counter()
    tu = _deps.verl_tensordict_utils()
    micro_batches = [tu.index_select_tensor_dict(batch, p) for p in parts]
    now = time.perf_counter()
    # planning_s: up to the plan (verl's own function also cuts the micro-batches); the split:
    # reading the batch, planning (verl's reference count included), cutting the micro-batches
    _RECORDS.add(SeamRecord("verl", rows, rows_theirs, ours_us, theirs_us, planning, theirs_s,
                            samples=int(lens_N.shape[0]), fallback=fallback, source=source, import_s=import_s,
                            plan_s=t_apply - t0 - import_s, apply_s=now - t_apply,
                            budget_s=settings.time_limit), on_record)
    return micro_batches, parts


def _bubble_order(cost_R, key_R) -> list[int]:
    """verl's pipeline-bubble order of micro-batches: heaviest in the middle, lighter ones at both
    ends (ties by ``key_R``)."""
    order = sorted(range(len(cost_R)), key=lambda r: (cost_R[r], key_R[r]), reverse=True)
    return order[::2][::-1] + order[1::2]


def _redundant(value) -> int:
    return check_redundant_experts(value)


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


def plan_step(batch_td, lens_N: np.ndarray, dp_size: int, mini_batch_size: int, *, max_token_len: int,
              settings: SeamSettings, num_experts: int | None = None, ep_size: int = 1, moe_layer_freq=None,
              num_batches_divided_by: int | None = None, min_num_micro_batch: int | None = None,
              redundant_experts: int = 0, t0: float | None = None, apply_reserve_s: float = 0.0,
              import_rate_s: float | None = None, skip_import_over_us: float | None = None,
              counts_NLE=None) -> StepPlan:
    """The driver's plan of one step under one budget (``settings``; the clock starts at ``t0``):
    the route import (once, for the whole batch), then per mini-batch verl's own layout and
    RoutePack's quick one (both scored by the evaluator), then the search with the rest of the
    budget split evenly over the mini-batches left (less ``apply_reserve_s`` for the reorder).

    The default budget (``time_limit_is_default``) is ``min(DEFAULT_TIME_LIMIT["verl_balance"],
    SHARE_OF_GAIN × predicted gain)``, the gain being verl's layout − the lower bound of ours
    summed over the mini-batches. A mini-batch takes the quick path (the better of RoutePack's
    count-limited greedy and verl's own layout, both keeping the cap, with RoutePack's expert
    placement) when its share of the budget is under 20 ms, or, with the default budget, when its
    headroom (quick − lower bound) cannot cover its share; ``StepPlan.quick`` says why (never with
    ``max_sweeps`` set: a fixed search effort, for plans that are the same on every run). With
    ``import_rate_s`` (seconds per routed_experts entry, measured on an earlier step) and
    ``skip_import_over_us``, a route import predicted to cost more than that is skipped and the
    step planned on lengths (recorded in ``quick``). ``counts_NLE`` (the rollout hook's per-sample
    ``[L, E]`` counts, :func:`~routepack_opt.integrations.rollout_hook.counts_from_non_tensor`)
    replaces the route import: the window is built from them, no routes are read."""
    t0 = time.perf_counter() if t0 is None else t0
    red = _redundant(redundant_experts)
    N, D, cap = int(lens_N.size), int(dp_size), int(max_token_len)
    has_counts = num_experts is not None and counts_NLE is not None
    use_routes = has_counts or (num_experts is not None and "routed_experts" in batch_td.keys())
    if red and not use_routes:
        raise InputError("redundant_experts needs routed_experts and num_experts: replicas follow the experts' loads")
    skip = None
    if use_routes and not has_counts and skip_import_over_us is not None and import_rate_s is not None:
        numel = int(np.prod(batch_td["routed_experts"].shape))
        if import_rate_s * numel * 1e6 > skip_import_over_us:
            skip = (f"route import: predicted {import_rate_s * numel * 1e3:.0f} ms, over its share of the "
                    f"predicted gain ({skip_import_over_us / 1e3:.0f} ms); planned on lengths")
            use_routes, ep, red = False, 1, 0
    window = _global_window(lens_N, batch_td if use_routes else None, num_experts, moe_layer_freq,
                            counts_NLE if use_routes else None)
    import_s = time.perf_counter() - t0
    t_plan = time.perf_counter()
    rule = dict(capacity=cap, min_rows=int(min_num_micro_batch or 1), row_multiple=int(num_batches_divided_by or 1),
                equal_samples_per_slot=True)
    ep = int(ep_size) if use_routes else 1
    if red and not use_routes:
        red = 0
    topo = Topology(dp=D, ep=ep, redundant_experts=red, **rule)
    topo_theirs = Topology(dp=D, ep=ep, **rule)
    topo.check_samples(mini_batch_size)
    K = N // mini_batch_size
    mini = []
    for k in range(K):
        idx = np.arange(k * mini_batch_size, (k + 1) * mini_batch_size)
        sub = window.subset(idx)
        load_LE = sub.expert_loads()
        if red:
            placement = replicated_placement(load_LE, ep, sub.num_experts + red)
        elif use_routes:
            placement = lpt_placement(load_LE, ep)
        else:
            placement = _ONE_EXPERT
        ev = Evaluator(sub, topo, settings.cost)
        ev_theirs = Evaluator(sub, topo_theirs, settings.cost) if red else ev
        from routepack_opt.heuristics.frameworks import verl_layout

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
        mini.append(dict(sub=sub, idx=idx, ev=ev, placement=placement, layout=lay, ours=e.score.makespan,
                         lb=e.lower_bound, theirs=theirs, rows_theirs=vrows))
    gain_us = sum(max(0.0, m["theirs"] - m["lb"]) for m in mini)
    budget = settings.gain_time_limit(gain_us)
    deadline = None if budget is None else t0 + budget
    quick: str | None = skip
    plans, placements = [], []
    for k, m in enumerate(mini):
        left = None if deadline is None else (deadline - time.perf_counter() - apply_reserve_s) / (K - k)
        headroom_s = max(0.0, m["ours"] - m["lb"]) / 1e6
        why = None
        if left is not None and left < _MIN_SEARCH_S and settings.max_sweeps is None:
            why = (f"budget: {max(left, 0.0) * 1e3:.0f} ms left for this mini-batch (of {budget:.3f} s per step, "
                   f"import {import_s * 1e3:.0f} ms)")
        elif settings.time_limit_is_default and left is not None and headroom_s < left and settings.max_sweeps is None:
            why = (f"predicted saving: the search could save at most {headroom_s * 1e3:.1f} ms over the quick "
                   f"path, under its {left * 1e3:.0f} ms")
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
        placements.append(placement if red else None)
        m["rows"] = int(lay.rows)
    gain_us = sum(max(0.0, m["theirs"] - m["lb"]) for m in mini) if use_routes else None
    return StepPlan(plans, float(sum(m["ours"] for m in mini)), float(sum(m["theirs"] for m in mini)),
                    int(sum(m["rows"] for m in mini)), int(sum(m["rows_theirs"] for m in mini)), placements,
                    quick, import_s, time.perf_counter() - t_plan, budget, gain_us,
                    import_s / max(1, int(np.prod(batch_td["routed_experts"].shape)))
                    if use_routes and not has_counts else None)


# where the driver's replicated placements ride to the workers (DataProto.meta_info: verl's
# dispatch hands every rank's chunk the batch's meta_info)
PLACEMENTS_KEY = "routepack_placements"


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
    exactly the planned shares. ``mini_batch_size`` (samples of the global batch) overrides it;
    ``keep_minibatch=True`` uses verl's own size for that branch (``actor.ppo_mini_batch_size``).
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
    mode = "balanced" if overlap is True else overlap
    settings = seam_settings("verl_balance", **settings_options)
    original = trainer_cls._balance_batch
    state: dict = {"apply_s": 0.0, "rate": None, "gain": None, "step": 0}
    opts = dict(max_token_len=max_token_len, num_experts=num_experts, ep_size=ep_size, moe_layer_freq=moe_layer_freq,
                num_batches_divided_by=num_batches_divided_by, min_num_micro_batch=min_num_micro_batch,
                redundant_experts=red)

    def _balance_batch(self, batch, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
        if getattr(self, "use_prefix_grouper", False) and "uid" in batch.non_tensor_batch:
            warn_once("verl", "prefix-grouper", "use_prefix_grouper keeps a uid's samples on one rank, which "
                      "RoutePack's balance does not model: verl's own _balance_batch runs")
            return original(self, batch, metrics, logging_prefix=logging_prefix, keep_minibatch=keep_minibatch)
        from routepack_opt.warmup import warm

        warm()  # numba's kernels compiled or loaded once per process, before the step's clock starts
        if num_experts is not None and "routed_experts" in batch.batch.keys():  # the import's pass, off the clock
            warm_import(batch.batch["routed_experts"], format="verl", num_experts=num_experts,
                        attention_mask=batch.batch["attention_mask"], moe_layer_freq=moe_layer_freq)
        t0 = time.perf_counter()
        try:
            dp_size = self._get_dp_size(self.actor_rollout_wg, "actor")
            mask = batch.batch["attention_mask"]
            N = int(mask.shape[0])
            lens_N = mask.reshape(N, -1).sum(-1).cpu().numpy().astype(np.int64)
            if (lens_N < 1).any():
                raise InputError("a sample has no tokens (attention_mask all zero)")
            size = _planned_mini_batch(self.config, N, keep_minibatch, mini_batch_size)
            if overlap:
                return _start_overlap(self, batch, metrics, logging_prefix, lens_N, dp_size, size, t0)
            # default budget: skip a route import predicted to cost more than its share of the
            # gain the last imported step predicted (re-measured every 8th step)
            state["step"] += 1
            # a set budget: skip a route import predicted to overrun the whole budget
            skip_over = None
            if settings.max_sweeps is None and state["step"] % 8:
                if settings.time_limit_is_default and state["gain"] is not None:
                    skip_over = SHARE_OF_GAIN * state["gain"]
                elif not settings.time_limit_is_default and settings.time_limit is not None:
                    skip_over = 1e6 * settings.time_limit
            with settings.planner_threads():
                sp = plan_step(batch.batch, lens_N, dp_size, size, settings=settings, t0=t0,
                               apply_reserve_s=state["apply_s"], import_rate_s=state["rate"],
                               skip_import_over_us=skip_over, counts_NLE=_hook_counts(batch), **opts)
            if sp.gain_us is not None:
                state["gain"], state["rate"] = sp.gain_us, sp.import_rate_s
        except Exception as exc:  # never break the trainer: verl's own balance
            warn_once("verl", "balance", f"balance_batch planning failed ({exc.__class__.__name__}: {exc}); "
                      "verl's own _balance_batch runs")
            return original(self, batch, metrics, logging_prefix=logging_prefix, keep_minibatch=keep_minibatch)
        t_apply = time.perf_counter()
        reorder_s = _apply_step(batch, metrics, logging_prefix, sp, lens_N, dp_size, max_token_len)
        state["apply_s"] = time.perf_counter() - t_apply - reorder_s  # reserved in the next step's budget
        # added over verl's own call: all of ours but the reorder, which verl's call makes as well
        # (its KK partition counted as free, so the net saving is a lower bound)
        _record_step(metrics, sp, t0, t_apply, N, red, sp.quick, added_s=time.perf_counter() - t0 - reorder_s)

    def _start_overlap(self, batch, metrics, logging_prefix, lens_N, dp_size, size, t0):
        import threading

        if mode == "balanced":
            quick = _quick_step(lens_N, dp_size, size, max_token_len, opts)
            reorder_s = _apply_step(batch, metrics, logging_prefix, quick, lens_N, dp_size, max_token_len,
                                    columns=False)
            lens_now = lens_N[[j for part in _parts(quick.plans, dp_size) for j in part]]
        else:  # "deferred": the batch stays in its order until the update
            reorder_s, lens_now = 0.0, lens_N
        td = batch.batch  # the background plan is of this order
        counts = _hook_counts(batch)  # reordered with the batch
        box: dict = {}

        def work():
            try:
                with settings.planner_threads():
                    box["plan"] = plan_step(td, lens_now, dp_size, size, settings=settings,
                                            apply_reserve_s=0.0, counts_NLE=counts, **opts)
            except Exception as exc:  # applied as verl's quick order at the update
                box["error"] = exc

        th = threading.Thread(target=work, name="routepack-balance", daemon=True)
        th.start()
        self._routepack_pending = dict(thread=th, box=box, lens=lens_now, metrics=metrics, prefix=logging_prefix,
                                       dp=dp_size, started=t0, start_s=time.perf_counter() - t0,
                                       reorder_s=reorder_s, mode=mode)

    _balance_batch.__routepack__ = True  # type: ignore[attr-defined]
    trainer_cls._balance_batch = _balance_batch
    if overlap:
        for name in ("_update_critic", "_update_actor"):
            if hasattr(trainer_cls, name):
                setattr(trainer_cls, name, _apply_pending_before(getattr(trainer_cls, name), max_token_len, red))
    logger.info("routepack verl: %s._balance_batch replaced (objective %s, budget %s per step%s)",
                getattr(trainer_cls, "__name__", trainer_cls), settings.objective,
                "none" if settings.time_limit is None else f"{settings.time_limit:g} s",
                ", planned behind the log-prob passes" if overlap else "")
    return original


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
                 added_s: float | None = None, on_critical_path: bool = True) -> SeamRecord:
    now = time.perf_counter()
    wall = now - t0
    rec = SeamRecord("verl.balance_batch", sp.rows, sp.rows_theirs, sp.ours_us, sp.theirs_us, wall,
                     samples=N, quick=quick, import_s=sp.import_s, plan_s=sp.plan_s, apply_s=now - t_apply,
                     budget_s=sp.budget_s, redundant_experts=red, added_s=wall if added_s is None else added_s,
                     on_critical_path=on_critical_path)
    metrics.update(_RECORDS.add(rec).metrics(prefix="routepack/balance"))
    if quick:
        logger.debug("routepack verl: quick path (%s)", quick)
    return rec


def _quick_step(lens_N, dp_size: int, size: int, max_token_len: int, opts: dict) -> StepPlan:
    """The quick length-only plan of the overlap mode's first reorder (no routes, no search)."""
    t = time.perf_counter()
    topo = Topology(dp=dp_size, ep=1, capacity=int(max_token_len), min_rows=int(opts["min_num_micro_batch"] or 1),
                    row_multiple=int(opts["num_batches_divided_by"] or 1), equal_samples_per_slot=True)
    plans = []
    for k in range(int(lens_N.size) // size):
        idx = np.arange(k * size, (k + 1) * size)
        lay = _quick_layout(lens_N[idx], topo)
        if lay is None:
            from routepack_opt.heuristics.frameworks import verl_layout

            lay = Layout(*verl_layout(lens_N[idx], topo))
        ev = Evaluator(length_only_window(lens_N[idx]), topo, DEFAULT_QUICK_COST)
        plans.append(_run_order(ev, _ONE_EXPERT, lay, dp_size, int(idx[0])))
    return StepPlan(plans, 0.0, 0.0, 0, 0, [], "overlap: quick order", 0.0, time.perf_counter() - t, None)


DEFAULT_QUICK_COST = as_cost("qwen3-30b-a3b")


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


# ROUTEPACK_VERL set while verl's plugins are off: say so where RoutePack is imported (the plugin
# itself never runs then); _verl_env, not verl_plugin, whose import would activate the plugin
_verl_env.check_environment()

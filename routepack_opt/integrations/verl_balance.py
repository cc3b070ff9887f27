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
    verl_own,
)
from routepack_opt.integrations.rollout_hook import COUNTS_KEY
from routepack_opt.replay import import_replay
from routepack_opt.replay.sample_counts import window_from_counts

logger = logging.getLogger("routepack_opt.integrations")

__all__ = ["balance_batch_partitions", "balance_batch", "GlobalBalance", "plan_step", "StepPlan", "BalanceOptions",
           "StepBudget", "VerlStepConfig", "VerlStep", "verl_step_layout", "verl_balance_fn", "forward_us",
           "FORWARD_SHARE"]

UNSET_FN = object()  # balance_fn not given: the installed RayPPOTrainer's own _balance_batch


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
    """Samples per planned mini-batch: ``explicit`` when given, else the one the actor's update
    iterates (``ppo_mini_batch_size × rollout.n``, verl 0.9.1's ``_update_actor``; also with
    ``keep_minibatch``, whose rollout-order blocks are then kept whole), or the whole batch when
    the config has none or it does not divide the batch."""
    if explicit is not None:
        size = int(explicit)
    else:
        arr = config.actor_rollout_ref
        mini = arr.actor.get("ppo_mini_batch_size")
        if mini is None:
            return N
        size = int(mini) * int((arr.get("rollout") or {}).get("n", 1) or 1)
        if size < 1 or N % size:
            return N
    if size < 1 or N % size:
        raise InputError(f"batch of {N} is not a multiple of the mini-batch of {size} samples")
    return size


_MIN_SEARCH_S = 0.02  # a mini-batch's share of the budget below this takes the quick path
# The forward-only passes (old log-prob, reference, value) each run a forward over every rank's
# whole chunk; a forward is about 1/3 of a forward + backward (the backward's two matmuls per
# forward one), so each pass is predicted at 1/3 of the evaluator's time of the chunk as one row.
FORWARD_SHARE = 1.0 / 3.0
# seconds per sample of the quick path (count-limited greedy, scoring) before a step has measured
# it: N = 1,024 took 20-60 ms on a loaded 2-core machine (experiments/verl_real_step.py)
_QUICK_RATE_S = 6e-5


@dataclasses.dataclass(frozen=True)
class VerlStepConfig:
    """What of the user's verl configuration decides the layout verl runs: the actor's mini-batch
    (``ppo_mini_batch_size`` prompts × ``rollout.n``), ``_balance_batch``'s ``keep_minibatch``,
    ``use_dynamic_bsz`` (off: ``ppo_micro_batch_size_per_gpu`` samples per micro-batch),
    ``actor.shuffle`` / ``data_loader_seed`` (the actor's mini-batch iterator), and how many
    forward-only passes reuse the DP split (old log-prob, reference, value)."""

    ppo_mini_batch_size: int | None = None
    rollout_n: int = 1
    keep_minibatch: bool = False
    use_dynamic_bsz: bool = True
    micro_batch_size_per_gpu: int | None = None
    shuffle: bool = False
    data_loader_seed: int = 42
    forward_passes: int = 2

    @classmethod
    def from_trainer(cls, trainer, keep_minibatch: bool = False) -> VerlStepConfig:
        """The configuration of a ``RayPPOTrainer`` (its ``config``; ``use_dynamic_bsz`` unset
        counts as on, the setting the driver seam is for)."""
        arr = trainer.config.actor_rollout_ref
        actor = arr.actor
        mini = actor.get("ppo_mini_batch_size")
        bypass = (trainer.config.get("algorithm") or {}).get("rollout_correction") or {}
        passes = (0 if bypass.get("bypass_mode", False) else 1) + bool(getattr(trainer, "use_reference_policy", True)) \
            + bool(getattr(trainer, "use_critic", False))
        mbs = actor.get("ppo_micro_batch_size_per_gpu")
        seed = actor.get("data_loader_seed")
        return cls(None if mini is None else int(mini), int((arr.get("rollout") or {}).get("n", 1) or 1),
                   bool(keep_minibatch), bool(actor.get("use_dynamic_bsz", True)),
                   None if mbs is None else int(mbs), bool(actor.get("shuffle", False)),
                   42 if seed is None else int(seed), int(passes))

    def actor_mini_batch(self, N: int) -> int:
        """Samples of the global batch in one actor mini-batch (the whole batch without a size or
        when it does not divide the batch)."""
        if self.ppo_mini_batch_size is None:
            return N
        size = self.ppo_mini_batch_size * self.rollout_n
        return size if 0 < size and N % size == 0 else N


@dataclasses.dataclass(frozen=True)
class VerlStep:
    """The layout verl's own code gives one step: ``perm`` (``_balance_batch``'s reorder: rank d's
    chunk is ``perm[d·m:(d+1)·m]``), ``members[k]`` (the global ids of actor mini-batch k, as the
    actor's iterator cuts every rank's chunk), ``plans[k][d]`` (rank d's micro-batches of
    mini-batch k, global ids, in verl's run order, from its ``rearrange_micro_batches`` with the
    ranks' all-reduces replayed), ``source`` (``"verl"``: verl's own functions ran; else
    ``"estimate: why"``), ``driver_s`` (verl's ``_balance_batch`` on the lengths: what verl's own
    call costs besides its reorder) and ``seconds`` (all of it)."""

    perm: np.ndarray
    members: list
    plans: list
    source: str
    driver_s: float
    seconds: float

    @property
    def rows(self) -> int:
        """Micro-batches one rank runs over the step."""
        return int(sum(len(p[0]) for p in self.plans))


class _DriverStandIn:
    """What verl's ``_balance_batch`` reads of its trainer, for a call outside one."""

    actor_rollout_wg = None
    use_prefix_grouper = False

    def __init__(self, dp: int, config: VerlStepConfig):
        from omegaconf import OmegaConf

        self._dp = int(dp)
        self.config = OmegaConf.create({"actor_rollout_ref": {"actor": {
            "ppo_mini_batch_size": config.ppo_mini_batch_size}}})

    def _get_dp_size(self, worker_group, role: str) -> int:
        return self._dp


def verl_balance_fn():
    """verl's own ``RayPPOTrainer._balance_batch`` (the one :func:`install_balance_batch`
    replaced), or None where ``verl.trainer.ppo.ray_trainer`` cannot be imported."""
    from routepack_opt.integrations._verl_common import ORIGINAL_BALANCE

    try:
        from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    except Exception:  # noqa: BLE001 - verl or one of RayPPOTrainer's dependencies is missing
        return None
    fn = RayPPOTrainer.__dict__.get("_balance_batch")
    if getattr(fn, "__routepack__", False):
        fn = ORIGINAL_BALANCE.get(RayPPOTrainer)
    return fn


def _driver_perm(lens_N: np.ndarray, dp: int, config: VerlStepConfig, balance_fn, trainer) -> tuple[np.ndarray, str]:
    """verl's ``_balance_batch`` reorder of a batch of these lengths: its own method run on a
    ``DataProto`` of the lengths (``attention_mask`` [N, 1] holding them: verl reads only the row
    sums) and an index column; the estimate (KK on verl's workload, its sort) where it cannot run."""
    N = int(lens_N.size)
    why = "verl.trainer.ppo.ray_trainer is not importable" if balance_fn is None else ""
    if balance_fn is not None:
        try:
            from verl import DataProto

            torch = _deps.torch()
            data = DataProto.from_dict(tensors={"attention_mask": torch.from_numpy(lens_N.reshape(N, 1).copy()),
                                                "routepack_index": torch.arange(N)})
            me = trainer if trainer is not None else _DriverStandIn(dp, config)
            balance_fn(me, data, {}, keep_minibatch=config.keep_minibatch)
            return data.batch["routepack_index"].numpy().astype(np.int64), "verl"
        except Exception as exc:  # noqa: BLE001 - said in the source, the estimate stands in
            why = f"verl's _balance_batch failed ({exc.__class__.__name__}: {exc})"
    from routepack_opt.heuristics.cells import kk_partition

    work_N = 24576.0 * lens_N + lens_N.astype(np.float64) ** 2
    block = int(config.ppo_mini_batch_size or N) if config.keep_minibatch else N
    parts: list[list[int]] = [[] for _ in range(dp)]
    for s in range(0, N, block):
        part = kk_partition(work_N[s:s + block], dp, equal_size=True)
        for d in range(dp):
            parts[d] += (s + np.flatnonzero(part == d)).tolist()
    perm = []
    for p in parts:
        p.sort(key=lambda x: (work_N[x], x))
        perm += p[::2] + p[1::2][::-1]
    return np.asarray(perm, dtype=np.int64), f"estimate: {why}"


def verl_step_layout(lens_N: np.ndarray, dp: int, config: VerlStepConfig, *, max_token_len: int,
                     min_num_micro_batch: int | None = None, num_batches_divided_by: int | None = None,
                     balance_fn=UNSET_FN, trainer=None) -> VerlStep:
    """The layout verl 0.9.1 runs for one step of these lengths, from verl's own code in the
    user's configuration: ``RayPPOTrainer._balance_batch`` (``balance_fn``: default the installed
    class's own; ``trainer``: the trainer to call it on, else a stand-in with ``dp`` and the
    config), the actor's mini-batch iterator over every rank's chunk (verl's ``make_iterator``,
    ``shuffle`` and seed included), then per mini-batch every rank's ``rearrange_micro_batches``
    (``use_dynamic_bsz``; the ranks' all-reduces replayed,
    :func:`~routepack_opt.heuristics.frameworks.verl_rank_micro_batches`) or its fixed
    ``micro_batch_size_per_gpu`` chunks. Where a part cannot run verl's code the record's source
    says so (``"estimate: why"``)."""
    from routepack_opt.heuristics.frameworks import verl_rank_micro_batches

    t0 = time.perf_counter()
    lens_N = np.asarray(lens_N, dtype=np.int64).reshape(-1)
    N, D = int(lens_N.size), int(dp)
    if N % D:
        raise InputError(f"batch of {N} samples is not divisible by dp_size={D} (verl's _balance_batch asserts it)")
    fn = verl_balance_fn() if balance_fn is UNSET_FN else balance_fn
    perm, source = _driver_perm(lens_N, D, config, fn, trainer)
    driver_s = time.perf_counter() - t0
    m = N // D
    per_gpu = config.actor_mini_batch(N) // D
    K = m // per_gpu
    slices = _actor_slices(m, per_gpu, D, config)
    try:
        own = verl_own()
    except Exception:  # noqa: BLE001 - verl absent or its function unknown: the estimate, said below
        own = None
    members, plans = [], []
    for k in range(K):
        ids = [perm[d * m:(d + 1) * m][slices[d][k]] for d in range(D)]
        if config.use_dynamic_bsz:
            parts, src = verl_rank_micro_batches([lens_N[i] for i in ids], int(max_token_len),
                                                 min_rows=int(min_num_micro_batch or 1),
                                                 row_multiple=int(num_batches_divided_by or 1), rearrange=own)
        else:
            b = int(config.micro_batch_size_per_gpu or per_gpu)
            parts, src = [[list(range(s, min(s + b, per_gpu))) for s in range(0, per_gpu, b)] for _ in ids], "verl"
        if src != "verl" and source == "verl":
            source = f"verl driver; rank side {src}"
        members.append(np.concatenate(ids))
        plans.append([[ids[d][p].tolist() for p in parts[d]] for d in range(D)])
    return VerlStep(perm, members, plans, source, driver_s, time.perf_counter() - t0)


def _actor_slices(m: int, per_gpu: int, D: int, config: VerlStepConfig) -> list[list[np.ndarray]]:
    """``[d][k]``: the positions in rank d's chunk of its k-th actor mini-batch: verl's own
    ``make_iterator`` (shuffled with ``data_loader_seed + d`` where ``actor.shuffle``), else
    consecutive slices."""
    if not config.shuffle:
        return [[np.arange(k * per_gpu, (k + 1) * per_gpu) for k in range(m // per_gpu)] for _ in range(D)]
    tu = _deps.verl_tensordict_utils()
    from tensordict import TensorDict

    torch = _deps.torch()
    out = []
    for d in range(D):
        td = TensorDict({"i": torch.arange(m)}, batch_size=[m])
        out.append([b["i"].numpy() for b in tu.make_iterator(td, mini_batch_size=per_gpu, epochs=1,
                                                              seed=config.data_loader_seed + d,
                                                              dataloader_kwargs={"shuffle": True})])
    return out


def _layout_of(plans_D: list, idx: np.ndarray, N: int) -> Layout:
    """The layout (in ``idx``'s local numbering) of one mini-batch's ``plans_D[d][j]`` (global ids)."""
    loc = np.empty(N, dtype=np.int64)
    loc[idx] = np.arange(idx.size)
    row = np.empty(idx.size, dtype=np.int64)
    slot = np.empty(idx.size, dtype=np.int64)
    for d, mbs in enumerate(plans_D):
        for j, mb in enumerate(mbs):
            row[loc[mb]], slot[loc[mb]] = j, d
    return Layout(row, slot, len(plans_D[0]))


def forward_us(window, rank_N: np.ndarray, topo: Topology, cost, passes: int, placement=None) -> float:
    """Predicted time of the step's forward-only passes (``passes`` of them: old log-prob,
    reference, value), each over every rank's whole chunk (``rank_N``: each sample's DP rank):
    :data:`FORWARD_SHARE` × the evaluator's time of the chunks as one row (attention, expert
    terms, the EP ranks' max; ``placement`` default the identity, the experts as they are)."""
    if passes <= 0:
        return 0.0
    pl = (np.tile(np.arange(window.num_experts, dtype=np.int64), (window.num_layers, 1))
          if placement is None else placement)
    one = Topology(dp=topo.dp, ep=topo.ep, capacity=max(1, int(window.lengths.sum())))
    ev = Evaluator(window, one, as_cost(cost))
    rows = np.zeros(window.num_samples, dtype=np.int64)
    return float(passes * FORWARD_SHARE * ev.score(pl, rows, np.asarray(rank_N, dtype=np.int64), 1,
                                                    "max-sum").makespan)


def _rank_of(plans: list, N: int) -> np.ndarray:
    rank_N = np.empty(N, dtype=np.int64)
    for plan in plans:
        for d, mbs in enumerate(plan):
            for mb in mbs:
                rank_N[mb] = d
    return rank_N


@dataclasses.dataclass
class StepPlan:
    """One step's driver plan (:func:`plan_step`): ``plans[k][d]``, rank d's micro-batches of
    mini-batch k in run order (global sample indices), of the plan applied (``applied``:
    ``"routepack"``, or ``"verl"`` when verl's own layout scored no worse or the budget left no
    room for ours); predicted step times (µs, the evaluator: every mini-batch's update plus the
    forward-only passes, :func:`forward_us`) of the plan applied (``ours_us``) and of verl's own
    path (``theirs_us``), with the forward passes' share (``forward_us`` / ``forward_us_theirs``);
    the micro-batches one rank runs over the step, applied (``rows``) and verl's (``rows_theirs``);
    ``placements[k]``: mini-batch k's replicated :class:`~routepack_opt.core.placement.Placement`
    (None without replicas); ``quick``: why some mini-batch took the quick path or verl's layout
    stood (None: all searched); ``theirs_source``: where verl's layout came from
    (:class:`VerlStep`); ``theirs``: verl's layout itself; the wall-time split."""

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
    forward_us: float | None = None
    forward_us_theirs: float | None = None
    applied: str = "routepack"
    theirs_source: str | None = None
    theirs: VerlStep | None = None
    quick_rate_s: float | None = None  # the quick path's seconds per sample, measured
    # seconds per sample of the call's floor: verl's rank side and both scorings (the import and
    # verl's own partitioning aside), up to the quick path, measured
    floor_rate_s: float | None = None


def _run_order(ev: Evaluator, placement, lay: Layout, D: int, idx) -> list:
    """``[d][j]``: rank d's micro-batches (global indices ``idx[local]``) in verl's
    pipeline-bubble order of the rows' group-wide cost (:attr:`GlobalBalance.row_order`)."""
    idx = np.asarray(idx, dtype=np.int64)
    J_RG = ev.costs(placement, lay.row, lay.slot, lay.rows)
    cell = lay.row * D + lay.slot
    order_N = np.argsort(cell, kind="stable")
    bounds = np.searchsorted(cell[order_N], np.arange(lay.rows * D + 1))
    cells = [[idx[order_N[bounds[r * D + d]:bounds[r * D + d + 1]]].tolist() for d in range(D)]
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
    (``apply_reserve_s``), the route import's rate measured on an earlier step or at warm-up
    (``import_rate_s``, seconds per ``routed_experts`` entry) with its ceiling
    (``skip_import_over_us``): an import predicted over it is skipped; and the quick path's rate
    (``quick_rate_s``, seconds per sample; None: :data:`_QUICK_RATE_S`), for its floor check."""

    t0: float | None = None
    apply_reserve_s: float = 0.0
    import_rate_s: float | None = None
    skip_import_over_us: float | None = None
    quick_rate_s: float | None = None


def plan_step(batch_td, lens_N: np.ndarray, dp_size: int, mini_batch_size: int, *, options: BalanceOptions,
              settings: SeamSettings, budget: StepBudget = StepBudget(), counts_NLE=None,
              config: VerlStepConfig | None = None, balance_fn=UNSET_FN, trainer=None) -> StepPlan:
    """The driver's plan of one step under one budget (``settings``; the clock starts at
    ``budget.t0``), never predicted slower than verl's own path:

    1. verl's own layout of the step (:func:`verl_step_layout` in ``config``, default
       :class:`VerlStepConfig` with ``mini_batch_size``), scored by the evaluator: every actor
       mini-batch's update plus the forward-only passes over every rank's chunk
       (:func:`forward_us`);
    2. the route import (once, for the whole batch; skipped when predicted over its ceiling);
    3. the window each mini-batch is planned in: verl's default path re-forms the mini-batches
       over the whole batch (its DP split, then the actor's consecutive slices), so ours takes
       verl's mini-batch membership — RoutePack chooses each mini-batch's DP split and micro-
       batches jointly with its expert placement; with ``keep_minibatch`` (or a
       ``mini_batch_size`` of its own) the rollout-order mini-batches;
    4. per mini-batch the quick plan: the best of verl's own layout of that mini-batch (where the
       membership is verl's) and RoutePack's count-limited greedy, under RoutePack's expert
       placement; its floor check: when what is left of the budget cannot pay for it
       (``budget.quick_rate_s`` × N), verl's layout stands;
    5. the search with the rest of the budget split evenly over the mini-batches left (less
       ``budget.apply_reserve_s`` for the reorder);
    6. ours is applied only when the evaluator scores the whole step (update + forward passes)
       better than verl's own: ``applied`` says which. With ``use_dynamic_bsz`` off the ranks cut
       fixed-size micro-batches, which RoutePack's plan does not keep: verl's layout is applied.

    The default budget (``time_limit_is_default``) is ``min(DEFAULT_TIME_LIMIT["verl_balance"],
    SHARE_OF_GAIN × predicted gain)``, the gain being verl's update − the lower bound of ours
    summed over the mini-batches. A mini-batch keeps its quick plan when its share of the
    budget is under 20 ms, or, with the default budget, when its headroom (quick − lower bound)
    cannot cover its share; ``StepPlan.quick`` says why (never with ``max_sweeps`` set: a fixed
    search effort, for plans that are the same on every run). ``counts_NLE`` (the rollout hook's
    per-sample ``[L, E]`` counts) replaces the route import."""
    t0 = time.perf_counter() if budget.t0 is None else budget.t0
    N, D, cap = int(lens_N.size), int(dp_size), int(options.max_token_len)
    cfg = config if config is not None else VerlStepConfig(ppo_mini_batch_size=int(mini_batch_size))
    theirs = verl_step_layout(lens_N, D, cfg, max_token_len=cap, min_num_micro_batch=options.min_num_micro_batch,
                              num_batches_divided_by=options.num_batches_divided_by, balance_fn=balance_fn,
                              trainer=trainer)
    t_import = time.perf_counter()
    window, use_routes, from_routes, red, skip = _step_window(batch_td, lens_N, options, budget, counts_NLE)
    import_s = time.perf_counter() - t_import
    t_plan = time.perf_counter()
    rule = dict(capacity=cap, min_rows=int(options.min_num_micro_batch or 1),
                row_multiple=int(options.num_batches_divided_by or 1), equal_samples_per_slot=True)
    ep = int(options.ep_size) if use_routes else 1
    topo = Topology(dp=D, ep=ep, redundant_experts=red, **rule)
    topo_theirs = Topology(dp=D, ep=ep, **rule)
    topo.check_samples(mini_batch_size)
    cost = settings.cost
    # verl's own step, scored: its experts as they are (the identity), without replicas
    identity = np.tile(np.arange(window.num_experts, dtype=np.int64), (window.num_layers, 1))
    lay_theirs = [_layout_of(p, idx, N) for p, idx in zip(theirs.plans, theirs.members)]
    upd_theirs = [Evaluator(window.subset(idx), topo_theirs, cost).score_layout(identity, lay, settings.objective)
                  for idx, lay in zip(theirs.members, lay_theirs)]
    fwd_theirs = forward_us(window, _rank_of(theirs.plans, N), topo_theirs, cost, cfg.forward_passes)
    theirs_us = float(sum(s.makespan for s in upd_theirs)) + fwd_theirs
    verl_members = not cfg.keep_minibatch and all(idx.size == mini_batch_size for idx in theirs.members)
    idx_K = list(theirs.members) if verl_members else [np.arange(k * mini_batch_size, (k + 1) * mini_batch_size)
                                                        for k in range(N // mini_batch_size)]
    prep = [_prepare_mini_batch(window, idx, topo, settings, use_routes) for idx in idx_K]
    gain_us = sum(max(0.0, s.makespan - p["lb"]) for s, p in zip(upd_theirs, prep)) if verl_members else \
        max(0.0, theirs_us - fwd_theirs - sum(p["lb"] for p in prep))
    # the budget bounds what the call adds: verl's own partitioning (run above) is what verl's
    # call costs anyway, so the clock starts after it
    spend = CallBudget(settings, t0 + theirs.driver_s, settings.call_budget(gain_us=gain_us))

    floor_rate = (time.perf_counter() - t0 - theirs.driver_s - import_s) / max(1, N)

    def verl_applied(why: str) -> StepPlan:
        return StepPlan(theirs.plans, theirs_us, theirs_us, theirs.rows, theirs.rows, [None] * len(theirs.plans),
                        why, import_s, time.perf_counter() - t_plan, spend.total_s, gain_us if use_routes else None,
                        _import_rate(batch_td, import_s) if from_routes else None, fwd_theirs, fwd_theirs, "verl",
                        theirs.source, theirs, floor_rate_s=floor_rate)

    if not cfg.use_dynamic_bsz:  # the ranks cut fixed-size micro-batches: RoutePack's would not survive
        return verl_applied("use_dynamic_bsz is off: the ranks cut ppo_micro_batch_size_per_gpu samples per "
                            "micro-batch, which RoutePack's plan does not keep; verl's own layout applied")
    left = spend.left(budget.apply_reserve_s)
    need = (budget.quick_rate_s or _QUICK_RATE_S) * N
    if left is not None and settings.max_sweeps is None and left < need:
        return verl_applied(f"budget: {max(left, 0.0) * 1e3:.0f} ms left, the quick path needs about "
                            f"{need * 1e3:.0f} ms: verl's own layout applied")
    t_quick = time.perf_counter()
    mini = [_quick_mini_batch(p, lay if verl_members else None, topo, settings)
            for p, lay in zip(prep, lay_theirs if verl_members else [None] * len(prep))]
    quick_rate = (time.perf_counter() - t_quick) / max(1, N)
    plans, placements, why = _search_mini_batches(mini, topo, settings, spend, budget.apply_reserve_s, import_s)
    fwd = forward_us(window, _rank_of(plans, N), topo_theirs, cost, cfg.forward_passes)
    ours_us = float(sum(m["ours"] for m in mini)) + fwd
    ours_key = (ours_us, sum(m["total"] for m in mini))
    theirs_key = (theirs_us, sum(s.total for s in upd_theirs))
    if not ours_key < theirs_key:
        sp = verl_applied(skip or why or f"verl's own layout scores no worse ({theirs_us / 1e3:.1f} ms against "
                          f"ours {ours_us / 1e3:.1f} ms, forward passes included)")
        sp.quick_rate_s = quick_rate
        return sp
    return StepPlan(plans, ours_us, theirs_us, int(sum(m["rows"] for m in mini)), theirs.rows, placements,
                    skip or why, import_s, time.perf_counter() - t_plan, spend.total_s,
                    gain_us if use_routes else None, _import_rate(batch_td, import_s) if from_routes else None,
                    fwd, fwd_theirs, "routepack", theirs.source, theirs, quick_rate, floor_rate)


def _import_rate(batch_td, import_s: float) -> float:
    return import_s / max(1, int(np.prod(batch_td["routed_experts"].shape)))


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


def _prepare_mini_batch(window, idx: np.ndarray, topo: Topology, settings: SeamSettings, use_routes: bool) -> dict:
    """Mini-batch ``idx``'s window, evaluator, RoutePack's expert placement (replicated LPT, LPT,
    or one expert without routes) and the lower bound of its time (any placement) at the fewest rows."""
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
    R = max(topo.min_rows, -(-int(sub.lengths.sum()) // (topo.dp * topo.capacity)))
    R = -(-R // topo.row_multiple) * topo.row_multiple
    # the search may choose another placement, so its headroom is bounded by the placement-free bound
    return dict(sub=sub, idx=idx, ev=ev, placement=placement, lb=float(ev.placement_free_lower_bound(R, red)))


def _quick_mini_batch(prep: dict, theirs: Layout | None, topo: Topology, settings: SeamSettings) -> dict:
    """Mini-batch's quick plan: the better (the evaluator's key) of verl's own layout of it
    (``theirs``, where the membership is verl's) and RoutePack's count-limited greedy, under
    RoutePack's expert placement."""
    sub, ev, placement = prep["sub"], prep["ev"], prep["placement"]
    cands = [] if theirs is None else [theirs]
    q = _quick_layout(sub.lengths, topo)
    if q is not None:
        cands.append(q)
    if not cands:  # neither: verl's rule as an estimate (rollout-order mini-batches, the greedy found none)
        from routepack_opt.heuristics.frameworks import verl_layout

        cands.append(Layout(*verl_layout(sub.lengths, topo)))
    scored = [(ev.score_layout(placement, lay, settings.objective), lay) for lay in cands]
    s, lay = min(scored, key=lambda t: t[0].key)
    return dict(prep, layout=lay, ours=s.makespan, total=s.total, rows=int(lay.rows))


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
                key = ev.score_layout(pc.plan.placement, Layout(pc.plan.row, pc.plan.slot, pc.plan.rows),
                                      settings.objective).key
                if key < (m["ours"], m["total"], float("inf")):
                    p = pc.plan
                    placement = p.placement
                    lay = Layout(p.row, p.slot, p.rows)
                    m["ours"], m["total"] = float(key[0]), float(key[1])
            except Exception as exc:  # the quick path's layout stands
                why = f"search failed ({exc.__class__.__name__}: {exc})"
        if why is not None:
            quick = quick or why
        plans.append(_run_order(ev, placement, lay, D, m["idx"]))
        placements.append(placement if topo.redundant_experts else None)
        m["rows"] = int(lay.rows)
    return plans, placements, quick

"""Integration API for trainers (verl, AReaL, slime, NeMo-RL, OpenRLHF, Megatron).

One call per optimizer step::

    from routepack_opt import plan_micro_batches
    mb = plan_micro_batches(lengths=seqlens, counts=replayed_counts,   # or routes=[T, L, k] ids
                            dp_size=32, ep_size=8, max_tokens=8192, cost="qwen3-30b-a3b")
    my_batches = mb.micro_batches[dp_rank]          # list of lists of sample indices
    expert_map = mb.logical_to_physical             # [L, E], EPLB-style (no redundancy)

and :class:`AsyncPlanner` plans the next window in a background thread while the current step
trains, returning the best plan found by a deadline. Plans are always valid and deterministic
for the same inputs, seed and sweep budget.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import Future

import numpy as np

from routepack_opt.cost import CostModel, resolve_cost
from routepack_opt.errors import InputError
from routepack_opt.plan import Plan
from routepack_opt.topology import Topology
from routepack_opt.window import Window

__all__ = ["MicroBatchPlan", "plan_micro_batches", "AsyncPlanner", "window_from"]


@dataclasses.dataclass(frozen=True)
class MicroBatchPlan:
    """``micro_batches[d][m]``: sample indices of micro-batch m on DP rank d (same count on every
    rank); ``physical_to_logical[l, s]`` / ``logical_to_physical[l, e]`` as in DeepSeek's EPLB
    (``phy2log`` / ``log2phy`` with one replica per expert); ``report``: score, bounds, gap,
    certificate and timings."""

    micro_batches: list[list[list[int]]]
    physical_to_logical: np.ndarray
    logical_to_physical: np.ndarray
    plan: Plan
    report: dict

    @property
    def num_micro_batches(self) -> int:
        return self.plan.rows


def window_from(lengths, counts=None, routes=None, num_experts: int | None = None, top_k=None) -> Window:
    """A window from per-sample counts [N, L, E] or per-token routes [T, L, k] (+ num_experts)."""
    if (counts is None) == (routes is None):
        raise InputError("give exactly one of counts=[N, L, E] or routes=[T, L, k]")
    if counts is not None:
        return Window(lengths, counts, top_k=top_k)
    if num_experts is None:
        raise InputError("routes=... needs num_experts=E")
    return Window.from_routes(lengths, routes, num_experts)


def _to_result(p: Plan) -> MicroBatchPlan:
    cells = p.cells()
    mbs = [[cells[r][d] for r in range(p.rows)] for d in range(p.topology.dp)]
    l2p = p.placement.copy()
    p2l = np.argsort(l2p, axis=1).astype(np.int64)
    rep = dict(p.info)
    rep["certificate"] = p.certificate
    return MicroBatchPlan(mbs, p2l, l2p, p, rep)


def plan_micro_batches(lengths, counts=None, *, dp_size: int, ep_size: int, max_tokens: int,
                       routes=None, num_experts: int | None = None, cost: str | CostModel = "qwen3-30b-a3b",
                       objective: str = "max-sum", placement="lpt", num_micro_batches: int | None = None,
                       pp_multiple: int = 1, min_micro_batches: int = 1, time_limit: float | None = None,
                       max_sweeps: int | None = None, seed: int = 0, current_placement=None,
                       **options) -> MicroBatchPlan:
    """Plan one optimizer step. ``pp_multiple`` makes the micro-batch count a multiple of the
    pipeline schedule (PP × VPP); ``placement`` is ``"lpt"``, ``"identity"``, ``"joint"`` or an
    [L, E] array (e.g. the placement already materialized)."""
    from routepack_opt.pipeline import plan

    if options:
        raise InputError(f"unknown option(s) {', '.join(sorted(options))}")
    window = window_from(lengths, counts, routes, num_experts)
    topo = Topology(dp=dp_size, ep=ep_size, capacity=max_tokens, min_rows=min_micro_batches,
                    row_multiple=pp_multiple)
    cm = cost if isinstance(cost, CostModel) else resolve_cost(cost)
    p = plan(window, topo, cm, objective, placement, num_micro_batches, time_limit, max_sweeps, seed,
             current_placement=current_placement)
    return _to_result(p)


class AsyncPlanner:
    """Plans the next window in the background while the current step trains.

    ``submit(...)`` starts planning (same arguments as :func:`plan_micro_batches`) with
    ``deadline`` seconds as the search's time limit; ``result()`` waits for it. If planning
    cannot finish by ``deadline + grace`` (e.g. a slow certificate), ``result()`` returns the
    length-only baseline plan computed up front, so the trainer never waits past its deadline.
    """

    def __init__(self, grace: float = 1.0):
        self.grace = grace
        self._future: Future | None = None
        self._fallback: MicroBatchPlan | None = None
        self._deadline_at = 0.0

    def submit(self, lengths, counts=None, *, deadline: float, **kwargs) -> Future:
        from routepack_opt.pipeline import baseline_layouts, layout_plan, resolve_placement

        if self._future is not None and not self._future.done():
            raise RuntimeError("AsyncPlanner: the previous window is still being planned")
        window = window_from(lengths, counts, kwargs.pop("routes", None), kwargs.pop("num_experts", None))
        fut: Future = Future()
        self._deadline_at = time.monotonic() + deadline
        # A valid fallback right away: identity/given placement + length-only packing at a
        # feasible row count (cheap: bounds + greedy).
        topo = Topology(dp=kwargs["dp_size"], ep=kwargs["ep_size"], capacity=kwargs["max_tokens"],
                        min_rows=kwargs.get("min_micro_batches", 1), row_multiple=kwargs.get("pp_multiple", 1))
        cost = kwargs.get("cost", "qwen3-30b-a3b")
        cm = cost if isinstance(cost, CostModel) else resolve_cost(cost)
        from routepack_opt.pipeline import resolve_rows

        R, cert = resolve_rows(window, topo, kwargs.get("num_micro_batches"), time_limit=min(deadline, 10.0))
        pl, _ = resolve_placement(window, topo, kwargs.get("current_placement") if kwargs.get("current_placement") is not None else "identity")
        name, (row, slot) = next(iter(baseline_layouts(window, topo, R).items()))
        self._fallback = _to_result(layout_plan(window, topo, cm, pl, row, slot, R,
                                                kwargs.get("objective", "max-sum"),
                                                {"fallback": f"deadline: baseline {name}"}, cert))
        kwargs.setdefault("num_micro_batches", R)

        def work():
            try:
                fut.set_result(plan_micro_batches(window.lengths, window.counts, time_limit=deadline, **kwargs))
            except BaseException as exc:  # delivered through result()
                fut.set_exception(exc)

        threading.Thread(target=work, name="routepack-planner", daemon=True).start()
        self._future = fut
        return fut

    def result(self) -> MicroBatchPlan:
        if self._future is None:
            raise RuntimeError("AsyncPlanner: nothing submitted")
        wait = max(0.0, self._deadline_at + self.grace - time.monotonic())
        try:
            return self._future.result(timeout=wait)
        except TimeoutError:
            return self._fallback

"""What the framework seams share: windows without routes, oversize samples, one planning call.

Legend: N samples, L MoE layers, E logical experts.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from routepack_opt.core.cost import CostModel, resolve_cost
from routepack_opt.core.errors import InputError
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.core.layout import Layout
from routepack_opt.core.objective import Objective
from routepack_opt.core.plan import Plan, assignment_from_cells
from routepack_opt.core.report import PlanReport, SearchStats
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import Window
from routepack_opt.heuristics.anneal import AnnealConfig, anneal
from routepack_opt.heuristics.placement.lpt import identity_placement
from routepack_opt.pipeline import build_plan, resolve_placement, solve

__all__ = ["length_only_window", "clip_to_cap", "plan_cells", "plan_fixed_cells", "score_cells", "as_cost",
           "PlannedCells"]


def as_cost(cost) -> CostModel:
    return cost if isinstance(cost, CostModel) else resolve_cost(cost)


def length_only_window(lengths) -> Window:
    """A window without routing replay: one layer, one expert, top-1 (``counts = lengths``). With
    ``ep = 1`` its expert term is γ·tokens of the cell, so the joint cost reduces to the
    length-only attention + linear cost every framework balances today."""
    len_N = np.asarray(lengths, dtype=np.int64).reshape(-1)
    return Window(len_N, len_N[:, None, None], top_k=1)


def clip_to_cap(window: Window, capacity: int) -> tuple[Window, np.ndarray]:
    """Samples longer than ``capacity`` planned at exactly ``capacity`` tokens (slime's rule: an
    oversize sample runs alone in its micro-batch). A cell holding a sample of length C cannot take
    another sample (every sample has ≥ 1 token), so the cap still forces it alone. Its counts are
    scaled to C tokens by largest remainder per layer (Σ_e = k·C, each ≤ C), an approximation of
    its cost only — its true cost is the same in every layout, as it is always alone.
    Returns (planning window, indices of the clipped samples)."""
    len_N = window.lengths
    over = np.flatnonzero(len_N > capacity)
    if over.size == 0:
        return window, over
    lengths = len_N.copy()
    counts = window.counts.astype(np.int64).copy()
    k = window.top_k
    for i in over:
        exact_LE = counts[i] * (capacity / len_N[i])
        base_LE = np.floor(exact_LE).astype(np.int64)
        short_L = k * capacity - base_LE.sum(axis=1)
        order_LE = np.argsort(-(exact_LE - base_LE), axis=1, kind="stable")
        for l in range(counts.shape[1]):
            base_LE[l, order_LE[l, :short_L[l]]] += 1
        counts[i] = base_LE
        lengths[i] = capacity
    return window.replace(lengths=lengths, counts=counts), over


@dataclasses.dataclass(frozen=True)
class PlannedCells:
    """``cells[r][d]``: sample indices of micro-batch r on DP rank d; the plan and its report."""

    cells: list[list[list[int]]]
    plan: Plan
    report: dict

    @property
    def rows(self) -> int:
        return self.plan.rows

    @property
    def logical_to_physical(self) -> np.ndarray:
        return self.plan.placement.first_slots

    @property
    def physical_to_logical(self) -> np.ndarray:
        return np.argsort(self.plan.placement.first_slots, axis=1).astype(np.int64)


def plan_cells(window: Window, topology: Topology, cost, *, objective: Objective = Objective.MAX_SUM,
               placement="lpt", rows: int | None = None, time_limit: float | None = None,
               max_sweeps: int | None = None, seed: int = 0, current_placement=None,
               certificate=None) -> PlannedCells:
    """One call into the pipeline; every seam plans through here (``certificate``: an R*
    certificate for ``rows`` the caller already has)."""

    if window.num_samples < topology.dp:
        raise InputError(f"{window.num_samples} samples cannot give every one of {topology.dp} DP "
                         "ranks a non-empty micro-batch")
    p = solve(window, topology, as_cost(cost), objective=objective, placement=placement, rows=rows,
              time_limit=time_limit, max_sweeps=max_sweeps, seed=seed,
              current_placement=current_placement, certificate=certificate)
    rep = p.info
    rep["score"] = p.score
    rep["certificate"] = p.certificate
    return PlannedCells(p.cells(), p, rep)


# Swaps only, no greedy seed: every move exchanges two samples' cells, so each cell keeps the
# sample count of the seed it started from (the greedy builds cells of any count).
_FIXED_COUNT_ANNEAL = AnnealConfig(p_swap=1.0, greedy_seed=False)


def plan_fixed_cells(window: Window, topology: Topology, cost, seeds: list[list[list[list[int]]]], *,
                     objective: Objective = Objective.MAX_SUM, placement="lpt", time_limit: float | None = None,
                     max_sweeps: int | None = None, seed: int = 0) -> PlannedCells:
    """Plan with every cell's sample count fixed: ``seeds`` are layouts as ``cells[r][d]`` lists
    with the same count per cell (e.g. slime's static micro-batches of ``micro_batch_size``
    samples); population annealing over swaps of samples between cells (which keep every count)
    searches the joint cost from them. The topology's ``capacity`` must not bind (a swap may
    raise a cell's tokens). The result is never worse than the best seed by the evaluator."""
    ev = Evaluator(window, topology, as_cost(cost))
    pl, kind = resolve_placement(window, topology, placement)
    R = len(seeds[0])
    arrays = [assignment_from_cells(cells, window.num_samples) for cells in seeds]
    res = anneal(window.lengths, ev.rank_loads(pl), topology, as_cost(cost), R, objective,
                 arrays, config=_FIXED_COUNT_ANNEAL, seed=seed, time_limit=time_limit,
                 max_sweeps=max_sweeps)
    found = Layout(res.row, res.slot, R)
    best = min((Layout(r, s, R) for r, s in arrays),
               key=lambda lay: ev.score_layout(pl, lay, objective).key)
    if ev.score_layout(pl, found, objective).key > ev.score_layout(pl, best, objective).key:
        found = best
    report = PlanReport(placement_kind=kind, search=SearchStats.from_anneal(res.stats))
    p = build_plan(ev, pl, found, objective, report=report)
    rep = p.info
    rep["score"] = p.score
    return PlannedCells(p.cells(), p, rep)


def score_cells(window: Window, topology: Topology, cost, cells, objective: Objective,
                placement=None) -> float:
    """The evaluator's makespan of ``cells[r][d]`` (a layout such as the framework's own) with
    ``placement`` (default: the identity, the expert order a framework leaves as it is)."""
    pl = identity_placement(window.num_layers, window.num_experts) if placement is None else placement
    row, slot = assignment_from_cells(cells, window.num_samples)
    return Evaluator(window, topology, as_cost(cost)).score_layout(pl, Layout(row, slot, len(cells)),
                                                                   objective).makespan

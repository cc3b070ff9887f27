"""What the framework seams share: windows without routes, oversize samples, one planning call.

Legend: N samples, L MoE layers, E logical experts.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from routepack_opt.core.cost import CostModel, resolve_cost
from routepack_opt.core.errors import InputError
from routepack_opt.core.plan import Plan
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import Window
from routepack_opt.pipeline import solve

__all__ = ["length_only_window", "clip_to_cap", "plan_cells", "as_cost", "PlannedCells"]


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
        return self.plan.placement

    @property
    def physical_to_logical(self) -> np.ndarray:
        return np.argsort(self.plan.placement, axis=1).astype(np.int64)


def plan_cells(window: Window, topology: Topology, cost, *, objective: str = "max-sum",
               placement="lpt", rows: int | None = None, time_limit: float | None = None,
               max_sweeps: int | None = None, seed: int = 0, current_placement=None) -> PlannedCells:
    """One call into the pipeline; every seam plans through here."""

    if window.num_samples < topology.dp:
        raise InputError(f"{window.num_samples} samples cannot give every one of {topology.dp} DP "
                         "ranks a non-empty micro-batch")
    p = solve(window, topology, as_cost(cost), objective=objective, placement=placement, rows=rows,
              time_limit=time_limit, max_sweeps=max_sweeps, seed=seed,
              current_placement=current_placement)
    rep = p.info
    rep["score"] = p.score
    rep["certificate"] = p.certificate
    return PlannedCells(p.cells(), p, rep)

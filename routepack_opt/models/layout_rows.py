"""The best row count and its layout, proved together (issue 42; docs/pipeline.md step 4).

The exact layout models fix R. Over a range of row counts, :func:`solve_best_rows` solves them
per R in ascending order with bound pruning: a count whose layout lower bound (docs/model.md;
it grows with R by ``row_overhead``) already reaches the best makespan found cannot do better
and is not solved. The best R and its layout are **proved** (status ``optimal``) when the model
at that R is proved optimal and every other count is either pruned, infeasible, or proved no
better (its model's bound reaches the best makespan, within the solvers' stated tolerance).
Every objective reported is the evaluator's makespan of the returned layout (the models'
results are re-scored by :mod:`routepack_opt.core.evaluate` inside ``solve_layout``).

With ``replicas=True`` each R is the joint layout + replica placement model
(:func:`~routepack_opt.models.layout.solve_layout_replicas`, ``topology.redundant_experts``
extra slots; with 0 a free permutation), pruned by the placement-free bound; otherwise the
layout model at the fixed ``placement``, pruned by that placement's bound.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import numpy as np

from routepack_opt.core.checks import check_time_limit
from routepack_opt.core.cost import CostModel
from routepack_opt.core.errors import InputError
from routepack_opt.core.evaluate import Evaluator, Score
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import Window

__all__ = ["RowsResult", "solve_best_rows"]


@dataclasses.dataclass(frozen=True)
class RowsResult:
    """The best (R, layout) over ``per_rows``' counts: ``objective`` the evaluator's makespan,
    ``bound`` a proved lower bound on the optimum over every count of the range, ``status``
    ``optimal`` (proved), ``feasible`` or ``infeasible`` (no count has a layout)."""

    status: str
    rows: int | None
    objective: float | None
    score: Score | None
    bound: float
    gap: float
    row: np.ndarray | None
    slot: np.ndarray | None
    placement: object  # the fixed placement, or the model's (a Placement) with replicas
    per_rows: list[dict]
    seconds: float

    def report(self) -> dict:
        return {"status": self.status, "rows": self.rows, "objective": self.objective, "bound": self.bound,
                "gap": self.gap, "seconds": self.seconds, "per_rows": self.per_rows}


def _tolerance(res) -> float:
    """How far a solver's proved bound may sit below a makespan it equals (CP-SAT's integer
    scaling, twice; a relative 1e-7 for HiGHS)."""
    return 2.0 * getattr(res, "rounding_error", 0.0) + 1e-7 * abs(res.objective or 0.0)


def solve_best_rows(window: Window, topology: Topology, cost: CostModel, rows: Sequence[int], *,
                    objective: str = "max-sum", placement=None, replicas: bool = False,
                    solver: str = "cpsat", time_limit: float = 60.0, num_workers: int = 2,
                    evaluator: Evaluator | None = None) -> RowsResult:
    """Solve the layout model (``placement`` fixed) or, with ``replicas``, the layout + replica
    placement model at each count of ``rows`` (ascending), pruning counts by their layout
    bound, within ``time_limit`` seconds in all (what is left split evenly over the counts
    still to solve). Returns the best count and layout, proved where the module docstring says."""
    from routepack_opt.models.layout import ExactOptions, solve_layout, solve_layout_replicas

    counts = sorted({int(r) for r in rows})
    if not counts or counts[0] < 1:
        raise InputError(f"rows must be a nonempty list of positive row counts, got {list(rows)!r}")
    if not replicas and placement is None:
        raise InputError("a fixed placement is needed without replicas")
    check_time_limit(time_limit)
    ev = evaluator or Evaluator(window, topology, cost)
    t0 = time.perf_counter()
    end = t0 + time_limit

    def bound_at(R: int) -> float:
        if replicas:
            return ev.placement_free_lower_bound(R, topology.redundant_experts)
        return ev.lower_bound(placement, R)

    best = None  # (score key, R, result)
    per: list[dict] = []
    for k, R in enumerate(counts):
        lb = bound_at(R)
        entry: dict = {"rows": R, "lower_bound": lb}
        per.append(entry)
        if best is not None and lb >= best[0][0]:
            entry.update(status="pruned", bound=lb)  # cannot beat the best makespan found
            continue
        if R * topology.dp > window.num_samples:
            entry.update(status="infeasible", bound=float("inf"))
            continue
        share = max(0.05, (end - time.perf_counter()) / (len(counts) - k))
        if replicas:
            res = solve_layout_replicas(window, topology, cost, R, objective, solver=solver, time_limit=share,
                                        num_workers=num_workers, evaluator=ev)
        else:
            res = solve_layout(window, topology, cost, placement, R, objective, solver=solver, time_limit=share,
                               options=ExactOptions(num_workers=num_workers), evaluator=ev)
        entry.update(status=res.status, objective=res.objective, bound=max(res.bound, lb), seconds=res.seconds,
                     tolerance=_tolerance(res) if res.objective is not None else 0.0)
        if res.status == "infeasible" or res.score is None:
            entry["bound"] = float("inf") if res.status == "infeasible" else entry["bound"]
            continue
        if best is None or res.score.key < best[0]:
            best = (res.score.key, R, res)
    seconds = time.perf_counter() - t0
    if best is None:
        return RowsResult("infeasible", None, None, None, float("inf"), float("inf"), None, None, None, per, seconds)
    key, R_best, res = best
    m = key[0]
    bound = min(min(e["bound"] for e in per), m)
    proved = all(
        e["rows"] == R_best and e["status"] == "optimal"
        or e["rows"] != R_best and (e["status"] in ("pruned", "infeasible")
                                    or e["bound"] >= m - e.get("tolerance", 0.0) - _tolerance(res))
        for e in per)
    if proved:
        bound = m  # every count proved no better than the best one
    pl = getattr(res, "placement", None) if replicas else placement
    return RowsResult("optimal" if proved else "feasible", R_best, m, res.score, bound,
                      (m - bound) / m if m > 0 else 0.0, res.row, res.slot, pl, per, seconds)

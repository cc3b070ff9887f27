"""One entry point to the exact layout models (docs/pipeline.md, step 4).

``solve_layout`` builds the instance (window, topology, cost, fixed placement, rows R, objective)
and hands it to CP-SAT (:mod:`routepack_opt.models.layout_cpsat`) or to a Pyomo MILP solved by
HiGHS (:mod:`routepack_opt.models.layout_milp`). Whatever the solver, the returned objective is
the evaluator's makespan of the returned layout, and the bound is a proved lower bound on the
optimal makespan (never below the docs/model.md bound).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from routepack_opt.core.checks import check_time_limit
from routepack_opt.core.cost import CostModel
from routepack_opt.core.errors import InputError
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.core.placement import as_placement
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import Window
from routepack_opt.models.layout_common import (
    MAX_BINARIES,
    LayoutInstance,
    LayoutResult,
    canonical_layout,
    gap_of,
    is_canonical,
    prefeasibility,
    symmetry_groups,
)
from routepack_opt.models.layout_cpsat import solve_cpsat
from routepack_opt.models.layout_dw import BlockBound, block_bound
from routepack_opt.models.layout_milp import solve_milp
from routepack_opt.models.layout_replicas import ReplicaLayoutInstance, ReplicaLayoutResult
from routepack_opt.models.layout_replicas_cpsat import solve_replica_cpsat
from routepack_opt.models.layout_replicas_milp import solve_replica_milp

__all__ = ["solve_layout", "ExactOptions", "LayoutResult", "LayoutInstance", "SOLVERS", "symmetry_groups",
           "canonical_layout", "is_canonical", "solve_layout_replicas", "ReplicaLayoutResult",
           "MAX_REPLICA_VARIABLES"]

# Split variables (cells × layers × experts × replica counts) above which the joint replica
# models refuse: they are for tiny windows (the heuristic's gap with replicas).
MAX_REPLICA_VARIABLES = 20_000

SOLVERS = ("cpsat", "highs")


@dataclasses.dataclass(frozen=True)
class ExactOptions:
    """How the exact layout model searches (the defaults are the shipped procedure)."""

    lexicographic: bool = False  # after minimising the makespan, fix it and minimise Σ J
    symmetry: bool = True  # add the symmetry-breaking constraints valid for the objective
    num_workers: int = 2  # CP-SAT search workers (HiGHS uses its own threads)
    decomposition: bool = True  # the decomposition bound (models/layout_dw.py) first
    bound_share: float = 0.25  # its share of the time limit (0.9 where the cell model is too large)

    def __post_init__(self):
        if not 0.0 < self.bound_share < 1.0:
            raise InputError(f"bound_share must be in (0, 1), got {self.bound_share!r}")


def solve_layout(window: Window, topology: Topology, cost: CostModel, placement, rows: int,
                 objective: str = "max-sum", solver: str = "cpsat", time_limit: float = 60.0,
                 warm_start=None, options: ExactOptions | None = None,
                 evaluator: Evaluator | None = None) -> LayoutResult:
    """Solve the whole layout problem at fixed ``placement`` [L, E] and ``rows`` exactly.

    ``warm_start``: a heuristic layout ``(row_N, slot_N)`` (CP-SAT hint / HiGHS MIP start).
    ``options``: lexicographic second stage, symmetry breaking, CP-SAT workers
    (:class:`ExactOptions`; default: its defaults).

    ``solver="cpsat"`` is a fixed sequence within ``time_limit`` (see
    :func:`routepack_opt.models.layout_cpsat.solve_cpsat`): with a warm start and P ≤ 2, the
    block decomposition (:mod:`routepack_opt.models.layout_blocks`) first; then one CP-SAT worker
    on the fixed heaviest-first search; then the ``num_workers`` portfolio. It proved all 36
    windows with N ≤ 24 of ``experiments/exact_study.py`` within 60 s each
    (``experiments/results/exact_study/exact_study_n24.md``). ``solver="highs"`` is the cell-level MILP alone.

    Before either, the decomposition bound (:func:`routepack_opt.models.layout_dw.block_bound`,
    ``options.bound_share`` of the time limit; ``options.decomposition=False`` leaves it out) is
    computed; the returned bound is the stronger of it and the solver's, and a decomposition
    bound that meets the incumbent proves it optimal (``info["decomposition"]`` reports it).
    At any size: a window whose cell model would exceed ``MAX_BINARIES`` binaries returns the
    warm start (status ``feasible``) with the certified bound and gap; without a warm start it
    is an :class:`InputError`.
    """
    t0 = time.perf_counter()
    options = options or ExactOptions()
    if solver not in SOLVERS:
        raise InputError(f"solver must be one of {', '.join(SOLVERS)}, got {solver!r}")
    check_time_limit(time_limit)
    topology.check_experts(window.num_experts)
    topology.check_samples(window.num_samples)  # equal_samples_per_slot needs D | N
    inst = LayoutInstance.build(window, topology, cost, placement, rows, objective, evaluator)
    if warm_start is not None:
        warm_start = _check_warm_start(inst, warm_start)
    binaries = inst.num_samples * inst.num_cells
    too_large = binaries > MAX_BINARIES
    if too_large and warm_start is None:
        raise InputError(
            f"exact layout model too large: N={inst.num_samples} samples × {inst.num_cells} cells "
            f"= {binaries} binaries > {MAX_BINARIES}; give a warm start (its bound and gap are then "
            "certified by the decomposition bound) or use `routepack plan` (the heuristic)")
    dw = None
    if options.decomposition and (too_large or prefeasibility(inst) is None):
        # with no cell model to run, the bound may take (nearly) the whole limit
        dw = block_bound(inst, (0.9 if too_large else options.bound_share) * time_limit)
    left = max(0.05 * time_limit, time_limit - (time.perf_counter() - t0))
    if too_large:  # the cell model would not even load: the warm start, with the certified bound
        res = _start_only(inst, warm_start, solver, t0, f"{binaries} binaries > {MAX_BINARIES}")
    elif solver == "cpsat":
        res = solve_cpsat(inst, left, warm_start, options.lexicographic, options.symmetry,
                          options.num_workers)
    else:
        res = solve_milp(inst, left, warm_start, options.lexicographic, options.symmetry)
    res = _never_worse_than_start(inst, res, warm_start)
    return _with_decomposition_bound(res, dw, time.perf_counter() - t0)


def _start_only(inst: LayoutInstance, warm_start, solver: str, t0: float, why: str) -> LayoutResult:
    """The result of a window too large for the cell model: the warm start, scored, with the
    docs/model.md bound (the decomposition bound is added by the caller)."""
    score = inst.score(*warm_start)
    bound = min(inst.lower_bound(), score.makespan)
    return LayoutResult(status="feasible", objective=score.makespan, bound=bound,
                        gap=gap_of(score.makespan, bound), seconds=time.perf_counter() - t0,
                        row=warm_start[0], slot=warm_start[1], score=score, solver=solver,
                        objective_name=inst.objective, rows=inst.rows,
                        info={"returned": "warm start", "model": f"skipped ({why})"})


def _with_decomposition_bound(res: LayoutResult, dw: BlockBound | None, seconds: float) -> LayoutResult:
    """The result with the decomposition bound where it is stronger (it is a proof: a bound that
    meets the incumbent proves it optimal)."""
    if dw is None or res.status == "infeasible":
        return dataclasses.replace(res, seconds=seconds)
    info = dict(res.info, decomposition=dw.report(), solver_bound=res.bound)
    bound, status = res.bound, res.status
    if dw.bound > bound:
        bound = dw.bound if res.objective is None else min(dw.bound, res.objective)
        if res.objective is not None and bound >= res.objective - 1e-9 * abs(res.objective):
            status = "optimal"
    return dataclasses.replace(res, bound=bound, gap=gap_of(res.objective, bound), status=status,
                               seconds=seconds, info=info)


def _never_worse_than_start(inst: LayoutInstance, res: LayoutResult, warm_start) -> LayoutResult:
    """Anytime guarantee: if the solver returns nothing, or a layout the evaluator scores worse
    than the warm start (beyond the rounding error), return the warm start (status feasible)."""
    if warm_start is None or res.status == "infeasible":
        return res
    start = inst.score(*warm_start)
    if res.score is not None:
        tol = 2 * res.rounding_error + 1e-9 * abs(res.score.makespan)
        if start.makespan >= res.score.makespan - tol:
            return res
    info = dict(res.info, returned="warm start")
    bound = min(res.bound, start.makespan)
    return dataclasses.replace(res, status="feasible", objective=start.makespan, score=start,
                               row=warm_start[0], slot=warm_start[1], bound=bound,
                               gap=gap_of(start.makespan, bound), info=info)


def _check_warm_start(inst: LayoutInstance, warm_start):
    """A warm start must be a feasible layout of this instance; an infeasible one is dropped
    (a hint, not a constraint), a malformed one is an input error."""
    try:
        row_N, slot_N = (np.asarray(a, dtype=np.int64) for a in warm_start)
    except (TypeError, ValueError):
        raise InputError("warm start must be a pair (row_N, slot_N) of integer arrays") from None
    if row_N.shape != (inst.num_samples,) or slot_N.shape != (inst.num_samples,):
        raise InputError(f"warm start must give a cell for each of the {inst.num_samples} samples")
    if inst.violations(row_N, slot_N):
        return None
    return row_N, slot_N


def solve_layout_replicas(window: Window, topology: Topology, cost: CostModel, rows: int,
                          objective: str = "max-sum", solver: str = "cpsat", time_limit: float = 60.0,
                          warm_start=None, symmetry: bool = True, num_workers: int = 2,
                          evaluator: Evaluator | None = None) -> ReplicaLayoutResult:
    """The layout *and* the replica placement (``topology.redundant_experts`` extra slots per layer;
    with 0 the placement is a free permutation) together, exactly, at ``rows``
    (:mod:`routepack_opt.models.layout_replicas`: replica counts and ranks are variables, the split
    is the even-local rule's, encoded exactly).

    ``warm_start``: ``(row_N, slot_N, Placement)`` (a CP-SAT hint; HiGHS gets none).
    ``num_workers``: CP-SAT workers, or HiGHS threads. Whatever the
    solver, ``objective`` is the evaluator's makespan of the returned (layout, placement), never
    worse than the warm start's (anytime), and ``bound`` a proved lower bound on the optimum over
    every layout and replica placement. For tiny windows: more than ``MAX_REPLICA_VARIABLES`` split
    variables is an :class:`InputError`."""
    if solver not in SOLVERS:
        raise InputError(f"solver must be one of {', '.join(SOLVERS)}, got {solver!r}")
    check_time_limit(time_limit)
    topology.check_samples(window.num_samples)
    inst = ReplicaLayoutInstance.build_replicas(window, topology, cost, rows, objective, evaluator)
    size = inst.num_cells * window.num_layers * window.num_experts * inst.nmax
    if inst.num_samples * inst.num_cells > MAX_BINARIES or size > MAX_REPLICA_VARIABLES:
        raise InputError(
            f"exact replica model too large: {inst.num_cells} cells × L={window.num_layers} × "
            f"E={window.num_experts} × {inst.nmax} replica counts = {size} split variables "
            f"(at most {MAX_REPLICA_VARIABLES}); it is for tiny windows, use `routepack plan "
            f"--redundant-experts` (the heuristic) instead")
    start = None
    if warm_start is not None:
        start = _check_replica_start(inst, warm_start)
    if solver == "cpsat":
        res = solve_replica_cpsat(inst, time_limit, start, symmetry, num_workers)
    else:
        res = solve_replica_milp(inst, time_limit, symmetry, threads=num_workers)
    if start is None or res.status == "infeasible":
        return res
    score = inst.score(*start)
    if res.score is not None and score.makespan >= res.score.makespan - 2 * res.rounding_error \
            - 1e-9 * abs(res.score.makespan):
        return res
    bound = min(res.bound, score.makespan)
    return dataclasses.replace(res, status="feasible", objective=score.makespan, score=score, row=start[0],
                               slot=start[1], placement=start[2], bound=bound,
                               gap=gap_of(score.makespan, bound), info=dict(res.info, returned="warm start"))


def _check_replica_start(inst: ReplicaLayoutInstance, warm_start):
    """A warm start (row_N, slot_N, Placement) that breaks a rule is dropped (a hint, not a
    constraint); a malformed one is an input error."""
    try:
        row_N, slot_N, pl = warm_start
        row_N, slot_N = np.asarray(row_N, dtype=np.int64), np.asarray(slot_N, dtype=np.int64)
    except (TypeError, ValueError):
        raise InputError("warm start must be (row_N, slot_N, Placement)") from None
    pl = as_placement(pl, inst.topology.ep, "warm start")  # a permutation: outside the model below
    if row_N.shape != (inst.num_samples,) or slot_N.shape != (inst.num_samples,):
        raise InputError(f"warm start must give a cell for each of the {inst.num_samples} samples")
    ranks = pl.replica_ranks().reshape(-1, pl.replica_ranks().shape[-1])
    distinct = all(len(set(r[r >= 0].tolist())) == int((r >= 0).sum()) for r in ranks)
    if (pl.ep != inst.topology.ep or pl.redundant != inst.redundant or pl.num_experts != inst.window.num_experts
            or not distinct):  # outside the model (replicas of one expert share a rank)
        return None
    if inst.violations(row_N, slot_N, pl):
        return None
    return row_N, slot_N, pl

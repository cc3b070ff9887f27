"""The best row count proved together with its layout (issue 42): the exact models (CP-SAT and
Pyomo/HiGHS, both objectives, fixed placement and with replicas) solved per R with bound pruning
against brute force over every R and every layout; objectives re-scored by the evaluator."""

import functools

import numpy as np
import pytest

from routepack_opt.core.cost import CostModel, Stage
from routepack_opt.core.errors import InputError
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.core.testing import random_window
from routepack_opt.core.topology import Topology
from routepack_opt.models.brute import brute_force_layout
from routepack_opt.models.layout import LayoutInstance
from routepack_opt.models.layout_replicas import ReplicaLayoutInstance, brute_force_replica_layout
from routepack_opt.models.layout_rows import solve_best_rows

# quadratic attention and a small overhead: more rows than the fewest can pay
COST = CostModel((Stage("attn", 0.02, 4e-3),), gamma=0.3, row_overhead=1.0)
OBJECTIVES = ("max-sum", "sum-max")
# (N, dp, ep, capacity, seed, rows range): every count of the range brute-forced
CASES = [
    (7, 2, 2, 60, 0, (2, 3)),
    (7, 2, 1, 70, 3, (2, 3)),
    (6, 2, 2, 45, 5, (2, 3)),
]


def _window(case):
    N, D, P, C, seed, _ = case
    return random_window(N, 2, 4, 2, max_len=40, min_len=8, seed=seed), Topology(dp=D, ep=P, capacity=C)


@functools.cache
def _brute_best(case, objective, cost=COST):
    w, topo = _window(case)
    pl = np.tile(np.arange(4), (2, 1))
    per = {}
    for R in case[5]:
        b = brute_force_layout(LayoutInstance.build(w, topo, cost, pl, R, objective))
        if b.score is not None:
            per[R] = b.score.makespan
    return per


@pytest.mark.parametrize("solver", ["cpsat", "highs"])
@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("case", CASES)
def test_best_rows_equals_brute_force(case, objective, solver):
    """Proved optimal, the best makespan over the range equals brute force's, at a count whose
    brute-force optimum is that makespan; the objective is the evaluator's of the layout."""
    w, topo = _window(case)
    pl = np.tile(np.arange(4), (2, 1))
    got = solve_best_rows(w, topo, COST, case[5], objective=objective, placement=pl, solver=solver,
                          time_limit=60.0)
    per = _brute_best(case, objective)
    best = min(per.values())
    tol = 1e-6 * best + 1e-6
    assert got.status == "optimal" and got.objective == pytest.approx(best, abs=tol)
    assert per[got.rows] == pytest.approx(best, abs=tol)
    ev = Evaluator(w, topo, COST).score(pl, got.row, got.slot, got.rows, objective)
    assert ev.makespan == got.objective and got.bound <= got.objective + tol
    for e in got.per_rows:  # a pruned count's bound is at or above the best, and below its optimum
        if e["status"] == "pruned":
            assert e["lower_bound"] >= got.objective and e["lower_bound"] <= per[e["rows"]] + tol


def test_some_case_prefers_more_rows_than_the_fewest():
    """The cases are meaningful: on at least one, brute force's best count is above the range's
    least (the least feasible here)."""
    assert any(min(per := _brute_best(c, o), key=lambda r: (per[r], r)) > c[5][0] for c in CASES for o in OBJECTIVES)


def test_dear_overhead_prunes_and_proves_the_fewest():
    """With a per-micro-batch overhead far above any balance gain, every count above the first
    is pruned by its bound and the fewest is proved best."""
    case = CASES[1]
    w, topo = _window(case)
    pl = np.tile(np.arange(4), (2, 1))
    dear = CostModel((Stage("attn", 0.02, 4e-3),), gamma=0.3, row_overhead=1e4)
    got = solve_best_rows(w, topo, dear, (2, 3), placement=pl, time_limit=30.0)
    assert got.status == "optimal" and got.rows == 2
    assert [e["status"] for e in got.per_rows[1:]] == ["pruned"]


# (N, L, E, top_k, dp, ep, redundant, capacity, seed, rows range)
REPLICA_CASES = [  # one case: the replica models take ~10 s a count on a shared 2-core host
    (5, 1, 3, 1, 2, 2, 1, 30, 0, (1, 2)),
]


@pytest.mark.parametrize("solver", ["cpsat", "highs"])
@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("case", REPLICA_CASES)
def test_best_rows_with_replicas_equals_brute_force(case, objective, solver):
    """With replicas: the best (R, layout, replica placement) over the range equals brute force
    over every count, layout and placement; the objective is the evaluator's."""
    N, L, E, k, D, P, red, C, seed, rows = case
    w = random_window(N, L, E, k, max_len=30, seed=seed, skew=2.0)
    topo = Topology(dp=D, ep=P, capacity=C, redundant_experts=red)
    cost = CostModel((Stage("attn", 0.01, 4e-3),), gamma=1.0, row_overhead=0.5)
    per = {}
    for R in rows:
        b = brute_force_replica_layout(ReplicaLayoutInstance.build_replicas(w, topo, cost, R, objective))
        if b.score is not None:
            per[R] = b.score.makespan
    best = min(per.values())
    got = solve_best_rows(w, topo, cost, rows, objective=objective, replicas=True, solver=solver, time_limit=60.0)
    tol = 1e-6 * best + 1e-6
    assert got.status == "optimal" and got.objective == pytest.approx(best, abs=tol)
    assert per[got.rows] == pytest.approx(best, abs=tol)
    assert Evaluator(w, topo, cost).score(got.placement, got.row, got.slot, got.rows, objective).makespan == got.objective


def test_bad_rows_refused():
    w, topo = _window(CASES[0])
    with pytest.raises(InputError, match="rows"):
        solve_best_rows(w, topo, COST, [], placement=np.tile(np.arange(4), (2, 1)))
    with pytest.raises(InputError, match="placement"):
        solve_best_rows(w, topo, COST, [2])

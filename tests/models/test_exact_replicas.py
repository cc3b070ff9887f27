"""Exact replica placement at a fixed layout (issue 26): CP-SAT under the even-local rule equals
brute force over every placement, and the heuristic never beats the proved bound."""

import numpy as np
import pytest

from routepack_opt.core.cost import CostModel, Stage
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.core.layout import Layout
from routepack_opt.core.testing import random_layout, random_window
from routepack_opt.core.topology import Topology
from routepack_opt.models.replica_placement import brute_force_replicas, solve_replicas_cpsat

COST = CostModel((Stage("attn", 0.01, 1e-4),), gamma=1.0, row_overhead=2.0)


@pytest.mark.parametrize("seed,objective,G", [(0, "max-sum", 1), (1, "sum-max", 1), (2, "max-sum", 2)])
def test_cpsat_replicas_equal_brute_force(seed, objective, G):
    """On tiny windows (E=3, P=2, one redundant slot; one or two shards) CP-SAT's optimum equals
    the brute-force optimum over every replica placement, both scored by the evaluator."""
    rng = np.random.default_rng(seed)
    w = random_window(num_samples=10, num_layers=1, num_experts=3, top_k=1, max_len=30, seed=seed, skew=2.0)
    topo = Topology(dp=2 * G, ep=2, capacity=1000, redundant_experts=1)
    row, slot = random_layout(10, 2, 2 * G, rng)
    lay = Layout(row, slot, 2)
    best, _ = brute_force_replicas(w, topo, COST, lay, objective)
    res = solve_replicas_cpsat(w, topo, COST, lay, objective, time_limit=20)
    assert res.status == "optimal"
    assert res.objective == pytest.approx(best, rel=1e-9)
    assert res.bound <= best + 1e-6
    assert Evaluator(w, topo, COST).score_layout(res.placement, lay, objective).makespan == res.objective


def test_heuristic_replicas_never_beat_the_bound():
    """The planner's replicated plan, at its own layout, is no better than the exact optimum."""
    from routepack_opt.pipeline import solve

    w = random_window(num_samples=12, num_layers=1, num_experts=4, top_k=2, max_len=40, seed=5, skew=2.0)
    topo = Topology(dp=2, ep=2, capacity=400)
    p = solve(w, topo, COST, max_sweeps=2, seed=0, redundant_experts=2)
    res = solve_replicas_cpsat(w, p.topology, COST, p.layout, time_limit=20, hint=p.replicas)
    assert res.status == "optimal"
    assert p.score["makespan"] >= res.bound - 1e-6
    assert res.objective <= p.score["makespan"] + 1e-6

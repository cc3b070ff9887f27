"""Test instances shared by several test modules (the annealer's and the exact layout models'),
in one place instead of tests importing each other."""

from __future__ import annotations

import numpy as np

from routepack_opt.core.cost import CostModel, Stage
from routepack_opt.core.evaluate import rank_loads
from routepack_opt.core.testing import random_window
from routepack_opt.core.topology import Topology
from routepack_opt.models.layout import LayoutInstance

# Hybrid-attention cost with a noticeable quadratic term and row overhead: every part of J counts.
COST = CostModel(stages=(Stage("lin", 0.02, 0.0), Stage("full", 0.01, 2e-4)), gamma=0.05,
                 row_overhead=3.0)

# (dp, ep, shard_of_slot, experts, rows): G = 1, G = 2 custom interleaved, G = 3, P = 1, P > 8.
TOPOLOGIES = [
    (4, 4, None, 8, 3),
    (4, 2, (0, 1, 1, 0), 8, 3),
    (6, 2, (2, 0, 1, 1, 0, 2), 4, 2),
    (3, 1, None, 3, 4),
    (10, 10, None, 10, 2),
]


def instance(topo_spec, seed, n=40, layers=3, max_len=30):
    dp, ep, sos, E, R = topo_spec
    w = random_window(n, layers, E, 2, max_len=max_len, seed=seed)
    # capacity with some slack over the mean load of a cell, so moves are often feasible
    C = int(max(w.lengths.max(), 1.6 * w.lengths.sum() / (R * dp)))
    topo = Topology(dp=dp, ep=ep, capacity=C, shard_of_slot=sos)
    rng = np.random.default_rng(seed)
    pl = np.stack([rng.permutation(E) for _ in range(layers)])
    b = rank_loads(w.counts, pl, ep)
    return w, topo, pl, b, R


def check_deltas_against_evaluator(w, b, topo, R, objective, pop, cfg, steps=200):
    """Step replica 0 of ``pop`` one proposal at a time at T = ∞ (every evaluated proposal is
    accepted) and check each move's (Δmakespan, Δtotal, Δpeak) and the state after it against a
    full re-evaluation by the evaluator. Returns how many moves were checked."""
    import pytest

    from routepack_opt.core.evaluate import row_shard_costs, score_from_J
    from routepack_opt.heuristics.anneal.moves import run_one

    before = score_from_J(row_shard_costs(w.lengths, b, *pop.layout(0), R, topo, COST), objective)
    checked = 0
    for _ in range(steps):
        n_eval = pop.walk.counters[0, 0]
        run_one(pop, 1, np.inf, cfg)
        if pop.walk.counters[0, 0] == n_eval:
            continue  # proposal was infeasible (capacity / nonempty / same cell / no partner)
        J = row_shard_costs(w.lengths, b, *pop.layout(0), R, topo, COST)
        after = score_from_J(J, objective)
        d = pop.walk.last[0]
        scale = max(1.0, abs(before.makespan))
        assert d[0] == pytest.approx(after.makespan - before.makespan, abs=1e-9 * scale)
        assert d[1] == pytest.approx(after.total - before.total, abs=1e-9 * scale)
        assert d[2] == pytest.approx(after.peak - before.peak, abs=1e-9 * scale)
        # the maintained state is the evaluator's, to rounding
        np.testing.assert_array_equal(pop.state.J[0], J.ravel())
        assert pop.state.agg[0, 0] == pytest.approx(after.makespan, rel=1e-12)
        assert pop.state.agg[0, 1] == pytest.approx(after.total, rel=1e-12)
        assert pop.state.agg[0, 2] == after.peak
        before = after
        checked += 1
    return checked


def feasible_layout(lengths, topo, R, rng):
    """Random feasible layout: one sample per cell, then the rest first-fit in random order."""
    N, D, C = lengths.size, topo.dp, topo.capacity
    order = rng.permutation(N)
    cells = R * D
    row = np.empty(N, np.int64)
    slot = np.empty(N, np.int64)
    load = np.zeros(cells, np.int64)
    for t, i in enumerate(order):
        if t < cells:
            c = t
        else:
            fits = np.flatnonzero(load + lengths[i] <= C)
            c = int(rng.choice(fits))
        load[c] += lengths[i]
        row[i], slot[i] = divmod(c, D)
    return row, slot


TOY = CostModel(stages=(Stage("linear", 0.3, 0.0), Stage("full", 0.05, 0.01)), gamma=0.2,
                row_overhead=5.0)

def layout_instance(case, objective, cost=TOY, layers=2, experts=4):
    N, D, P, R, C, seed = case
    w = random_window(N, layers, experts, 2, 20, seed)
    topo = Topology(D, P, C)
    placement = np.tile(np.arange(experts), (layers, 1))
    return LayoutInstance.build(w, topo, cost, placement, R, objective)

"""Joint placement/packing search: never worse than its start, valid, deterministic, sticky
under expensive migration; its score re-scored by the evaluator."""

import numpy as np
import pytest

from routepack_opt.core.cost import CostModel, Stage
from routepack_opt.core.evaluate import Evaluator, row_shard_costs, score_from_J
from routepack_opt.core.plan import Plan, check_placement
from routepack_opt.core.testing import random_layout, random_window
from routepack_opt.core.topology import Topology
from routepack_opt.heuristics.placement.joint import JointConfig, joint_search
from routepack_opt.heuristics.placement.lpt import lpt_placement

COST = CostModel((Stage("a", 0.3, 0.01),), gamma=0.7, row_overhead=5.0, expert_bytes=100.0,
                 migration_bandwidth=30.0)
OBJECTIVES = ("max-sum", "sum-max")


def hill_packer(window, topo, cost, rows, objective, iters=150):
    """Stand-in packer for tests: seeded first-improvement sample swaps (keeps every cell
    nonempty; capacity is not binding in these cases)."""

    def pack(b, seeds, seed, time_limit):
        rng = np.random.default_rng(seed)
        row, slot = (np.asarray(a).copy() for a in seeds[0])

        def key(r, s):
            return score_from_J(row_shard_costs(window.lengths, b, r, s, rows, topo, cost), objective).key

        k = key(row, slot)
        for _ in range(iters):
            i, j = rng.choice(len(row), 2, replace=False)
            r2, s2 = row.copy(), slot.copy()
            r2[i], r2[j], s2[i], s2[j] = row[j], row[i], slot[j], slot[i]
            k2 = key(r2, s2)
            if k2 < k:
                row, slot, k = r2, s2, k2
        return row, slot

    return pack


def _case(seed, N=40, L=3, E=8, P=2, G=2, R=3):
    rng = np.random.default_rng(seed)
    w = random_window(N, L, E, 2, 30, seed=seed, skew=1.5)
    topo = Topology(dp=P * G, ep=P, capacity=10_000)
    row, slot = random_layout(N, R, P * G, rng)
    return w, topo, row, slot, R, lpt_placement(w.expert_loads(), P), rng


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_joint_never_worse_valid_and_rescored(objective):
    """The joint result is a valid plan, never worse than (placement0, layout0), and its score
    equals the evaluator's."""
    for seed in range(3):
        w, topo, row, slot, R, pl, _ = _case(seed)
        pk = hill_packer(w, topo, COST, R, objective)
        res = joint_search(w, topo, COST, R, objective, pl, (row, slot), seed=seed, packer=pk)
        plan = Plan(topology=topo, rows=R, placement=res.placement, row=res.row, slot=res.slot,
                    objective=objective)
        assert plan.validate(w) == []
        ev = Evaluator(w, topo, COST)
        start = ev.score(pl, row, slot, R, objective)
        assert res.score == ev.score(res.placement, res.row, res.slot, R, objective)
        assert res.score.key <= start.key
        assert res.objective_value == res.score.makespan  # no current placement: no migration term
        assert res.stats["lower_bound"] <= res.score.makespan * (1 + 1e-12)


def test_joint_deterministic():
    """Same seed and budget (no time limit) → bit-identical result."""
    w, topo, row, slot, R, pl, rng = _case(3)
    cur = np.stack([rng.permutation(8) for _ in range(3)])
    runs = [joint_search(w, topo, COST, R, "sum-max", pl, (row, slot), seed=7, current_placement=cur,
                         packer=hill_packer(w, topo, COST, R, "sum-max")) for _ in range(2)]
    assert runs[0].placement == runs[1].placement
    assert (runs[0].row == runs[1].row).all() and (runs[0].slot == runs[1].slot).all()
    assert runs[0].objective_value == runs[1].objective_value


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_sticky_keeps_current_when_moving_does_not_pay(objective):
    """With migration far dearer than any gain, the sticky search keeps the current placement
    (nothing moves); its value is no worse than staying."""
    w, topo, row, slot, R, pl, rng = _case(4)
    dear = CostModel(COST.stages, gamma=COST.gamma, row_overhead=COST.row_overhead,
                     expert_bytes=1e12, migration_bandwidth=1.0)
    cur = np.stack([rng.permutation(8) for _ in range(3)])
    res = joint_search(w, topo, dear, R, objective, pl, (row, slot), seed=0, current_placement=cur,
                       packer=hill_packer(w, topo, dear, R, objective))
    assert res.migration.experts_moved == 0 and (res.placement.permutation() == cur).all()
    assert res.stats["start"] in ("stay", "from-current")


def test_sticky_value_is_makespan_plus_migration():
    """With cheap migration the search may move; its objective value is makespan + migration
    time, no worse than the 'stay' start."""
    w, topo, row, slot, R, pl, rng = _case(5)
    cur = np.stack([rng.permutation(8) for _ in range(3)])
    res = joint_search(w, topo, COST, R, "max-sum", pl, (row, slot), seed=0, current_placement=cur,
                       packer=hill_packer(w, topo, COST, R, "max-sum"))
    assert res.objective_value == pytest.approx(res.score.makespan + res.migration.time_us, rel=1e-12)
    assert res.objective_value <= res.stats["starts"]["stay"]["key"][0] + 1e-9
    assert check_placement(res.placement.permutation(), 3, 8) == []


def test_joint_with_annealer():
    """Integration with the population annealer (small fixed budget): valid, never worse."""
    from routepack_opt.heuristics.anneal import AnnealConfig
    w, topo, row, slot, R, pl, _ = _case(6, N=48, L=2, E=8, P=2, G=2, R=3)
    cfg = JointConfig(anneal_sweeps=2)
    from routepack_opt.heuristics.placement.joint import anneal_packer
    pk = anneal_packer(w, topo, COST, R, "max-sum",
                       config=AnnealConfig(population=4, temperatures=4, sweeps=2),
                       max_sweeps=2)
    res = joint_search(w, topo, COST, R, "max-sum", pl, (row, slot), seed=1, config=cfg, packer=pk)
    ev = Evaluator(w, topo, COST)
    assert res.score.key <= ev.score(pl, row, slot, R, "max-sum").key
    assert Plan(topology=topo, rows=R, placement=res.placement, row=res.row, slot=res.slot,
                objective="max-sum").validate(w) == []

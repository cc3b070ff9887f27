"""Row-aware placement refinement: exact incremental keys, invariants, monotonicity, and the
exact per-layer CP-SAT model against brute force (and the local search against it)."""

import numpy as np
import pytest

from routepack_opt.core.cost import CostModel, Stage
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.core.plan import check_placement
from routepack_opt.core.testing import random_layout, random_window
from routepack_opt.core.topology import Topology
from routepack_opt.heuristics.placement.migration import migration_cost
from routepack_opt.heuristics.placement.refine import (
    RefineConfig,
    RowAwareState,
    refine_placement,
    row_shard_expert_loads,
)
from routepack_opt.models.placement_rowaware import (
    brute_force_layer,
    layer_gaps,
    layer_objective,
    layer_problem,
    solve_layer_cpsat,
)

COST = CostModel((Stage("lin", 0.3, 0.0), Stage("full", 0.1, 0.01)), gamma=0.7, row_overhead=5.0,
                 expert_bytes=100.0, migration_bandwidth=30.0)
OBJECTIVES = ("max-sum", "sum-max")


def _case(seed, N=40, L=3, E=8, P=2, G=2, R=3, skew=1.5):
    rng = np.random.default_rng(seed)
    w = random_window(N, L, E, 2, 30, seed=seed, skew=skew)
    topo = Topology(dp=P * G, ep=P, capacity=10_000)
    row, slot = random_layout(N, R, P * G, rng)
    pl = np.stack([rng.permutation(E) for _ in range(L)])
    return w, topo, row, slot, R, pl, rng


def test_expert_loads_match_definition():
    """V[l,e,k] equals the plain sum of counts over the samples of (row, shard) k."""
    w, topo, row, slot, R, _, _ = _case(0, G=3)
    V = row_shard_expert_loads(w.counts, row, slot, R, topo)
    k = row * topo.num_shards + topo.shard_array()[slot]
    for kk in range(R * topo.num_shards):
        assert (V[:, :, kk] == w.counts[k == kk].sum(axis=0)).all()


@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("with_current", [False, True])
def test_swap_key_equals_evaluator(objective, with_current):
    """Randomised: every swap's incremental key equals the evaluator's score (+ migration time)
    of the swapped placement, and applying it keeps the state exact."""
    for seed in range(3):
        w, topo, row, slot, R, pl, rng = _case(seed, E=12, P=3, G=2)
        cur = np.stack([rng.permutation(12) for _ in range(3)]) if with_current else None
        st = RowAwareState(w, topo, COST, pl, row, slot, R, objective, current_placement=cur)
        ev = Evaluator(w, topo, COST)
        for _ in range(60):
            l = int(rng.integers(3))
            a, b = (int(x) for x in rng.choice(12, 2, replace=False))
            if st.rank_LE[l, a] == st.rank_LE[l, b]:
                continue
            k_try = st.try_swap(l, a, b)
            st.swap(l, a, b)
            P_new = st.placement()
            s = ev.score(P_new, row, slot, R, objective)
            mig = migration_cost(cur, P_new, topo, COST).time_us if with_current else 0.0
            want = (s.makespan + mig, s.total, s.peak)
            assert np.allclose(k_try, want, rtol=1e-12, atol=0)
            assert np.allclose(st.key(), want, rtol=1e-12, atol=0)


@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("with_current", [False, True])
def test_each_accepted_swap_claims_the_evaluators_key(objective, with_current):
    """The search's own moves: after every layer scan the key the kernel claims for the swaps it
    accepted equals the evaluator's score (+ migration time) of the placement they leave, to
    1e-12 relative (the search sums the blocks in block order, the evaluator pairwise)."""
    for seed in range(3):
        w, topo, row, slot, R, pl, rng = _case(seed, E=12, P=3, G=2, L=3)
        cur_pl = np.stack([rng.permutation(12) for _ in range(3)]) if with_current else None
        st = RowAwareState(w, topo, COST, pl, row, slot, R, objective, current_placement=cur_pl)
        ev = Evaluator(w, topo, COST)
        cur = np.array(st.key(), dtype=np.float64)
        swaps = 0
        for _ in range(2):
            for l in rng.permutation(3):
                n = st.scan_layer(int(l), rng.permutation(12).astype(np.int64), cur)
                swaps += n
                s = ev.score(st.placement(), row, slot, R, objective)
                mig = migration_cost(cur_pl, st.placement(), topo, COST).time_us if with_current else 0.0
                assert np.allclose(cur, (s.makespan + mig, s.total, s.peak), rtol=1e-12, atol=0)
        assert swaps > 0


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_refine_invariants_and_monotone(objective):
    """The refinement keeps every π[l] a permutation with E/P experts per rank, is never worse
    than its start (by the evaluator) and is deterministic for a seed."""
    for seed in range(4):
        w, topo, row, slot, R, pl, _ = _case(seed, E=16, P=4, G=2, L=4)
        res = refine_placement(w, topo, COST, pl, row, slot, R, objective, seed=seed)
        assert check_placement(res.placement, 4, 16) == []
        for l in range(4):
            assert np.bincount(res.placement[l] // 4, minlength=4).tolist() == [4] * 4
        ev = Evaluator(w, topo, COST)
        start = ev.score(pl, row, slot, R, objective).key
        end = ev.score(res.placement, row, slot, R, objective)
        assert end.key <= start or np.allclose(end.key, start, rtol=1e-12)
        assert np.allclose(end.key, res.key, rtol=1e-12)
        again = refine_placement(w, topo, COST, pl, row, slot, R, objective, seed=seed)
        assert (again.placement == res.placement).all() and again.key == res.key


def test_refine_keeps_slots_of_unmoved_experts():
    """Experts whose rank does not change keep their slot of the start placement."""
    w, topo, row, slot, R, pl, _ = _case(5, E=16, P=4, L=4)
    res = refine_placement(w, topo, COST, pl, row, slot, R, "max-sum")
    same_rank = (res.placement // 4) == (pl // 4)
    assert (res.placement[same_rank] == pl[same_rank]).all()


def test_expensive_migration_keeps_current():
    """When one move costs more than any gain, the migration-aware refinement moves nothing."""
    w, topo, row, slot, R, pl, _ = _case(6, E=16, P=4, L=4)
    dear = CostModel(COST.stages, gamma=COST.gamma, row_overhead=COST.row_overhead,
                     expert_bytes=1e12, migration_bandwidth=1.0)
    res = refine_placement(w, topo, dear, pl, row, slot, R, "max-sum", current_placement=pl)
    assert (res.placement == pl).all() and res.swaps == 0
    free = refine_placement(w, topo, COST, pl, row, slot, R, "max-sum",
                            config=RefineConfig(migration_weight=0.0), current_placement=pl)
    plain = refine_placement(w, topo, COST, pl, row, slot, R, "max-sum")
    assert free.score.key == plain.score.key


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_cpsat_layer_equals_brute_force_and_bounds_local_search(objective):
    """Tiny cases: the exact per-layer CP-SAT optimum equals brute force; its proved bound is
    below the local search's per-layer value (the local search is within the proved gap)."""
    shapes = [(6, 2), (8, 2), (6, 3), (8, 4), (9, 3)]
    for seed, (E, P) in enumerate(shapes):
        w, topo, row, slot, R, pl, _ = _case(seed, N=30, L=2, E=E, P=P, G=2, R=2)
        res = refine_placement(w, topo, COST, pl, row, slot, R, objective, seed=seed)
        st = RowAwareState(w, topo, COST, res.placement, row, slot, R, objective)
        for l in range(2):
            prob = layer_problem(st, l)
            bf, bf_ranks = brute_force_layer(prob)
            assert layer_objective(prob, bf_ranks) == bf
            cp = solve_layer_cpsat(prob, time_limit=10)
            assert cp.status == "optimal"
            assert cp.objective == pytest.approx(bf, rel=1e-12)
            assert cp.bound <= bf + 1e-9 and cp.bound >= bf * (1 - 1e-6)
            ls = layer_objective(prob, st.rank_LE[l])
            assert ls >= cp.bound - 1e-9
            assert ls == pytest.approx(st.key()[0], rel=1e-12)
        gaps = layer_gaps(st, time_limit=10)
        assert all(g["gap"] >= -1e-9 for g in gaps)

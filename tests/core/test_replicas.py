"""Expert replicas (issue 26): the Placement type, the even-local replica rule as the evaluator
scores it, the bounds that apply with replicas, and the plan file round trip."""

import json

import numpy as np
import pytest

from routepack_opt.core.cost import CostModel, Stage
from routepack_opt.core.errors import InputError
from routepack_opt.core.evaluate import Evaluator, replica_block_W
from routepack_opt.core.layout import Layout
from routepack_opt.core.placement import Placement, split_counts
from routepack_opt.core.plan import Plan
from routepack_opt.core.testing import random_layout, random_window
from routepack_opt.core.topology import Topology

COST = CostModel((Stage("attn", 0.5, 1e-3),), gamma=2.0, row_overhead=3.0, expert_bytes=1000.0)


def _random_placement(L, E, P, red, rng) -> Placement:
    """Every expert once, then ``red`` extra replicas of random experts, slots shuffled."""
    rows = []
    for _ in range(L):
        extra = rng.integers(0, E, size=red)
        rows.append(rng.permutation(np.concatenate([np.arange(E), extra])))
    return Placement(np.array(rows), P, E)


def _reference_W(window, placement: Placement, row_N, slot_N, rows, topo) -> np.ndarray:
    """Brute force: for every cell, sum its counts per expert, split them by split_counts over
    the replicas (ascending slots), add to the replicas' ranks."""
    P, G, L, E = topo.ep, topo.num_shards, window.num_layers, window.num_experts
    W = np.zeros((rows, G, L, P), dtype=np.int64)
    q_of = {int(d): j for g in range(G) for j, d in enumerate(topo.slots_of_shard()[g])}
    M = placement.slots_per_rank
    for r in range(rows):
        for d in range(topo.dp):
            members = np.flatnonzero((row_N == r) & (slot_N == d))
            c_LE = window.counts[members].sum(axis=0)
            g = topo.shard_of_slot[d]
            for l in range(L):
                for e in range(E):
                    slots = np.flatnonzero(placement.phy2log[l] == e)
                    for s, amount in zip(slots, split_counts(c_LE[l, e], len(slots), q_of[d])):
                        W[r, g, l, s // M] += amount
    return W.reshape(rows * G, L * P)


def test_split_counts_is_even_and_rotates():
    """The rule sends ⌊c/k⌋ or ⌈c/k⌉ to each replica, sums to c, and the remainder's replicas
    rotate with the source's EP rank."""
    for c in range(0, 12):
        for k in range(1, 5):
            for q in range(6):
                got = split_counts(c, k, q)
                assert sum(got) == c and max(got) - min(got) <= (1 if c % k else 0)
    assert split_counts(5, 3, 0) == [2, 2, 1]
    assert split_counts(5, 3, 1) == [1, 2, 2]
    assert split_counts(5, 3, 2) == [2, 1, 2]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_replica_block_loads_match_brute_force(seed):
    """The compiled W under the even-local rule equals a per-cell Python reference, on two shards
    with a custom slot order."""
    rng = np.random.default_rng(seed)
    w = random_window(num_samples=14, num_layers=2, num_experts=6, top_k=2, max_len=9, seed=seed)
    topo = Topology(dp=4, ep=2, capacity=100, shard_of_slot=(1, 0, 0, 1), redundant_experts=4)
    pl = _random_placement(2, 6, 2, 4, rng)
    row, slot = random_layout(14, 2, 4, rng)
    got = replica_block_W(w.counts, pl, row, slot, 2, topo)
    assert np.array_equal(got, _reference_W(w, pl, row, slot, 2, topo))
    ev = Evaluator(w, topo, COST)
    W = ev.block_loads(pl, row, slot, 2)
    assert W.reshape(2 * 2, 2, 2).sum(axis=(0, 2)).tolist() == w.expert_loads().sum(axis=1).tolist()


def test_permutation_placement_scores_like_the_array():
    """A Placement without replicas scores exactly as today's permutation array (same J, bounds)."""
    rng = np.random.default_rng(5)
    w = random_window(num_samples=20, num_layers=3, num_experts=8, top_k=2, max_len=12, seed=5)
    topo = Topology(dp=4, ep=2, capacity=200)
    perm = np.stack([rng.permutation(8) for _ in range(3)])
    pl = Placement.from_permutation(perm, 2)
    assert np.array_equal(pl.permutation(), perm) and pl.is_permutation
    assert pl.logcnt.max() == 1
    row, slot = random_layout(20, 3, 4, rng)
    ev = Evaluator(w, topo, COST)
    a, b = ev.evaluate(perm, row, slot, 3), ev.evaluate(pl, row, slot, 3)
    assert np.array_equal(a.J, b.J) and a.lower_bound == b.lower_bound
    # the replica kernel with logcnt = 1 agrees with the permutation projection too
    assert np.array_equal(replica_block_W(w.counts, pl, row, slot, 3, topo), ev.block_loads(perm, row, slot, 3))


def test_bounds_hold_with_replicas():
    """With replicas, the makespan never falls below the force-balanced bound or the replica-aware
    placement-free bound, and the force-balanced bound is the weakest of them."""
    rng = np.random.default_rng(7)
    w = random_window(num_samples=24, num_layers=2, num_experts=4, top_k=2, max_len=15, seed=7, skew=2.0)
    topo = Topology(dp=4, ep=4, capacity=500, redundant_experts=4)
    ev = Evaluator(w, topo, COST)
    for _ in range(20):
        pl = _random_placement(2, 4, 4, 4, rng)
        row, slot = random_layout(24, 2, 4, rng)
        e = ev.evaluate(pl, row, slot, 2)
        assert e.force_balanced_lower_bound <= e.placement_free_lower_bound + 1e-9
        for obj in e.scores.values():
            assert obj.makespan >= e.lower_bound - 1e-9
        assert e.redundant_experts == 4 and e.replica_bytes_per_rank == 1000.0
        assert 1.0 <= e.imbalance.median <= e.imbalance.max


def test_surrogate_is_close_to_the_fractional_split():
    """The search's surrogate b is within half a token per (sample, layer, rank) of the exact
    fractional spread c·n_p/k."""
    rng = np.random.default_rng(3)
    w = random_window(num_samples=10, num_layers=2, num_experts=6, top_k=3, max_len=30, seed=3)
    pl = _random_placement(2, 6, 3, 3, rng)
    topo = Topology(dp=3, ep=3, capacity=100, redundant_experts=3)
    b = Evaluator(w, topo, COST).rank_loads(pl)
    frac = np.einsum("nle,lep->nlp", w.counts.astype(float), pl.surrogate_rank_matrix())
    assert np.abs(b - frac).max() <= 0.5 + 1e-9


def test_placement_validation():
    """Bad placements and topologies are InputErrors naming the fix."""
    with pytest.raises(InputError, match="no slot"):
        Placement(np.array([[0, 0, 1, 1]]), 2, 3)
    with pytest.raises(InputError, match="divisible"):
        Placement(np.array([[0, 1, 2, 0, 1]]), 2, 3)
    with pytest.raises(InputError, match="≥ 0"):
        Topology(dp=2, ep=2, capacity=10, redundant_experts=-1)
    topo = Topology(dp=4, ep=4, capacity=10, redundant_experts=3)
    with pytest.raises(InputError, match="not divisible by ep=4.*use 0 or 4"):
        topo.check_experts(8)
    Topology(dp=4, ep=4, capacity=10, redundant_experts=4).check_experts(8)


def test_plan_json_round_trip_with_replicas(tmp_path):
    """A plan with replicas writes phy2log, logcnt and the rule, reads back equal, and scores the
    same; a logcnt that does not match phy2log is refused."""
    rng = np.random.default_rng(1)
    w = random_window(num_samples=12, num_layers=2, num_experts=4, top_k=2, max_len=10, seed=1)
    topo = Topology(dp=2, ep=2, capacity=1000, redundant_experts=2)
    pl = _random_placement(2, 4, 2, 2, rng)
    row, slot = random_layout(12, 2, 2, rng)
    plan = Plan.from_layout(topo, pl, Layout(row, slot, 2))
    assert plan.validate(w) == []
    d = json.loads(json.dumps(plan.to_json()))
    assert d["replica_rule"] == "even-local" and d["topology"]["redundant_experts"] == 2
    back = Plan.from_json(d, num_samples=12)
    assert np.array_equal(back.replicas.phy2log, pl.phy2log)
    ev = Evaluator(w, topo, COST)
    assert ev.evaluate_plan(back).score.key == ev.evaluate(pl, row, slot, 2).score.key
    d["logcnt"][0][0] += 1
    with pytest.raises(InputError, match="logcnt"):
        Plan.from_json(d, num_samples=12)
    # a plan without replicas on a topology that has redundant slots is invalid
    bare = Plan.from_layout(topo, np.tile(np.arange(4), (2, 1)), Layout(row, slot, 2))
    assert any("no replicas" in e for e in bare.validate(w))

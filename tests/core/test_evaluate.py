"""The one evaluator: hand-computed cases, the referee's example, bounds, projection."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routepack_opt.core.cost import PRESETS, CostModel, Stage
from routepack_opt.core.errors import InputError
from routepack_opt.core.evaluate import Evaluator, rank_loads, row_shard_costs, score_from_J
from routepack_opt.core.testing import random_layout, random_window
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import Window


def test_referee_two_shard_example():
    """max-sum prefers [[100,0],[0,100]] (100 < 120); sum-max prefers [[60,60],[60,60]] (120 < 200)."""
    A = np.array([[100.0, 0.0], [0.0, 100.0]])
    B = np.array([[60.0, 60.0], [60.0, 60.0]])
    assert score_from_J(A, "max-sum").makespan == 100 and score_from_J(B, "max-sum").makespan == 120
    assert score_from_J(A, "sum-max").makespan == 200 and score_from_J(B, "sum-max").makespan == 120
    assert score_from_J(A, "max-sum").key < score_from_J(B, "max-sum").key
    assert score_from_J(B, "sum-max").key < score_from_J(A, "sum-max").key


def _hand_case():
    lengths = [3, 1, 2, 2]
    counts = np.array([[[3, 0]], [[0, 1]], [[1, 1]], [[2, 0]]])
    w = Window(lengths, counts, top_k=1)
    topo = Topology(dp=2, ep=2, capacity=10)
    cost = CostModel((Stage("attn", 1.0, 0.5),), gamma=10.0, row_overhead=7.0)
    return w, topo, cost


def test_hand_computed_costs_and_bound():
    """J, both objectives and the lower bound match a hand computation (docs/model.md)."""
    w, topo, cost = _hand_case()
    ev = Evaluator(w, topo, cost)
    pl = np.array([[0, 1]])
    res = ev.evaluate(pl, np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1]), 2)
    # row 0: attn max(3+4.5, 1+0.5)=7.5, W=(3,1)→30, +7 ; row 1: attn 2+2=4, W=(3,1)→30, +7
    assert np.allclose(res.J, [[44.5], [41.0]])
    assert res.scores["max-sum"].key == (85.5, 85.5, 44.5)
    assert res.scores["sum-max"].makespan == 85.5
    # LB = ((8 + 0.5*18)/2 + 10*6 + 2*1*7)/1 = 82.5
    assert np.isclose(res.lower_bound, 82.5)
    assert np.isclose(res.gap, 85.5 / 82.5)


def test_two_shards_hand_case():
    """Two shards: attention max stays per shard, expert peaks per shard and row."""
    lengths = [4, 2, 1, 3]
    counts = np.array([[[4, 0]], [[0, 2]], [[1, 0]], [[0, 3]]])
    w = Window(lengths, counts, top_k=1)
    topo = Topology(dp=2, ep=1, capacity=10)  # G = 2 shards of one slot
    cost = CostModel((Stage("a", 1.0, 0.0),), gamma=1.0, row_overhead=0.0)
    J = Evaluator(w, topo, cost).costs(np.array([[0, 1]]), [0, 0, 1, 1], [0, 1, 0, 1], 2)
    # P=1: W = all tokens of the cell at the single rank: J = T + T
    assert np.allclose(J, [[8, 4], [2, 6]])
    assert score_from_J(J, "max-sum").makespan == 10 and score_from_J(J, "sum-max").makespan == 14


def test_projection_equals_direct_loop(rng):
    """rank_loads equals summing counts expert by expert through the placement."""
    w = random_window(10, 3, 8, 2, seed=5)
    pl = np.stack([rng.permutation(8) for _ in range(3)])
    b = rank_loads(w.counts, pl, 4)
    direct = np.zeros((10, 3, 4), int)
    for i in range(10):
        for l in range(3):
            for e in range(8):
                direct[i, l, pl[l, e] // 2] += w.counts[i, l, e]
    assert np.array_equal(b, direct)


def test_projection_rejects_out_of_range_slots():
    """A placement slot outside 0..E-1 is an input error, not an index error."""
    w = random_window(4, 2, 8, 2, seed=1)
    pl = np.tile(np.arange(8), (2, 1))
    pl[1, 3] = 8
    with pytest.raises(InputError, match="slots"):
        rank_loads(w.counts, pl, 4)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), dp=st.sampled_from([1, 2, 4]), ep=st.sampled_from([1, 2]),
       rows=st.integers(1, 3))
def test_lower_bound_never_exceeds_makespan(seed, dp, ep, rows):
    """LB (and the placement-free LB) ≤ makespan for both objectives on random layouts."""
    if dp % ep:
        dp = ep
    rng = np.random.default_rng(seed)
    n = rows * dp + int(rng.integers(0, 6))
    w = random_window(n, 2, 4, 2, max_len=30, seed=seed)
    topo = Topology(dp=dp, ep=ep, capacity=10**6)
    cost = CostModel((Stage("lin", float(rng.uniform(0, 2)), 0.0), Stage("full", float(rng.uniform(0, 1)), float(rng.uniform(0, 0.1)))),
                     gamma=float(rng.uniform(0, 3)), row_overhead=float(rng.uniform(0, 5)))
    pl = np.stack([rng.permutation(4) for _ in range(2)])
    row, slot = random_layout(n, rows, dp, rng)
    res = Evaluator(w, topo, cost).evaluate(pl, row, slot, rows)
    for s in res.scores.values():
        assert res.lower_bound <= s.makespan * (1 + 1e-12)
    assert res.placement_free_lower_bound <= res.lower_bound * (1 + 1e-12)


def test_custom_shard_of_slot_matches_relabelled_default(rng):
    """A custom shard_of_slot scores like the default order after relabelling slots."""
    w = random_window(12, 2, 4, 2, seed=9)
    cost = PRESETS["olmoe-1b-7b"].cost
    pl = np.tile(np.arange(4), (2, 1))
    row, slot = random_layout(12, 2, 4, rng)
    custom = Topology(dp=4, ep=2, capacity=10**6, shard_of_slot=(0, 1, 0, 1))
    default = Topology(dp=4, ep=2, capacity=10**6)
    relabel = np.array([0, 2, 1, 3])  # custom slot d → default slot with the same shard
    b = rank_loads(w.counts, pl, 2)
    J1 = row_shard_costs(w.lengths, b, row, slot, 2, custom, cost)
    J2 = row_shard_costs(w.lengths, b, row, relabel[slot], 2, default, cost)
    assert np.allclose(J1, J2)


def test_block_sums_equal_add_at_for_every_storage(rng):
    """row_shard_costs' compiled block sums equal np.add.at over int64, for int16/int32/int64 loads
    and for the annealer's strided (transposed) view of b."""
    from routepack_opt.core.projection import block_loads

    b_NLP = rng.integers(0, 300, size=(40, 3, 4))
    block_N = rng.integers(0, 7, size=40)
    want = np.zeros((7, 12), dtype=np.int64)
    np.add.at(want, block_N, b_NLP.reshape(40, 12))
    for dtype in (np.int16, np.int32, np.int64):
        b_NPL = np.ascontiguousarray(b_NLP.transpose(0, 2, 1), dtype=dtype)
        for view in (b_NLP.astype(dtype), b_NPL.transpose(0, 2, 1)):
            assert np.array_equal(block_loads(view, block_N, 7), want)


def test_scoring_rejects_a_layout_outside_the_grid():
    """A row or slot outside the R × D grid (or a layout of the wrong length) is an input
    error: the compiled block sums never index out of bounds."""
    w, topo, cost = _hand_case()
    b = rank_loads(w.counts, np.array([[0, 1]]), 2)
    for row, slot in (([0, 0, 1, 2], [0, 1, 0, 1]), ([0, 0, 1, 1], [0, 1, 0, 2]),
                      ([0, 0, 1, -1], [0, 1, 0, 1]), ([0, 0, 1], [0, 1, 0])):
        with pytest.raises(InputError, match="cell of the 2 × 2 grid"):
            row_shard_costs(w.lengths, b, row, slot, 2, topo, cost)

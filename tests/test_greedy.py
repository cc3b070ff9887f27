"""The joint-cost greedy seed: the swap that makes room on fragmented tight windows, and the
one-sided expert kernel that scores a block."""

import numpy as np
import pytest

from routepack_opt.certify import certify_rows
from routepack_opt.core.cost import PRESETS
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.core.testing import random_counts, random_window
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import Window
from routepack_opt.heuristics.anneal import greedy
from routepack_opt.heuristics.anneal.kernels import msum_add, msum_add8, msum_swap, msum_swap8
from routepack_opt.heuristics.anneal.problem import Instance
from routepack_opt.heuristics.placement.lpt import lpt_placement

# olmoe's attention and expert terms with a 50 µs row overhead: the fragmented window below was
# found for it (with the preset's cited 6.1 ms the greedy, weighing the overhead, happens to fit)
COST = PRESETS["olmoe-1b-7b"].config.cost_model(row_overhead=50.0)


def _instance(window, topo, rows):
    b = Evaluator(window, topo, COST).rank_loads(lpt_placement(window.expert_loads(), topo.ep))
    return Instance(window.lengths, b, topo, COST, rows, "max-sum", 1e-9)


def test_repair_rescues_a_fragmented_tight_window():
    """A window 96 % full at R* where the greedy, placing by cost alone, leaves every cell too
    little room for a later sample: without repairs it gives the seed up (None); with them it
    returns a feasible layout (every cell filled, capacity kept), the same one on every call."""
    w = random_window(40, num_layers=2, num_experts=4, top_k=2, max_len=30, min_len=3, seed=19)
    topo = Topology(dp=4, ep=2, capacity=64)
    rows = certify_rows(w, topo, 2.0).rows
    inst = _instance(w, topo, rows)
    assert greedy.greedy_seed(inst, repairs=0) is None
    got = greedy.greedy_seed(inst)
    assert got is not None
    inst.check_layout(*inst.external(*got), "repaired greedy")  # raises on an empty or overfull cell
    again = greedy.greedy_seed(inst)
    assert np.array_equal(again[0], got[0]) and np.array_equal(again[1], got[1])


def _two_cells(lengths):
    """Two cells of capacity 10 (one row, D = 2, one shard)."""
    lengths = np.asarray(lengths)
    w = Window(lengths, random_counts(lengths, 2, 4, 2, np.random.default_rng(0)), top_k=2)
    return _instance(w, Topology(dp=2, ep=2, capacity=10), 1)


def _state_of(inst, placed):
    """A greedy state built from scratch with internal samples ``placed`` = {i: cell}."""
    pb = inst.problem
    st = greedy.greedy_state(inst)
    m = np.empty(2 * pb.L, dtype=st.W.dtype)
    for i, c in placed.items():
        greedy._add(i, c, 1, pb, st, m)
        st.row[i], st.slot[i] = c // pb.D, c % pb.D
    return st, m


def _make_room(inst, i, order, st, m):
    pb = inst.problem
    zeros = np.zeros(pb.D, dtype=np.int64)
    reach = np.empty((3, pb.C + 1), dtype=np.int64)
    return greedy._make_room(i, len(order) - 1, np.asarray(order), 0, zeros, zeros.copy(), pb, st,
                             m, reach)


def _same_state(a, b):
    for f in ("row", "slot", "cnt", "T", "Q", "W", "Msum", "J", "colsum", "agg"):
        assert np.array_equal(getattr(a, f), getattr(b, f)), f


def test_make_room_swaps_the_smallest_difference():
    """Cells {6, 3} and {5, 4} (1 token free each) cannot take 2 tokens; swapping 6 and 5
    (δ = 1, the smallest that works: 6↔4 needs 2 free in the other cell) frees 2 in the first
    cell. The state after the swap equals one built from scratch with the swapped layout."""
    inst = _two_cells([2, 3, 4, 5, 6])
    pb = inst.problem
    assert pb.lengths.tolist() == [2, 3, 4, 5, 6]  # internal order: by length
    st, m = _state_of(inst, {4: 0, 1: 0, 3: 1, 2: 1})
    assert _make_room(inst, 0, [4, 3, 2, 1, 0], st, m) == 0
    assert pb.C - st.T[0] >= pb.lengths[0]
    _same_state(st, _state_of(inst, {3: 0, 1: 0, 4: 1, 2: 1})[0])


def test_make_room_leaves_the_state_when_no_swap_fits():
    """Cells {5, 4} and {5, 4} (1 token free each) and 3 tokens to place: a swap would need
    δ ≥ 2, and 5↔4 gives 1: −1, the state untouched."""
    inst = _two_cells([3, 4, 4, 5, 5])
    layout = {4: 0, 2: 0, 3: 1, 1: 1}
    st, m = _state_of(inst, layout)
    assert _make_room(inst, 0, [4, 3, 2, 1, 0], st, m) == -1
    _same_state(st, _state_of(inst, layout)[0])


@pytest.mark.parametrize("ranks", [8, 16])
def test_msum_add_is_the_placement_side_of_msum_swap(ranks):
    """Σ_l max_p (W[x] + b[i]) from the one-sided kernel equals msum_swap's side A of a swap with
    the zero row, for one and two groups of 8 ranks."""
    rng = np.random.default_rng(ranks)
    L = 5
    W = rng.integers(0, 1000, size=(3, ranks * L)).astype(np.int32)
    b = rng.integers(0, 300, size=(4, ranks * L)).astype(np.int16)
    b[-1] = 0  # the zero row
    m = np.empty(2 * L, dtype=np.int32)
    for x in range(3):
        for i in range(3):
            want = (W[x].reshape(ranks, L).astype(np.int64) + b[i].reshape(ranks, L)).max(axis=0).sum()
            assert msum_add(W, x, b, i, L, ranks // 8, m) == want
            if ranks == 8:
                assert msum_add8(W, x, b, i, L) == want
            assert msum_swap(W, x, x, b, 3, i, L, ranks // 8, m)[0] == want


@pytest.mark.parametrize("b_dtype", [np.int16, np.int32])
@pytest.mark.parametrize("ranks", [8, 16])
def test_msum_swap_both_sides_match_numpy(ranks, b_dtype):
    """Both sides of a swap (i in A with j in B; j the zero row: a relocation), against numpy,
    from the general kernel (one and two groups of 8 ranks) and from its 8-rank form."""
    rng = np.random.default_rng(ranks)
    L = 7
    W = rng.integers(300, 1000, size=(3, ranks * L)).astype(np.int32)
    b = rng.integers(0, 300, size=(5, ranks * L)).astype(b_dtype)
    b[-1] = 0
    m = np.empty(2 * L, dtype=np.int32)
    for A, B, i, j in [(0, 1, 0, 1), (1, 2, 2, 4), (2, 0, 3, 0), (1, 1, 1, 2)]:
        d = b[i].astype(np.int64) - b[j]
        want = tuple(int((W[x].astype(np.int64) + s * d).reshape(ranks, L).max(axis=0).sum())
                     for x, s in ((A, -1), (B, 1)))
        assert msum_swap(W, A, B, b, i, j, L, ranks // 8, m) == want
        if ranks == 8:
            assert msum_swap8(W, A, B, b, i, j, L) == want

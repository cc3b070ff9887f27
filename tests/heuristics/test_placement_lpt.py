"""Expert placement heuristics: identity, cardinality-constrained LPT, balance metrics."""


import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routepack_opt.core.errors import InputError
from routepack_opt.core.evaluate import expert_rank_loads
from routepack_opt.core.plan import check_placement, placement_from_ranks
from routepack_opt.core.testing import random_window
from routepack_opt.heuristics.placement.lpt import (
    identity_placement,
    lpt_assign,
    lpt_placement,
    placement_ranks,
    rank_load_cv,
    rank_load_matrix,
    rank_peak_ratio,
    swap_refine,
)


def _skewed_loads(L, E, sd, seed):
    rng = np.random.default_rng(seed)
    return np.rint(rng.lognormal(0.0, sd, (L, E)) * 1000).astype(np.int64)


def test_identity_is_arange():
    """identity_placement puts expert e in slot e at every layer."""
    pl = identity_placement(3, 8)
    assert pl.dtype == np.int64 and pl.shape == (3, 8)
    assert (pl == np.arange(8)).all()


def test_lpt_hand_example():
    """LPT on (5,4,3,3,3,2), P=2: 5→r0, 4→r1, 3→r1, 3→r0, 3→r1 (full), 2→r0; both ranks carry 10."""
    pl = lpt_placement(np.array([[5, 4, 3, 3, 3, 2]]), 2)
    assert pl.tolist() == [[0, 3, 4, 1, 5, 2]]
    assert rank_load_matrix([[5, 4, 3, 3, 3, 2]], pl, 2).tolist() == [[10.0, 10.0]]


def test_lpt_ties_are_deterministic():
    """Equal loads break ties by lower expert id and lower rank id: zero loads give identity."""
    assert (lpt_placement(np.zeros((2, 12), dtype=np.int64), 3) == identity_placement(2, 12)).all()


@settings(max_examples=60, deadline=None)
@given(L=st.integers(1, 4), P=st.sampled_from([1, 2, 3, 4, 8]), M=st.integers(1, 8),
       seed=st.integers(0, 10_000), sd=st.floats(0.0, 2.0))
def test_lpt_is_permutation_with_cardinality(L, P, M, seed, sd):
    """Every LPT layer is a permutation and every rank holds exactly E/P experts."""
    load = _skewed_loads(L, P * M, sd, seed)
    pl = lpt_placement(load, P)
    assert check_placement(pl, L, P * M) == []
    ranks = placement_ranks(pl, P)
    assert all((np.bincount(ranks[l], minlength=P) == M).all() for l in range(L))


@settings(max_examples=40, deadline=None)
@given(P=st.sampled_from([2, 4, 8]), M=st.integers(2, 16), seed=st.integers(0, 10_000))
def test_lpt_greedy_rule(P, M, seed):
    """Each LPT step gives the next-heaviest expert to the least-loaded rank with a free slot."""
    load = _skewed_loads(1, P * M, 1.0, seed)[0]
    rank = placement_ranks(lpt_placement(load[None], P), P)[0]
    acc = np.zeros(P)
    fill = np.zeros(P, dtype=int)
    for e in np.argsort(-load, kind="stable"):
        free = np.flatnonzero(fill < M)
        assert rank[e] == free[np.argmin(acc[free])]
        acc[rank[e]] += load[e]
        fill[rank[e]] += 1


@settings(max_examples=40, deadline=None)
@given(L=st.integers(1, 3), P=st.sampled_from([2, 4, 8]), M=st.integers(1, 12),
       seed=st.integers(0, 10_000), sd=st.floats(0.0, 2.0))
def test_swap_refine_never_worse(L, P, M, seed, sd):
    """Swap refinement keeps permutation and cardinality and never raises a layer's busiest rank."""
    load = _skewed_loads(L, P * M, sd, seed)
    lpt = lpt_placement(load, P)
    ref = swap_refine(load, lpt, P)
    assert check_placement(ref, L, P * M) == []
    assert all((np.bincount(r, minlength=P) == M).all() for r in placement_ranks(ref, P))
    assert (rank_load_matrix(load, ref, P).max(axis=1) <= rank_load_matrix(load, lpt, P).max(axis=1)).all()


def test_swap_refine_fixes_graham_worst_case():
    """On (1,2,2,2,1,4), P=2, LPT's 7 is improved by one swap to the optimum 6."""
    load = np.array([[1, 2, 2, 2, 1, 4]])
    ref = swap_refine(load, lpt_placement(load, 2), 2)
    assert rank_load_matrix(load, ref, 2).max() == 6


def test_placement_from_ranks_checks_cardinality():
    """placement_from_ranks fills slots rank by rank and rejects unequal rank sizes."""
    assert placement_from_ranks([[1, 0, 1, 0]], [[1, 2, 3, 4]], 2).tolist() == [[3, 1, 2, 0]]
    with pytest.raises(InputError):
        placement_from_ranks([[0, 0, 0, 1]], [[1, 1, 1, 1]], 2)


def test_cv_and_peak_drop_after_lpt():
    """On skewed loads LPT lowers the EP-rank CV and the busiest-rank ratio below identity's."""
    load = _skewed_loads(6, 128, 0.7, 3)
    ident, lpt = identity_placement(6, 128), lpt_placement(load, 8)
    assert rank_load_cv(load, lpt, 8) < 0.25 * rank_load_cv(load, ident, 8)
    assert rank_peak_ratio(load, lpt, 8) < rank_peak_ratio(load, ident, 8)
    assert rank_load_cv(load, lpt, 8, per_layer=True) < rank_load_cv(load, ident, 8, per_layer=True)
    assert rank_peak_ratio(load, lpt, 8) >= 1.0


def test_metrics_match_evaluator_and_definition():
    """rank_load_matrix equals the evaluator's projection; on a real window (equal layer totals)
    the global CV is the plain CV over all (layer, rank) loads."""
    w = random_window(num_samples=12, num_layers=3, num_experts=8, top_k=2, max_len=30, seed=5)
    load = w.expert_loads()
    pl = lpt_placement(load, 4)
    Lagg = rank_load_matrix(load, pl, 4)
    assert np.array_equal(Lagg, expert_rank_loads(load, pl, 4).astype(float))
    assert rank_load_cv(load, pl, 4) == pytest.approx(Lagg.std() / Lagg.mean())
    assert rank_peak_ratio(load, pl, 4) == pytest.approx(Lagg.max(axis=1).sum() / Lagg.mean(axis=1).sum())


def test_uniform_loads_have_zero_cv():
    """Equal expert loads: CV 0 and peak ratio 1 under any placement."""
    load = np.full((2, 8), 7)
    assert rank_load_cv(load, identity_placement(2, 8), 4) == 0.0
    assert rank_peak_ratio(load, identity_placement(2, 8), 4) == 1.0


def test_bad_inputs_raise():
    """E not divisible by P, negative loads and a wrong item count are InputErrors."""
    with pytest.raises(InputError):
        lpt_placement(np.ones((1, 6)), 4)
    with pytest.raises(InputError):
        lpt_placement(-np.ones((1, 4)), 2)
    with pytest.raises(InputError):
        lpt_assign(np.ones((1, 5)), 2, 2)


def test_lpt_is_fast_at_production_size():
    """LPT at L=58, E=256, P=8 (DeepSeek-V3 size) is deterministic (timing: experiments/placement_gap.py)."""
    load = _skewed_loads(58, 256, 0.8, 0)
    first = lpt_placement(load, 8)
    again = lpt_placement(load, 8)
    assert np.array_equal(first, again)

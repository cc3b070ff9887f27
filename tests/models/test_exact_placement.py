"""Exact per-layer placement (CP-SAT) against brute force, and LPT's approximation bound."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routepack_opt.core.bounds import layer_lower_bound
from routepack_opt.core.errors import InputError
from routepack_opt.core.evaluate import expert_rank_loads
from routepack_opt.core.plan import check_placement
from routepack_opt.core.testing import random_window
from routepack_opt.heuristics.placement.lpt import lpt_placement, placement_ranks, swap_refine
from routepack_opt.models.placement import PlacementReport, exact_placement, solve_layer


def _exact(load_LE, P, **kw) -> PlacementReport:
    """exact_placement with the hints the CLI gives it: LPT + swaps, and plain LPT for the report."""
    lpt_LE = lpt_placement(load_LE, P)
    return exact_placement(load_LE, P, swap_refine(load_LE, lpt_LE, P), lpt_LE, **kw)


def brute_force(load_E, P):
    """Optimal busiest-rank load by enumerating all splits into P groups of E/P."""
    load_E = [int(x) for x in load_E]
    M = len(load_E) // P
    best = [sum(load_E) + 1]

    def rec(rest, cur):
        if not rest:
            best[0] = min(best[0], cur)
            return
        first, others = rest[0], rest[1:]
        for comb in itertools.combinations(range(len(others)), M - 1):
            s = load_E[first] + sum(load_E[others[c]] for c in comb)
            if max(cur, s) < best[0]:
                rec([o for c, o in enumerate(others) if c not in comb], max(cur, s))

    rec(list(range(len(load_E))), 0)
    return best[0]


def _check_report(load, P, rep):
    assert isinstance(rep, PlacementReport)
    assert check_placement(rep.placement, *load.shape) == []
    ranks = placement_ranks(rep.placement, P)
    assert all((np.bincount(r, minlength=P) == load.shape[1] // P).all() for r in ranks)
    # the claimed objective, re-scored by the evaluator's projection
    assert np.array_equal(expert_rank_loads(load, rep.placement, P).max(axis=1), rep.objective_L)
    assert (rep.bound_L <= rep.objective_L).all() and (rep.objective_L <= rep.lpt_makespan_L).all()
    assert (rep.lpt_gap_L >= 1.0).all()


@settings(max_examples=40, deadline=None)
@given(E=st.sampled_from([2, 4, 6, 8]), hi=st.sampled_from([3, 10, 100]), seed=st.integers(0, 10_000))
def test_exact_equals_brute_force_p2(E, hi, seed):
    """Exact placement matches brute force on tiny layers (E ≤ 8, P = 2), proved optimal."""
    load = np.random.default_rng(seed).integers(0, hi, (2, E))
    rep = _exact(load, 2, time_limit=10.0)
    _check_report(load, 2, rep)
    assert rep.proved
    assert rep.objective_L.tolist() == [brute_force(load[l], 2) for l in range(2)]


@settings(max_examples=25, deadline=None)
@given(PM=st.sampled_from([(3, 2), (3, 3), (4, 2), (4, 3), (2, 5)]), seed=st.integers(0, 10_000))
def test_exact_equals_brute_force_more_ranks(PM, seed):
    """Exact placement matches brute force with 3–4 ranks too (symmetry breaking is valid)."""
    P, M = PM
    load = np.random.default_rng(seed).integers(0, 40, (1, P * M))
    rep = _exact(load, P, time_limit=10.0)
    _check_report(load, P, rep)
    assert rep.proved and rep.objective_L[0] == brute_force(load[0], P)


@settings(max_examples=60, deadline=None)
@given(PM=st.sampled_from([(2, 2), (2, 3), (3, 2), (3, 3), (4, 2), (4, 3)]),
       hi=st.sampled_from([5, 30, 1000]), seed=st.integers(0, 10_000))
def test_lpt_within_graham_bound(PM, hi, seed):
    """LPT ≤ (4/3 − 1/(3P))·OPT with ≤ 3 experts per rank (Kellerer & Woeginger 1993), and the
    combinatorial lower bound never exceeds the optimum."""
    P, M = PM
    load = np.random.default_rng(seed).integers(0, hi, P * M)
    opt = brute_force(load, P)
    lpt = expert_rank_loads(load[None], lpt_placement(load[None], P), P).max()
    assert lpt <= (4 / 3 - 1 / (3 * P)) * opt + 1e-9
    assert layer_lower_bound(load, P) <= opt


def test_tight_graham_example():
    """(1,2,2,2,1,4) at P=2: LPT gives 7, the optimum 6 — the 7/6 worst case is reached."""
    load = np.array([[1, 2, 2, 2, 1, 4]])
    rep = _exact(load, 2)
    assert rep.lpt_makespan_L.tolist() == [7] and rep.objective_L.tolist() == [6]
    assert rep.lpt_gap_L[0] == pytest.approx(7 / 6) and rep.proved


def test_bounds_close_without_solver():
    """Uniform loads: LPT meets the average bound, proved by bounds alone."""
    rep = _exact(np.full((3, 16), 5), 4)
    assert rep.proved and set(rep.method_L) == {"bounds"} and (rep.lpt_gap_L == 1).all()


def test_time_limited_layer_reports_bound():
    """A large skewed layer under a short limit still returns a valid placement no worse than
    LPT, with a proved bound below it."""
    load = np.rint(np.random.default_rng(0).lognormal(0, 0.8, (1, 64)) * 1e4).astype(np.int64)
    rep = _exact(load, 8, time_limit=0.5)
    _check_report(load, 8, rep)
    assert rep.status_L[0] in ("optimal", "feasible")
    s = rep.summary()
    assert s["lpt_gap_max"] >= 1.0 and s["layers"] == 1


def test_window_loads_and_determinism():
    """On a window's loads the exact placement is valid, and two runs agree (one worker, seed)."""
    load = random_window(num_samples=10, num_layers=2, num_experts=8, top_k=2, max_len=25, seed=3).expert_loads()
    a = _exact(load, 4, time_limit=5.0)
    b = _exact(load, 4, time_limit=5.0)
    _check_report(load, 4, a)
    assert np.array_equal(a.placement, b.placement) and a.status_L == b.status_L


def test_solve_layer_keeps_a_better_hint():
    """solve_layer never returns worse than its hint."""
    load = np.array([1, 2, 2, 2, 1, 4])
    res = solve_layer(load, 2, hint_ranks_E=np.array([0, 0, 1, 1, 0, 1]), time_limit=5.0)
    assert res.makespan == 6 and res.status == "optimal"


def test_bad_inputs():
    """Fractional loads, E % P ≠ 0 and a non-positive time limit are InputErrors."""
    with pytest.raises(InputError):
        exact_placement(np.array([[1.5, 2.0]]), 2, None)
    with pytest.raises(InputError):
        exact_placement(np.ones((1, 6), dtype=int), 4, None)
    with pytest.raises(InputError):
        exact_placement(np.ones((1, 4), dtype=int), 2, None, time_limit=0)

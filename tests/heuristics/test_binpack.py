"""Bin-packing bounds (routepack_opt.core.bounds) and constructive packings (routepack_opt.heuristics.binpack)."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import require_bpp

from routepack_opt.core.bounds import bin_lower_bound, is_packing, lower_bound_dff, lower_bound_l1, lower_bound_l2
from routepack_opt.core.errors import InputError
from routepack_opt.heuristics.binpack import (
    best_fit_decreasing,
    best_packing,
    bins_used,
    first_fit_decreasing,
    fixed_bins_search,
    minimum_bin_slack,
)
from routepack_opt.models.brute import brute_force_bins

instances = st.integers(5, 60).flatmap(
    lambda C: st.tuples(st.just(C), st.lists(st.integers(1, C), min_size=1, max_size=8)))


@settings(max_examples=150, deadline=None)
@given(instances)
def test_bounds_below_optimum_below_packings(inst):
    """L1 ≤ L2, every bound ≤ brute-force optimum ≤ FFD, BFD, MBS'; packings are valid."""
    C, sizes = inst
    opt = brute_force_bins(sizes, C)
    l1, l2, dff = lower_bound_l1(sizes, C), lower_bound_l2(sizes, C), lower_bound_dff(sizes, C)
    best, _ = bin_lower_bound(sizes, C)
    assert l1 <= l2 <= opt and dff <= opt and best == max(l1, l2, dff)
    for fn in (first_fit_decreasing, best_fit_decreasing, minimum_bin_slack):
        bin_N, used = fn(sizes, C)
        assert is_packing(sizes, C, bin_N) and bins_used(bin_N) == used >= opt


@settings(max_examples=60, deadline=None)
@given(st.integers(10, 1000).flatmap(
    lambda C: st.tuples(st.just(C), st.lists(st.integers(1, C), min_size=1, max_size=300))))
def test_bounds_below_packings_larger(inst):
    """On larger random data, the best bound never exceeds the best FFD/BFD/MBS' packing."""
    C, sizes = inst
    lb, _ = bin_lower_bound(sizes, C)
    _, ub, _ = best_packing(sizes, C)
    mbs_N, mbs = minimum_bin_slack(sizes, C, restarts=3, seed=1)
    assert is_packing(sizes, C, mbs_N)
    assert lb <= min(ub, mbs)


def test_bounds_and_ffd_bfd_match_benchmark_records():
    """L1, L2, FFD and BFD equal the values stored with every BPP benchmark instance."""
    checked = 0
    for path in sorted(require_bpp().glob("*.jsonl")):
        for line in path.read_text().splitlines():
            r = json.loads(line)
            s, C = np.asarray(r["sizes"]), r["capacity"]
            got = (lower_bound_l1(s, C), lower_bound_l2(s, C), first_fit_decreasing(s, C)[1],
                   best_fit_decreasing(s, C)[1])
            assert got == (r["lb_l1"], r["lb_l2"], r["ffd"], r["bfd"]), r["name"]
            checked += 1
    assert checked == 1615


def test_ffd_and_bfd_hand_cases():
    """FFD takes the first bin with room, BFD the fullest one; checked on hand-computed packings."""
    # FFD, C=10, [6, 5, 4, 3]: 6 | 5 ; 4 → bin 0 (first with room 4) ; 3 → bin 1.
    ffd, n_f = first_fit_decreasing([3, 6, 4, 5], 10)
    assert ffd.tolist() == [1, 0, 0, 1] and n_f == 2
    # BFD, C=10, [7, 5, 3, 2, 2]: 7 | 5 ; 3 → bin 0 (res 3, exact) ; 2 → bin 1 (res 5) ; 2 → bin 1.
    bfd, n_b = best_fit_decreasing([7, 5, 3, 2, 2], 10)
    assert bfd.tolist() == [0, 1, 0, 1, 1] and n_b == 2
    # FFD, C=10, [6, 4, 4, 3, 3]: 6 | ; 4 → bin 0 ; 4 → bin 1 ; 3 → bin 1 ; 3 → bin 1.
    assert first_fit_decreasing([6, 4, 4, 3, 3], 10)[0].tolist() == [0, 0, 1, 1, 1]


def test_bfd_large_capacity_path_agrees():
    """The linear-scan BFD (capacities above the Fenwick limit) gives the Fenwick one's bin loads."""
    rng = np.random.default_rng(3)
    s = rng.integers(1, 100, size=200)
    a, na = best_fit_decreasing(s, 100)
    b, nb = best_fit_decreasing(s * (1 << 17), 100 * (1 << 17))  # same instance, C > 2^22
    # ties between equal residuals may pick different bins; the bin loads are the same multiset
    loads_a = np.sort(np.bincount(a, weights=s))
    loads_b = np.sort(np.bincount(b, weights=s))
    assert na == nb and (loads_a == loads_b).all()


def test_item_larger_than_capacity_is_input_error():
    """Sizes above the capacity are refused with the offending items named."""
    with pytest.raises(InputError, match=r"items \[1\].*larger than the capacity 10"):
        lower_bound_l1([3, 11, 2], 10)


def test_production_scale_is_fast():
    """Bounds + FFD + BFD handle N=4096 production lengths (speed: experiments/bench_certify.py)."""
    rng = np.random.default_rng(0)
    s = np.minimum(rng.lognormal(7.0, 1.0, size=4096).astype(np.int64) + 1, 8192)
    bin_lower_bound(s[:10], 8192), best_packing(s[:10], 8192)  # warm-up
    lb, _ = bin_lower_bound(s, 8192)
    bin_N, ub, _ = best_packing(s, 8192)
    assert lb <= ub and is_packing(s, 8192, bin_N)


def test_fixed_bins_search_reaches_the_optimum_where_ffd_does_not():
    """The overflow tabu search packs Falkenauer-U instances into their optimum (FFD uses one more)."""
    recs = [json.loads(x) for x in (require_bpp() / "falkenauer_u.jsonl").read_text().splitlines()]
    done = 0
    for r in recs:
        if r["ffd"] == r["optimum"] or r["n"] > 250:
            continue
        bin_N = fixed_bins_search(r["sizes"], r["capacity"], r["optimum"], time_limit=5.0)
        assert bin_N is not None and is_packing(r["sizes"], r["capacity"], bin_N, r["optimum"])
        done += 1
        if done == 5:
            break
    assert done == 5


def test_fixed_bins_search_refuses_too_few_bins():
    """With less room than volume it returns None at once; with enough bins it returns a packing."""
    assert fixed_bins_search([6, 6, 6], 10, 1) is None
    got = fixed_bins_search([6, 4, 6, 4], 10, 2)
    assert got is not None and is_packing([6, 4, 6, 4], 10, got, 2)

"""The frameworks' own packers at their native row counts (routepack_opt.heuristics.frameworks)."""

from __future__ import annotations

import numpy as np
import pytest

from routepack_opt.core.errors import InfeasibleError
from routepack_opt.core.topology import Topology
from routepack_opt.heuristics.binpack import first_fit_decreasing
from routepack_opt.heuristics.frameworks import (
    FRAMEWORK_PACKERS,
    cap_violations,
    first_fit,
    modified_first_fit_decreasing,
    verl_layout,
    verl_target_layout,
)


def _cells(row, slot, R, D):
    return np.bincount(row * D + slot, minlength=R * D)


def test_mffd_phases_on_a_worked_example():
    """MFFD's phases on a hand-worked case: the large item takes the largest medium that fits, the rest go by FFD."""
    s = np.array([60, 45, 40, 35, 30, 20, 20, 10])
    bin_N, used = modified_first_fit_decreasing(s, 100)
    assert used == 3
    assert bin_N[0] == bin_N[2] and np.bincount(bin_N, weights=s)[bin_N[0]] == 100  # 60 + 40
    # phase 3: the two smallest small items beside a large one that took no medium; the tiny one
    # no longer fits and goes to a new bin (phase 5)
    s = np.array([60, 18, 17, 10])
    bin_N, used = modified_first_fit_decreasing(s, 100)
    assert used == 2 and bin_N[0] == bin_N[1] == bin_N[2] != bin_N[3]


def test_mffd_is_a_packing_and_above_the_volume_bound():
    """MFFD puts every item in one bin within the cap, and never uses fewer bins than ⌈Σs / C⌉."""
    rng = np.random.default_rng(0)
    for _ in range(300):
        s = rng.integers(1, 101, size=int(rng.integers(1, 60)))
        bin_N, used = modified_first_fit_decreasing(s, 100)
        assert bin_N.shape == s.shape and bin_N.min() == 0 and bin_N.max() + 1 == used
        assert (np.bincount(bin_N, weights=s) <= 100).all()
        assert used >= -(-int(s.sum()) // 100)


def test_first_fit_keeps_the_given_order():
    """First fit (slime's pass) takes items in the given order, each to the lowest bin with room."""
    bin_N, used = first_fit(np.array([6, 6, 4, 3, 4]), 10)
    assert bin_N.tolist() == [0, 1, 0, 1, 2] and used == 3
    assert first_fit_decreasing(np.array([6, 6, 4, 3, 4]), 10)[1] == 3


def test_cap_violations_counts_overfull_cells():
    """cap_violations counts the (row, slot) cells over the cap."""
    len_N = np.array([5, 5, 9, 2])
    assert cap_violations(len_N, np.array([0, 0, 1, 1]), np.array([0, 0, 0, 0]), 2, 1, 9) == 2  # 10, 11 tokens
    assert cap_violations(len_N, np.array([0, 0, 1, 1]), np.array([0, 0, 0, 0]), 2, 1, 10) == 1
    assert cap_violations(len_N, np.array([0, 0, 1, 1]), np.array([0, 0, 0, 0]), 2, 1, 11) == 0


@pytest.mark.parametrize("name", sorted(FRAMEWORK_PACKERS))
def test_framework_layouts_cover_every_sample_once(name):
    """Every packer puts each sample in one cell of its R × D grid, no cell empty, R on the row rules."""
    rng = np.random.default_rng(3)
    len_N = rng.integers(1, 100, size=240)
    topo = Topology(dp=4, ep=1, capacity=100, row_multiple=2)
    row, slot, R = FRAMEWORK_PACKERS[name](len_N, topo)
    assert R % 2 == 0 and R * 4 >= -(-int(len_N.sum()) // 100)
    assert row.min() >= 0 and row.max() < R and slot.min() >= 0 and slot.max() < 4
    assert (_cells(row, slot, R, 4) >= 1).all()
    if name != "verl-target":
        assert cap_violations(len_N, row, slot, R, 4, 100) == 0


def test_verl_keeps_equal_counts_and_adds_rows_only_to_fit_the_cap():
    """verl: equal sample counts per rank (KK equal size); the hard-limit loop adds rows only where the target count breaks the cap."""
    rng = np.random.default_rng(5)
    len_N = rng.integers(30, 100, size=160)
    topo = Topology(dp=4, ep=1, capacity=110)
    row_t, slot_t, R_t = verl_target_layout(len_N, topo)
    row, slot, R = verl_layout(len_N, topo)
    counts = np.bincount(slot, minlength=4)
    assert counts.max() - counts.min() <= 1
    tok = np.bincount(slot_t, weights=len_N, minlength=4)
    assert R_t == max(-(-int(t) // 110) for t in tok)  # ceil(tokens / C), agreed MAX
    assert R >= R_t and cap_violations(len_N, row, slot, R, 4, 110) == 0
    if cap_violations(len_N, row_t, slot_t, R_t, 4, 110) == 0:
        assert R == R_t
    else:
        assert R > R_t


def test_verl_refuses_more_micro_batches_than_samples():
    """verl raises (as verl does) when a rank would need more micro-batches than it has samples."""
    with pytest.raises(InfeasibleError):
        # ranks of 2 and 1 samples; the 2-sample rank (140 tokens) needs 2 micro-batches
        verl_layout(np.array([90, 90, 50]), Topology(dp=2, ep=1, capacity=100))

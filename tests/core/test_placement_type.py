"""Placement is the one placement type (issue 40, item 2): arrays are converted once at the
boundary, plans and the evaluator hold and take a Placement, and the one alternate loop keeps a
step only as its rules say."""

import json

import numpy as np
import pytest

from routepack_opt.core.cost import CostModel, Stage
from routepack_opt.core.errors import InputError
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.core.layout import Layout
from routepack_opt.core.placement import Placement, as_placement
from routepack_opt.core.plan import Plan
from routepack_opt.core.testing import random_layout, random_window
from routepack_opt.core.topology import Topology
from routepack_opt.heuristics.placement.joint import AlternateRules, alternate

COST = CostModel((Stage("attn", 0.5, 1e-3),), gamma=2.0, row_overhead=3.0, expert_bytes=1000.0)


def _perm(L, E, seed):
    rng = np.random.default_rng(seed)
    return np.stack([rng.permutation(E) for _ in range(L)])


def test_plan_converts_a_permutation_once_and_writes_the_same_file():
    """Plan(placement=π) holds the Placement of π: first_slots is π, the JSON is the old format
    (no phy2log/logcnt), and a plan built from the Placement itself is equal and scores equal."""
    w = random_window(num_samples=12, num_layers=3, num_experts=8, top_k=2, max_len=10, seed=2)
    topo = Topology(dp=2, ep=2, capacity=1000)
    pi = _perm(3, 8, 0)
    row, slot = random_layout(12, 2, 2, np.random.default_rng(0))
    a = Plan(topo, 2, pi, row, slot)
    b = Plan.from_layout(topo, Placement.from_permutation(pi, 2), Layout(row, slot, 2))
    assert isinstance(a.placement, Placement) and a.placement == b.placement and a.replicas is None
    assert np.array_equal(a.placement.first_slots, pi) and np.array_equal(a.placement.permutation(), pi)
    d = json.loads(json.dumps(a.to_json()))
    assert d["placement"] == pi.tolist() and not {"phy2log", "logcnt", "replica_rule"} & set(d)
    assert Plan.from_json(d, num_samples=12).placement == a.placement
    ev = Evaluator(w, topo, COST)
    assert ev.evaluate_plan(a).score.key == ev.score(pi, row, slot, 2, "max-sum").key
    assert ev.score(b.placement, row, slot, 2, "sum-max") == ev.score(pi, row, slot, 2, "sum-max")


@pytest.mark.parametrize("value, match", [
    ([[0, 1], [0]], "cannot be read"),
    (np.arange(4.0)[None], "integers"),
    (np.arange(4), "expected an"),
    (np.array([[0, 0, 1, 2]]), "not a permutation"),
])
def test_as_placement_refuses_what_is_not_a_permutation(value, match):
    """The one conversion refuses ragged, float, 1-D and non-permutation arrays with an InputError."""
    with pytest.raises(InputError, match=match):
        as_placement(value, 2)


def test_as_placement_keeps_a_placement_and_placements_compare_by_value():
    """A Placement passes through as the same object; equal slots compare (and hash) equal."""
    pl = Placement(np.array([[0, 1, 2, 3, 0, 1]]), 2, 4)
    assert as_placement(pl, 2) is pl
    same = Placement(pl.phy2log.copy(), 2, 4)
    assert same == pl and hash(same) == hash(pl)
    assert Placement(pl.phy2log, 3, 4) != pl


def test_evaluator_refuses_a_placement_of_another_shape():
    """A placement for another E or ep is an InputError at the evaluator, not a wrong score."""
    w = random_window(num_samples=8, num_layers=2, num_experts=4, top_k=2, max_len=10, seed=1)
    ev = Evaluator(w, Topology(dp=2, ep=2, capacity=1000), COST)
    row, slot = random_layout(8, 2, 2, np.random.default_rng(1))
    with pytest.raises(InputError, match="built for"):
        ev.score(Placement.from_permutation(_perm(2, 4, 1), 4), row, slot, 2, "max-sum")
    with pytest.raises(InputError, match="built for"):
        ev.score(_perm(3, 4, 1), row, slot, 2, "max-sum")


def _toy(moves_by_round, keys):
    """A refiner that proposes placement rnd with the given moves, a packer that proposes
    layout rnd, and a scorer that reads (placement, layout) keys (default: the start's)."""
    def refiner(pl, lay, rnd):
        return rnd, moves_by_round[rnd - 1]

    def packer(pl, lay, rnd):
        return f"L{rnd}"

    def scorer(pl, lay):
        return keys.get((pl, lay), keys[(0, "L0")])

    return refiner, packer, scorer


def test_alternate_strict_keeps_only_improving_moves():
    """Strict rules (replica moves): round 1 improves and its packing too; round 2's refinement
    does not lower the key, so the loop ends there and the result is round 1's."""
    keys = {(0, "L0"): (10.0,), (1, "L0"): (8.0,), (1, "L1"): (7.0,), (2, "L1"): (7.0,)}
    pl, lay, key, rounds = alternate(*_toy([3, 2, 1], keys), 0, "L0", AlternateRules(3, strict=True))
    assert (pl, lay, key) == (1, "L1", (7.0,))
    assert [(r.kept, r.packed, r.stop) for r in rounds] == [(True, True, None), (False, False, "no gain")]


def test_alternate_undoes_a_worse_refinement_and_stops_when_converged():
    """Non-strict rules (row-aware swaps): a refinement that scores worse is undone (the start
    placement is packed instead), and a later round without moves ends the loop."""
    keys = {(0, "L0"): (10.0,), (1, "L0"): (11.0,), (0, "L1"): (9.0,)}
    pl, lay, key, rounds = alternate(*_toy([1, 0, 0], keys), 0, "L0", AlternateRules(3))
    assert (pl, lay, key) == (0, "L1", (9.0,))
    assert rounds[0].refine_key == (10.0,) and rounds[0].packed
    assert rounds[-1].stop == "placement converged" and len(rounds) == 2


def test_alternate_without_repack_refines_once():
    """repack=False (the replica moves without a time limit): one refinement kept, no packing."""
    keys = {(0, "L0"): (10.0,), (1, "L0"): (8.0,)}
    pl, lay, key, rounds = alternate(*_toy([2], keys), 0, "L0", AlternateRules(1, strict=True, repack=False))
    assert (pl, lay, key) == (1, "L0", (8.0,)) and rounds[0].stop == "no packing"

"""Joint exact layout + replica placement (issue 26, "Exact"): CP-SAT and Pyomo/HiGHS against brute
force over every layout × every replica placement (each scored by the evaluator), the model's
split against the evaluator's, redundant=0 against the fixed-placement layout model, the
symmetry the models keep, and the heuristic against the proved bound."""

import itertools

import numpy as np
import pytest

from routepack_opt.core.cost import CostModel, Stage
from routepack_opt.core.errors import InputError
from routepack_opt.core.placement import Placement
from routepack_opt.core.testing import random_layout, random_window
from routepack_opt.core.topology import Topology
from routepack_opt.models.layout import solve_layout, solve_layout_replicas
from routepack_opt.models.layout_common import canonical_layout, is_canonical
from routepack_opt.models.layout_replicas import (
    ReplicaLayoutInstance,
    brute_force_replica_layout,
    model_loads,
)
from routepack_opt.models.replica_placement import layer_choices, placement_from_y

COST = CostModel((Stage("attn", 0.01, 1e-4),), gamma=1.0, row_overhead=2.0)
OBJECTIVES = ("max-sum", "sum-max")

# (N, L, E, top_k, dp, ep, redundant, rows, capacity, seed): brute force scores ≤ ~5k candidates.
CASES = [
    (6, 1, 3, 1, 2, 2, 1, 1, 1000, 0),   # G=1, one row
    (5, 1, 3, 2, 2, 2, 1, 2, 1000, 1),   # G=1, two rows
    (5, 2, 4, 2, 2, 2, 2, 1, 1000, 2),   # two layers, two redundant slots
    (5, 1, 3, 1, 4, 2, 1, 1, 1000, 3),   # G=2 shards
    (6, 2, 3, 2, 2, 2, 1, 1, 80, 4),     # capacity binds (153 tokens in two cells of 80)
    (5, 1, 3, 2, 3, 3, 3, 1, 1000, 5),   # P=3: three replicas, remainders over three ranks
]
IDS = [f"N{c[0]}L{c[1]}E{c[2]}D{c[4]}P{c[5]}red{c[6]}R{c[7]}" for c in CASES]


def _instance(case, objective):
    N, L, E, k, D, P, red, R, C, seed = case
    w = random_window(N, L, E, k, max_len=30, seed=seed, skew=2.0)
    topo = Topology(dp=D, ep=P, capacity=C, redundant_experts=red)
    return ReplicaLayoutInstance.build_replicas(w, topo, COST, R, objective)


def _solve(inst, solver, **kw):
    kw.setdefault("time_limit", 30.0)
    return solve_layout_replicas(inst.window, inst.topology, inst.cost, inst.rows, inst.objective,
                                 solver=solver, num_workers=2, **kw)


@pytest.fixture(scope="module")
def brute():
    cache = {}

    def get(case, objective):
        if (case, objective) not in cache:
            cache[case, objective] = brute_force_replica_layout(_instance(case, objective))
        return cache[case, objective]
    return get


def test_model_split_is_the_evaluators():
    """The models' per-expert loads (the even-local split, summed over a block's cells) add up to
    the evaluator's W on random layouts and placements: the model scores what the evaluator does."""
    rng = np.random.default_rng(0)
    for seed in range(6):
        inst = _instance(CASES[seed % len(CASES)], "max-sum")
        w, topo = inst.window, inst.topology
        choices = list(layer_choices(w.num_experts, topo.ep, inst.slots_per_rank))
        for _ in range(5):
            pl = placement_from_y(np.stack([choices[rng.integers(len(choices))] for _ in range(w.num_layers)]),
                                  topo.ep)
            row, slot = random_layout(w.num_samples, inst.rows, topo.dp, rng)
            W = inst.evaluator.block_loads(pl, row, slot, inst.rows)
            z = model_loads(inst, row, slot, pl)
            assert np.array_equal(W, z.sum(axis=2).reshape(W.shape))


@pytest.mark.parametrize("solver", ["cpsat", "highs"])
@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_model_equals_brute_force(case, objective, solver, brute):
    """Each model proves the brute-force optimum over layouts × replica placements; its objective
    is the evaluator's score of its (layout, placement), its own claim agrees, its bound holds."""
    inst = _instance(case, objective)
    ref = brute(case, objective)
    res = _solve(inst, solver)
    tol = 2 * res.rounding_error + 1e-7 * ref.objective
    assert res.status == "optimal"
    assert abs(res.objective - ref.objective) <= tol
    assert res.bound <= ref.objective + tol
    assert res.objective == inst.score(res.row, res.slot, res.placement).makespan  # re-scored
    assert abs(res.claimed - res.objective) <= res.rounding_error + 1e-6 * res.objective
    assert res.placement.redundant == inst.redundant
    assert not inst.violations(res.row, res.slot, res.placement)


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_redundant_zero_equals_layout_model_over_placements(objective):
    """With no redundant slot the joint model's optimum is the fixed-placement layout model's
    optimum minimised over every assignment of experts to ranks."""
    w = random_window(6, 1, 4, 2, max_len=30, seed=7, skew=2.0)
    topo = Topology(dp=2, ep=2, capacity=1000)
    best = np.inf
    for y in layer_choices(4, 2, 2):
        pl = placement_from_y(y[None], 2).permutation()
        res = solve_layout(w, topo, COST, pl, 1, objective, time_limit=20)
        assert res.status == "optimal"
        best = min(best, res.objective)
    for solver in ("cpsat", "highs"):
        joint = solve_layout_replicas(w, topo, COST, 1, objective, solver=solver, time_limit=20)
        assert joint.status == "optimal" and joint.placement.is_permutation
        assert joint.objective == pytest.approx(best, rel=1e-7)


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_slot_order_matters_and_canonical_keeps_score(objective):
    """With replicas, swapping two slots of a block can change the score (the rule rotates by the
    slot's position), so the models keep slot order; the row/shard canonical form they do use
    (``slots=False``) keeps the score exactly."""
    w = random_window(12, 1, 3, 2, max_len=30, seed=3, skew=2.0)
    topo = Topology(dp=4, ep=2, capacity=10_000, redundant_experts=1)
    inst = ReplicaLayoutInstance.build_replicas(w, topo, COST, 2, objective)
    pl = Placement.identity(1, 3, 2, 1)
    rng = np.random.default_rng(1)
    changed = False
    for _ in range(30):
        row, slot = random_layout(12, 2, 4, rng)
        s = inst.score(row, slot, pl)
        r2, s2 = canonical_layout(row, slot, topo, 2, objective, inst.order_N, slots=False)
        assert inst.score(r2, s2, pl).key == pytest.approx(s.key, rel=1e-12)
        assert is_canonical(r2, s2, topo, 2, objective, inst.order_N, slots=False)
        swapped = np.where(row == 0, slot ^ 1, slot)  # slots 0↔1 and 2↔3 in row 0 only
        changed |= inst.score(row, swapped, pl).makespan != s.makespan
    assert changed


def test_warm_start_and_heuristic_never_beat_the_bound():
    """From the heuristic's replicated plan as a hint, CP-SAT returns no worse a plan; the
    heuristic's makespan is never below the proved joint optimum."""
    from routepack_opt.pipeline import solve

    w = random_window(6, 2, 4, 2, max_len=30, seed=9, skew=2.5)
    topo = Topology(dp=2, ep=2, capacity=1000)
    p = solve(w, topo, COST, rows=2, max_sweeps=2, seed=0, redundant_experts=2)
    h = p.score["makespan"]
    for solver in ("cpsat", "highs"):
        res = solve_layout_replicas(w, p.topology, COST, 2, solver=solver, time_limit=20,
                                    warm_start=(p.layout.row, p.layout.slot, p.replicas))
        assert res.status == "optimal"
        assert res.objective <= h + 1e-9 and res.bound <= h + 1e-9


def test_too_large_and_bad_inputs_are_input_errors():
    """A window past the model's size is refused with a fix-it message; so are a bad solver name
    and a malformed warm start."""
    w = random_window(160, 8, 16, 2, max_len=30, seed=0)
    topo = Topology(dp=16, ep=4, capacity=10_000, redundant_experts=4)
    with pytest.raises(InputError, match="routepack plan"):
        solve_layout_replicas(w, topo, COST, 8, time_limit=1)
    small = random_window(5, 1, 3, 1, max_len=30, seed=0)
    t2 = Topology(dp=2, ep=2, capacity=1000, redundant_experts=1)
    with pytest.raises(InputError, match="solver"):
        solve_layout_replicas(small, t2, COST, 1, solver="gurobi")
    with pytest.raises(InputError, match="warm start"):
        solve_layout_replicas(small, t2, COST, 1, warm_start=(np.zeros(5), np.zeros(5), "lpt"))


def test_brute_force_counts_every_candidate():
    """The reference enumerates every partition × position × placement (no symmetry used)."""
    inst = _instance(CASES[0], "max-sum")
    ref = brute_force_replica_layout(inst)
    n_part = 2 ** (inst.num_samples - 1) - 1  # S(6, 2), capacity never binds
    n_pl = len(list(layer_choices(3, 2, 2)))
    assert ref.count == n_part * 2 * n_pl
    assert len(list(itertools.permutations(range(2)))) == 2

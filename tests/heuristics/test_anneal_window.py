"""Row windows of the annealer (AnnealConfig.window_bytes, moves.row_window): when they switch
on, that unguided moves stay inside one, and that every windowed move is still exact, feasible
and deterministic."""

from __future__ import annotations

import numpy as np
import pytest
from cases import COST, TOPOLOGIES, check_deltas_against_evaluator, feasible_layout, instance  # noqa: E402

from routepack_opt.core.errors import InputError
from routepack_opt.core.evaluate import row_shard_costs, score_from_J
from routepack_opt.core.plan import Plan
from routepack_opt.core.topology import Topology
from routepack_opt.heuristics.anneal import AnnealConfig, anneal
from routepack_opt.heuristics.anneal.moves import moves_of, row_window, run, run_one
from routepack_opt.heuristics.anneal.problem import Instance
from routepack_opt.heuristics.anneal.rng import rng_states
from routepack_opt.heuristics.anneal.state import Population

WINDOWED = dict(window_bytes=1, window_sweeps=0.5)  # the least window: 2 rows


def _population(ti, objective, cfg, seed, n=40, K=1):
    w, topo, pl, b, R = instance(TOPOLOGIES[ti], seed=seed, n=n)
    pb = Instance(w.lengths, b, topo, COST, R, objective, cfg.tie_eps)
    row, slot = feasible_layout(w.lengths, topo, R, np.random.default_rng(seed))
    pop = Population(pb, K)
    r32, s32 = pb.check_layout(row, slot, "layout")
    pop.init(np.repeat(r32[None], K, 0), np.repeat(s32[None], K, 0))
    pop.walk.rng[:] = rng_states(seed, 0, K)
    return w, topo, pl, b, R, pb, pop


def test_window_sizes_from_the_cache_budget():
    """Off (w = R) for the default budget on a small instance, for window_bytes = 0 and below 3
    rows; on a budget of one byte, the least window of 2 rows; the near-swap neighbourhood widens
    by R/w inside a window and not outside one."""
    w, topo, pl, b, R = instance(TOPOLOGIES[3], seed=1)  # R = 4
    inst = Instance(w.lengths, b, topo, COST, R, "max-sum", 1e-9)
    assert row_window(inst, AnnealConfig()) == (R, 0)
    assert row_window(inst, AnnealConfig(window_bytes=0)) == (R, 0)
    rows, stay = row_window(inst, AnnealConfig(**WINDOWED))
    assert rows == 2 and stay == round(0.5 * w.num_samples * 2 / R)
    assert moves_of(AnnealConfig(swap_window=5, **WINDOWED), inst).wide == 5 * 2
    assert moves_of(AnnealConfig(swap_window=5), inst).wide == 5
    w3, topo3, _, b3, R3 = instance(TOPOLOGIES[2], seed=1)  # R = 2: never a window
    assert row_window(Instance(w3.lengths, b3, topo3, COST, R3, "max-sum", 1e-9),
                      AnnealConfig(**WINDOWED)) == (R3, 0)


def _circular_span(rows, R):
    """Fewest consecutive rows (circularly) that hold every row in ``rows``."""
    rs = sorted(set(int(r) for r in rows))
    if len(rs) == 1:
        return 1
    gaps = [(rs[(k + 1) % len(rs)] - rs[k]) % R for k in range(len(rs))]
    return R - max(gaps) + 1


@pytest.mark.parametrize("spec", [TOPOLOGIES[3], (4, 2, None, 8, 6)])
def test_unguided_moves_stay_inside_their_window(spec):
    """With p_guide = 0 every accepted move's rows (both samples' old and new) lie inside 2
    consecutive rows (circularly): the window (R ≥ 4, so two rows apart is outside it)."""
    cfg = AnnealConfig(p_guide=0.0, p_near=0.5, swap_window=3, **WINDOWED)
    w, topo, pl, b, R = instance(spec, seed=2, n=60)
    pb = Instance(w.lengths, b, topo, COST, R, "max-sum", cfg.tie_eps)
    row, slot = feasible_layout(w.lengths, topo, R, np.random.default_rng(2))
    pop = Population(pb, 1)
    pop.init(*(a[None] for a in pb.check_layout(row, slot, "layout")))
    pop.walk.rng[:] = rng_states(2, 0, 1)
    assert R >= 4
    moved = 0
    for _ in range(400):
        before = pop.state.row[0].copy()
        run_one(pop, 1, np.inf, cfg)
        changed = np.flatnonzero(pop.state.row[0] != before)
        if changed.size:
            rows = np.concatenate([before[changed], pop.state.row[0][changed]])
            assert _circular_span(rows, R) <= 2
            moved += 1
    assert moved >= 30


@pytest.mark.parametrize("objective", ["max-sum", "sum-max"])
@pytest.mark.parametrize("mix", ["relocate", "swap", "guided"])
@pytest.mark.parametrize("ti", [0, 1, 3])
def test_windowed_move_delta_equals_full_reevaluation(objective, mix, ti):
    """Inside a row window every move's incremental (Δmakespan, Δtotal, Δpeak) and the state
    after it still equal a full re-evaluation by the evaluator."""
    cfg = AnnealConfig(p_swap={"relocate": 0.0, "swap": 1.0, "guided": 0.5}[mix],
                       p_guide=1.0 if mix == "guided" else 0.0, p_near=0.5, swap_window=3,
                       **WINDOWED)
    w, topo, pl, b, R, pb, pop = _population(ti, objective, cfg, seed=ti)
    checked = check_deltas_against_evaluator(w, b, topo, R, objective, pop, cfg)
    assert checked >= 30


@pytest.mark.parametrize("objective", ["max-sum", "sum-max"])
def test_windowed_walks_keep_every_constraint(objective):
    """Long random walks at T = ∞ inside row windows keep capacity, nonempty cells and
    coverage, and the member lists consistent."""
    cfg = AnnealConfig(p_guide=0.3, **WINDOWED)
    w, topo, pl, b, R, pb, pop = _population(1, objective, cfg, seed=5, n=60, K=2)
    for _ in range(5):
        run(pop, 2000, np.inf, cfg)
        for k in range(2):
            assert Plan(topo, R, pl, *pop.layout(k), objective=objective).validate(w) == []
            cell = pop.state.row[k].astype(np.int64) * topo.dp + pop.state.slot[k]
            np.testing.assert_array_equal(pop.state.cnt[k], np.bincount(cell, minlength=R * topo.dp))
            for i in range(w.num_samples):
                assert pop.state.memb[k, pop.state.pos[k, i] * R * topo.dp + cell[i]] == i
    assert pop.walk.counters[:, 1].sum() > 1000


def test_windowed_equal_counts_relocations_stay_in_their_slot():
    """Equal samples per slot: windowed relocations move a sample to another row of its own
    slot, so every slot keeps N/D samples."""
    dp, ep, _, E, R = TOPOLOGIES[0]
    w, _, pl, b, _ = instance(TOPOLOGIES[0], seed=4, n=48)
    C = int(max(w.lengths.max(), 1.6 * w.lengths.sum() / (R * dp)))
    topo = Topology(dp=dp, ep=ep, capacity=C, equal_samples_per_slot=True)
    cfg = AnnealConfig(p_swap=0.0, p_guide=0.0, **WINDOWED)
    pb = Instance(w.lengths, b, topo, COST, R, "max-sum", cfg.tie_eps)
    assert pb.eq
    slot = np.arange(48) % dp
    order = np.argsort(slot, kind="stable")
    row = np.empty(48, np.int64)
    row[order] = np.tile(np.arange(R), 48 // R)[: 48]
    if (np.bincount(row * dp + slot, weights=w.lengths, minlength=R * dp) > C).any():
        pytest.skip("this random window's round-robin layout exceeds the capacity")
    pop = Population(pb, 1)
    r32, s32 = pb.check_layout(row, slot, "layout")
    pop.init(r32[None], s32[None])
    pop.walk.rng[:] = rng_states(4, 0, 1)
    run(pop, 3000, np.inf, cfg)
    r, s = pop.layout(0)
    assert np.array_equal(np.bincount(s, minlength=dp), np.full(dp, 48 // dp))
    assert pop.walk.counters[0, 1] > 100


def test_windowed_search_is_deterministic_and_never_worse_than_its_seeds():
    """The same seed and budget give the same layout with row windows on; the result is valid
    and no worse than the best seed."""
    w, topo, pl, b, R = instance(TOPOLOGIES[3], seed=3, n=40)
    seeds = [feasible_layout(w.lengths, topo, R, np.random.default_rng(s)) for s in range(2)]
    cfg = AnnealConfig(population=4, temperatures=5, **WINDOWED)
    r1 = anneal(w.lengths, b, topo, COST, R, "max-sum", seeds, config=cfg, seed=7, max_sweeps=10)
    r2 = anneal(w.lengths, b, topo, COST, R, "max-sum", seeds, config=cfg, seed=7, max_sweeps=10)
    assert np.array_equal(r1.row, r2.row) and np.array_equal(r1.slot, r2.slot)
    assert Plan(topo, R, pl, r1.row, r1.slot, objective="max-sum").validate(w) == []
    seed_best = min(score_from_J(row_shard_costs(w.lengths, b, r, s, R, topo, COST), "max-sum").key
                    for r, s in seeds)
    assert score_from_J(row_shard_costs(w.lengths, b, r1.row, r1.slot, R, topo, COST), "max-sum").key <= seed_best


def test_window_parameters_are_checked():
    """A negative byte budget or a non-positive stay is an input error."""
    with pytest.raises(InputError, match="window_bytes"):
        AnnealConfig(window_bytes=-1)
    with pytest.raises(InputError, match="window_sweeps"):
        AnnealConfig(window_sweeps=0.0)

"""The move kinds as records (anneal/proposal.py): every kind applied by the one apply_move
leaves the incremental state that a fresh build of the same layout has, and the rotation
(AnnealConfig.p_rotate, off by default) moves exactly three samples and keeps every cell's count."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cases import COST, TOPOLOGIES, feasible_layout, instance  # noqa: E402

from routepack_opt.core.evaluate import row_shard_costs, score_from_J
from routepack_opt.core.plan import Plan
from routepack_opt.heuristics.anneal import AnnealConfig, anneal
from routepack_opt.heuristics.anneal.moves import run_one
from routepack_opt.heuristics.anneal.problem import Instance
from routepack_opt.heuristics.anneal.rng import rng_states
from routepack_opt.heuristics.anneal.state import Population

MIXES = {  # AnnealConfig changes: each move kind alone, then all of them together
    "relocate": dict(p_swap=0.0, p_guide=0.0),
    "swap": dict(p_swap=1.0, p_guide=0.0),
    "rotate": dict(p_rotate=1.0, p_guide=0.0),
    "all": dict(p_swap=0.5, p_guide=0.3, p_rotate=0.3),
}


def _walk(ti, objective, mix):
    w, topo, pl, b, R = instance(TOPOLOGIES[ti], seed=ti)
    cfg = AnnealConfig(p_near=0.5, swap_window=3, **MIXES[mix])
    inst = Instance(w.lengths, b, topo, COST, R, objective, cfg.tie_eps)
    row, slot = feasible_layout(w.lengths, topo, R, np.random.default_rng(ti))
    pop = Population(inst, 1)
    r32, s32 = inst.check_layout(row, slot, "layout")
    pop.init(r32[None], s32[None])
    pop.walk.rng[:] = rng_states(ti, 0, 1)
    return w, topo, pl, b, R, cfg, inst, pop


@pytest.mark.parametrize("objective", ["max-sum", "sum-max"])
@pytest.mark.parametrize("mix", list(MIXES))
@pytest.mark.parametrize("ti", [0, 1, 2])
def test_applied_moves_leave_the_state_a_fresh_build_has(objective, mix, ti):
    """After T = ∞ walks of each move kind, every incremental array (counts, member lists,
    token sums, expert loads and sums, attention tables, costs, open cells) equals the one
    built from scratch for the same layout, and the evaluator agrees on the score."""
    w, topo, pl, b, R, cfg, inst, pop = _walk(ti, objective, mix)
    for _ in range(8):
        run_one(pop, 50, np.inf, cfg)
        fresh = Population(inst, 1)
        fresh.init(pop.state.row[:1], pop.state.slot[:1])
        st, fr = pop.state, fresh.state
        for name in ("cnt", "T", "Q", "W", "Msum", "J", "At"):
            np.testing.assert_array_equal(getattr(st, name)[0], getattr(fr, name)[0], err_msg=name)
        n_cells = R * topo.dp
        for c in range(n_cells):  # member lists: the same samples (in any order), pos consistent
            got = st.memb[0][np.arange(st.cnt[0, c]) * n_cells + c]
            np.testing.assert_array_equal(np.sort(got), np.flatnonzero(st.row[0] * topo.dp + st.slot[0] == c))
            np.testing.assert_array_equal(st.pos[0][got], np.arange(got.size))
        n_open = st.opn[0, 2 * n_cells]
        assert sorted(st.opn[0, :n_open]) == sorted(fr.opn[0, :fr.opn[0, 2 * n_cells]])
        J = row_shard_costs(w.lengths, b, *pop.layout(0), R, topo, COST)
        assert st.agg[0, 0] == pytest.approx(score_from_J(J, objective).makespan, rel=1e-12)
    assert pop.walk.counters[0, 1] >= 50  # moves were accepted


@pytest.mark.parametrize("ti", [0, 1, 2])
def test_rotation_moves_three_samples_and_keeps_every_count(ti):
    """Each accepted rotation moves exactly three samples, two of them within one row and
    shard (a → c and c → a), and no cell's count changes."""
    w, topo, pl, b, R, cfg, inst, pop = _walk(ti, "max-sum", "rotate")
    D = topo.dp
    rotations = 0
    for _ in range(200):
        n_acc = pop.walk.counters[0, 1]
        row0, slot0, cnt0 = pop.state.row[0].copy(), pop.state.slot[0].copy(), pop.state.cnt[0].copy()
        run_one(pop, 1, np.inf, cfg)
        if pop.walk.counters[0, 1] == n_acc:
            continue
        moved = np.flatnonzero((pop.state.row[0] != row0) | (pop.state.slot[0] != slot0))
        assert moved.size == 3
        np.testing.assert_array_equal(pop.state.cnt[0], cnt0)
        cells_before = set((row0[moved] * D + slot0[moved]).tolist())
        cells_after = set((pop.state.row[0][moved] * D + pop.state.slot[0][moved]).tolist())
        assert cells_before == cells_after and len(cells_before) == 3
        rotations += 1
    assert rotations >= 40


def test_rotation_is_off_by_default_and_a_search_with_it_is_valid():
    """p_rotate defaults to 0 (plans as without the move); a search that uses it returns a valid
    plan whose claimed score the evaluator confirms."""
    assert AnnealConfig().p_rotate == 0.0
    w, topo, pl, b, R = instance(TOPOLOGIES[0], seed=4, n=60)
    seeds = [feasible_layout(w.lengths, topo, R, np.random.default_rng(4))]
    cfg = AnnealConfig(p_rotate=0.2, population=4, temperatures=4)
    res = anneal(w.lengths, b, topo, COST, R, "max-sum", seeds, config=cfg, seed=3, max_sweeps=20)
    assert Plan(topo, R, pl, res.row, res.slot).validate(w) == []
    got = score_from_J(row_shard_costs(w.lengths, b, res.row, res.slot, R, topo, COST), "max-sum")
    assert res.score[0] == pytest.approx(got.makespan, rel=1e-12)

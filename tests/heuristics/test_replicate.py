"""Replica placement (issue 26): EPLB's replica counts, LPT on distinct ranks, the EPLB baseline,
and the pipeline, API and CLI with redundant expert slots."""

import json
import subprocess
import sys

import numpy as np
import pytest

from routepack_opt.api import plan_micro_batches
from routepack_opt.core.cost import CostModel, Stage
from routepack_opt.core.errors import InputError
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.core.testing import random_window
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import save_window
from routepack_opt.heuristics.placement.replicate import (
    eplb_placement,
    place_replicas,
    replica_counts,
    replicated_placement,
)
from routepack_opt.pipeline import solve

COST = CostModel((Stage("attn", 0.02, 4e-5),), gamma=0.05, row_overhead=5.0, expert_bytes=1e6)


def _loads(L, E, seed):
    rng = np.random.default_rng(seed)
    return np.floor(rng.pareto(1.2, size=(L, E)) * 1000 + 1)


def test_replica_counts_minimise_the_largest_share():
    """The greedy's largest load per replica is optimal: no other count vector with the same
    total (checked by brute force over all of them on a tiny layer) has a smaller one."""
    import itertools

    load = np.array([[90.0, 10.0, 40.0, 7.0]])
    S = 8
    cnt = replica_counts(load, S, 4)
    assert cnt.sum() == S and cnt.min() >= 1
    best = min(max(load[0] / np.array(c)) for c in itertools.product(range(1, 5), repeat=4) if sum(c) == S)
    assert max(load[0] / cnt[0]) == pytest.approx(best)


@pytest.mark.parametrize("seed", [0, 1])
def test_place_replicas_is_valid_and_never_worse_than_eplb(seed):
    """Every rank gets S/P slots, replicas of one expert sit on distinct ranks, and on these
    heavy-tailed loads the busiest ranks' aggregate shares (summed over layers) are below EPLB's."""
    load = _loads(5, 16, seed)
    P, S = 4, 24
    pl = replicated_placement(load, P, S)
    assert pl.num_slots == S and pl.logcnt.sum(axis=1).tolist() == [S] * 5
    ranks = pl.replica_ranks()
    for l in range(5):
        for e in range(16):
            r = ranks[l, e][ranks[l, e] >= 0]
            assert len(set(r.tolist())) == r.size
    share = load[:, :, None] * pl.surrogate_rank_matrix()
    eplb = eplb_placement(load, P, S)
    assert np.array_equal(eplb.logcnt, replica_counts(load, S, S))
    share_eplb = load[:, :, None] * eplb.surrogate_rank_matrix()
    assert share.sum(axis=1).max(axis=1).sum() < share_eplb.sum(axis=1).max(axis=1).sum()
    too_many = np.ones((5, 16), dtype=np.int64)
    too_many[:, 0] = 9  # 9 replicas of one expert cannot sit on 4 distinct ranks
    with pytest.raises(InputError, match="1..4"):
        place_replicas(load, too_many, P)


def test_solve_with_replicas_is_valid_scored_and_deterministic():
    """A plan with redundant slots carries replicas, is valid, its score is the evaluator's exact
    one, a sweep budget makes it bit-identical, and redundant_experts=0 gives today's plan."""
    w = random_window(num_samples=96, num_layers=3, num_experts=8, top_k=2, max_len=300, seed=4, skew=2.5)
    topo = Topology(dp=4, ep=4, capacity=1200)
    a = solve(w, topo, COST, max_sweeps=4, seed=1, redundant_experts=4)
    b = solve(w, topo, COST, max_sweeps=4, seed=1, redundant_experts=4)
    assert a.replicas is not None and a.validate(w) == [] and a.topology.redundant_experts == 4
    assert np.array_equal(a.row, b.row) and np.array_equal(a.replicas.phy2log, b.replicas.phy2log)
    e = Evaluator(w, a.topology, COST).evaluate_plan(a)
    assert e.score.as_dict() == a.score
    assert a.report.evaluation.gap_force_balanced >= 1.0
    plain = solve(w, topo, COST, max_sweeps=4, seed=1)
    zero = solve(w, topo, COST, max_sweeps=4, seed=1, redundant_experts=0)
    assert zero.replicas is None and zero.to_json()["cells"] == plain.to_json()["cells"]
    assert np.array_equal(zero.placement, plain.placement)
    with pytest.raises(InputError, match="max_replica_bytes"):
        solve(w, topo, COST, max_sweeps=1, redundant_experts=4, max_replica_bytes=10.0)
    with pytest.raises(InputError, match="not divisible"):
        solve(w, topo, COST, max_sweeps=1, redundant_experts=3)


def test_api_returns_replica_maps():
    """plan_micro_batches(redundant_experts=N) returns phy2log [L, E+N] and log2phy [L, E, K]
    consistent with each other."""
    w = random_window(num_samples=48, num_layers=2, num_experts=8, top_k=2, max_len=200, seed=2, skew=2.0)
    mb = plan_micro_batches(w.lengths, w.counts, dp_size=4, ep_size=4, max_tokens=800, cost=COST,
                            max_sweeps=2, redundant_experts=8)
    p2l, l2p = mb.physical_to_logical, mb.logical_to_physical
    assert p2l.shape == (2, 16) and l2p.shape[:2] == (2, 8)
    for l in range(2):
        for e in range(8):
            assert sorted(p2l[l, s] for s in l2p[l, e] if s >= 0) == [e] * int((l2p[l, e] >= 0).sum())


def test_cli_replica_flags(tmp_path):
    """`plan --redundant-experts` writes phy2log/logcnt/rule and `evaluate` re-scores it; bad
    values (not divisible, over the memory limit) are one error: line and exit 2."""
    w = random_window(num_samples=32, num_layers=2, num_experts=8, top_k=2, max_len=100, seed=3)
    save_window(w, tmp_path / "w.npz")
    base = [sys.executable, "-m", "routepack_opt"]
    topo = ["--dp", "4", "--ep", "4", "--capacity", "400", "--cost", "olmoe-1b-7b"]
    r = subprocess.run(base + ["plan", str(tmp_path / "w.npz"), *topo, "--redundant-experts", "4",
                               "--max-sweeps", "2", "-o", str(tmp_path / "p.json"), "--json"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    d = json.loads((tmp_path / "p.json").read_text())
    assert d["replica_rule"] == "even-local" and len(d["phy2log"][0]) == 12
    r = subprocess.run(base + ["evaluate", str(tmp_path / "w.npz"), str(tmp_path / "p.json"), "--cost",
                               "olmoe-1b-7b", "--json"], capture_output=True, text=True)
    assert r.returncode == 0 and json.loads(r.stdout)["makespan"] == pytest.approx(d["score"]["makespan"])
    for extra in (["--redundant-experts", "3"], ["--redundant-experts", "4", "--max-replica-bytes", "1"]):
        r = subprocess.run(base + ["plan", str(tmp_path / "w.npz"), *topo, *extra], capture_output=True, text=True)
        assert r.returncode == 2 and r.stderr.count("error:") == 1 and "Traceback" not in r.stderr


def _surrogate_cost(V_LEK, pl):
    """Σ_{l,k} max_p Σ_e V[l,e,k]·n[e,p]/cnt[e], in numpy (independent of the kernel)."""
    W_LKP = np.einsum("lek,lep->lkp", V_LEK.astype(float), pl.surrogate_rank_matrix())
    return W_LKP.max(axis=2).sum()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_row_aware_replica_moves_never_raise_the_surrogate_and_stay_valid(seed):
    """refine_replicas keeps S/P slots per rank, every expert ≥ 1 replica on distinct ranks, and
    never raises the surrogate expert cost Σ_{l,k} max_p W (recomputed in numpy)."""
    from routepack_opt.core.testing import random_layout
    from routepack_opt.heuristics.placement.replica_refine import block_expert_loads, refine_replicas

    rng = np.random.default_rng(seed)
    w = random_window(num_samples=40, num_layers=3, num_experts=12, top_k=3, max_len=60, seed=seed, skew=2.5)
    topo = Topology(dp=4, ep=4, capacity=10_000, redundant_experts=8)
    pl = replicated_placement(w.expert_loads(), 4, 20)
    row, slot = random_layout(40, 3, 4, rng)
    V = block_expert_loads(w.counts, row, slot, 3, topo)
    new, moves = refine_replicas(V, pl, topo)
    assert _surrogate_cost(V, new) <= _surrogate_cost(V, pl) + 1e-6
    assert new.num_slots == 20 and new.logcnt.min() >= 1
    ranks = new.replica_ranks()
    for l in range(3):
        for e in range(12):
            r = ranks[l, e][ranks[l, e] >= 0]
            assert len(set(r.tolist())) == r.size
    again, more = refine_replicas(V, new, topo, max_passes=64)
    assert _surrogate_cost(V, again) <= _surrogate_cost(V, new) + 1e-6
    if moves:
        assert _surrogate_cost(V, new) < _surrogate_cost(V, pl)


def test_async_planner_with_replicas_and_its_quick_fallback(monkeypatch):
    """AsyncPlanner(redundant_experts=N) returns a replicated plan equal to the synchronous one,
    and its quick fallback (no worker progress) is a valid plan with replicas too."""
    import threading

    from routepack_opt import pipeline
    from routepack_opt.api import AsyncPlanner

    w = random_window(num_samples=48, num_layers=2, num_experts=8, top_k=2, max_len=200, seed=6, skew=2.0)
    opts = dict(dp_size=4, ep_size=4, max_tokens=800, cost=COST, redundant_experts=4)
    sync = plan_micro_batches(w.lengths, w.counts, max_sweeps=2, seed=1, **opts)
    ap = AsyncPlanner(grace=60.0, warm=False)
    ap.submit(w.lengths, w.counts, deadline=60.0, max_sweeps=2, seed=1, **opts)
    got = ap.result()
    assert got.micro_batches == sync.micro_batches
    assert np.array_equal(got.physical_to_logical, sync.physical_to_logical)
    ap.close()
    release = threading.Event()
    monkeypatch.setattr(pipeline, "resolve_rows", lambda *a, **k: release.wait(30) and None)
    ap = AsyncPlanner(grace=0.0, warm=False)
    ap.submit(w.lengths, w.counts, deadline=0.01, **opts)
    mb = ap.result()
    release.set()
    assert mb.plan.validate(w) == [] and mb.plan.replicas is not None and "quick" in mb.report["fallback"]
    ap.close()


def test_replica_moves_bracket_the_one_packing_under_a_sweep_budget():
    """Without a time limit the packing gets the whole sweep budget; row-aware replica moves run
    for the best seed's packing before it and for its result after it, with no re-packing."""
    w = random_window(num_samples=96, num_layers=3, num_experts=8, top_k=2, max_len=300, seed=4, skew=2.5)
    topo = Topology(dp=4, ep=4, capacity=1200)
    p = solve(w, topo, COST, max_sweeps=4, seed=1, redundant_experts=4)
    notes = p.report.notes["replicas"]
    assert p.report.search is not None and p.report.search.sweeps == pytest.approx(4)
    assert notes["rounds"] == 1 and notes["packings_kept"] == 0 and notes["start_moves"] > 0
    assert {"replicas-start", "anneal", "replicas"} <= set(p.report.timings)


def test_replica_start_keeps_moves_only_when_the_evaluator_scores_them_better():
    """The moves before the first packing are kept only if the one evaluator scores the seed's
    layout better under them than ``best``: an unbeatable ``best`` keeps the constructive
    replicas, an infinite one takes the moved placement."""
    from routepack_opt.core.layout import Layout
    from routepack_opt.heuristics.baselines import verl_kk_layout
    from routepack_opt.pipeline import _Clock, _replica_start

    w = random_window(num_samples=96, num_layers=3, num_experts=8, top_k=2, max_len=300, seed=4, skew=2.5)
    topo = Topology(dp=4, ep=4, capacity=1200, redundant_experts=4)
    ev = Evaluator(w, topo, COST)
    pl = replicated_placement(w.expert_loads(), topo.ep, topo.num_slots(w.num_experts))
    layout = Layout(*verl_kk_layout(w.lengths, topo, 4), 4)
    start = ev.score_layout(pl, layout, "max-sum").key
    kept_pl, kept, notes = _replica_start(w, topo, ev, pl, layout, 4, "max-sum", (-np.inf,) * len(start),
                                          _Clock(None), None)
    assert not kept and kept_pl is pl and notes["start_moves"] > 0
    moved_pl, kept, _ = _replica_start(w, topo, ev, pl, layout, 4, "max-sum", (np.inf,) * len(start),
                                       _Clock(None), None)
    assert kept and not np.array_equal(moved_pl.phy2log, pl.phy2log)
    assert ev.score_layout(moved_pl, layout, "max-sum").key < start  # the moves do help here

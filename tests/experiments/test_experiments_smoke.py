"""Smoke tests: every referee study, the realism study and the training-loop example run on tiny
settings, and the helpers the studies define are right (so the scripts cannot silently rot).
The shared statistics and report writers are tested in test_lib.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _lib.referee import STUDIES, Setting

from routepack_opt.core.evaluate import expert_rank_loads
from routepack_opt.core.topology import Topology
from routepack_opt.heuristics.baselines import verl_kk_layout
from routepack_opt.heuristics.cells import check_layout
from routepack_opt.heuristics.placement.lpt import lpt_placement

PLOTS = {"decomposition": "decomposition", "staleness": "staleness", "cost": "cost_pareto", "budget": "budget"}


def test_eplb_balanced_packing_is_cardinality_lpt(load_script):
    """EPLB's balanced packing without replication is a valid placement with LPT's rank loads."""
    peers = load_script("peers")
    rng = np.random.default_rng(1)
    load = rng.integers(1, 1000, size=(6, 32))
    pl = peers.eplb_balanced_packing(load, 4)
    assert all(sorted(p) == list(range(32)) for p in pl)
    np.testing.assert_array_equal(np.sort(expert_rank_loads(load, pl, 4), axis=1),
                                  np.sort(expert_rank_loads(load, lpt_placement(load, 4), 4), axis=1))


def test_perturb_keeps_layout_feasible(load_script):
    """Random swaps keep coverage, capacity and nonempty cells."""
    semantics = load_script("semantics")
    rng = np.random.default_rng(2)
    lengths = rng.integers(10, 200, 64)
    topo = Topology(dp=4, ep=2, capacity=1000)
    row, slot = verl_kk_layout(lengths, topo, 4)
    r2, s2 = semantics.perturb(lengths, row, slot, 4, 4, 1000, 30, rng)
    assert check_layout(lengths, r2, s2, 4, 4, 1000)


@pytest.mark.parametrize("study", STUDIES)
def test_referee_study_runs_tiny(load_script, study, tmp_path):
    """Each referee study runs end to end on a tiny setting and writes its table, records (and plot)
    under its own name in the output folder."""
    st = Setting(samples=40, layers=2, steps=3, sweeps=1, windows=2, bootstrap=100,
                 presets=("olmoe-1b-7b",), out=tmp_path, quick=True)
    path = load_script(study).run(st)
    assert path == tmp_path / f"{study}.md"
    assert "| olmoe-1b-7b |" in path.read_text()
    assert f"python experiments/{study}.py" in path.read_text()
    json.loads((tmp_path / f"{study}.json").read_text())
    if study in PLOTS:
        assert (tmp_path / f"{PLOTS[study]}.png").stat().st_size > 0
    if study == "control":
        assert "routepack ≥ baseline holds" in path.read_text()


def test_referee_study_command_line(load_script, tmp_path):
    """A study's command line takes the common flags and writes into --out."""
    control = load_script("control")
    rc = control.main(control.__doc__, "control", control.run,
                      ["--samples", "40", "--layers", "2", "--sweeps", "1", "--windows", "1",
                       "--presets", "olmoe-1b-7b", "--quick", "--out", str(tmp_path)])
    assert rc == 0 and (tmp_path / "control.md").exists()


def test_train_loop_example_runs(load_script):
    """The toy training loop plans, trains, re-places experts and keeps the loss unchanged."""
    ex = load_script("train_loop_example")
    out = ex.run(steps=1, samples=12, sweeps=1, deadline=20.0, verbose=False)
    assert out["replacement_loss_identical"]
    assert len(out["log"]) == 1 and np.isfinite(out["log"][0]["loss"])


def test_train_loop_example_runs_with_replicas(load_script):
    """The toy loop with --redundant-experts 2: the plans' replicated placements are materialized
    (E + 2 slots, hot experts replicated) and the loss is bitwise unchanged under shuffled slots."""
    ex = load_script("train_loop_example")
    out = ex.run(steps=1, samples=12, sweeps=1, deadline=20.0, verbose=False, redundant=2)
    assert out["replacement_loss_identical"] and out["slots_per_layer"] == 10
    assert out["replicated_experts"] > 0 and np.isfinite(out["log"][0]["loss"])


def test_realism_study_runs_tiny(load_script, tmp_path):
    """The realism study (issue 15) runs end to end on a tiny setting: calibration table, headline,
    sensitivity tables, the joint verdict and three plots."""
    realism = load_script("realism")
    path = realism.run(realism.quick_setting(tmp_path))
    text = path.read_text()
    for needle in ("| olmoe-1b-7b | before |", "| olmoe-1b-7b | after |", "domains=olmoe",
                   "### vs dispersion", "### vs skew", "Where joint placement stops paying",
                   "--dispersion TARGET", "Reading the curves"):
        assert needle in text, needle
    for png in ("calibration", "dispersion", "skew"):
        assert (tmp_path / f"realism_{png}.png").stat().st_size > 0
    data = json.loads((tmp_path / "realism.json").read_text())
    assert {r["objective"] for r in data["headline"]} == {"max-sum", "sum-max"}

"""Smoke tests: the referee experiments and the training-loop example run on tiny settings, and
their statistics helpers are right (so the scripts cannot silently rot)."""

from __future__ import annotations

import importlib.util
import itertools
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from routepack_opt.heuristics.baselines import verl_kk_layout
from routepack_opt.heuristics.cells import check_layout
from routepack_opt.heuristics.placement.lpt import lpt_placement
from routepack_opt.core.evaluate import expert_rank_loads
from routepack_opt.core.topology import Topology

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"_exp_{name}", EXPERIMENTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def referee():
    return _load("referee")


def test_kendall_tau_matches_definition(referee):
    """Kendall tau-b equals the pair-counting definition, including ties."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        x = rng.integers(0, 5, 9).astype(float)
        y = rng.integers(0, 5, 9).astype(float)
        c = d = tx = ty = 0
        for i, j in itertools.combinations(range(9), 2):
            a, b = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
            c += a * b > 0
            d += a * b < 0
            tx += a == 0
            ty += b == 0
        n0 = 36
        den = np.sqrt((n0 - tx) * (n0 - ty))
        want = (c - d) / den if den else np.nan
        got = referee.kendall_tau(x, y)
        assert (np.isnan(want) and np.isnan(got)) or got == pytest.approx(want)
    assert referee.kendall_tau([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)


def test_block_bootstrap_ci_brackets_the_mean(referee):
    """The moving-block bootstrap CI contains the sample mean and is degenerate for a constant."""
    x = np.sin(np.arange(30) / 3.0) + 1.0
    lo, hi = referee.block_bootstrap_ci(x, referee.block_length(30), reps=500)
    assert lo <= x.mean() <= hi and lo < hi
    assert referee.block_bootstrap_ci(np.full(10, 2.0), 3, reps=100) == (2.0, 2.0)


def test_eplb_balanced_packing_is_cardinality_lpt(referee):
    """EPLB's balanced packing without replication is a valid placement with LPT's rank loads."""
    rng = np.random.default_rng(1)
    load = rng.integers(1, 1000, size=(6, 32))
    pl = referee.eplb_balanced_packing(load, 4)
    assert all(sorted(p) == list(range(32)) for p in pl)
    np.testing.assert_array_equal(np.sort(expert_rank_loads(load, pl, 4), axis=1),
                                  np.sort(expert_rank_loads(load, lpt_placement(load, 4), 4), axis=1))


def test_perturb_keeps_layout_feasible(referee):
    """Random swaps keep coverage, capacity and nonempty cells."""
    rng = np.random.default_rng(2)
    lengths = rng.integers(10, 200, 64)
    topo = Topology(dp=4, ep=2, capacity=1000)
    row, slot = verl_kk_layout(lengths, topo, 4)
    r2, s2 = referee.perturb(lengths, row, slot, 4, 4, 1000, 30, rng)
    assert check_layout(lengths, r2, s2, 4, 4, 1000)


def test_referee_studies_run_tiny(referee, tmp_path):
    """Every study runs end to end on a tiny setting and writes its table (and plots)."""
    st = referee.Setting(samples=40, layers=2, steps=3, sweeps=1, windows=2, bootstrap=100,
                         presets=("olmoe-1b-7b",), out=tmp_path, quick=True)
    for name in referee.STUDIES:
        path = referee.RUNNERS[name](st)
        text = path.read_text()
        assert "| olmoe-1b-7b |" in text, name
    for png in ("decomposition", "staleness", "cost_pareto", "budget"):
        assert (tmp_path / f"referee_{png}.png").stat().st_size > 0
    assert "routepack ≥ baseline holds" in (tmp_path / "referee_control.md").read_text()


def test_train_loop_example_runs():
    """The toy training loop plans, trains, re-places experts and keeps the loss unchanged."""
    ex = _load("train_loop_example")
    out = ex.run(steps=1, samples=12, sweeps=1, deadline=20.0, verbose=False)
    assert out["replacement_loss_identical"]
    assert len(out["log"]) == 1 and np.isfinite(out["log"][0]["loss"])


def test_realism_study_runs_tiny(tmp_path):
    """The realism study (issue 15) runs end to end on a tiny setting: calibration table, headline,
    sensitivity tables, the joint verdict and three plots."""
    realism = _load("realism")
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

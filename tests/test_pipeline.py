"""The full pipeline, compare, the plan/demo commands and the trainer API."""

import json

import numpy as np
import pytest

from routepack_opt.api import AsyncPlanner, plan_micro_batches
from routepack_opt.core.cost import PRESETS
from routepack_opt.core.errors import InputError
from routepack_opt.core.evaluate import evaluate_plan
from routepack_opt.core.plan import load_plan
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import save_window
from routepack_opt.params import PlannerParams
from routepack_opt.pipeline import solve
from routepack_opt.trace import generate_window

COST = PRESETS["olmoe-1b-7b"].cost


@pytest.fixture(scope="module")
def window():
    return generate_window("olmoe-1b-7b", 96, seed=3, num_layers=4)


def test_plan_is_valid_and_rescored(window):
    """solve() returns a valid plan at R* whose reported score is the evaluator's."""
    topo = Topology(dp=8, ep=4, capacity=4096)
    p = solve(window, topo, COST, objective="max-sum", max_sweeps=20, seed=1)
    assert p.validate(window) == []
    assert p.rows == p.certificate["rows"]
    e = evaluate_plan(window, p, COST)
    assert e.score.makespan == pytest.approx(p.score["makespan"])
    assert e.lower_bound <= e.score.makespan
    assert "fallback" not in p.info


def test_plan_never_worse_than_length_only_baselines(window):
    """routepack ≤ every length-only baseline at the same placement and rows (both objectives)."""
    from routepack_opt.compare import compare_plans

    topo = Topology(dp=8, ep=4, capacity=4096)
    for obj in ("max-sum", "sum-max"):
        table, plans = compare_plans(window, topo, COST, objective=obj, max_sweeps=20, seed=0, exact=False, joint=False)
        by = {m["name"]: m for m in table}
        assert by["routepack"]["makespan"] <= by["reorder"]["makespan"] * (1 + 1e-12)
        assert {p.rows for p in plans.values()} == {plans["baseline"].rows}


def test_same_seed_same_plan(window):
    """Same inputs, seed and sweep budget → the identical plan."""
    topo = Topology(dp=8, ep=4, capacity=4096)
    a = solve(window, topo, COST, objective="sum-max", max_sweeps=15, seed=7)
    b = solve(window, topo, COST, objective="sum-max", max_sweeps=15, seed=7)
    assert np.array_equal(a.row, b.row) and np.array_equal(a.slot, b.slot)
    assert np.array_equal(a.placement, b.placement)


def test_rows_rules_and_errors(window):
    """--rows below R*, against the row rules, or needing more samples than N is an InputError."""
    topo = Topology(dp=8, ep=4, capacity=4096)
    p = solve(window, topo, COST, max_sweeps=5, rows=4)
    assert p.rows == 4 and p.validate(window) == []
    with pytest.raises(InputError, match="needs|need"):
        solve(window, topo, COST, max_sweeps=5, rows=13)
    with pytest.raises(InputError, match="row rules"):
        solve(window, Topology(dp=8, ep=4, capacity=4096, row_multiple=3), COST, max_sweeps=5, rows=4)


def test_plan_cli_writes_valid_plan_and_keeps_placement(run_cli, tmp_path, window):
    """routepack plan -o writes a plan evaluate accepts; --placement PLAN.json reuses its placement."""
    save_window(window, tmp_path / "w.npz")
    args = ["--dp", 8, "--ep", 4, "--capacity", 4096, "--cost", "olmoe-1b-7b", "--max-sweeps", 10]
    code, out, err = run_cli("plan", tmp_path / "w.npz", *args, "--placement", "identity", "-o", tmp_path / "p.json", "--json")
    assert code == 0, err
    res = json.loads(out)
    assert res["lower_bound"] <= res["makespan"] and res["certificate"]["status"] in ("optimal", "feasible")
    code, out, err = run_cli("plan", tmp_path / "w.npz", *args, "--placement", tmp_path / "p.json", "-o", tmp_path / "q.json")
    assert code == 0, err
    assert np.array_equal(load_plan(tmp_path / "q.json").placement.first_slots, np.tile(np.arange(64), (4, 1)))
    code, out, err = run_cli("evaluate", tmp_path / "w.npz", tmp_path / "q.json", "--cost", "olmoe-1b-7b", "--json")
    assert code == 0, err
    code, _, err = run_cli("plan", tmp_path / "w.npz", "--dp", 8, "--ep", 3, "--capacity", 4096, "--cost", "olmoe-1b-7b")
    assert code == 2 and err.startswith("error:")
    code, _, err = run_cli("plan", tmp_path / "w.npz", "--dp", 8, "--ep", 4, "--capacity", 100, "--cost", "olmoe-1b-7b")
    assert code == 2 and "longer than the capacity" in err


def test_api_micro_batches_and_maps(window):
    """plan_micro_batches: equal counts per rank, PP multiple, cap strict, EPLB-style maps inverse."""
    mb = plan_micro_batches(lengths=window.lengths, counts=window.counts, dp_size=8, ep_size=4,
                            max_tokens=4096, cost=COST, pp_multiple=2, max_sweeps=10)
    counts = {len(rank) for rank in mb.micro_batches}
    assert len(counts) == 1 and counts.pop() % 2 == 0
    seen = sorted(i for rank in mb.micro_batches for m in rank for i in m)
    assert seen == list(range(window.num_samples))
    assert all(window.lengths[m].sum() <= 4096 for rank in mb.micro_batches for m in rank)
    L, E = mb.logical_to_physical.shape
    assert np.array_equal(np.take_along_axis(mb.physical_to_logical, mb.logical_to_physical, 1),
                          np.tile(np.arange(E), (L, 1)))


def test_async_planner_returns_by_deadline(window):
    """AsyncPlanner returns a valid plan by its deadline."""
    ap = AsyncPlanner(grace=5.0)
    ap.submit(window.lengths, window.counts, deadline=0.5, dp_size=8, ep_size=4, max_tokens=4096, cost=COST)
    mb = ap.result()
    assert mb.plan.validate(window) == []


def test_joint_placement_plan_and_sticky(window):
    """--placement joint returns a valid plan no worse than routepack; with the current placement
    given it reports migration and may keep it."""
    from routepack_opt.heuristics.placement.lpt import identity_placement

    topo = Topology(dp=8, ep=4, capacity=4096)
    rp = solve(window, topo, COST, objective="max-sum", max_sweeps=10, seed=0)
    jp = solve(window, topo, COST, objective="max-sum", placement="joint", max_sweeps=10, seed=0)
    assert jp.validate(window) == [] and "fallback" not in jp.info
    assert jp.score["makespan"] <= rp.score["makespan"] * (1 + 1e-9)
    sticky = solve(window, topo, COST, objective="max-sum", placement="joint", max_sweeps=10, seed=0,
                   current_placement=identity_placement(window.num_layers, window.num_experts))
    assert sticky.validate(window) == [] and "joint" in sticky.info


def test_compare_cli_uses_anneal_config(run_cli, tmp_path, window):
    """compare --config passes the annealing parameters to the search (regression: it was only
    validated); a bad config is one error: line, exit 2."""
    save_window(window, tmp_path / "w.npz")
    (tmp_path / "a.toml").write_text("population = 4\nsweeps = 5\n")
    args = ["compare", tmp_path / "w.npz", "--dp", 8, "--ep", 4, "--capacity", 4096, "--cost", "olmoe-1b-7b",
            "--exact", "no", "--json"]
    code, out, err = run_cli(*args, "--config", tmp_path / "a.toml")
    assert code == 0, err
    rows = {r["name"]: r for r in json.loads(out)["rows"]}
    p = solve(window, Topology(dp=8, ep=4, capacity=4096), COST, objective="max-sum",
              rows=rows["routepack"]["rows"], params=PlannerParams.from_toml(tmp_path / "a.toml"))
    assert rows["routepack"]["makespan"] == pytest.approx(p.score["makespan"])
    (tmp_path / "b.toml").write_text("bogus = 1\n")
    code, _, err = run_cli(*args, "--config", tmp_path / "b.toml")
    assert code == 2 and err.startswith("error:") and "bogus" in err


def _triplet_window():
    """20 bins' worth of items of 1000 filled exactly by three items each: FFD/BFD need 23."""
    from routepack_opt.core.window import Window

    rng = np.random.default_rng(5)
    triplets = []
    for _ in range(20):
        a = int(rng.integers(250, 450))
        b = int(rng.integers(250, min(450, 750 - a)))
        triplets += [a, b, 1000 - a - b]
    lengths = np.array(triplets, dtype=np.int64)
    counts = np.zeros((lengths.size, 1, 2), dtype=np.int32)
    counts[:, 0, 0] = lengths
    return Window(lengths, counts, top_k=1), Topology(dp=2, ep=2, capacity=1000)


@pytest.fixture
def packing_calls(monkeypatch):
    """The bin counts of every exact packing the pipeline's seeds run (a spy on it)."""
    from routepack_opt import pipeline

    calls = []
    real = pipeline.pack_into_bins

    def spy(*args, **kwargs):
        calls.append(args[2])
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "pack_into_bins", spy)
    return calls


def test_compare_and_solve_reuse_the_certificate_packing(packing_calls):
    """On a tight window, compare's baseline rows and its searched rows take the R*
    certificate's packing for the baselines' last resort: no exact packing runs after R*."""
    from routepack_opt.compare import compare_plans

    w, topo = _triplet_window()
    calls = packing_calls
    table, plans = compare_plans(w, topo, COST, max_sweeps=2, joint=False, exact=False)
    assert calls == []
    assert {p.rows for p in plans.values()} == {10}
    for p in plans.values():
        assert p.validate(w) == []


def test_baselines_share_one_exact_packing(packing_calls):
    """On a tight window both baselines fall back to an exact packing into R·D bins: with the
    R* certificate's packing given it is used as is (no packing run), and without it the
    packing runs once for both; every layout is valid at exactly R rows."""
    from routepack_opt import pipeline
    from routepack_opt.certify import certify_rows
    from routepack_opt.core.layout import Layout

    w, topo = _triplet_window()
    lengths = w.lengths
    cert = certify_rows(w, topo)
    assert cert.rows == 10 and cert.packing_N is not None
    calls = packing_calls
    with_cert = pipeline.baseline_layouts(w, topo, cert.rows, packing=cert.packing_N)
    assert calls == []
    without = pipeline.baseline_layouts(w, topo, cert.rows)
    assert calls == [20]  # both baselines needed it; it ran once
    for layouts in (with_cert, without):
        assert set(layouts) == {"verl-kk", "nemo-ffd"}
        for lay in layouts.values():
            assert isinstance(lay, Layout) and lay.rows == cert.rows
            cells = lay.row * topo.dp + lay.slot
            assert np.bincount(cells, minlength=cert.rows * topo.dp).min() >= 1
            assert np.bincount(cells, weights=lengths).max() <= topo.capacity

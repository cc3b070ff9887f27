"""The row count as a decision (issue 42, docs/pipeline.md step 2b): solve() chooses R in
[R*, R_max] within its one budget, prunes by the layout bound, stops at a tight R*, keeps the
row rules, and never returns a plan a cap-keeping framework baseline beats under the same cost."""

import dataclasses

import numpy as np
import pytest

from routepack_opt import plan_micro_batches
from routepack_opt.core.cost import CostModel, Stage
from routepack_opt.core.errors import InputError
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.core.layout import Layout
from routepack_opt.core.testing import random_layout, random_window
from routepack_opt.core.timing import Timings
from routepack_opt.core.topology import Topology
from routepack_opt.heuristics.placement.lpt import identity_placement, lpt_placement
from routepack_opt.params import PlannerParams, RowParams
from routepack_opt.pipeline import (
    _baseline_check,
    _best_baseline,
    _Clock,
    _Context,
    _Result,
    framework_layouts,
    row_candidates,
    solve,
)

# attention mostly quadratic, cheap micro-batches: R* = 9 leaves no slack, 10 rows pay
COST = CostModel(stages=(Stage("full_attn", alpha=0.02, beta=4e-4),), gamma=0.01, row_overhead=0.5)
WINDOW = random_window(num_samples=64, num_layers=3, num_experts=8, top_k=2, max_len=1000, min_len=20, seed=2)
TOPO = Topology(dp=4, ep=2, capacity=1000)


def _rs(plan):
    return plan.info["row_search"]


@pytest.mark.parametrize("objective", ["max-sum", "sum-max"])
def test_more_rows_chosen_where_they_pay_and_reported(objective):
    """On a window whose R* leaves no slack the search picks more rows, and the report names R*,
    the chosen R, why, and both makespans; the plan's makespan is the evaluator's."""
    p = solve(WINDOW, TOPO, COST, objective=objective, max_sweeps=16, seed=3)
    rs = _rs(p)
    assert rs["r_star"] == p.certificate["rows"] == 9
    assert p.rows == rs["chosen"] > rs["r_star"] and str(rs["chosen"]) in rs["why"]
    assert rs["makespan_chosen"] < rs["makespan_r_star"]
    ev = Evaluator(WINDOW, TOPO, COST).evaluate_plan(p)
    assert rs["makespan_chosen"] == pytest.approx(ev.score.makespan, rel=1e-12)
    assert p.score["makespan"] == pytest.approx(ev.score.makespan, rel=1e-12)


def test_deterministic_for_seed_and_sweeps():
    a = solve(WINDOW, TOPO, COST, max_sweeps=12, seed=5)
    b = solve(WINDOW, TOPO, COST, max_sweeps=12, seed=5)
    assert a.rows == b.rows and a.cells() == b.cells() and a.score == b.score


def test_forced_rows_and_extra_zero_plan_at_that_count():
    """--rows forces the count (no search); extra = 0 plans at R* as before the search."""
    p = solve(WINDOW, TOPO, COST, rows=11, max_sweeps=8, seed=1)
    assert p.rows == 11 and "row_search" not in p.info
    q = solve(WINDOW, TOPO, COST, max_sweeps=8, seed=1, params=PlannerParams(rows=RowParams(extra=0)))
    assert q.rows == q.certificate["rows"] == 9 and "row_search" not in q.info


def test_row_rules_and_max_rows_are_kept():
    """Candidates keep min_rows / row_multiple and stop at max_rows and at N/D."""
    topo = dataclasses.replace(TOPO, row_multiple=2, min_rows=4)
    assert row_candidates(64, topo, 10, RowParams()) == [10, 12, 14, 16]  # N/D = 16
    assert row_candidates(64, topo, 10, RowParams(), max_rows=13) == [10, 12]
    assert row_candidates(64, topo, 10, RowParams(max_rows=14)) == [10, 12, 14]
    assert row_candidates(40, TOPO, 9, RowParams(extra=3)) == [9, 10]  # a sample per cell
    p = solve(WINDOW, topo, COST, max_sweeps=8, seed=2)
    assert p.rows % 2 == 0 and p.rows >= 10 and all(c["rows"] % 2 == 0 for c in _rs(p)["candidates"])
    p = solve(WINDOW, TOPO, COST, max_sweeps=8, seed=2, max_rows=9)
    assert p.rows == 9 and [c["rows"] for c in _rs(p)["candidates"]] == [9]


def test_bound_prunes_counts_an_overhead_makes_dear():
    """With a per-micro-batch overhead above R*'s gap, every count above R* has a layout bound
    above R*'s makespan: pruned, never screened, and R* is chosen."""
    dear = dataclasses.replace(COST, row_overhead=5000.0)
    p = solve(WINDOW, TOPO, dear, max_sweeps=8, seed=0, params=PlannerParams(rows=RowParams(tight_gap=1.0)))
    rs = _rs(p)
    assert p.rows == 9
    assert [c["status"] for c in rs["candidates"] if c["rows"] > 9] == ["pruned"] * 4
    assert all(c["lower_bound"] >= rs["makespan_chosen"] for c in rs["candidates"] if c["rows"] > 9)


def test_tight_gap_at_r_star_ends_the_search():
    p = solve(WINDOW, TOPO, COST, max_sweeps=8, seed=0, params=PlannerParams(rows=RowParams(tight_gap=100.0)))
    rs = _rs(p)
    assert rs["chosen"] == 9 and rs["why"].startswith("tight at R*")
    assert [c["status"] for c in rs["candidates"]] == ["screened"] + ["skipped"] * 4
    # the plan is the search's, or a framework baseline that beat it, named
    assert p.rows == 9 or p.info["baseline_check"]["taken"]


@pytest.mark.parametrize("objective", ["max-sum", "sum-max"])
def test_never_worse_than_a_cap_keeping_framework_baseline(objective):
    """Every framework packer at its own count and verl's KK at R*, under identity, EPLB's and
    the plan's placement, scores no better than the plan (same cost, one evaluator)."""
    w = random_window(num_samples=96, num_layers=3, num_experts=8, top_k=2, max_len=900, min_len=10, seed=7)
    topo = Topology(dp=4, ep=2, capacity=1000)
    p = solve(w, topo, COST, objective=objective, max_sweeps=6, seed=0)
    ev = Evaluator(w, topo, COST)
    ours = ev.evaluate_plan(p).score.key
    ctx = _ctx(w, topo, objective)
    lays = [lay for d in framework_layouts(ctx, p.certificate["rows"]).values() for lay in d.values()]
    assert lays
    for pl in (identity_placement(3, 8), lpt_placement(w.expert_loads(), 2), p.placement):
        for lay in lays:
            assert ours <= ev.score_layout(pl, lay, objective).key
    assert p.info["baseline_check"]["best"] is not None


def _ctx(window, topo, objective, placement="lpt"):
    return _Context(window, topo, COST, objective, placement, PlannerParams(), 0, _Clock(None), None, Timings(),
                    None, Evaluator(window, topo, COST), None)


def test_baseline_check_takes_a_better_baseline_and_says_why():
    """A search result worse than a baseline (here a random layout) is replaced by the best
    baseline, named with the reason; a placement the caller fixed is kept."""
    ctx = _ctx(WINDOW, TOPO, "max-sum")
    pl = lpt_placement(WINDOW.expert_loads(), 2)
    row, slot = random_layout(WINDOW.num_samples, 16, 4, np.random.default_rng(0))
    bad = Layout(row, slot, 16)
    key = ctx.ev.score_layout(pl, bad, "max-sum").key
    res, note = _baseline_check(ctx, _Result(pl, "lpt", bad, 16, key, {}), *_best_baseline(ctx, pl, None, 9), 9)
    assert note["taken"] and note["best"] in note["reason"] and res.key < key and res.layout is not bad
    assert res.key == ctx.ev.score_layout(res.pl, res.layout, "max-sum").key
    fixed = _ctx(WINDOW, TOPO, "max-sum", placement="identity")
    idp = identity_placement(3, 8)
    res, note = _baseline_check(fixed, _Result(idp, "identity", bad, 16, fixed.ev.score_layout(idp, bad, "max-sum").key,
                                               {}), *_best_baseline(fixed, idp, None, 9), 9)
    assert note["taken"] and res.pl is idp and note["best"].endswith("/plan")


def test_api_runs_the_plans_count():
    """plan_micro_batches: every rank gets plan.rows micro-batches; max_micro_batches bounds it."""
    lengths = WINDOW.lengths
    mb = plan_micro_batches(lengths, WINDOW.counts, dp_size=4, ep_size=2, max_tokens=1000, cost=COST,
                            max_sweeps=8, seed=0)
    assert all(len(m) == mb.num_micro_batches == mb.plan.rows for m in mb.micro_batches)
    assert mb.report["row_search"]["chosen"] == mb.plan.rows
    mb = plan_micro_batches(lengths, WINDOW.counts, dp_size=4, ep_size=2, max_tokens=1000, cost=COST,
                            max_sweeps=8, seed=0, max_micro_batches=9)
    assert mb.plan.rows == 9
    with pytest.raises(InputError, match="max_micro_batches"):
        plan_micro_batches(lengths, WINDOW.counts, dp_size=4, ep_size=2, max_tokens=1000, max_micro_batches=0)


def test_plan_cli_names_r_star_the_chosen_rows_and_why(run_cli, tmp_path):
    """routepack plan: the text names R*, the chosen R and why; --max-rows bounds the choice;
    --rows forces the count (no search); --max-rows 0 is one error line, exit 2."""
    from routepack_opt.core.cost import save_cost
    from routepack_opt.core.window import save_window

    save_window(WINDOW, tmp_path / "w.npz")
    save_cost(COST, tmp_path / "c.toml")
    args = [tmp_path / "w.npz", "--dp", 4, "--ep", 2, "--capacity", 1000, "--cost", tmp_path / "c.toml",
            "--max-sweeps", 8]
    code, out, err = run_cli("plan", *args)
    assert code == 0, err
    assert "rows: chose 10 of R*=9..13" in out and "rows beat R* = 9" in out
    code, out, err = run_cli("plan", *args, "--max-rows", 9, "--json")
    assert code == 0, err
    import json
    res = json.loads(out)
    assert res["rows"] == 9 and res["row_search"]["r_max"] == 9
    code, out, err = run_cli("plan", *args, "--rows", 11, "--json")
    assert code == 0 and json.loads(out)["rows"] == 11 and json.loads(out)["row_search"] is None
    code, out, err = run_cli("plan", *args, "--max-rows", 0)
    assert code == 2 and err.startswith("error:") and "--max-rows" in err

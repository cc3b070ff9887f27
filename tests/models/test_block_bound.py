"""The decomposition lower bound (models/layout_dw.py): never above the brute-force optimum under
either objective, never below the cheap bound, valid for any multipliers, and exactly what its
LP duals certify."""

import functools

import numpy as np
import pytest
from cases import layout_instance as _instance
from hypothesis import given, settings
from hypothesis import strategies as st

from routepack_opt.core.testing import random_layout
from routepack_opt.models.brute import brute_force_layout
from routepack_opt.models.layout_dw import (
    THETA_GRID,
    BlockData,
    Multipliers,
    block_bound,
    certified_attention,
    mean_multipliers,
)

OBJECTIVES = ("max-sum", "sum-max")
# (N, dp, ep, rows, capacity, seed), as in test_exact_layout.py: small enough to enumerate.
CASES = [
    (8, 4, 2, 2, 40, 3),
    (7, 2, 1, 2, 40, 2),
    (8, 6, 2, 1, 30, 5),
    (8, 2, 2, 3, 25, 7),
]


@functools.cache
def _brute(case, objective):
    """The brute-force optimum of a case (enumerated once per test session)."""
    return brute_force_layout(_instance(case, objective))


def _attention_sum(inst, row_N, slot_N) -> float:
    """Σ over the layout's blocks of its attention term (the evaluator's parts)."""
    _, A_SRG, _ = inst.evaluator.costs(inst.placement, row_N, slot_N, inst.rows, parts=True)
    return float(A_SRG.sum())


def _data(inst, classes=None) -> BlockData:
    topo = inst.topology
    return BlockData.build(inst.window.lengths, inst.coef_SN, topo.ep, topo.capacity,
                           inst.rows * topo.num_shards, classes)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("objective", OBJECTIVES)
def test_bound_below_brute_force_and_above_cheap(case, objective):
    """The certified bound lies between the cheap docs/model.md bound and the brute-force optimum."""
    inst = _instance(case, objective)
    ref = _brute(case, objective)
    bb = block_bound(inst, time_limit=10.0)
    assert bb.cheap <= bb.bound <= ref.objective * (1 + 1e-12)
    # its attention part bounds the optimum's attention too (the relaxation, not just the sum)
    assert bb.attention <= _attention_sum(inst, ref.row, ref.slot) * (1 + 1e-12)


def test_issue53_item1_bound_beats_the_cheap_bound():
    """Issue 53 item 1: on a window whose blocks each hold long samples, the decomposition bound
    is strictly above the cheap bound (every block is charged its largest cell, not one)."""
    inst = _instance(CASES[0], "max-sum")
    bb = block_bound(inst, time_limit=10.0)
    assert bb.bound > bb.cheap * (1 + 1e-3)
    assert bb.attention > bb.cheap_attention * (1 + 1e-2)


@pytest.mark.parametrize("classes", [None, 2])
def test_certificate_matches_the_lp(classes):
    """The integer recomputation of the LP's duals loses at most the rounding (1e-6 relative):
    the bound is the LP's value, recomputed, not taken from the solver. With 2 own classes the
    generic class carries the rest."""
    inst = _instance(CASES[0], "sum-max")
    bb = block_bound(inst, time_limit=10.0, classes=classes)
    assert bb.classes == (inst.num_samples if classes is None else 2)
    assert bb.lp_value is not None
    assert bb.attention <= bb.lp_value * (1 + 1e-9) + 1e-9
    assert bb.attention >= bb.lp_value * (1 - 1e-6)


def test_mean_multipliers_give_the_mean():
    """The fallback multipliers certify exactly Σ_s A_s / P (up to the floored cost unit)."""
    inst = _instance(CASES[2], "max-sum")
    data = _data(inst)
    mean = float(inst.coef_SN.sum()) / inst.topology.ep
    got = float(certified_attention(data, mean_multipliers(data)))
    assert mean * (1 - 1e-6) <= got <= mean * (1 + 1e-12)


def _block_sum(inst, row_N, slot_N, expert: bool) -> float:
    """Σ over the layout's blocks of attention (+ γ Σ_l max_p W with ``expert``)."""
    _, A_SRG, M_RGL = inst.evaluator.costs(inst.placement, row_N, slot_N, inst.rows, parts=True)
    return float(A_SRG.sum() + (inst.cost.gamma * M_RGL.sum() if expert else 0.0))


@settings(max_examples=40, deadline=None)
@given(case=st.sampled_from(CASES), classes=st.integers(0, 8), expert=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_any_multipliers_give_a_valid_bound(case, classes, expert, seed):
    """Weak duality: whatever the (integer) multipliers, the certified block sum (attention, and
    with ``expert`` the expert peaks too) is at most that of every layout — here the brute-force
    optimum's and random valid ones'."""
    inst = _instance(case, "max-sum")
    topo = inst.topology
    data = BlockData.build(inst.window.lengths, inst.coef_SN, topo.ep, topo.capacity,
                           inst.rows * topo.num_shards, classes,
                           expert_NLP=inst.cost.gamma * inst.b_NLP if expert else None)
    rng = np.random.default_rng(seed)
    base = mean_multipliers(data)
    nk = base.t_KS.shape[0]
    scale = int(np.abs(base.rho_N).max(initial=1))
    M = inst.window.num_layers * topo.ep
    mult = Multipliers(
        rho_N=base.rho_N + rng.integers(-scale, scale + 1, base.rho_N.size),
        t_KS=rng.integers(-5, THETA_GRID + 6, base.t_KS.shape),
        mu_K=rng.integers(-2, 3, nk) * (scale // max(1, inst.topology.capacity)),
        sigma_K=rng.integers(-1, 2, nk) * scale,
        kappa_K=rng.integers(-1, 2, nk) * scale,
        q_KM=rng.integers(-THETA_GRID // 4, THETA_GRID, (nk, M)) if expert else None)
    bound = float(certified_attention(data, mult))
    ref = _brute(case, "max-sum")
    assert bound <= _block_sum(inst, ref.row, ref.slot, expert) * (1 + 1e-12)
    for _ in range(5):
        row, slot = random_layout(inst.num_samples, inst.rows, inst.topology.dp, rng)
        if not inst.violations(row, slot):
            assert bound <= _block_sum(inst, row, slot, expert) * (1 + 1e-12)


# --- routepack exact: seeded with plan's plan, at any size (issue 53 items 3 and 4) ---------------


def _cli_window(tmp_path):
    from cases import TOY

    from routepack_opt.core.testing import random_window
    from routepack_opt.core.window import save_window

    w = random_window(12, 2, 4, 2, 20, seed=5)
    save_window(w, tmp_path / "w.npz")
    toml = tmp_path / "c.toml"
    toml.write_text(TOY.to_toml())
    return w, TOY, [str(tmp_path / "w.npz"), "--dp", "4", "--ep", "2", "--capacity", "40", "--cost", str(toml),
                    "--time-limit", "10", "--json"]


def test_issue53_item3_exact_never_worse_than_plan(tmp_path, capsys):
    """Issue 53 item 3: `exact` is seeded with `plan`'s own plan at the same settings (placement,
    rows, certificate, seed 0) — or a baseline that scores better — and its incumbent is never
    worse than that seed, re-scored by the evaluator."""
    import json

    from routepack_opt.cli import main
    from routepack_opt.cli.exact import warm_start
    from routepack_opt.core.evaluate import Evaluator
    from routepack_opt.core.topology import Topology
    from routepack_opt.pipeline import certified_rows, resolve_placement, solve

    w, cost, base = _cli_window(tmp_path)
    topo = Topology(4, 2, 40)
    ev = Evaluator(w, topo, cost)
    R, cert = certified_rows(w, topo, None, 10.0, "auto")
    pl, _ = resolve_placement(w, topo, "lpt")
    plan = solve(w, topo, cost, objective="max-sum", placement="lpt", rows=R, seed=0, certificate=cert)
    layout, name = warm_start(w, topo, cost, pl, R, "max-sum", 30.0, ev, cert)
    seed_key = ev.score_layout(pl, layout, "max-sum").key
    assert seed_key <= ev.score_layout(plan.placement, plan.layout, "max-sum").key
    assert name != "plan" or np.array_equal(layout.arrays()[0], plan.layout.arrays()[0])
    assert main(["exact", *base, "--objective", "max-sum"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["objective"] <= d["warm_start"]["makespan"] * (1 + 1e-12)
    assert d["decomposition"]["cheap_bound"] <= d["bound"] <= d["objective"] * (1 + 1e-12)
    assert {"warmup_seconds", "command_seconds"} <= set(d)  # compilation reported apart


def test_issue53_item4_exact_at_any_size(tmp_path, capsys, monkeypatch):
    """Issue 53 item 4: a window too large for the cell model still gets an answer: the warm
    start (plan's plan) with its certified decomposition bound and gap, status feasible or optimal."""
    import json

    from routepack_opt.cli import main
    from routepack_opt.models import layout

    monkeypatch.setattr(layout, "MAX_BINARIES", 10)
    _, _, base = _cli_window(tmp_path)
    assert main(["exact", *base, "--objective", "sum-max"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["model"].startswith("skipped") and d["status"] in ("feasible", "optimal")
    assert d["objective"] == pytest.approx(d["warm_start"]["makespan"], rel=1e-12)
    assert d["lower_bound"] <= d["bound"] <= d["objective"] * (1 + 1e-12)
    assert d["gap"] == pytest.approx(max(0.0, (d["objective"] - d["bound"]) / d["objective"]), abs=1e-12)


def test_issue53_item4_compare_shows_gap_to_certified_bound():
    """Issue 53 item 4: `compare` (exact auto) gives every plan its certified bound for its own
    placement — never below its docs/model.md bound, never above its makespan — and the table a
    column for it."""
    from cases import TOY

    from routepack_opt.compare import compare_plans, format_table
    from routepack_opt.core.testing import random_window
    from routepack_opt.core.topology import Topology

    w = random_window(12, 2, 4, 2, 20, seed=5)
    table, plans = compare_plans(w, Topology(4, 2, 40), TOY, max_sweeps=5, joint=False, exact_time_limit=5.0)
    assert "exact" in plans
    for m in table:
        assert m["lower_bound"] <= m["certified_bound"] <= m["makespan"] * (1 + 1e-12)
        assert m["gap_certified"] == pytest.approx(m["makespan"] / m["certified_bound"])
    assert "gap to cert. bound" in [c.header for c in format_table(table, "max-sum").columns]

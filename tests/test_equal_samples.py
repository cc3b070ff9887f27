"""Equal samples per DP slot (``Topology.equal_samples_per_slot``, verl's DP balance): the option
through the model, R*, the seeds, the annealer's moves, the exact models and the CLI."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from cases import COST, TOPOLOGIES, instance

from routepack_opt.certify import certify_rows, pack_into_bins
from routepack_opt.core.errors import InputError
from routepack_opt.core.evaluate import row_shard_costs, score_from_J
from routepack_opt.core.plan import Plan
from routepack_opt.core.testing import random_window
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import Window
from routepack_opt.heuristics.anneal import AnnealConfig, anneal, greedy_layout
from routepack_opt.heuristics.anneal.moves import run, run_one
from routepack_opt.heuristics.anneal.problem import Instance
from routepack_opt.heuristics.anneal.rng import rng_states
from routepack_opt.heuristics.anneal.state import Population
from routepack_opt.heuristics.baselines import verl_kk_layout
from routepack_opt.heuristics.equal_counts import equal_count_layout, equal_counts_ok


def _eq(topo: Topology) -> Topology:
    return dataclasses.replace(topo, equal_samples_per_slot=True)


# ------------------------------------------------------------------ model and validation


def test_topology_round_trips_the_option_and_omits_it_when_off():
    """The option is read back from the plan JSON topology; off, the dict has no new key."""
    t = Topology(dp=4, ep=2, capacity=100, equal_samples_per_slot=True)
    assert Topology.from_dict(t.to_dict()) == t
    off = Topology(dp=4, ep=2, capacity=100)
    assert "equal_samples_per_slot" not in off.to_dict()
    assert Topology.from_dict(off.to_dict()).equal_samples_per_slot is False
    with pytest.raises(InputError, match="true or false"):
        Topology(dp=4, ep=2, capacity=100, equal_samples_per_slot="yes")


def test_indivisible_window_is_an_input_error_naming_n_and_d():
    """N % D != 0 with the option on: one InputError naming N and D (verl asserts it too)."""
    t = Topology(dp=4, ep=2, capacity=1000, equal_samples_per_slot=True)
    with pytest.raises(InputError, match=r"N=10 .*D=4"):
        certify_rows(np.full(10, 5), t)
    Topology(dp=4, ep=2, capacity=1000).check_samples(10)  # off: no demand


def test_validate_reports_unequal_slot_counts():
    """Plan.validate flags slots holding unequal counts only when the topology demands equal ones."""
    w = random_window(8, 1, 4, 1, max_len=10, seed=0)
    row = np.array([0, 0, 0, 0, 0, 0, 0, 0])
    slot = np.array([0, 0, 0, 1, 1, 1, 1, 1])  # 3 vs 5
    topo = Topology(dp=2, ep=1, capacity=1000)
    pl = np.tile(np.arange(4), (1, 1))
    assert Plan(topo, 1, pl, row, slot).validate(w) == []
    errs = Plan(_eq(topo), 1, pl, row, slot).validate(w)
    assert len(errs) == 1 and "slot 0 holds 3" in errs[0] and "N/D = 4" in errs[0]
    slot = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    assert Plan(_eq(topo), 1, pl, row, slot).validate(w) == []


# ------------------------------------------------------------------ R*


def _brute_rows(lengths, D, C, equal):
    """Least R with a layout (every cell nonempty, cap kept, equal slot counts if asked), by
    enumerating every assignment of samples to cells."""
    N = len(lengths)
    for R in range(1, N // D + 1):
        for cells in itertools.product(range(R * D), repeat=N):
            cnt = np.bincount(cells, minlength=R * D)
            if (cnt == 0).any():
                continue
            if (np.bincount(cells, weights=lengths, minlength=R * D) > C).any():
                continue
            if equal and (cnt.reshape(R, D).sum(axis=0) != N // D).any():
                continue
            return R
    return None


def test_equal_counts_can_need_more_rows_and_cpsat_proves_it():
    """Three full-cap samples and three tiny ones on 2 slots: 2 rows without counts, 3 with
    (one slot must hold two full samples and a tiny one) — proved by the CP-SAT decision."""
    L = np.array([100, 100, 100, 1, 1, 1])
    free = Topology(dp=2, ep=1, capacity=100)
    assert certify_rows(L, free).rows == 2
    c = certify_rows(L, _eq(free))
    assert (c.rows, c.status, c.lower_bound, c.method) == (3, "optimal", 3, "cpsat")
    assert _brute_rows(L, 2, 100, True) == 3


@pytest.mark.parametrize("seed", range(6))
def test_certified_rows_equal_brute_force_on_tiny_windows(seed):
    """R* with equal counts equals brute-force enumeration on tiny windows (status optimal)."""
    rng = np.random.default_rng(seed)
    N, D = 6, 2
    L = rng.integers(1, 60, N)
    C = int(max(L.max(), rng.integers(60, 120)))
    c = certify_rows(L, Topology(dp=D, ep=1, capacity=C, equal_samples_per_slot=True), 20.0)
    want = _brute_rows(L, D, C, True)
    assert c.status == "optimal" and c.rows == want


@pytest.mark.parametrize("C", [1200, 700, 420])
def test_seed_layouts_keep_equal_counts(C):
    """verl-kk (verl's split, repairs inside a slot) and the constructions give valid layouts
    with N/D samples per slot at R*; nemo-ffd is skipped as a seed."""
    from routepack_opt.pipeline import baseline_layouts

    w = random_window(64, 2, 8, 2, max_len=400, seed=11)
    topo = Topology(dp=4, ep=2, capacity=C, equal_samples_per_slot=True)
    R = certify_rows(w, topo).rows
    seeds = baseline_layouts(w, topo, R)
    assert "nemo-ffd" not in seeds and seeds
    pl = np.tile(np.arange(8), (2, 1))
    for row, slot in [lay.arrays() for lay in seeds.values()] + [verl_kk_layout(w.lengths, topo, R, exact_pack=pack_into_bins)]:
        assert Plan(topo, R, pl, row, slot).validate(w) == []
        assert equal_counts_ok(slot, 4)


# ------------------------------------------------------------------ annealer moves


def _eq_instance(ti, seed, n=40):
    w, topo, pl, b, R = instance(TOPOLOGIES[ti], seed=seed, n=n)
    topo = _eq(topo)
    row, slot = equal_count_layout(w.lengths, topo, R, exact_pack=pack_into_bins)
    return w, topo, pl, b, R, row, slot


@pytest.mark.parametrize("objective", ["max-sum", "sum-max"])
@pytest.mark.parametrize("mix", ["relocate", "swap", "guided", "rotate"])
@pytest.mark.parametrize("ti", [0, 1, 2, 4])
def test_equal_count_moves_delta_equals_full_reevaluation(objective, mix, ti):
    """With equal counts, every move's (Δmakespan, Δtotal, Δpeak) equals a full re-evaluation
    (relocate, swap, guided and rotation moves), every slot keeps N/D samples, and relocations
    stay in their slot."""
    w, topo, pl, b, R, row, slot = _eq_instance(ti, seed=ti, n=42 if ti == 2 else 40)
    cfg = AnnealConfig(p_swap={"relocate": 0.0, "swap": 1.0, "guided": 0.5, "rotate": 0.5}[mix],
                         p_guide={"guided": 1.0, "rotate": 0.3}.get(mix, 0.0), p_near=0.5, swap_window=3,
                         p_rotate=1.0 if mix == "rotate" else 0.0)
    pb = Instance(w.lengths, b, topo, COST, R, objective, cfg.tie_eps)
    pop = Population(pb, 1)
    r32, s32 = pb.check_layout(row, slot, "layout")
    pop.init(r32[None], s32[None])
    pop.walk.rng[:] = rng_states(ti, 0, 1)
    J0 = row_shard_costs(w.lengths, b, row, slot, R, topo, COST)
    before = score_from_J(J0, objective)
    m = w.num_samples // topo.dp
    checked = relocated = 0
    for _ in range(300):
        n_eval = pop.walk.counters[0, 0]
        old_slot = pop.state.slot[0].copy()
        old_row = pop.state.row[0].copy()
        run_one(pop, 1, np.inf, cfg)
        if pop.walk.counters[0, 0] == n_eval:
            continue
        moved = np.flatnonzero((pop.state.slot[0] != old_slot) | (pop.state.row[0] != old_row))
        if moved.size == 1:  # a relocation: same slot, another row
            relocated += 1
            assert pop.state.slot[0][moved[0]] == old_slot[moved[0]]
        r_N, s_N = pop.layout(0)
        assert (np.bincount(s_N, minlength=topo.dp) == m).all()
        after = score_from_J(row_shard_costs(w.lengths, b, r_N, s_N, R, topo, COST), objective)
        d = pop.walk.last[0]
        scale = max(1.0, abs(before.makespan))
        assert d[0] == pytest.approx(after.makespan - before.makespan, abs=1e-9 * scale)
        assert d[1] == pytest.approx(after.total - before.total, abs=1e-9 * scale)
        assert d[2] == pytest.approx(after.peak - before.peak, abs=1e-9 * scale)
        before = after
        checked += 1
    assert checked >= 30
    if mix == "relocate":
        assert relocated >= 20


@pytest.mark.parametrize("objective", ["max-sum", "sum-max"])
def test_long_walks_keep_equal_counts(objective):
    """Long T = ∞ walks (relocations, swaps, guided moves) keep N/D samples in every slot and
    every other constraint; the annealer's result does too."""
    w, topo, pl, b, R, row, slot = _eq_instance(1, seed=5, n=60)
    cfg = AnnealConfig(p_guide=0.3, p_swap=0.5)
    pb = Instance(w.lengths, b, topo, COST, R, objective, cfg.tie_eps)
    pop = Population(pb, 2)
    r32, s32 = pb.check_layout(row, slot, "layout")
    pop.init(np.stack([r32, r32]), np.stack([s32, s32]))
    pop.walk.rng[:] = rng_states(3, 0, 2)
    start = [pop.layout(k) for k in range(2)]
    for _ in range(5):
        run(pop, 4000, np.inf, cfg)
        for k in range(2):
            r_N, s_N = pop.layout(k)
            assert Plan(topo, R, pl, r_N, s_N, objective=objective).validate(w) == []
    assert any((pop.layout(k)[0] != start[k][0]).any() for k in range(2))
    res = anneal(w.lengths, b, topo, COST, R, objective, [(row, slot)], seed=1, max_sweeps=20)
    assert Plan(topo, R, pl, res.row, res.slot, objective=objective).validate(w) == []


def test_anneal_rejects_a_seed_with_unequal_counts():
    """A seed breaking equal counts is refused with an InputError when the option is on."""
    w, topo, pl, b, R, row, slot = _eq_instance(0, seed=2)
    i = int(np.flatnonzero(slot == 0)[0])
    bad = slot.copy()
    bad[i] = 1
    with pytest.raises(InputError):
        anneal(w.lengths, b, topo, COST, R, "max-sum", [(row, bad)], max_sweeps=1)


# ------------------------------------------------------------------ exact models

from cases import TOY  # noqa: E402

from routepack_opt.core.evaluate import Evaluator  # noqa: E402
from routepack_opt.core.testing import random_layout  # noqa: E402
from routepack_opt.models import layout_blocks  # noqa: E402
from routepack_opt.models.brute import brute_force_layout  # noqa: E402
from routepack_opt.models.layout import LayoutInstance, canonical_layout, is_canonical, solve_layout  # noqa: E402

# (N, dp, ep, rows, capacity, seed): N divisible by dp; small enough to enumerate every cell order.
EQ_CASES = [
    (8, 2, 2, 2, 40, 0),   # G=1, R=2: slots of one shard
    (8, 4, 2, 1, 40, 1),   # G=2, one row
    (6, 2, 1, 2, 40, 2),   # P=1: every slot its own shard
    (8, 2, 2, 3, 30, 7),   # G=1, R=3: uneven rows inside a slot
    (8, 4, 2, 2, 40, 3),   # G=2, R=2: cells = samples, counts fixed by the nonempty rule
]


def _eq_layout_instance(case, objective):
    N, D, P, R, C, seed = case
    w = random_window(N, 2, 4, 2, 20, seed)
    topo = Topology(D, P, C, equal_samples_per_slot=True)
    return LayoutInstance.build(w, topo, TOY, np.tile(np.arange(4), (2, 1)), R, objective)


@pytest.fixture(scope="module")
def eq_brute():
    cache = {}

    def get(case, objective):
        if (case, objective) not in cache:
            cache[case, objective] = brute_force_layout(_eq_layout_instance(case, objective))
        return cache[case, objective]
    return get


@pytest.mark.parametrize("objective", ["max-sum", "sum-max"])
@pytest.mark.parametrize("shape", [(4, 2, 3), (6, 2, 2), (4, 1, 2), (2, 2, 4)])
def test_equal_count_symmetry_representative_keeps_score_and_counts(objective, shape):
    """Under equal counts the orbit representative keeps the score and every slot's count, is
    canonical, and canonicalising is idempotent (the per-row slot/shard levels are replaced)."""
    D, P, R = shape
    N = D * (R + 2)
    w = random_window(N, 3, 4, 2, 30, seed=D * 10 + R)
    topo = Topology(D, P, 10_000, equal_samples_per_slot=True)
    ev = Evaluator(w, topo, TOY)
    pl = np.tile(np.arange(4), (3, 1))
    rng = np.random.default_rng(R)
    for k in range(20):
        row, slot = random_layout(N, R, D, rng)
        slot = np.repeat(np.arange(D), N // D)[rng.permutation(N)]  # equal counts
        row = np.concatenate([np.arange(R), rng.integers(0, R, N // D - R)])[
            np.argsort(np.argsort(slot, kind="stable"), kind="stable") % (N // D)]
        assert Plan(topo, R, pl, row, slot).validate(w) == []
        order = None if k % 2 else rng.permutation(N)
        r2, s2 = canonical_layout(row, slot, topo, R, objective, order)
        assert np.allclose(ev.score(pl, row, slot, R, objective).key,
                           ev.score(pl, r2, s2, R, objective).key, rtol=1e-12)
        assert Plan(topo, R, pl, r2, s2).validate(w) == []
        assert is_canonical(r2, s2, topo, R, objective, order)


@pytest.mark.parametrize("solver", ["cpsat", "highs"])
@pytest.mark.parametrize("objective", ["max-sum", "sum-max"])
@pytest.mark.parametrize("case", EQ_CASES, ids=[f"N{c[0]}D{c[1]}P{c[2]}R{c[3]}" for c in EQ_CASES])
def test_exact_models_with_equal_counts_equal_brute_force(case, objective, solver, eq_brute):
    """CP-SAT and HiGHS, with the per-slot count constraint and the adapted symmetry breaking,
    prove the brute-force optimum over equal-count layouts; their layouts keep the counts."""
    inst = _eq_layout_instance(case, objective)
    ref = eq_brute(case, objective)
    assert ref.score is not None
    res = solve_layout(inst.window, inst.topology, inst.cost, inst.placement, inst.rows, objective,
                       solver=solver, time_limit=30.0)
    assert res.status == "optimal"
    assert abs(res.objective - ref.objective) <= 2 * res.rounding_error + 1e-7 * ref.objective
    assert res.bound <= ref.objective * (1 + 1e-9)
    assert not inst.violations(res.row, res.slot)
    assert equal_counts_ok(res.slot, inst.topology.dp)


def test_equal_counts_can_cost_makespan_and_models_see_it(eq_brute):
    """On some tiny window the equal-count optimum is strictly worse than the free one (the
    constraint binds), and the exact models find the constrained value, not the free one."""
    from cases import layout_instance as _instance

    found = False
    for case in EQ_CASES:
        free = brute_force_layout(_instance(case, "max-sum"))
        eq = eq_brute(case, "max-sum")
        assert eq.objective >= free.objective - 1e-9 * free.objective
        found |= eq.objective > free.objective * (1 + 1e-9)
    assert found


def test_block_decomposition_is_skipped_with_equal_counts():
    """The block decomposition cannot see slot totals, so it is not applied under the option."""
    inst = _eq_layout_instance(EQ_CASES[0], "max-sum")
    assert not layout_blocks.applicable(inst)
    free = LayoutInstance.build(inst.window, dataclasses.replace(inst.topology, equal_samples_per_slot=False),
                                TOY, inst.placement, inst.rows, "max-sum")
    assert layout_blocks.applicable(free)


def test_solve_layout_rejects_indivisible_window():
    """The exact models refuse N % D != 0 under the option with an InputError naming N and D."""
    w = random_window(7, 2, 4, 2, 20, 0)
    with pytest.raises(InputError, match="N=7"):
        solve_layout(w, Topology(2, 2, 40, equal_samples_per_slot=True), TOY,
                     np.tile(np.arange(4), (2, 1)), 2)


# ------------------------------------------------------------------ pipeline, API and CLI


def test_pipeline_plan_keeps_equal_counts_and_round_trips(tmp_path):
    """solve() with the option (lpt and joint placement) returns a valid plan with N/D samples per
    slot; its JSON carries the option and reads back into a plan that still validates."""
    from routepack_opt.core.cost import CostModel, Stage
    from routepack_opt.core.plan import load_plan
    from routepack_opt.pipeline import solve

    cost = CostModel(stages=(Stage("full_attn", alpha=0.02, beta=4e-5),), gamma=0.01, row_overhead=5.0)
    w = random_window(64, 4, 16, 2, max_len=400, seed=11, skew=1.2)
    topo = Topology(dp=4, ep=2, capacity=1200, equal_samples_per_slot=True)
    for placement in ("lpt", "joint"):
        p = solve(w, topo, cost, objective="max-sum", placement=placement, max_sweeps=8, seed=3)
        assert p.validate(w) == [] and equal_counts_ok(p.slot, 4)
        assert p.to_json()["topology"]["equal_samples_per_slot"] is True
    p.save(tmp_path / "p.json")
    back = load_plan(tmp_path / "p.json", num_samples=64)
    assert back.topology.equal_samples_per_slot and back.validate(w) == []


def test_api_option_reaches_the_plan():
    """plan_micro_batches(equal_samples_per_slot=True) gives every DP rank N/D samples; an
    indivisible window is an InputError naming N and D."""
    from routepack_opt.api import plan_micro_batches

    w = random_window(48, 2, 8, 2, max_len=300, seed=4)
    mb = plan_micro_batches(w.lengths, w.counts, dp_size=4, ep_size=2, max_tokens=900,
                            equal_samples_per_slot=True, max_sweeps=4)
    assert [sum(len(c) for c in rank) for rank in mb.micro_batches] == [12] * 4
    with pytest.raises(InputError, match=r"N=47 .*D=4"):
        plan_micro_batches(w.lengths[:47], w.counts[:47], dp_size=4, ep_size=2, max_tokens=900,
                           equal_samples_per_slot=True, max_sweeps=4)


def test_cli_flag_on_certify_plan_evaluate(run_cli, tmp_path):
    """--equal-samples-per-slot on certify/plan/evaluate: the plan keeps counts and says so;
    evaluate with the flag rejects a plan made without it when its counts are unequal; an
    indivisible window exits 2 with one error line naming N and D."""
    import json

    from routepack_opt.core.window import save_window

    w = random_window(48, 2, 8, 2, max_len=300, seed=4)
    save_window(w, tmp_path / "w.npz")
    topo = ["--dp", "4", "--ep", "2", "--capacity", "900"]
    code, out, err = run_cli("certify", tmp_path / "w.npz", *topo, "--equal-samples-per-slot", "--json")
    assert code == 0, err
    assert json.loads(out)["status"] == "optimal"
    code, out, err = run_cli("plan", tmp_path / "w.npz", *topo, "--cost", "qwen3-30b-a3b",
                             "--equal-samples-per-slot", "--max-sweeps", "4", "-o", tmp_path / "p.json", "--json")
    assert code == 0, err
    d = json.loads((tmp_path / "p.json").read_text())
    assert d["topology"]["equal_samples_per_slot"] is True
    assert [sum(len(d["cells"][r][s]) for r in range(d["rows"])) for s in range(4)] == [12] * 4
    code, _, err = run_cli("evaluate", tmp_path / "w.npz", tmp_path / "p.json", "--cost", "qwen3-30b-a3b",
                           "--equal-samples-per-slot", "--json")
    assert code == 0, err
    # a plan with unequal counts, checked with the flag
    row = np.zeros(48, dtype=np.int64)
    slot = np.r_[np.zeros(9), np.ones(13), np.full(13, 2), np.full(13, 3)].astype(np.int64)
    Plan(Topology(dp=4, ep=2, capacity=10**6), 1, np.tile(np.arange(8), (2, 1)), row, slot).save(tmp_path / "u.json")
    code, _, err = run_cli("evaluate", tmp_path / "w.npz", tmp_path / "u.json", "--cost", "qwen3-30b-a3b")
    assert code == 0, err
    code, _, err = run_cli("evaluate", tmp_path / "w.npz", tmp_path / "u.json", "--cost", "qwen3-30b-a3b",
                           "--equal-samples-per-slot")
    assert code == 2 and "slot 0 holds 9" in err and err.count("\n") == 1
    save_window(Window(w.lengths[:47], w.counts[:47], top_k=w.top_k), tmp_path / "w47.npz")
    code, _, err = run_cli("plan", tmp_path / "w47.npz", *topo, "--cost", "qwen3-30b-a3b",
                           "--equal-samples-per-slot", "-o", tmp_path / "q.json")
    assert code == 2 and "N=47" in err and "D=4" in err


def test_cli_flag_on_exact_and_compare(run_cli, tmp_path):
    """`exact --equal-samples-per-slot` proves an equal-count optimum and writes a plan that keeps
    the counts; `compare` with the flag plans every row with N/D samples per slot."""
    import json

    from routepack_opt.core.plan import load_plan
    from routepack_opt.core.window import save_window

    w = random_window(8, 2, 4, 2, 20, 0)
    save_window(w, tmp_path / "w.npz")
    topo = ["--dp", "2", "--ep", "2", "--capacity", "40", "--equal-samples-per-slot"]
    code, out, err = run_cli("exact", tmp_path / "w.npz", *topo, "--cost", "qwen3-30b-a3b", "--solver", "highs",
                             "--rows", "2", "--time-limit", "30", "-o", tmp_path / "e.json", "--json")
    assert code == 0, err
    assert json.loads(out)["status"] == "optimal"
    p = load_plan(tmp_path / "e.json", num_samples=8)
    assert p.topology.equal_samples_per_slot and p.validate(w) == [] and equal_counts_ok(p.slot, 2)
    w = random_window(48, 2, 8, 2, max_len=300, seed=4)
    save_window(w, tmp_path / "w48.npz")
    code, out, err = run_cli("compare", tmp_path / "w48.npz", "--dp", "4", "--ep", "2", "--capacity", "900",
                             "--equal-samples-per-slot", "--cost", "qwen3-30b-a3b", "--max-sweeps", "4",
                             "--exact", "no", "--json")
    assert code == 0, err
    assert len(json.loads(out)["rows"]) >= 3


@pytest.mark.parametrize("ti", [0, 1, 2])
def test_greedy_seed_keeps_equal_counts(ti):
    """The joint-cost greedy seed, with the option on, gives every slot N/D samples (its per-slot
    quota) and a valid layout, or None when capacity blocks it."""
    w, topo, pl, b, R, row, slot = _eq_instance(ti, seed=ti, n=42 if ti == 2 else 40)
    for objective in ("max-sum", "sum-max"):
        g = greedy_layout(w.lengths, b, topo, COST, R, objective)
        assert g is not None
        assert Plan(topo, R, pl, *g).validate(w) == []


def test_async_planner_option_and_quick_fallback_keep_equal_counts():
    """AsyncPlanner.submit takes the option; its numba-free quick fallback gives every slot N/D
    samples (count-limited first fit), valid under the cap."""
    from routepack_opt import api
    from routepack_opt.api import PlanOptions
    rng = np.random.default_rng(3)
    lengths = rng.integers(50, 600, size=48)
    counts = np.zeros((48, 1, 4), dtype=np.int64)
    counts[:, 0, 0] = lengths
    opts = PlanOptions(dp_size=4, ep_size=2, max_tokens=1000, equal_samples_per_slot=True)
    mb = api._quick_plan(api._Job(Window(lengths, counts, top_k=1), opts, 0.0, api.Future()))
    assert mb.plan.validate(Window(lengths, counts, top_k=1)) == []
    assert [sum(len(c) for c in rank) for rank in mb.micro_batches] == [12] * 4
    planner = api.AsyncPlanner(warm=False)
    try:
        fut = planner.submit(lengths, counts, deadline=60.0, dp_size=4, ep_size=2, max_tokens=1000,
                             equal_samples_per_slot=True, max_sweeps=2)
        got = fut.result(timeout=120)
        assert [sum(len(c) for c in rank) for rank in got.micro_batches] == [12] * 4
    finally:
        planner.close()


def test_without_the_exact_decision_the_certificate_stays_honest(monkeypatch):
    """When the CP-SAT decision cannot run (too large), R* is reported `feasible` with the proved
    lower bound, never `optimal` (here: a construction fills 3 rows, only 2 are proved needed)."""
    import routepack_opt.certify as cm

    monkeypatch.setattr(cm, "_EQUAL_EXACT_MAX_BINARIES", 0)
    c = certify_rows(np.array([100, 100, 100, 1, 1, 1]), Topology(dp=2, ep=1, capacity=100,
                                                                 equal_samples_per_slot=True))
    assert (c.rows, c.status, c.lower_bound) == (3, "feasible", 2)


def test_solve_uses_the_certificates_layout_when_no_construction_fills_r_star():
    """Equal counts, R* = 1 proved by CP-SAT while no construction finds a layout: solve plans from the certificate's layout (was an InputError)."""
    from routepack_opt.core.cost import get_preset
    from routepack_opt.core.window import Window
    from routepack_opt.pipeline import solve

    lens = np.array([60, 90, 30, 10, 700, 20, 340, 150])
    w = Window(lens, lens[:, None, None], top_k=1)
    topo = Topology(dp=2, ep=1, capacity=800, equal_samples_per_slot=True)
    plan = solve(w, topo, get_preset("qwen3-30b-a3b").cost, max_sweeps=5)
    assert plan.rows == 1 and plan.validate(w) == []
    assert "certificate" in plan.report.seed_scores

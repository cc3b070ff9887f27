"""Exact layout models (CP-SAT and Pyomo/HiGHS) against brute force, each other, the evaluator and
the annealer; validity of the symmetry breaking for each objective."""

import numpy as np
import pyomo.environ as pyo
import pytest
from cases import TOY
from cases import layout_instance as _instance
from ortools.sat.python import cp_model

from routepack_opt.core.cost import resolve_cost
from routepack_opt.core.errors import InputError
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.core.testing import random_layout, random_window
from routepack_opt.core.topology import Topology
from routepack_opt.models import layout_cpsat, layout_milp
from routepack_opt.models.brute import brute_force_layout, set_partitions
from routepack_opt.models.layout import (
    ExactOptions,
    LayoutInstance,
    canonical_layout,
    is_canonical,
    solve_layout,
    symmetry_groups,
)

OBJECTIVES = ("max-sum", "sum-max")

# (N, dp, ep, rows, capacity, seed): G = dp / ep shards; all small enough to enumerate.
CASES = [
    (8, 4, 2, 2, 40, 3),   # G=2, R=2: both row and shard symmetry matter
    (8, 4, 2, 1, 40, 1),   # G=2, one row
    (8, 2, 2, 2, 40, 0),   # G=1, R=2
    (7, 2, 1, 2, 40, 2),   # P=1: every slot its own shard (G=2)
    (8, 6, 2, 1, 30, 5),   # G=3
    (8, 2, 2, 3, 25, 7),   # G=1, R=3, tight capacity
]


def _tol(res, ref):
    """Allowed makespan difference: CP-SAT's stated rounding (twice), else solver tolerance."""
    return 2 * res.rounding_error + 1e-7 * abs(ref)


def _solve(inst, solver, time_limit=30.0, warm_start=None, **options):
    return solve_layout(inst.window, inst.topology, inst.cost, inst.placement, inst.rows, inst.objective,
                        solver=solver, time_limit=time_limit, warm_start=warm_start, options=ExactOptions(**options))


@pytest.fixture(scope="module")
def brute():
    cache = {}

    def get(case, objective):
        if (case, objective) not in cache:
            cache[case, objective] = brute_force_layout(_instance(case, objective))
        return cache[case, objective]
    return get


# --- brute force itself ----------------------------------------------------------------------


def test_set_partitions_count_stirling():
    """The partition enumerator yields exactly S(n, k) partitions when capacity never binds."""
    assert sum(1 for _ in set_partitions([1] * 6, 3, 100)) == 90  # S(6,3)
    assert sum(1 for _ in set_partitions([1] * 5, 5, 100)) == 1
    assert sum(1 for _ in set_partitions([3, 3, 3], 2, 4)) == 0  # capacity rules out all


def test_brute_matches_plain_enumeration():
    """Skipping slot order inside a block loses nothing: plain enumeration of every cell
    assignment (no symmetry used at all) finds the same optimum on a very small case."""
    import itertools

    inst = _instance((6, 4, 2, 1, 40, 11), "max-sum")
    best = None
    for cells in itertools.product(range(inst.num_cells), repeat=inst.num_samples):
        cell_N = np.array(cells)
        if np.unique(cell_N).size < inst.num_cells:
            continue
        row, slot = cell_N // inst.topology.dp, cell_N % inst.topology.dp
        if inst.violations(row, slot):
            continue
        key = inst.score(row, slot).key
        best = key if best is None else min(best, key)
    assert brute_force_layout(inst).score.key == best


# --- symmetry breaking is valid ---------------------------------------------------------------


@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("shape", [(4, 2, 3), (6, 2, 2), (4, 1, 2), (8, 4, 2), (2, 2, 4)])
def test_canonical_layout_keeps_score(objective, shape):
    """The orbit representative the models keep scores exactly like the original layout (so
    symmetry breaking cannot cut off an optimum), is canonical, and canonicalising is idempotent."""
    D, P, R = shape
    w = random_window(R * D + 6, 3, 4, 2, 30, seed=D * 10 + R)
    topo = Topology(D, P, 10_000)
    ev = Evaluator(w, topo, TOY)
    rng = np.random.default_rng(R)
    pl = np.tile(np.arange(4), (3, 1))
    for k in range(20):
        row, slot = random_layout(w.num_samples, R, D, rng)
        order = None if k % 2 else rng.permutation(w.num_samples)  # the models use a custom order
        r2, s2 = canonical_layout(row, slot, topo, R, objective, order)
        a, b = ev.score(pl, row, slot, R, objective), ev.score(pl, r2, s2, R, objective)
        assert np.allclose(a.key, b.key, rtol=1e-12)
        assert is_canonical(r2, s2, topo, R, objective, order)
        assert np.array_equal(canonical_layout(r2, s2, topo, R, objective, order)[1], s2)


def test_symmetry_is_objective_specific():
    """Permuting shards inside one row keeps sum-max but can change max-sum (and permuting one
    shard's rows keeps max-sum but can change sum-max): the groups differ for good reason."""
    w = random_window(12, 2, 4, 2, 30, seed=4)
    topo = Topology(4, 2, 10_000)
    ev = Evaluator(w, topo, TOY)
    pl = np.tile(np.arange(4), (2, 1))
    rng = np.random.default_rng(0)
    changed = {"max-sum": False, "sum-max": False}
    swap = np.array([2, 3, 0, 1])  # shard 0 <-> shard 1
    for _ in range(30):
        row, slot = random_layout(12, 2, 4, rng)
        s2 = np.where(row == 0, swap[slot], slot)  # shards swapped in row 0 only
        r3 = np.where(slot < 2, 1 - row, row)  # rows swapped in shard 0 only
        assert np.isclose(ev.score(pl, row, s2, 2, "sum-max").makespan, ev.score(pl, row, slot, 2, "sum-max").makespan)
        assert np.isclose(ev.score(pl, r3, slot, 2, "max-sum").makespan, ev.score(pl, row, slot, 2, "max-sum").makespan)
        changed["max-sum"] |= not np.isclose(ev.score(pl, row, s2, 2, "max-sum").makespan, ev.score(pl, row, slot, 2, "max-sum").makespan)
        changed["sum-max"] |= not np.isclose(ev.score(pl, r3, slot, 2, "sum-max").makespan, ev.score(pl, row, slot, 2, "sum-max").makespan)
    assert all(changed.values())
    ms = symmetry_groups(topo, 2, "max-sum")
    sm = symmetry_groups(topo, 2, "sum-max")
    assert len(ms[0]) == 2 and len(ms[0][0]) == 4  # whole shards: 2 rows × 2 slots each
    assert len(sm[0]) == 2 and len(sm[0][0]) == 4  # whole rows: 4 slots each


# --- both models equal brute force ------------------------------------------------------------


@pytest.mark.parametrize("solver", ["cpsat", "highs"])
@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("case", CASES, ids=[f"N{c[0]}D{c[1]}P{c[2]}R{c[3]}" for c in CASES])
def test_model_equals_brute_force(case, objective, solver, brute):
    """With symmetry breaking on, each model proves the brute-force optimum; its objective is the
    evaluator's score of its layout; its bound is valid."""
    inst = _instance(case, objective)
    ref = brute(case, objective)
    res = _solve(inst, solver)
    assert res.status == "optimal"
    assert abs(res.objective - ref.objective) <= _tol(res, ref.objective)
    assert res.bound <= ref.objective + 1e-9 * ref.objective
    assert res.bound >= inst.lower_bound() - 1e-9
    assert res.objective == inst.score(res.row, res.slot).makespan  # re-scored by the evaluator
    assert abs(res.claimed - res.objective) <= res.rounding_error + 1e-6 * res.objective
    assert not inst.violations(res.row, res.slot)


@pytest.mark.parametrize("solver", ["cpsat", "highs"])
@pytest.mark.parametrize("objective", OBJECTIVES)
def test_lexicographic_equals_brute_force(objective, solver, brute):
    """The second stage reaches brute force's (makespan, total) lexicographic optimum."""
    case = CASES[0]
    inst = _instance(case, objective)
    ref = brute(case, objective)
    res = _solve(inst, solver, lexicographic=True)
    assert res.status == "optimal"
    assert abs(res.score.makespan - ref.score.makespan) <= _tol(res, ref.objective)
    assert abs(res.score.total - ref.score.total) <= 2 * _tol(res, ref.score.total) * 4


@pytest.mark.parametrize("solver", ["cpsat", "highs"])
def test_symmetry_off_and_warm_start_agree(solver, brute):
    """Without symmetry breaking, and from a non-canonical warm start, the optimum is the same."""
    case = CASES[0]
    for objective in OBJECTIVES:
        inst = _instance(case, objective)
        ref = brute(case, objective)
        off = _solve(inst, solver, symmetry=False)
        assert off.status == "optimal" and abs(off.objective - ref.objective) <= _tol(off, ref.objective)
        # a feasible but poor, non-canonical warm start: the brute-force optimum mirrored
        row = inst.rows - 1 - ref.row
        slot = inst.topology.dp - 1 - ref.slot
        assert not is_canonical(row, slot, inst.topology, inst.rows, objective, inst.order_N)
        warm = _solve(inst, solver, warm_start=(row, slot))
        assert warm.status == "optimal" and abs(warm.objective - ref.objective) <= _tol(warm, ref.objective)


def test_preset_cost_and_trace_window():
    """Realistic coefficients (a derived preset, 2 attention stages) on a synthetic RL trace
    window: both models equal brute force (CP-SAT's scaling keeps its error tiny)."""
    from routepack_opt.trace import generate_window

    cost = resolve_cost("ling-hybrid")
    w = generate_window("ling-hybrid", 8, seed=1, num_layers=2, num_experts=8, capacity=4096)
    topo = Topology(4, 2, 4096)
    pl = np.tile(np.arange(8), (2, 1))
    for objective in OBJECTIVES:
        inst = LayoutInstance.build(w, topo, cost, pl, 1, objective)
        ref = brute_force_layout(inst)
        for solver in ("cpsat", "highs"):
            res = _solve(inst, solver)
            assert res.status == "optimal"
            assert abs(res.objective - ref.objective) <= _tol(res, ref.objective)
            assert res.rounding_error <= 1e-6 * ref.objective


# --- hints / starts are complete and feasible ----------------------------------------------------


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_cpsat_hint_is_complete_and_feasible(objective):
    """The canonicalised heuristic hint satisfies every constraint (incl. symmetry breaking):
    fixing every variable to it leaves a feasible model whose value is the hint's."""
    inst = _instance((10, 4, 2, 2, 60, 9), objective)
    sc = layout_cpsat.CpsatScaling(inst)
    m = layout_cpsat._Model(inst, sc)
    m.add_symmetry_breaking()
    m.minimise_makespan()
    rng = np.random.default_rng(1)
    row, slot = random_layout(inst.num_samples, inst.rows, inst.topology.dp, rng)
    assert not inst.violations(row, slot)
    m.hint(*canonical_layout(row, slot, inst.topology, inst.rows, objective, inst.order_N))
    solver = cp_model.CpSolver()
    solver.parameters.fix_variables_to_their_hinted_value = True
    solver.parameters.num_workers = 1
    assert solver.Solve(m.model) == cp_model.OPTIMAL
    true = inst.score(row, slot).makespan
    assert abs(sc.to_us(solver.ObjectiveValue()) + inst.constant() - true) <= sc.error + 1e-9 * true


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_milp_start_satisfies_every_constraint(objective):
    """The MIP start (layout + implied auxiliaries) violates no constraint of the Pyomo model."""
    inst = _instance((10, 4, 2, 2, 60, 9), objective)
    m, unit = layout_milp.build_milp(inst, symmetry=True)
    rng = np.random.default_rng(2)
    row, slot = random_layout(inst.num_samples, inst.rows, inst.topology.dp, rng)
    layout_milp._set_start(m, inst, *canonical_layout(row, slot, inst.topology, inst.rows, objective, inst.order_N))
    for con in m.component_data_objects(pyo.Constraint, active=True):
        body = pyo.value(con.body)
        assert con.lower is None or body >= pyo.value(con.lower) - 1e-9, con.name
        assert con.upper is None or body <= pyo.value(con.upper) + 1e-9, con.name
    true = inst.score(row, slot).makespan
    assert abs(pyo.value(m.makespan) * unit + inst.constant() - true) <= 1e-9 * true


# --- CP-SAT and HiGHS agree beyond brute-force sizes ------------------------------------------------


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_cpsat_and_highs_agree(objective):
    """On a window bigger than the brute-force cases (N=10), both models prove the same optimum."""
    inst = _instance((10, 4, 2, 2, 60, 21), objective)
    a = _solve(inst, "cpsat")
    b = _solve(inst, "highs")
    assert a.status == b.status == "optimal"
    assert abs(a.objective - b.objective) <= _tol(a, b.objective)
    assert a.bound <= b.objective + 1e-9 * b.objective and b.bound <= a.objective + 1e-9 * a.objective


# --- infeasible and anytime ----------------------------------------------------------------------


@pytest.mark.parametrize("solver", ["cpsat", "highs"])
def test_infeasible_rows_and_capacity(solver):
    """Too many cells for the samples, or lengths no layout can fit, are reported infeasible."""
    w = random_window(6, 2, 4, 2, 20, seed=0)
    pl = np.tile(np.arange(4), (2, 1))
    res = solve_layout(w, Topology(4, 2, 40), TOY, pl, 2, solver=solver, time_limit=10)
    assert res.status == "infeasible" and res.row is None and res.objective is None
    # passes the cheap checks (N ≥ cells, Σlen ≤ cells·C) but three 6-token samples need 3 cells
    from routepack_opt.core.window import Window
    counts = np.zeros((5, 1, 2), dtype=np.int64)
    lens = np.array([6, 6, 6, 1, 1])
    counts[:, 0, 0] = lens
    w2 = Window(lens, counts, top_k=1)
    res = solve_layout(w2, Topology(2, 2, 10), TOY, np.array([[0, 1]]), 1, solver=solver, time_limit=10)
    assert res.status == "infeasible"


@pytest.mark.parametrize("solver", ["cpsat", "highs"])
def test_time_limit_returns_valid_layout_and_bound(solver):
    """Under a short time limit on a bigger window the answer is a valid layout, re-scored, with a
    bound no higher than its objective (anytime behaviour)."""
    w = random_window(24, 2, 4, 2, 40, seed=5)
    topo = Topology(4, 2, 200)
    pl = np.tile(np.arange(4), (2, 1))
    inst = LayoutInstance.build(w, topo, TOY, pl, 2, "max-sum")
    rng = np.random.default_rng(0)
    start = random_layout(24, 2, 4, rng)
    res = solve_layout(w, topo, TOY, pl, 2, solver=solver, time_limit=2.0, warm_start=start)
    assert res.status in ("optimal", "feasible")
    assert not inst.violations(res.row, res.slot)
    assert res.objective == inst.score(res.row, res.slot).makespan
    assert inst.lower_bound() - 1e-9 <= res.bound <= res.objective
    assert res.objective <= inst.score(*start).makespan + 1e-9  # never worse than its start


def test_bad_inputs():
    """Unknown solver, bad rows, and non-positive time limits are input errors."""
    w = random_window(8, 2, 4, 2, 20, seed=0)
    pl = np.tile(np.arange(4), (2, 1))
    with pytest.raises(InputError):
        solve_layout(w, Topology(2, 2, 40), TOY, pl, 2, solver="gurobi")
    with pytest.raises(InputError):
        solve_layout(w, Topology(2, 2, 40), TOY, pl, 0)
    with pytest.raises(InputError):
        solve_layout(w, Topology(2, 2, 40), TOY, pl, 2, time_limit=0)


# --- the annealer against proved bounds ---------------------------------------------------------------


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_annealer_never_below_proved_bound(objective):
    """The annealer's makespan (re-scored) is never below the exact model's proved bound, and the
    exact optimum is never worse than the annealer's layout."""
    from routepack_opt.heuristics.anneal import anneal
    from routepack_opt.heuristics.baselines import verl_kk_layout

    for seed in range(2):
        w = random_window(10, 2, 4, 2, 40, seed=30 + seed)
        topo = Topology(4, 2, 80)
        pl = np.tile(np.arange(4), (2, 1))
        inst = LayoutInstance.build(w, topo, TOY, pl, 2, objective)
        start = verl_kk_layout(w.lengths, topo, 2)
        ar = anneal(w.lengths, inst.b_NLP, topo, TOY, 2, objective, seeds=[start],
                    seed=seed, max_sweeps=200)
        heur = inst.score(ar.row, ar.slot).makespan
        ex = solve_layout(w, topo, TOY, pl, 2, objective, "cpsat", time_limit=10,
                          warm_start=(ar.row, ar.slot))
        assert ex.bound <= heur + 1e-9 * heur
        assert ex.objective <= heur + 1e-9 * heur


# --- routepack exact ------------------------------------------------------------------------------


def test_cli_exact_json_and_plan(tmp_path, capsys):
    """`routepack exact --json -o` reports status/objective/bound/seconds, writes a valid plan whose
    evaluator score is the reported objective; infeasible rows are an input error (exit 2)."""
    import json

    from routepack_opt.cli import main
    from routepack_opt.core.evaluate import evaluate_plan
    from routepack_opt.core.plan import load_plan
    from routepack_opt.core.window import save_window

    w = random_window(10, 2, 4, 2, 20, seed=3)
    save_window(w, tmp_path / "w.npz")
    toml = tmp_path / "c.toml"
    toml.write_text(TOY.to_toml())
    base = [str(tmp_path / "w.npz"), "--dp", "4", "--ep", "2", "--capacity", "40", "--cost", str(toml),
            "--time-limit", "10"]
    for solver in ("cpsat", "highs"):
        out = tmp_path / f"{solver}.json"
        assert main(["exact", *base, "--solver", solver, "--objective", "sum-max", "--json", "-o", str(out)]) == 0
        d = json.loads(capsys.readouterr().out)
        assert {"status", "objective", "bound", "seconds"} <= set(d) and d["status"] == "optimal"
        plan = load_plan(out, w.num_samples)
        ev = evaluate_plan(w, plan, TOY, "sum-max")
        assert ev.score.makespan == pytest.approx(d["objective"], rel=1e-12)
        assert d["bound"] <= d["objective"] + 1e-9
    # reuse the plan's placement, explicit rows
    assert main(["exact", *base, "--placement", str(tmp_path / "cpsat.json"), "--rows", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["placement"] == "plan"
    assert main(["exact", *base, "--rows", "5"]) == 2  # 5 × 4 cells > 10 samples
    assert "error:" in capsys.readouterr().err


# --- block decomposition (set partitioning over (row, shard) blocks) ---------------------------


def _poor_start(inst, seed=0):
    """A feasible layout, the worst of a few random ones (a loose upper bound for the filter)."""
    rng = np.random.default_rng(seed)
    found = []
    for _ in range(400):
        row, slot = random_layout(inst.num_samples, inst.rows, inst.topology.dp, rng)
        if not inst.violations(row, slot):
            found.append((inst.score(row, slot).makespan, row, slot))
    assert found
    _, row, slot = max(found, key=lambda t: t[0])
    return row, slot


def _block_cost_by_hand(inst, members):
    """min over splits of the block into P nonempty cells of Σ_s max_cell + γ Σ_l max_p W."""
    import itertools

    P, C = inst.topology.ep, inst.topology.capacity
    lengths = inst.window.lengths
    W = inst.b_NLP[members].sum(axis=0)
    expert = inst.cost.gamma * W.max(axis=1).sum()
    best = np.inf
    for cells in itertools.product(range(P), repeat=len(members)):
        cells = np.array(cells)
        if len(set(cells.tolist())) < P:
            continue
        if any(lengths[members[cells == j]].sum() > C for j in range(P)):
            continue
        att = sum(max(inst.coef_SN[s][members[cells == j]].sum() for j in range(P))
                  for s in range(inst.coef_SN.shape[0]))
        best = min(best, att)
    return best + expert


@pytest.mark.parametrize("case", [CASES[0], CASES[3], CASES[5]], ids=["P2G2", "P1G2", "P2G1tight"])
def test_block_enumeration_is_complete_and_exact(case):
    """The enumerated blocks are exactly the subsets that can fill one (row, shard) block of a
    feasible layout (size and token bounds, a split into P cells within capacity), each with its
    exact cheapest-split cost."""
    import itertools

    from routepack_opt.models import layout_blocks

    inst = _instance(case, "max-sum")
    bs = layout_blocks.enumerate_blocks(inst)
    lo, hi, kmax = layout_blocks.block_bounds(inst)
    lengths = inst.window.lengths
    expected = {}
    for k in range(inst.topology.ep, kmax + 1):
        for members in itertools.combinations(range(inst.num_samples), k):
            members = np.array(members)
            if not lo <= lengths[members].sum() <= hi:
                continue
            c = _block_cost_by_hand(inst, members)
            if np.isfinite(c):
                expected[int(sum(1 << int(i) for i in members))] = c
    got = dict(zip(bs.masks.tolist(), bs.costs.tolist()))
    assert set(got) == set(expected)
    for mask, c in expected.items():
        assert got[mask] == pytest.approx(c, rel=1e-12)


@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("case", CASES, ids=[f"N{c[0]}D{c[1]}P{c[2]}R{c[3]}" for c in CASES])
def test_blocks_equal_brute_force(case, objective, brute):
    """From a poor feasible start, the decomposition proves the brute-force optimum; its layout is
    feasible and its bound valid."""
    from routepack_opt.models import layout_blocks

    inst = _instance(case, objective)
    ref = brute(case, objective)
    out = layout_blocks.solve_blocks(inst, 30.0, _poor_start(inst))
    assert out["status"] == "optimal"
    assert not inst.violations(*out["layout"])
    assert inst.score(*out["layout"]).makespan == pytest.approx(ref.objective, rel=1e-9)
    assert out["bound"] <= ref.objective * (1 + 1e-9)


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_default_procedure_blocks_then_cpsat(objective, brute, monkeypatch):
    """`solve_layout(solver="cpsat")` with a warm start runs the decomposition first (and proves
    the optimum there); when the decomposition gets almost no time, CP-SAT finishes the proof
    with the decomposition's bound kept: both equal brute force."""
    case = CASES[0]
    inst = _instance(case, objective)
    ref = brute(case, objective)
    start = _poor_start(inst, 1)
    res = _solve(inst, "cpsat", warm_start=start)
    assert res.status == "optimal" and res.info["method"] == "blocks"
    assert abs(res.objective - ref.objective) <= _tol(res, ref.objective)
    monkeypatch.setattr(layout_cpsat, "DECOMPOSE_SHARE", 1e-6)
    res = _solve(inst, "cpsat", warm_start=start)
    assert res.status == "optimal" and res.info["method"].startswith("blocks+")
    assert abs(res.objective - ref.objective) <= _tol(res, ref.objective)
    assert res.bound <= ref.objective * (1 + 1e-9)


def test_block_grouping_values_match_enumeration():
    """The cover search values R·G block costs at their best arrangement: sum-max's sorted chunks
    and max-sum's min-max grouping equal an enumeration of every arrangement."""
    import itertools

    from routepack_opt.models.layout_blocks import _group_value

    rng = np.random.default_rng(0)
    for R, G in [(2, 2), (3, 2), (2, 3), (1, 3), (4, 2)]:
        for _ in range(5):
            vals = rng.integers(1, 50, R * G).astype(np.float64)
            best_rows = best_shards = np.inf
            for perm in itertools.permutations(range(R * G)):
                grid = vals[list(perm)].reshape(R, G)  # grid[r, g]
                best_rows = min(best_rows, grid.max(axis=1).sum())
                best_shards = min(best_shards, grid.sum(axis=0).max())
            assert _group_value(vals, 1, G, R, np.inf) == pytest.approx(best_rows)
            assert _group_value(vals, 2, G, R, np.inf) == pytest.approx(best_shards)


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_default_procedure_p4_fixed_then_portfolio(objective):
    """P = 4 (no decomposition): the fixed-search worker, then the portfolio, prove the
    brute-force optimum from a poor warm start."""
    case = (8, 4, 4, 1, 40, 4)
    inst = _instance(case, objective)
    ref = brute_force_layout(inst)
    res = _solve(inst, "cpsat", warm_start=_poor_start(inst, 2))
    assert res.status == "optimal" and res.info["method"] in ("fixed", "fixed+portfolio")
    assert abs(res.objective - ref.objective) <= _tol(res, ref.objective)
    assert res.bound <= ref.objective * (1 + 1e-9)

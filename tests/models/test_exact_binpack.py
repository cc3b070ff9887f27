"""Exact bin-packing models (CP-SAT, arc-flow MILP) against brute force and each other."""

import numpy as np
import pytest
from cases import layout_instance

from routepack_opt.core.bounds import bin_lower_bound, is_packing
from routepack_opt.core.errors import InputError
from routepack_opt.heuristics.binpack import best_packing
from routepack_opt.models.binpack import arcflow_graph, solve_bin_packing
from routepack_opt.models.brute import brute_force_bins
from routepack_opt.models.layout import solve_layout


def tiny_cases(k=12, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(k):
        C = int(rng.integers(8, 40))
        n = int(rng.integers(2, 9))
        out.append((rng.integers(1, C + 1, size=n), C))
    return out


@pytest.mark.parametrize("method", ["cpsat", "arcflow"])
def test_optimum_equals_brute_force_on_tiny_instances(method):
    """Minimisation (heuristic shortcut off) returns the brute-force optimum and a valid packing."""
    for sizes, C in tiny_cases():
        opt = brute_force_bins(sizes, C)
        res = solve_bin_packing(sizes, C, method=method, time_limit=10, presolve=False, num_workers=1,
                                hint=best_packing(sizes, C)[0])
        assert res.status == "optimal" and res.bins == opt == res.lower_bound, (sizes, C)
        assert res.method == method and is_packing(sizes, C, res.bin_N, opt)


def _gap_cases():
    """Tiny instances whose optimum is above the best simple bound (the models must prove it)."""
    rng = np.random.default_rng(7)
    found = []
    while len(found) < 4:
        C = int(rng.integers(10, 30))
        sizes = rng.integers(C // 4, C // 2 + 3, size=int(rng.integers(5, 9)))
        if bin_lower_bound(sizes, C)[0] < brute_force_bins(sizes, C):
            found.append((sizes, C))
    return found


@pytest.mark.parametrize("method", ["cpsat", "arcflow"])
def test_decision_matches_brute_force(method):
    """Decision at K = opt−1 is proved infeasible and at K = opt gives a packing, on gap instances."""
    for sizes, C in _gap_cases():
        opt = brute_force_bins(sizes, C)
        no = solve_bin_packing(sizes, C, max_bins=opt - 1, method=method, decision=True, time_limit=10)
        assert no.status == "infeasible" and no.bins is None and no.lower_bound >= opt
        yes = solve_bin_packing(sizes, C, max_bins=opt, method=method, decision=True, time_limit=10,
                                presolve=False)
        assert yes.bins == opt and is_packing(sizes, C, yes.bin_N, opt)


def test_cpsat_and_arcflow_agree_on_medium_instances():
    """Both models prove the same optimum on 30–40-item instances where FFD/BFD are not optimal."""
    rng = np.random.default_rng(11)
    checked = 0
    while checked < 3:
        C = 100
        sizes = rng.integers(20, 61, size=int(rng.integers(30, 41)))
        ffd_N = best_packing(sizes, C)[0]
        a = solve_bin_packing(sizes, C, method="cpsat", time_limit=20, presolve=False, hint=ffd_N)
        b = solve_bin_packing(sizes, C, method="arcflow", time_limit=20, presolve=False, hint=ffd_N)
        assert a.status == b.status == "optimal" and a.bins == b.bins
        assert is_packing(sizes, C, a.bin_N, a.bins) and is_packing(sizes, C, b.bin_N, b.bins)
        checked += 1


def test_arcflow_graph_paths_are_decreasing_and_within_capacity():
    """Every item arc ends within the capacity, and leaves a load reachable by larger items."""
    g = arcflow_graph([5, 5, 3, 3, 3, 2], 10)
    w, tail, typ = g["w"], g["tail_A"], g["type_A"]
    assert (tail + w[typ] <= 10).all()
    reach = {0}
    for j in range(w.size):  # types in decreasing size
        starts = set(tail[typ == j].tolist())
        assert starts <= reach | {d + w[j] * c for d in reach for c in range(1, 4)}
        reach |= {d + w[j] for d in starts}
    assert set(g["nodes"].tolist()) == reach


def test_unknown_method_is_input_error():
    """A misspelt method name is refused."""
    with pytest.raises(InputError, match="method: expected one of"):
        solve_bin_packing([1, 2], 3, method="gurobi")


def test_arcflow_after_a_highs_solve_with_another_thread_count():
    """HiGHS sizes one process-wide scheduler at its first solve; the arc-flow model (1 thread)
    run after the layout MILP (HiGHS' automatic thread count) used to get no solution ("unknown")
    because of it. Both now state their count and the scheduler is reset when it changes."""
    inst = layout_instance((8, 2, 2, 2, 40, 0), "max-sum")
    res = solve_layout(inst.window, inst.topology, inst.cost, inst.placement, inst.rows, inst.objective,
                       solver="highs", time_limit=30.0)
    assert res.status == "optimal"
    sizes, C = _gap_cases()[0]
    opt = brute_force_bins(sizes, C)
    no = solve_bin_packing(sizes, C, max_bins=opt - 1, method="arcflow", decision=True, time_limit=10)
    assert no.status == "infeasible"
    yes = solve_bin_packing(sizes, C, max_bins=opt, method="arcflow", decision=True, time_limit=10)
    assert yes.bins == opt and is_packing(sizes, C, yes.bin_N, opt)

"""The Gilmore–Gomory LP bound by column generation and its certificate, against brute force.

- the exact knapsack kernels (capacity DP, least-load DP, Pareto list) against enumeration;
- ``dual_bound`` is a valid lower bound for *any* nonnegative integer duals (the certificate's
  claim), and its K-bin form never rules out a K that a brute-force packing meets;
- ``gilmore_gomory`` reaches ⌈LP⌉ of the LP over every enumerated pattern (HiGHS on the full
  pattern LP), never above the brute-force optimum;
- instances with optima known by construction (bins filled exactly), certified by the LP path,
  also with D > 1 slots; the classic HARD instances through ``ROUTEPACK_BPP_DIR``.
"""

import itertools
import json

import numpy as np
import pytest
from support import require_bpp

from routepack_opt.certify import _lp_bound, _lp_packing, certify_rows
from routepack_opt.core.bounds import bin_lower_bound, dual_bound, is_packing, knapsack_max, knapsack_top
from routepack_opt.core.topology import Topology
from routepack_opt.models import _solvers
from routepack_opt.models.brute import brute_force_bins
from routepack_opt.models.colgen import assignment, gilmore_gomory, lp_pack, types_of


def _patterns(w_M, b_M, C):
    """Every nonzero pattern (counts ≤ b, load ≤ C)."""
    out = []
    for combo in itertools.product(*[range(min(int(b), C // int(w)) + 1) for w, b in zip(w_M, b_M)]):
        a = np.array(combo, dtype=np.int64)
        if a.any() and int((a * w_M).sum()) <= C:
            out.append(a)
    return out


def _brute_knapsack(w_M, b_M, v_M, C, min_load=0):
    best = -1
    for combo in itertools.product(*[range(min(int(b), C // int(w)) + 1) for w, b in zip(w_M, b_M)]):
        a = np.array(combo)
        load = int((a * w_M).sum())
        if max(min_load, 0) <= load <= C:
            best = max(best, int((a * v_M).sum()))
    return best


@pytest.mark.parametrize("big", [False, True])
def test_knapsack_matches_enumeration(big):
    """knapsack_max / knapsack_top: the exact optimum and a pattern achieving it (capacity DP,
    least-load DP and, above 4,096, the Pareto list)."""
    rng = np.random.default_rng(1 if big else 0)
    for _ in range(300):
        m = int(rng.integers(1, 6))
        C = int(rng.integers(5, 60)) + (5000 if big else 0)
        w = np.sort(rng.integers(1, C + 1, m))[::-1].astype(np.int64)
        if big:
            w = np.sort(rng.integers(C // 6, C + 1, m))[::-1].astype(np.int64)
        b = rng.integers(1, 4, m).astype(np.int64)
        v = rng.integers(0, 50, m).astype(np.int64)
        min_load = int(rng.integers(-3, C + 1)) if rng.random() < 0.4 else 0
        want = _brute_knapsack(w, b, v, C, min_load)
        got, a = knapsack_max(w, b, v, C, min_load)
        assert got == want, (w, b, v, C, min_load)
        if got >= 0:
            load = int((a * w).sum())
            assert int((a * v).sum()) == got and max(min_load, 0) <= load <= C and (a <= b).all()
        if min_load <= 0:
            v_T, a_TM = knapsack_top(w, b, v, C, 4)
            assert v_T[0] == want
            for val, a in zip(v_T, a_TM):
                assert int((a * v).sum()) == val and int((a * w).sum()) <= C and (a <= b).all()


def test_dual_bound_is_valid_for_any_duals():
    """Any nonnegative integer duals give ⌈Σ b u / U⌉ ≤ the optimum; the K-bin form exceeds K only
    when brute force needs more than K bins."""
    rng = np.random.default_rng(3)
    for _ in range(150):
        C = int(rng.integers(8, 30))
        sizes = rng.integers(1, C + 1, size=int(rng.integers(2, 8)))
        opt = brute_force_bins(sizes, C)
        w, b, _ = types_of(sizes)
        for _ in range(3):
            u = rng.integers(0, 1000, size=w.size)
            bound, num, U = dual_bound(sizes, C, w, u)
            assert bound <= opt, (sizes, C, u)
            if U:
                assert num == int((b * u).sum()) and bound == -(-num // U)
            for K in range(max(1, opt - 1), opt + 1):
                kb = dual_bound(sizes, C, w, u, max_bins=K)[0]
                assert not (kb > K and opt <= K), (sizes, C, u, K)


def _full_lp(w, b, C):
    """The pattern LP over every enumerated pattern, by HiGHS (reference value)."""
    hs = _solvers.highspy()
    h = hs.Highs()
    h.setOptionValue("output_flag", False)
    m = w.size
    h.addRows(m, b.astype(float), np.full(m, np.inf), 0, np.zeros(0, np.int32), np.zeros(0, np.int32),
              np.zeros(0))
    for a in _patterns(w, b, C):
        idx = np.flatnonzero(a).astype(np.int32)
        h.addCol(1.0, 0.0, np.inf, idx.size, idx, a[idx].astype(float))
    h.run()
    return h.getInfo().objective_function_value


def test_column_generation_reaches_the_lp_bound():
    """Converged column generation proves ⌈LP⌉ of the full pattern LP, certified by its duals,
    and never more than the brute-force optimum; instances where ⌈LP⌉ beats L1/L2/DFF occur."""
    rng = np.random.default_rng(11)
    above = 0
    for _ in range(40):
        C = int(rng.integers(10, 40))
        sizes = rng.integers(C // 5 + 1, C // 2 + 2, size=int(rng.integers(3, 9)))
        w, b, _ = types_of(sizes)
        lp = gilmore_gomory(w, b, C, time_limit=10, stop_at_ceiling=False)
        ref = _full_lp(w, b, C)
        assert lp.converged
        assert lp.bound == int(np.ceil(ref - 1e-7)), (sizes, C, lp.bound, ref)
        assert dual_bound(sizes, C, w, lp.u_M)[0] == lp.bound
        opt = brute_force_bins(sizes, C)
        assert lp.bound <= opt
        above += lp.bound > bin_lower_bound(sizes, C)[0]
    assert above >= 1


def exact_fill(rng, bins: int, C: int, lo: int, hi: int):
    """Sizes that fill ``bins`` bins of ``C`` exactly (each bin cut at random points, pieces in
    [lo, hi] where possible): the optimum is ``bins`` by construction (L1 = bins)."""
    sizes = []
    for _ in range(bins):
        left = C
        while left > 0:
            if left <= hi:
                sizes.append(left)
                break
            piece = int(rng.integers(lo, min(hi, left - lo) + 1)) if left - lo >= lo else left
            sizes.append(piece)
            left -= piece
    out = np.array(sizes, dtype=np.int64)
    return out[rng.permutation(out.size)]


def test_lp_guided_search_packs_instances_with_known_optima():
    """Exactly filled bins (optimum known by construction): the LP-guided search alone finds a
    packing into the optimum, checked, and so does certify_rows (D = 1 and D = 3)."""
    rng = np.random.default_rng(5)
    for t in range(2):
        C = 1000
        K = 12 + 3 * t
        sizes = exact_fill(rng, K, C, 180, 420)
        w, b, type_N = types_of(sizes)
        lp = gilmore_gomory(w, b, C, time_limit=5)
        assert lp.bound == K
        bins, how = lp_pack(w, b, C, K, lp, time_limit=5)
        assert bins is not None and how, (t, how)
        bin_N = assignment(bins, type_N)
        assert is_packing(sizes, C, bin_N, K)
        for D in (1, 3)[t:]:
            R = -(-K // D)
            cert = certify_rows(sizes, Topology(dp=D, ep=1, capacity=C), time_limit=10)
            assert cert.status == "optimal" and cert.rows == R, (t, D, cert)
            assert is_packing(sizes, C, cert.packing_N, R * D)


def test_lp_step_helpers_prove_and_pack():
    """The certifier's LP bound helper raises a weak K (L1 = 3) to ⌈LP⌉ = 4 (items just over C/3:
    two a bin), and its packing helper returns a checked packing."""
    import time

    C = 99
    sizes = np.array([34] * 7, dtype=np.int64)
    t0 = time.perf_counter()
    elapsed = lambda: time.perf_counter() - t0  # noqa: E731
    ub_N = np.arange(sizes.size)
    lb, name, lp = _lp_bound(sizes, C, 3, ub_N, sizes.size, 10.0, elapsed)
    assert lb == brute_force_bins(sizes, C) == 4 and name.startswith("LP")
    bin_N = _lp_packing(sizes, C, lb, lp, 10.0, elapsed)
    assert bin_N is not None and is_packing(sizes, C, bin_N, lb)


@pytest.mark.parametrize("name", ["HARD4", "HARD7"])
def test_classic_hard_instances_need_the_lp_bound(name):
    """Scholl's HARD4 / HARD7 (C = 100,000): L1 = L2 = optimum − 1; the certified LP bound is the
    optimum and certify_rows proves it within the 10 s limit."""
    bpp = require_bpp()
    rec = next(r for r in map(json.loads, (bpp / "scholl_3.jsonl").read_text().splitlines()) if r["name"] == name)
    sizes, C = np.array(rec["sizes"]), rec["capacity"]
    assert bin_lower_bound(sizes, C)[0] == rec["optimum"] - 1
    w, b, _ = types_of(sizes)
    lp = gilmore_gomory(w, b, C, time_limit=20, target=rec["optimum"])
    assert dual_bound(sizes, C, w, lp.u_M)[0] == rec["optimum"]
    cert = certify_rows(sizes, Topology(dp=1, ep=1, capacity=C), time_limit=10)
    assert cert.status == "optimal" and cert.rows == rec["optimum"] and cert.method == "colgen"


def test_dive_restarts_are_seeded_and_pack_exactly():
    """A perturbed dive (seed > 0) on exactly filled bins (optimum known by construction) is the
    same for the same seed, its bins a checked packing into the optimum, and the column pool it
    fills holds only patterns (loads ≤ C) that include the root LP's columns."""
    from routepack_opt.models.colgen import _dive

    rng = np.random.default_rng(11)
    C, K = 1000, 10
    sizes = exact_fill(rng, K, C, 150, 450)
    w, b, type_N = types_of(sizes)
    lp = gilmore_gomory(w, b, C, time_limit=5)
    runs = []
    for _ in range(2):
        pool = {a.tobytes(): a for a in lp.cols_PM}
        bins, _, _ = _dive(w, b, C, K, list(lp.cols_PM), float("inf"), max_nodes=500, pool=pool, seed=3)
        runs.append(bins)
        assert all(int(a @ w) <= C for a in pool.values()) and len(pool) >= lp.cols_PM.shape[0]
    assert runs[0] is not None and runs[1] is not None
    assert np.array_equal(np.array(runs[0]), np.array(runs[1]))
    assert is_packing(sizes, C, assignment(runs[0], type_N), K)

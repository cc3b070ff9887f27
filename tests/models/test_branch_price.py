"""Branch-and-price on "K bins?" (``models.branch_price``), against brute force.

- the exact pricing kernel against enumeration of every pattern, with branching rows of every
  kind (pair, single type, ≥ k copies, one exact pattern) and the patterns they bar;
- ``decide_bins`` on tiny instances: a packing (re-checked item by item) at the brute-force
  optimum, a proof below it;
- the classic non-IRUP instances (⌈LP⌉ < optimum) through ``ROUTEPACK_BPP_DIR``: the proof that
  ⌈LP⌉ bins do not suffice, and ``certify_rows`` proving the optimum with it.
"""

import itertools
import json

import numpy as np
import pytest
from support import require_bpp

from routepack_opt.certify import certify_rows
from routepack_opt.core.bounds import is_packing, lower_bound_l1
from routepack_opt.core.topology import Topology
from routepack_opt.models import branch_price as bp
from routepack_opt.models.brute import brute_force_bins
from routepack_opt.models.colgen import assignment, types_of


def _brute_price(w_M, b_M, u_M, C, min_load, rows, nu):
    """The pricing maximum by enumerating every pattern (the kernel's oracle)."""
    kinds = [bp._kind(r, b_M) for r in rows]
    best = None
    for combo in itertools.product(*[range(int(b) + 1) for b in b_M]):
        a = np.array(combo, dtype=np.int64)
        load = int((a * w_M).sum())
        if not (max(min_load, 0) <= load <= C):
            continue
        member = bp._membership(a[None, :], rows)[0] if rows else np.zeros(0, bool)
        if rows and bp._barred(a[None, :], rows, kinds)[0]:
            continue
        v = int((a * u_M).sum()) + sum(int(n) for n, mb in zip(nu, member) if mb)
        best = v if best is None else max(best, v)
    return best


def _random_types(rng, u_low: int):
    """A tiny random instance for the kernels: sizes (decreasing), counts, capacity, integer
    values in [u_low, 40) and a least load."""
    m = int(rng.integers(2, 6))
    w_M = np.sort(rng.choice(np.arange(3, 30), m, replace=False))[::-1].astype(np.int64)
    b_M = rng.integers(1, 4, m).astype(np.int64)
    C = int(rng.integers(30, 70))
    u_M = rng.integers(u_low, 40, m).astype(np.int64)
    return w_M, b_M, C, u_M, int(rng.integers(-5, C))


def _random_rows(rng, b_M, m):
    rows = []
    for _ in range(int(rng.integers(0, 4))):
        kind = int(rng.integers(0, 4))
        ge, rhs = bool(rng.integers(0, 2)), int(rng.integers(0, 3))
        i, j = (int(t) for t in rng.choice(m, 2, replace=False))
        if kind == 0:
            rows.append(bp._Row(i, j, ge, rhs))
        elif kind == 1:
            rows.append(bp._Row(i, -1, ge, rhs))
        elif kind == 2:
            rows.append(bp._Row(i, -1, ge, rhs, k=int(rng.integers(1, int(b_M[i]) + 1))))
        else:
            e = tuple(int(rng.integers(0, int(b) + 1)) for b in b_M)
            rows.append(bp._Row(-1, -1, ge, rhs, exact=e))
    return rows


@pytest.mark.parametrize("seed", range(40))
def test_price_matches_enumeration(seed):
    rng = np.random.default_rng(seed)
    w_M, b_M, C, u_M, min_load = _random_types(rng, u_low=-5)
    m = w_M.size
    rows = _random_rows(rng, b_M, m)
    nu = [int(rng.integers(0, 30)) if r.ge else -int(rng.integers(0, 30)) for r in rows]
    kinds = [bp._kind(r, b_M) for r in rows]
    pricer = bp._Pricer(w_M, b_M, C, min_load, rows, kinds)
    v, a_M = pricer.price(u_M, nu)
    want = _brute_price(w_M, b_M, u_M, C, min_load, rows, nu)
    if want is None:
        assert v < 0 and v < -(1 << 61)
        return
    assert v == want
    # the pattern returned is admissible and worth what the kernel says
    assert np.all((0 <= a_M) & (a_M <= b_M)) and max(min_load, 0) <= int((a_M * w_M).sum()) <= C
    if rows:
        assert not bp._barred(a_M[None, :], rows, kinds)[0]
        member = bp._membership(a_M[None, :], rows)[0]
    else:
        member = []
    assert int((a_M * u_M).sum()) + sum(n for n, mb in zip(nu, member) if mb) == v


def _brute_enumerate(w_M, b_M, u_M, C, min_load, theta):
    out = []
    for combo in itertools.product(*[range(int(b) + 1) for b in b_M]):
        a = np.array(combo, dtype=np.int64)
        if max(min_load, 0) <= int((a * w_M).sum()) <= C and int((a * u_M).sum()) >= theta and a.any():
            out.append(tuple(combo))
    return sorted(out)


@pytest.mark.parametrize("seed", range(30))
def test_enumerate_matches_brute_force(seed):
    rng = np.random.default_rng(500 + seed)
    w_M, b_M, C, u_M, min_load = _random_types(rng, u_low=-10)
    theta = int(rng.integers(-20, 60))
    n, E = bp._enumerate(w_M, b_M, u_M, C, min_load, theta, 10_000)
    got = sorted(tuple(int(c) for c in a) for a in E if a.any())
    assert got == _brute_enumerate(w_M, b_M, u_M, C, min_load, theta)
    assert n == E.shape[0]
    # the limit stops the listing one past it
    if n > 1:
        assert bp._enumerate(w_M, b_M, u_M, C, min_load, theta, n - 2)[0] == n - 1


# the three ways a node's patterns are priced: the listed set decided by CP-SAT first; the tree over
# the listed set (CP-SAT given no time); the compiled DP pricing (no listing)
MODES = {"listed+cpsat": {}, "listed tree": {"_LIST_CPSAT_S": 0.0}, "dp pricing": {"_LIST_MAX": -1}}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("seed", range(30))
def test_decide_bins_against_brute_force(seed, mode, monkeypatch):
    for name, value in MODES[mode].items():
        monkeypatch.setattr(bp, name, value)
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(5, 11))
    C = int(rng.integers(15, 60))
    sizes = rng.integers(max(1, C // 6), C // 2 + 2, n)
    opt = brute_force_bins(sizes, C)
    w_M, b_M, type_N = types_of(sizes)
    res = bp.decide_bins(w_M, b_M, C, opt, time_limit=30)
    assert res.status == "feasible"
    bin_N = assignment(res.bins, type_N)
    assert is_packing(sizes, C, bin_N, opt)
    if opt - 1 >= 1:
        assert bp.decide_bins(w_M, b_M, C, opt - 1, time_limit=30).status == "infeasible"


def test_decide_bins_is_deterministic():
    rng = np.random.default_rng(3)
    sizes = rng.integers(20, 60, 24)
    w_M, b_M, _ = types_of(sizes)
    K = lower_bound_l1(sizes, 100)
    a = bp.decide_bins(w_M, b_M, 100, K, time_limit=30)
    b = bp.decide_bins(w_M, b_M, 100, K, time_limit=30)
    assert a.status == b.status and a.nodes == b.nodes and a.columns == b.columns
    assert a.bins is None and b.bins is None or all(np.array_equal(x, y) for x, y in zip(a.bins, b.bins))


# ⌈LP⌉ = optimum − 1: no bound and no packing settles them; branch-and-price proves ⌈LP⌉ bins short
NON_IRUP = [("waescher", "Waescher_TEST0022"), ("waescher", "Waescher_TEST0065"),
            ("hard28", "Hard28_BPP14"), ("hard28", "Hard28_BPP119"), ("hard28", "Hard28_BPP175")]


def _instance(set_name, name):
    for line in (require_bpp() / f"{set_name}.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["name"] == name:
            return np.asarray(rec["sizes"], dtype=np.int64), int(rec["capacity"]), int(rec["optimum"])
    raise AssertionError(f"{name} not in {set_name}")


@pytest.mark.parametrize("set_name,name", NON_IRUP)
def test_classic_non_irup_proved(set_name, name):
    sizes, C, opt = _instance(set_name, name)
    w_M, b_M, _ = types_of(sizes)
    assert bp.decide_bins(w_M, b_M, C, opt - 1, time_limit=120).status == "infeasible"
    cert = certify_rows(sizes, Topology(dp=1, ep=1, capacity=C), time_limit=60)
    assert cert.status == "optimal" and cert.rows == opt



def test_resumed_search_decides_as_one_run():
    # BranchAndPrice.run continues where its time ran out: many short runs reach the one-run answer
    rng = np.random.default_rng(8)
    sizes = rng.integers(25, 60, 20)
    w_M, b_M, type_N = types_of(sizes)
    opt = brute_force_bins(sizes, 100)
    for K, want in ((opt - 1, "infeasible"), (opt, "feasible")):
        search = bp.BranchAndPrice(w_M, b_M, 100, K)
        for _ in range(10_000):
            res = search.run(0.002)
            if res.status != "unknown":
                break
        assert res.status == want == bp.decide_bins(w_M, b_M, 100, K, time_limit=30).status
        if want == "feasible":
            assert is_packing(sizes, 100, assignment(res.bins, type_N), K)


def test_non_irup_proof_sets_rows_on_slots():
    # D = 3 slots: ⌈LP⌉ = 15 bins allows R = 5 rows (15 cells); only the proof that 15 bins are
    # impossible gives R* = 6 (the optimum, 16 bins, needs 6 rows of 3)
    sizes, C, opt = _instance("waescher", "Waescher_TEST0065")
    assert opt == 16
    cert = certify_rows(sizes, Topology(dp=3, ep=1, capacity=C), time_limit=60)
    assert cert.status == "optimal" and cert.rows == 6 and cert.lower_bound == 6
    assert "branch-and-price on 15 bins" in cert.detail

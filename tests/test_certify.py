"""R* certifier: row rules, errors, BPP benchmark optima, pack_into_bins and `routepack certify`."""

import dataclasses
import json

import numpy as np
import pytest
from support import require_bpp

from routepack_opt.certify import BinPackUndecided, Certificate, certify_rows, pack_into_bins, spread_to_nonempty
from routepack_opt.cli import main
from routepack_opt.core.bounds import bin_lower_bound, is_packing
from routepack_opt.core.errors import InputError
from routepack_opt.core.testing import random_window
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import save_window
from routepack_opt.models.brute import brute_force_bins


def expected_rows(sizes, C, D, min_rows, multiple):
    """Least R ≥ min_rows, R % multiple == 0, with opt ≤ R·D ≤ N (None if none)."""
    opt = brute_force_bins(sizes, C)
    for R in range(1, len(sizes) // D + 1):
        if R >= min_rows and R % multiple == 0 and opt <= R * D:
            return R
    return None


def test_row_rules_match_brute_force():
    """R* obeys min_rows, row_multiple and D>1 exactly as the brute-force definition says."""
    rng = np.random.default_rng(5)
    checked = 0
    for _ in range(200):
        n = int(rng.integers(4, 9))
        C = int(rng.integers(10, 30))
        sizes = rng.integers(1, C + 1, size=n)
        D = int(rng.integers(1, 4))
        min_rows = int(rng.integers(1, 3))
        mult = int(rng.integers(1, 3))
        want = expected_rows(sizes, C, D, min_rows, mult)
        if want is None or n < D * min_rows:
            continue
        cert = certify_rows(sizes, Topology(dp=D, ep=1, capacity=C, min_rows=min_rows, row_multiple=mult),
                            time_limit=10)
        assert cert.status == "optimal" and cert.rows == cert.lower_bound == want, (sizes, C, D, min_rows, mult)
        assert cert.rows * D <= n and cert.packing_N is not None
        assert is_packing(sizes, C, cert.packing_N, cert.rows * D)
        checked += 1
        if checked >= 40:
            break
    assert checked >= 40


def test_window_and_lengths_give_the_same_certificate():
    """A Window and its plain lengths array certify to the same rows, status and method."""
    w = random_window(num_samples=40, max_len=60, seed=3)
    topo = Topology(dp=4, ep=2, capacity=100, row_multiple=2)
    a, b = certify_rows(w, topo), certify_rows(np.asarray(w.lengths), topo)
    assert (a.rows, a.status, a.method, a.lower_bound) == (b.rows, b.status, b.method, b.lower_bound)
    assert a.rows % 2 == 0


def test_certificate_as_dict_has_exactly_the_contract_keys():
    """as_dict gives exactly rows, status, lower_bound, method, seconds (JSON-serialisable)."""
    cert = certify_rows([3, 4, 5, 6], Topology(dp=2, ep=1, capacity=10))
    d = cert.as_dict()
    assert set(d) == {"rows", "status", "lower_bound", "method", "seconds"}
    assert json.loads(json.dumps(d)) == d and isinstance(cert, Certificate)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cert.rows = 3  # frozen


def test_sample_longer_than_capacity_names_the_samples():
    """Samples above the token cap are an InputError that names them."""
    with pytest.raises(InputError, match=r"samples \[1, 3\].*> capacity 10"):
        certify_rows([5, 11, 2, 12], Topology(dp=1, ep=1, capacity=10))


def test_too_few_samples_for_min_rows():
    """N < D·min_rows is an InputError (a cell would be empty)."""
    with pytest.raises(InputError, match=r"N=5 samples cannot fill D·min_rows = 2·3 = 6"):
        certify_rows([1, 2, 3, 4, 5], Topology(dp=2, ep=1, capacity=10, min_rows=3))


def test_impossible_row_rule():
    """No multiple of row_multiple with R·D ≤ N is an InputError."""
    with pytest.raises(InputError, match="no valid rows"):
        certify_rows(np.ones(10, int), Topology(dp=3, ep=1, capacity=10, row_multiple=4))


def test_lengths_need_more_cells_than_valid_rows_allow():
    """When the packing needs more bins than the largest valid R·D, the error says how many."""
    with pytest.raises(InputError, match="need at least 5 micro-batches"):
        certify_rows([10] * 5, Topology(dp=2, ep=1, capacity=10))


def test_undecided_certificate_is_feasible_with_a_valid_bound():
    """A hard instance with a tiny limit returns status feasible, rows ≥ optimum ≥ lower bound."""
    rec = _records("hard28")[0]
    cert = certify_rows(rec["sizes"], Topology(dp=1, ep=1, capacity=rec["capacity"]),
                        time_limit=1.0, method="cpsat")
    if cert.status == "feasible":
        assert cert.lower_bound <= rec["optimum"] <= cert.rows
    else:
        assert cert.rows == rec["optimum"]
    assert cert.lower_bound <= rec["optimum"]


# ---------------------------------------------------------------- BPP benchmark sample


def _records(name):
    return [json.loads(x) for x in (require_bpp() / f"{name}.jsonl").read_text().splitlines() if x.strip()]


def _bpp_sample():
    """≥ 40 instances that bounds + FFD/BFD do not close, many with optimum > L2 (hard)."""
    picks = []

    def take(name, k, pred):
        got = [r for r in _records(name) if not r["optimum_certified_by_bounds"] and pred(r)][:k]
        picks.extend((name, r) for r in got)

    take("scholl_1", 19, lambda r: r["optimum"] > r["lb_l2"] and r["n"] <= 100)
    take("scholl_1", 6, lambda r: r["optimum"] == r["lb_l2"] and r["n"] <= 100)
    take("scholl_2", 6, lambda r: r["n"] <= 50)
    take("falkenauer_t", 4, lambda r: r["n"] == 60)
    take("falkenauer_u", 4, lambda r: r["n"] == 120)
    take("schwerin_1", 2, lambda r: True)
    return picks


def test_bpp_sample_certified_to_the_known_optimum():
    """With D=1 the certifier proves the known optimum on a 41-instance benchmark sample."""
    sample = _bpp_sample()
    assert len(sample) >= 40
    assert sum(r["optimum"] > r["lb_l2"] for _, r in sample) >= 19
    for name, r in sample:
        cert = certify_rows(r["sizes"], Topology(dp=1, ep=1, capacity=r["capacity"]), time_limit=10)
        assert cert.status == "optimal" and cert.rows == r["optimum"], (name, r["name"], cert)


# ---------------------------------------------------------------- pack_into_bins


def test_pack_into_bins_against_brute_force():
    """At K = optimum it returns a valid packing; below the optimum it returns None (proved)."""
    rng = np.random.default_rng(9)
    gaps = plain = 0
    while gaps < 4 or plain < 20:
        C = int(rng.integers(10, 30))
        sizes = rng.integers(C // 4, C // 2 + 3, size=int(rng.integers(4, 9)))
        opt = brute_force_bins(sizes, C)
        gap = bin_lower_bound(sizes, C)[0] < opt  # the exact models, not the bounds, decide these
        if (gap and gaps >= 4) or (not gap and plain >= 20):
            continue
        gaps, plain = gaps + gap, plain + (not gap)
        bins = pack_into_bins(sizes, C, opt, time_limit=3)
        assert bins is not None and is_packing(sizes, C, bins, opt)
        assert pack_into_bins(sizes, C, opt - 1, time_limit=3) is None


def test_pack_into_bins_oversize_and_undecided():
    """An item above the capacity gives None; a hard case with no time raises BinPackUndecided."""
    assert pack_into_bins([3, 12], 10, 5) is None
    rec = next(r for r in _records("hard28") if r["optimum"] > r["lb_l2"] or r["ffd"] > r["optimum"])
    with pytest.raises(BinPackUndecided, match="could not decide"):
        pack_into_bins(rec["sizes"], rec["capacity"], rec["optimum"], time_limit=0.2, method="cpsat")


def test_spread_to_nonempty_fills_every_bin():
    """Spreading a 2-bin packing onto 4 bins leaves no bin empty and keeps capacity."""
    sizes = [4, 3, 3, 2, 2]
    spread = spread_to_nonempty(sizes, [0, 0, 1, 1, 1], 4)
    assert sorted(set(spread.tolist())) == [0, 1, 2, 3] and is_packing(sizes, 7, spread, 4)


# ---------------------------------------------------------------- CLI


def test_cli_certify_json_and_error(tmp_path, capsys):
    """`routepack certify --json` prints exactly the contract keys; a sample over C exits 2."""
    w = random_window(num_samples=32, max_len=50, seed=1)
    path = tmp_path / "w.npz"
    save_window(w, path)
    rc = main(["certify", str(path), "--dp", "4", "--ep", "2", "--capacity", "80", "--min-rows", "2",
               "--row-multiple", "2", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and set(out) == {"rows", "status", "lower_bound", "method", "seconds"}
    assert out["status"] == "optimal" and out["rows"] % 2 == 0 and out["rows"] >= 2
    rc = main(["certify", str(path), "--dp", "4", "--ep", "2", "--capacity", "80"])
    assert rc == 0 and "R* =" in capsys.readouterr().out
    rc = main(["certify", str(path), "--dp", "4", "--ep", "2", "--capacity", "10", "--json"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: samples") and err.count("\n") == 1


def test_production_window_certified_fast():
    """N=4096 lengths on D=64 slots are certified by bounds (timing: experiments/bench_certify.py)."""
    rng = np.random.default_rng(0)
    lengths = np.minimum(rng.lognormal(7.5, 1.0, size=4096).astype(np.int64) + 1, 16384)
    topo = Topology(dp=64, ep=8, capacity=16384)
    certify_rows(lengths[:256], Topology(dp=4, ep=1, capacity=16384))  # warm-up (JIT cache)
    cert = certify_rows(lengths, topo)
    assert cert.method == "bounds" and cert.status == "optimal"


# ---------------------------------------------------------------- instances with known optima (in-repo)


def _triplets(k, C, rng):
    """k bins, each filled exactly by 3 items in (C/4, C/2) (Falkenauer's "triplets"): optimum k."""
    sizes = []
    for _ in range(k):
        while True:
            a, b = rng.integers(C // 4 + 1, C // 2, size=2)
            c = C - a - b
            if C // 4 < c < C // 2:
                break
        sizes += [int(a), int(b), int(c)]
    return rng.permutation(sizes).tolist()


def _cut_bins(k, C, rng):
    """k full bins, each cut at 1..5 random points into pieces: Σ = k·C, so optimum k."""
    sizes = []
    for _ in range(k):
        cuts = np.sort(rng.choice(np.arange(1, C), size=int(rng.integers(1, 6)), replace=False))
        sizes += np.diff(np.concatenate([[0], cuts, [C]])).tolist()
    return rng.permutation(sizes).tolist()


def _pairs_only(n, C, rng):
    """n items in (C/3, C/2]: any two share a bin, no three do, so the optimum is ⌈n/2⌉ (> L1)."""
    return rng.integers(C // 3 + 1, C // 2 + 1, size=n).tolist()


@pytest.mark.parametrize("family, make, optimum", [
    ("triplets", lambda rng: _triplets(20, 1000, rng), lambda s: 20),
    ("cut-bins", lambda rng: _cut_bins(25, 150, rng), lambda s: 25),
    ("cut-bins-wide", lambda rng: _cut_bins(15, 10_000, rng), lambda s: 15),
    ("pairs-only", lambda rng: _pairs_only(41, 100, rng), lambda s: 21),
])
def test_certifier_proves_constructed_optima(family, make, optimum):
    """With D=1 the certifier proves exactly the optimum known by construction (no external data)."""
    for seed in range(3):
        sizes = make(np.random.default_rng(seed))
        C = {"triplets": 1000, "cut-bins": 150, "cut-bins-wide": 10_000,
             "pairs-only": 100}[family]
        cert = certify_rows(sizes, Topology(dp=1, ep=1, capacity=C), time_limit=10)
        assert cert.status == "optimal" and cert.rows == optimum(sizes), (family, seed, cert)
        assert cert.lower_bound == optimum(sizes)


def test_constructed_triplets_need_more_than_ffd():
    """The triplet family is not closed by FFD alone, so the test above exercises the search."""
    from routepack_opt.heuristics.binpack import first_fit_decreasing

    rng = np.random.default_rng(0)
    assert any(first_fit_decreasing(_triplets(20, 1000, rng), 1000)[1] > 20 for _ in range(3))


def test_constructed_optimum_spread_over_slots():
    """With D slots, R* = ⌈optimum / D⌉ for a cut-bins instance with known optimum 24."""
    sizes = _cut_bins(24, 150, np.random.default_rng(5))
    for D, expect in ((1, 24), (2, 12), (5, 5), (8, 3)):
        cert = certify_rows(sizes, Topology(dp=D, ep=1, capacity=150), time_limit=10)
        assert cert.status == "optimal" and cert.rows == expect, (D, cert)


def test_fewer_rows_fills_the_rows_between_the_bound_and_the_packing():
    """Where K = r_lo·D stays open, the rows between r_lo and the best packing's are filled by
    the tabu search (easiest first): a triplet instance (optimum 60 bins) that FFD/BFD pack in
    more than 64 bins gets a valid packing in 16 rows of D = 4, and never one at r_lo or below
    from this helper (r_lo's own question is the exact model's)."""
    from routepack_opt.certify import _fewer_rows
    from routepack_opt.heuristics.binpack import best_packing

    sizes = np.array(_triplets(60, 1000, np.random.default_rng(0)))
    topo = Topology(dp=4, ep=1, capacity=1000)
    pack, ub, name = best_packing(sizes, 1000)
    assert ub > 64  # FFD/BFD leave at least one row to gain
    got, bins, how = _fewer_rows(sizes, 1000, topo, 15, pack, ub, name, 5.0)
    assert how == "tabu search" and bins <= 64 and is_packing(sizes, 1000, got, 16 * 4)
    # nothing below the packing's rows can be filled in no time: the packing comes back as it was
    same, same_bins, same_how = _fewer_rows(sizes, 1000, topo, 15, pack, ub, name, 0.0)
    assert same is pack and (same_bins, same_how) == (ub, name)

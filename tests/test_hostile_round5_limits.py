"""Issue 50, items 2, 5 and 6: every stage sized and clocked before it allocates, standard output
holding nothing but our own output, and the row limits a user sets kept or refused."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}

# ---------------------------------------------------------------- 50.5: stdout belongs to us

# Every command, run in one fresh process, with its file descriptor 1 captured separately: a
# library that prints once per process (HiGHS' banner at its first instance) shows up in the
# first command that loads it, whichever that is.
_RUNNER = r"""
import ctypes, json, os, sys, tempfile
from routepack_opt.cli import main
import shutil
jobs, out = json.loads(sys.argv[1]), sys.argv[2]
res = {}
for name, argv, copy in jobs:
    if copy:  # an input an earlier command wrote
        shutil.copy(*copy)
    fd, path = tempfile.mkstemp()
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(fd, 1)
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = exc.code
    finally:
        sys.stdout.flush()
        ctypes.CDLL(None).fflush(None)
        os.dup2(saved, 1)
        os.close(saved)
    res[name] = [rc, open(path).read()]
    os.close(fd)
    os.unlink(path)
with open(out, "w") as f:
    json.dump(res, f)
"""


def _commands() -> set[str]:
    from routepack_opt.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return {name for name, p in sub.choices.items() if any("--json" in a.option_strings for a in p._actions)}


def _json_jobs(d: Path) -> list[tuple[str, list[str], list[str] | None]]:
    """A tiny run of every command, in an order that writes each shared input before its use
    (name, argv, a file to copy before the command or None)."""
    w, p, topo = str(d / "w.npz"), str(d / "p.json"), ["--dp", "2", "--ep", "2", "--capacity", "4096"]
    cost = ["--cost", "olmoe-1b-7b"]
    run_dir = d / "run"
    run_dir.mkdir()
    np.save(d / "routes.npy", np.arange(5 * 2 * 2).reshape(5, 2, 2) % 4)
    np.save(d / "len.npy", np.array([2, 3]))
    return [
        ("gen-trace", ["gen-trace", "--preset", "olmoe-1b-7b", "--samples", "16", "--layers", "2", "-o", w]),
        ("stats", ["stats", w]),
        ("import-replay", ["import-replay", str(d / "routes.npy"), "--format", "routes", "--num-experts", "4",
                           "--lengths", str(d / "len.npy"), "-o", str(d / "imported.npz")]),
        ("certify", ["certify", w, *topo, "--time-limit", "1"]),
        ("plan", ["plan", w, *topo, *cost, "--max-sweeps", "2", "-o", p]),
        ("evaluate", ["evaluate", w, p, *cost]),
        ("exact", ["exact", w, *topo, *cost, "--time-limit", "1", "-o", str(d / "e.json")]),
        ("compare", ["compare", w, *topo, *cost, "--max-sweeps", "2", "--exact", "no"]),
        ("warmup", ["warmup", "--group", "exact", "--jobs", "1"]),
        ("demo", ["demo", "--samples", "16", "--dp", "2", "--ep", "2", "--time-limit", "1", "--out", str(d / "demo")]),
        ("calibrate", ["calibrate", "--quick", "-o", str(d / "cost.toml")]),
        ("measure", ["measure", w, p, "--quick"]),
        ("verify-runtime", ["verify-runtime", "--world-size", "1", "--steps", "2"]),
        ("replay-report", ["replay-report", str(run_dir), "-o", str(d / "report"), *topo, *cost,
                           "--max-sweeps", "2", "--workers", "1"], [w, str(run_dir / "step0.npz")]),
    ]


def test_50_5_every_json_command_prints_one_json_object(tmp_path):
    """50.5: the stdout of every command that has --json (looked up in the parser) is exactly one
    JSON object, in a fresh process: no HiGHS banner or other library print before it."""
    jobs = [(job + (None,))[:3] for job in _json_jobs(tmp_path)]
    assert {name for name, *_ in jobs} == _commands(), "a command with --json is missing from this test"
    jobs = [(name, [*argv, "--json"], copy) for name, argv, copy in jobs]
    out = tmp_path / "res.json"
    r = subprocess.run([sys.executable, "-c", _RUNNER, json.dumps(jobs), str(out)], env=ENV, cwd=tmp_path,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    for name, (rc, stdout) in res.items():
        assert rc == 0, (name, stdout[:500])
        obj = json.loads(stdout)  # the whole of stdout: one JSON document, nothing before or after
        assert isinstance(obj, dict), (name, stdout[:200])


# ---------------------------------------------------------------- 50.6: row limits are limits


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A 64-sample window (R* = 2 on D = 2 at C = 16,384; R* = 6 at C = 8,000 with row multiple 3) and its file."""
    from routepack_opt.core.window import save_window
    from routepack_opt.trace import generate_window

    w = generate_window("olmoe-1b-7b", 64, seed=0, num_layers=2)
    path = tmp_path_factory.mktemp("rows") / "w.npz"
    save_window(w, path)
    return w, path


def _plan_cli(capsys, path, *extra):
    from routepack_opt.cli import main

    code = main(["plan", str(path), "--dp", "2", "--ep", "2", "--cost", "olmoe-1b-7b", "--max-sweeps", "4",
                 "--json", *extra])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("extra, says", [
    (["--capacity", "16384", "--max-rows", "1"], "below R* ≥ 2"),
    (["--capacity", "8000", "--row-multiple", "3", "--max-rows", "5"], "below R* ≥ 6"),
    (["--capacity", "16384", "--min-rows", "4", "--max-rows", "2"], "no valid row count"),
    (["--capacity", "16384", "--rows", "4", "--max-rows", "3"], "above"),
])
def test_50_6_unmeetable_row_limits_are_exit_2(capsys, small, extra, says):
    """50.6: a --max-rows below R*, below --min-rows, with no multiple of --row-multiple under it,
    or under a forced --rows, is exit 2 with one error line saying why, never a plan over it."""
    code, out, err = _plan_cli(capsys, small[1], *extra)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], err


def test_50_6_row_multiple_under_the_maximum_is_kept(capsys, small):
    """50.6: --row-multiple 3 --max-rows 5 plans at most 5 rows (3) and reports r_max 3, the
    maximum as asked, never a rewritten one."""
    code, out, err = _plan_cli(capsys, small[1], "--capacity", "16384", "--row-multiple", "3", "--max-rows", "5")
    assert code == 0, err
    res = json.loads(out)
    assert res["rows"] == 3 and res["row_search"]["r_max"] == 3 and res["row_search"]["max_rows"] == 5


def test_50_6_toml_and_api_row_maxima_are_limits(small):
    """50.6: [rows] max_rows below R* and plan_micro_batches(max_micro_batches=…) below R* or
    under min_micro_batches raise InputError naming the limit."""
    from routepack_opt import pipeline
    from routepack_opt.api import plan_micro_batches
    from routepack_opt.core.cost import PRESETS
    from routepack_opt.core.errors import InputError
    from routepack_opt.core.topology import Topology
    from routepack_opt.params import PlannerParams, RowParams

    w = small[0]
    params = PlannerParams(rows=RowParams(max_rows=1))
    with pytest.raises(InputError, match=r"\[rows\] max_rows = 1 is below R\* ≥ 2"):
        pipeline.solve(w, Topology(dp=2, ep=2, capacity=16384), PRESETS["olmoe-1b-7b"].cost, params=params,
                       max_sweeps=4)
    opts = dict(dp_size=2, ep_size=2, max_tokens=16384, cost="olmoe-1b-7b", max_sweeps=4)
    with pytest.raises(InputError, match="max_micro_batches.*= 1 is below R"):
        plan_micro_batches(w.lengths, w.counts, max_micro_batches=1, **opts)
    with pytest.raises(InputError, match="no valid row count"):
        plan_micro_batches(w.lengths, w.counts, max_micro_batches=2, min_micro_batches=3, **opts)


# ---------------------------------------------------------------- 50.2: sized and clocked


def test_50_2_bfd_at_large_capacity_is_the_fenwick_packing(monkeypatch):
    """50.2: above C = 2^22 BFD runs on a treap of the open bins (O(N log N), not a scan of every
    bin per item) and gives exactly the Fenwick kernel's packing, ties included."""
    from routepack_opt.heuristics import binpack

    rng = np.random.default_rng(7)
    cases = [(rng.integers(1, C + 1, size=n), C) for n, C in ((400, 100), (300, 7), (500, 1 << 20))]
    fenwick = [binpack.best_fit_decreasing(s, C) for s, C in cases]
    monkeypatch.setattr(binpack, "_FENWICK_MAX_C", 0)  # every capacity takes the large-capacity path
    for (s, C), (bin_F, used_F) in zip(cases, fenwick):
        bin_T, used_T = binpack.best_fit_decreasing(s, C)
        assert used_T == used_F and np.array_equal(bin_T, bin_F)


def test_50_2_bfd_stops_at_its_deadline_and_ffd_stands():
    """50.2: BFD at a large capacity reads the clock (from its first item): a deadline already
    passed gives None, and best_packing then returns FFD's packing."""
    from routepack_opt.heuristics import binpack

    s = np.random.default_rng(1).integers(1, 2**31, size=64)
    assert binpack.best_fit_decreasing(s, 2**31 - 1, deadline=0.0) is None
    bin_N, used, name = binpack.best_packing(s, 2**31 - 1, deadline=0.0)
    assert name == "FFD" and used == binpack.first_fit_decreasing(s, 2**31 - 1)[1]


def test_50_2_arcflow_graph_is_sized_before_it_is_built(monkeypatch):
    """50.2: the arc-flow graph (O(types × C)) is checked against the memory budget before it is
    built: over it, `arcflow` says it skipped and why, and `auto` falls back to CP-SAT's model."""
    from routepack_opt.core import sizing
    from routepack_opt.models.binpack import solve_bin_packing

    sizes = np.array([6, 5, 5, 4, 4, 3, 3, 2], dtype=np.int64)
    big = solve_bin_packing(sizes << 28, 10 << 28, max_bins=4, method="arcflow", decision=True, presolve=False,
                            time_limit=5.0)  # C ≈ 2.7·10⁹: ~70 GB of loads
    assert big.status == "unknown" and "memory budget" in big.method
    monkeypatch.setattr(sizing, "MEMORY_BUDGET", 1000)  # a tiny budget: even C = 10 is too large
    small = solve_bin_packing(sizes, 10, max_bins=4, method="arcflow", decision=True, presolve=False)
    assert small.status == "unknown" and small.method.startswith("arcflow (arc-flow graph skipped")
    auto = solve_bin_packing(sizes, 10, max_bins=4, method="auto", decision=True, presolve=False)
    assert auto.method == "cpsat" and auto.bins is not None and auto.bins <= 4


def test_50_2_decide_bins_sizes_its_tables_first(monkeypatch):
    """50.2: decide_bins at C = 2^31 − 1 answers unknown at once with the reason (its pricing
    table would be ~100 GiB), and a listing over the budget is left out, the answer kept."""
    from routepack_opt.core import sizing
    from routepack_opt.models.branch_price import decide_bins

    res = decide_bins(np.array([2**30, 2**29 + 5, 7]), np.array([1, 2, 3]), 2**31 - 1, 2, time_limit=5.0)
    assert res.status == "unknown" and res.nodes == 0 and "memory budget" in res.reason
    w_M, b_M = np.array([35, 30, 20], dtype=np.int64), np.array([2, 3, 1], dtype=np.int64)
    full = decide_bins(w_M, b_M, 64, 4, time_limit=5.0)
    monkeypatch.setattr(sizing, "MEMORY_BUDGET", 4 * 3 * 65 + 48 * 65)  # the pricing fits, the listing does not
    lean = decide_bins(w_M, b_M, 64, 4, time_limit=5.0)
    assert lean.status == full.status == "feasible" and "listing skipped" in lean.reason


def test_50_2_certificate_says_what_it_skipped():
    """50.2: Hard28's BPP13 scaled to C = 2^31 − 1 (ran past 300 s at C = 2.6·10⁸) is certified
    with every O(types × C) stage sized out, each named with its reason in the certificate and
    its JSON form, and the rows it gives are a valid answer (feasible, at least the bound)."""
    from routepack_opt.certify import certify_rows
    from routepack_opt.core.topology import Topology

    src = Path(os.environ.get("ROUTEPACK_BPP_DIR", "/nonexistent")) / "hard28.jsonl"
    if not src.is_file():
        pytest.skip("ROUTEPACK_BPP_DIR with hard28.jsonl is not set")
    rec = next(r for r in map(json.loads, src.read_text().splitlines()) if r["name"].endswith("BPP13"))
    C = 2**31 - 1
    sizes = np.asarray(rec["sizes"], dtype=np.int64) * C // int(rec["capacity"])
    cert = certify_rows(sizes, Topology(dp=1, ep=1, capacity=C), time_limit=1.0)
    assert cert.status == "feasible" and cert.lower_bound <= rec["optimum"] <= cert.rows
    assert any(r.startswith("column generation skipped") for r in cert.skipped), cert.skipped
    assert cert.as_dict()["skipped"] == list(cert.skipped)


def test_50_2_cap_repair_allocates_nothing_over_the_lengths():
    """50.2: the seeds' cap repair looks lengths up by a search over the sorted lengths, not a
    table over 0..max length (at lengths near 2^31 that table was 17 GB and `plan` ran out of
    memory on a 180-sample window): tiny peak memory, and the layout keeps the cap."""
    import tracemalloc

    from routepack_opt.heuristics import cells

    C = 2**31 - 1
    len_N = np.array([C // 2 + 5, C // 2 + 7, C // 3, C // 3, C // 4, C // 5], dtype=np.int64)
    cell_N = np.array([0, 0, 1, 1, 2, 2])  # cell 0 over the cap
    cells.repair_capacity(len_N[:2], np.array([0, 0]), 1, 2, C)  # the kernels loaded (not measured)
    tracemalloc.start()
    ok = cells.repair_capacity(len_N, cell_N, 1, 3, C)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert ok and peak < 64 << 20  # the table over the lengths alone was 17 GB
    assert (np.bincount(cell_N, weights=len_N, minlength=3) <= C).all()


def test_50_2_first_decide_bins_of_a_process_compiles_before_its_clock(tmp_path):
    """Issue 50 item 2 (first call in a process): with a cold numba cache, decide_bins compiled
    its kernels inside a 1 s limit and answered 'unknown' after 3.8 s; now they are compiled
    before the clock and a tiny instance is decided."""
    code = ("import numpy as np\nfrom routepack_opt.models.branch_price import decide_bins\n"
            "r = decide_bins(np.array([5, 4, 3]), np.array([2, 2, 2]), 10, 3, time_limit=1.0)\n"
            "print(r.status)\n")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path), "ROUTEPACK_CACHE_DIR": str(tmp_path),
           "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["feasible"], (r.stdout, r.stderr)

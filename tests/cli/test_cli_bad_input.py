"""Bad-input table (issue 12): every case → exit 2 and exactly one ``error:`` line on stderr."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from routepack_opt.core.errors import InputError
from routepack_opt.core.plan import Plan, dumps_strict
from routepack_opt.core.testing import random_layout, random_window
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import save_window

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOPO = ["--dp", "4", "--ep", "2", "--capacity", "200"]


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    """A directory with a valid window, plan and cost file, and the malformed files of the table."""
    t = tmp_path_factory.mktemp("bad")
    w = random_window(12, 2, 4, 2, max_len=40, seed=1)
    save_window(w, t / "w.npz")
    row, slot = random_layout(12, 2, 4, np.random.default_rng(0))
    Plan(Topology(dp=4, ep=2, capacity=200), 2, np.tile(np.arange(4), (2, 1)), row, slot).save(t / "p.json")
    (t / "c.toml").write_text("gamma = 0.5\nrow_overhead = 3\n[[stage]]\nname = 'a'\nalpha = 1.0\nbeta = 0.01\n")
    base = json.loads((t / "p.json").read_text())

    def plan_variant(name, fn):
        v = json.loads(json.dumps(base))
        fn(v)
        (t / name).write_text(json.dumps(v))

    plan_variant("float_pl.json", lambda v: v.__setitem__("placement", [[float(x) + 0.5 for x in r] for r in v["placement"]]))
    plan_variant("str_pl.json", lambda v: v.__setitem__("placement", [[str(x) for x in r] for r in v["placement"]]))
    plan_variant("other_e.json", lambda v: v.__setitem__("placement", [list(range(8))] * 2))
    plan_variant("cap_1e20.json", lambda v: v["topology"].__setitem__("capacity", 10**20))
    plan_variant("cap_float.json", lambda v: v["topology"].__setitem__("capacity", 200.5))
    (t / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (t / "zero.toml").write_text("gamma = 0\nrow_overhead = 0\n[[stage]]\nname = 'a'\nalpha = 0\nbeta = 0\n")
    (t / "huge.toml").write_text("gamma = 1e308\nrow_overhead = 1e308\n[[stage]]\nname = 'a'\nalpha = 1e308\nbeta = 1e308\n")
    np.save(t / "w.npy", w.counts)
    np.savez(t / "w_2p63.npz", lengths=np.full(12, 2.0**63 - 512), counts=w.counts)
    (t / "afile").write_text("x")
    return t


def _cases():
    """(id, argv with {d} for the fixture directory, text the error line must contain)."""
    W, P, C = "{d}/w.npz", "{d}/p.json", "{d}/c.toml"
    plan = ["plan", W, *TOPO, "--cost", C]
    cases = []
    for cmd, argv in (("plan", plan), ("certify", ["certify", W, *TOPO]),
                      ("exact", ["exact", W, *TOPO, "--cost", C]),
                      ("compare", ["compare", W, *TOPO, "--cost", C])):
        for v in ("0", "-1", "nan", "inf"):
            cases.append((f"{cmd} --time-limit {v}", argv + ["--time-limit", v], "--time-limit"))
    for cmd, argv in (("plan", plan), ("compare", ["compare", W, *TOPO, "--cost", C])):
        for v in ("0", "-1"):
            cases.append((f"{cmd} --max-sweeps {v}", argv + ["--max-sweeps", v], "--max-sweeps"))
    cases += [
        ("gen-trace --staleness -1", ["gen-trace", "--samples", "8", "--staleness", "-1", "-o", "{d}/g.npz"], "--staleness"),
        ("plan --seed -1", plan + ["--seed", "-1"], "--seed"),
        ("compare --seed -1", ["compare", W, *TOPO, "--cost", C, "--seed", "-1"], "--seed"),
        ("gen-trace --seed -1", ["gen-trace", "--samples", "8", "--seed", "-1", "-o", "{d}/g.npz"], "--seed"),
        ("demo --seed -1", ["demo", "--seed", "-1", "--out", "{d}/demo"], "--seed"),
        ("calibrate --seed -1", ["calibrate", "--seed", "-1", "-o", "{d}/k.toml"], "--seed"),
        ("verify-runtime --seed -1", ["verify-runtime", "--seed", "-1"], "--seed"),
        ("measure --scale inf", ["measure", W, P, "--scale", "inf"], "--scale"),
        ("measure --scale nan", ["measure", W, P, "--scale", "nan"], "--scale"),
        ("measure --scale 0", ["measure", W, P, "--scale", "0"], "--scale"),
        ("evaluate float placement", ["evaluate", W, "{d}/float_pl.json", "--cost", C], "placement"),
        ("evaluate string placement", ["evaluate", W, "{d}/str_pl.json", "--cost", C], "placement"),
        ("plan --placement other E", plan + ["--placement", "{d}/other_e.json"], "placement"),
        ("plan --placement-from other E", plan + ["--placement-from", "{d}/other_e.json", "--placement", "joint"], "placement"),
        ("evaluate all-zero cost", ["evaluate", W, P, "--cost", "{d}/zero.toml"], "is 0"),
        ("plan all-zero cost", plan[:-1] + ["{d}/zero.toml"], "is 0"),
        ("evaluate 1e308 cost", ["evaluate", W, P, "--cost", "{d}/huge.toml"], "absurd"),
        ("plan 1e308 cost", plan[:-1] + ["{d}/huge.toml"], "absurd"),
        ("evaluate .npy window", ["evaluate", "{d}/w.npy", P, "--cost", C], ".npy"),
        ("plan .npy window", ["plan", "{d}/w.npy", *TOPO, "--cost", C], ".npy"),
        ("plan --capacity 1e20", ["plan", W, "--dp", "4", "--ep", "2", "--capacity", "1e20", "--cost", C], "--capacity"),
        ("plan --capacity 10^20", ["plan", W, "--dp", "4", "--ep", "2", "--capacity", str(10**20), "--cost", C], "--capacity"),
        ("plan --capacity 1.5", ["plan", W, "--dp", "4", "--ep", "2", "--capacity", "1.5", "--cost", C], "--capacity"),
        ("certify --capacity 2^40+1", ["certify", W, "--dp", "4", "--ep", "2", "--capacity", str(2**40 + 1)], "capacity"),
        ("evaluate plan capacity 1e20", ["evaluate", W, "{d}/cap_1e20.json", "--cost", C], "capacity"),
        ("evaluate plan capacity 200.5", ["evaluate", W, "{d}/cap_float.json", "--cost", C], "capacity"),
        ("evaluate deeply nested plan", ["evaluate", W, "{d}/deep.json", "--cost", C], "nested"),
        ("plan --placement deeply nested", plan + ["--placement", "{d}/deep.json"], "nested"),
        ("plan -o missing dir", plan + ["-o", "{d}/no/such/dir/p.json"], "does not exist"),
        ("plan -o under a file", plan + ["-o", "{d}/afile/p.json"], "does not exist"),
        ("plan -o a directory", plan + ["-o", "{d}"], "directory"),
        ("plan -o dir/", plan + ["-o", "{d}/sub/"], "directory"),
        ("plan -o the input window", plan + ["-o", W], "overwrite the input"),
        ("exact -o the input window", ["exact", W, *TOPO, "--cost", C, "-o", W], "overwrite the input"),
        ("gen-trace -o a directory", ["gen-trace", "--samples", "8", "-o", "{d}"], "directory"),
        ("calibrate -o missing dir", ["calibrate", "--quick", "-o", "{d}/no/k.toml"], "does not exist"),
        ("verify-runtime --timeout nan", ["verify-runtime", "--timeout", "nan"], "--timeout"),
        ("verify-runtime --timeout 0", ["verify-runtime", "--timeout", "0"], "--timeout"),
        ("bare routepack", [], "missing command"),
        ("lengths near 2^63", ["evaluate", "{d}/w_2p63.npz", P, "--cost", C], "lengths"),
        ("gen-trace --samples 0", ["gen-trace", "--samples", "0", "-o", "{d}/g.npz"], "--samples"),
        ("plan --rows 0", plan + ["--rows", "0"], "--rows"),
    ]
    return cases


CASES = _cases()


@pytest.mark.parametrize("argv, match", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_error_line_exit_2(run_cli, d, argv, match):
    """A hostile or mistaken input exits 2 with exactly one `error:` line naming the problem."""
    (d / "sub").mkdir(exist_ok=True)
    code, out, err = run_cli(*[a.replace("{d}", str(d)) for a in argv])
    lines = err.strip().splitlines()
    assert code == 2, (argv, code, err)
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert match in lines[0], lines[0]


def test_table_covers_the_issue():
    """The table keeps at least the ~50 cases listed in issue 12."""
    assert len(CASES) >= 50


@pytest.mark.parametrize("argv", [
    ["evaluate", "{d}/w_2p63.npz", "{d}/p.json", "--cost", "{d}/c.toml"],
    ["evaluate", "{d}/w.npz", "{d}/p.json", "--cost", "{d}/huge.toml"],
    [],
], ids=["lengths near 2^63", "1e308 cost", "bare routepack"])
def test_no_warning_before_the_error_line(d, argv):
    """In a real process (warnings on), stderr is the error line alone: no numpy RuntimeWarning."""
    r = subprocess.run([sys.executable, "-W", "default", "-m", "routepack_opt",
                        *[a.replace("{d}", str(d)) for a in argv]],
                       capture_output=True, text=True, timeout=120, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": REPO})
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.stderr


def test_json_output_is_strict():
    """A non-finite number never reaches JSON output as `Infinity`: it is a clean InputError."""
    assert json.loads(dumps_strict({"a": np.float64(1.5)})) == {"a": 1.5}
    with pytest.raises(InputError, match="non-finite"):
        dumps_strict({"makespan": float("inf")})

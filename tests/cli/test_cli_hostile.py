"""Hostile-input sweep (issue 30, issue 25 item 5): every case exits 2 with one `error:` line
before any work or output, never "internal failure"; outputs go where the user means."""

import json
import os
import socket
import stat
import subprocess
import sys

import numpy as np
import pytest

from routepack_opt.core.plan import Plan
from routepack_opt.core.testing import random_layout, random_window
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import save_window

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = {**os.environ, "PYTHONPATH": REPO}
TOPO = ["--dp", "4", "--ep", "2", "--capacity", "200"]
LONG = "x" * 300 + ".json"


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    """A valid window, plan and cost, and the hostile variants of the table."""
    t = tmp_path_factory.mktemp("hostile")
    w = random_window(16, 2, 4, 2, max_len=40, seed=1)
    save_window(w, t / "w.npz")
    row, slot = random_layout(16, 2, 4, np.random.default_rng(0))
    Plan(Topology(dp=4, ep=2, capacity=200), 2, np.tile(np.arange(4), (2, 1)), row, slot).save(t / "p.json")
    (t / "c.toml").write_text("gamma = 0.5\nrow_overhead = 3\n[[stage]]\nname = 'a'\nalpha = 1.0\nbeta = 0.01\n")
    arrs = {"lengths": w.lengths, "counts": w.counts}
    np.savez(t / "w_topk_inf.npz", **arrs, top_k=np.float64("inf"))
    np.savez(t / "w_bool.npz", lengths=np.ones(4, dtype=bool), counts=np.ones((4, 1, 2), dtype=bool))
    np.savez(t / "w_step_neg.npz", **arrs, step=np.int64(-1))
    counts = np.zeros((8, 2, 4), dtype=np.int32)
    counts[:, :, :2] = 10
    np.savez(t / "w_short.npz", lengths=np.full(8, 10), counts=counts, top_k=np.int64(2))
    base = json.loads((t / "p.json").read_text())

    def variant(name, fn, text=None):
        v = json.loads(json.dumps(base))
        fn(v)
        (t / name).write_text(text(json.dumps(v)) if text else json.dumps(v))

    for kind, info in (("str", "x"), ("num", 3), ("list", [1, 2])):
        variant(f"info_{kind}.json", lambda v, info=info: v.__setitem__("info", info))
    variant("id_1e8.json", lambda v: v["cells"][0][0].append(100_000_000))
    variant("id_2p63.json", lambda v: v["cells"][0][0].append(2**63))
    variant("nan.json", lambda v: v.__setitem__("lower_bound", 1.5),
            text=lambda s: s.replace('"lower_bound": 1.5', '"lower_bound": NaN'))
    variant("shard_float.json", lambda v: v["topology"].__setitem__("shard_of_slot", [0.5, 0.5, 1.5, 1.5]))
    for name, body in (("temps", "temperatures = 1000000000"), ("calib", "calibration_moves = 100000000"),
                       ("pop", "population = 1000000000"), ("walk", "random_walk_sweeps = 1e12")):
        (t / f"{name}.toml").write_text(f"[anneal]\n{body}\n")
    stage = "[[stage]]\nname = 'a'\nalpha = 1.0\nbeta = 0.01\n"
    (t / "bytes.toml").write_text(f"gamma = 0.5\nexpert_bytes = 1e308\nmigration_bandwidth = 1.0\n{stage}")
    (t / "slow.toml").write_text(f"gamma = 0.5\nexpert_bytes = 1e12\nmigration_bandwidth = 1e-9\n{stage}")
    (t / "adir").mkdir()
    return t


def _cases():
    """(id, argv with {d} for the fixture directory, text the error line must contain)."""
    W, P, C = "{d}/w.npz", "{d}/p.json", "{d}/c.toml"
    plan = ["plan", W, *TOPO, "--cost", C]
    cases = []
    wi = "{d}/w_topk_inf.npz"
    for cmd, argv in (("stats", ["stats", wi]), ("certify", ["certify", wi, *TOPO]),
                      ("plan", ["plan", wi, *TOPO, "--cost", C]), ("evaluate", ["evaluate", wi, P, "--cost", C]),
                      ("compare", ["compare", wi, *TOPO, "--cost", C]), ("exact", ["exact", wi, *TOPO, "--cost", C])):
        cases.append((f"top_k=inf {cmd}", argv, "top_k"))
    for kind in ("str", "num", "list"):
        pj = "{d}/info_" + kind + ".json"
        for cmd, argv in (("evaluate", ["evaluate", W, pj, "--cost", C]),
                          ("plan --placement", plan + ["--placement", pj]),
                          ("plan --placement-from", plan + ["--placement", "joint", "--placement-from", pj]),
                          ("exact --placement", ["exact", W, *TOPO, "--cost", C, "--placement", pj]),
                          ("compare --placement-from", ["compare", W, *TOPO, "--cost", C, "--placement-from", pj]),
                          ("measure", ["measure", W, pj, "--quick"])):
            cases.append((f"info={kind} {cmd}", argv, "info must be a JSON object"))
    for cmd, argv in (("plan", plan), ("gen-trace", ["gen-trace", "--samples", "4"]),
                      ("exact", ["exact", W, *TOPO, "--cost", C]), ("calibrate", ["calibrate", "--quick"])):
        cases.append((f"{cmd} -o 300-char name", argv + ["-o", "{d}/" + LONG], "at most 255"))
        cases.append((f"{cmd} -o ''", argv + ["-o", ""], "empty"))
        cases.append((f"{cmd} -o newdir/", argv + ["-o", "{d}/newdir/"], "directory"))
        cases.append((f"{cmd} -o existing dir", argv + ["-o", "{d}/adir"], "directory"))
    cases += [
        ("--placement plan with sample id 1e8", plan + ["--placement", "{d}/id_1e8.json"], "sample id"),
        ("--placement plan with sample id 2^63", plan + ["--placement", "{d}/id_2p63.json"], "sample id"),
        ("gen-trace --experts 1000000", ["gen-trace", "--samples", "4", "--layers", "1", "--experts", "1000000",
                                         "--top-k", "2", "-o", "{d}/g.npz"], "num_experts"),
        ("gen-trace --domains 20000000", ["gen-trace", "--samples", "4", "--domains", "20000000", "-o", "{d}/g.npz"],
         "num_domains"),
        ("gen-trace --domains 4000 --layers 64 --experts 256", ["gen-trace", "--samples", "4", "--domains", "4000", "--layers", "64", "--experts", "256",
                                                  "-o", "{d}/g.npz"], "policy logits"),
        ("gen-trace --skew 1e308", ["gen-trace", "--samples", "4", "--skew", "1e308", "-o", "{d}/g.npz"], "skew"),
        ("gen-trace --step 10^9", ["gen-trace", "--samples", "4", "--step", "1000000000", "-o", "{d}/g.npz"],
         "--step"),
        ("config temperatures=1e9", plan + ["--time-limit", "2", "--config", "{d}/temps.toml"], "temperatures"),
        ("config calibration_moves=1e8", plan + ["--time-limit", "2", "--config", "{d}/calib.toml"],
         "calibration_moves"),
        ("config population=1e9", plan + ["--time-limit", "2", "--config", "{d}/pop.toml"], "population"),
        ("config random_walk_sweeps=1e12", plan + ["--config", "{d}/walk.toml"], "random_walk_sweeps"),
        ("bool-dtype window", ["stats", "{d}/w_bool.npz"], "bool"),
        ("float shard_of_slot", ["evaluate", W, "{d}/shard_float.json", "--cost", C], "shard_of_slot"),
        ("window step=-1 plan", ["plan", "{d}/w_step_neg.npz", *TOPO, "--cost", C], "step"),
        ("window step=-1 stats", ["stats", "{d}/w_step_neg.npz"], "step"),
        ("NaN literal in a plan", ["evaluate", W, "{d}/nan.json", "--cost", C], "NaN"),
        ("cost expert_bytes=1e308", plan[:-1] + ["{d}/bytes.toml"], "expert_bytes"),
        ("cost migration of 1e21 µs", plan[:-1] + ["{d}/slow.toml"], "migration_bandwidth"),
        ("stats --tokens 10^30", ["stats", W, "--tokens", str(10**30)], "--tokens"),
        ("demo --ep 3", ["demo", "--ep", "3", "--samples", "64", "--out", "{d}/demo"], "divisible"),
    ]
    return cases


CASES = _cases()


@pytest.mark.parametrize("argv, match", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_input_is_one_error_line_exit_2(run_cli, d, argv, match):
    """A hostile input exits 2 with one `error:` line naming it, before any output is written."""
    code, out, err = run_cli(*[a.replace("{d}", str(d)) for a in argv])
    lines = err.strip().splitlines()
    assert code == 2, (argv, code, err)
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert match in lines[0], lines[0]
    assert not (d / "newdir").exists() and not (d / "g.npz").exists()
    assert not (d / "demo" / "window.npz").exists()
    assert not [p.name for p in d.iterdir() if p.name.endswith(".tmp")]


def test_the_sweep_covers_the_issue():
    """The table keeps every case of the issue (with the probes of the other tables in tests/cli)."""
    assert len(CASES) >= 60


def test_stats_json_on_a_window_shorter_than_tokens(run_cli, d):
    """`stats --json` on a window whose samples are all shorter than --tokens works: the
    dispersion is null (undefined), not an error blaming the cost model."""
    code, out, err = run_cli("stats", d / "w_short.npz", "--json")
    assert code == 0, err
    disp = json.loads(out)["routing_dispersion"]
    assert disp["median"] is None and disp["mean"] is None and disp["pairs"] == 0
    assert disp["samples_short"] == 8


def _plan_to(run_cli, d, target):
    return run_cli("plan", d / "w.npz", *TOPO, "--cost", d / "c.toml", "--max-sweeps", "1", "-o", target)


def test_plan_through_a_symlink_is_refused(run_cli, d, tmp_path):
    """`plan -o link.json`: exit 2 before any work (issue 50: outputs never follow a link); the link stays, its target keeps its contents."""
    (tmp_path / "real.json").write_text("old")
    (tmp_path / "link.json").symlink_to("real.json")
    code, _, err = _plan_to(run_cli, d, tmp_path / "link.json")
    assert code == 2 and err.count("\n") == 1 and "symbolic link" in err, err
    assert (tmp_path / "link.json").is_symlink() and (tmp_path / "real.json").read_text() == "old"


def test_plan_into_a_fifo_is_refused(run_cli, d, tmp_path):
    """`plan -o fifo`: exit 2 at once, the FIFO never opened (issue 50: with no reader it blocked) and still a FIFO."""
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a regression that opens it anyway does not block
    try:
        code, _, err = _plan_to(run_cli, d, fifo)
        assert os.read(reader, 16) == b""
    finally:
        os.close(reader)
    assert code == 2 and err.count("\n") == 1 and "FIFO" in err, err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_plan_onto_char_devices(run_cli, d, tmp_path):
    """As root, `plan -o` a null or full char device: exit 2 before any work; the nodes stay devices."""
    for name, minor in (("null", 3), ("full", 7)):
        try:
            os.mknod(tmp_path / name, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
        except OSError as exc:
            pytest.skip(f"cannot create a character device here ({exc})")
    for name in ("null", "full"):
        code, _, err = _plan_to(run_cli, d, tmp_path / name)
        assert code == 2 and err.startswith("error: ") and "character device" in err and err.count("\n") == 1, err
    assert all(stat.S_ISCHR(os.lstat(tmp_path / n).st_mode) for n in ("null", "full"))


def test_socket_output_is_refused(run_cli, d, tmp_path):
    """`-o` a socket: exit 2 before any work; the socket is not replaced."""
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(tmp_path / "s.sock"))
        code, _, err = _plan_to(run_cli, d, tmp_path / "s.sock")
        assert code == 2 and "socket" in err, err
        assert stat.S_ISSOCK(os.lstat(tmp_path / "s.sock").st_mode)
    finally:
        s.close()


def _subprocess(argv, **kw):
    return subprocess.run([sys.executable, "-m", "routepack_opt", *map(str, argv)], env=ENV, cwd=REPO,
                          text=True, timeout=300, **kw)


def test_stats_json_into_a_full_device_is_exit_2(d):
    """`stats --json > /dev/full`: exit 2, one `error:` line (was an internal failure, ENOSPC)."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    with open("/dev/full", "w") as full:
        r = _subprocess(["stats", d / "w.npz", "--json"], stdout=full, stderr=subprocess.PIPE)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "No space left" in r.stderr, r.stderr


def test_verify_runtime_short_timeout_is_exit_2():
    """`verify-runtime --timeout 0.5`: exit 2 naming --timeout (was an internal TimeoutError)."""
    r = _subprocess(["verify-runtime", "--timeout", "0.5", "--world-size", "2"], capture_output=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--timeout 0.5" in r.stderr, r.stderr

"""Atomic output (routepack_opt.core.io): a killed, full or refused write never loses the old file."""

import json
import os
import resource
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from routepack_opt.core.errors import InputError
from routepack_opt.core.io import atomic_write_text, check_output_path, save_npz
from routepack_opt.core.plan import Plan
from routepack_opt.core.testing import random_layout, random_window
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import load_window, save_window

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = {**os.environ, "PYTHONPATH": REPO}

# A writer that streams a large output slowly through atomic_open, so a kill lands mid-write.
SLOW_WRITER = """
import sys
from routepack_opt.core.io import atomic_open
with atomic_open(sys.argv[1]) as fh:
    print("writing", flush=True)
    for _ in range(10_000):
        fh.write(b"x" * 65536)
        fh.flush()
"""


def test_kill_during_write_keeps_the_old_file(tmp_path):
    """SIGKILL in the middle of writing a big output: the old file is intact, byte for byte."""
    target = tmp_path / "plan.json"
    target.write_text('{"old": true}\n')
    proc = subprocess.Popen([sys.executable, "-c", SLOW_WRITER, str(target)], stdout=subprocess.PIPE,
                            env=ENV, cwd=REPO)
    assert proc.stdout.readline().strip() == b"writing"
    while not any(p.name.startswith(".plan.json.") and p.stat().st_size > 0 for p in tmp_path.iterdir()):
        time.sleep(0.01)  # wait until the temporary file holds data (a real mid-write kill)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert target.read_text() == '{"old": true}\n'


def test_kill_during_gen_trace_keeps_the_old_window(tmp_path):
    """`gen-trace -o existing.npz` killed at any point leaves a loadable window, never 0 bytes."""
    target = tmp_path / "w.npz"
    save_window(random_window(8, seed=0), target)
    before = target.read_bytes()
    proc = subprocess.Popen([sys.executable, "-m", "routepack_opt", "gen-trace", "--samples", "4096",
                             "-o", str(target)], env=ENV, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.8)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    data = target.read_bytes()
    assert data == before or load_window(target).num_samples == 4096


def _limit_fsize(nbytes):
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))


def test_disk_full_is_one_error_line_and_keeps_the_old_plan(tmp_path):
    """Under a 8 KiB RLIMIT_FSIZE a plan too big to write is exit 2, one error line, old file intact."""
    w = random_window(3000, 2, 4, 2, max_len=40, seed=1)
    save_window(w, tmp_path / "w.npz")
    old = tmp_path / "p.json"
    old.write_text('{"old": true}\n')
    argv = [sys.executable, "-m", "routepack_opt", "plan", str(tmp_path / "w.npz"), "--dp", "4",
            "--ep", "2", "--capacity", "40000", "--cost", "olmoe-1b-7b", "--max-sweeps", "1", "-o"]
    # Unlimited first: on a fresh clone numba writes its compilation cache, which the limit would hit.
    subprocess.run(argv + [str(tmp_path / "warm.json")], capture_output=True, timeout=600, env=ENV,
                   cwd=REPO, check=True)
    r = subprocess.run(argv + [str(old)], capture_output=True, text=True, timeout=300, env=ENV,
                       cwd=REPO, preexec_fn=_limit_fsize(8 * 1024))
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: ") and "cannot write" in r.stderr
    assert old.read_text() == '{"old": true}\n'
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_disk_full_gen_trace_keeps_the_old_window(tmp_path):
    """`gen-trace -o existing.npz` past an 8 KiB RLIMIT_FSIZE: exit 2, one error line, old window intact."""
    target = tmp_path / "w.npz"
    save_window(random_window(4, seed=0), target)
    before = target.read_bytes()
    r = subprocess.run([sys.executable, "-m", "routepack_opt", "gen-trace", "--samples", "512",
                        "-o", str(target)], capture_output=True, text=True, timeout=300, env=ENV,
                       cwd=REPO, preexec_fn=_limit_fsize(8 * 1024))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "cannot write" in r.stderr, r.stderr
    assert target.read_bytes() == before


def test_failed_write_in_process_removes_the_temp_file(tmp_path):
    """An exception while writing leaves the old file and no temporary file behind."""
    target = tmp_path / "t.txt"
    target.write_text("old")

    class Boom(Exception):
        pass

    from routepack_opt.core.io import atomic_open
    with pytest.raises(Boom):
        with atomic_open(target) as fh:
            fh.write(b"partial")
            raise Boom
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["t.txt"]


def test_atomic_writers_round_trip(tmp_path):
    """Plan.save, save_window, save_npz and atomic_write_text write complete, readable files."""
    atomic_write_text(tmp_path / "a.txt", "héllo")
    assert (tmp_path / "a.txt").read_text() == "héllo"
    save_npz(tmp_path / "a.npz", x=np.arange(5))
    assert np.load(tmp_path / "a.npz")["x"].tolist() == list(range(5))
    row, slot = random_layout(12, 2, 4, np.random.default_rng(0))
    Plan(Topology(dp=4, ep=2, capacity=200), 2, np.tile(np.arange(4), (2, 1)), row, slot).save(tmp_path / "p.json")
    assert json.loads((tmp_path / "p.json").read_text())["rows"] == 2


def test_check_output_path_refusals(tmp_path):
    """Outputs equal to an input (also via another spelling), directories or in missing dirs are refused."""
    (tmp_path / "w.npz").write_bytes(b"x")
    with pytest.raises(InputError, match="overwrite the input"):
        (tmp_path / "sub").mkdir()
        check_output_path(tmp_path / "sub" / ".." / "w.npz", tmp_path / "w.npz")
    os.symlink(tmp_path / "w.npz", tmp_path / "link.npz")
    with pytest.raises(InputError, match="overwrite the input"):
        check_output_path(tmp_path / "link.npz", tmp_path / "w.npz")
    with pytest.raises(InputError, match="directory"):
        check_output_path(tmp_path)
    with pytest.raises(InputError, match="does not exist"):
        check_output_path(tmp_path / "nope" / "x.json")
    assert check_output_path(tmp_path / "ok.json", tmp_path / "w.npz") == tmp_path / "ok.json"

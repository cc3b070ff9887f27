"""Atomic output (routepack_opt.core.io): a killed, full or refused write never loses the old file."""

import json
import os
import resource
import signal
import stat
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
    with pytest.raises(InputError, match="symbolic link"):  # never followed, onto an input or not
        check_output_path(tmp_path / "link.npz", tmp_path / "w.npz")
    with pytest.raises(InputError, match="directory"):
        check_output_path(tmp_path)
    with pytest.raises(InputError, match="does not exist"):
        check_output_path(tmp_path / "nope" / "x.json")
    assert check_output_path(tmp_path / "ok.json", tmp_path / "w.npz") == tmp_path / "ok.json"


# --- writes go where the user means (issue 25 item 5) and leave no debris (issue 30) -------------
def _mknod_or_skip(path, minor):
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
    except (PermissionError, OSError) as exc:
        pytest.skip(f"cannot create a character device here ({exc})")


def test_symlink_output_is_refused_and_its_target_kept(tmp_path):
    """`-o link.json` (a symlink): refused (issue 50: a link's target may be an input); the link and the file it points to are unchanged."""
    (tmp_path / "real.json").write_text("old")
    (tmp_path / "link.json").symlink_to("real.json")
    with pytest.raises(InputError, match="symbolic link"):
        atomic_write_text(tmp_path / "link.json", "new")
    assert (tmp_path / "link.json").is_symlink() and (tmp_path / "real.json").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "real.json"]


def test_fifo_output_is_refused_never_opened(tmp_path):
    """`-o fifo` (a named pipe, no reader): refused at once (issue 50: opening it blocked), and it is still a FIFO."""
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="FIFO"):
        atomic_write_text(fifo, "through the pipe")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_char_devices_are_refused_never_replaced(tmp_path):
    """As root, a char device output (null, full made with mknod) is refused and stays a device."""
    null, full = tmp_path / "null", tmp_path / "full"
    _mknod_or_skip(null, 3)
    _mknod_or_skip(full, 7)
    for dev in (null, full):
        with pytest.raises(InputError, match="character device"):
            atomic_write_text(dev, "gone")
    assert stat.S_ISCHR(os.lstat(null).st_mode) and stat.S_ISCHR(os.lstat(full).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full", "null"]


def test_dash_and_dev_stdout_stream_to_standard_output(tmp_path):
    """`-o -` and `-o /dev/stdout` (redirected to a file, as `> out` does) put the plan on stdout,
    the summary on stderr, and leave /dev/stdout a link."""
    w = random_window(12, 2, 4, 2, max_len=40, seed=1)
    save_window(w, tmp_path / "w.npz")
    before = os.lstat("/dev/stdout").st_mode if os.path.lexists("/dev/stdout") else None
    for name in ("-", "/dev/stdout"):
        with open(tmp_path / "out.json", "w") as fh:
            r = subprocess.run([sys.executable, "-m", "routepack_opt", "plan", str(tmp_path / "w.npz"), "--dp",
                                "4", "--ep", "2", "--capacity", "200", "--cost", "olmoe-1b-7b", "--max-sweeps",
                                "1", "-o", name], stdout=fh, stderr=subprocess.PIPE, text=True, env=ENV,
                               cwd=tmp_path, timeout=600)
        assert r.returncode == 0, r.stderr
        assert json.loads((tmp_path / "out.json").read_text())["format"] == "routepack-plan/1"
        assert "wrote" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json", "w.npz"]
    if before is not None:
        assert os.lstat("/dev/stdout").st_mode == before


@pytest.mark.parametrize("name, match", [("", "empty"), ("x" * 300 + ".json", "at most 255"),
                                         ("newdir/", "directory"), (".", "directory"), ("sub", "directory")])
def test_outputs_no_write_can_succeed_on_are_refused_up_front(tmp_path, name, match):
    """Empty, over-long, directory-like and existing-directory outputs: InputError before any work."""
    (tmp_path / "sub").mkdir()
    path = name if name in ("",) else str(tmp_path / name) if name != "newdir/" else str(tmp_path / "newdir") + "/"
    with pytest.raises(InputError, match=match):
        check_output_path(path)
    assert not (tmp_path / "newdir").exists()


def test_socket_output_is_refused(tmp_path):
    """A socket is never replaced by a file."""
    import socket

    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(tmp_path / "s.sock"))
        with pytest.raises(InputError, match="socket"):
            check_output_path(tmp_path / "s.sock")
    finally:
        s.close()


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_temp_files_of_dead_writers_are_swept(tmp_path):
    """Before a write, temp files of the same target whose writer is dead go; a live writer's stay."""
    dead = tmp_path / f".x.json.{_dead_pid()}-abcd1234.tmp"
    live = tmp_path / f".x.json.{os.getppid()}-efgh5678.tmp"
    other = tmp_path / f".y.json.{_dead_pid()}-abcd1234.tmp"
    for p in (dead, live, other):
        p.write_bytes(b"junk")
    atomic_write_text(tmp_path / "x.json", "ok")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other.name, "x.json"])


def test_kill9_debris_is_removed_by_the_next_run(tmp_path):
    """SIGKILL mid-write leaves a temp file; the next write to the same target removes it."""
    target = tmp_path / "plan.json"
    proc = subprocess.Popen([sys.executable, "-c", SLOW_WRITER, str(target)], stdout=subprocess.PIPE,
                            env=ENV, cwd=REPO)
    assert proc.stdout.readline().strip() == b"writing"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # the debris of the kill
    atomic_write_text(target, "clean")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"] and target.read_text() == "clean"


def test_sigterm_is_a_clean_interrupt(tmp_path):
    """SIGTERM during `gen-trace -o`: exit 130, one `error: interrupted` line, no temp file left."""
    target = tmp_path / "w.npz"
    proc = subprocess.Popen([sys.executable, "-m", "routepack_opt", "gen-trace", "--samples", "200000",
                             "--layers", "8", "-o", str(target)], env=ENV, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    while not any(p.name.endswith(".tmp") for p in tmp_path.iterdir()) and time.monotonic() - t0 < 300:
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 130 and err == "error: interrupted\n", err
    assert list(tmp_path.iterdir()) == []

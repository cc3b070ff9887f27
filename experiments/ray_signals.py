"""Signals and processes with Ray running (issue 39, item 2): ``replay-report`` on a local Ray
cluster, then, once the raylet is up,

- ``sigterm``: SIGTERM to the command: exit 130 or 143, one ``error: interrupted`` line, no C++ dump,
  ``steps.jsonl`` lines kept (a rerun resumes), no Ray process left;
- ``sigterm-init``: SIGTERM while ``ray.init`` runs (as soon as the GCS is up): the same;
- ``sigterm-mid``: SIGTERM after the first ``steps.jsonl`` line: the same, the lines kept;
- ``sigint``: SIGINT, the same;
- ``kill9``: SIGKILL to the command: no Ray process (GCS, raylet, DashboardAgent,
  RuntimeEnvAgent, workers) left 20 s later;
- ``raylet``: SIGKILL to the raylet mid-run (what the OOM killer does): exit 2 with one
  ``error:`` line, no hang, the finished lines kept, no process left.

    PYTHONPATH=<tree> python3 experiments/ray_signals.py [OUT.json] [--only NAME]

Processes are found by the ``ROUTEPACK_RAY_OWNER`` token in their environment (what the
command's reaper kills, :mod:`routepack_opt.integrations.ray`) and, independently, by their
command line under the run's temporary directory.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PY = sys.executable
T = ["--dp", "8", "--ep", "4", "--capacity", "1024", "--cost", "olmoe-1b-7b"]


def rp(*args) -> list[str]:
    return [PY, "-m", "routepack_opt", *map(str, args)]


def owned(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of every process whose environment names ``pid``'s Ray as its owner."""
    out = []
    needle = f"ROUTEPACK_RAY_OWNER={pid}-".encode()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            env = Path(f"/proc/{d}/environ").read_bytes()
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(v.startswith(needle) for v in env.split(b"\0")):
            out.append((int(d), cmd))
    return out


def _wait_for(pred, timeout: float, step: float = 0.1) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step)
    return False


def run_dir(d: Path, n: int = 4) -> Path:
    run = d / "run"
    run.mkdir()
    for i in range(n):
        subprocess.run(rp("gen-trace", "--preset", "olmoe-1b-7b", "--samples", 64, "--layers", 4, "--experts", 16,
                          "--top-k", 2, "--capacity", 1024, "--seed", i, "-o", run / f"step_{i}.npz"),
                       check=True, capture_output=True)
    return run


def case(name: str, run: Path, out: Path, rerun: bool = True) -> dict:
    cmd = rp("replay-report", run, "-o", out, *T, "--max-sweeps", 2, "--workers", 2)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def has(word):
        return lambda: any(word in c for _, c in owned(proc.pid))

    if name == "sigterm-init":
        up = _wait_for(has("gcs_server"), 60, 0.02)
    elif name in ("raylet", "sigterm-mid"):  # mid-run: after the first line, with windows still to go
        up = _wait_for(lambda: (out / "steps.jsonl").exists() and (out / "steps.jsonl").stat().st_size > 0, 120)
    else:
        up = _wait_for(has("ray::"), 90)  # a worker: raylet and agents are up
    alive_before = owned(proc.pid)
    if name in ("sigterm", "sigterm-init", "sigterm-mid"):
        proc.send_signal(signal.SIGTERM)
    elif name == "sigint":
        proc.send_signal(signal.SIGINT)
    elif name == "kill9":
        proc.kill()
    elif name == "raylet":
        for pid, c in alive_before:
            if "/raylet/raylet" in c.split(" ")[0]:
                os.kill(pid, signal.SIGKILL)
    try:
        stdout, stderr = proc.communicate(timeout=120)
        hang = False
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        hang = True
    wall = time.monotonic() - t0
    gone = _wait_for(lambda: not owned(proc.pid), 20, 0.5)
    left = owned(proc.pid)
    for pid, _ in left:  # clean up after a failed check
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    lines = (out / "steps.jsonl").read_text().count("\n") if (out / "steps.jsonl").exists() else 0
    resumed = None
    if rerun and name in ("sigterm-mid", "raylet") and not hang:  # the rerun plans only what is missing
        again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        resumed = {"rc": again.returncode, "line": again.stdout.splitlines()[0] if again.stdout else again.stderr}
    # replay-report's progress lines (``replay-report: k/N windows ...``, stderr without a TTY) are
    # not errors: what is left must be the one error: line
    err = [x for x in stderr.splitlines() if x.strip() and not re.match(r"replay-report: \d+/\d+ windows", x)]
    return {"case": name, "ray_up": up, "ray_processes_before": len(alive_before), "rc": proc.returncode,
            "hang": hang, "stderr_lines": len(err), "stderr": err[:3], "dump": "SIGTERM received" in stderr
            or "***" in stderr, "steps_lines_kept": lines, "rerun": resumed, "left_after_20s": len(left) if not gone else 0,
            "left": [c[:100] for _, c in left][:5], "wall_s": round(wall, 1)}


def main() -> None:
    args = sys.argv[1:]
    only = args[args.index("--only") + 1] if "--only" in args else None
    out_json = next((a for a in args if a.endswith(".json")), None)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        run = run_dir(Path(tmp), 8)
        for name in ("sigterm", "sigterm-init", "sigterm-mid", "sigint", "kill9", "raylet"):
            if only and only != name:
                continue
            rows.append(case(name, run, Path(tmp) / f"out_{name}"))
            print(json.dumps(rows[-1]), flush=True)
    if out_json:
        Path(out_json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()

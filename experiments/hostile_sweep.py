"""Hostile-input sweep (issue 30, issue 25 item 5): each probe run as a subprocess, with its exit
code, first stderr line, wall time and peak memory (RSS of the process tree), under a memory cap.

    PYTHONPATH=<tree> python3 experiments/hostile_sweep.py OUT.json [--only SUBSTR] [--cap-gb 6]

The probes are the issue's reproducers: a 64-sample window ``w.npz`` from ``gen-trace --preset
olmoe-1b-7b --samples 64 --layers 4 --experts 16 --top-k 2 --capacity 1024`` and the topology
``T = --dp 8 --ep 4 --capacity 1024 --cost olmoe-1b-7b``. Run it once on the code before a change
and once after to get the before/after table (``--table BEFORE.json AFTER.json`` prints it).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PY = sys.executable
T = ["--dp", "8", "--ep", "4", "--capacity", "1024", "--cost", "olmoe-1b-7b"]


def rp(*args) -> list[str]:
    return [PY, "-m", "routepack_opt", *map(str, args)]


def fixtures(d: Path) -> None:
    """The window, a plan of it and the hostile variants of both."""
    subprocess.run(rp("gen-trace", "--preset", "olmoe-1b-7b", "--samples", 64, "--layers", 4, "--experts", 16,
                      "--top-k", 2, "--capacity", 1024, "-o", d / "w.npz"), check=True, capture_output=True)
    subprocess.run(rp("plan", d / "w.npz", *T, "--max-sweeps", 2, "-o", d / "p.json"), check=True,
                   capture_output=True)
    with np.load(d / "w.npz") as z:
        arrs = {k: z[k] for k in z.files}
    np.savez(d / "w_topk_inf.npz", **{**arrs, "top_k": np.float64("inf")})
    np.savez(d / "w_bool.npz", lengths=np.ones(4, dtype=bool), counts=np.ones((4, 1, 2), dtype=bool))
    np.savez(d / "w_step_neg.npz", **{**arrs, "step": np.int64(-1)})
    short = {k: v for k, v in arrs.items() if k != "group_ids"}
    short["lengths"] = np.full(8, 10, dtype=np.int64)
    c = np.zeros((8, 4, 16), dtype=np.int32)
    c[:, :, 0] = 10
    c[:, :, 1] = 10
    short["counts"] = c
    short["top_k"] = np.int64(2)
    np.savez(d / "w_short.npz", **short)
    plan = json.loads((d / "p.json").read_text())
    for name, info in (("str", "x"), ("num", 3), ("list", [1, 2])):
        (d / f"p_info_{name}.json").write_text(json.dumps({**plan, "info": info}))
    big = json.loads(json.dumps(plan))
    big["cells"][0][0].append(100_000_000)
    (d / "p_id_1e8.json").write_text(json.dumps(big))
    big["cells"][0][0][-1] = 2**63
    (d / "p_id_2p63.json").write_text(json.dumps(big))
    (d / "p_nan.json").write_text(json.dumps({**plan, "lower_bound": 1.0}).replace('"lower_bound": 1.0',
                                                                                 '"lower_bound": NaN'))
    fl = json.loads(json.dumps(plan))
    fl["topology"]["shard_of_slot"] = [float(i // 4) + 0.5 for i in range(8)]  # 0.5, 1.5: truncated
    (d / "p_shard_float.json").write_text(json.dumps(fl))
    (d / "temps.toml").write_text("[anneal]\ntemperatures = 1000000000\n")
    (d / "calib.toml").write_text("[anneal]\ncalibration_moves = 100000000\n")
    (d / "pop.toml").write_text("[anneal]\npopulation = 1000000000\n")
    (d / "bytes.toml").write_text("gamma = 1.0\nrow_overhead = 1.0\nexpert_bytes = 1e308\n"
                                  "migration_bandwidth = 1.0\n[[stage]]\nname = 'a'\nalpha = 1.0\nbeta = 0.01\n")
    (d / "adir").mkdir()
    (d / "real.json").write_text("old\n")
    (d / "link.json").symlink_to("real.json")
    os.mkfifo(d / "fifo.json")
    (d / "stdout.link").symlink_to("/proc/self/fd/1")
    # private char devices (null, full): probing the machine's own /dev/null with the old writer
    # would replace it under every other process
    os.mknod(d / "null.dev", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    os.mknod(d / "full.dev", 0o666 | stat.S_IFCHR, os.makedev(1, 7))


def probes(d: Path) -> list[dict]:
    """Each probe: name, argv; optional stdout file, a 'check' kind evaluated after the run."""
    W, P = d / "w.npz", d / "p.json"
    long_name = str(d / ("x" * 300 + ".json"))
    out = []

    def add(name, argv, **kw):
        out.append(dict(name=name, argv=[str(a) for a in argv], **kw))

    wi = d / "w_topk_inf.npz"
    add("top_k=inf stats", rp("stats", wi))
    add("top_k=inf certify", rp("certify", wi, *T[:6]))
    add("top_k=inf plan", rp("plan", wi, *T))
    add("top_k=inf evaluate", rp("evaluate", wi, P, "--cost", "olmoe-1b-7b"))
    add("top_k=inf compare", rp("compare", wi, *T, "--exact", "no"))
    add("top_k=inf exact", rp("exact", wi, *T))
    for kind in ("str", "num", "list"):
        pj = d / f"p_info_{kind}.json"
        add(f"info={kind} evaluate", rp("evaluate", W, pj, "--cost", "olmoe-1b-7b"))
        add(f"info={kind} plan --placement", rp("plan", W, *T, "--placement", pj))
        add(f"info={kind} plan --placement-from", rp("plan", W, *T, "--placement", "joint", "--placement-from", pj))
        add(f"info={kind} exact --placement", rp("exact", W, *T, "--placement", pj))
        add(f"info={kind} compare --placement-from", rp("compare", W, *T, "--exact", "no", "--placement-from", pj))
        add(f"info={kind} measure", rp("measure", W, pj, "--quick"))
    add("-o 300-char name plan", rp("plan", W, *T, "--max-sweeps", 1, "-o", long_name))
    add("-o 300-char name gen-trace", rp("gen-trace", "--samples", 4, "-o", long_name))
    add("-o 300-char name exact", rp("exact", W, *T, "-o", long_name))
    add("-o existing dir plan", rp("plan", W, *T, "-o", d / "adir"))
    add("-o '' plan", rp("plan", W, *T, "-o", ""))
    add("-o newdir/ plan", rp("plan", W, *T, "-o", str(d / "newdir") + "/"), check="no_newdir")
    add("-o '' gen-trace", rp("gen-trace", "--samples", 4, "-o", ""))
    add("-o newdir/ gen-trace", rp("gen-trace", "--samples", 4, "-o", str(d / "newdir") + "/"), check="no_newdir")
    add("stats --json > /dev/full", rp("stats", W, "--json"), stdout="/dev/full")
    add("verify-runtime --timeout 0.5", rp("verify-runtime", "--timeout", 0.5))
    add("--placement with sample id 1e8", rp("plan", W, *T, "--max-sweeps", 1, "--placement", d / "p_id_1e8.json"))
    add("--placement with sample id 2^63", rp("plan", W, *T, "--max-sweeps", 1, "--placement", d / "p_id_2p63.json"))
    add("gen-trace --experts 1000000", rp("gen-trace", "--samples", 4, "--layers", 1, "--experts", 1_000_000,
                                          "--top-k", 2, "-o", d / "g.npz"))
    add("gen-trace --domains 20000000", rp("gen-trace", "--samples", 4, "--domains", 20_000_000, "-o", d / "g.npz"))
    add("config temperatures=1e9 --time-limit 2", rp("plan", W, *T, "--time-limit", 2, "--config", d / "temps.toml"))
    add("config calibration_moves=1e8 --time-limit 2", rp("plan", W, *T, "--time-limit", 2, "--config",
                                                         d / "calib.toml"))
    add("config population=1e9 --time-limit 2", rp("plan", W, *T, "--time-limit", 2, "--config", d / "pop.toml"))
    add("stats --json, all samples < --tokens", rp("stats", d / "w_short.npz", "--json"))
    add("bool-dtype window", rp("stats", d / "w_bool.npz"))
    add("float shard_of_slot", rp("evaluate", W, d / "p_shard_float.json", "--cost", "olmoe-1b-7b"))
    add("gen-trace --skew 1e308", rp("gen-trace", "--samples", 4, "--skew", "1e308", "-o", d / "g.npz"))
    add("window step=-1 plan", rp("plan", d / "w_step_neg.npz", *T, "--max-sweeps", 1))
    add("window step=-1 stats", rp("stats", d / "w_step_neg.npz"))
    add("NaN literal in plan", rp("evaluate", W, d / "p_nan.json", "--cost", "olmoe-1b-7b"))
    add("demo --ep 3", rp("demo", "--ep", 3, "--samples", 64, "--out", d / "demo"), check="no_demo_window")
    add("cost expert_bytes=1e308", rp("plan", W, *T[:6], "--cost", d / "bytes.toml", "--placement", "joint",
                                      "--placement-from", P, "--max-sweeps", 1))
    # issue 25 item 5: writes go where the user means
    add("-o symlink", rp("plan", W, *T, "--max-sweeps", 1, "-o", d / "link.json"), check="symlink")
    add("-o fifo", rp("plan", W, *T, "--max-sweeps", 1, "-o", d / "fifo.json"), check="fifo", fifo=True)
    add("-o char device null (root)", rp("plan", W, *T, "--max-sweeps", 1, "-o", d / "null.dev"), check="devnull")
    add("-o char device full (root)", rp("plan", W, *T, "--max-sweeps", 1, "-o", d / "full.dev"), check="devfull")
    add("-o - (stdout)", rp("plan", W, *T, "--max-sweeps", 1, "-o", "-"), check="stdout_json")
    # a private link to /proc/self/fd/1, as /dev/stdout is: the old writer replaced the machine's
    # own /dev/stdout with a regular file when probed with it directly
    add("-o link to /proc/self/fd/1 (as /dev/stdout)", rp("plan", W, *T, "--max-sweeps", 1, "-o", d / "stdout.link"),
        check="stdout_json")
    return out


def _check(kind: str | None, d: Path, stdout: str) -> str:
    if kind is None:
        return ""
    if kind == "no_newdir":
        p = d / "newdir"
        return "no file 'newdir'" if not p.exists() else f"'newdir' exists ({'dir' if p.is_dir() else 'file'})"
    if kind == "no_demo_window":
        return "no window.npz" if not (d / "demo" / "window.npz").exists() else "window.npz written"
    if kind == "symlink":
        link = d / "link.json"
        txt = (d / "real.json").read_text()[:20].replace("\n", " ")
        return f"link {'kept' if link.is_symlink() else 'REPLACED'}, real.json starts {txt!r}"
    if kind == "fifo":
        return "fifo kept" if stat.S_ISFIFO(os.lstat(d / "fifo.json").st_mode) else "fifo REPLACED"
    if kind in ("devnull", "devfull"):
        dev = d / ("null.dev" if kind == "devnull" else "full.dev")
        ok = stat.S_ISCHR(os.lstat(dev).st_mode)
        return f"{dev.name} {'still a char device' if ok else 'REPLACED by a regular file'}"
    if kind == "stdout_json":
        try:
            json.loads(stdout[stdout.index("{"):]) if "{" in stdout else None
            return "plan JSON on stdout" if '"format"' in stdout else "no plan on stdout"
        except ValueError:
            return "stdout not JSON"
    return ""


# Runs the probe as its child and reports the child's peak RSS (its waited-for descendants too).
_WRAP = """
import os, subprocess, sys
p = subprocess.Popen(sys.argv[1:])
_, status, ru = os.wait4(p.pid, 0)
sys.stderr.write(f"\\n__peak_kb={ru.ru_maxrss}\\n")
sys.exit(os.waitstatus_to_exitcode(status) % 256 if os.waitstatus_to_exitcode(status) >= 0 else 128 - os.waitstatus_to_exitcode(status))
"""


def run_probe(p: dict, d: Path, cap: int, timeout: float) -> dict:
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        os.setsid()

    stdout = open(p["stdout"], "w") if p.get("stdout") else subprocess.PIPE
    reader = None
    if p.get("fifo"):  # a reader on the fifo, as a pipeline would have
        reader = subprocess.Popen(["cat", str(d / "fifo.json")], stdout=subprocess.DEVNULL)
    t0 = time.perf_counter()
    proc = subprocess.Popen([PY, "-c", _WRAP, *p["argv"]], stdout=stdout, stderr=subprocess.PIPE, preexec_fn=limit, cwd=d)
    try:
        out, err = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        timed_out = True
    wall = time.perf_counter() - t0
    if reader is not None:
        if reader.poll() is None:
            with open(d / "fifo.json", "wb"):  # release a reader still waiting for a writer
                pass
        try:
            reader.wait(timeout=5)
        except subprocess.TimeoutExpired:  # the fifo was replaced under it: nobody will ever write
            reader.kill()
            reader.wait()
    lines = [ln for ln in (err or b"").decode(errors="replace").splitlines() if ln.strip()]
    peak_kb = next((int(ln.split("=")[1]) for ln in lines if ln.startswith("__peak_kb=")), None)
    lines = [ln for ln in lines if not ln.startswith("__peak_kb=")]
    first = next((ln for ln in lines if ln.startswith("error:")), lines[-1] if lines else "")
    return dict(name=p["name"], rc=None if timed_out else proc.returncode, timed_out=timed_out,
                wall_s=round(wall, 2), first=first[:160], stderr_lines=len(lines),
                peak_mb=None if peak_kb is None else round(peak_kb / 1024),
                check=_check(p.get("check"), d, (out or b"").decode(errors="replace")))


def main() -> None:
    args = sys.argv[1:]
    if args and args[0] == "--table":
        before, after = (json.loads(Path(a).read_text()) for a in args[1:3])
        b = {r["name"]: r for r in before}
        print("| case | before | after |\n|---|---|---|")
        for r in after:
            o = b.get(r["name"])
            print(f"| {r['name']} | {_cell(o) if o else '—'} | {_cell(r)} |")
        return
    dest = Path(args[0])
    only = args[args.index("--only") + 1] if "--only" in args else None
    cap = int(float(args[args.index("--cap-gb") + 1] if "--cap-gb" in args else 6) * 2**30)
    timeout = float(args[args.index("--timeout") + 1]) if "--timeout" in args else 60.0
    d = Path(tempfile.mkdtemp(prefix="hostile-"))
    fixtures(d)
    results = []
    for p in probes(d):
        if only and not any(o in p["name"] for o in only.split(",")):
            continue
        r = run_probe(p, d, cap, timeout)
        results.append(r)
        print(json.dumps(r), flush=True)
        for junk in ("g.npz", "newdir", "demo"):
            q = d / junk
            if q.is_dir():
                shutil.rmtree(q)
            elif q.exists():
                q.unlink()
    dest.write_text(json.dumps(results, indent=1))
    shutil.rmtree(d, ignore_errors=True)


def _cell(r: dict) -> str:
    rc = "timeout" if r["timed_out"] else f"exit {r['rc']}"
    extra = f"; {r['check']}" if r.get("check") else ""
    mem = f", {r['peak_mb']} MB" if r.get("peak_mb") else ""
    return f"{rc}, {r['wall_s']} s{mem}: {r['first'][:90]}{extra}".replace("|", "/")


if __name__ == "__main__":
    main()

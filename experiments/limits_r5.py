"""Time limits at every size (issue 50, item 2): `certify` and `plan` at `--time-limit 1 / 5`.

Windows (one layer, one expert: only the lengths matter to R*): 200,000 samples at C = 2^23
(lengths uniform in 1..C), 10^6 samples at C = 2^31 − 1 (uniform in 1..C), and the Hard28
instance BPP13 ($ROUTEPACK_BPP_DIR) with its sizes scaled from C = 1,000 to C = 2^28 and
2^31 − 1 (⌊s·C/1000⌋). Each command runs in its own process (the first call in a process, numba's
cache warm, groups plan, exact and storage); the table gives the wall time of the command, its peak resident memory (the child's
``ru_maxrss``), its exit status and the certificate's status. A run is killed after 120 s.

    python experiments/limits_r5.py                 # ≈ 4 min on a quiet 2-core machine
    python experiments/limits_r5.py --quick         # the two small cases at --time-limit 1

The machine it ran on may be loaded: the times are upper bounds of what a quiet machine gives.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _lib import settings

DATA = Path(os.environ.get("ROUTEPACK_BPP_DIR") or Path(__file__).resolve().parents[2] / "shared" / "data" / "bpp")
KILL_S = 120.0


def _window(path: Path, lengths: np.ndarray) -> None:
    """A window of the lengths with one layer and one expert (counts = lengths, top_k = 1)."""
    np.savez(path, lengths=lengths.astype(np.int64), counts=lengths.astype(np.int32).reshape(-1, 1, 1),
             top_k=np.int64(1))


def _hard28(capacity: int) -> np.ndarray | None:
    src = DATA / "hard28.jsonl"
    if not src.is_file():
        return None
    for line in src.read_text().splitlines():
        rec = json.loads(line)
        if rec["name"].endswith("BPP13"):
            return np.asarray(rec["sizes"], dtype=np.int64) * capacity // int(rec["capacity"])
    return None


def cases(quick: bool) -> list[tuple[str, int, np.ndarray]]:
    rng = np.random.default_rng(0)
    out = [("200,000 samples, C = 2^23", 1 << 23, rng.integers(1, (1 << 23) + 1, size=200_000))]
    for name, C in (("Hard28 BPP13, C = 2^28", 1 << 28), ("Hard28 BPP13, C = 2^31 − 1", 2**31 - 1)):
        sizes = _hard28(C)
        if sizes is not None:
            out.append((name, C, sizes))
    if not quick:
        out.append(("10^6 samples, C = 2^31 − 1", 2**31 - 1, rng.integers(1, 2**31, size=1_000_000)))
    return out


def run(cmd: list[str], env: dict) -> dict:
    """Run ``cmd``: wall seconds, the child's peak RSS (MiB), exit code, parsed --json stdout."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        killed = False
        while True:
            pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - t0 > KILL_S:
                proc.kill()
                killed = True
            time.sleep(0.02)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    rc = os.waitstatus_to_exitcode(status)
    try:
        res = json.loads(stdout)
    except ValueError:
        res = None
    return {"wall": wall, "rss_mib": ru.ru_maxrss / 1024, "rc": rc, "killed": killed, "json": res,
            "stderr": stderr.strip().splitlines()[-1:] if stderr.strip() else []}


def main() -> None:
    ap = settings.parser(__doc__)
    settings.add_quick(ap)
    settings.add_out(ap, "limits_r5")
    args = ap.parse_args()
    outdir = settings.results_dir("limits_r5", args.out)
    limits = (1.0,) if args.quick else (1.0, 5.0)
    env = {**os.environ, "PYTHONPATH": str(settings.ROOT)}
    base = [sys.executable, "-m", "routepack_opt"]
    for group in ("plan", "exact", "storage"):  # numba's cache filled first: no run pays for compiling
        subprocess.run(base + ["warmup", "--group", group], env=env, check=True, capture_output=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, C, lengths in cases(args.quick):
            w = Path(tmp) / "w.npz"
            _window(w, lengths)
            topo = ["--dp", "1", "--ep", "1", "--capacity", str(C)]
            for limit in limits:
                for command in ("certify", "plan"):
                    extra = ["--cost", "olmoe-1b-7b"] if command == "plan" else []
                    cmd = base + [command, str(w), *topo, *extra, "--time-limit", str(limit), "--json"]
                    t0 = time.perf_counter()
                    res = run(cmd, env)
                    cert = (res["json"] or {}).get("certificate", res["json"]) if res["json"] else None
                    js = res["json"] or {}
                    rows.append({"case": name, "command": command, "limit": limit, "wall": res["wall"],
                                 "seconds": js.get("seconds"), "warmup": js.get("warmup_seconds"),
                                 "skipped": (cert or {}).get("skipped", []) + (
                                     (js.get("baseline_check") or {}).get("skipped", []) if command == "plan" else []),
                                 "rss_mib": res["rss_mib"], "rc": res["rc"], "killed": res["killed"],
                                 "status": (cert or {}).get("status"), "rows": (cert or {}).get("rows"),
                                 "chosen": (res["json"] or {}).get("rows") if command == "plan" else None,
                                 "error": res["stderr"]})
                    print(f"{name:32s} {command:8s} --time-limit {limit:g}: {rows[-1]['seconds']} in limit, "
                          f"{res['wall']:6.2f} s "
                          f"{res['rss_mib']:7.0f} MiB rc={res['rc']} {rows[-1]['status']} "
                          f"({time.perf_counter() - t0:.1f} s)", flush=True)
    (outdir / "limits_r5.json").write_text(json.dumps(rows, indent=1))
    (outdir / "limits_r5.md").write_text(render(rows))


def render(rows: list[dict]) -> str:
    lines = ["# Time limits at every size (issue 50, item 2)", "",
             "Each command in its own process, numba's cache warm (`routepack warmup --group plan/exact/storage` "
             "first); "
             "wall time of the whole command (start-up and reading the window included), peak resident "
             f"memory of the child, exit code, the certificate's status. Killed after {KILL_S:g} s. "
             "`experiments/limits_r5.py`; the machine was shared (2 cores, other jobs running).", "",
             "`in limit (s)`: the seconds the command reports against its limit (certify: the certificate's "
             "`seconds`; plan: `seconds`, the pipeline after its warm-up); `wall`: the whole process.", "",
             "| case | command | --time-limit | in limit (s) | wall (s) | peak RSS (MiB) | exit | status | R |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        status = "killed" if r["killed"] else (r["status"] or ("; ".join(r["error"]) or "-"))
        R = r["rows"] if r["command"] == "certify" else f"{r['chosen']} (R* {r['rows']})"
        inlim = "-" if r.get("seconds") is None else f"{r['seconds']:.2f}"
        lines.append(f"| {r['case']} | {r['command']} | {r['limit']:g} | {inlim} | {r['wall']:.2f} | "
                     f"{r['rss_mib']:.0f} | {r['rc']} | {status} | {R} |")
    notes = sorted({why.split(":")[0] for r in rows for why in r.get("skipped", [])})
    if notes:
        lines += ["", "Stages sized out somewhere in the table (the certificate's / baseline check's `skipped`): "
                  + "; ".join(notes) + "."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

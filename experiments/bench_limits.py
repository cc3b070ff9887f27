"""Are time limits honoured at every size? ``routepack plan`` and ``routepack exact`` as a user runs
them (one process each, wall time measured from outside), against their ``--time-limit``.

    python experiments/bench_limits.py [--quick] [--out experiments/results/bench_limits/bench_limits.md]

Windows: the qwen3-30b-a3b trace shape with L=48, E=256, top-8, capacity 8192. N=1,024 and 16,384
are generated; N=65,536 is 16 copies of a generated 4,096-sample window (the generator's memory,
not the planner's, limited the size when this was written), written uncompressed. For each run:
the process wall time, the time spent loading the window (a separate load of the same file, same
interpreter), the pipeline's own total from the plan, the makespan / lower bound gap, and what the
search did (temperatures done, greedy seed used). ``exact`` runs the CP-SAT and HiGHS models on
N=300 and N=600 olmoe windows whose models take tens of seconds to build. "Honoured" means
wall − load − start-up ≤ 1.1 × limit, with start-up measured as the wall time of
``routepack plan`` on a 16-sample window with a sweep budget of 1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _lib import report, settings  # noqa: E402

from routepack_opt.core.window import save_window  # noqa: E402
from routepack_opt.trace import generate_window  # noqa: E402

SHAPE = dict(num_experts=256, num_layers=48, capacity=8192)


def _write_window(path: Path, n: int) -> None:
    base = min(n, 4096)
    w = generate_window("qwen3-30b-a3b", base, 0, **SHAPE)
    reps = n // base
    counts = np.empty((n,) + w.counts.shape[1:], dtype=np.int16)
    for k in range(reps):
        counts[k * base:(k + 1) * base] = w.counts
    np.savez(path, lengths=np.tile(w.lengths, reps), counts=counts, top_k=np.int64(w.top_k))


def _cli(*args) -> tuple[float, dict, str]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "routepack_opt", *map(str, args), "--json"],
                          capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return wall, {}, proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
    return wall, json.loads(proc.stdout), ""


def _load_seconds(path: Path) -> float:
    code = (f"import time; t=time.perf_counter(); from routepack_opt.core.window import load_window; "
            f"load_window({str(path)!r}); print(time.perf_counter()-t)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    return float(out.stdout.strip())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="N=1,024 and 16,384 only, one limit")
    ap.add_argument("--out", default=str(settings.RESULTS / "bench_limits" / "bench_limits.md"))
    ap.add_argument("--render", action="store_true", help="only rewrite the markdown from the .json next to it")
    args = ap.parse_args()
    if args.render:
        out = Path(args.out)
        report.write_text(out, render(json.loads(out.with_suffix(".json").read_text())))
        return
    sizes = [(1024, 32), (16384, 128)] + ([] if args.quick else [(65536, 256)])
    limits = [5.0] if args.quick else [5.0, 30.0]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tiny = tmp / "tiny.npz"
        save_window(generate_window("olmoe-1b-7b", 16, 0, num_layers=2), tiny)
        startup, _, _ = _cli("plan", tiny, "--dp", "4", "--ep", "2", "--capacity", "4096",
                             "--cost", "olmoe-1b-7b", "--max-sweeps", "1")
        for n, dp in sizes:
            path = tmp / f"w{n}.npz"
            _write_window(path, n)
            load_s = _load_seconds(path)
            for limit in limits:
                wall, res, err = _cli("plan", path, "--dp", dp, "--ep", 8, "--capacity", 8192,
                                      "--cost", "qwen3-30b-a3b", "--time-limit", limit,
                                      "-o", tmp / "plan.json")
                info = json.loads((tmp / "plan.json").read_text())["info"] if not err else {}
                search = info.get("search", {})
                rows.append({"cmd": "plan", "N": n, "D": dp, "limit": limit, "wall": wall, "load": load_s,
                             "startup": startup, "pipeline": res.get("seconds"), "gap": res.get("gap"),
                             "temps": search.get("temperatures_done"), "greedy": search.get("greedy_seed"),
                             "note": err or (res.get("fallback") or "")})
                print(rows[-1], flush=True)
        for n, dp, ep in ((300, 4, 2), (600, 16, 2)):
            path = tmp / f"e{n}.npz"
            save_window(generate_window("olmoe-1b-7b", n, 0), path)
            load_s = _load_seconds(path)
            for solver in ("cpsat", "highs"):
                wall, res, err = _cli("exact", path, "--dp", dp, "--ep", ep, "--capacity", 8192,
                                      "--cost", "olmoe-1b-7b", "--solver", solver, "--time-limit", 5)
                rows.append({"cmd": f"exact {solver}", "N": n, "D": dp, "limit": 5.0, "wall": wall,
                             "load": load_s, "startup": startup, "pipeline": res.get("seconds"),
                             "gap": res.get("gap"), "temps": None, "greedy": None,
                             "note": err or f"{res.get('status')}"})
                print(rows[-1], flush=True)
    _write(Path(args.out), rows)


def render(record: dict) -> str:
    """The markdown of ``record`` (``bench_limits.json``: the machine's cores and one dict per run)."""
    lines = ["# Time limits at every size", "",
             f"`python experiments/bench_limits.py` on {record['cores']} cores (shared with other jobs "
             "while measured). Wall = the whole process as a user runs it; load = reading and "
             "validating the window; start-up = interpreter, imports and numba cache loading "
             "(`plan` of a 16-sample window). Honoured: wall − load − start-up ≤ 1.1 × limit.", ""]
    rows = []
    for r in record["rows"]:
        spent = r["wall"] - r["load"] - r["startup"]
        rows.append((r["cmd"], r["N"], r["D"], r["limit"], r["wall"], r["load"], r["startup"], r["pipeline"],
                     spent - r["limit"], "yes" if spent <= 1.1 * r["limit"] else "NO", r["gap"], r["temps"],
                     r["greedy"], r["note"]))
    lines += report.table(["command", "N", "D", "limit s", "wall s", "load s", "start-up s", "pipeline s",
                           "over limit s", "honoured", "gap", "temps", "greedy", "note"], rows,
                          formats={"limit s": "g", "wall s": ".1f", "load s": ".1f", "start-up s": ".1f",
                                   "pipeline s": ".1f", "over limit s": "+.1f", "gap": ".4f", "temps": "d"})
    return "\n".join(lines) + "\n"


def _write(out: Path, rows: list[dict]) -> None:
    """``out`` (markdown) and the record it is made from, ``out`` with ``.json``, atomically."""
    record = {"cores": os.cpu_count(), "rows": rows}
    report.write_json(out.with_suffix(".json"), record)
    report.write_text(out, render(record))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

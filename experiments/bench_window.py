"""Row windows in the annealer (``AnnealConfig.window_bytes``): plan quality and the ladder's cost
with and without them, on the scaling table's large windows, same seeds and budget.

    python experiments/bench_window.py [--parts study,ab] [--points 16384x128,...] [--seeds 0,1]
    python experiments/bench_window.py --render

- study: one process per (window, seed, setting), the default budget; makespan, gap to the lower
  bound, ladder time and cost per proposal, the share of proposals evaluated (a windowed move that
  finds no sample, partner or target inside its window is dropped, unevaluated).
- ab: the ladder's CPU cost per proposal with and without windows, interleaved in one process on
  one window (``--ab-sweeps`` sweeps, ``--ab-reps`` each): this 2-core machine's speed drifts
  by ±30 % between runs minutes apart, so only an interleaved comparison measures a speed-up.

Windows are bench_latency's (qwen3-30b-a3b, L=48, E=256, P=8, capacity 8192, max-sum). Writes
``experiments/results/bench_window/bench_window.md`` from its record ``bench_window.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from _lib import report as rep
from _lib import settings

ROOT = Path(__file__).resolve().parents[1]
RESULTS = settings.RESULTS / "bench_window"
ON = 4 << 20  # the default window_bytes


def _setting(window_bytes: int, sweeps: int | None = None):
    from routepack_opt.params import PlannerParams

    base = PlannerParams()
    anneal = base.anneal.replace(window_bytes=window_bytes, **({} if sweeps is None else {"sweeps": sweeps}))
    return base.replace(anneal=anneal)


def _problem(n: int, dp: int):
    from bench_latency import CAP, COST, EP, make_window

    from routepack_opt.core.cost import resolve_cost
    from routepack_opt.core.topology import Topology
    from routepack_opt.warmup import warm

    warm()
    return make_window(n), Topology(dp=dp, ep=EP, capacity=CAP), resolve_cost(COST)


def _child(n: int, dp: int, seed: int, window_bytes: int) -> None:
    from routepack_opt.pipeline import solve

    w, topo, cost = _problem(n, dp)
    p = solve(w, topo, cost, params=_setting(window_bytes), seed=seed)
    s = p.report.search
    print(json.dumps({"N": n, "D": dp, "seed": seed, "window_bytes": window_bytes, "rows": p.rows,
                      "makespan": p.score["makespan"], "gap": p.score["makespan"] / p.lower_bound,
                      "ladder_s": s.search_seconds,
                      "ns_per_proposal": s.search_cpu_seconds / max(s.moves_proposed, 1) * 1e9,
                      "evaluated": s.moves_evaluated, "proposed": s.moves_proposed}))


def part_study(points, seeds) -> list[dict]:
    runs = []
    for n, dp in points:
        for seed in seeds:
            for wb in (0, ON):
                out = subprocess.run([sys.executable, __file__, "--child", str(n), str(dp), str(seed), str(wb)],
                                     capture_output=True, text=True, cwd=ROOT)
                if out.returncode != 0:
                    raise SystemExit(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode)
                runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
                print(runs[-1], flush=True)
    return runs


def part_ab(points, sweeps: int, reps: int) -> list[dict]:
    from routepack_opt.pipeline import solve

    rows = []
    for n, dp in points:
        w, topo, cost = _problem(n, dp)
        ns: dict[int, list[float]] = {0: [], ON: []}
        for k in range(reps):
            for wb in (0, ON) if k % 2 == 0 else (ON, 0):  # alternate which goes first
                s = solve(w, topo, cost, params=_setting(wb), max_sweeps=sweeps).report.search
                ns[wb].append(s.search_cpu_seconds / max(s.moves_proposed, 1) * 1e9)
        rows.append({"N": n, "D": dp, "sweeps": sweeps, "off_ns": ns[0], "on_ns": ns[ON],
                     "ratio": statistics.median(ns[ON]) / statistics.median(ns[0])})
        print(rows[-1], flush=True)
    return rows


def render(record: dict) -> list[str]:
    lines = ["# Row windows in the annealer", "",
             "`python experiments/bench_window.py` on 2 cores; bench_latency's windows (qwen3-30b-a3b, "
             "L=48, E=256, top-8, capacity 8192, P=8, max-sum). Off = `window_bytes = 0`; on = the "
             f"default `window_bytes = {ON}` (unguided moves confined to cache-sized windows of rows, "
             "`routepack_opt.heuristics.anneal.moves.row_window`).", ""]
    if record.get("study"):
        lines += ["## Quality at the default budget (one process per run)", ""]
        by = {}
        for r in record["study"]:
            by.setdefault((r["N"], r["D"], r["seed"]), {})[r["window_bytes"]] = r
        rows = []
        for (n, dp, seed), pair in sorted(by.items()):
            off, on = pair.get(0), pair.get(ON)
            if off is None or on is None:
                continue
            rows.append((n, dp, seed, off["rows"], off["makespan"], on["makespan"],
                         (on["makespan"] / off["makespan"] - 1) * 100, off["gap"], on["gap"],
                         off["ladder_s"], on["ladder_s"], off["ns_per_proposal"], on["ns_per_proposal"],
                         off["evaluated"] / off["proposed"] * 100, on["evaluated"] / on["proposed"] * 100))
        lines += rep.table(("N", "D", "seed", "rows", "makespan off", "makespan on", "Δ %", "gap off", "gap on",
                            "ladder s off", "ladder s on", "ns/proposal off", "ns/proposal on",
                            "evaluated % off", "evaluated % on"), rows,
                           formats={4: ",.0f", 5: ",.0f", 6: "+.3f", 7: ".4f", 8: ".4f", 9: ".1f", 10: ".1f",
                                    11: ".0f", 12: ".0f", 13: ".0f", 14: ".0f"})
        worst = max(r[6] for r in rows) if rows else float("nan")
        better = sum(r[6] < 0 for r in rows)
        lines += ["", f"Windowed plans: {better} of {len(rows)} better, the worst {worst:+.3f} %. The ladder "
                  "times come from separate processes minutes apart; for speed see the interleaved "
                  "comparison below.", ""]
    if record.get("ab"):
        lines += ["## Cost per proposal, interleaved in one process", ""]
        lines += rep.table(("N", "D", "sweeps", "ns/proposal off", "ns/proposal on", "on / off (medians)"),
                           [(r["N"], r["D"], r["sweeps"], ", ".join(f"{x:.0f}" for x in r["off_ns"]),
                             ", ".join(f"{x:.0f}" for x in r["on_ns"]), r["ratio"]) for r in record["ab"]],
                           formats={5: ".3f"})
        lines.append("")
    return lines


def _pairs(text: str) -> list[tuple[int, int]]:
    return [tuple(map(int, p.split("x"))) for p in text.split(",")]  # type: ignore[misc]


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        _child(*map(int, sys.argv[2:6]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="study,ab")
    ap.add_argument("--points", default="16384x32,16384x128,16384x512,32768x128,32768x512")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--ab-points", default="32768x128,16384x512")
    ap.add_argument("--ab-sweeps", type=int, default=30)
    ap.add_argument("--ab-reps", type=int, default=4)
    ap.add_argument("--render", action="store_true", help="rewrite the markdown from the record only")
    args = ap.parse_args()
    path = RESULTS / "bench_window.json"
    record = json.loads(path.read_text()) if path.exists() else {}
    if not args.render:
        parts = args.parts.split(",")
        if "study" in parts:
            record["study"] = part_study(_pairs(args.points), [int(s) for s in args.seeds.split(",")])
        if "ab" in parts:
            record["ab"] = part_ab(_pairs(args.ab_points), args.ab_sweeps, args.ab_reps)
        rep.write_text(path, json.dumps(record, indent=1) + "\n")
    rep.write_md(RESULTS / "bench_window.md", render(record))
    print(f"wrote {RESULTS / 'bench_window.md'}")


if __name__ == "__main__":
    main()

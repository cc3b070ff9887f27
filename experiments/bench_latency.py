"""Planner latency and scale: cold vs warm start, the production window in process, a scaling
table over N and D, and anytime curves.

    python experiments/bench_latency.py [--parts cold,prod,prod-coactivated,scale,anytime,ep] [--quick]

Writes ``experiments/results/bench_latency/bench_latency.md`` (+ ``bench_latency.json``,
``bench_latency_anytime.png``).

Windows: the qwen3-30b-a3b trace shape with L=48, E=256, top-8, capacity 8192 (the production
window of the issues: N=1,024, D=32, P=8). Windows larger than 4,096 samples are copies of
generated 4,096-sample windows (different seeds), so every size is generated in seconds.

- cold: ``routepack plan`` as a fresh container runs it, with an empty numba cache
  (``ROUTEPACK_CACHE_DIR``), then again warm; with the default budget and with ``--time-limit 5``.
- prod: in process, warm, median of 5 plans with the default budget; the length-only packers
  (verl-style KK, NeMo-style FFD) timed on the same window for the ratio.
- prod-coactivated: the same on a strongly co-activated window (trace ``dispersion=20``), median
  of 7 (and prod then takes 7 runs too).
- scale: N ∈ {1k, 4k, 16k, 32k} × D ∈ {32, 128, 512}, P=8, default budget, each in its own process
  (peak resident memory from the kernel): plan time, time per sample, gap to the lower bound, gain
  over the length-only baseline (identity placement + verl-style KK packing, same rows).
- anytime: best makespan against time over the annealing ladder (default budget, 5× budget).
- ep: the DeepSeek-V3 shape (58 MoE layers, E=256, top-8, capacity 8192) on D=512 slots with
  P=8 and P=64 EP ranks, N ∈ {4k, 32k}, default budget (and N=32k, P=64 under a 60 s limit):
  time, memory, gap and gain as in the scaling table, and the ladder's cost per proposal.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _lib import report as rep
from _lib import settings

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = settings.RESULTS / "bench_latency"
SHAPE = dict(num_experts=256, num_layers=48, capacity=8192)
CAP, EP, COST = 8192, 8, "qwen3-30b-a3b"


def make_window(n: int, seed: int = 0, preset: str = COST, **overrides):
    """A window of ``preset``'s trace shape (qwen3: SHAPE; other presets their own);
    ``overrides``: trace settings (e.g. ``dispersion=20.0``)."""
    from routepack_opt.core.window import Window
    from routepack_opt.trace import generate_window

    shape = {**(SHAPE if preset == COST else {}), **overrides}
    if n <= 4096:
        return generate_window(preset, n, seed, **shape)
    first = generate_window(preset, 4096, seed, **shape)
    lengths = np.empty(n, dtype=np.int64)
    counts = np.empty((n, first.num_layers, first.num_experts), dtype=np.int32)
    for k in range(n // 4096):  # filled part by part: the peak is the counts plus one part
        w = first if k == 0 else generate_window(preset, 4096, seed + k, **shape)
        lengths[k * 4096:(k + 1) * 4096] = w.lengths
        counts[k * 4096:(k + 1) * 4096] = w.counts
    return Window(lengths, counts, top_k=w.top_k, copy=False)


# ------------------------------------------------------------------ one scaling point (child)

def _child(n: int, dp: int, ep: int = EP, preset: str = COST, limit: float | None = None) -> None:
    import resource

    from routepack_opt.certify import pack_into_bins
    from routepack_opt.core.cost import resolve_cost
    from routepack_opt.core.evaluate import Evaluator
    from routepack_opt.core.topology import Topology
    from routepack_opt.heuristics.baselines import verl_kk_layout
    from routepack_opt.heuristics.placement.lpt import identity_placement
    from routepack_opt.pipeline import solve
    from routepack_opt.warmup import warm

    warm()
    w = make_window(n, preset=preset)
    topo, cost = Topology(dp=dp, ep=ep, capacity=CAP), resolve_cost(preset)
    t = time.perf_counter()
    p = solve(w, topo, cost, time_limit=limit)
    seconds = time.perf_counter() - t
    ev = Evaluator(w, topo, cost)
    row, slot = verl_kk_layout(w.lengths, topo, p.rows, exact_pack=pack_into_bins)  # tight windows need it
    base = ev.score(identity_placement(w.num_layers, w.num_experts), row, slot, p.rows, "max-sum").makespan
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"N": n, "D": dp, "P": ep, "L": w.num_layers, "limit": limit, "rows": p.rows, "seconds": seconds, "makespan": p.score["makespan"],
                      "gap": p.score["makespan"] / p.lower_bound, "gain": 1 - p.score["makespan"] / base,
                      "peak_bytes": peak, "counts_bytes": int(w.counts.nbytes),
                      "timings": dict(p.report.timings), "sweeps": p.report.search.sweeps if p.report.search else None,
                      "search": _search_figures(p.report.search)}))


def _search_figures(s) -> dict | None:
    """The annealer's own split of its stage: seeds (greedy included), setup (ladder, start
    population), the ladder itself, and its CPU cost per proposal."""
    if s is None:
        return None
    return {"seeds_s": s.timings.get("seeds", 0.0), "setup_s": s.timings.get("setup", 0.0),
            "ladder_s": s.search_seconds, "ns_per_move": s.search_cpu_seconds / max(s.moves_proposed, 1) * 1e9,
            "t_hot_quantile": s.t_hot_quantile, "seed_gap": s.seed_gap, "improved": s.improved}


# ------------------------------------------------------------------ parts

def part_cold(tmp: Path, quick: bool) -> list[dict]:
    from routepack_opt.core.window import save_window

    path = tmp / "prod.npz"
    save_window(make_window(1024), path)
    rows = []
    for limit in ([None] if quick else [None, 5.0]):
        cache = tempfile.mkdtemp(dir=tmp)
        for state in ("cold", "warm"):
            args = [sys.executable, "-m", "routepack_opt", "plan", str(path), "--dp", "32", "--ep", str(EP),
                    "--capacity", str(CAP), "--cost", COST, "--json", "-o", str(tmp / "p.json")]
            if limit:
                args += ["--time-limit", str(limit)]
            t = time.perf_counter()
            out = subprocess.run(args, capture_output=True, text=True, cwd=ROOT,
                                 env={**os.environ, "ROUTEPACK_CACHE_DIR": cache})
            wall = time.perf_counter() - t
            res = json.loads(out.stdout)
            rows.append({"state": state, "limit": limit, "wall": wall, "plan_seconds": res["seconds"],
                         "warmup": res.get("warmup_seconds"), "makespan": res["makespan"]})
            print(rows[-1], flush=True)
    return rows


def part_prod(runs: int = 5, **overrides) -> dict:
    from routepack_opt.core.cost import resolve_cost
    from routepack_opt.core.topology import Topology
    from routepack_opt.heuristics.baselines import nemo_ffd_layout, verl_kk_layout
    from routepack_opt.pipeline import solve
    from routepack_opt.warmup import warm

    warm()
    w = make_window(1024, **overrides)
    topo, cost = Topology(dp=32, ep=EP, capacity=CAP), resolve_cost(COST)
    totals, makespans, stages = [], [], []
    for _ in range(runs):
        t = time.perf_counter()
        p = solve(w, topo, cost)
        totals.append(time.perf_counter() - t)
        makespans.append(p.score["makespan"])
        stages.append(p.report.timings)
    peers = {}
    for name, fn in (("verl-kk", verl_kk_layout), ("nemo-ffd", nemo_ffd_layout)):
        ts = []
        for _ in range(5):
            t = time.perf_counter()
            fn(w.lengths, topo, p.rows)
            ts.append(time.perf_counter() - t)
        peers[name] = statistics.median(ts)
    med = {k: statistics.median(s[k] for s in stages) for k in stages[0]}
    out = {"median_total": statistics.median(totals), "totals": totals, "makespans": makespans,
           "stages": med, "peers": peers, "rows": p.rows, "runs": runs, "overrides": overrides}
    print(out, flush=True)
    return out


def _run_child(n: int, dp: int, *extra) -> dict:
    """One scaling point in its own process (its peak memory is its own)."""
    out = subprocess.run([sys.executable, __file__, "--child", str(n), str(dp), *map(str, extra)],
                         capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        tail = out.stderr.strip().splitlines()
        row = {"N": n, "D": dp, "error": tail[-1] if tail else f"exit code {out.returncode}"}
    else:
        row = json.loads(out.stdout.strip().splitlines()[-1])
    print(row, flush=True)
    return row


def part_scale(quick: bool) -> list[dict]:
    sizes = [1024, 4096] if quick else [1024, 4096, 16384, 32768]
    return [_run_child(n, dp) for n in sizes for dp in (32, 128, 512)]


def part_ep(quick: bool) -> list[dict]:
    points = ([(1024, 64, 8, None), (1024, 64, 64, None)] if quick else
              [(4096, 512, 8, None), (4096, 512, 64, None), (32768, 512, 8, None), (32768, 512, 64, None),
               (32768, 512, 64, 60.0)])
    return [_run_child(n, dp, ep, "deepseek-v3", "" if limit is None else limit) for n, dp, ep, limit in points]


def part_anytime(quick: bool) -> dict:
    from routepack_opt.core.cost import resolve_cost
    from routepack_opt.core.evaluate import Evaluator
    from routepack_opt.core.topology import Topology
    from routepack_opt.heuristics.anneal import AnnealConfig, anneal
    from routepack_opt.pipeline import baseline_layouts, certified_rows, resolve_placement
    from routepack_opt.warmup import warm

    warm()
    curves = {}
    for n, dp in ([(1024, 32)] if quick else [(1024, 32), (16384, 128)]):
        w = make_window(n)
        topo, cost = Topology(dp=dp, ep=EP, capacity=CAP), resolve_cost(COST)
        pl, _ = resolve_placement(w, topo, "lpt")
        R, cert = certified_rows(w, topo, None, 10.0, "auto")
        b = Evaluator(w, topo, cost).rank_loads(pl)
        seeds = [lay.arrays() for lay in baseline_layouts(w, topo, R, packing=cert.packing_N).values()]
        for mult in (1, 5):
            cfg = AnnealConfig(sweeps=200 * mult)
            res = anneal(w.lengths, b, topo, cost, R, "max-sum", seeds, config=cfg, seed=0)
            curves[f"N={n} D={dp} {200 * mult} sweeps"] = [(e["seconds"], e["best_energy"]) for e in res.stats["trace"]]
            print(n, mult, res.stats["seconds"], res.score[0], flush=True)
    return curves


# ------------------------------------------------------------------ report

def write(report: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    lines = ["# Planner latency and scale", "",
             f"`python experiments/bench_latency.py` on {os.cpu_count()} cores; qwen3-30b-a3b trace shape "
             "with L=48, E=256, top-8, capacity 8192, P=8, objective max-sum, default search budget "
             "(16 replicas × 200 sweeps × 24 temperatures) unless a time limit is given.", ""]
    if "cold" in report:
        lines += ["## Cold vs warm start (`routepack plan`, production window N=1,024, D=32)", "",
                  "Cold = an empty numba cache (`ROUTEPACK_CACHE_DIR`): the kernels compile before the "
                  "clock starts, so the plan is the warm one.", "",
                  ]
        lines += rep.table(("start", "time limit", "process wall s", "warm-up s", "plan s", "makespan µs"),
                           [(r["state"], r["limit"] or "none (budget)", r["wall"], r["warmup"] or 0,
                             r["plan_seconds"], r["makespan"]) for r in report["cold"]],
                           formats={2: ".1f", 3: ".1f", 4: ".2f", 5: ",.1f"})
        lines.append("")
    for key, title in (("prod", "calibrated routing"), ("prod-coactivated", "strongly co-activated routing, "
                                                          "`--dispersion 20`")):
        if key not in report:
            continue
        p = report[key]
        n = p.get("runs", 5)
        st = ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in p["stages"].items() if k != "warmup")
        lines += [f"## Production window in process (N=1,024, D=32, {title}; warm, median of {n})", "",
                  f"- total **{p['median_total'] * 1e3:.0f} ms** (runs: "
                  f"{', '.join(f'{t * 1e3:.0f}' for t in p['totals'])} ms); stages (median): {st}",
                  f"- makespan {p['makespans'][0]:,.1f} µs (identical in all {n} runs: "
                  f"{len(set(p['makespans'])) == 1}), R = {p['rows']}",
                  f"- length-only packers on the same window: verl-style KK {p['peers']['verl-kk'] * 1e3:.1f} ms, "
                  f"NeMo-style FFD {p['peers']['nemo-ffd'] * 1e3:.1f} ms; routepack / KK = "
                  f"{p['median_total'] / p['peers']['verl-kk']:.0f}×", ""]
    if "scale" in report:
        lines += ["## Scaling (default budget, one process per point)", "",
                  ]
        rows = [(r["N"], r["D"], None, None, None, None, None, None, None, r["error"]) if "error" in r else
                (r["N"], r["D"], r["rows"], r["seconds"], r["seconds"] / r["N"] * 1e6, r["peak_bytes"] / 2**30,
                 r["counts_bytes"] / 2**30, r["gap"], r["gain"], r["sweeps"]) for r in report["scale"]]
        lines += rep.table(("N", "D", "rows", "plan s", "µs per sample", "peak RSS GiB", "counts GiB", "gap to LB",
                            "gain over baseline", "sweeps"), rows,
                           formats={3: ".2f", 4: ".0f", 5: ".2f", 6: ".2f", 7: ".4f", 8: lambda g: f"{g * 100:+.1f} %"})
        lines += ["", "Where the time goes, per sample (µs; the annealer's stage split into its seeds — the "
                  "joint-cost greedy —, its setup and the ladder), and the ladder's CPU cost per proposal:", ""]
        split = []
        for r in report["scale"]:
            if "error" in r or not r.get("search"):
                continue
            t, s, n = r["timings"], r["search"], r["N"] / 1e6
            split.append((r["N"], r["D"], t.get("placement", 0) / n, t.get("certify", 0) / n, t.get("seeds", 0) / n,
                          s["seeds_s"] / n, s["setup_s"] / n, s["ladder_s"] / n, s["ns_per_move"],
                          s["t_hot_quantile"], s["seed_gap"], s["improved"]))
        lines += rep.table(("N", "D", "placement", "certify", "length-only seeds", "greedy", "setup", "ladder",
                            "ns per proposal", "T_hot quantile", "best seed gap", "search improved"), split,
                           formats={2: ".0f", 3: ".0f", 4: ".0f", 5: ".0f", 6: ".0f", 7: ".0f", 8: ".0f",
                                    10: lambda g: f"{g * 100:.1f} %"})
        lines.append("")
    if "anytime" in report:
        lines += ["## Anytime curves", "", "![anytime](bench_latency_anytime.png)", "",
                  ]
        rows = []
        for name, pts in report["anytime"].items():
            t_end = pts[-1][0]
            def at(frac):
                vals = [e for s, e in pts if s <= frac * t_end]
                return vals[-1] if vals else None
            rows.append((name, at(0.1), at(0.5), at(1.0), t_end))
        lines += rep.table(("run", "after 10 % of the time", "50 %", "100 %", "best at s"), rows,
                           formats={1: ",.0f", 2: ",.0f", 3: ",.0f", 4: ".2f"})
        lines.append("")
        _plot(report["anytime"])
    if "ep" in report:
        lines += ["## Many EP ranks: the DeepSeek-V3 shape (one process per point)", "",
                  "58 MoE layers, E=256, top-8, capacity 8192, D=512 slots; default budget unless a limit is given.",
                  ""]
        rows = [(r["N"], r["D"], r.get("P"), None, None, None, None, None, None, None, None, r["error"]) if "error" in r
                else (r["N"], r["D"], r["P"], r["limit"] or "none (budget)", r["rows"], r["seconds"],
                      r["seconds"] / r["N"] * 1e6, r["peak_bytes"] / 2**30, r["gap"], r["gain"],
                      r["search"]["ns_per_move"] if r.get("search") else None, r["sweeps"]) for r in report["ep"]]
        lines += rep.table(("N", "D", "P", "time limit s", "rows", "plan s", "µs per sample", "peak RSS GiB",
                            "gap to LB", "gain over baseline", "ns per proposal", "sweeps"), rows,
                           formats={5: ".1f", 6: ".0f", 7: ".2f", 8: ".4f", 9: lambda g: f"{g * 100:+.1f} %",
                                    10: ".0f", 11: ".1f"})
        lines.append("")
    rep.write_md(RESULTS / "bench_latency.md", lines)
    rep.write_text(RESULTS / "bench_latency.json", json.dumps(report, indent=1) + "\n")


def _plot(curves: dict) -> None:
    plt = rep.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, pts in curves.items():
        s, e = zip(*pts)
        ax.plot(s, np.asarray(e) / e[-1], marker=".", label=name)
    ax.set_xlabel("seconds since the search started")
    ax.set_ylabel("best makespan / final")
    ax.set_xscale("log")
    ax.legend(fontsize=8)
    fig.tight_layout()
    rep.save_fig(fig, RESULTS / "bench_latency_anytime.png", dpi=110)


def main() -> None:
    if len(sys.argv) >= 4 and sys.argv[1] == "--child":
        extra = sys.argv[4:]
        _child(int(sys.argv[2]), int(sys.argv[3]), *([int(extra[0]), extra[1]] if extra else []),
               *([float(extra[2])] if len(extra) > 2 and extra[2] else []))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="cold,prod,scale,anytime")
    ap.add_argument("--quick", action="store_true", help="small sizes only (smoke run)")
    args = ap.parse_args()
    parts = args.parts.split(",")
    path = RESULTS / "bench_latency.json"
    report = json.loads(path.read_text()) if path.exists() else {}
    with tempfile.TemporaryDirectory() as tmp:
        if "cold" in parts:
            report["cold"] = part_cold(Path(tmp), args.quick)
        if "prod" in parts:
            report["prod"] = part_prod(7 if "prod-coactivated" in parts else 5)
        if "prod-coactivated" in parts:  # the routing the trials found slowest (issue 25)
            report["prod-coactivated"] = part_prod(7, dispersion=20.0)
        if "scale" in parts:
            report["scale"] = part_scale(args.quick)
        if "anytime" in parts:
            report["anytime"] = part_anytime(args.quick)
        if "ep" in parts:
            report["ep"] = part_ep(args.quick)
    write(report)
    print(f"wrote {RESULTS / 'bench_latency.md'}")


if __name__ == "__main__":
    main()

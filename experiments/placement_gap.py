"""LPT vs exact expert placement on generated traces, and the length-only baselines' speed.

    python experiments/placement_gap.py [--samples 1024] [--seeds 3] [--time-limit 0.5]

Part 1, per preset (its L, E, k and EP size P), over several seeds of
``routepack_opt.trace.generate_window``: per layer LPT's busiest rank against the proved lower
bound of the exact CP-SAT model (``lpt gap`` = LPT makespan / proved bound, ≥ 1; it over-states
the true gap wherever CP-SAT did not close the layer), the same for LPT followed by swap
refinement (the exact model's hint), the exact model's own gap, the share of
layers proved optimal, and the global EP-rank load CV and busiest-rank ratio
(Σ_l max_p / Σ_l mean_p) under identity, LPT and the exact placement.

Part 2: the baselines (verl-kk, nemo-ffd) at N=4096, D=64 on trace lengths (deepseek-v3 preset,
capacity 8192), rows R = ⌈bins/D⌉ of the best FFD/BFD packing (R* when the certifier says so).

Writes ``experiments/results/placement_gap/placement_gap.md``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from _lib import report, settings

from routepack_opt.core.cost import get_preset
from routepack_opt.core.topology import Topology
from routepack_opt.heuristics.baselines import BASELINES, nemo_ffd_layout
from routepack_opt.heuristics.binpack import best_packing
from routepack_opt.heuristics.cells import check_layout
from routepack_opt.heuristics.placement.lpt import (
    identity_placement,
    lpt_placement,
    rank_load_cv,
    rank_peak_ratio,
    swap_refine,
)
from routepack_opt.models.placement import exact_placement
from routepack_opt.trace import generate_window

PRESETS = ("olmoe-1b-7b", "qwen3-30b-a3b", "ling-hybrid", "deepseek-v3")
OUT = settings.RESULTS / "placement_gap" / "placement_gap.md"


def placement_study(samples: int, seeds: int, time_limit: float) -> list[str]:
    rows = []
    for name in PRESETS:
        cfg = get_preset(name).config
        P = cfg.ep
        acc = {k: [] for k in ("lpt_ms", "swap_ms", "lgap", "sgap", "egap", "proved", "sec", "cv_i",
                               "cv_l", "cv_e", "pk_i", "pk_l", "pk_e")}
        for seed in range(seeds):
            w = generate_window(name, samples, seed)
            load = w.expert_loads()
            L, E = load.shape
            ident = identity_placement(L, E)
            lpt_placement(load, P)  # warm (numba cache)
            t0 = time.perf_counter()
            lpt = lpt_placement(load, P)
            acc["lpt_ms"].append((time.perf_counter() - t0) * 1e3)
            swap_refine(load, lpt, P)  # warm
            t0 = time.perf_counter()
            swap_refine(load, lpt, P)
            acc["swap_ms"].append((time.perf_counter() - t0) * 1e3)
            rep = exact_placement(load, P, swap_refine(load, lpt, P), lpt, time_limit=time_limit)
            acc["lgap"] += rep.lpt_gap_L.tolist()
            acc["sgap"] += rep.hint_gap_L.tolist()
            acc["egap"] += rep.gap_L.tolist()
            acc["proved"] += [s == "optimal" for s in rep.status_L]
            acc["sec"].append(rep.seconds / L)
            for tag, pl in (("i", ident), ("l", lpt), ("e", rep.placement)):
                acc["cv_" + tag].append(rank_load_cv(load, pl, P))
                acc["pk_" + tag].append(rank_peak_ratio(load, pl, P))
            print(f"{name} seed {seed}: {rep.summary()}", flush=True)
        m = statistics.mean
        rows.append((name, f"{cfg.moe_layers} × {cfg.experts}, {P}", seeds, m(acc["lpt_ms"]), m(acc["lgap"]),
                     max(acc["lgap"]), m(acc["swap_ms"]), m(acc["sgap"]), max(acc["sgap"]), max(acc["egap"]),
                     f"{sum(acc['proved'])}/{len(acc['proved'])}", m(acc["sec"]), m(acc["cv_i"]), m(acc["cv_l"]),
                     m(acc["cv_e"]), m(acc["pk_i"]), m(acc["pk_l"]), m(acc["pk_e"])))
    return report.table(
        ["preset", "L × E, P", "seeds", "LPT ms", "LPT gap mean", "LPT gap max", "+swap ms", "+swap gap mean",
         "+swap gap max", "exact gap max", "layers proved", "exact s/layer", "CV identity", "CV LPT", "CV exact",
         "peak identity", "peak LPT", "peak exact"], rows,
        formats={"LPT ms": ".2f", "LPT gap mean": ".5f", "LPT gap max": ".5f", "+swap ms": ".1f",
                 "+swap gap mean": ".6f", "+swap gap max": ".6f", "exact gap max": ".6f", "exact s/layer": ".2f",
                 "CV identity": ".4f", "CV LPT": ".5f", "CV exact": ".5f", "peak identity": ".4f",
                 "peak LPT": ".5f", "peak exact": ".5f"})


def _rows_for(lengths, topo: Topology) -> tuple[int, str]:
    try:
        from routepack_opt.certify import certify_rows
        from routepack_opt.core.window import Window
        counts = np.zeros((lengths.size, 1, topo.ep), dtype=np.int32)
        counts[:, 0, 0] = lengths
        cert = certify_rows(Window(lengths, counts, top_k=1), topo, time_limit=10.0)
        return int(cert.rows), f"R* = {cert.rows} ({cert.status}, {cert.method})"
    except ImportError:
        _, bins, how = best_packing(lengths, topo.capacity)
        R = -(-bins // topo.dp)
        return R, f"R = ⌈{bins} {how} bins / D⌉ = {R}"


def baseline_timing(reps: int = 20) -> list[str]:
    cfg = get_preset("deepseek-v3").config
    # lengths are drawn before routing, so one layer gives the same lengths as the full model
    w = generate_window("deepseek-v3", 4096, 0, num_layers=1)
    lengths = w.lengths
    topo = Topology(dp=64, ep=cfg.ep, capacity=cfg.capacity)
    R, how = _rows_for(lengths, topo)
    fns = dict(BASELINES)
    fns["nemo-ffd (round-robin)"] = lambda l, t, r, info=None: nemo_ffd_layout(l, t, r, deal="round-robin", info=info)
    lines = [f"N = {lengths.size}, D = 64, C = {topo.capacity}, Σlen = {int(lengths.sum())}, {how}; "
             f"fill = Σlen / (R·D·C) = {lengths.sum() / (R * 64 * topo.capacity):.3f}.", ""]
    rows = []
    for name, fn in fns.items():
        fn(lengths, topo, R)  # warm up (numba cache)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            row, slot = fn(lengths, topo, R)
            times.append((time.perf_counter() - t0) * 1e3)
        assert check_layout(lengths, row, slot, R, 64, topo.capacity)
        info = {}
        fn(lengths, topo, R, info=info)
        cell = np.bincount(row * 64 + slot, weights=lengths, minlength=R * 64)
        per_slot = np.bincount(slot, weights=lengths, minlength=64)
        rows.append((name, min(times), statistics.median(times), cell.max() / cell.mean(),
                     per_slot.max() / per_slot.mean(), info.get("fallback")))
    return lines + report.table(["baseline", "best ms", "median ms", "cell tokens max/mean", "slot tokens max/mean",
                                 "fallback"], rows,
                                formats={"best ms": ".2f", "median ms": ".2f", "cell tokens max/mean": ".4f",
                                         "slot tokens max/mean": ".4f"})


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--time-limit", type=float, default=0.5, help="CP-SAT seconds per layer")
    args = ap.parse_args()
    part1 = placement_study(args.samples, args.seeds, args.time_limit)
    part2 = baseline_timing()
    text = "\n".join([
        "# Expert placement: LPT vs exact, and baseline packing speed", "",
        f"`python experiments/placement_gap.py --samples {args.samples} --seeds {args.seeds} "
        f"--time-limit {args.time_limit}` on the shared 2-core dev machine (CP-SAT, 1 worker).", "",
        "## LPT vs exact per-layer placement", "",
        f"Windows of {args.samples} samples from `generate_window(preset, N, seed)`. "
        "`lpt gap` = LPT's busiest rank / the proved lower bound (per layer; an upper bound on "
        "LPT's true gap where CP-SAT did not close the layer); `exact gap` = the exact model's "
        "busiest rank / the same bound; `+swap` = LPT then pairwise swaps off the busiest rank. CV = global EP-rank load coefficient of variation "
        "(RMS of per-layer CVs); peak = Σ_l max_p / Σ_l mean_p.", "",
        *part1, "",
        "Reading: LPT here keeps E/P experts per rank. Its worst layers have one heavy expert: "
        "the rank holding it stays the busiest and only takes its remaining experts once the "
        "others are full, so it ends up with mid-sized leftovers. Swapping experts off the "
        "busiest rank (2-exchange) removes nearly all of that in milliseconds. CP-SAT, started "
        "from the swapped placement, rarely improves it within the limit and closes no layer; "
        "the remaining gap is bounded by the `+swap` column. `peak identity` is the expert-tail "
        "inflation (Σ_l max_p / Σ_l mean_p) that placement removes.", "",
        "## Length-only baselines at N = 4096, D = 64", "",
        *part2, "",
        "`fallback`: verl-kk's KK cells broke the cap at this R and moves/swaps could not repair "
        "them, so its cells came from the named bin packing, dealt to slots by equal-size KK. "
        "Timings are wall-clock on a shared machine with other jobs running (medians are noisy; "
        "best is the closer figure for an idle core).", ""])
    report.write_text(OUT, text)
    print(text)


if __name__ == "__main__":
    main()

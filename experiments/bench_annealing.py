"""Benchmark the population annealer (docs/pipeline.md, step 3) at production size.

    python experiments/bench_annealing.py            # writes experiments/results/bench_annealing/bench_annealing.md

Window: qwen3-30b-a3b-shaped trace (L=48) with E=256 experts, k=8, N=1024 samples; topology
D=32, P=8 (G=4), C=8192; LPT placement; rows = the fewest rows the NeMo-FFD baseline fills.
Measured: (1) move evaluations per CPU second (per core) of the default search — the whole
default ladder (24 temperatures, 16 replicas, 200 sweeps), one thread and all threads, three
trace seeds; (2) the same rate at one fixed temperature for three move mixes (a hotter, more
accepting setting: every acceptance updates the state, so this is the slower figure); (3) wall
time and result of the default budget (all cores), against the baselines and the lower bound,
for both objectives.

A move evaluation is a feasible proposal (capacity and nonempty cells kept) whose exact ΔE was
computed and decided by the Metropolis rule; infeasible proposals are rejected before any cost
work and not counted (their time is).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numba
import numpy as np
from _lib import report, settings

from routepack_opt.core.cost import get_preset
from routepack_opt.core.evaluate import Evaluator, rank_loads
from routepack_opt.core.topology import Topology
from routepack_opt.heuristics.anneal import AnnealConfig, anneal
from routepack_opt.heuristics.anneal.moves import run
from routepack_opt.heuristics.anneal.problem import Instance
from routepack_opt.heuristics.anneal.rng import rng_states
from routepack_opt.heuristics.anneal.state import Population
from routepack_opt.heuristics.baselines import nemo_ffd_layout, verl_kk_layout
from routepack_opt.heuristics.placement.lpt import lpt_placement
from routepack_opt.trace import generate_window

MEGA = report.num(".2f", per=1e6, suffix=" M")  # a count or rate in millions: 2.84 M


def production_instance(seed: int = 0, num_samples: int = 1024, num_layers: int = 48):
    window = generate_window("qwen3-30b-a3b", num_samples, seed=seed, num_experts=256,
                             num_layers=num_layers, top_k=8, capacity=8192)
    topo = Topology(dp=32, ep=8, capacity=8192)
    cost = get_preset("qwen3-30b-a3b").cost
    pl = lpt_placement(window.expert_loads(), topo.ep)
    b = rank_loads(window.counts, pl, topo.ep)
    R = max(1, int(np.ceil(window.lengths.sum() / (topo.capacity * topo.dp))))
    while True:
        try:
            seeds = {"nemo-ffd": nemo_ffd_layout(window.lengths, topo, R, time_limit=5.0),
                     "verl-kk": verl_kk_layout(window.lengths, topo, R, time_limit=5.0)}
            break
        except Exception:
            R += 1
    return window, topo, cost, pl, b, R, seeds


def move_rate(pb, seeds, objective, threads: int, K: int, n_moves: int, cfg):
    """Move evaluations per wall second and per CPU second (whole population, ``threads``
    threads), acceptance rate and the share of proposals that were feasible (evaluated)."""
    numba.set_num_threads(threads)
    pop = Population(pb, K)
    lay = list(seeds.values())
    lay = [pb.check_layout(r, sl, 'seed') for r, sl in lay]
    pop.init(np.stack([lay[k % len(lay)][0] for k in range(K)]),
             np.stack([lay[k % len(lay)][1] for k in range(K)]))
    pop.walk.rng[:] = rng_states(0, 0, K)
    # a mid-ladder temperature: 1% of the makespan scale of a single move
    temp = 1e-3 * float(pop.energy.mean()) / pb.R
    run(pop, 2000, temp, cfg)  # warm-up (compiled functions loaded)
    pop.walk.counters[:] = 0
    t0 = time.perf_counter()
    c0 = time.process_time()
    run(pop, n_moves, temp, cfg)
    dt = time.perf_counter() - t0
    cpu = time.process_time() - c0
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    c = pop.walk.counters.sum(axis=0)
    return float(c[0]) / dt, float(c[0]) / cpu, float(c[1] / c[0]), float(c[0] / c[3])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--moves", type=int, default=200_000, help="proposals per replica for the rate")
    ap.add_argument("--seeds", type=int, default=1, help="trace seeds for the default-budget run")
    ap.add_argument("--ladder-seeds", type=int, default=3, help="trace seeds for the ladder rate")
    ap.add_argument("-o", default=str(settings.RESULTS / "bench_annealing" / "bench_annealing.md"))
    args = ap.parse_args()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = ["# Population annealing benchmark", "",
             "`python experiments/bench_annealing.py` (" + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "o") + ")", "",
             f"cores: {os.cpu_count()}, numba threads: {numba.config.NUMBA_NUM_THREADS}, "
             f"load average at start: {load:.1f}", ""]
    window, topo, cost, pl, b, R, seeds = production_instance(0)
    N, L, E = window.counts.shape
    lines += [f"window: N={N} L={L} E={E} k={window.top_k}; D={topo.dp} P={topo.ep} "
              f"G={topo.num_shards} C={topo.capacity}; R={R}", ""]
    cfg = AnnealConfig()
    lines += ["## Move evaluations per CPU second over the default ladder", "",
              "`anneal()` with the default config (seeded by NeMo-FFD and verl-KK), evaluations /",
              "CPU seconds of the process during the ladder (all threads together, so per core).", ""]
    ladder = report.Table(["objective", "threads", "seed", "evals", "accept rate", "CPU s", "evals / CPU s (per core)"],
                          formats={"evals": MEGA, "accept rate": ".3f", "CPU s": ".3f",
                                   "evals / CPU s (per core)": MEGA})
    summary = {}
    for objective in ("max-sum", "sum-max"):
        for threads in sorted({1, numba.config.NUMBA_NUM_THREADS}):
            numba.set_num_threads(threads)
            rates = []
            for s in range(args.ladder_seeds):
                w_s, topo_s, cost_s, pl_s, b_s, R_s, seeds_s = (
                    (window, topo, cost, pl, b, R, seeds) if s == 0 else production_instance(s))
                if s == 0 and threads == 1 and objective == "max-sum":  # compile / load cache
                    anneal(w_s.lengths, b_s, topo_s, cost_s, R_s, objective,
                             list(seeds_s.values()), seed=s, max_sweeps=2)
                res = anneal(w_s.lengths, b_s, topo_s, cost_s, R_s, objective,
                               list(seeds_s.values()), seed=s)
                st = res.stats
                rates.append(st["moves_per_cpu_second"])
                print(ladder.add(objective, threads, s, st["moves_evaluated"],
                                 st["moves_accepted"] / st["moves_evaluated"], st["search_cpu_seconds"], rates[-1]),
                      flush=True)
            summary[objective, threads] = statistics.median(rates)
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    lines += ladder.lines()
    lines += ["", "Median per-core rate: " + ", ".join(
        f"{o} {t} thread{'s' if t > 1 else ''}: **{v / 1e6:.2f} M/s**" for (o, t), v in summary.items()), ""]
    lines += ["## Move evaluations per second at one fixed temperature", "",
              "A population of 4 replicas at T = 10⁻³ · E / R (hot: ~55 % of evaluated moves accepted,",
              "against ~20 % averaged over the default ladder). Rates per wall second and per CPU",
              "second (the machine may be shared: per CPU second is the per-core figure).", ""]
    fixed = report.Table(["objective", "move mix", "threads", "evals / wall s", "evals / CPU s (per core)",
                          "feasible share", "accept rate"],
                         formats={"evals / wall s": MEGA, "evals / CPU s (per core)": MEGA, "feasible share": ".3f",
                                  "accept rate": ".3f"})
    for objective in ("max-sum", "sum-max"):
        pb = Instance(window.lengths, b, topo, cost, R, objective, cfg.tie_eps)
        for label, c in (("default", cfg), ("relocate only", cfg.replace(p_swap=0.0, p_guide=0.0)),
                         ("swap only", cfg.replace(p_swap=1.0, p_guide=0.0))):
            for threads in sorted({1, numba.config.NUMBA_NUM_THREADS}):
                rate, cpu_rate, acc, feas = move_rate(pb, seeds, objective, threads, 4 * threads,
                                                      args.moves, c)
                print(fixed.add(objective, label, threads, rate, cpu_rate, feas, acc), flush=True)
    lines += fixed.lines()
    lines += ["", "## Default budget (AnnealConfig())", "",
              "`10× budget`: the same search with 10× the sweeps (`max_sweeps=2000`); `default vs 10×`:",
              "how much worse the default makespan is (target ≤ 1 %).", ""]
    budget = report.Table(["seed", "objective", "R", "wall s", "CPU s", "sweeps × replicas", "evals", "best baseline",
                           "anneal", "10× budget", "default vs 10×", "LB", "gap base → anneal"],
                          formats={"wall s": ".2f", "CPU s": ".2f", "evals": MEGA, "best baseline": ".4g",
                                   "anneal": ".4g", "10× budget": ".4g", "default vs 10×": report.num("+.2f", 100, " %"),
                                   "LB": ".4g"})
    for s in range(args.seeds):
        if s:
            window, topo, cost, pl, b, R, seeds = production_instance(s)
        ev = Evaluator(window, topo, cost)
        lb = ev.lower_bound(pl, R)
        for objective in ("max-sum", "sum-max"):
            base = min(ev.score(pl, r, sl, R, objective).makespan for r, sl in seeds.values())
            t0 = time.perf_counter()
            c0 = time.process_time()
            res = anneal(window.lengths, b, topo, cost, R, objective, list(seeds.values()), seed=s)
            wall = time.perf_counter() - t0
            cpu = time.process_time() - c0
            got = ev.score(pl, res.row, res.slot, R, objective).makespan
            st = res.stats
            long = anneal(window.lengths, b, topo, cost, R, objective, list(seeds.values()), seed=s,
                            max_sweeps=10 * AnnealConfig().sweeps)
            got10 = ev.score(pl, long.row, long.slot, R, objective).makespan
            print(budget.add(s, objective, R, wall, cpu, f"{st['sweeps']:.0f}×{st['replicas']}", st["moves_evaluated"],
                             base, got, got10, got / got10 - 1, lb, f"{base / lb:.4f} → {got / lb:.4f}"), flush=True)
    lines += budget.lines()
    lines += ["", "Notes: `evals` counts feasible proposals whose ΔE was computed (infeasible ones — capacity,",
              "nonempty, same cell — are rejected before any cost work). Per-core rates are per CPU",
              "second, so they hold on a shared machine; wall times of the default budget are inflated",
              "by the load average shown above. Gaps are makespan / lower bound (docs/model.md) with LPT",
              "placement; `best baseline` is the better of NeMo-FFD and verl-KK at the same rows."]
    Path(args.o).parent.mkdir(parents=True, exist_ok=True)
    report.write_md(args.o, lines)
    print(f"wrote {args.o}")


if __name__ == "__main__":
    main()

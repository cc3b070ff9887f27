"""Benchmark the foundation: trace generation and the one evaluator at production size.

    python experiments/bench_foundation.py   # writes experiments/results/bench_foundation/bench_foundation.md
"""

from __future__ import annotations

import time

import numpy as np
from _lib import report, settings

from routepack_opt.core.cost import PRESETS
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.core.testing import random_layout
from routepack_opt.core.topology import Topology
from routepack_opt.trace import generate_window


def best_of(fn, repeat=5):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), float(np.median(times))


def main():
    rows = []
    gen = best_of(lambda: generate_window("qwen3-30b-a3b", 1024, 0, num_layers=48, num_experts=256), repeat=3)
    rows.append(("gen-trace N=1024 L=48 E=256 k=8", *gen))
    w = generate_window("deepseek-v3", 4096, 0, num_layers=48, num_experts=256, capacity=16384)
    topo = Topology(dp=64, ep=8, capacity=16384)
    ev = Evaluator(w, topo, PRESETS["deepseek-v3"].cost)
    rng = np.random.default_rng(0)
    pl = np.stack([rng.permutation(256) for _ in range(48)])
    proj = best_of(lambda: Evaluator(w, topo, ev.cost).rank_loads(pl), repeat=3)
    rows.append(("project counts through placement (N=4096 L=48 E=256 P=8)", *proj))
    ev.rank_loads(pl)
    R = 8
    row, slot = random_layout(w.num_samples, R, 64, rng)
    sc = best_of(lambda: ev.score(pl, row, slot, R, "max-sum"), repeat=20)
    rows.append(("score a layout (N=4096 L=48 E=256 D=64 P=8 R=8)", *sc))
    full = best_of(lambda: ev.evaluate(pl, row, slot, R), repeat=10)
    rows.append(("full evaluation: both objectives + both bounds", *full))
    lines = ["# Foundation benchmarks", "", "`python experiments/bench_foundation.py` on the 2-core dev machine.", "",
             *report.table(("what", "best (ms)", "median (ms)"), [(name, b * 1e3, m * 1e3) for name, b, m in rows],
                           formats={1: ".1f", 2: ".1f"})]
    report.write_md(settings.RESULTS / "bench_foundation" / "bench_foundation.md", lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()

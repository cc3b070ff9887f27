"""Benchmark: R* certification of a production-size window (N=4096 samples, D=64 DP slots).

    python experiments/bench_certify.py [--preset deepseek-v3] [--samples 4096] [--seeds 5]

Lengths come from the synthetic RL trace of the preset (``trace.generate_window``; the preset
gives D=64, P=8 and the capacity). Reports the first call in a fresh process (includes loading
numba's cached kernels) and the median of repeated calls, per seed, with how R* was certified.
"""

from __future__ import annotations

import argparse
import statistics
import time

from routepack_opt.certify import certify_rows
from routepack_opt.core.cost import get_preset
from routepack_opt.core.topology import Topology
from routepack_opt.trace import generate_window


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="deepseek-v3")
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args(argv)
    cfg = get_preset(args.preset).config
    topo = Topology(dp=cfg.dp, ep=cfg.ep, capacity=cfg.capacity)
    print(f"preset {args.preset}: N={args.samples}, D={topo.dp}, P={topo.ep}, capacity {topo.capacity}")
    print("| seed | R* | status | method | bins LB | bins UB | first call ms | median ms |")
    print("|---|---|---|---|---|---|---|---|")
    first = True
    for seed in range(args.seeds):
        lengths = generate_window(args.preset, args.samples, seed).lengths
        t0 = time.perf_counter()
        cert = certify_rows(lengths, topo)
        cold = time.perf_counter() - t0
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            certify_rows(lengths, topo)
            times.append(time.perf_counter() - t0)
        note = " (process start)" if first else ""
        first = False
        print(f"| {seed} | {cert.rows} | {cert.status} | {cert.method} | {cert.bins_lower_bound} | "
              f"{cert.bins_upper_bound} | {cold * 1e3:.1f}{note} | {statistics.median(times) * 1e3:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Benchmark: R* certification of a production-size window (N=4096 samples, D=64 DP slots).

    python experiments/bench_certify.py [--preset deepseek-v3] [--samples 4096] [--seeds 5] [--out DIR]
    # writes experiments/results/bench_certify/bench_certify.md (and prints each row as it comes)

Lengths come from the synthetic RL trace of the preset (``trace.generate_window``; the preset
gives D=64, P=8 and the capacity). Reports the first call in a fresh process (includes loading
numba's cached kernels) and the median of repeated calls, per seed, with how R* was certified.
"""

from __future__ import annotations

import statistics
import time

from _lib import report, settings

from routepack_opt.certify import certify_rows
from routepack_opt.core.cost import get_preset
from routepack_opt.core.topology import Topology
from routepack_opt.trace import generate_window


def main(argv=None) -> int:
    ap = settings.parser(__doc__)
    ap.add_argument("--preset", default="deepseek-v3")
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=20)
    settings.add_out(ap, "bench_certify")
    args = ap.parse_args(argv)
    cfg = get_preset(args.preset).config
    topo = Topology(dp=cfg.dp, ep=cfg.ep, capacity=cfg.capacity)
    setting = f"preset {args.preset}: N={args.samples}, D={topo.dp}, P={topo.ep}, capacity {topo.capacity}"
    print(setting)
    rows = report.Table(["seed", "R*", "status", "method", "bins LB", "bins UB", "first call ms", "median ms"],
                        formats={"median ms": report.num(".2f", 1e3)})
    print("\n".join(rows.lines()))  # header and rule; rows follow as measured
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
        print(rows.add(seed, cert.rows, cert.status, cert.method, cert.bins_lower_bound, cert.bins_upper_bound,
                       f"{cold * 1e3:.1f}{note}", statistics.median(times)), flush=True)
    cmd = "python experiments/bench_certify.py" + "".join(
        f" --{k} {v}" for k, v in (("preset", args.preset), ("samples", args.samples), ("seeds", args.seeds),
                                  ("repeats", args.repeats)))
    path = report.write_md(settings.results_dir("bench_certify", args.out) / "bench_certify.md",
                           ["# R* certification benchmark (production window)", "",
                            f"`{cmd}` on the shared 2-core machine. \"first call\" of seed 0 includes loading "
                            "numba's cached kernels at process start.", "", setting, "",
                            *rows.lines()])
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Planning time of the searches that call the cost kernel, on one window.

    PYTHONPATH=. python experiments/time_cost_kernel.py [--repeat 5]

Times ``refine_placement`` (row-aware swaps, both objectives), ``refine_replicas`` (replica
swaps and reassigns) and ``solve`` (greedy seed + annealer, 30 sweeps, both objectives) on one
synthetic window (N = 1,024, L = 16, E = 64, top-8, D = 16, P = 8, R = 8 for the refinements),
after one warm-up call (numba compiled), and prints the fastest of ``--repeat`` runs with the
searches' results, so two checkouts can be compared (the results must be equal).
A measurement, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from routepack_opt.core.cost import CostModel, Stage
from routepack_opt.core.testing import random_layout, random_window
from routepack_opt.core.topology import Topology
from routepack_opt.heuristics.placement.refine import RefineConfig, refine_placement
from routepack_opt.heuristics.placement.replica_refine import block_expert_loads, refine_replicas
from routepack_opt.heuristics.placement.replicate import replicated_placement
from routepack_opt.params import PlannerParams, RowParams
from routepack_opt.pipeline import solve

COST = CostModel((Stage("attn", 0.02, 4e-5),), gamma=0.05, row_overhead=5.0, expert_bytes=1e6)
N, L, E, K, D, P, R = 1024, 16, 64, 8, 16, 8, 8


def _fastest(fn, repeat):
    fn()  # warm-up: compiled kernels loaded
    best, out = np.inf, None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    w = random_window(num_samples=N, num_layers=L, num_experts=E, top_k=K, max_len=400, seed=7, skew=1.5)
    row, slot = random_layout(N, R, D, np.random.default_rng(7))
    rec = {}
    topo = Topology(dp=D, ep=P, capacity=100_000)
    pl = np.stack([np.random.default_rng(l).permutation(E) for l in range(L)])
    for objective in ("max-sum", "sum-max"):
        s, res = _fastest(lambda o=objective: refine_placement(w, topo, COST, pl, row, slot, R, o,
                                                               config=RefineConfig(max_passes=2)), args.repeat)
        rec[f"refine_placement/{objective}"] = {"seconds": s, "swaps": res.swaps, "key": list(res.key)}
    topo_r = Topology(dp=D, ep=P, capacity=100_000, redundant_experts=16)
    rpl = replicated_placement(w.expert_loads(), P, E + 16)
    V = block_expert_loads(w.counts, row, slot, R, topo_r)
    s, (new, moves) = _fastest(lambda: refine_replicas(V, rpl, topo_r), args.repeat)
    rec["refine_replicas"] = {"seconds": s, "moves": moves,
                              "phy2log_sum": int((np.asarray(new.phy2log) * np.arange(E + 16)).sum())}
    topo_s = Topology(dp=D, ep=P, capacity=4096)
    for objective in ("max-sum", "sum-max"):
        s, plan = _fastest(lambda o=objective: solve(w, topo_s, COST, objective=o, placement="lpt", max_sweeps=30,
                                                     seed=0, params=PlannerParams(rows=RowParams(extra=0))),
                           args.repeat)
        rec[f"solve/{objective}"] = {"seconds": s, "rows": plan.rows,
                                     "cells": int(((np.asarray(plan.row) * D + np.asarray(plan.slot))
                                                   * np.arange(N)).sum())}
    print(json.dumps(rec, indent=1))


if __name__ == "__main__":
    main()

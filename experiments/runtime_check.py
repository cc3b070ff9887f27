"""Runtime check: re-placement is invisible, the calibrated cost model tracks real kernels.

    python experiments/runtime_check.py [--quick] [--device cpu|cuda]

1. verify-runtime: a tiny MoE model trained with and without a mid-run re-placement, in one
   process and in 4 gloo processes (D=4 with P=2 and P=4): max |difference| and bytes moved.
2. calibrate: attention and expert kernels (forward + backward) on the device, NNLS fit: R²,
   relative residuals, coefficients (the cost file is written next to the results).
3. measure: generated RL windows (routepack_opt.trace, two presets × two seeds, small enough to
   run unscaled on CPU), three plans each — baseline (identity placement + verl-KK length-only
   packing at R*), reorder (LPT + the same packing), routepack (LPT + population annealing on the
   calibrated cost) — every cell and expert workload timed with torch, both objectives composed,
   compared with the evaluator's prediction.

Writes experiments/results/runtime_check/runtime_check.md (+ .json, + the calibrated cost TOML).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
from _lib import settings
from _lib.report import num, table, write_text

from routepack_opt.core.cost import save_cost
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.core.topology import Topology
from routepack_opt.heuristics.placement.lpt import identity_placement, lpt_placement
from routepack_opt.pipeline import baseline_layouts, build_plan, resolve_rows, solve
from routepack_opt.runtime.bench import bench_config, calibrate, measure_plan
from routepack_opt.runtime.verify import VerifyConfig, verify_runtime
from routepack_opt.trace import generate_window

RESULTS = settings.RESULTS / "runtime_check"


def verify_part(quick: bool) -> list[dict]:
    runs = []
    for world, ep in ([(4, 2)] if quick else [(4, 2), (4, 4)]):
        cfg = dataclasses.replace(VerifyConfig(), steps=3, timeout_s=300)
        t0 = time.perf_counter()
        rep = verify_runtime(cfg, world_size=world, ep=ep, single=(ep == 2))
        rep["wall_s"] = round(time.perf_counter() - t0, 1)
        runs.append(rep)
        print(f"verify world={world} ep={ep}: max_abs_diff {rep['max_abs_diff']} ok {rep['ok']} "
              f"bytes {rep['bytes_moved']}", flush=True)
    return runs


def plans_for(window, topo, cost, time_limit: float):
    """baseline / reorder / routepack plans (max-sum objective)."""
    R, cert = resolve_rows(window, topo, None)
    ev = Evaluator(window, topo, cost)
    ident = identity_placement(window.num_layers, window.num_experts)
    lpt = lpt_placement(window.expert_loads(), topo.ep)
    layout = baseline_layouts(window, topo, R)["verl-kk"]
    out = {
        "baseline": build_plan(ev, ident, layout, "max-sum", certificate=cert),
        "reorder": build_plan(ev, lpt, layout, "max-sum", certificate=cert),
        "routepack": solve(window, topo, cost, objective="max-sum", placement="lpt", time_limit=time_limit),
    }
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=str(RESULTS / "runtime_check.md"))
    ap.add_argument("--render", action="store_true", help="only re-render the .md from the .json")
    args = ap.parse_args(argv)
    if args.render:
        res = json.loads(Path(args.out).with_suffix(".json").read_text())
        write_text(Path(args.out), report(res, args, RESULTS / f"runtime_check_cost_{args.device}.toml"))
        return 0
    RESULTS.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    res: dict = {"env": {"python": platform.python_version(), "torch": torch.__version__,
                         "machine": platform.machine(), "device": args.device,
                         "cpus": __import__("os").cpu_count()}}

    # 1. re-placement invisibility
    res["verify"] = verify_part(args.quick)

    # 2. calibration (2 layers, 4 experts per rank: the measured topology below)
    ep, dp, E, L = 4, 8, 16, 2
    cfg = bench_config(args.device, quick=args.quick, layers=L, experts_per_rank=E // ep)
    cost, cal = calibrate(args.device, cfg)
    cost_path = RESULTS / f"runtime_check_cost_{args.device}.toml"
    save_cost(cost, cost_path)
    res["calibration"] = cal
    print(f"calibration: attention R² {cal['attention']['r2']:.4f}, experts R² {cal['expert']['r2']:.4f}, "
          f"{cal['seconds']} s", flush=True)

    # 3. measured vs predicted on generated windows
    # (label, seed, trace knobs); the preset only sets L, E, k, C, all overridden here
    windows = [("default", 0, {}), ("default", 1, {}), ("default", 2, {}),
               ("skewed", 3, {"expert_skew": 1.2, "length_sigma": 1.0})]
    if args.quick:
        windows = windows[:1]
    capacity = 1024 if args.device == "cpu" else 16384
    n_samples = 64 if args.device == "cpu" else 512
    res["measure"] = []
    for preset, seed, knobs in windows:
        w = generate_window("qwen3-30b-a3b", n_samples, seed, num_layers=L, num_experts=E, top_k=4,
                            capacity=capacity, **knobs)
        topo = Topology(dp=dp, ep=ep, capacity=capacity)
        plans = plans_for(w, topo, cost, time_limit=2.0 if args.quick else 5.0)
        runs = list(plans.items())
        if seed == windows[0][1]:
            runs.append(("baseline (again)", plans["baseline"]))  # run-to-run noise of a measurement
        for name, p in runs:
            m = measure_plan(w, p, cost, args.device, cfg, scale=1.0, layers=L)
            row = {"preset": preset, "seed": seed, "N": w.num_samples, "tokens": w.total_tokens,
                   "rows": p.rows, "plan": name, **{k: m[k] for k in (
                       "J_r2", "J_rel_err_mean", "attention_cell_corr2", "expert_workload_corr2",
                       "seconds")}, "objectives": m["objectives"]}
            res["measure"].append(row)
            o = m["objectives"]
            print(f"{preset} s{seed} {name:9s} R={p.rows} max-sum meas {o['max-sum']['measured_us']:,.0f} "
                  f"pred {o['max-sum']['predicted_us']:,.0f} ratio {o['max-sum']['ratio']:.3f} | sum-max ratio "
                  f"{o['sum-max']['ratio']:.3f} | J R² {m['J_r2']:.3f}", flush=True)
    res["seconds"] = round(time.perf_counter() - t_all, 1)
    write_text(Path(args.out).with_suffix(".json"), json.dumps(res, indent=1, default=str) + "\n")
    write_text(Path(args.out), report(res, args, cost_path))
    print(f"wrote {args.out}")
    return 0


def report(res: dict, args, cost_path: Path) -> str:
    cmd = "python experiments/runtime_check.py" + (" --quick" if args.quick else "") + (
        f" --device {args.device}" if args.device != "cpu" else "")
    env = res["env"]
    L = [f"# Runtime check ({env['device']})", "",
         f"Command: `{cmd}` — torch {env['torch']}, Python {env['python']}, {env['machine']}, "
         f"{env['cpus']} CPUs (shared with other jobs). Total {res['seconds']} s.", "",
         "## 1. Re-placing experts changes nothing", "",
         "Tiny MoE model (2 layers, 8 experts, top-2, hidden 32), Adam, replayed routes, a random valid "
         "plan; a random new placement materialized after step 1 of 3 (weights, grads, exp_avg, "
         "exp_avg_sq move in place). Compared with a run that never re-places: every micro-batch loss, "
         "every dense parameter, every logical expert's weights, grads and Adam moments.", "",
         *table(["world size", "EP", "mode", "max abs diff", "bitwise equal", "experts moved", "bytes moved",
                 "cross-rank bytes", "EP vs 1-process loss diff", "s"],
                [(rep["world_size"] if mode == "distributed" else 1, rep["ep"] if mode == "distributed" else 1,
                  mode.replace("_", " "), m["max_abs_diff"], m["bitwise_equal"],
                  m.get("experts_moved", m.get("experts_moved_per_shard")), m["bytes_moved"],
                  m.get("bytes_sent_cross_rank", 0), m.get("vs_single_process_loss_diff"), m["seconds"])
                 for rep in res["verify"] for mode in ("single_process", "distributed") if mode in rep
                 for m in [rep[mode]]],
                formats={"max abs diff": ".3g", "bytes moved": ",", "cross-rank bytes": ",",
                         "EP vs 1-process loss diff": ".2g"})]
    cal = res["calibration"]
    a, e = cal["attention"], cal["expert"]
    c = cal["config"]
    L += ["", "## 2. Calibration", "",
          f"Device {cal['device']} ({cal['dtype']}, clock: {cal['clock']}, {cal['threads']} thread(s)); small model "
          f"hidden {c['hidden']}, {c['heads']} heads, expert FFN {c['ffn']}, {c['experts_per_rank']} experts per rank; "
          f"forward + backward. Fit: non-negative least squares on relative error. {cal['seconds']} s.", "",
          *table(["kernel", "model", "coefficients", "R²", "median abs rel. residual", "max abs rel. residual",
                  "points"],
                 [("attention (1 layer)", "α·T + β·Q + c",
                   f"α {a['coef']['alpha']:.4g} µs/token, β {a['coef']['beta']:.4g} µs/token², "
                   f"c {a['coef']['intercept']:.4g} µs", a["r2"], a["rel_residual_median"], a["rel_residual_max"],
                   a["points"]),
                  ("experts (1 rank, 1 layer)", "γ·W + c",
                   f"γ {e['coef']['gamma']:.4g} µs/token, c {e['coef']['intercept']:.4g} µs", e["r2"],
                   e["rel_residual_median"], e["rel_residual_max"], e["points"])],
                 formats={"R²": ".4f", 4: ".3f", 5: ".3f"}),
          "", f"Cost file for {c['layers']} layers: `{cost_path.relative_to(settings.ROOT)}` "
          f"(alpha {cal['cost']['alpha']:.4g}, beta {cal['cost']['beta']:.4g}, gamma {cal['cost']['gamma']:.4g}, "
          f"row_overhead {cal['cost']['row_overhead']:.4g}).", "",
          "## 3. Measured vs predicted step time", "",
          f"Windows from `routepack_opt.trace.generate_window('qwen3-30b-a3b', N={res['measure'][0]['N']}, seed, num_layers=2, "
          f"num_experts=16, top_k=4, capacity=C)` (window 'skewed': expert_skew=1.2, length_sigma=1.0); topology D=8, P=4 (G=2 shards); R = certified R*. Every cell's attention "
          "and every (row, shard, layer, rank) expert workload run with torch (unscaled); J composed per docs/model.md "
          "with measured times; prediction = `routepack_opt.core.evaluate` with the calibrated cost. ratio = measured / predicted.", "",
          *table(["window", "tokens", "R", "plan", "max-sum measured µs", "predicted µs", "ratio", "sum-max measured µs",
                  "predicted µs", "ratio", "J R²", "mean abs rel. err J", "corr² attn cells", "corr² expert loads"],
                 [(f"{r['preset']} s{r['seed']}", r["tokens"], r["rows"], r["plan"],
                   *(r["objectives"][o][k] for o in ("max-sum", "sum-max")
                     for k in ("measured_us", "predicted_us", "ratio")),
                   r["J_r2"], r["J_rel_err_mean"], r["attention_cell_corr2"], r["expert_workload_corr2"])
                  for r in res["measure"]],
                 formats={1: ",", 4: ",.0f", 5: ",.0f", 6: ".3f", 7: ",.0f", 8: ",.0f", 9: ".3f", 10: ".3f",
                          11: ".3f", 12: ".3f", 13: ".3f"})]
    ratios = [r["objectives"][o]["ratio"] for r in res["measure"] if "again" not in r["plan"]
              for o in ("max-sum", "sum-max")]
    ratios = np.array(ratios)
    L += ["", f"Measured / predicted makespan over all plans and both objectives: mean {ratios.mean():.3f}, "
          f"min {ratios.min():.3f}, max {ratios.max():.3f}.", ""]
    again = [r for r in res["measure"] if "again" in r["plan"]]
    if again:
        first = next(r for r in res["measure"] if r["plan"] == "baseline" and r["seed"] == again[0]["seed"])
        a0, a1 = first["objectives"]["max-sum"]["measured_us"], again[0]["objectives"]["max-sum"]["measured_us"]
        L += [f"Run-to-run noise: the same baseline plan measured twice gives {a0:,.0f} and {a1:,.0f} µs "
              f"({abs(a1 - a0) / a0:.1%} apart) on this shared machine.", ""]
    # does the predicted improvement show up in the measurement?
    by = {}
    for r in res["measure"]:
        by.setdefault((r["preset"], r["seed"]), {})[r["plan"]] = r["objectives"]["max-sum"]
    L += ["Predicted vs measured speed-up of each plan over the baseline (max-sum makespan):", "",
          *table(["window", "plan", "predicted speed-up", "measured speed-up"],
                 [(f"{preset} s{seed}", name, d["baseline"]["predicted_us"] / d[name]["predicted_us"],
                   d["baseline"]["measured_us"] / d[name]["measured_us"])
                  for (preset, seed), d in by.items() for name in ("reorder", "routepack")
                  if name in d and "baseline" in d],
                 formats={2: num(".3f", suffix="×"), 3: num(".3f", suffix="×")})]
    L += ["", "Notes: CPU timings use the thread's CPU clock with one intra-op thread (immune to "
          "preemption by other jobs on a shared machine; kernels run inline). The attention kernel is a "
          "per-sample causal SDPA loop (varlen semantics), so it has a per-sample launch cost the cost "
          "model has no term for; it shows as the attention fit's residuals at many short samples.", "",
          "Limit (checked by hand, not part of this script): a full-size preset window measured with heavy "
          "downscaling — `routepack gen-trace --preset qwen3-30b-a3b --samples 512 --seed 0`, "
          "`routepack plan … --cost qwen3-30b-a3b --time-limit 5`, `routepack measure W.npz PLAN.json` "
          "(auto scale 1/336, median scaled sample ≈ 16 tokens) — gave measured/predicted 1.26 and attention "
          "corr² 0.10: at that scale fixed per-sample costs dominate, which the cost model (docs/model.md) does not "
          "represent; `measure` now prints a note in that regime.", ""]
    return "\n".join(L)


if __name__ == "__main__":
    sys.exit(main())

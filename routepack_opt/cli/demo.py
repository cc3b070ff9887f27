"""``routepack demo``: the main job on an embedded default window.

Generates a window from a preset, certifies R*, plans, compares with the baselines, prints the
table and writes a plot (per-rank expert load before/after placement; per-row/shard cost before
and after planning).
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

from routepack_opt.cli.common import (
    add_json,
    add_objective,
    add_replica_args,
    emit,
    nonneg_int,
    positive_float,
    positive_int,
)
from routepack_opt.cli.plan import progress_bar
from routepack_opt.core.cost import PRESETS, get_preset
from routepack_opt.core.errors import InputError
from routepack_opt.core.topology import Topology

DEFAULTS = dict(preset="qwen3-30b-a3b", samples=512, dp=16, ep=8, seed=0)


def register(sub) -> None:
    p = sub.add_parser("demo", help="the main job on an embedded default: trace → R* → plan → compare → plot")
    p.add_argument("--preset", default=DEFAULTS["preset"], help=f"model preset ({', '.join(PRESETS)})")
    p.add_argument("--samples", type=positive_int, default=DEFAULTS["samples"])
    p.add_argument("--dp", type=positive_int, default=DEFAULTS["dp"])
    p.add_argument("--ep", type=positive_int, default=DEFAULTS["ep"])
    p.add_argument("--seed", type=nonneg_int, default=DEFAULTS["seed"])
    p.add_argument("--time-limit", type=positive_float, help="search time limit per plan (s)")
    add_replica_args(p)
    p.add_argument("--out", default="routepack-demo", help="output directory (window, plan, plot)")
    add_objective(p)
    add_json(p)
    p.set_defaults(func=run)


def run(args) -> None:
    from rich.console import Console

    from routepack_opt.certify import certify_rows
    from routepack_opt.compare import compare_plans, format_table
    from routepack_opt.core.window import save_window
    from routepack_opt.trace import generate_window

    preset = get_preset(args.preset)
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--out {out}: {exc.strerror or exc}") from None
    from routepack_opt.core.io import check_output_path

    for name in ("window.npz", "plan.json", "routepack-demo.png"):  # before the work starts
        check_output_path(out / name)
    # the topology is checked before anything is generated or written
    topo = Topology(dp=args.dp, ep=args.ep, capacity=preset.config.capacity,
                    redundant_experts=args.redundant_experts)
    topo.check_experts(preset.config.experts)
    console = Console(width=140, stderr=args.json, quiet=args.json)
    t0 = time.perf_counter()
    window = generate_window(args.preset, args.samples, args.seed)
    save_window(window, out / "window.npz")
    cost = preset.cost
    console.print(f"[bold]window[/]: {args.preset}, N={window.num_samples} samples, L={window.num_layers} "
                  f"layers, E={window.num_experts} experts, top-{window.top_k}, {window.total_tokens:,} tokens "
                  f"(gen {time.perf_counter() - t0:.2f} s) → {out / 'window.npz'}")
    console.print(f"[bold]topology[/]: D={topo.dp} DP slots, P={topo.ep} EP ranks, G={topo.num_shards} "
                  f"shard(s), capacity {topo.capacity:,} tokens; cost '{cost.name}' "
                  f"(gamma {cost.gamma:.4g} µs, stages "
                  + ", ".join(f"{s.name} α={s.alpha:.3g} β={s.beta:.3g}" for s in cost.stages) + ")")
    from routepack_opt.warmup import default_jobs, warm

    # compile/load the kernels first (in parallel worker processes on a cold cache), so no
    # timing below includes it; the demo's table needs the plan and joint groups (not the exact
    # models' or the rare load storages')
    cold = console.status("compiling the numba kernels (once per install)") if not args.json else None
    with cold if cold is not None else contextlib.nullcontext():
        wr = warm(("plan", "joint") + (("replicas",) if topo.redundant_experts else ()), jobs=default_jobs(),
                  progress=lambda unit, secs, ok: console.print(f"[dim]  {unit}: {'compiled' if ok else 'failed'}"
                                                                f" in {secs:.1f} s[/]"))
    if not wr["already_warm"]:
        console.print(f"[dim]numba kernels ready in {wr['seconds']:.1f} s ({len(wr.get('workers', {}))} "
                      f"worker units, {wr['compiled']} compiled here, {wr['loaded']} loaded from the cache)[/]")
    cert = certify_rows(window, topo, time_limit=10.0)
    console.print(f"[bold]R*[/] = {cert.rows} rows ({cert.status}, lower bound {cert.lower_bound}, "
                  f"by {cert.method}, {cert.seconds * 1e3:.1f} ms)")
    with progress_bar(sys.stderr.isatty() and not args.json, "planning") as cb:
        table, plans = compare_plans(window, topo, cost, objective=args.objective, time_limit=args.time_limit,
                                     max_replica_bytes=args.max_replica_bytes,
                                     seed=args.seed, exact=False, progress=cb)
    console.print(format_table(table, args.objective))
    plans["routepack"].save(out / "plan.json")
    png = out / "routepack-demo.png"
    _plot(window, topo, cost, plans, args.objective, png)
    console.print(f"wrote {out / 'plan.json'} and {png}")
    emit(args, {"window": str(out / "window.npz"), "plan": str(out / "plan.json"), "plot": str(png),
                "certificate": cert.as_dict(), "objective": args.objective, "rows": table})


def _plot(window, topo, cost, plans, objective, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from routepack_opt.core.evaluate import Evaluator, expert_rank_loads

    load = window.expert_loads()
    ev = Evaluator(window, topo, cost)
    fig, axes = plt.subplots(2, 2, figsize=(13, 8), constrained_layout=True)
    for ax, name in zip(axes[0], ("baseline", "reorder")):
        pn = plans[name]
        if pn.replicas is None:
            Lagg = expert_rank_loads(load, pn.placement.first_slots, topo.ep)
        else:  # the ranks' window totals under the replica rule
            Lagg = ev.block_loads(pn.replicas, pn.row, pn.slot, pn.rows).reshape(
                -1, window.num_layers, topo.ep).sum(axis=0).astype(float)
        rel = Lagg / Lagg.mean(axis=1, keepdims=True)
        im = ax.imshow(rel.T, aspect="auto", cmap="magma", vmin=0.5, vmax=max(1.5, float(rel.max())))
        ax.set_title(f"{name}: per-rank expert load / mean (max {rel.max():.2f})")
        ax.set_xlabel("MoE layer")
        ax.set_ylabel("EP rank")
        fig.colorbar(im, ax=ax)
    Js = {n: ev.costs(plans[n].expert_placement, plans[n].row, plans[n].slot, plans[n].rows)
          for n in ("baseline", "routepack")}
    vmax = max(float(J.max()) for J in Js.values()) / 1e3
    vmin = min(float(J.min()) for J in Js.values()) / 1e3
    for ax, (name, J) in zip(axes[1], Js.items()):
        im = ax.imshow(J.T / 1e3, aspect="auto", cmap="viridis", vmin=vmin, vmax=vmax)
        s = ev.evaluate(plans[name].expert_placement, plans[name].row, plans[name].slot, plans[name].rows,
                        objective).score
        ax.set_title(f"{name}: J[row, shard] (ms); {objective} makespan {s.makespan / 1e3:,.1f} ms")
        ax.set_xlabel("row (micro-batch)")
        ax.set_ylabel("EDP shard")
        ax.set_yticks(range(J.shape[1]))
        fig.colorbar(im, ax=ax)
    fig.suptitle("RoutePack demo: expert placement (top) and joint packing (bottom)")
    import io

    from routepack_opt.core.io import atomic_write_bytes

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())

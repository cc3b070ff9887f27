"""Referee study: where the gain comes from — baseline → reorder → routepack over a sequence of
drifting optimizer steps, both objectives.

    python experiments/decomposition.py [--steps 20] [--presets a,b] [--quick] [--out DIR]

Mean gains over ``--steps`` steps with moving-block bootstrap 95% CIs (steps are serially
correlated); global EP-rank CV identity → LPT; worst row-local EP peak reorder → routepack.
Common setting and flags: ``experiments/_lib/referee.py``. Writes
``experiments/results/decomposition/decomposition.{md,json,png}``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from _lib import report, stats
from _lib.referee import OBJECTIVES, Planner, Setting, gains, header, main, three, write
from _lib.report import pct

from routepack_opt.core.evaluate import Evaluator

STUDY = "decomposition"
COLUMNS = ("preset", "L used/full × E, k, D, P, C", "objective", "R", "reorder gain [95% CI]",
           "packing increment [95% CI]", "total gain [95% CI]", "lag-1 ac", "EP-rank CV identity → LPT",
           "row EP peak reorder → routepack", "routepack s/step")


def run(st: Setting) -> Path:
    blk = stats.block_length(st.steps)
    ci = lambda x: stats.mean_ci_pct(x, blk, st.bootstrap)  # noqa: E731
    head = header(st, STUDY,
                  "Baseline (identity placement + verl-style length-only KK packing) → reorder (LPT+swap "
                  "placement, same packing) → routepack (LPT+swap + population annealing on the joint "
                  f"cost), over {st.steps} consecutive optimizer steps with drifting routing "
                  "(`generate_sequence`, drift 0.05/step). Gains are relative reductions of the "
                  "predicted step time under the objective planned for, mean over steps with a "
                  f"moving-block bootstrap 95% CI (block length {blk} = round(n^(1/3)), "
                  f"{st.bootstrap} resamples: steps are serially correlated, not independent). "
                  "`lag-1 ac` is the lag-1 autocorrelation of the step-wise total gain. "
                  "CV = coefficient of variation of the window's per-rank expert loads (all layers); "
                  "row EP peak = worst row-local busiest-rank token count max_{r,g,l} max_p W.")
    rows, records = [], []
    for preset in st.presets:
        topo, cost = st.topology(preset), st.cost(preset)
        per_obj = {o: [] for o in OBJECTIVES}
        for t in range(st.steps):
            w = st.window(preset, step=t)
            pl = Planner(w, topo, cost)
            ev = Evaluator(w, topo, cost)
            for o in OBJECTIVES:
                m = three(pl, ev, o, st.sweeps, st.seed)
                rec = {"preset": preset, "step": t, "objective": o, "rows": pl.rows, **gains(m),
                       "cv_identity": m["baseline"]["cv"], "cv_lpt": m["reorder"]["cv"],
                       "peak_reorder": m["reorder"]["row_peak"], "peak_routepack": m["routepack"]["row_peak"],
                       "seconds": m["routepack"]["seconds"],
                       "makespans": {k: v["makespan"] for k, v in m.items()}}
                per_obj[o].append(rec)
                records.append(rec)
            print(f"decomposition {preset} step {t}: "
                  + ", ".join(f"{o} total {pct(per_obj[o][-1]['total'])}" for o in OBJECTIVES), flush=True)
        for o in OBJECTIVES:
            rs = per_obj[o]
            g = {k: np.array([r[k] for r in rs]) for k in ("reorder", "packing", "total")}
            cvi, cvl = np.mean([r["cv_identity"] for r in rs]), np.mean([r["cv_lpt"] for r in rs])
            pr, pp = np.mean([r["peak_reorder"] for r in rs]), np.mean([r["peak_routepack"] for r in rs])
            rows.append((preset, st.shape(preset), o, rs[0]["rows"], ci(g["reorder"]), ci(g["packing"]),
                         ci(g["total"]), stats.lag1(g["total"]),
                         f"{cvi:.4f} → {cvl:.5f} ({100 * (1 - cvl / cvi):.1f}% removed)",
                         f"{pr:,.0f} → {pp:,.0f} ({pct((pp - pr) / pr)})",
                         np.mean([r["seconds"] for r in rs])))
        write(st, STUDY, head + _table(rows), records)
    report.save_fig(_plot(st, records, blk), st.folder(STUDY) / f"{STUDY}.png")
    return write(st, STUDY, head + _table(rows) + ["", f"![decomposition]({STUDY}.png)", ""], records)


def _table(rows) -> list[str]:
    return report.table(COLUMNS, rows, formats={"lag-1 ac": ".2f", "routepack s/step": ".2f"})


def _plot(st: Setting, records: list[dict], blk: int):
    plt = report.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, o in zip(axes, OBJECTIVES):
        x = np.arange(len(st.presets))
        for j, (k, color) in enumerate((("reorder", "tab:blue"), ("packing", "tab:orange"), ("total", "tab:green"))):
            mean, lo, hi = [], [], []
            for p in st.presets:
                v = np.array([r[k] for r in records if r["preset"] == p and r["objective"] == o])
                a, b = stats.block_bootstrap_ci(v, blk, st.bootstrap)
                mean.append(100 * v.mean())
                lo.append(max(0.0, 100 * (v.mean() - a)))
                hi.append(max(0.0, 100 * (b - v.mean())))
            ax.bar(x + (j - 1) * 0.27, mean, 0.27, yerr=[lo, hi], capsize=3, color=color,
                   label={"reorder": "reorder (LPT)", "packing": "+ packing", "total": "total"}[k])
        ax.set_xticks(x, st.presets, rotation=15)
        ax.set_title(f"objective {o}")
        ax.axhline(0, color="k", lw=0.5)
    axes[0].set_ylabel("gain over baseline, % (95% block-bootstrap CI)")
    axes[0].legend()
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    sys.exit(main(__doc__, STUDY, run))

"""Referee study: stale routing — plan on routing recorded k policy updates late, execute on
the true routing.

    python experiments/staleness.py [--windows 4] [--presets a,b] [--quick] [--out DIR]

Two drift rates, lags k = 0..16 (0..4 with ``--quick``); realized gains with moving-block
bootstrap 95% CIs, next to the gain the planner believed. Common setting and flags:
``experiments/_lib/referee.py``. Writes ``experiments/results/staleness/staleness.{md,json,png}``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from _lib import report, stats
from _lib.referee import Planner, Setting, gains, header, main, three, write
from _lib.report import pct

from routepack_opt.core.evaluate import Evaluator

STUDY = "staleness"
LAGS = (0, 1, 2, 4, 8, 16)
COLUMNS = ("preset", "drift", "k", "reorder gain", "packing increment", "total gain [95% CI]", "predicted total")


def run(st: Setting, drifts=(0.05, 0.2), objective: str = "max-sum") -> Path:
    lags = tuple(k for k in LAGS if k <= (4 if st.quick else 16))
    t0 = max(lags)
    steps = list(range(t0, t0 + st.windows))
    blk = stats.block_length(len(steps))
    head = header(st, STUDY,
                  "Replay staleness: at step t the planner sees routing recorded k policy updates "
                  "earlier (`generate_window(step=t, routing_step=t-k)`: same samples and lengths, "
                  "routing of the older policy) and its plan is executed on the true routing "
                  "(`routing_step=t`). Gains are realized on the true routing, relative to the "
                  f"baseline (which does not use routing). Objective {objective}; windows t = "
                  f"{steps[0]}..{steps[-1]}; CI: moving-block bootstrap over t (block {blk}). "
                  "`drift` is the per-step sd of the routing logits' random walk (default 0.05; "
                  "0.2 = fast-moving policy). `predicted` = the gain the planner believed on the stale "
                  "routing.")
    rows, records = [], []
    for preset in st.presets:
        topo, cost = st.topology(preset), st.cost(preset)
        for drift in drifts:
            for k in lags:
                per_t = []
                for t in steps:
                    w_true = st.window(preset, step=t, drift=drift)
                    w_stale = st.window(preset, step=t, routing_step=t - k, drift=drift)
                    pl = Planner(w_stale, topo, cost)
                    g = gains(three(pl, Evaluator(w_true, topo, cost), objective, st.sweeps, st.seed))
                    ev_s = Evaluator(w_stale, topo, cost)  # what the planner believed
                    pred_base = ev_s.score(pl.ident, *pl.base["verl-kk"], pl.rows, objective).makespan
                    rp_row, rp_slot, _, _ = pl.routepack(objective, st.sweeps, st.seed)  # cached
                    pred_rp = ev_s.score(pl.lpt, rp_row, rp_slot, pl.rows, objective).makespan
                    g["predicted"] = (pred_base - pred_rp) / pred_base
                    rec = {"preset": preset, "drift": drift, "k": k, "step": t, **g}
                    per_t.append(rec)
                    records.append(rec)
                arr = {key: np.array([r[key] for r in per_t]) for key in ("reorder", "packing", "total", "predicted")}
                rows.append((preset, str(drift), k, arr["reorder"].mean(), arr["packing"].mean(),
                             stats.mean_ci_pct(arr["total"], blk, st.bootstrap), arr["predicted"].mean()))
                print(f"staleness {preset} drift {drift} k {k}: total {pct(arr['total'].mean())}", flush=True)
            write(st, STUDY, head + _table(rows), records)
    report.save_fig(_plot(st, records, lags, drifts), st.folder(STUDY) / f"{STUDY}.png")
    return write(st, STUDY, head + _table(rows) + ["", f"![staleness]({STUDY}.png)", ""], records)


def _table(rows) -> list[str]:
    return report.table(COLUMNS, rows, formats={"reorder gain": pct, "packing increment": pct,
                                                "predicted total": pct})


def _plot(st: Setting, records, lags, drifts):
    plt = report.pyplot()
    fig, axes = plt.subplots(1, len(drifts), figsize=(5.5 * len(drifts), 4), sharey=True, squeeze=False)
    for ax, drift in zip(axes[0], drifts):
        for p in st.presets:
            y = [100 * np.mean([r["total"] for r in records if r["preset"] == p and r["drift"] == drift and r["k"] == k])
                 for k in lags]
            yr = [100 * np.mean([r["reorder"] for r in records if r["preset"] == p and r["drift"] == drift and r["k"] == k])
                  for k in lags]
            line, = ax.plot(lags, y, "o-", label=f"{p} total")
            ax.plot(lags, yr, "x--", color=line.get_color(), alpha=0.6, label=f"{p} reorder")
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xticks(lags, [str(k) for k in lags])
        ax.set_xlabel("replay lag k (policy updates)")
        ax.set_title(f"drift {drift} per step")
        ax.axhline(0, color="k", lw=0.5)
    axes[0][0].set_ylabel("realized gain over baseline, %")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    sys.exit(main(__doc__, STUDY, run))

"""Referee study: cost-model sensitivity (referee major 3) and the attention-vs-expert Pareto
front at fixed R.

    python experiments/cost.py [--windows 4] [--presets a,b] [--quick] [--out DIR]

Every attention alpha ×a, beta ×b (×0.25..×4): Kendall tau of the candidate layouts' rankings,
the regret of planning with the preset's coefficients; then plans under w·attention +
(1−w)·expert. Common setting and flags: ``experiments/_lib/referee.py``. Writes
``experiments/results/cost/cost.{md,json}`` and ``cost_pareto.png``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from _lib import report, stats
from _lib.referee import Planner, Setting, header, main, scaled_cost, write
from _lib.report import pct

from routepack_opt.core.evaluate import Evaluator
from routepack_opt.heuristics.anneal import greedy_layout

STUDY = "cost"
SCALES = (0.25, 0.5, 1.0, 2.0, 4.0)
PARETO_W = (0.0, 0.1, 0.25, 0.4, 0.5, 0.6, 0.75, 0.9, 1.0)
COLUMNS = ("preset", "a (alpha ×)", "b (beta ×)", "tau mean", "tau min", "regret mean", "regret max",
           "gain of preset plan under (a,b)", "gain of plan made for (a,b)")
PARETO_COLUMNS = ("preset", "R", "w", "attention vs baseline", "expert vs baseline", "joint makespan vs baseline")


def cost_grid(quick: bool) -> list[tuple[float, float]]:
    """The (a, b) multipliers: each axis alone, then the four corners."""
    if quick:
        return [(1.0, 1.0), (0.25, 1.0), (4.0, 1.0), (1.0, 4.0)]
    axis = [(a, 1.0) for a in SCALES] + [(1.0, b) for b in SCALES if b != 1.0]
    return axis + [(0.25, 0.25), (4.0, 4.0), (0.25, 4.0), (4.0, 0.25)]


def run(st: Setting, objective: str = "max-sum") -> Path:

    grid = cost_grid(st.quick)
    nwin = max(1, st.windows // 2)
    head = header(st, STUDY,
                  "Cost-model sensitivity (referee major 3). Every attention alpha ×a, beta ×b "
                  f"(gamma fixed) over {len(grid)} models (a, b ∈ ×0.25..×4); {nwin} window(s) per "
                  f"preset; objective {objective}. Candidates: the 4 baseline layouts (identity/LPT × "
                  "verl-kk/NeMo-FFD), the joint greedy, and routepack planned under each model "
                  f"({len(grid) + 5} layouts). `tau` = Kendall tau-b between the candidates' makespans "
                  "under the preset model (a=b=1) and under (a, b): 1 = same ranking. `regret` = how much "
                  "worse the plan made with the preset coefficients is, under (a, b), than the plan made "
                  "with (a, b) itself. `gain` = that preset-coefficient plan's gain over the baseline "
                  "when (a, b) are the true coefficients.")
    rows, records, pareto = [], [], []
    for preset in st.presets:
        topo, cost = st.topology(preset), st.cost(preset)
        acc = {ab: [] for ab in grid}
        for t in range(nwin):
            w = st.window(preset, step=t)
            pl = Planner(w, topo, cost)
            R = pl.rows
            cands = {f"identity+{n}": (pl.ident, r, s) for n, (r, s) in pl.base.items()}
            cands.update({f"lpt+{n}": (pl.lpt, r, s) for n, (r, s) in pl.base.items()})
            g = greedy_layout(w.lengths, Evaluator(w, topo, cost).rank_loads(pl.lpt), topo, cost, R, objective)
            if g is not None:
                cands["lpt+greedy"] = (pl.lpt, np.asarray(g[0]), np.asarray(g[1]))
            for ab in grid:
                r, s, _, _ = pl.routepack(objective, st.sweeps, st.seed, cost=scaled_cost(cost, *ab))
                cands[f"routepack@{ab}"] = (pl.lpt, r, s)
            names = list(cands)
            scores = {}
            for ab in grid:
                ev = Evaluator(w, topo, scaled_cost(cost, *ab))
                scores[ab] = np.array([ev.score(*cands[n], R, objective).makespan for n in names])
            ref = scores[(1.0, 1.0)]
            i_pre = names.index("routepack@(1.0, 1.0)")
            i_base = names.index("identity+verl-kk")
            for ab in grid:
                s = scores[ab]
                i_own = names.index(f"routepack@{ab}")
                rec = {"preset": preset, "step": t, "a": ab[0], "b": ab[1], "tau": stats.kendall_tau(ref, s),
                       "regret": (s[i_pre] - s[i_own]) / s[i_own],
                       "gain_preset_plan": (s[i_base] - s[i_pre]) / s[i_base],
                       "gain_own_plan": (s[i_base] - s[i_own]) / s[i_base]}
                acc[ab].append(rec)
                records.append(rec)
            if t == 0:
                pareto.append(_pareto(st, preset, pl, cost, cands, objective))
        for ab in grid:
            rs = acc[ab]
            rows.append((preset, str(ab[0]), str(ab[1]), np.mean([r["tau"] for r in rs]), min(r["tau"] for r in rs),
                         np.mean([r["regret"] for r in rs]), max(r["regret"] for r in rs),
                         np.mean([r["gain_preset_plan"] for r in rs]), np.mean([r["gain_own_plan"] for r in rs])))
        print(f"cost {preset} done", flush=True)
        write(st, STUDY, head + _table(rows) + _pareto_lines(pareto), {"sensitivity": records, "pareto": pareto})
    report.save_fig(_plot_pareto(pareto, objective), st.folder(STUDY) / f"{STUDY}_pareto.png")
    lines = head + _table(rows) + _pareto_lines(pareto) + ["", f"![pareto]({STUDY}_pareto.png)", ""]
    return write(st, STUDY, lines, {"sensitivity": records, "pareto": pareto})


def _pareto(st: Setting, preset: str, pl: Planner, cost, cands, objective: str) -> dict:
    """Pareto front at fixed R: plan under weights w·attention + (1-w)·expert (×2 so that w = 0.5
    is the preset model), evaluate both parts under the true coefficients."""
    w, topo, R = pl.window, pl.topology, pl.rows
    ev_att = Evaluator(w, topo, scaled_cost(cost, g=0.0, overhead=0.0))
    ev_exp = Evaluator(w, topo, scaled_cost(cost, a=0.0, b=0.0, overhead=0.0))
    ev = Evaluator(w, topo, cost)
    pts = []
    for wt in (PARETO_W if not st.quick else (0.0, 0.5, 1.0)):
        cw = scaled_cost(cost, a=2 * wt, b=2 * wt, g=2 * (1 - wt))
        r, s, _, _ = pl.routepack(objective, st.sweeps, st.seed, cost=cw)
        pts.append({"w": wt, "attention": ev_att.score(pl.lpt, r, s, R, objective).makespan,
                    "expert": ev_exp.score(pl.lpt, r, s, R, objective).makespan,
                    "joint": ev.score(pl.lpt, r, s, R, objective).makespan})
    refs = {}
    for n, (p_, r, s) in (("baseline", cands["identity+verl-kk"]), ("reorder", cands["lpt+verl-kk"])):
        refs[n] = {"attention": ev_att.score(p_, r, s, R, objective).makespan,
                   "expert": ev_exp.score(p_, r, s, R, objective).makespan,
                   "joint": ev.score(p_, r, s, R, objective).makespan}
    return {"preset": preset, "rows": R, "points": pts, "refs": refs}


def _table(rows) -> list[str]:
    return report.table(COLUMNS, rows, formats={"tau mean": ".3f", "tau min": ".3f", **{c: pct for c in COLUMNS[5:]}})


def _pareto_lines(pareto) -> list[str]:
    rows = []
    for pf in pareto:
        b = pf["refs"]["baseline"]
        for name, p in [("reorder", pf["refs"]["reorder"])] + [(f"{p['w']}", p) for p in pf["points"]]:
            rows.append((pf["preset"], pf["rows"], name, p["attention"] / b["attention"] - 1,
                         p["expert"] / b["expert"] - 1, p["joint"] / b["joint"] - 1))
    return (["", "## Attention-vs-expert Pareto front at fixed R (first window of each preset)", "",
             "Plans made under w·attention + (1−w)·expert (w = 0.5: the preset model); both parts then "
             "scored under the true coefficients as separate makespans (attention only: gamma = 0; "
             "expert only: alpha = beta = 0; row overhead 0). Relative to the baseline layout's parts.", ""]
            + report.table(PARETO_COLUMNS, rows, formats={c: pct for c in PARETO_COLUMNS[3:]}))


def _plot_pareto(pareto, objective):
    plt = report.pyplot()
    n = len(pareto)
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 4), squeeze=False)
    for ax, pf in zip(axes[0], pareto):
        b = pf["refs"]["baseline"]
        xs = [p["attention"] / b["attention"] for p in pf["points"]]
        ys = [p["expert"] / b["expert"] for p in pf["points"]]
        ax.plot(xs, ys, "o-", label="routepack(w)")
        for p, x, y in zip(pf["points"], xs, ys):
            ax.annotate(f"{p['w']}", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        for name, mk in (("baseline", "s"), ("reorder", "^")):
            r = pf["refs"][name]
            ax.plot(r["attention"] / b["attention"], r["expert"] / b["expert"], mk, label=name)
        ax.set_title(f"{pf['preset']} (R={pf['rows']})")
        ax.set_xlabel("attention makespan / baseline's")
        ax.set_ylabel("expert makespan / baseline's")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"Attention-vs-expert front at fixed R ({objective}); label = attention weight w")
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    sys.exit(main(__doc__, STUDY, run))

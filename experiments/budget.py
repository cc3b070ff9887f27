"""Referee study: search budget — quality vs sweeps and vs time limit, and the planner's
overhead against the overlap condition at production size.

    python experiments/budget.py [--windows 4] [--presets a,b] [--quick] [--out DIR]

The overlap condition T_place + T_pack ≤ max(T_place, T_aux) + T_actor is checked on
production-size windows (skipped with ``--quick``). Common setting and flags:
``experiments/_lib/referee.py``. Writes ``experiments/results/budget/budget.{md,json,png}``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from _lib import report
from _lib.referee import Planner, Setting, header, main, write
from _lib.report import pct

from routepack_opt.core.cost import get_preset
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.pipeline import resolve_placement, solve
from routepack_opt.trace import generate_window

STUDY = "budget"
SWEEP_BUDGETS = (1, 2, 5, 10, 20, 50, 100)
TIME_LIMITS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0)
T_ACTOR_S = (10.0, 30.0, 60.0)
COLUMNS = ("preset", "budget", "wall s", "gain", "of best")
OVERHEAD_COLUMNS = ("preset", "shape", "T_place s", "T_pack s", "T_aux s (experts moved, busiest rank recv.)",
                    "min T_actor s", "holds for T_actor = " + " / ".join(f"{a:.0f}" for a in T_ACTOR_S) + " s",
                    "predicted step s")


def run(st: Setting, objective: str = "max-sum") -> Path:
    sweeps = SWEEP_BUDGETS if not st.quick else (1, 5)
    limits = TIME_LIMITS if not st.quick else (0.1, 0.5)
    nwin = max(1, st.windows // 2)
    head = header(st, STUDY,
                  f"Search quality vs budget (objective {objective}, {nwin} window(s) per preset). "
                  "`gain` = reduction of predicted step time over the baseline; `of best` = share of the "
                  "largest gain seen for that window that the budget reaches. Time = wall time of the "
                  "whole pipeline (placement, R*, seeds, ladder calibration, search) on this machine "
                  "(2 cores shared with other jobs), after one untimed warm-up plan; with a time limit "
                  "the search stops at the limit but the fixed pipeline work before it does not.")
    rows, records = [], []
    for preset in st.presets:
        topo, cost = st.topology(preset), st.cost(preset)
        per_window = []
        for t in range(nwin):
            w = st.window(preset, step=t)
            pl = Planner(w, topo, cost)
            ev = Evaluator(w, topo, cost)
            base = ev.score(pl.ident, *pl.base["verl-kk"], pl.rows, objective).makespan
            pl.routepack(objective, 1, st.seed + 1)  # warm-up (numba compile), not timed
            reo = ev.score(pl.lpt, *pl.base["verl-kk"], pl.rows, objective).makespan
            runs = [("reorder only", 0.0, (base - reo) / base)]
            for sw in sweeps:
                r, s, secs, _ = pl.routepack(objective, sw, st.seed)
                runs.append((f"{sw} sweeps", secs, (base - ev.score(pl.lpt, r, s, pl.rows, objective).makespan) / base))
            for tl in limits:
                r, s, secs, _ = pl.routepack(objective, None, st.seed, time_limit=tl)
                runs.append((f"{tl} s limit", secs, (base - ev.score(pl.lpt, r, s, pl.rows, objective).makespan) / base))
            best = max(g for _, _, g in runs)
            for name, secs, g in runs:
                rec = {"preset": preset, "step": t, "budget": name, "seconds": secs, "gain": g,
                       "of_best": g / best if best > 0 else 1.0}
                per_window.append(rec)
                records.append(rec)
        for name in dict.fromkeys(r["budget"] for r in per_window):
            rs = [r for r in per_window if r["budget"] == name]
            rows.append((preset, name, np.mean([r["seconds"] for r in rs]), np.mean([r["gain"] for r in rs]),
                         np.mean([r["of_best"] for r in rs])))
        print(f"budget {preset} done", flush=True)
        write(st, STUDY, head + _table(rows), records)
    report.save_fig(_plot(st, records), st.folder(STUDY) / f"{STUDY}.png")
    lines = head + _table(rows) + ["", f"![budget]({STUDY}.png)", ""]
    over = [] if st.quick else overhead_rows(st)
    if over:
        lines += _overhead_lines(over)
    return write(st, STUDY, lines, {"budget": records, "overhead": over})


def _table(rows) -> list[str]:
    return report.table(COLUMNS, rows, formats={"wall s": ".2f", "gain": pct, "of best": lambda x: f"{100 * x:.1f}%"})


def _plot(st: Setting, records):
    plt = report.pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for p in st.presets:
        for kind, mk in (("sweeps", "o-"), ("s limit", "s--")):
            rs = [r for r in records if r["preset"] == p and r["budget"].endswith(kind)]
            names = list(dict.fromkeys(r["budget"] for r in rs))
            x = [np.mean([r["seconds"] for r in rs if r["budget"] == n]) for n in names]
            y = [100 * np.mean([r["gain"] for r in rs if r["budget"] == n]) for n in names]
            ax.plot(x, y, mk, label=f"{p} ({kind.strip()})")
    ax.set_xscale("log")
    ax.set_xlabel("planner wall time, s (2 shared cores)")
    ax.set_ylabel("gain over baseline, %")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def overhead_rows(st: Setting, samples: int = 1024) -> list[dict]:
    """Production size (full L, N=1024, default annealing budget): T_place, T_pack, and T_aux =
    materialization time of the new placement after the previous step's (slots aligned, bytes of
    weights + optimizer state over ``cost.migration_bandwidth``, busiest rank)."""
    from routepack_opt.heuristics.placement.migration import align_slots, migration_cost

    out = []
    for preset in st.presets:
        P = get_preset(preset)
        topo = st.topology(preset)
        cost = P.cost
        w_prev = generate_window(preset, samples, st.seed, step=0)
        w = generate_window(preset, samples, st.seed, step=1)
        prev_pl, _ = resolve_placement(w_prev, topo, "lpt")
        p = solve(w, topo, cost, objective="max-sum", placement="lpt", seed=st.seed)
        tm = p.report.timings
        prev_pi = prev_pl.permutation()
        mig = migration_cost(prev_pi, align_slots(p.placement.permutation(), prev_pi, topo.ep), topo, cost)
        t_place = tm["placement"]
        t_pack = tm["total"] - tm["placement"]
        t_aux = mig.time_us / 1e6
        step_s = p.score["makespan"] / 1e6
        out.append({"preset": preset, "shape": f"{w.num_layers} × {w.num_experts}, N {samples}",
                    "t_place": t_place, "t_pack": t_pack, "t_aux": t_aux,
                    "moved": mig.experts_moved, "max_rank_received": mig.max_rank_received,
                    "step_s": step_s, "min_t_actor": max(0.0, t_place + t_pack - max(t_place, t_aux))})
        print(f"overhead {preset}: {out[-1]}", flush=True)
    return out


def _overhead_lines(over) -> list[str]:
    rows = []
    for o in over:
        holds = " / ".join("yes" if o["t_place"] + o["t_pack"] <= max(o["t_place"], o["t_aux"]) + a else "no"
                           for a in T_ACTOR_S)
        rows.append((o["preset"], o["shape"], o["t_place"], o["t_pack"],
                     f"{o['t_aux']:.2f} ({o['moved']}, {o['max_rank_received']})", o["min_t_actor"], holds, o["step_s"]))
    return (["", "## Planner overhead and the overlap condition", "",
             "Production-size windows (every preset's full L and E, N = 1024, default annealing budget "
             "200 sweeps × 16 replicas, no time limit), planned on this 2-core machine. Assumptions: "
             "T_actor = rollout time of the next batch (10–60 s is typical for RL rollouts of "
             "thousands of tokens per sample); T_aux = materialization of the new placement after the "
             "previous step's (slots aligned to keep unmoved experts in place): busiest rank's "
             "received experts × (bf16 weights + fp32 master + Adam moments) / 50 GB/s. "
             "The condition T_place + T_pack ≤ max(T_place, T_aux) + T_actor holds whenever "
             "T_actor ≥ `min T_actor`; the predicted step time is the training step the plan is for.", ""]
            + report.table(OVERHEAD_COLUMNS, rows, formats={"T_place s": ".3f", "T_pack s": ".2f",
                                                            "min T_actor s": ".2f", "predicted step s": ".2f"}))


if __name__ == "__main__":
    sys.exit(main(__doc__, STUDY, run))

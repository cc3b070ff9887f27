"""Referee study: the control — uniform routing and equal lengths, where the gains should vanish
and routepack must never lose.

    python experiments/control.py [--windows 4] [--presets a,b] [--quick] [--out DIR]

2 × ``--windows`` consecutive steps per preset, uniform and (for contrast) the default skewed
trace, both objectives. Common setting and flags: ``experiments/_lib/referee.py``. Writes
``experiments/results/control/control.{md,json}``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from _lib import report
from _lib.referee import OBJECTIVES, Planner, Setting, gains, header, main, three, write
from _lib.report import pct

from routepack_opt.core.evaluate import Evaluator

STUDY = "control"
COLUMNS = ("preset", "trace", "objective", "reorder gain mean (min)", "packing increment mean (min)",
           "total gain mean", "total gain min", "total gain max")


def run(st: Setting) -> Path:
    head = header(st, STUDY,
                  "Control: uniform expert popularity and equal lengths (`uniform=True`), "
                  f"{st.windows * 2} consecutive steps per preset. The referee's prediction: little "
                  "room beyond length-only packing, and routepack must not lose (min gain ≥ 0). For "
                  "contrast, the `skewed` rows repeat the same windows with the default skewed trace.")
    rows, records = [], []
    n = st.windows * 2
    for preset in st.presets:
        topo, cost = st.topology(preset), st.cost(preset)
        for trace, kw in (("uniform", {"uniform": True}), ("skewed", {})):
            per = {o: [] for o in OBJECTIVES}
            for t in range(n):
                w = st.window(preset, step=t, **kw)
                pl = Planner(w, topo, cost)
                ev = Evaluator(w, topo, cost)
                for o in OBJECTIVES:
                    g = gains(three(pl, ev, o, st.sweeps, st.seed))
                    rec = {"preset": preset, "trace": trace, "objective": o, "step": t, **g}
                    per[o].append(rec)
                    records.append(rec)
            for o in OBJECTIVES:
                a = {k: np.array([r[k] for r in per[o]]) for k in ("reorder", "packing", "total")}
                rows.append((preset, trace, o, f"{pct(a['reorder'].mean())} ({pct(a['reorder'].min())})",
                             f"{pct(a['packing'].mean())} ({pct(a['packing'].min())})",
                             a["total"].mean(), a["total"].min(), a["total"].max()))
            print(f"control {preset} {trace} done", flush=True)
        write(st, STUDY, head + _table(rows), records)
    uni = [r["total"] for r in records if r["trace"] == "uniform"]
    tail = ["", f"Uniform control over all presets and objectives: min total gain {pct(min(uni))}, "
            f"max {pct(max(uni))} (routepack ≥ baseline holds: {min(uni) >= 0})."]
    return write(st, STUDY, head + _table(rows) + tail, records)


def _table(rows) -> list[str]:
    return report.table(COLUMNS, rows, formats={c: pct for c in COLUMNS[5:]})


if __name__ == "__main__":
    sys.exit(main(__doc__, STUDY, run))

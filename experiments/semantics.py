"""Referee study: execution semantics (referee major 1) — how often and how much ``max-sum``
and ``sum-max`` disagree, and the cost of planning under the wrong one.

    python experiments/semantics.py [--windows 4] [--presets a,b] [--quick] [--out DIR]

Common setting and flags: ``experiments/_lib/referee.py``. Writes
``experiments/results/semantics/semantics.{md,json}``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from _lib import report
from _lib.referee import OBJECTIVES, Planner, Setting, header, main, write
from _lib.report import pct

from routepack_opt.core.evaluate import Evaluator

STUDY = "semantics"
COLUMNS = ("preset", "G", "windows", "pairs", "disagree", "loss if max-sum picks (mean / max)",
           "loss if sum-max picks, in max-sum (mean / max)", "max-sum plan run as sum-max", "sum-max plan run as max-sum")


def perturb(lengths, row, slot, rows: int, dp: int, cap: int, swaps: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """``swaps`` random capacity-keeping swaps of two samples in different cells (coverage and
    nonempty cells are kept by any swap)."""
    row, slot = row.copy(), slot.copy()
    cell = row * dp + slot
    tok = np.bincount(cell, weights=lengths, minlength=rows * dp)
    n, done, tries = lengths.size, 0, 0
    while done < swaps and tries < 50 * swaps:
        tries += 1
        i, j = rng.integers(0, n, 2)
        ci, cj = cell[i], cell[j]
        if ci == cj:
            continue
        d = lengths[j] - lengths[i]
        if tok[ci] + d > cap or tok[cj] - d > cap:
            continue
        tok[ci] += d
        tok[cj] -= d
        cell[i], cell[j] = cj, ci
        done += 1
    return cell // dp, cell % dp


def run(st: Setting) -> Path:
    head = header(st, STUDY,
                  "Referee major 1: `max-sum` (max_g Σ_r J, shards asynchronous) and `sum-max` "
                  "(Σ_r max_g J, rows synchronize) can rank layouts differently. Candidates per window: "
                  "the 4 baseline layouts, routepack under each objective at 2 budgets × 2 seeds, and "
                  "12 random capacity-keeping perturbations (1–32 swaps) of the max-sum plan. "
                  "`disagree` = share of candidate pairs (ties excluded) that the two objectives order "
                  "oppositely; `loss if max-sum picks` = for those pairs, how much worse in sum-max "
                  "makespan the max-sum-preferred layout is (mean / max). Cross-evaluation: plan under "
                  "one objective, execute under the other; loss relative to the plan made for the "
                  "executing semantics (negative: the other plan happened to be better).")
    rows, records = [], []
    budgets = (5, st.sweeps) if not st.quick else (st.sweeps,)
    for preset in st.presets:
        topo, cost = st.topology(preset), st.cost(preset)
        acc = {"pairs": 0, "dis": 0, "loss_ms": [], "loss_sm": [], "x_ms": [], "x_sm": []}
        for t in range(st.windows):
            w = st.window(preset, step=t)
            pl = Planner(w, topo, cost)
            ev = Evaluator(w, topo, cost)
            R = pl.rows
            cands = [(pl.ident, r, s) for r, s in pl.base.values()] + [(pl.lpt, r, s) for r, s in pl.base.values()]
            main_plan = {}
            for o in OBJECTIVES:
                for sw in budgets:
                    for sd in (0, 1):
                        r, s, _, _ = pl.routepack(o, sw, sd)
                        cands.append((pl.lpt, r, s))
                        if sw == st.sweeps and sd == 0:
                            main_plan[o] = (r, s)
            rng = np.random.default_rng([st.seed, t])
            for sw in (1, 2, 4, 8, 16, 32) * 2:
                r, s = perturb(w.lengths, *main_plan["max-sum"], R, topo.dp, topo.capacity, sw, rng)
                cands.append((pl.lpt, r, s))
            ms = np.array([ev.score(p, r, s, R, "max-sum").makespan for p, r, s in cands])
            sm = np.array([ev.score(p, r, s, R, "sum-max").makespan for p, r, s in cands])
            i, j = np.triu_indices(len(cands), 1)
            a, b = np.sign(ms[i] - ms[j]), np.sign(sm[i] - sm[j])
            valid = (a != 0) & (b != 0)
            dis = valid & (a != b)
            acc["pairs"] += int(valid.sum())
            acc["dis"] += int(dis.sum())
            for ii, jj in zip(i[dis], j[dis]):
                pick, other = (ii, jj) if ms[ii] < ms[jj] else (jj, ii)  # max-sum's choice
                acc["loss_ms"].append(sm[pick] / sm[other] - 1)
                pick, other = (ii, jj) if sm[ii] < sm[jj] else (jj, ii)  # sum-max's choice
                acc["loss_sm"].append(ms[pick] / ms[other] - 1)
            (rm, sm_) = main_plan["max-sum"]
            (rs, ss) = main_plan["sum-max"]
            x_ms = ev.score(pl.lpt, rm, sm_, R, "sum-max").makespan / ev.score(pl.lpt, rs, ss, R, "sum-max").makespan - 1
            x_sm = ev.score(pl.lpt, rs, ss, R, "max-sum").makespan / ev.score(pl.lpt, rm, sm_, R, "max-sum").makespan - 1
            acc["x_ms"].append(x_ms)
            acc["x_sm"].append(x_sm)
            records.append({"preset": preset, "step": t, "candidates": len(cands), "pairs": int(valid.sum()),
                            "disagree": int(dis.sum()), "maxsum_plan_as_summax": x_ms, "summax_plan_as_maxsum": x_sm})
        mean_max = lambda v: f"{pct(np.mean(v))} / {pct(np.max(v))}" if v else None  # noqa: E731
        rows.append((preset, topo.num_shards, st.windows, acc["pairs"], f"{100 * acc['dis'] / max(acc['pairs'], 1):.1f}%",
                     mean_max(acc["loss_ms"]), mean_max(acc["loss_sm"]),
                     f"{pct(np.mean(acc['x_ms']))} (max {pct(np.max(acc['x_ms']))})",
                     f"{pct(np.mean(acc['x_sm']))} (max {pct(np.max(acc['x_sm']))})"))
        print(f"semantics {preset} done", flush=True)
        write(st, STUDY, head + report.table(COLUMNS, rows), records)
    return write(st, STUDY, head + report.table(COLUMNS, rows), records)


if __name__ == "__main__":
    sys.exit(main(__doc__, STUDY, run))

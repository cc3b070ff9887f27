"""Referee study: peers — LPT vs EPLB-style balanced packing (no replication) vs exact
placement bounds; routepack vs the verl- and NeMo-style packing baselines.

    python experiments/peers.py [--windows 4] [--presets a,b] [--quick] [--out DIR]

Common setting and flags: ``experiments/_lib/referee.py``. Writes
``experiments/results/peers/peers.{md,json}``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
from _lib import report
from _lib.referee import Planner, Setting, header, main, write
from _lib.report import pct

from routepack_opt.core.evaluate import Evaluator
from routepack_opt.heuristics.baselines import BASELINES
from routepack_opt.heuristics.placement.lpt import lpt_placement

STUDY = "peers"
COLUMNS = ("preset", "L × E, P", "LPT ms", "LPT gap mean / max", "EPLB ms", "EPLB gap mean / max",
           "EPLB same as LPT", "LPT+swap ms", "LPT+swap gap mean / max", "exact gap max", "layers proved")
PACK_COLUMNS = ("preset", "packing", "max-sum / LB", "sum-max / LB", "gain over verl-kk (objective)", "time s")


def eplb_balanced_packing(weight_LE, num_packs: int):
    """DeepSeek EPLB's ``balanced_packing`` without replication (deepseek-ai/EPLB, eplb.py):
    per layer, items by decreasing weight, each to the lightest pack that still has room, every
    pack taking exactly E / num_packs items. Returns the placement [L, E] (slots filled in
    assignment order). Written like the original (torch sort, Python loop over items)."""
    import torch

    w = torch.as_tensor(np.asarray(weight_LE, dtype=np.float64))
    L, E = w.shape
    per = E // num_packs
    indices = w.sort(-1, descending=True).indices
    placement = np.empty((L, E), dtype=np.int64)
    for i in range(L):
        pack_weights = [0.0] * num_packs
        pack_items = [0] * num_packs
        for e in indices[i].tolist():
            pack = min((p for p in range(num_packs) if pack_items[p] < per), key=pack_weights.__getitem__)
            placement[i, e] = pack * per + pack_items[pack]
            pack_weights[pack] += float(w[i, e])
            pack_items[pack] += 1
    return placement


def _timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return out, 1e3 * (time.perf_counter() - t0)


def run(st: Setting, objective: str = "max-sum") -> Path:
    from routepack_opt.core.evaluate import expert_rank_loads
    from routepack_opt.heuristics.placement.lpt import swap_refine
    from routepack_opt.models.placement import exact_placement

    nwin = max(1, st.windows // 2)
    tl = 0.2 if st.quick else 0.5
    head = header(st, STUDY,
                  "Placement: LPT (Graham 1969, numba), EPLB-style balanced packing without "
                  "replication (DeepSeek EPLB's `balanced_packing` idea, torch + Python loop as in the "
                  "original; defined in this script), LPT + swap refinement (the pipeline's `lpt`), "
                  f"and the exact per-layer CP-SAT model ({tl} s/layer) giving a proved lower bound. "
                  "Gap = busiest rank / proved bound per layer (≥ 1). `same as LPT` = share of layers "
                  f"where EPLB's per-rank loads equal LPT's. {nwin} window(s) per preset.")
    pack_head = ["", "## Packing: routepack vs the verl- and NeMo-style baselines", "",
                 f"LPT+swap placement, R = R*, objective {objective}; makespans relative to the lower "
                 "bound (LB of docs/model.md, 1 = optimal); both objectives shown; time = wall time.", ""]
    rows, pack_rows, records = [], [], []
    for preset in st.presets:
        topo, cost = st.topology(preset), st.cost(preset)
        P = topo.ep
        acc = {k: [] for k in ("lpt_ms", "eplb_ms", "swap_ms", "lgap", "egap", "sgap", "xgap", "same", "proved")}
        pk = {}
        for t in range(nwin):
            w = st.window(preset, step=t)
            load = w.expert_loads()
            lpt_placement(load, P)  # warm (numba cache, torch import)
            eplb_balanced_packing(load[:1], P)
            lpt, ms = _timed(lpt_placement, load, P)
            acc["lpt_ms"].append(ms)
            ep_, ms = _timed(eplb_balanced_packing, load, P)
            acc["eplb_ms"].append(ms)
            sw, ms = _timed(swap_refine, load, lpt, P)
            acc["swap_ms"].append(ms)
            rep = exact_placement(load, P, sw, lpt, time_limit=tl)
            bound = rep.bound_L.astype(np.float64)
            peak = lambda pl: expert_rank_loads(load, pl, P).max(axis=1)  # noqa: E731
            acc["lgap"] += (peak(lpt) / bound).tolist()
            acc["egap"] += (peak(ep_) / bound).tolist()
            acc["sgap"] += (peak(sw) / bound).tolist()
            acc["xgap"] += rep.gap_L.tolist()
            acc["proved"] += [s == "optimal" for s in rep.status_L]
            same = np.all(np.sort(expert_rank_loads(load, lpt, P), axis=1)
                          == np.sort(expert_rank_loads(load, ep_, P), axis=1), axis=1)
            acc["same"] += same.tolist()
            # packing peers
            pl = Planner(w, topo, cost)
            ev = Evaluator(w, topo, cost)
            lb = ev.lower_bound(pl.lpt, pl.rows)
            lays = {}
            for name, fn in BASELINES.items():
                t0 = time.perf_counter()
                lays[name] = (*fn(w.lengths, topo, pl.rows), time.perf_counter() - t0)
            r, s, secs, _ = pl.routepack(objective, st.sweeps, st.seed)
            lays["routepack"] = (r, s, secs)
            base = ev.score(pl.lpt, *lays["verl-kk"][:2], pl.rows, objective).makespan
            for name, (r, s, secs) in lays.items():
                e = ev.evaluate(pl.lpt, r, s, pl.rows, objective)
                pk.setdefault(name, []).append((e.scores["max-sum"].makespan / lb, e.scores["sum-max"].makespan / lb,
                                                (base - e.score.makespan) / base, secs))
        mean_max = lambda v: f"{np.mean(v):.4f} / {np.max(v):.4f}"  # noqa: E731
        rows.append((preset, f"{st.layers_of(preset)} × {load.shape[1]}, {P}", np.mean(acc["lpt_ms"]),
                     mean_max(acc["lgap"]), np.mean(acc["eplb_ms"]), mean_max(acc["egap"]),
                     f"{100 * np.mean(acc['same']):.0f}%", np.mean(acc["swap_ms"]), mean_max(acc["sgap"]),
                     np.max(acc["xgap"]), f"{sum(acc['proved'])}/{len(acc['proved'])}"))
        for name, v in pk.items():
            v = np.array(v)
            pack_rows.append((preset, name, v[:, 0].mean(), v[:, 1].mean(), v[:, 2].mean(), v[:, 3].mean()))
        records.append({"preset": preset, **{k: list(map(float, v)) for k, v in acc.items()},
                        "packing": {k: np.array(v).tolist() for k, v in pk.items()}})
        print(f"peers {preset} done", flush=True)
        write(st, STUDY, head + _tables(rows, pack_head, pack_rows), records)
    return write(st, STUDY, head + _tables(rows, pack_head, pack_rows), records)


def _tables(rows, pack_head, pack_rows) -> list[str]:
    return (report.table(COLUMNS, rows, formats={"LPT ms": ".2f", "EPLB ms": ".1f", "LPT+swap ms": ".1f",
                                                 "exact gap max": ".4f"})
            + pack_head
            + report.table(PACK_COLUMNS, pack_rows, formats={"max-sum / LB": ".4f", "sum-max / LB": ".4f",
                                                             "gain over verl-kk (objective)": pct, "time s": ".2f"}))


if __name__ == "__main__":
    sys.exit(main(__doc__, STUDY, run))

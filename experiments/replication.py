"""Expert replication (issue 26): replicated plans against placement-only plans and EPLB.

    python experiments/replication.py [--samples 512 4096] [--ep 8 32 64] [--time-limit 4 15]
                                      [--quick] [--out DIR]

Windows: ``generate_window("deepseek-v3", N, seed, dispersion=1.25)`` (L=58, E=256, top-8, the
preset's calibrated per-layer skew), D = P (one EDP shard), capacity 8192, max-sum objective.
Per (N, P) and redundant ∈ {0, P, 2P} (one and two extra slots per rank):

- ``placement-only``: ``solve`` with LPT + swaps, no replicas (the same for every redundant);
- ``eplb+ours``: DeepSeek EPLB's replicas and packing of them (``eplb_placement``, the global
  policy re-implemented from github.com/deepseek-ai/EPLB, MIT) with our packing search;
- ``eplb+verl-kk`` / ``eplb+nemo-ffd``: EPLB's placement with the length-only packers;
- ``ours``: replicate the hottest experts, LPT on distinct ranks, swaps, then our packing search
  (``solve(..., redundant_experts=N)``).

Every plan is scored by the one evaluator under the even-local rule the runtime applies. Columns:
makespan / force-balanced lower bound (every rank gets 1/P of each layer's expert tokens in each
row), the median over (row, layer) of the EP-rank imbalance max/mean, and the planning time. Each
search runs under ``--time-limit`` (one per N); the record says what ran.

The replica-selection rule: on the ``ours`` plans at the smallest N the expert term is also
computed under two other rules — ``by-source`` (a source slot sends all its tokens of e to
replica q mod k, q its EP rank: intra-node-style locality) and ``fractional`` (each micro-batch's
tokens of e split exactly c/k per replica: the continuous even split, what an LP-planned integer
split could at best approach with these replicas).

Planning time with vs without replicas (``--timing-reps`` interleaved runs; ``--only-timing``
runs it alone into ``replication_timing.{jsonl,md}``): per N and P ∈ {32, 64}, ``solve`` with the
default budget (no time limit, no sweep cap), without and with P redundant slots.

Writes ``experiments/results/replication/{replication.jsonl, replication.md}``.
"""

from __future__ import annotations

import json
import statistics
import time

import numpy as np
from _lib import report, settings

from routepack_opt.core.cost import get_preset
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.core.layout import Layout
from routepack_opt.core.topology import Topology
from routepack_opt.heuristics.placement.replicate import eplb_placement
from routepack_opt.pipeline import baseline_layouts, certified_rows, solve
from routepack_opt.trace import generate_window

STUDY = "replication"
PRESET = "deepseek-v3"


def _metrics(ev: Evaluator, placement, layout: Layout, seconds: float, plan=None) -> dict:
    e = ev.evaluate_layout(placement, layout, "max-sum")
    _, _, M_RGL = ev.costs(placement, layout.row, layout.slot, layout.rows, parts=True)
    # the expert part alone (one shard): Σ_{r,l} max_p W against Σ_l (layer tokens / P)
    fb_expert = ev.window.expert_loads().sum() / ev.topology.ep
    out = {"makespan": e.score.makespan, "fb_bound": e.force_balanced_lower_bound,
           "gap_fb": e.gap_force_balanced, "expert_gap_fb": float(M_RGL.sum()) / fb_expert,
           "imb_median": e.imbalance.median, "imb_p90": e.imbalance.p90,
           "maxvio_mean": e.imbalance.maxvio_mean, "rows": layout.rows, "seconds": seconds}
    if plan is not None and plan.report.timings:
        out["plan_total_s"] = plan.report.timings.get("total")
        out["fallback"] = plan.report.fallback
    return out


def _rule_study(ev: Evaluator, plan) -> dict:
    """Makespan of ``plan`` under the even-local, by-source and fractional rules."""
    w, topo, pl = ev.window, ev.topology, plan.replicas
    R, D, P, L = plan.rows, topo.dp, topo.ep, w.num_layers
    J, A_SRG, M_RGL = ev.costs(pl, plan.row, plan.slot, R, parts=True)
    cell_N = plan.row * D + plan.slot
    C_XLE = np.zeros((R * D, L, w.num_experts), dtype=np.int64)
    np.add.at(C_XLE, cell_N, w.counts)
    rank_LEK, cnt_LE = pl.replica_ranks(), pl.logcnt
    q_D = np.empty(D, dtype=np.int64)
    q_D[topo.slots_of_shard()] = np.arange(P)[None, :]
    blk_X = (np.arange(R * D) // D) * topo.num_shards + topo.shard_array()[np.arange(R * D) % D]
    # by-source: every token of e from slot d goes to replica q_d mod k
    j_XLE = q_D[np.arange(R * D) % D][:, None, None] % cnt_LE[None]
    rank_XLE = np.take_along_axis(np.broadcast_to(rank_LEK[None], (R * D, *rank_LEK.shape)),
                                  j_XLE[..., None], axis=3)[..., 0]
    W = np.zeros((R * topo.num_shards, L, P), dtype=np.int64)
    np.add.at(W, (np.broadcast_to(blk_X[:, None, None], rank_XLE.shape),
                  np.broadcast_to(np.arange(L)[None, :, None], rank_XLE.shape), rank_XLE), C_XLE)
    # fractional: c / k to every replica
    F_LEP = pl.surrogate_rank_matrix()
    Wf = np.zeros((R * topo.num_shards, L, P))
    np.add.at(Wf, blk_X, np.einsum("xle,lep->xlp", C_XLE.astype(float), F_LEP))
    out = {"even-local": float(J.sum(axis=0).max())}
    for name, WW in (("by-source", W), ("fractional", Wf)):
        M = WW.reshape(R, topo.num_shards, L, P).max(axis=3)
        JJ = A_SRG.sum(axis=0) + ev.cost.gamma * M.sum(axis=2) + ev.cost.row_overhead
        out[name] = float(JJ.sum(axis=0).max())
    return out


def run_point(w, N: int, P: int, time_limit: float, seed: int, record) -> None:
    cost = get_preset(PRESET).cost
    base_topo = Topology(dp=P, ep=P, capacity=8192)
    R, full = certified_rows(w, base_topo, None, 10.0, "auto")
    t0 = time.perf_counter()
    only = solve(w, base_topo, cost, rows=R, certificate=full, time_limit=time_limit, seed=seed)
    t_only = time.perf_counter() - t0
    ev0 = Evaluator(w, base_topo, cost)
    for red in (0, P, 2 * P):
        topo = Topology(dp=P, ep=P, capacity=8192, redundant_experts=red)
        ev = Evaluator(w, topo, cost)
        row = {"N": N, "P": P, "D": P, "redundant": red, "time_limit": time_limit, "seed": seed}
        row["placement-only"] = _metrics(ev0, only.expert_placement, only.layout, t_only, only)
        if red == 0:
            record(row)
            continue
        t0 = time.perf_counter()
        eplb = eplb_placement(w.expert_loads(), P, w.num_experts + red)
        t_eplb = time.perf_counter() - t0
        t0 = time.perf_counter()
        base = baseline_layouts(w, topo, R, packing=full.packing_N)  # verl-kk, nemo-ffd at R
        t_base = (time.perf_counter() - t0) / max(len(base), 1)
        for name, lay in base.items():
            row[f"eplb+{name}"] = _metrics(ev, eplb, lay, t_eplb + t_base)
        t0 = time.perf_counter()
        pe = solve(w, topo, cost, placement=eplb, rows=R, certificate=full, time_limit=time_limit, seed=seed)
        row["eplb+ours"] = _metrics(ev, pe.expert_placement, pe.layout, t_eplb + time.perf_counter() - t0, pe)
        t0 = time.perf_counter()
        po = solve(w, topo, cost, rows=R, certificate=full, time_limit=time_limit, seed=seed)
        row["ours"] = _metrics(ev, po.expert_placement, po.layout, time.perf_counter() - t0, po)
        row["ours"]["replica_bytes_per_rank"] = po.report.evaluation.replica_bytes_per_rank
        if N <= 1024:
            row["rules"] = _rule_study(ev, po)
        record(row)


def timing_study(w, P: int, reps: int, seed: int) -> dict:
    """``solve`` with the default budget (no time limit, no sweep cap: what a caller gets),
    without and with P redundant slots, interleaved ``reps`` times (the 2-core host is noisy):
    the median totals, their ratio, and the stages of the median run."""
    cost = get_preset(PRESET).cost
    R, full = certified_rows(w, Topology(dp=P, ep=P, capacity=8192), None, 10.0, "auto")
    runs: dict[int, list[dict]] = {0: [], P: []}
    for _ in range(reps):
        for red in (0, P):
            topo = Topology(dp=P, ep=P, capacity=8192, redundant_experts=red)
            p = solve(w, topo, cost, rows=R, certificate=full, seed=seed)
            runs[red].append({"timings": dict(p.report.timings or {}),
                              "gap_fb": p.report.evaluation.gap_force_balanced,
                              "notes": p.report.notes.get("replicas", {})})
    out = {"N": w.num_samples, "P": P, "reps": reps}
    for red, rs in runs.items():
        rs = sorted(rs, key=lambda r: r["timings"]["total"])
        med = rs[len(rs) // 2]
        out[str(red)] = {"totals": [r["timings"]["total"] for r in runs[red]], "median_s": med["timings"]["total"],
                         "stages": med["timings"], "gap_fb": med["gap_fb"], "notes": med["notes"]}
    out["ratio"] = out[str(P)]["median_s"] / out["0"]["median_s"]
    return out


COLS = ("placement-only", "eplb+verl-kk", "eplb+nemo-ffd", "eplb+ours", "ours")


def render(rows: list[dict], timing: list[dict]) -> list[str]:
    lines = ["# Expert replication: DeepSeek-V3-shaped windows (issue 26)", "",
             "Generated by `experiments/replication.py` (see its docstring for the setting). "
             "Makespan / force-balanced lower bound (max-sum, one shard: D = P); every plan is "
             "scored by the one evaluator under the even-local replica rule. "
             "`expert gap`: the expert part alone, Σ_(row, layer) max_p W over Σ_layer tokens / P. "
             "`imb` = median over (row, layer) of max/mean EP-rank load. `plan s`: the plan's own "
             "`timings.total` (numba warm-up excluded). One window per N (seed 0); "
             "time limits per plan: N = 512 6 s, N = 4096 20 s, on the shared 2-core machine.", ""]
    cols = ["N", "P", "red", *[f"{c} gap" for c in COLS], "ours expert gap", "eplb+ours expert gap",
            "ours imb", "eplb+ours imb", "placement-only imb", "ours plan s", "placement-only plan s"]
    body = []
    for r in rows:
        g = [r[c]["gap_fb"] if c in r else None for c in COLS]

        def get(name, key, r=r):
            return r[name].get(key) if name in r else None

        body.append([r["N"], r["P"], r["redundant"], *g, get("ours", "expert_gap_fb"),
                     get("eplb+ours", "expert_gap_fb"), get("ours", "imb_median"),
                     get("eplb+ours", "imb_median"), get("placement-only", "imb_median"),
                     get("ours", "plan_total_s"), get("placement-only", "plan_total_s")])
    fmt = {k: report.num(".4f") for k in cols[3:13]}
    fmt.update({k: report.num(".2f") for k in cols[13:]})
    lines += report.table(cols, body, fmt)
    rule_rows = [r for r in rows if "rules" in r]
    if rule_rows:
        lines += ["", "## Replica-selection rule (the `ours` plans, makespan / force-balanced bound)", ""]
        body = [[r["N"], r["P"], r["redundant"]] + [r["rules"][k] / r["ours"]["fb_bound"]
                                                    for k in ("even-local", "by-source", "fractional")]
                for r in rule_rows]
        lines += report.table(["N", "P", "red", "even-local", "by-source", "fractional"], body,
                              {k: report.num(".4f") for k in ("even-local", "by-source", "fractional")})
    if timing:
        lines += ["", "## Planning time with vs without replicas (the default budget: no time limit, no sweep cap)", "",
                  "Median `timings.total` of interleaved runs (one redundant slot per rank), and the stages "
                  "of the median run: `start` = the row-aware replica moves for the best seed's packing, "
                  "`moves` = those for the packing found.", ""]
        cols = ["N", "P", "runs", "without s", "with s", "with / without", "seeds s", "start s", "anneal s",
                "moves s", "gap without", "gap with"]
        body = []
        for t in timing:
            P = str(t["P"])
            st = t[P]["stages"]
            body.append([t["N"], t["P"], t["reps"], t["0"]["median_s"], t[P]["median_s"], t["ratio"],
                         st.get("seeds", 0.0), st.get("replicas-start", 0.0), st.get("anneal", 0.0),
                         st.get("replicas", 0.0), t["0"]["gap_fb"], t[P]["gap_fb"]])
        lines += report.table(cols, body, {k: report.num(".2f") for k in cols[3:10]}
                              | {k: report.num(".4f") for k in cols[10:]})
    return lines


def main() -> None:
    ap = settings.parser(__doc__)
    ap.add_argument("--samples", type=int, nargs="+", default=[512, 4096])
    ap.add_argument("--ep", type=int, nargs="+", default=[8, 32, 64])
    ap.add_argument("--time-limit", type=float, nargs="+", default=[4.0, 15.0],
                    help="search time limit per plan, one per --samples value")
    ap.add_argument("--timing-reps", type=int, default=3, help="interleaved runs per point of the timing study")
    ap.add_argument("--only-timing", action="store_true", help="run only the timing study")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--render", nargs="+", metavar="JSONL",
                    help="only write the markdown from these records (concatenated)")
    settings.add_seed(ap)
    settings.add_quick(ap)
    settings.add_out(ap, STUDY)
    args = ap.parse_args()
    if args.render:
        rows, timing = [], []
        for path in args.render:
            for line in open(path):
                r = json.loads(line)
                if "timing" not in r:
                    rows.append(r)
                elif "ratio" in r["timing"]:  # the default-budget study (older records: other budgets)
                    timing.append(r["timing"])
        report.write_md(settings.results_dir(STUDY, args.out) / "replication.md", render(rows, timing))
        return
    if args.quick:
        args.samples, args.ep, args.time_limit = [128], [8], [1.0]
    out = settings.results_dir(STUDY, args.out)
    name = "replication_timing" if args.only_timing else "replication"
    rec_path = out / f"{name}.jsonl"
    rows: list[dict] = []
    with open(rec_path, "w") as fh:
        def record(row):
            rows.append(row)
            fh.write(json.dumps(row) + "\n")
            fh.flush()
            print(json.dumps({k: (v["gap_fb"] if isinstance(v, dict) and "gap_fb" in v else v)
                              for k, v in row.items() if k != "rules"}), flush=True)

        for N, tl in zip(args.samples, [] if args.only_timing else args.time_limit):
            w = generate_window(PRESET, N, args.seed, dispersion=1.25)
            for P in args.ep:
                run_point(w, N, P, tl, args.seed, record)
        timing = []
        if not args.no_timing and not args.quick:
            for N in args.samples:
                w = generate_window(PRESET, N, args.seed, dispersion=1.25)
                for P in (p for p in args.ep if p > 8):
                    t = timing_study(w, P, args.timing_reps, args.seed)
                    timing.append(t)
                    fh.write(json.dumps({"timing": t}) + "\n")
                    print(json.dumps({k: t[k] for k in ("N", "P", "ratio")}), flush=True)
    report.write_md(out / f"{name}.md", render(rows, timing))
    if rows:
        ours = [r["ours"]["gap_fb"] for r in rows if "ours" in r]
        print("median gap (ours)", statistics.median(ours) if ours else None)


if __name__ == "__main__":
    main()

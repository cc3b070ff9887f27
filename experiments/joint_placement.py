"""Joint (row-aware) expert placement vs routepack (LPT + packing), with migration cost (issue 8).

    python experiments/joint_placement.py [--samples 1024] [--seed 0] [--steps 4]
                                          [--presets SPEC,...] [--parts 1,3,4] [--quick]

Per preset (its L, E, k, D, P, capacity and derived cost model) on ``trace.generate_window``:

Part 1 — one window, both objectives. ``routepack`` = LPT placement + population annealing seeded
with the length-only baselines (the pipeline's default budget). ``joint`` = ``joint_search`` from
that plan (alternating row-aware placement refinement and annealing). Reported: makespans and
their change, the expert part Σ γ·max_p W, the docs/model.md lower bound for each placement (LPT is
aggregate-optimal-ish; the joint placement trades aggregate balance for row-local balance, so its
bound can rise), experts/bytes moved from the LPT placement, wall time. ``refine@kk``: the
refinement alone on the length-only (verl-kk) packing — the setting of the issue's quick test.

Part 2 — perturbed routing: both plans, made on window t, are executed on the *same samples*
routed by a policy ``s`` updates later (``routing_step = t + s``; the generator's drift random
walk plus fresh multinomial draws) — does the joint gain survive replay error?

Part 3 — a drifting sequence of steps (``generate_sequence``): per step, the placement in force
is the previous step's; strategies ``static`` (step-0 LPT kept; packing only), ``routepack`` (LPT
every step), ``joint`` (joint every step, migration ignored) and ``joint-sticky`` (joint with the
current placement: makespan + migration time). Reported per strategy over steps 1..S-1: Σ
makespan, Σ migration time, Σ (makespan + migration), bytes moved.

Writes ``experiments/results/joint_placement/joint_placement.{md,json}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np
from _lib import report, settings

from routepack_opt.core.cost import get_preset
from routepack_opt.core.errors import InfeasibleError
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.core.topology import Topology
from routepack_opt.heuristics.anneal import AnnealConfig, anneal
from routepack_opt.heuristics.baselines import BASELINES, verl_kk_layout
from routepack_opt.heuristics.placement.joint import JointConfig, joint_search
from routepack_opt.heuristics.placement.lpt import lpt_placement
from routepack_opt.heuristics.placement.migration import align_slots, migration_cost
from routepack_opt.heuristics.placement.refine import RefineConfig, refine_placement
from routepack_opt.trace import generate_sequence, generate_window

PRESETS = ("olmoe-1b-7b", "qwen3-30b-a3b", "ling-hybrid", "deepseek-v3")
OBJECTIVES = ("max-sum", "sum-max")
OUT = settings.RESULTS / "joint_placement" / "joint_placement.md"


def parse_spec(spec: str) -> tuple[str, dict]:
    """``preset[:key=value,...]`` — trace overrides, e.g. ``qwen3-30b-a3b:num_experts=256``."""
    name, _, rest = spec.partition(":")
    over = {}
    for kv in filter(None, rest.split("+")):
        k, _, v = kv.partition("=")
        over[k] = int(v) if v.lstrip("-").isdigit() else float(v)
    return name, over


def setup(preset: str):
    cfg = get_preset(preset).config
    return Topology(dp=cfg.dp, ep=cfg.ep, capacity=cfg.capacity), get_preset(preset).cost


def min_rows(window, topo) -> int:
    """R*: the certifier when present, else the least R with a feasible baseline layout."""
    try:
        from routepack_opt.certify import certify_rows
        return int(certify_rows(window, topo, time_limit=10.0).rows)
    except ImportError:
        R = max(1, int(np.ceil(window.lengths.sum() / (topo.capacity * topo.dp))))
        while True:
            try:
                verl_kk_layout(window.lengths, topo, R)
                return R
            except InfeasibleError:
                R += 1


def seeds_for(window, topo, R):
    out = []
    for fn in BASELINES.values():
        try:
            out.append(fn(window.lengths, topo, R))
        except InfeasibleError:
            pass
    return out


def routepack(window, topo, cost, R, objective, seed, placement=None, anneal_cfg=None):
    """LPT (or the given placement) + population annealing from the baseline layouts."""
    t0 = time.perf_counter()
    pl = lpt_placement(window.expert_loads(), topo.ep) if placement is None else placement
    ev = Evaluator(window, topo, cost)
    res = anneal(window.lengths, ev.rank_loads(pl), topo, cost, R, objective, seeds_for(window, topo, R),
                 config=anneal_cfg, seed=seed)
    return pl, np.asarray(res.row), np.asarray(res.slot), time.perf_counter() - t0


def expert_part(ev, pl, row, slot, R):
    _, _, M = ev.costs(pl, row, slot, R, parts=True)
    return ev.cost.gamma * float(M.sum())


def pct(a, b):
    return 100.0 * (a / b - 1.0) if b else float("nan")


def part1_2(presets, N, seed, joint_cfg, anneal_cfg, max_rounds, stale_steps):
    rows1, rows2, raw = [], [], []
    for spec in presets:
        preset, over = parse_spec(spec)
        topo, cost = setup(preset)
        w = generate_window(preset, N, seed, step=0, **over)
        R = min_rows(w, topo)
        ev = Evaluator(w, topo, cost)
        perturbed = {s: generate_window(preset, N, seed, step=0, routing_step=s, **over) for s in stale_steps}
        for obj in OBJECTIVES:
            pl, row, slot, t_rp = routepack(w, topo, cost, R, obj, seed, anneal_cfg=anneal_cfg)
            jr = joint_search(w, topo, cost, R, obj, pl, (row, slot), seed=seed,
                              config=dataclasses.replace(joint_cfg, max_rounds=max_rounds))
            e_rp = ev.evaluate(pl, row, slot, R, obj)
            e_j = ev.evaluate(jr.placement, jr.row, jr.slot, R, obj)
            assert e_j.score.key <= e_rp.score.key
            x_rp, x_j = expert_part(ev, pl, row, slot, R), expert_part(ev, jr.placement, jr.row, jr.slot, R)
            # the setting: refinement alone on the length-only packing
            kr, ks = verl_kk_layout(w.lengths, topo, R)
            rf = refine_placement(w, topo, cost, pl, kr, ks, R, obj, seed=seed)
            kk0 = ev.score(pl, kr, ks, R, obj).makespan
            kk1 = ev.score(rf.placement, kr, ks, R, obj).makespan
            mig = jr.migration  # vs the LPT placement (no current placement given)
            rec = {"preset": spec, "objective": obj, "R": R, "rp": e_rp.score.makespan,
                   "joint": e_j.score.makespan, "d_mk": pct(e_j.score.makespan, e_rp.score.makespan),
                   "d_expert": pct(x_j, x_rp), "expert_share": x_rp / e_rp.score.total,
                   "lb_rp": e_rp.lower_bound, "lb_j": e_j.lower_bound,
                   "d_lb": pct(e_j.lower_bound, e_rp.lower_bound), "gap_rp": e_rp.gap, "gap_j": e_j.gap,
                   "moved": mig.experts_moved, "moved_frac": mig.experts_moved / pl.size,
                   "bytes_total": mig.bytes_total, "mig_us": mig.time_us,
                   "t_rp": t_rp, "t_joint": jr.stats["wall_s"], "rounds": jr.stats["rounds"],
                   "kk_refine": pct(kk1, kk0), "kk_refine_s": rf.wall_s}
            rows1.append(rec)
            for s, wp in perturbed.items():
                evp = Evaluator(wp, topo, cost)
                a = evp.score(pl, row, slot, R, obj).makespan
                b = evp.score(jr.placement, jr.row, jr.slot, R, obj).makespan
                rows2.append({"preset": spec, "objective": obj, "stale": s, "rp": a, "joint": b,
                              "d_mk": pct(b, a), "d_plan": rec["d_mk"]})
            raw.append(rec)
            print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in rec.items()}),
                  file=sys.stderr, flush=True)
    return rows1, rows2


def part3(spec, N, seed, steps, objective, joint_cfg, anneal_cfg, max_rounds):
    """Drifting sequence: placement in force = the previous step's (module doc)."""
    preset, over = parse_spec(spec)
    topo, cost = setup(preset)
    seq = generate_sequence(preset, N, steps, seed, **over)
    strategies = ("static", "routepack", "joint", "joint-sticky")
    cur = {}
    acc = {s: {"mk": 0.0, "mig": 0.0, "bytes": 0.0, "moved": 0, "wall": 0.0} for s in strategies}
    for t, w in enumerate(seq):
        R = min_rows(w, topo)
        lpt = lpt_placement(w.expert_loads(), topo.ep)
        for s in strategies:
            t0 = time.perf_counter()
            prev = cur.get(s)
            if s == "static" and prev is not None:
                pl, row, slot, _ = routepack(w, topo, cost, R, objective, seed + t, placement=prev,
                                             anneal_cfg=anneal_cfg)
            else:
                pl0 = lpt if prev is None else align_slots(lpt, prev, topo.ep)
                pl, row, slot, _ = routepack(w, topo, cost, R, objective, seed + t, placement=pl0,
                                             anneal_cfg=anneal_cfg)
                if s in ("joint", "joint-sticky"):
                    sticky = s == "joint-sticky" and prev is not None
                    jr = joint_search(w, topo, cost, R, objective, pl, (row, slot), seed=seed + t,
                                      config=dataclasses.replace(joint_cfg, max_rounds=max_rounds),
                                      current_placement=prev if sticky else None)
                    pl, row, slot = jr.placement.permutation(), jr.row, jr.slot
                if prev is not None:
                    pl = align_slots(pl, prev, topo.ep)
            wall = time.perf_counter() - t0
            mk = Evaluator(w, topo, cost).score(pl, row, slot, R, objective).makespan
            if prev is not None:  # step 0 sets every strategy's starting placement
                m = migration_cost(prev, pl, topo, cost)
                a = acc[s]
                a["mk"] += mk; a["mig"] += m.time_us; a["bytes"] += m.bytes_total
                a["moved"] += m.experts_moved; a["wall"] += wall
            cur[s] = pl
        print(f"{spec} {objective} step {t} done", file=sys.stderr, flush=True)
    return acc


def part4(seed, time_limit, anneal_cfg):
    """Per-layer gap of the converged refinement, proved by the exact per-layer CP-SAT model."""
    from routepack_opt.heuristics.placement.refine import RowAwareState
    from routepack_opt.models.placement_rowaware import layer_gaps

    cases = [("small: L=4, E=16, k=4, P=4, D=8, N=64", "olmoe-1b-7b",
              dict(num_layers=4, num_experts=16, top_k=4), Topology(dp=8, ep=4, capacity=4096), 64, None),
             ("olmoe-1b-7b: L=16, E=64, k=8, P=8, D=16, N=256 (first 4 layers)", "olmoe-1b-7b", {},
              None, 256, [0, 1, 2, 3])]
    out = []
    for label, preset, over, topo, N, layers in cases:
        topo0, cost = setup(preset)
        topo = topo or topo0
        w = generate_window(preset, N, seed, **over)
        R = min_rows(w, topo)
        for obj in OBJECTIVES:
            pl, row, slot, _ = routepack(w, topo, cost, R, obj, seed, anneal_cfg=anneal_cfg)
            rf = refine_placement(w, topo, cost, pl, row, slot, R, obj, seed=seed,
                                  config=RefineConfig(max_passes=100))
            st = RowAwareState(w, topo, cost, rf.placement, row, slot, R, obj)
            gaps = layer_gaps(st, layers=layers, time_limit=time_limit)
            out.append({"case": label, "objective": obj, "R": R, "converged": rf.converged,
                        "layers": gaps})
            print(label, obj, [(g["status"], round(g["gap"], 6)) for g in gaps], file=sys.stderr, flush=True)
    return out


DEFAULT_PRESETS = PRESETS + ("qwen3-30b-a3b:num_experts=256",
                             "qwen3-30b-a3b:domain_strength=1.2+group_noise=0.6")


PP = report.num("+.2f", suffix="%")  # a change already in percent: +1.23%
GB = report.num(".1f", per=1e9)  # bytes as GB


def render(res: dict) -> str:
    """The markdown of ``res`` (the record written to joint_placement.json)."""
    L = ["# Joint (row-aware) expert placement vs routepack", ""]
    for part, meta in sorted(res.get("meta", {}).items()):
        L.append(f"- part {part}: `{meta['command']}` — {meta['seconds']:.0f} s on the shared 2-core "
                 "box (wall times are indicative only)")
    L += ["", "Windows from `trace.generate_window(preset, N, seed, **overrides)` (`preset:key=value+...` "
          "names the overrides); topology (D, P, C) and cost model are the preset's; R = R*. "
          "routepack = LPT + population annealing (default budget, seeded with the length-only "
          "baselines); joint = `joint_search` from the routepack plan (rounds of placement refinement "
          "+ annealing). Δ are joint vs routepack. Moves are relative to the LPT placement with rank "
          "labels and slots aligned (moved = experts changing rank); GB = all G shards; migration µs = "
          "busiest rank's received bytes / bandwidth (preset: expert weights + Adam state, 50 GB/s). "
          "`refine@kk` = the refinement alone on the length-only (verl-kk) packing.", ""]
    if "1" in res:
        d = [r["d_mk"] for r in res["1"]]
        x = [r["d_expert"] for r in res["1"]]
        lb = [r["d_lb"] for r in res["1"]]
        closed = [(r["gap_rp"] - r["gap_j"]) / (r["gap_rp"] - 1) * 100 for r in res["1"] if r["gap_rp"] > 1]
        L += ["## Reading", "",
              f"- joint vs routepack on one window: makespan {min(d):+.2f}% … {max(d):+.2f}%, expert part "
              f"{min(x):+.2f}% … {max(x):+.2f}%, while the placement's lower bound moves {min(lb):+.2f}% … "
              f"{max(lb):+.2f}% — the gap of each plan to its own placement's LB shrinks by {min(closed):.0f}–{max(closed):.0f}% "
              "(routepack → joint). The gain grows with co-activation (the `domain_strength`/"
              "`group_noise` row). Routepack is already within 3–6% of the LB here, which caps what any "
              "placement can add; the issue's quick test (−9% expert part, −8% makespan) is not reproduced "
              "on these traces (`refine@kk`, the refinement on a length-only packing, is the closest setting).",
              "- Perturbed routing (part 2): most of the gain survives one policy update of drift and a "
              "smaller part survives four.",
              "- Migration (parts 1, 3): with the preset's figures (≈1.3–2 ms per expert on the busiest "
              "rank), moving ~half the experts to the joint placement costs more than one step's gain; "
              "re-running LPT every step moves most experts and loses 6–10% of the step time to migration "
              "on a drifting sequence. The sticky joint search (makespan + migration) moves almost nothing "
              "and beats both LPT-every-step and a frozen placement.", ""]
        L += ["## 1. One window, both objectives", "",
              *report.table(
                  ["preset", "obj", "R", "routepack µs", "joint µs", "Δ makespan", "Δ expert part", "expert share",
                   "LB routepack", "Δ LB", "gap rp → joint", "experts moved", "GB moved", "migration µs",
                   "t routepack s", "t joint s", "rounds", "refine@kk Δ"],
                  [(r["preset"], r["objective"], r["R"], r["rp"], r["joint"], r["d_mk"], r["d_expert"],
                    r["expert_share"], r["lb_rp"], r["d_lb"], f"{r['gap_rp']:.3f} → {r['gap_j']:.3f}",
                    f"{r['moved']} ({100 * r['moved_frac']:.0f}%)", r["bytes_total"], r["mig_us"], r["t_rp"],
                    r["t_joint"], r["rounds"], r["kk_refine"]) for r in res["1"]],
                  formats={"routepack µs": ".4g", "joint µs": ".4g", "Δ makespan": PP, "Δ expert part": PP,
                           "expert share": report.num(".0f", 100, "%"), "LB routepack": ".4g", "Δ LB": PP,
                           "GB moved": GB, "migration µs": ".3g", "t routepack s": ".1f", "t joint s": ".1f",
                           "refine@kk Δ": PP})]
        L += ["", "## 2. Plan on window t, execute with perturbed routing (same samples, routing_step = t + s)", "",
              *report.table(["preset", "obj", "s", "routepack µs", "joint µs", "Δ makespan executed", "Δ planned"],
                            [(r["preset"], r["objective"], r["stale"], r["rp"], r["joint"], r["d_mk"], r["d_plan"])
                             for r in res["2"]],
                            formats={"routepack µs": ".4g", "joint µs": ".4g", "Δ makespan executed": PP,
                                     "Δ planned": PP})]
    if "3" in res:
        rows = []
        for item in res["3"]:
            acc = item["acc"]
            base = acc["routepack"]["mk"] + acc["routepack"]["mig"]
            for s_, a in acc.items():
                tot = a["mk"] + a["mig"]
                rows.append((item["preset"], item["objective"], s_, a["mk"], a["mig"], tot, pct(tot, base),
                             a["moved"], a["bytes"], a["wall"]))
        L += ["", "## 3. Drifting sequence (totals over steps 1..S-1; the placement in force is the "
              "strategy's previous one)", "",
              *report.table(["preset", "obj", "strategy", "Σ makespan µs", "Σ migration µs",
                             "Σ (makespan + migration) µs", "vs routepack", "experts moved", "GB moved", "wall s"],
                            rows, formats={"Σ makespan µs": ".4g", "Σ migration µs": ".3g",
                                           "Σ (makespan + migration) µs": ".4g", "vs routepack": PP,
                                           "GB moved": GB, "wall s": ".1f"})]
    if "4" in res:
        L += ["", "## 4. Per-layer gap of the converged refinement (exact per-layer CP-SAT, other layers fixed)", "",
              "gap = local-search layer makespan / proved bound − 1 (bound net of the integer-scaling error).", "",
              *report.table(["case", "obj", "R", "refinement converged", "layer", "local search µs", "exact µs",
                             "status", "gap"],
                            [(c["case"], c["objective"], c["R"], str(c["converged"]), g["layer"], g["local_search"],
                              g["exact"], g["status"], g["gap"]) for c in res["4"] for g in c["layers"]],
                            formats={"local search µs": ".6g", "exact µs": ".6g", "gap": ".2e"})]
    return "\n".join(L) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--presets", default=",".join(DEFAULT_PRESETS))
    ap.add_argument("--seq-presets", default="olmoe-1b-7b,qwen3-30b-a3b")
    ap.add_argument("--parts", default="1,3,4", help="1 (with 2), 3, 4")
    ap.add_argument("--gap-time-limit", type=float, default=20.0)
    ap.add_argument("--quick", action="store_true", help="small budgets (smoke run)")
    ap.add_argument("-o", "--output", default=str(OUT))
    args = ap.parse_args(argv)
    parts = set(args.parts.split(","))
    out_md = Path(args.output)
    out_json = out_md.with_suffix(".json")
    res = json.loads(out_json.read_text()) if out_json.exists() else {}
    res.setdefault("meta", {})
    presets = [p for p in args.presets.split(",") if p]
    anneal_cfg = AnnealConfig(population=8, temperatures=8, sweeps=8) if args.quick else AnnealConfig()
    joint_cfg = JointConfig(refine=RefineConfig(max_passes=2 if args.quick else 4))
    cmd = "python experiments/joint_placement.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if "1" in parts:
        t0 = time.perf_counter()
        res["1"], res["2"] = part1_2(presets, args.samples, args.seed, joint_cfg, anneal_cfg, args.rounds, (1, 4))
        res["meta"]["1-2"] = {"command": cmd, "seconds": time.perf_counter() - t0}
    if "3" in parts:
        t0 = time.perf_counter()
        res["3"] = []
        for p in [p for p in args.seq_presets.split(",") if p]:
            for obj in OBJECTIVES:
                acc = part3(p, args.samples, args.seed, args.steps, obj, joint_cfg, anneal_cfg, args.rounds)
                res["3"].append({"preset": p, "objective": obj, "steps": args.steps, "acc": acc})
        res["meta"]["3"] = {"command": cmd, "seconds": time.perf_counter() - t0}
    if "4" in parts:
        t0 = time.perf_counter()
        res["4"] = part4(args.seed, args.gap_time_limit, anneal_cfg)
        res["meta"]["4"] = {"command": cmd, "seconds": time.perf_counter() - t0}
    out_md.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(out_json, json.dumps(res, indent=1, default=float))
    text = render(res)
    report.write_text(out_md, text)
    print(text)


if __name__ == "__main__":
    main()

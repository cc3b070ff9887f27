"""Realistic routing (issue 15): the generator before/after calibration next to real figures, the
headline gains on calibrated windows, and every gain as a function of dispersion and skew.

    python experiments/realism.py [--samples 512] [--seed 0] [--quick]

Part 1 — calibration. Routing dispersion at 64 tokens (``routepack_opt.stats``) and the median
busiest/mean expert load per layer, per preset: *before* = the pre-issue-15 generator parameters
(log-popularity sd 0.7, domain/group/sample logit sd 0.6/0.3/0.3, no dispersion target; today's
block-keyed random streams, so not bit-identical to old files), *after* = today's defaults (the
calibrated single-task setting), and the ``--domains olmoe`` mixture (real OLMoE domain profiles).
Real references: one web-text stream 1.18 (i.i.d. tokens 0.89); mixed domains ≈ 3–6; skew OLMoE
2.5–7.8 per domain and layer, DeepSeek-V3/R1 serving median 5–8 (max 13.7), Mixtral 1.1–1.3.

Part 1b — the knob: ``--dispersion`` targets 1 → 10 against the dispersion measured on fresh
windows (another seed, all layers), per preset.

Part 2 — headline on calibrated windows, per preset (its L, E, k, D, P, C and derived cost) and
both objectives: gains over the length-only baseline (identity placement + verl-KK packing) of
``reorder`` (LPT + the same packing), ``packing`` (identity placement + population annealing),
``routepack`` (LPT + annealing) and ``joint`` (row-aware placement searched with packing) — all
from ``routepack_opt.compare.compare_plans`` plus the packing row through ``pipeline.solve`` — the
gap of each plan to its placement's lower bound, and plan times (default budgets).

Part 3 — sensitivity: the same gains on one preset pair as the dispersion target runs over
1 → 10 (at the preset's skew) and as the skew target runs over 1.5 → 9 (at dispersion 1.2); the
x axis is the *measured* figure. Where joint placement stops paying: its makespan gain over
routepack against its extra planning time.

Size: one seed, N = 512 (the referee studies use more); the box is a shared 2-core machine, so
plan times are pessimistic. Writes ``experiments/results/realism/realism.{md,json}`` and three plots.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np
from _lib import settings
from _lib.report import num, table, write_text

from routepack_opt.compare import compare_plans, plan_metrics
from routepack_opt.core.cost import PRESETS, resolve_cost
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.core.topology import Topology
from routepack_opt.pipeline import solve
from routepack_opt.stats import routing_dispersion, skew_stats
from routepack_opt.trace import DEFAULT_DISPERSION, PRESET_SKEW, generate_window

RESULTS = settings.RESULTS / "realism"
LEGACY = dict(expert_skew=0.7, domain_strength=0.6, group_noise=0.3, sample_noise=0.3)
PLANS = ("reorder", "packing", "routepack", "joint")
REAL_DISPERSION = {"one web-text stream (64 experts, top-6)": 1.18, "i.i.d. tokens, same aggregate": 0.89}


@dataclasses.dataclass
class Setting:
    samples: int = 512
    seed: int = 0
    presets: tuple[str, ...] = tuple(PRESETS)
    sens_presets: tuple[str, ...] = ("olmoe-1b-7b", "qwen3-30b-a3b")
    dispersions: tuple[float, ...] = (1.0, 1.2, 2.0, 3.0, 5.0, 7.0, 10.0)
    skews: tuple[float, ...] = (1.5, 3.0, 4.5, 6.5, 9.0)
    cal_samples: int = 384
    mapping_targets: tuple[float, ...] = (1.0, 1.2, 2.0, 5.0, 10.0)
    max_sweeps: int | None = None  # None: the planner's default budget
    overrides: dict = dataclasses.field(default_factory=dict)  # trace overrides (quick mode)
    out: Path = RESULTS


def measure(w) -> dict:
    rd = routing_dispersion(w, 64)
    return {"dispersion": rd["median"], "dispersion_mean": rd["mean"],
            "skew": skew_stats(w)["max_over_mean"]["median"]}


def calibration(st: Setting) -> list[dict]:
    rows = []
    for preset in st.presets:
        variants = [("before", LEGACY), ("after", {})]
        if PRESETS[preset].config.experts == 64:
            variants.append(("domains=olmoe", {"domains": "olmoe"}))
        for label, over in variants:
            w = generate_window(preset, st.cal_samples, seed=st.seed, **{**st.overrides, **over})
            rows.append({"preset": preset, "variant": label, **measure(w)})
            print(f"calibration {preset} {label}: {rows[-1]}", flush=True)
    return rows


def knob_mapping(st: Setting) -> list[dict]:
    """The --dispersion knob: target → measured dispersion (and the logit scale it resolved to)."""
    from routepack_opt.trace import routing_scale, trace_config

    rows = []
    for preset in st.presets:
        for target in st.mapping_targets:
            over = {**st.overrides, "dispersion": target}
            w = generate_window(preset, st.cal_samples, seed=st.seed + 1, **over)
            rows.append({"preset": preset, "target": target,
                         "scale": routing_scale(trace_config(preset, **over)), **measure(w)})
    return rows


def gains(preset: str, st: Setting, objective: str, **over) -> dict:
    """One calibrated window: every plan's gain over the baseline, its gap and its plan time."""
    cfg = PRESETS[preset].config
    w = generate_window(preset, st.samples, seed=st.seed, **{**st.overrides, **over})
    topo = Topology(cfg.dp, cfg.ep, cfg.capacity)
    cost = resolve_cost(preset)
    table, plans = compare_plans(w, topo, cost, objective=objective, seed=st.seed, max_sweeps=st.max_sweeps,
                                 exact=False, joint=True)
    rows = {m["name"]: m for m in table}
    ev = Evaluator(w, topo, cost)
    t0 = time.perf_counter()
    rp = plans["routepack"]
    pk = solve(w, topo, cost, objective=objective, placement="identity", rows=rp.rows,
               max_sweeps=st.max_sweeps, seed=st.seed, certificate=rp.certificate)
    rows["packing"] = plan_metrics(ev, pk, objective, time.perf_counter() - t0)
    base = rows["baseline"]["makespan"]
    out = {"preset": preset, "objective": objective, "R": rp.rows, "baseline": base, **measure(w)}
    for name in PLANS:
        m = rows[name]
        out[name] = {"gain": (base - m["makespan"]) / base, "makespan": m["makespan"], "gap": m["gap"],
                     "seconds": m["plan_seconds"]}
    out["baseline_gap"] = rows["baseline"]["gap"]
    return out


def headline(st: Setting) -> list[dict]:
    res = []
    for preset in st.presets:
        for objective in ("max-sum", "sum-max"):
            res.append(gains(preset, st, objective))
            r = res[-1]
            print(f"headline {preset} {objective}: " + ", ".join(
                f"{k} {100 * r[k]['gain']:+.1f}%" for k in PLANS), flush=True)
    return res


def sensitivity(st: Setting) -> list[dict]:
    res = []
    for preset in st.sens_presets:
        for objective in ("max-sum", "sum-max"):
            for d in st.dispersions:
                res.append({"axis": "dispersion", "target": d, **gains(preset, st, objective, dispersion=d)})
                print(f"sens {preset} {objective} dispersion {d}: measured {res[-1]['dispersion']:.2f} "
                      f"joint {100 * res[-1]['joint']['gain']:+.2f}%", flush=True)
            for s in st.skews:
                res.append({"axis": "skew", "target": s, **gains(preset, st, objective, skew=s)})
                print(f"sens {preset} {objective} skew {s}: measured {res[-1]['skew']:.2f}", flush=True)
    return res


def joint_pays(r: dict) -> dict:
    """Joint vs routepack on one window: makespan saved (µs, and % of baseline) vs extra plan time."""
    saved_us = r["routepack"]["makespan"] - r["joint"]["makespan"]
    extra_s = r["joint"]["seconds"] - r["routepack"]["seconds"]
    return {"saved_pct": 100 * (r["joint"]["gain"] - r["routepack"]["gain"]), "saved_ms": saved_us / 1e3,
            "extra_plan_s": extra_s, "net_sync_ms": saved_us / 1e3 - 1e3 * extra_s}


# --- report ---------------------------------------------------------------------------------------
def _plots(st: Setting, cal: list[dict], head: list[dict], sens: list[dict]) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    presets = list(dict.fromkeys(r["preset"] for r in cal))
    variants = list(dict.fromkeys(r["variant"] for r in cal))
    width = 0.8 / len(variants)
    for k, key in enumerate(("dispersion", "skew")):
        ax = axes[k]
        for j, v in enumerate(variants):
            xs = [i + j * width for i, p in enumerate(presets) if any(r["preset"] == p and r["variant"] == v for r in cal)]
            ys = [r[key] for p in presets for r in cal if r["preset"] == p and r["variant"] == v]
            ax.bar(xs, ys, width, label=v)
        ax.set_xticks(np.arange(len(presets)) + 0.4 - width / 2, presets, rotation=15, fontsize=8)
        if key == "dispersion":
            ax.axhline(1.18, color="k", ls="--", lw=1, label="real: one web-text stream 1.18")
            ax.axhline(0.89, color="gray", ls=":", lw=1, label="real: i.i.d. tokens 0.89")
            ax.axhspan(3, 6, color="orange", alpha=0.15, label="real: mixed domains ≈ 3–6")
            ax.set_ylabel("routing dispersion at 64 tokens (median)")
        else:
            ax.axhspan(5, 8, color="orange", alpha=0.15, label="real: DeepSeek-V3/R1 median 5–8")
            ax.axhspan(2.5, 7.8, color="green", alpha=0.08, label="real: OLMoE 2.5–7.8")
            ax.set_ylabel("busiest / mean expert load (median layer)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(st.out / "realism_calibration.png", dpi=110)
    plt.close(fig)
    names.append("realism_calibration.png")
    for axis in ("dispersion", "skew"):
        rows = [r for r in sens if r["axis"] == axis]
        if not rows:
            continue
        combos = list(dict.fromkeys((r["preset"], r["objective"]) for r in rows))
        fig, axes = plt.subplots(1, len(combos), figsize=(4.2 * len(combos), 3.8), squeeze=False)
        for ax, (preset, obj) in zip(axes[0], combos):
            sub = sorted((r for r in rows if r["preset"] == preset and r["objective"] == obj), key=lambda r: r[axis])
            for name in PLANS:
                ax.plot([r[axis] for r in sub], [100 * r[name]["gain"] for r in sub], "o-", label=name, ms=3)
            ax.set_title(f"{preset} {obj}", fontsize=9)
            ax.set_xlabel(f"measured {axis}" + (" (64 tokens)" if axis == "dispersion" else " (busiest/mean)"))
            ax.set_ylabel("gain over length-only baseline (%)")
            if axis == "dispersion":
                ax.set_xscale("log")
                ax.axvline(1.18, color="k", ls="--", lw=0.8)
            ax.grid(alpha=0.3)
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(st.out / f"realism_{axis}.png", dpi=110)
        plt.close(fig)
        names.append(f"realism_{axis}.png")
    return names


def _pct(x):
    return f"{100 * x:+.1f} %"


def report(st: Setting, cal, mapping, head, sens, seconds: float) -> Path:
    """Plots, ``realism.md`` and the record it is made from, ``realism.json``."""
    st.out.mkdir(parents=True, exist_ok=True)
    _plots(st, cal, head, sens)
    record = {"calibration": cal, "knob": mapping, "headline": head, "sensitivity": sens}
    path = st.out / "realism.md"
    write_text(path, render(st, record, seconds))
    write_text(st.out / "realism.json", json.dumps(record, indent=1))
    return path


def render(st: Setting, record: dict, seconds: float) -> str:
    """The markdown of ``record`` (``realism.json``); ``seconds`` is the run's wall time."""
    cal, mapping, head, sens = (record[k] for k in ("calibration", "knob", "headline", "sensitivity"))
    L = ["# Realistic routing: calibration, calibrated headline, sensitivity (issue 15)", "",
         f"`python experiments/realism.py` (--samples {st.samples}, seed {st.seed}; {seconds / 60:.1f} min "
         "on the shared 2-core box). See the script's docstring for the setup. Every makespan comes from "
         "the one evaluator; every dispersion/skew from `routepack_opt.stats` (`routepack stats`).", "",
         "## 1. The generator before and after calibration, next to real figures", "",
         *table(["preset", "generator", "dispersion (median)", "dispersion (mean)", "busiest/mean (median layer)"],
                [(r["preset"], r["variant"], r["dispersion"], r["dispersion_mean"], r["skew"]) for r in cal],
                formats={2: ".2f", 3: ".2f", 4: ".2f"})]
    L += ["", "Real: dispersion of 64-token chunks of one web-text stream 1.18 (i.i.d. tokens from the same "
          "aggregate 0.89); a 64-token sample from one domain in a mixed batch ≈ 3–6 (OLMoE/Mixtral per-domain "
          "chi-square 0.10–1.06, `routepack_opt/data/README.md`). Busiest/mean per layer: OLMoE 2.5–7.8 per "
          "domain and layer (6.2–6.8 on layer 7 arXiv/GitHub/Wikipedia, 2.7 C4), DeepSeek-V3/R1 serving median "
          "5–8 (max 13.7), Mixtral 1.1–1.3.", "",
          f"Calibrated targets: dispersion {DEFAULT_DISPERSION} (the single-stream figure), skew "
          + ", ".join(f"{p} {s}" for p, s in PRESET_SKEW.items())
          + " (OLMoE from the shipped counts; the others DeepSeek's serving median — an assumption for qwen3 "
          "and ling-hybrid). The generator's floor (scale 0) is ≈ 1.0, not 0.89: it draws each sample's "
          "routes multinomially, not k distinct experts per token.", "",
          "![calibration](realism_calibration.png)", "",
          "### The knob: `--dispersion TARGET` → measured dispersion", "",
          "The generator scales its sample-specific logits (domain, group, sample) by one factor found by "
          "bisection on a fixed pilot window (512 samples, ≤ 4 layers); measured here on fresh windows "
          f"({st.cal_samples} samples, seed {st.seed + 1}, all layers):", "",
          *table(["preset", *(f"target {t}" for t in st.mapping_targets)],
                 [(preset, *(f"{r['dispersion']:.2f} (scale {r['scale']:.2f})" for r in mapping if r["preset"] == preset))
                  for preset in dict.fromkeys(r["preset"] for r in mapping)])]
    L += ["", "A target below the floor gives scale 0 (samples drawn from the aggregate itself).", "",
          "## 2. Headline on calibrated windows (gain over identity placement + length-only packing)", "",
          *table(["preset", "objective", "R", *PLANS, "gap baseline", "gap routepack", "gap joint",
                  "plan s routepack / joint"],
                 [(r["preset"], r["objective"], r["R"], *(r[k]["gain"] for k in PLANS), r["baseline_gap"],
                   r["routepack"]["gap"], r["joint"]["gap"],
                   f"{r['routepack']['seconds']:.1f} / {r['joint']['seconds']:.1f}") for r in head],
                 formats={**{k: _pct for k in PLANS}, "gap baseline": ".3f", "gap routepack": ".3f",
                          "gap joint": ".3f"})]
    L += ["", "`packing` = identity placement + the annealer (packing alone); `gap` = makespan / the lower bound "
          "of the plan's own placement (docs/model.md).", ""]
    L += ["## 3. Sensitivity: gains vs dispersion and skew", ""]
    for axis in ("dispersion", "skew"):
        rows = [r for r in sens if r["axis"] == axis]
        if not rows:
            continue
        pays = [joint_pays(r) for r in rows]
        L += [f"### vs {axis}", "",
              *table(["preset", "objective", "target", "measured dispersion", "measured skew", *PLANS,
                      "joint − routepack", "joint saves (ms)", "joint extra plan (s)"],
                     [(r["preset"], r["objective"], r["target"], r["dispersion"], r["skew"],
                       *(r[k]["gain"] for k in PLANS), jp["saved_pct"], jp["saved_ms"], jp["extra_plan_s"])
                      for r, jp in zip(rows, pays, strict=True)],
                     formats={"measured dispersion": ".2f", "measured skew": ".2f", **{k: _pct for k in PLANS},
                              "joint − routepack": num("+.2f", suffix=" pp"), "joint saves (ms)": ".1f",
                              "joint extra plan (s)": ".1f"})]
        L += ["", f"![{axis}](realism_{axis}.png)", ""]
    L += ["## Reading the curves", ""] + _trends(sens) + [""]
    L += ["## Where joint placement stops paying", ""] + _joint_verdict(head, sens) + [""]
    L += ["## What this means for a user", "", "Run `routepack stats W.npz` on your own replay: its "
          "dispersion and busiest/mean place you on the curves above; its `implications` give the "
          "evaluator's placement-only gain and the bound no plan can beat for your topology."]
    return "\n".join(L) + "\n"


def _trends(sens) -> list[str]:
    """Each plan's gain at the low and high end of each axis (computed, not written by hand)."""
    out = []
    for axis in ("dispersion", "skew"):
        rows = [r for r in sens if r["axis"] == axis]
        for key in dict.fromkeys((r["preset"], r["objective"]) for r in rows):
            sub = sorted((r for r in rows if (r["preset"], r["objective"]) == key), key=lambda r: r[axis])
            lo, hi = sub[0], sub[-1]
            out.append(f"- {key[0]} {key[1]}, {axis} {lo[axis]:.2f} → {hi[axis]:.2f}: " + "; ".join(
                f"{n} {_pct(lo[n]['gain'])} → {_pct(hi[n]['gain'])}" for n in PLANS) + ".")
    return out


def _joint_verdict(head, sens) -> list[str]:
    out = []
    pays = [joint_pays(r) for r in head]
    if pays:
        pp = [p["saved_pct"] for p in pays]
        ms = [p["saved_ms"] for p in pays]
        ex = [p["extra_plan_s"] for p in pays]
        sync = sum(p["net_sync_ms"] > 0 for p in pays)
        out.append(f"- Calibrated windows (dispersion ≈ {DEFAULT_DISPERSION}): joint adds {min(pp):+.2f} .. "
                   f"{max(pp):+.2f} pp over routepack ({min(ms):.1f} .. {max(ms):.1f} ms of predicted step "
                   f"time) for {min(ex):.1f} .. {max(ex):.1f} s more planning; it beats routepack *including* "
                   f"its extra planning time (planning on the critical path) in {sync} of {len(pays)} cases. "
                   "Planned asynchronously during the previous step, only the makespan part counts.")
    for axis in ("dispersion", "skew"):
        rows = [r for r in sens if r["axis"] == axis]
        for key in dict.fromkeys((r["preset"], r["objective"]) for r in rows):
            sub = sorted((r for r in rows if (r["preset"], r["objective"]) == key), key=lambda r: r[axis])
            ok = [joint_pays(r)["saved_pct"] >= 0.5 for r in sub]
            first = next((i for i in range(len(sub)) if all(ok[i:])), None)
            where = ("never adds ≥ 0.5 pp in this range" if first is None else
                     f"adds ≥ 0.5 pp from {axis} {sub[first][axis]:.2f} upward"
                     + (f" (below that: {max(joint_pays(r)['saved_pct'] for r in sub[:first]):+.2f} pp at most)"
                        if first > 0 else ""))
            out.append(f"- {key[0]} {key[1]}, vs measured {axis}: joint {where}.")
    return out


def run(st: Setting) -> Path:
    t0 = time.perf_counter()
    cal = calibration(st)
    mapping = knob_mapping(st)
    head = headline(st)
    sens = sensitivity(st)
    return report(st, cal, mapping, head, sens, time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="tiny setting (smoke test)")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    st = Setting(samples=args.samples, seed=args.seed, out=Path(args.out))
    if args.quick:
        st = quick_setting(Path(args.out))
    print(f"wrote {run(st)}")


def quick_setting(out: Path) -> Setting:
    return Setting(samples=48, presets=("olmoe-1b-7b",), sens_presets=("olmoe-1b-7b",),
                   dispersions=(1.2, 3.0), skews=(2.0, 5.0), cal_samples=48, max_sweeps=1,
                   mapping_targets=(1.2, 3.0),
                   overrides={"num_layers": 2}, out=out)


if __name__ == "__main__":
    main()

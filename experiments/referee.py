"""Experiments that settle the referee report's questions (seeds/001; issue 7).

    python experiments/referee.py all            # every study below (≈ 30–40 min on 2 busy cores)
    python experiments/referee.py decomposition  # or one study: staleness, control, cost,
                                                 # semantics, budget, peers

Common setting (flags before or after the study name, e.g. ``--samples 256 --layers 8``):
windows of ``--samples`` samples (default 512) from ``routepack_opt.trace`` with every preset's own
E, top-k, capacity, DP and EP sizes, but only ``--layers`` MoE layers (default 16, to fit the
time budget). Since the preset's attention coefficients cover the whole model, the expert
coefficient gamma is multiplied by L_full / L_used so expert work keeps its share of the step
(the "L used / L full" column says where this applies). Packing search: a fixed budget of
``--sweeps`` sweeps per replica (default 20) and seed 0 — deterministic; R = R* (certified).
Every number is scored by the one evaluator (``routepack_opt.core.evaluate.Evaluator``).

Studies (each writes ``experiments/results/referee_<study>.md`` (+ ``.json`` records, + ``.png``),
partial results after every preset):

- decomposition: baseline → reorder → routepack over a sequence of ``--steps`` optimizer steps
  with drifting routing, both objectives; mean gains with moving-block bootstrap 95% CIs over
  the step sequence; global EP-rank CV identity → LPT; worst row-local EP peak reorder → routepack.
- staleness: plan on routing replayed k policy updates late, execute on the true routing.
- control: uniform routing and equal lengths: gains vanish; routepack never loses.
- cost: alpha/beta scaled ×0.25..×4: Kendall tau of candidate layouts' scores, the regret of
  planning with the preset's coefficients, and the attention-vs-expert Pareto front at fixed R.
- semantics: max-sum vs sum-max disagreement over candidate-layout pairs, and the cost of
  planning under the wrong semantics.
- budget: quality vs sweeps and vs time limit; planner overhead against the overlap condition
  T_place + T_pack ≤ max(T_place, T_aux) + T_actor at production size.
- peers: LPT vs EPLB-style balanced packing (no replication) vs exact placement bounds; routepack
  vs the verl- and NeMo-style packing baselines.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from routepack_opt.core.cost import CostModel, Stage, get_preset
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.heuristics.baselines import BASELINES
from routepack_opt.core.io import atomic_write_text
from routepack_opt.heuristics.placement.lpt import identity_placement, lpt_placement, rank_load_cv
from routepack_opt.pipeline import plan, resolve_placement, resolve_rows
from routepack_opt.core.topology import Topology
from routepack_opt.trace import generate_window

PRESETS = ("olmoe-1b-7b", "qwen3-30b-a3b", "ling-hybrid", "deepseek-v3")
RESULTS = Path(__file__).resolve().parent / "results"
OBJECTIVES = ("max-sum", "sum-max")
STUDIES = ("decomposition", "staleness", "control", "cost", "semantics", "budget", "peers")


# ---------------------------------------------------------------------------------------------
# setting, statistics, helpers
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Setting:
    samples: int = 512
    layers: int = 16  # MoE layers used (≤ the preset's)
    steps: int = 20  # windows of the decomposition sequence
    sweeps: int = 20  # annealing sweeps per replica (fixed budget → deterministic)
    seed: int = 0
    presets: tuple[str, ...] = PRESETS
    windows: int = 4  # windows per preset for the smaller studies
    bootstrap: int = 2000
    out: Path = RESULTS
    quick: bool = False  # smoke-test sizes (skips the production-size timing)

    def layers_of(self, preset: str) -> int:
        return min(self.layers, get_preset(preset).config.moe_layers)

    def topology(self, preset: str) -> Topology:
        c = get_preset(preset).config
        return Topology(dp=c.dp, ep=c.ep, capacity=c.capacity)

    def cost(self, preset: str) -> CostModel:
        """The preset's cost model, gamma scaled by L_full / L_used (see module docstring)."""
        c = get_preset(preset)
        return dataclasses.replace(c.cost, gamma=c.cost.gamma * c.config.moe_layers / self.layers_of(preset))

    def window(self, preset: str, step: int = 0, routing_step: int | None = None, **overrides):
        return generate_window(preset, self.samples, self.seed, step=step, routing_step=routing_step,
                               num_layers=self.layers_of(preset), **overrides)

    def shape(self, preset: str) -> str:
        c = get_preset(preset).config
        return (f"{self.layers_of(preset)}/{c.moe_layers} × {c.experts}, k {c.top_k}, "
                f"D {c.dp}, P {c.ep}, C {c.capacity}")


def scaled_cost(cost: CostModel, a: float = 1.0, b: float = 1.0, g: float = 1.0,
                overhead: float | None = None) -> CostModel:
    """``cost`` with every alpha ×a, beta ×b, gamma ×g (and optionally another row overhead)."""
    stages = tuple(Stage(s.name, s.alpha * a, s.beta * b) for s in cost.stages)
    return dataclasses.replace(cost, stages=stages, gamma=cost.gamma * g,
                               row_overhead=cost.row_overhead if overhead is None else overhead)


def block_bootstrap_ci(x, block: int, reps: int = 2000, seed: int = 0, level: float = 0.95):
    """Moving-block bootstrap (Künsch 1989) percentile CI of the mean of a serially correlated
    series: resample overlapping blocks of ``block`` consecutive values, concatenate to length n."""
    x = np.asarray(x, dtype=np.float64)
    n = x.size
    if n == 0:
        return (math.nan, math.nan)
    block = max(1, min(block, n))
    rng = np.random.default_rng(seed)
    nb = -(-n // block)
    starts = rng.integers(0, n - block + 1, size=(reps, nb))
    idx = (starts[:, :, None] + np.arange(block)).reshape(reps, -1)[:, :n]
    means = x[idx].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def block_length(n: int) -> int:
    """n^(1/3) rounded (the usual rate for the moving-block bootstrap of a mean), at least 2."""
    return max(2, int(round(n ** (1 / 3))))


def lag1(x) -> float:
    x = np.asarray(x, dtype=np.float64)
    if x.size < 3 or x.std() == 0:
        return math.nan
    return float(np.corrcoef(x[:-1], x[1:])[0, 1])


def kendall_tau(x, y) -> float:
    """Kendall's tau-b (ties in either ranking handled), O(n²) with numpy."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    i, j = np.triu_indices(x.size, 1)
    sx = np.sign(x[i] - x[j])
    sy = np.sign(y[i] - y[j])
    n0 = i.size
    nx, ny = np.count_nonzero(sx == 0), np.count_nonzero(sy == 0)
    den = math.sqrt((n0 - nx) * (n0 - ny))
    return float((sx * sy).sum() / den) if den > 0 else math.nan


def pct(x: float) -> str:
    return f"{100 * x:+.2f}%"


def ci_str(x, block: int, reps: int) -> str:
    lo, hi = block_bootstrap_ci(x, block, reps)
    return f"{100 * np.mean(x):+.2f}% [{100 * lo:+.2f}, {100 * hi:+.2f}]"


def write(st: Setting, name: str, lines: list[str], records=None) -> Path:
    st.out.mkdir(parents=True, exist_ok=True)
    path = st.out / f"referee_{name}.md"
    atomic_write_text(path, "\n".join(lines) + "\n")
    if records is not None:
        atomic_write_text(st.out / f"referee_{name}.json", json.dumps(records, indent=1, default=float) + "\n")
    return path


def header(st: Setting, title: str, what: str) -> list[str]:
    cmd = f"python experiments/referee.py {title}" + (" (quick)" if st.quick else "")
    return [f"# Referee study: {title}", "", what, "",
            f"Regenerate: `{cmd}` — N = {st.samples} samples, L used = min({st.layers}, preset L) "
            f"(gamma × L_full/L_used), {st.sweeps} sweeps per replica, seed {st.seed}, R = R*.", ""]


def plt_module():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


class Planner:
    """Layouts of one (planning) window: baselines, LPT placement, routepack at a fixed budget."""

    def __init__(self, window, topology: Topology, cost: CostModel, rows: int | None = None):
        self.window, self.topology, self.cost = window, topology, cost
        self.rows, self.cert = resolve_rows(window, topology, rows)
        self.ident = identity_placement(window.num_layers, window.num_experts)
        self.lpt, _ = resolve_placement(window, topology, "lpt")
        self.base = {name: fn(window.lengths, topology, self.rows) for name, fn in BASELINES.items()}
        self._cache: dict = {}

    def routepack(self, objective: str, sweeps: int | None, seed: int = 0, cost: CostModel | None = None,
                  time_limit: float | None = None):
        """(row, slot, seconds, plan); deterministic calls (no time limit) are cached."""
        key = (objective, sweeps, seed, cost, time_limit)
        if time_limit is None and key in self._cache:
            return self._cache[key]
        t0 = time.perf_counter()
        p = plan(self.window, self.topology, cost or self.cost, objective, self.lpt, self.rows,
                 time_limit, sweeps, seed)
        out = (p.row, p.slot, time.perf_counter() - t0, p)
        if time_limit is None:
            self._cache[key] = out
        return out


def metrics(ev: Evaluator, placement, row, slot, rows: int, objective: str) -> dict:
    """Makespans (both objectives), EP-rank CV, worst row-local EP peak, via the evaluator."""
    e = ev.evaluate(placement, row, slot, rows, objective)
    _, A_SRG, M_RGL = ev.costs(placement, row, slot, rows, parts=True)
    return {"makespan": e.score.makespan, "max-sum": e.scores["max-sum"].makespan,
            "sum-max": e.scores["sum-max"].makespan, "lb": e.lower_bound,
            "cv": rank_load_cv(ev.window.expert_loads(), placement, ev.topology.ep),
            "row_peak": float(M_RGL.max())}


def three(planner: Planner, ev: Evaluator, objective: str, sweeps: int, seed: int = 0) -> dict:
    """baseline (identity + verl-kk), reorder (LPT + verl-kk), routepack (LPT + annealing), all
    planned on ``planner``'s window and scored by ``ev`` (the window that executes)."""
    R = planner.rows
    br, bs = planner.base["verl-kk"]
    rr, rs, secs, _ = planner.routepack(objective, sweeps, seed)
    out = {"baseline": metrics(ev, planner.ident, br, bs, R, objective),
           "reorder": metrics(ev, planner.lpt, br, bs, R, objective),
           "routepack": metrics(ev, planner.lpt, rr, rs, R, objective)}
    out["routepack"]["seconds"] = secs
    return out


def gains(m: dict) -> dict:
    b = m["baseline"]["makespan"]
    return {"reorder": (b - m["reorder"]["makespan"]) / b,
            "packing": (m["reorder"]["makespan"] - m["routepack"]["makespan"]) / b,
            "total": (b - m["routepack"]["makespan"]) / b}


# ---------------------------------------------------------------------------------------------
# 1. decomposition
# ---------------------------------------------------------------------------------------------


def study_decomposition(st: Setting) -> Path:
    blk = block_length(st.steps)
    lines = header(st, "decomposition",
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
    lines += ["| preset | L used/full × E, k, D, P, C | objective | R | reorder gain [95% CI] "
              "| packing increment [95% CI] | total gain [95% CI] | lag-1 ac | EP-rank CV identity → LPT "
              "| row EP peak reorder → routepack | routepack s/step |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    records = []
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
            lines.append(
                f"| {preset} | {st.shape(preset)} | {o} | {rs[0]['rows']} "
                f"| {ci_str(g['reorder'], blk, st.bootstrap)} | {ci_str(g['packing'], blk, st.bootstrap)} "
                f"| {ci_str(g['total'], blk, st.bootstrap)} | {lag1(g['total']):.2f} "
                f"| {cvi:.4f} → {cvl:.5f} ({100 * (1 - cvl / cvi):.1f}% removed) "
                f"| {pr:,.0f} → {pp:,.0f} ({pct((pp - pr) / pr)}) "
                f"| {np.mean([r['seconds'] for r in rs]):.2f} |")
        write(st, "decomposition", lines, records)
    _plot_decomposition(st, records, blk)
    lines += ["", "![decomposition](referee_decomposition.png)", ""]
    return write(st, "decomposition", lines, records)


def _plot_decomposition(st: Setting, records: list[dict], blk: int) -> None:
    plt = plt_module()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, o in zip(axes, OBJECTIVES):
        x = np.arange(len(st.presets))
        for j, (k, color) in enumerate((("reorder", "tab:blue"), ("packing", "tab:orange"), ("total", "tab:green"))):
            mean, lo, hi = [], [], []
            for p in st.presets:
                v = np.array([r[k] for r in records if r["preset"] == p and r["objective"] == o])
                a, b = block_bootstrap_ci(v, blk, st.bootstrap)
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
    fig.savefig(st.out / "referee_decomposition.png", dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# 2. staleness
# ---------------------------------------------------------------------------------------------

LAGS = (0, 1, 2, 4, 8, 16)


def study_staleness(st: Setting, drifts=(0.05, 0.2), objective: str = "max-sum") -> Path:
    lags = tuple(k for k in LAGS if k <= (4 if st.quick else 16))
    t0 = max(lags)
    steps = list(range(t0, t0 + st.windows))
    blk = block_length(len(steps))
    lines = header(st, "staleness",
                   "Replay staleness: at step t the planner sees routing recorded k policy updates "
                   "earlier (`generate_window(step=t, routing_step=t-k)`: same samples and lengths, "
                   "routing of the older policy) and its plan is executed on the true routing "
                   "(`routing_step=t`). Gains are realized on the true routing, relative to the "
                   f"baseline (which does not use routing). Objective {objective}; windows t = "
                   f"{steps[0]}..{steps[-1]}; CI: moving-block bootstrap over t (block {blk}). "
                   "`drift` is the per-step sd of the routing logits' random walk (default 0.05; "
                   "0.2 = fast-moving policy). `predicted` = the gain the planner believed on the stale "
                   "routing.")
    lines += ["| preset | drift | k | reorder gain | packing increment | total gain [95% CI] | predicted total |",
              "|---|---|---|---|---|---|---|"]
    records = []
    for preset in st.presets:
        topo, cost = st.topology(preset), st.cost(preset)
        for drift in drifts:
            for k in lags:
                rows = []
                for t in steps:
                    w_true = st.window(preset, step=t, drift=drift)
                    w_stale = st.window(preset, step=t, routing_step=t - k, drift=drift)
                    pl = Planner(w_stale, topo, cost)
                    m_true = three(pl, Evaluator(w_true, topo, cost), objective, st.sweeps, st.seed)
                    g = gains(m_true)
                    ev_s = Evaluator(w_stale, topo, cost)  # what the planner believed
                    pred_base = ev_s.score(pl.ident, *pl.base["verl-kk"], pl.rows, objective).makespan
                    rp_row, rp_slot, _, _ = pl.routepack(objective, st.sweeps, st.seed)  # cached
                    pred_rp = ev_s.score(pl.lpt, rp_row, rp_slot, pl.rows, objective).makespan
                    g["predicted"] = (pred_base - pred_rp) / pred_base
                    rec = {"preset": preset, "drift": drift, "k": k, "step": t, **g}
                    rows.append(rec)
                    records.append(rec)
                arr = {key: np.array([r[key] for r in rows]) for key in ("reorder", "packing", "total", "predicted")}
                lines.append(f"| {preset} | {drift} | {k} | {pct(arr['reorder'].mean())} | {pct(arr['packing'].mean())} "
                             f"| {ci_str(arr['total'], blk, st.bootstrap)} | {pct(arr['predicted'].mean())} |")
                print(f"staleness {preset} drift {drift} k {k}: total {pct(arr['total'].mean())}", flush=True)
            write(st, "staleness", lines, records)
    _plot_staleness(st, records, lags, drifts)
    lines += ["", "![staleness](referee_staleness.png)", ""]
    return write(st, "staleness", lines, records)


def _plot_staleness(st: Setting, records, lags, drifts) -> None:
    plt = plt_module()
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
    fig.savefig(st.out / "referee_staleness.png", dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# 3. control
# ---------------------------------------------------------------------------------------------


def study_control(st: Setting) -> Path:
    lines = header(st, "control",
                   "Control: uniform expert popularity and equal lengths (`uniform=True`), "
                   f"{st.windows * 2} consecutive steps per preset. The referee's prediction: little "
                   "room beyond length-only packing, and routepack must not lose (min gain ≥ 0). For "
                   "contrast, the `skewed` rows repeat the same windows with the default skewed trace.")
    lines += ["| preset | trace | objective | reorder gain mean (min) | packing increment mean (min) "
              "| total gain mean | total gain min | total gain max |", "|---|---|---|---|---|---|---|---|"]
    records = []
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
                lines.append(f"| {preset} | {trace} | {o} | {pct(a['reorder'].mean())} ({pct(a['reorder'].min())}) "
                             f"| {pct(a['packing'].mean())} ({pct(a['packing'].min())}) | {pct(a['total'].mean())} "
                             f"| {pct(a['total'].min())} | {pct(a['total'].max())} |")
            print(f"control {preset} {trace} done", flush=True)
        write(st, "control", lines, records)
    uni = [r["total"] for r in records if r["trace"] == "uniform"]
    lines += ["", f"Uniform control over all presets and objectives: min total gain {pct(min(uni))}, "
              f"max {pct(max(uni))} (routepack ≥ baseline holds: {min(uni) >= 0})."]
    return write(st, "control", lines, records)


# ---------------------------------------------------------------------------------------------
# 4. cost sensitivity and the attention/expert Pareto front
# ---------------------------------------------------------------------------------------------

SCALES = (0.25, 0.5, 1.0, 2.0, 4.0)


def cost_grid(quick: bool) -> list[tuple[float, float]]:
    if quick:
        return [(1.0, 1.0), (0.25, 1.0), (4.0, 1.0), (1.0, 4.0)]
    axis = [(a, 1.0) for a in SCALES] + [(1.0, b) for b in SCALES if b != 1.0]
    return axis + [(0.25, 0.25), (4.0, 4.0), (0.25, 4.0), (4.0, 0.25)]


PARETO_W = (0.0, 0.1, 0.25, 0.4, 0.5, 0.6, 0.75, 0.9, 1.0)


def study_cost(st: Setting, objective: str = "max-sum") -> Path:
    grid = cost_grid(st.quick)
    nwin = max(1, st.windows // 2)
    lines = header(st, "cost",
                   "Cost-model sensitivity (referee major 3). Every attention alpha ×a, beta ×b "
                   f"(gamma fixed) over {len(grid)} models (a, b ∈ ×0.25..×4); {nwin} window(s) per "
                   f"preset; objective {objective}. Candidates: the 4 baseline layouts (identity/LPT × "
                   "verl-kk/NeMo-FFD), the joint greedy, and routepack planned under each model "
                   f"({len(grid) + 5} layouts). `tau` = Kendall tau-b between the candidates' makespans "
                   "under the preset model (a=b=1) and under (a, b): 1 = same ranking. `regret` = how much "
                   "worse the plan made with the preset coefficients is, under (a, b), than the plan made "
                   "with (a, b) itself. `gain` = that preset-coefficient plan's gain over the baseline "
                   "when (a, b) are the true coefficients.")
    lines += ["| preset | a (alpha ×) | b (beta ×) | tau mean | tau min | regret mean | regret max "
              "| gain of preset plan under (a,b) | gain of plan made for (a,b) |",
              "|---|---|---|---|---|---|---|---|---|"]
    records = []
    pareto = []
    from routepack_opt.heuristics.anneal import greedy_layout

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
                rec = {"preset": preset, "step": t, "a": ab[0], "b": ab[1], "tau": kendall_tau(ref, s),
                       "regret": (s[i_pre] - s[i_own]) / s[i_own],
                       "gain_preset_plan": (s[i_base] - s[i_pre]) / s[i_base],
                       "gain_own_plan": (s[i_base] - s[i_own]) / s[i_base]}
                acc[ab].append(rec)
                records.append(rec)
            # Pareto front at fixed R: plan under weights w·attention + (1-w)·expert (×2 so that
            # w = 0.5 is the preset model), evaluate both parts under the true coefficients
            if t == 0:
                ev_att = Evaluator(w, topo, scaled_cost(cost, g=0.0, overhead=0.0))
                ev_exp = Evaluator(w, topo, scaled_cost(cost, a=0.0, b=0.0, overhead=0.0))
                ws = PARETO_W if not st.quick else (0.0, 0.5, 1.0)
                pts = []
                for wt in ws:
                    cw = scaled_cost(cost, a=2 * wt, b=2 * wt, g=2 * (1 - wt))
                    r, s, _, _ = pl.routepack(objective, st.sweeps, st.seed, cost=cw)
                    pts.append({"w": wt, "attention": ev_att.score(pl.lpt, r, s, R, objective).makespan,
                                "expert": ev_exp.score(pl.lpt, r, s, R, objective).makespan,
                                "joint": Evaluator(w, topo, cost).score(pl.lpt, r, s, R, objective).makespan})
                refs = {}
                for n, (p_, r, s) in (("baseline", cands["identity+verl-kk"]), ("reorder", cands["lpt+verl-kk"])):
                    refs[n] = {"attention": ev_att.score(p_, r, s, R, objective).makespan,
                               "expert": ev_exp.score(p_, r, s, R, objective).makespan,
                               "joint": Evaluator(w, topo, cost).score(p_, r, s, R, objective).makespan}
                pareto.append({"preset": preset, "rows": R, "points": pts, "refs": refs})
        for ab in grid:
            rs = acc[ab]
            lines.append(f"| {preset} | {ab[0]} | {ab[1]} | {np.mean([r['tau'] for r in rs]):.3f} "
                         f"| {min(r['tau'] for r in rs):.3f} | {pct(np.mean([r['regret'] for r in rs]))} "
                         f"| {pct(max(r['regret'] for r in rs))} | {pct(np.mean([r['gain_preset_plan'] for r in rs]))} "
                         f"| {pct(np.mean([r['gain_own_plan'] for r in rs]))} |")
        print(f"cost {preset} done", flush=True)
        write(st, "cost", lines + _pareto_lines(pareto), {"sensitivity": records, "pareto": pareto})
    _plot_pareto(st, pareto, objective)
    lines += _pareto_lines(pareto) + ["", "![pareto](referee_cost_pareto.png)", ""]
    return write(st, "cost", lines, {"sensitivity": records, "pareto": pareto})


def _pareto_lines(pareto) -> list[str]:
    out = ["", "## Attention-vs-expert Pareto front at fixed R (first window of each preset)", "",
           "Plans made under w·attention + (1−w)·expert (w = 0.5: the preset model); both parts then "
           "scored under the true coefficients as separate makespans (attention only: gamma = 0; "
           "expert only: alpha = beta = 0; row overhead 0). Relative to the baseline layout's parts.", "",
           "| preset | R | w | attention vs baseline | expert vs baseline | joint makespan vs baseline |",
           "|---|---|---|---|---|---|"]
    for pf in pareto:
        b = pf["refs"]["baseline"]
        rows = [("reorder", pf["refs"]["reorder"])] + [(f"{p['w']}", p) for p in pf["points"]]
        for name, p in rows:
            out.append(f"| {pf['preset']} | {pf['rows']} | {name} | {pct(p['attention'] / b['attention'] - 1)} "
                       f"| {pct(p['expert'] / b['expert'] - 1)} | {pct(p['joint'] / b['joint'] - 1)} |")
    return out


def _plot_pareto(st: Setting, pareto, objective) -> None:
    plt = plt_module()
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
    fig.savefig(st.out / "referee_cost_pareto.png", dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# 5. semantics
# ---------------------------------------------------------------------------------------------


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


def study_semantics(st: Setting) -> Path:
    lines = header(st, "semantics",
                   "Referee major 1: `max-sum` (max_g Σ_r J, shards asynchronous) and `sum-max` "
                   "(Σ_r max_g J, rows synchronize) can rank layouts differently. Candidates per window: "
                   "the 4 baseline layouts, routepack under each objective at 2 budgets × 2 seeds, and "
                   "12 random capacity-keeping perturbations (1–32 swaps) of the max-sum plan. "
                   "`disagree` = share of candidate pairs (ties excluded) that the two objectives order "
                   "oppositely; `loss if max-sum picks` = for those pairs, how much worse in sum-max "
                   "makespan the max-sum-preferred layout is (mean / max). Cross-evaluation: plan under "
                   "one objective, execute under the other; loss relative to the plan made for the "
                   "executing semantics (negative: the other plan happened to be better).")
    lines += ["| preset | G | windows | pairs | disagree | loss if max-sum picks (mean / max) "
              "| loss if sum-max picks, in max-sum (mean / max) | max-sum plan run as sum-max | sum-max plan run as max-sum |",
              "|---|---|---|---|---|---|---|---|---|"]
    records = []
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
            main = {}
            for o in OBJECTIVES:
                for sw in budgets:
                    for sd in (0, 1):
                        r, s, _, _ = pl.routepack(o, sw, sd)
                        cands.append((pl.lpt, r, s))
                        if sw == st.sweeps and sd == 0:
                            main[o] = (r, s)
            rng = np.random.default_rng([st.seed, t])
            for sw in (1, 2, 4, 8, 16, 32) * 2:
                r, s = perturb(w.lengths, *main["max-sum"], R, topo.dp, topo.capacity, sw, rng)
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
            (rm, sm_) = main["max-sum"]
            (rs, ss) = main["sum-max"]
            x_ms = ev.score(pl.lpt, rm, sm_, R, "sum-max").makespan / ev.score(pl.lpt, rs, ss, R, "sum-max").makespan - 1
            x_sm = ev.score(pl.lpt, rs, ss, R, "max-sum").makespan / ev.score(pl.lpt, rm, sm_, R, "max-sum").makespan - 1
            acc["x_ms"].append(x_ms)
            acc["x_sm"].append(x_sm)
            records.append({"preset": preset, "step": t, "candidates": len(cands), "pairs": int(valid.sum()),
                            "disagree": int(dis.sum()), "maxsum_plan_as_summax": x_ms, "summax_plan_as_maxsum": x_sm})
        f = lambda v: f"{pct(np.mean(v))} / {pct(np.max(v))}" if v else "—"  # noqa: E731
        lines.append(f"| {preset} | {topo.num_shards} | {st.windows} | {acc['pairs']} "
                     f"| {100 * acc['dis'] / max(acc['pairs'], 1):.1f}% | {f(acc['loss_ms'])} | {f(acc['loss_sm'])} "
                     f"| {pct(np.mean(acc['x_ms']))} (max {pct(np.max(acc['x_ms']))}) "
                     f"| {pct(np.mean(acc['x_sm']))} (max {pct(np.max(acc['x_sm']))}) |")
        print(f"semantics {preset} done", flush=True)
        write(st, "semantics", lines, records)
    return write(st, "semantics", lines, records)


# ---------------------------------------------------------------------------------------------
# 6. budget and planner overhead
# ---------------------------------------------------------------------------------------------

SWEEP_BUDGETS = (1, 2, 5, 10, 20, 50, 100)
TIME_LIMITS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0)
T_ACTOR_S = (10.0, 30.0, 60.0)


def study_budget(st: Setting, objective: str = "max-sum") -> Path:
    sweeps = SWEEP_BUDGETS if not st.quick else (1, 5)
    limits = TIME_LIMITS if not st.quick else (0.1, 0.5)
    nwin = max(1, st.windows // 2)
    lines = header(st, "budget",
                   f"Search quality vs budget (objective {objective}, {nwin} window(s) per preset). "
                   "`gain` = reduction of predicted step time over the baseline; `of best` = share of the "
                   "largest gain seen for that window that the budget reaches. Time = wall time of the "
                   "whole pipeline (placement, R*, seeds, ladder calibration, search) on this machine "
                   "(2 cores shared with other jobs), after one untimed warm-up plan; with a time limit "
                   "the search stops at the limit but the fixed pipeline work before it does not.")
    lines += ["| preset | budget | wall s | gain | of best |", "|---|---|---|---|---|"]
    records = []
    for preset in st.presets:
        topo, cost = st.topology(preset), st.cost(preset)
        rows = []
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
                rec = {"preset": preset, "step": t, "budget": name, "seconds": secs, "gain": g, "of_best": g / best if best > 0 else 1.0}
                rows.append(rec)
                records.append(rec)
        for name in dict.fromkeys(r["budget"] for r in rows):
            rs = [r for r in rows if r["budget"] == name]
            lines.append(f"| {preset} | {name} | {np.mean([r['seconds'] for r in rs]):.2f} "
                         f"| {pct(np.mean([r['gain'] for r in rs]))} | {100 * np.mean([r['of_best'] for r in rs]):.1f}% |")
        print(f"budget {preset} done", flush=True)
        write(st, "budget", lines, records)
    _plot_budget(st, records)
    lines += ["", "![budget](referee_budget.png)", ""]
    over = [] if st.quick else overhead_rows(st)
    if over:
        lines += _overhead_lines(over)
    return write(st, "budget", lines, {"budget": records, "overhead": over})


def _plot_budget(st: Setting, records) -> None:
    plt = plt_module()
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
    fig.savefig(st.out / "referee_budget.png", dpi=120)
    plt.close(fig)


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
        p = plan(w, topo, cost, "max-sum", "lpt", None, None, None, st.seed)
        tm = p.info["timings"]
        mig = migration_cost(prev_pl, align_slots(p.placement, prev_pl, topo.ep), topo, cost)
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
    lines = ["", "## Planner overhead and the overlap condition", "",
             "Production-size windows (every preset's full L and E, N = 1024, default annealing budget "
             "200 sweeps × 16 replicas, no time limit), planned on this 2-core machine. Assumptions: "
             "T_actor = rollout time of the next batch (10–60 s is typical for RL rollouts of "
             "thousands of tokens per sample); T_aux = materialization of the new placement after the "
             "previous step's (slots aligned to keep unmoved experts in place): busiest rank's "
             "received experts × (bf16 weights + fp32 master + Adam moments) / 50 GB/s. "
             "The condition T_place + T_pack ≤ max(T_place, T_aux) + T_actor holds whenever "
             "T_actor ≥ `min T_actor`; the predicted step time is the training step the plan is for.", "",
             "| preset | shape | T_place s | T_pack s | T_aux s (experts moved, busiest rank recv.) "
             "| min T_actor s | holds for T_actor = " + " / ".join(f"{a:.0f}" for a in T_ACTOR_S) + " s | predicted step s |",
             "|---|---|---|---|---|---|---|---|"]
    for o in over:
        holds = " / ".join("yes" if o["t_place"] + o["t_pack"] <= max(o["t_place"], o["t_aux"]) + a else "no"
                           for a in T_ACTOR_S)
        lines.append(f"| {o['preset']} | {o['shape']} | {o['t_place']:.3f} | {o['t_pack']:.2f} "
                     f"| {o['t_aux']:.2f} ({o['moved']}, {o['max_rank_received']}) | {o['min_t_actor']:.2f} "
                     f"| {holds} | {o['step_s']:.2f} |")
    return lines


# ---------------------------------------------------------------------------------------------
# 7. peers
# ---------------------------------------------------------------------------------------------


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


def study_peers(st: Setting, objective: str = "max-sum") -> Path:
    from routepack_opt.core.evaluate import expert_rank_loads
    from routepack_opt.heuristics.placement.lpt import swap_refine
    from routepack_opt.models.placement import exact_placement

    nwin = max(1, st.windows // 2)
    tl = 0.2 if st.quick else 0.5
    lines = header(st, "peers",
                   "Placement: LPT (Graham 1969, numba), EPLB-style balanced packing without "
                   "replication (DeepSeek EPLB's `balanced_packing` idea, torch + Python loop as in the "
                   "original; defined in this script), LPT + swap refinement (the pipeline's `lpt`), "
                   f"and the exact per-layer CP-SAT model ({tl} s/layer) giving a proved lower bound. "
                   "Gap = busiest rank / proved bound per layer (≥ 1). `same as LPT` = share of layers "
                   f"where EPLB's per-rank loads equal LPT's. {nwin} window(s) per preset.")
    lines += ["| preset | L × E, P | LPT ms | LPT gap mean / max | EPLB ms | EPLB gap mean / max "
              "| EPLB same as LPT | LPT+swap ms | LPT+swap gap mean / max | exact gap max | layers proved |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    pack_lines = ["", "## Packing: routepack vs the verl- and NeMo-style baselines", "",
                  f"LPT+swap placement, R = R*, objective {objective}; makespans relative to the lower "
                  "bound (LB of docs/model.md, 1 = optimal); both objectives shown; time = wall time.", "",
                  "| preset | packing | max-sum / LB | sum-max / LB | gain over verl-kk (objective) | time s |",
                  "|---|---|---|---|---|---|"]
    records = []
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
            t0 = time.perf_counter(); lpt = lpt_placement(load, P); acc["lpt_ms"].append(1e3 * (time.perf_counter() - t0))
            t0 = time.perf_counter(); ep_ = eplb_balanced_packing(load, P); acc["eplb_ms"].append(1e3 * (time.perf_counter() - t0))
            t0 = time.perf_counter(); sw = swap_refine(load, lpt, P); acc["swap_ms"].append(1e3 * (time.perf_counter() - t0))
            rep = exact_placement(load, P, time_limit=tl)
            bound = rep.bound_L.astype(np.float64)
            pk_of = lambda pl: expert_rank_loads(load, pl, P).max(axis=1)  # noqa: E731
            acc["lgap"] += (pk_of(lpt) / bound).tolist()
            acc["egap"] += (pk_of(ep_) / bound).tolist()
            acc["sgap"] += (pk_of(sw) / bound).tolist()
            acc["xgap"] += rep.gap_L.tolist()
            acc["proved"] += [s == "optimal" for s in rep.status_L]
            same = np.all(np.sort(expert_rank_loads(load, lpt, P), axis=1) == np.sort(expert_rank_loads(load, ep_, P), axis=1), axis=1)
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
        m = lambda v: f"{np.mean(v):.4f} / {np.max(v):.4f}"  # noqa: E731
        lines.append(f"| {preset} | {st.layers_of(preset)} × {load.shape[1]}, {P} | {np.mean(acc['lpt_ms']):.2f} "
                     f"| {m(acc['lgap'])} | {np.mean(acc['eplb_ms']):.1f} | {m(acc['egap'])} "
                     f"| {100 * np.mean(acc['same']):.0f}% | {np.mean(acc['swap_ms']):.1f} | {m(acc['sgap'])} "
                     f"| {np.max(acc['xgap']):.4f} | {sum(acc['proved'])}/{len(acc['proved'])} |")
        for name, v in pk.items():
            v = np.array(v)
            pack_lines.append(f"| {preset} | {name} | {v[:, 0].mean():.4f} | {v[:, 1].mean():.4f} "
                              f"| {pct(v[:, 2].mean())} | {v[:, 3].mean():.2f} |")
        records.append({"preset": preset, **{k: list(map(float, v)) for k, v in acc.items()},
                        "packing": {k: np.array(v).tolist() for k, v in pk.items()}})
        print(f"peers {preset} done", flush=True)
        write(st, "peers", lines + pack_lines, records)
    return write(st, "peers", lines + pack_lines, records)


# ---------------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------------

RUNNERS = {"decomposition": study_decomposition, "staleness": study_staleness, "control": study_control,
           "cost": study_cost, "semantics": study_semantics, "budget": study_budget, "peers": study_peers}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("study", choices=STUDIES + ("all",))
    ap.add_argument("--samples", type=int, default=512)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--sweeps", type=int, default=20)
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--quick", action="store_true", help="smoke-test sizes")
    a = ap.parse_args(argv)
    st = Setting(samples=a.samples, layers=a.layers, steps=a.steps, sweeps=a.sweeps, seed=a.seed,
                 presets=tuple(p for p in a.presets.split(",") if p), windows=a.windows, out=a.out,
                 quick=a.quick)
    for p in st.presets:
        get_preset(p)
    for name in (STUDIES if a.study == "all" else (a.study,)):
        t0 = time.perf_counter()
        path = RUNNERS[name](st)
        print(f"{name}: {path} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

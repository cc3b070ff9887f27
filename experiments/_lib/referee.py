"""The referee studies' common setting (issue 7): windows, cost model and the three layouts
every study compares, scored by the one evaluator.

Setting: windows of ``samples`` samples (default 512) from ``routepack_opt.trace`` with every
preset's own E, top-k, capacity, DP and EP sizes, but only ``layers`` MoE layers (default 16, to
fit the time budget). Since the preset's attention coefficients cover the whole model, the expert
coefficient gamma is multiplied by L_full / L_used so expert work keeps its share of the step
(the "L used / L full" column says where this applies). Packing search: a fixed budget of
``sweeps`` sweeps per replica (default 20) and seed 0 — deterministic; R = R* (certified). Every
number is scored by the one evaluator (``routepack_opt.core.evaluate.Evaluator``).

The three layouts (``three``): baseline = identity placement + verl-style length-only KK packing;
reorder = LPT+swap placement, same packing; routepack = LPT+swap + population annealing.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from routepack_opt.core.cost import CostModel, Stage, get_preset
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.core.topology import Topology
from routepack_opt.heuristics.baselines import BASELINES
from routepack_opt.heuristics.placement.lpt import identity_placement, rank_load_cv
from routepack_opt.pipeline import resolve_placement, resolve_rows, solve
from routepack_opt.trace import generate_window

from . import report, settings

OBJECTIVES = ("max-sum", "sum-max")
STUDIES = ("decomposition", "staleness", "control", "cost", "semantics", "budget", "peers")


@dataclasses.dataclass(frozen=True)
class Setting:
    samples: int = 512
    layers: int = 16  # MoE layers used (≤ the preset's)
    steps: int = 20  # windows of the decomposition sequence
    sweeps: int = 20  # annealing sweeps per replica (fixed budget → deterministic)
    seed: int = 0
    presets: tuple[str, ...] = settings.PRESETS
    windows: int = 4  # windows per preset for the smaller studies
    bootstrap: int = 2000
    out: Path | None = None  # None: experiments/results/<study>
    quick: bool = False  # smoke-test sizes (skips the production-size timing)

    def __post_init__(self):
        for p in self.presets:
            get_preset(p)  # an unknown preset fails here, before any study runs

    def folder(self, study: str) -> Path:
        return settings.results_dir(study, self.out)

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


def add_arguments(ap) -> None:
    """The flags every referee study takes."""
    ap.add_argument("--samples", type=int, default=512)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--sweeps", type=int, default=20)
    ap.add_argument("--windows", type=int, default=4)
    settings.add_seed(ap)
    settings.add_presets(ap)
    ap.add_argument("--out", type=Path, default=None, help="output folder (default experiments/results/<study>)")
    settings.add_quick(ap)


def setting_from(args) -> Setting:
    return Setting(samples=args.samples, layers=args.layers, steps=args.steps, sweeps=args.sweeps,
                   seed=args.seed, presets=settings.presets_arg(args.presets), windows=args.windows,
                   out=args.out, quick=args.quick)


def main(doc: str, study: str, run, argv=None) -> int:
    """Command line of one study: parse the common flags, run, print where the table went."""
    ap = settings.parser(doc)
    add_arguments(ap)
    st = setting_from(ap.parse_args(argv))
    t0 = time.perf_counter()
    path = run(st)
    print(f"{study}: {path} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return 0


def scaled_cost(cost: CostModel, a: float = 1.0, b: float = 1.0, g: float = 1.0,
                overhead: float | None = None) -> CostModel:
    """``cost`` with every alpha ×a, beta ×b, gamma ×g (and optionally another row overhead)."""
    stages = tuple(Stage(s.name, s.alpha * a, s.beta * b) for s in cost.stages)
    return dataclasses.replace(cost, stages=stages, gamma=cost.gamma * g,
                               row_overhead=cost.row_overhead if overhead is None else overhead)


def header(st: Setting, study: str, what: str) -> list[str]:
    """Title, what the study measures, and the command and setting that regenerate it."""
    cmd = f"python experiments/{study}.py" + (" (quick)" if st.quick else "")
    return [f"# Referee study: {study}", "", what, "",
            f"Regenerate: `{cmd}` — N = {st.samples} samples, L used = min({st.layers}, preset L) "
            f"(gamma × L_full/L_used), {st.sweeps} sweeps per replica, seed {st.seed}, R = R*.", ""]


def write(st: Setting, study: str, lines: list[str], records=None) -> Path:
    """``<folder>/<study>.md`` (and ``<study>.json`` with the records), atomically; called after
    every preset so a stopped run leaves partial results."""
    folder = st.folder(study)
    path = report.write_md(folder / f"{study}.md", lines)
    if records is not None:
        report.write_json(folder / f"{study}.json", records)
    return path


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
        p = solve(self.window, self.topology, cost or self.cost, objective=objective,
                  placement=self.lpt, rows=self.rows, time_limit=time_limit, max_sweeps=sweeps, seed=seed)
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
    """Relative reductions of the baseline's makespan: by reordering, the packing increment on
    top of it, and in total."""
    b = m["baseline"]["makespan"]
    return {"reorder": (b - m["reorder"]["makespan"]) / b,
            "packing": (m["reorder"]["makespan"] - m["routepack"]["makespan"]) / b,
            "total": (b - m["routepack"]["makespan"]) / b}

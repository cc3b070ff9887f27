"""Whole-run replay report (``routepack replay-report``, docs/cli.md): what RoutePack would save
on every step of a recorded run.

Legend: N samples, L layers, E experts, P EP ranks, D DP slots, R rows, C token cap, G shards.

Per window (one optimizer step), :func:`analyze_window` computes

- R* and its certificate (:func:`routepack_opt.certify.certify_rows`);
- our plan: :func:`routepack_opt.pipeline.solve` at R* (LPT + swaps placement, annealed packing);
- the frameworks' own packers at the rows each picks (:mod:`routepack_opt.heuristics.frameworks`:
  verl, verl-target, NeMo-RL FFD/MFFD, slime) and verl's KK repaired to the cap at R*
  (``verl-kk@R*``, ``routepack compare``'s baseline), each under the identity placement and
  EPLB's (balanced packing without replication, which is cardinality-constrained LPT). With
  redundant expert slots (``--redundant-experts N``) our plan has replicas, and so do the
  baselines' placements: EPLB's global policy with the same N slots
  (:func:`~routepack_opt.heuristics.placement.replicate.eplb_placement`) and the identity with
  the first N experts copied (:meth:`~routepack_opt.core.placement.Placement.identity`), every
  token split by the even-local rule, as the runtime dispatches it;
- every layout scored by the one evaluator: makespan M, the lower bound LB of its placement
  and rows, its cap violations (micro-batches over C) and extra rows (R − R*);
- saving = (M_best − M_ours) / M_best over the best baseline that keeps the cap;
- EP-rank imbalance (CV of the per-layer rank loads) of identity, EPLB and our placement (with
  replicas: a baseline placement's rank loads split each expert's tokens evenly over its copies;
  our plan's are the even-local split of its own layout, as ``routepack compare`` reports it);
- where the time goes on the critical path of our plan: for max-sum the busiest shard
  g* = argmax_g Σ_r J[r, g], split into attention Σ_r Σ_s A[s, r, g*], experts
  γ Σ_r Σ_l M[r, g*, l] and overhead R·row_overhead (for sum-max, per row its busiest shard);
  the three add up to the makespan.

``OUT_DIR/steps.jsonl`` holds one JSON object per window, appended by :func:`append_step` as each
finishes (one ``write`` of the whole line with ``O_APPEND``, then ``fsync``): a kill loses at most
the windows in flight, and a torn last line is ignored by :func:`read_steps` and cut off before
the next append. ``OUT_DIR/run.json`` records the options; a rerun with the same options skips the
windows already in ``steps.jsonl``. Results do not depend on how many workers ran them: every
window is planned alone with the run's seed, and with ``max_sweeps`` (no time limit) bit for bit.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import numpy as np

from routepack_opt.core import inputs
from routepack_opt.core.cost import CostModel
from routepack_opt.core.errors import InputError
from routepack_opt.core.io import append_bytes, atomic_write_text, check_output_path, truncate_file
from routepack_opt.core.objective import Objective, check_objective
from routepack_opt.core.topology import Topology
from routepack_opt.params import PlannerParams
from routepack_opt.report_html import (  # summary.json and report.html, re-exported
    SUMMARY,
    _natural_key,
    render_report,
    run_summary,
    summarize,
    write_summary,
)

__all__ = ["ReportConfig", "list_windows", "load_step_window", "analyze_window", "append_step", "read_steps",
           "prepare_out_dir", "render_report", "summarize", "strip_timings", "check_dirs", "FORMATS",
           "STEPS", "REPORT", "RUN", "SUMMARY", "OUTPUTS", "run_summary", "write_summary", "run_records",
           "check_out_files"]

FORMATS = ("window", "slime", "verl", "routes")
_REPLAY_SUFFIXES = (".pt", ".pth", ".npy", ".npz", ".safetensors")
PLACEMENTS = ("identity", "eplb")
STEPS, REPORT, RUN = "steps.jsonl", "report.html", "run.json"


@dataclasses.dataclass(frozen=True)
class ReportConfig:
    """What every window is planned and judged with. ``format``: ``window`` (our ``.npz``) or an
    ``import-replay`` format (``slime``, ``verl``, ``routes``; then ``num_experts`` is required)."""

    topology: Topology
    cost: CostModel
    objective: Objective = Objective.MAX_SUM  # a string is parsed once, here
    params: PlannerParams = PlannerParams()
    time_limit: float | None = None
    max_sweeps: int | None = None
    seed: int = 0
    format: str = "window"
    num_experts: int | None = None
    moe_layer_freq: object = None
    top_k: int | None = None
    cost_name: str | None = None  # how the run named its cost (shown in the options; not compared on resume)
    budget_source: str | None = None  # where the time limit came from (shown with the budget; not compared)

    def __post_init__(self):
        object.__setattr__(self, "objective", check_objective(self.objective))
        if self.format not in FORMATS:
            raise InputError(f"--format must be one of {', '.join(FORMATS)}, got {self.format!r}")
        if self.format != "window" and self.num_experts is None:
            raise InputError(f"--format {self.format} needs --num-experts E (logical experts per MoE layer)")

    def options(self) -> dict:
        """Every option of the run, flat and short (the cost by name where it has one): what
        ``summary.json`` and ``report.html`` show."""
        topo = dataclasses.asdict(self.topology)
        return {**topo, "cost": self.cost_name or "custom", "objective": self.objective,
                "time_limit": self.time_limit, "max_sweeps": self.max_sweeps, "seed": self.seed,
                "format": self.format, "num_experts": self.num_experts, "moe_layer_freq": self.moe_layer_freq,
                "top_k": self.top_k, "budget": self.budget(), "params": self.params.to_dict()}

    def budget(self) -> str:
        """The search budget of every window, in words: its time limit and sweep budget, and where
        the limit came from (``budget_source``: the seams' default, ``--time-limit``)."""
        parts = []
        if self.time_limit is not None:
            parts.append(f"{self.time_limit:g} s of search per window")
        if self.max_sweeps is not None:
            parts.append(f"at most {self.max_sweeps} sweeps per window")
        text = " and ".join(parts) if parts else "no time limit and no sweep budget (the search runs to its end)"
        if self.time_limit is None and parts:
            text += " (no time limit)"
        return f"{text}; {self.budget_source}" if self.budget_source else text

    def fingerprint(self) -> dict:
        """The options that change the numbers (not the workers): compared on resume."""
        return {"topology": dataclasses.asdict(self.topology), "cost": self.cost.to_toml(),
                "objective": self.objective, "params": self.params.to_dict(), "time_limit": self.time_limit,
                "max_sweeps": self.max_sweeps, "seed": self.seed, "format": self.format,
                "num_experts": self.num_experts, "moe_layer_freq": self.moe_layer_freq, "top_k": self.top_k}


# ---------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------


def list_windows(run_dir, fmt: str = "window") -> list[Path]:
    """The windows of ``run_dir`` (not recursive), in natural name order (``step_2`` before
    ``step_10``): ``*.npz`` for our format, else the files ``import-replay`` reads. Hidden files
    (a writer's temporaries) are skipped."""
    d = Path(run_dir)
    try:
        inputs.check_dir(d, "RUN_DIR")  # a name over 255 bytes, a loop: one line
    except InputError as exc:
        raise InputError(f"{exc}; give the directory that holds one window per step") from None
    suffixes = (".npz",) if fmt == "window" else _REPLAY_SUFFIXES
    files = [p for p in d.iterdir() if p.is_file() and not p.name.startswith(".")
             and p.suffix.lower() in suffixes]
    if not files:
        raise InputError(f"{d}: no windows ({', '.join('*' + s for s in suffixes)}) in it"
                         + ("; for replay files give --format slime|verl|routes" if fmt == "window" else ""))
    return sorted(files, key=lambda p: _natural_key(p.name))


def predicted_fill(path, cfg: ReportConfig) -> float:
    """How tightly ``path``'s tokens fill the fewest rows the volume bound allows: tokens ÷
    (R_L1 · D · capacity), in [0, 1]. Windows near 1 are the ones whose R* the cheap bounds and
    FFD/BFD do not close, where the certifier searches for seconds (the 200-window study: the
    three windows at 0.998–0.9996 took 7–12 CPU s, the others 0.4 s at the median). Reads only
    the ``lengths`` array of our ``.npz``; 0.0 for the replay formats or a file it cannot read
    (the task itself then records the error)."""
    if cfg.format != "window":
        return 0.0
    try:
        lengths = np.asarray(inputs.read_npz(path, "window", ["lengths"], ["lengths"])["lengths"], dtype=np.int64)
    except Exception:
        return 0.0
    topo = cfg.topology
    cell = topo.dp * topo.capacity
    tokens = int(lengths.clip(min=0).sum())
    if tokens <= 0 or cell <= 0:
        return 0.0
    rows = max(-(-tokens // cell), topo.min_rows)
    rows = -(-rows // topo.row_multiple) * topo.row_multiple
    return min(1.0, tokens / (rows * cell))


def schedule(items: list[tuple[str, int]], cfg: ReportConfig) -> list[tuple[str, int]]:
    """The order to start ``(path, step)`` windows in: the likely-slow ones first (highest
    :func:`predicted_fill`, ties in step order), so that a slow window does not start last and
    leave the other workers idle behind it (longest-processing-time-first list scheduling). The
    records do not depend on the order; ``steps.jsonl`` is in finishing order either way."""
    fill = {path: predicted_fill(path, cfg) for path, _ in items}
    return sorted(items, key=lambda it: (-round(fill[it[0]], 3), it[1]))


def load_step_window(path, cfg: ReportConfig):
    """One step's window: :func:`~routepack_opt.core.window.load_window`, or
    :func:`~routepack_opt.replay.import_replay` for the replay formats."""
    if cfg.format == "window":
        from routepack_opt.core.window import load_window

        return load_window(path)
    from routepack_opt.replay import import_replay

    assert cfg.num_experts is not None  # checked by ReportConfig
    return import_replay(str(path), format=cfg.format, num_experts=cfg.num_experts,
                         moe_layer_freq=cfg.moe_layer_freq, top_k=cfg.top_k).window


def check_dirs(run_dir, out_dir) -> Path:
    """Refuse an OUT_DIR that is RUN_DIR, an existing file, or in a missing directory."""
    if str(out_dir) in ("", "-"):  # '' would be the current directory; '-' is no directory
        raise InputError(f"-o {str(out_dir)!r}: give the report's directory (a name, not '' or '-')")
    out = Path(out_dir)
    run = Path(run_dir)
    if os.path.exists(out) and not os.path.isdir(out):
        raise InputError(f"{out}: exists and is not a directory; -o takes the report's directory")
    inputs.check_dir(out, "-o", must_exist=False)  # a name over 255 bytes, a symlink loop: one line
    if out.exists() and run.exists() and os.path.samefile(out, run):
        raise InputError(f"{out}: is RUN_DIR; write the report to another directory")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"{out}: directory {parent} does not exist")
    if out.is_dir():
        check_out_files(out, run)
    return out


OUTPUTS = (STEPS, RUN, SUMMARY, REPORT)  # every file the report writes in OUT_DIR


def check_out_files(out: Path, run: Path) -> None:
    """Refuse, before any work, an OUT_DIR file the report would write (``steps.jsonl``,
    ``run.json``, ``summary.json``, ``report.html``) that is not a regular file (a symlink — into
    RUN_DIR or anywhere —, a FIFO, a device) or that is a file of RUN_DIR (a hard link)
    (:func:`routepack_opt.core.io.check_output_path`)."""
    names = [out / n for n in OUTPUTS if os.path.lexists(out / n)]
    if not names:
        return
    try:
        run_files = [p for p in run.iterdir() if p.is_file()]
    except OSError:
        run_files = []
    for path in names:
        check_output_path(path, *run_files)


# ---------------------------------------------------------------------------------------------
# one window
# ---------------------------------------------------------------------------------------------


def _critical_split(ev, placement, row, slot, rows: int, objective: Objective) -> dict:
    """Attention / experts / overhead on the critical path (module docstring); sums to the makespan."""
    J_RG, A_SRG, M_RGL = ev.costs(placement, row, slot, rows, parts=True)
    att_RG = A_SRG.sum(axis=0)
    exp_RG = ev.cost.gamma * M_RGL.sum(axis=2)
    pick = objective.critical_blocks(J_RG)
    return {"attention": float(att_RG[pick].sum()), "experts": float(exp_RG[pick].sum()),
            "overhead": float(rows * ev.cost.row_overhead)}


def _seed_packing(lengths, capacity: int, num_bins: int, certified) -> tuple[np.ndarray, bool]:
    """A packing into at most ``num_bins`` bins that does not depend on the machine's speed, for
    the seeds' last resort (tight windows). The certifier's steps with budgets in iterations and
    search nodes instead of seconds: FFD/BFD; the overflow tabu search from them; MBS' (200
    seeded restarts, stopping at ``num_bins``); the tabu search from MBS'. If none packs, the
    certifier's packing, which its time limits shaped (``False``: the line may then differ
    between runs)."""
    from routepack_opt.certify import _mbs_nodes
    from routepack_opt.heuristics.binpack import best_packing, fixed_bins_search, minimum_bin_slack

    base, used, _ = best_packing(lengths, capacity)
    if used <= num_bins:
        return base, True
    found = fixed_bins_search(lengths, capacity, num_bins, start=base, seed=0, time_limit=None)
    if found is not None:
        return found, True
    mbs, used = minimum_bin_slack(lengths, capacity, restarts=200, target=num_bins,
                                  node_limit=_mbs_nodes(len(lengths)), time_limit=None)
    if used <= num_bins:
        return mbs, True
    found = fixed_bins_search(lengths, capacity, num_bins, start=mbs, seed=1, time_limit=None)
    if found is not None:
        return found, True
    return certified, False


def _judge(ev, window, topology: Topology, placement, row, slot, rows: int, R_star: int, objective: Objective) -> dict:
    from routepack_opt.heuristics.frameworks import cap_violations

    e = ev.evaluate(placement, row, slot, rows, objective)
    return {"makespan": e.score.makespan, "rows": int(rows), "extra_rows": int(rows - R_star),
            "cap_violations": cap_violations(window.lengths, row, slot, rows, topology.dp, topology.capacity),
            "lower_bound": e.lower_bound, "gap": e.gap}


def _plan_window(window, cfg: ReportConfig, t: dict):
    """R* with its certificate (seeded by a packing independent of the machine's speed where one
    is found), then the plan, the row count searched from R*; their seconds into ``t``. Returns
    (R*, certificate, whether the seed packing is deterministic, plan)."""
    from routepack_opt.pipeline import certified_rows, solve

    topo = cfg.topology
    t1 = time.perf_counter()
    c = cfg.params.certify
    R, full = certified_rows(window, topo, None, c.time_limit, c.method)
    packing, deterministic = _seed_packing(window.lengths, topo.capacity, R * topo.dp, full.packing_N)
    full = dataclasses.replace(full, packing_N=packing)
    t["certify"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    # the row count is searched from the certified R* (issue 42): rows=None with its certificate
    plan = solve(window, topo, cfg.cost, objective=cfg.objective, placement="lpt", rows=None, params=cfg.params,
                 time_limit=cfg.time_limit, max_sweeps=cfg.max_sweeps, seed=cfg.seed, certificate=full)
    t["plan"] = time.perf_counter() - t1
    return R, full, deterministic, plan


def _baseline_placements(window, topology: Topology, load_LE) -> dict:
    """The expert placements the baselines run under: identity and EPLB (LPT), or with
    replicas every placement with the same replica slots as our plan."""
    from routepack_opt.heuristics.placement.lpt import identity_placement, lpt_placement
    from routepack_opt.pipeline import resolve_placement

    if topology.redundant_experts:
        return {k: resolve_placement(window, topology, k)[0] for k in PLACEMENTS}
    return {"identity": identity_placement(window.num_layers, window.num_experts),
            "eplb": lpt_placement(load_LE, topology.ep)}


def _baseline_layouts(window, topology: Topology, R: int, full) -> tuple[dict[str, tuple], dict[str, str]]:
    """Each framework's own packing (verl's KK also at R*, from the certificate's packing):
    (layouts ``(row, slot, rows)`` by name, errors by name)."""
    from routepack_opt.heuristics.baselines import BASELINES
    from routepack_opt.heuristics.frameworks import FRAMEWORK_PACKERS
    from routepack_opt.pipeline import SharedPacker

    layouts: dict[str, tuple] = {}
    errors: dict[str, str] = {}
    try:
        row, slot = BASELINES["verl-kk"](window.lengths, topology, R, exact_pack=SharedPacker(
            window.lengths, topology.capacity, full.packing_N))
        layouts["verl-kk@R*"] = (row, slot, R)
    except Exception as exc:
        errors["verl-kk@R*"] = f"{exc.__class__.__name__}: {exc}"
    for pname, fn in FRAMEWORK_PACKERS.items():
        try:
            layouts[pname] = fn(window.lengths, topology)
        except Exception as exc:  # e.g. verl needing more micro-batches than a rank has samples
            errors[pname] = f"{exc.__class__.__name__}: {exc}"
    return layouts, errors


def _judge_baselines(ev, window, placements: dict, layouts: dict, errors: dict, R: int, objective: Objective,
                     ours: float) -> dict[str, dict]:
    """Every ``packer/placement`` baseline scored by the evaluator (or its packer's error), with
    its saving against our makespan ``ours``."""
    baselines: dict[str, dict] = {}
    for plname, pl in placements.items():
        for pname, (row, slot, rows) in layouts.items():
            baselines[f"{pname}/{plname}"] = _judge(ev, window, ev.topology, pl, row, slot, rows, R, objective)
    for pname, msg in errors.items():
        for plname in placements:
            baselines[f"{pname}/{plname}"] = {"error": msg}
    for b in baselines.values():
        if "makespan" in b:
            b["saving"] = (b["makespan"] - ours) / b["makespan"]
    return baselines


def analyze_window(path, cfg: ReportConfig, step: int | None = None) -> dict:
    """The report's line for one window (module docstring). Never raises: a window that cannot
    be read or planned gives ``{"window", "step", "error"}``."""
    t0, c0 = time.perf_counter(), time.process_time()
    name = Path(path).name
    out: dict = {"window": name, "step": step}
    try:
        out.update(_analyze(path, cfg, t0))
    except Exception as exc:  # recorded; the run goes on
        out["error"] = f"{exc.__class__.__name__}: {' '.join(str(exc).split())}"
        out["timings"] = {"total": time.perf_counter() - t0}
    out["timings"]["cpu"] = time.process_time() - c0  # this process's CPU seconds (all its threads)
    return out


def _analyze(path, cfg: ReportConfig, t0: float) -> dict:
    from routepack_opt.compare import plan_metrics
    from routepack_opt.core.evaluate import Evaluator
    from routepack_opt.heuristics.placement.lpt import rank_load_cv
    from routepack_opt.warmup import warm

    topo, cost, obj = cfg.topology, cfg.cost, cfg.objective
    t = {}
    window = load_step_window(path, cfg)
    topo.check_experts(window.num_experts)
    t["load"] = time.perf_counter() - t0
    warm()  # numba kernels loaded (once per worker process) before the clock of the planning starts
    R, full, deterministic, plan = _plan_window(window, cfg, t)
    t1 = time.perf_counter()
    ev = Evaluator(window, topo, cost)
    m = plan_metrics(ev, plan, obj, t["plan"])
    load_LE = window.expert_loads()
    placements = _baseline_placements(window, topo, load_LE)
    layouts, errors = _baseline_layouts(window, topo, R, full)
    ours = m["makespan"]
    baselines = _judge_baselines(ev, window, placements, layouts, errors, R, obj, ours)
    keeping = {k: b for k, b in baselines.items() if "makespan" in b and b["cap_violations"] == 0}
    best = min(keeping, key=lambda k: (keeping[k]["makespan"], k)) if keeping else None
    t["baselines"] = time.perf_counter() - t1
    t["total"] = time.perf_counter() - t0
    cert = plan.certificate or {}
    rec = {"samples": window.num_samples, "tokens": int(window.total_tokens), "layers": window.num_layers,
           "experts": window.num_experts, "rows": plan.rows,
           "certificate": {k: cert.get(k) for k in ("rows", "status", "lower_bound", "method")},
           "objective": obj, "makespan": ours, "lower_bound": m["lower_bound"], "gap": m["gap"],
           "lower_bound_any_placement": ev.placement_free_lower_bound(plan.rows),
           # plan_metrics names each objective's makespan "makespan_<objective with _>"
           "makespan_other_objective": m["makespan_" + obj.other.replace("-", "_")],
           "ep_imbalance": {"routepack": m["ep_rank_cv"],
                            **{k: rank_load_cv(load_LE, pl, topo.ep) for k, pl in placements.items()}},
           "time_split": _critical_split(ev, plan.expert_placement, plan.row, plan.slot, plan.rows, obj),
           "baselines": baselines, "best_baseline": best,
           "saving": None if best is None else keeping[best]["saving"],
           "rows_saved": None if best is None else keeping[best]["rows"] - plan.rows,
           "fallback": plan.report.fallback,
           # R*, the chosen R and why; where a baseline still beats the plan, the reason (issue 42)
           "row_search": {k: (plan.info.get("row_search") or {}).get(k)
                          for k in ("r_star", "chosen", "why", "makespan_r_star", "makespan_chosen")},
           "baseline_wins": (None if best is None or keeping[best]["saving"] >= 0 else
                             (plan.info.get("baseline_check") or {}).get("reason")
                             or (f"{best} at {keeping[best]['rows']} rows scores below the plan at {plan.rows}: the "
                                 "row count was held at R* ([rows] extra = 0), so neither the row search nor "
                                 "the baseline check ran" if "baseline_check" not in plan.info else
                                 f"{best} scores below the plan under this cost; the plan's baseline check "
                                 "did not cover it")),
           # False where neither FFD/BFD nor an iteration-bounded search packs into R*·D bins and
           # the certifier's time-bounded packing seeds the plan: the line may then differ
           # between runs (never seen on the study's windows)
           "deterministic": deterministic and cert.get("status") == "optimal"}
    if topo.redundant_experts:
        rec.update(redundant_experts=topo.redundant_experts, force_balanced_lower_bound=m["force_balanced_lower_bound"],
                   gap_force_balanced=m["gap_force_balanced"],
                   replica_bytes_per_rank=topo.redundant_experts / topo.ep * cost.expert_bytes)
    if best is not None:
        bl = best.split("/")
        brow, bslot, brows = layouts[bl[0]]
        rec["time_split_best_baseline"] = _critical_split(ev, placements[bl[1]], brow, bslot, brows, obj)
    rec["timings"] = t
    return rec


# ---------------------------------------------------------------------------------------------
# steps.jsonl
# ---------------------------------------------------------------------------------------------


def _dumps(rec: dict) -> str:
    from routepack_opt.core.plan import dumps_strict

    return dumps_strict(rec, separators=(",", ":"), sort_keys=True)


def append_step(path, rec: dict) -> None:
    """Append ``rec`` as one line: one ``os.write`` of the whole line to an ``O_APPEND`` file
    descriptor, then ``fsync`` (:func:`routepack_opt.core.io.append_bytes`: never through a link,
    never into a FIFO or device). A reader never sees a finished line half written; a kill during
    the write leaves at most a torn last line, which :func:`read_steps` ignores."""
    append_bytes(path, (_dumps(rec) + "\n").encode("utf-8"))


def read_steps(path, notes: list[str] | None = None) -> tuple[list[dict], bool]:
    """(records, torn): every complete line of ``steps.jsonl`` that holds a step record as a run
    writes it; ``torn`` when the last line was cut by a kill (no newline, or not JSON) and was
    left out. A JSON line that fails the record's schema (:func:`routepack_opt.core.inputs.
    check_step_record`: a negative makespan, a saving of 1e300, a step of 2^70, a float where an
    integer belongs) is skipped, its reason appended to ``notes``: it counts nowhere, and its
    window is planned again on a resume. A line before the last one that is not JSON at all is an
    InputError (the file was edited or is not ours)."""
    p = Path(path)
    if not os.path.lexists(p):
        return [], False
    data = inputs.read_bytes(p, "steps file", limit=1 << 34)  # a directory, FIFO, huge file: refused
    lines = data.split(b"\n")
    tail = lines.pop()  # after the last newline: b"" when the file ends cleanly
    torn = bool(tail.strip())
    out = []
    for k, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)  # NaN/Infinity load, and the schema refuses them
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            if k == len(lines) - 1 and not tail:
                torn = True
                break
            raise InputError(f"{p}: line {k + 1} is not a JSON object; move the file away to start over") from None
        try:  # the one schema check of a line, before any work (api: core/inputs.py)
            inputs.check_step_record(rec, f"line {k + 1}")
        except InputError as exc:
            if notes is not None:
                notes.append(f"{inputs.display_name(p)}: ignored {exc} (not a line a run writes)")
            continue
        out.append(rec)
    return out, torn


def run_records(records: list[dict], windows: list[str], notes: list[str] | None = None) -> list[dict]:
    """The lines the report counts: the newest line of each window of RUN_DIR (``windows``, the
    names :func:`list_windows` found), in the order read. A line for any other name
    (``ghost.npz``, ``../../etc/passwd``: a window this run never had) is left out, with a note
    in ``notes`` that does not repeat the name."""
    names = set(windows)
    latest: dict[str, dict] = {}
    stray = 0
    for r in records:
        if r["window"] in names:
            latest[r["window"]] = r  # a retried window: its newest line
        else:
            stray += 1
    if stray and notes is not None:
        notes.append(f"steps.jsonl: ignored {stray} line(s) for windows that are not in RUN_DIR")
    return list(latest.values())


def _trim_torn_tail(path) -> None:
    """Cut a torn last line (everything after the last complete, parseable line)."""
    p = Path(path)
    if not os.path.lexists(p):
        return
    data = inputs.read_bytes(p, "steps file", limit=1 << 34)
    keep = len(data)
    if not data.endswith(b"\n"):
        keep = data.rfind(b"\n") + 1
    else:
        last = data[:-1].rfind(b"\n") + 1
        try:
            json.loads(data[last:])
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            keep = last
    if keep != len(data):
        truncate_file(p, keep)


def strip_timings(rec: dict) -> dict:
    """A record without its timings: what must be equal between runs with any worker count."""
    return {k: v for k, v in rec.items() if k != "timings"}


def prepare_out_dir(out_dir, cfg: ReportConfig) -> None:
    """Create OUT_DIR; write ``run.json`` (the options), or check it against a previous run's."""
    out = Path(out_dir)
    try:
        out.mkdir(exist_ok=True)
    except OSError as exc:
        raise InputError(f"{out}: cannot create ({exc.strerror or exc})") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise InputError(f"{out}: not writable")
    fp = json.loads(_dumps(cfg.fingerprint()))
    run = out / RUN
    if os.path.lexists(run):
        try:
            old = inputs.parse_json(inputs.read_text(run, "run.json"), str(run), "run.json")
        except InputError as exc:
            raise InputError(f"{exc}; move OUT_DIR away to start over") from None
        if not isinstance(old, dict):
            raise InputError(f"{inputs.display_name(run)}: not a JSON object of options; move OUT_DIR away to "
                             "start over")
        # compared as JSON text, not as Python values: "seed": 0.0 or true is not the 0 or 1 a run writes
        same = lambda k: k in old and k in fp and _dumps({"v": old[k]}) == _dumps({"v": fp[k]})
        diff = sorted(k for k in set(old) | set(fp) if not same(k))
        if diff:
            raise InputError(f"{out}: holds a run made with other options ({', '.join(diff)}); use the same "
                             "options to resume, or another OUT_DIR")
    else:
        atomic_write_text(run, json.dumps(fp, indent=1, sort_keys=True) + "\n")
    _trim_torn_tail(out / STEPS)

"""Cold start: compile (or load from numba's on-disk cache) every kernel before any clock starts.

The search kernels are numba functions compiled on first call (``cache=True`` writes the machine
code to disk). On a fresh install the first plan would compile for ~30 s, inside the search's
time limit, and return a worse plan. :func:`warm` runs every planning kernel once, for every
type signature the planner calls it with, on tiny windows, so that:

- the pipeline (:func:`routepack_opt.pipeline.solve`) calls ``warm()`` at its entry, *before*
  its time-limit clock starts: compilation never counts against a limit (the annealer, below
  it, compiles what a direct call needs off its own clock, in ``warm_storage``);
- ``routepack warmup`` does it ahead of time (at install or image build), for every group, and
  reports what it compiled and what it loaded from the cache;
- :class:`routepack_opt.api.AsyncPlanner` starts it in a background thread when created.

One family is left out of the default warm-up: the annealer's int32/int64 load storages, needed
only when one sample sends ≥ 2^15 tokens to one EP rank (or a rank gets ≥ 2^30). Compiling them
costs as much as everything else together, so the annealer compiles the one a window needs on
first use, off its clock (:func:`routepack_opt.heuristics.anneal.warm_storage`);
``routepack warmup`` (group ``storage``) compiles both ahead of time.

``warm()`` runs once per process per group (later calls return the first report at once); a lock
makes concurrent callers wait for the one warm-up instead of compiling twice, and a call from
inside the warm-up itself (a kernel's caller that calls ``warm()`` again) returns immediately.

The warmers drive the same functions the pipeline does — placement, the R* certifier, the
baselines, the evaluator, the annealer, joint placement, the exact models' numba parts — on tiny
windows; this module sits above them and below the pipeline, so it cannot call the pipeline
itself. Where the cache lives: :mod:`routepack_opt.core.cache`.

In parallel (``warm(groups, jobs=N)``, ``routepack warmup --jobs N``): numba's on-disk cache is
shared by processes, so worker processes first compile independent *units* into it — the
annealer's greedy seed and its Metropolis loop for each load storage, the planning kernels
around them, joint placement's refinement and migration kernels, the exact models' parts; each
unit's heavy kernels are its own, so no two workers compile the same heavy function — then the
replica kernels (which sit on top of the plan group's), and the calling process loads the lot from
the cache through the serial path above, compiling whatever a worker missed. On two workers the
annealer's search loop, the longest unit, is the critical path; the other worker compiles the rest
of the plan group, the greedy seed and joint placement's kernels beside it (joint placement's own
driver runs the annealer, so its unit drives the refinement and the matching directly). The
workers are plain ``python -c`` subprocesses (never a fork or a re-import of the caller's
``__main__``), run by a thread pool of ``jobs`` threads.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import importlib
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import numpy as np
from numba.core import config as numba_config
from numba.core.dispatcher import Dispatcher

from routepack_opt.certify import certify_rows, pack_into_bins
from routepack_opt.core.cost import get_preset
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.core.objective import Objective
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import Window
from routepack_opt.heuristics import anneal, binpack, cells
from routepack_opt.heuristics.baselines import BASELINES, verl_kk_layout
from routepack_opt.heuristics.placement.joint import JointConfig, joint_search
from routepack_opt.heuristics.placement.lpt import identity_placement, lpt_placement, swap_refine
from routepack_opt.heuristics.placement.migration import align_slots, migration_cost
from routepack_opt.heuristics.placement.refine import RefineConfig, refine_placement
from routepack_opt.heuristics.placement.replica_refine import block_expert_loads, refine_replicas
from routepack_opt.heuristics.placement.replicate import replicated_placement
from routepack_opt.models import binpack as exact_binpack
from routepack_opt.models import branch_price, colgen, layout_blocks
from routepack_opt.models.layout_common import LayoutInstance
from routepack_opt.replay import import_replay

__all__ = ["warm", "groups_for", "GROUPS", "UNITS", "numba_kernels", "run_unit", "default_jobs"]

log = logging.getLogger(__name__)

# The modules whose numba kernels each group compiles.
_ANNEAL = tuple(f"routepack_opt.heuristics.anneal.{m}"
                for m in ("rng", "kernels", "state", "moves", "greedy"))
GROUPS = {
    # everything a plan (and so every trainer seam) can reach: placement, R* certification with
    # its whole escalation (the overflow tabu search, the arc-flow graph, the knapsack pricing of
    # column generation and branch-and-price), the baselines, the annealer, and the seams' route
    # import (verl's padded routes and slime's per-sample ones, int16 / int32 / int64 ids)
    "plan": ("routepack_opt.core.projection", "routepack_opt.core.cost_kernel",
             "routepack_opt.heuristics.placement.lpt",
             "routepack_opt.heuristics.binpack", "routepack_opt.heuristics.cells",
             "routepack_opt.heuristics.baselines",
             "routepack_opt.models.binpack", "routepack_opt.core._knapsack", "routepack_opt.models.branch_price",
             "routepack_opt.replay.kernels", *_ANNEAL),
    # row-aware joint placement and migration (``--placement joint``, compare), warmed when used
    "joint": ("routepack_opt.heuristics.placement.refine", "routepack_opt.heuristics.placement.migration"),
    # expert replicas (``redundant_experts`` > 0): the replica placement, its row-aware moves, and
    # the projection's surrogate loads and exact even-local split (kernels of the plan group's
    # projection module, compiled only here); warmed when a plan asks for replicas
    "replicas": ("routepack_opt.heuristics.placement.replicate",
                 "routepack_opt.heuristics.placement.replica_refine"),
    # the annealer's rare load storages (int32 / int64 loads: samples of ≥ 2^15 tokens on one
    # rank, or ≥ 2^30 tokens per rank); compiled before the annealer's clock when a window needs
    # them (anneal.warm_storage), so only ``routepack warmup`` does them ahead of time
    "storage": _ANNEAL,
    # ``routepack exact``'s block decomposition (the certifier's exact parts are the plan group's)
    "exact": ("routepack_opt.models.layout_blocks",),
}

_lock = threading.RLock()
_local = threading.local()  # .depth > 0 while this thread runs a warm-up
_done: dict[str, dict] = {}


def groups_for(placement, redundant_experts: int = 0) -> tuple[str, ...]:
    """The warm-up groups a plan with this ``placement`` argument (and ``redundant_experts``
    replica slots per layer) needs."""
    joint = isinstance(placement, str) and placement == "joint"
    return ("plan",) + (("joint",) if joint else ()) + (("replicas",) if redundant_experts else ())


def numba_kernels(groups=tuple(GROUPS)) -> dict:
    """``{"module.function": dispatcher}`` for every numba kernel of ``groups``."""
    out = {}
    for g in groups:
        for name in GROUPS[g]:
            mod = importlib.import_module(name)
            for attr, obj in vars(mod).items():
                if isinstance(obj, Dispatcher) and obj.py_func.__module__ == name:
                    out[f"{name}.{attr}"] = obj
    return out


def _signatures(kernels: dict) -> dict:
    return {k: len(d.signatures) for k, d in kernels.items()}


def _cache_counts(kernels: dict) -> tuple[int, int]:
    hits = misses = 0
    for d in kernels.values():
        st = d.stats
        hits += sum(st.cache_hits.values())
        misses += sum(st.cache_misses.values())
    return hits, misses


def warm(groups=("plan",), jobs: int = 1, progress: Callable[[str, float, bool], None] | None = None) -> dict:
    """Compile or load every kernel of ``groups`` (``"plan"``: everything a plan or a trainer
    seam can reach — placement, R* bounds, packings and the certifier's whole escalation (tabu
    search, arc-flow graph, knapsack pricing, branch-and-price), baselines, annealer, both
    objectives, the ordinary load storage; ``"joint"``: row-aware joint placement and migration;
    ``"storage"``: the annealer's rare int32/int64 load storages, which it otherwise compiles off
    its clock when a window needs them; ``"exact"``: ``routepack exact``'s block decomposition).
    ``jobs`` > 1: first compile into numba's cache in that many worker processes (see the
    module docstring; skipped when every kernel of ``groups`` already has a cache index), calling
    ``progress(unit, seconds, ok)`` as each finishes. Returns a report: seconds,
    kernels, signatures, ``compiled`` (cache misses in this process), ``loaded`` (cache hits),
    cache directory, and ``workers`` (``{unit: seconds}``) when workers ran.
    Never raises: a failure is logged and reported (``error``), and planning then compiles
    lazily as before."""
    groups = tuple(groups)
    for g in groups:
        if g not in GROUPS:
            raise ValueError(f"warm: unknown group {g!r} (known: {', '.join(GROUPS)})")
    if getattr(_local, "depth", 0):  # called from inside the warm-up (pipeline → anneal)
        return {"groups": list(groups), "seconds": 0.0, "reentrant": True}
    if all(g in _done for g in groups):  # fast path, no lock
        return _merge(groups)
    fresh = []
    with _lock:
        t_workers = time.perf_counter()
        workers = (_compile_in_workers([g for g in groups if g not in _done], jobs, progress)
                   if jobs > 1 else {})
        t_workers = time.perf_counter() - t_workers
        for g in groups:
            if g in _done:
                continue
            fresh.append(g)
            _local.depth = getattr(_local, "depth", 0) + 1
            t0 = time.perf_counter()
            rep: dict = {"group": g}
            try:
                kernels = numba_kernels((g,))
                h0, m0 = _cache_counts(kernels)
                s0 = _signatures(kernels)
                _WARMERS[g]()
                h1, m1 = _cache_counts(kernels)
                s1 = _signatures(kernels)
                rep.update(kernels=len(kernels), signatures=sum(s1.values()),
                           new_signatures=sum(s1.values()) - sum(s0.values()),
                           compiled=m1 - m0, loaded=h1 - h0)
            except Exception as exc:  # never let the warm-up break planning
                log.warning("routepack warm-up of %s kernels failed: %s: %s", g,
                            exc.__class__.__name__, exc)
                rep["error"] = f"{exc.__class__.__name__}: {exc}"
            finally:
                _local.depth -= 1
            rep["seconds"] = time.perf_counter() - t0
            _done[g] = rep
    out = _merge(groups, fresh)
    if workers:
        out["workers"] = workers
        out["seconds"] += t_workers
    return out


def _merge(groups, fresh=()) -> dict:
    """One report for ``groups``; ``seconds`` counts only the groups warmed by this call."""
    reps = [_done[g] for g in groups]
    out = {"groups": list(groups), "already_warm": not fresh,
           "seconds": sum(_done[g]["seconds"] for g in fresh),
           "cache_dir": _cache_dir()}
    for key in ("kernels", "signatures", "new_signatures", "compiled", "loaded"):
        out[key] = sum(r.get(key, 0) for r in reps)
    errs = [f"{r['group']}: {r['error']}" for r in reps if "error" in r]
    if errs:
        out["error"] = "; ".join(errs)
    out["per_group"] = {r["group"]: {k: v for k, v in r.items() if k != "group"} for r in reps}
    return out


def _cache_dir() -> str:
    return numba_config.CACHE_DIR or "(numba default: __pycache__ beside the sources, else per-user)"


# ---------------------------------------------------------------------------------------------
# the warmers: the pipeline's code paths on tiny windows, so the argument types are exactly the
# planner's (tests/test_warmup.py checks that planning afterwards compiles nothing new)
# ---------------------------------------------------------------------------------------------


def _tiny_window(seed: int, n: int = 24, layers: int = 2, experts: int = 8, top_k: int = 2,
                 max_len: int = 40) -> Window:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max_len + 1, size=n)
    counts = np.zeros((n, layers, experts), dtype=np.int64)
    for i in range(n):
        for l in range(layers):
            picks = rng.choice(experts, size=top_k, replace=False)
            counts[i, l, picks] = lengths[i]
    return Window(lengths, counts, top_k=top_k)


def _tiny_problem():
    cfg = anneal.AnnealConfig(population=2, temperatures=2, calibration_moves=16)
    return _tiny_window(0), Topology(dp=4, ep=2, capacity=64), get_preset("olmoe-1b-7b").cost, cfg


def _placements(window: Window, ep: int) -> dict[str, np.ndarray]:
    """The pipeline's placements: ``lpt`` (LPT + swaps), ``lpt-plain``, ``identity``."""
    load = window.expert_loads()
    lpt = lpt_placement(load, ep)
    return {"lpt": swap_refine(load, lpt, ep), "lpt-plain": lpt,
            "identity": identity_placement(window.num_layers, window.num_experts)}


def _seeds(window: Window, topology: Topology, rows: int) -> list[tuple[np.ndarray, np.ndarray]]:
    return [fn(window.lengths, topology, rows, time_limit=1.0, exact_pack=pack_into_bins)
            for fn in BASELINES.values()]


def _tiny_plan():
    """:func:`_tiny_problem` with what the planner derives from it: the placements, R* and the
    baselines' seed layouts."""
    w, topo, cost, cfg = _tiny_problem()
    R = certify_rows(w, topo, time_limit=1.0).rows
    return w, topo, cost, cfg, _placements(w, topo.ep), R, _seeds(w, topo, R)


# (placement, objective, budget) as solve() runs the annealer: sweep budgets and a time limit
_PLAN_RUNS = [("lpt", Objective.MAX_SUM, {"max_sweeps": 2}), ("lpt", Objective.SUM_MAX, {"max_sweeps": 2}),
              ("identity", Objective.MAX_SUM, {"time_limit": 0.05}),
              ("lpt-plain", Objective.SUM_MAX, {"max_sweeps": 1})]


def _warm_plan(with_anneal: bool = True) -> None:
    """The plan group; ``with_anneal=False`` leaves out the annealer (a worker unit of its own)."""
    w, topo, cost, cfg, pls, R, seeds = _tiny_plan()
    ev = Evaluator(w, topo, cost)
    for name, objective, budget in _PLAN_RUNS:
        pl = pls[name]
        for row, slot in seeds:
            ev.score(pl, row, slot, R, objective)
        if with_anneal:
            res = anneal.anneal(w.lengths, ev.rank_loads(pl), topo, cost, R, objective, seeds,
                                config=cfg, seed=0, **budget)
            ev.evaluate(pl, res.row, res.slot, R, objective)
        else:
            ev.evaluate(pl, *seeds[0], R, objective)
    if with_anneal:
        anneal.warm_storage(*anneal.STORAGES[0])  # the ordinary storage (compiled above)
    _warm_certifier()
    _warm_route_import()
    # the cap repair of a length-only seed (a move, then swaps): tight windows need it
    cells.repair_capacity(np.array([6, 3, 5, 4, 2, 9]), np.array([0, 0, 0, 1, 1, 2]), 1, 3, 10)


def _warm_certifier() -> None:
    """R* escalation past the cheap bounds, every stage a near-cap window can reach, each module's
    own warmer (the ones the certifier runs before its clock): FFD/BFD (the treap above 2^22),
    MBS', the overflow tabu search and its exchanges on an instance FFD does not pack into L1
    bins, the arc-flow graph with and without a bin count (its live-load pass needs slack < C),
    the knapsack pricing (the dense DP and, at large capacities, the sparse Pareto DP) and
    branch-and-price's pricing and listing."""
    binpack.warm_kernels()
    exact_binpack.warm_kernels()
    colgen.warm_kernels()
    branch_price.warm_kernels()


def _warm_route_import() -> None:
    """The seams' route import for the id dtypes trainers record: verl's padded ``[B, S, L, K]``
    routes with their mask and slime's per-sample list (numpy and torch take the same pass)."""
    rng = np.random.default_rng(0)
    ids = np.argsort(rng.random((2, 5, 2, 8)), axis=3)[..., :2]
    mask = np.ones((2, 5), dtype=np.int64)
    for dt in (np.int16, np.int32, np.int64):
        X = ids.astype(dt)
        import_replay(X, format="verl", num_experts=8, attention_mask=mask)
        import_replay([X[0, :4], X[1, :3]], format="slime", num_experts=8, lengths=[5, 4])


def _warm_replicas() -> None:
    """Replicas: the replica placement, the surrogate loads, the exact even-local split and the
    row-aware replica moves (the annealer itself is the plan group's, on the surrogate loads)."""
    w, topo, cost, cfg = _tiny_problem()
    R = certify_rows(w, topo, time_limit=1.0).rows
    row, slot = _seeds(w, topo, R)[0]
    rtopo = dataclasses.replace(topo, redundant_experts=topo.ep)
    rpl = replicated_placement(w.expert_loads(), rtopo.ep, rtopo.num_slots(w.num_experts))
    rev = Evaluator(w, rtopo, cost)
    rev.rank_loads(rpl)
    rev.evaluate(rpl, row, slot, R, Objective.MAX_SUM)
    refine_replicas(block_expert_loads(w.counts, row, slot, R, rtopo), rpl, rtopo, max_passes=2)


def _warm_joint() -> None:
    """Joint placement as ``solve(placement="joint", current_placement=...)`` runs it."""
    w, topo, cost, _, pls, R, seeds = _tiny_plan()
    joint_search(w, topo, cost, R, Objective.MAX_SUM, pls["lpt"], seeds[0], seed=0,
                 current_placement=pls["identity"],
                 config=JointConfig(refine=RefineConfig(max_passes=4), anneal_sweeps=2, max_rounds=3))


def _warm_joint_kernels() -> None:
    """The joint group's own kernels — the row-aware refinement and the migration matching — as
    :func:`joint_search` calls them, without its annealer (the plan group's, compiled by a unit of
    its own): a worker compiles them beside the annealer's search loop instead of after it."""
    w, topo, cost, _, pls, R, seeds = _tiny_plan()
    row, slot = seeds[0]
    refine_placement(w, topo, cost, pls["lpt"], row, slot, R, Objective.MAX_SUM,
                     current_placement=pls["identity"],
                     config=RefineConfig(max_passes=4, migration_weight=1.0), seed=1)
    for relabel in (False, True):
        migration_cost(pls["identity"], align_slots(pls["lpt"], pls["identity"], topo.ep, relabel=relabel),
                       topo, cost)


def _warm_storage() -> None:
    for storage in anneal.STORAGES[1:]:
        anneal.warm_storage(*storage)


def _warm_exact() -> None:
    _warm_certifier()
    _warm_blocks()


def _warm_blocks() -> None:
    """The block decomposition's enumeration and exact-cover search (``routepack exact``)."""
    w = _tiny_window(1, n=8, experts=4, max_len=30)
    topo = Topology(dp=2, ep=2, capacity=64)
    cost = get_preset("olmoe-1b-7b").cost
    start = verl_kk_layout(w.lengths, topo, 2, exact_pack=pack_into_bins)
    for objective in Objective:
        inst = LayoutInstance.build(w, topo, cost, identity_placement(w.num_layers, w.num_experts),
                                    2, objective)
        if layout_blocks.applicable(inst):
            layout_blocks.solve_blocks(inst, 5.0, start)


_WARMERS = {"plan": _warm_plan, "joint": _warm_joint, "replicas": _warm_replicas, "storage": _warm_storage,
            "exact": _warm_exact}


# ---------------------------------------------------------------------------------------------
# parallel compilation: worker units (see the module docstring)
# ---------------------------------------------------------------------------------------------


def _storage_unit(k: int, part: str) -> Callable[[], None]:
    return lambda: anneal.drive_storage(*anneal.STORAGES[k], parts=(part,))


_SEARCH = "routepack_opt.heuristics.anneal.moves.run_population"
_GREEDY = "routepack_opt.heuristics.anneal.greedy.greedy_place"


def _storage_mark(k: int) -> str:
    """The text of a search kernel's cached signature that names load storage k (b's dtype is
    the third array of the compiled ``Problem``)."""
    return f"Problem(array(int64, 1d, C), array(int64, 1d, C), array({np.dtype(anneal.STORAGES[k][0]).name}, 2d"


# unit → (group, stage, driver, landmarks). Stage 0 units share no heavy kernel (joint shares
# plan:rest's small ones: listed after it, a second worker runs it once they are cached); stage 1
# (replicas) runs on top of the plan group's kernels, so after stage 0. Listed longest first
# (measured serially). Landmarks: (kernel, text its cached signature must hold) — a unit whose landmarks
# all have a current cache entry is not run again (if one is stale or missing, it is).
UNITS: dict[str, tuple[str, int, Callable[[], None], tuple[tuple[str, str], ...]]] = {
    "plan:anneal-search": ("plan", 0, _storage_unit(0, "search"), ((_SEARCH, _storage_mark(0)),)),
    "plan:rest": ("plan", 0, lambda: _warm_plan(with_anneal=False),
                  tuple((f"routepack_opt.{k}", "") for k in (
                      "heuristics.cells._kk_kernel", "heuristics.cells._repair_cells",
                      "heuristics.binpack._mbs_kernel", "heuristics.binpack._overflow_tabu",
                      "models.binpack._alive_loads", "replay.kernels.count_rows",
                      "heuristics.placement.lpt._swap_kernel",
                      "core.projection.project_counts", "core.projection.block_loads"))),
    "plan:anneal-greedy": ("plan", 0, _storage_unit(0, "greedy"), ((_GREEDY, _storage_mark(0)),)),
    "joint": ("joint", 0, _warm_joint_kernels, (("routepack_opt.heuristics.placement.refine._scan_layer", ""),
                                                ("routepack_opt.heuristics.placement.migration._hungarian_max", ""))),
    "storage:int32-search": ("storage", 0, _storage_unit(1, "search"), ((_SEARCH, _storage_mark(1)),)),
    "storage:int32-greedy": ("storage", 0, _storage_unit(1, "greedy"), ((_GREEDY, _storage_mark(1)),)),
    "storage:int64-search": ("storage", 0, _storage_unit(2, "search"), ((_SEARCH, _storage_mark(2)),)),
    "storage:int64-greedy": ("storage", 0, _storage_unit(2, "greedy"), ((_GREEDY, _storage_mark(2)),)),
    "exact": ("exact", 0, _warm_exact, (("routepack_opt.models.layout_blocks._cover_dfs", ""),
                                         ("routepack_opt.models.binpack._arcflow_arcs", ""))),
    "replicas": ("replicas", 1, _warm_replicas,
                 (("routepack_opt.heuristics.placement.replica_refine._search_all", ""),
                  ("routepack_opt.core.projection.replica_block_loads", ""))),
}


def run_unit(name: str) -> None:
    """Run one worker unit in this process (the workers' entry point)."""
    UNITS[name][2]()


def default_jobs() -> int:
    """The CPUs this process may use (its affinity mask), for ``--jobs``' default."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _unit_cached(name: str, kernels: dict) -> bool:
    """Every landmark of unit ``name`` has a cache entry for the current source (numba's index
    is empty when the source changed since it was written) whose signature holds its text."""
    for kernel, mark in UNITS[name][3]:
        try:
            index = kernels[kernel]._cache._cache_file._load_index()
        except Exception:  # no cache (numba internals changed, unreadable index): compile
            return False
        if not any(mark in str(key[0]) for key in index):
            return False
    return True


def _run_worker(name: str) -> tuple[str, float, bool, str]:
    t = time.perf_counter()
    code = "import sys; from routepack_opt.warmup import run_unit; run_unit(sys.argv[1])"
    r = subprocess.run([sys.executable, "-c", code, name], capture_output=True, text=True)
    tail = (r.stderr or "").strip().splitlines()[-1:] if r.returncode else []
    return name, time.perf_counter() - t, r.returncode == 0, " ".join(tail)


def _compile_in_workers(groups, jobs: int, progress) -> dict[str, float]:
    """Compile the units of ``groups`` into numba's cache in ``jobs`` worker processes, stage by
    stage. A failed unit is logged; the serial pass after it compiles what is still missing."""
    kernels = numba_kernels(tuple(GROUPS))
    todo = [n for n, (g, *_) in UNITS.items() if g in groups and not _unit_cached(n, kernels)]
    times: dict[str, float] = {}
    if not todo:
        return times
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        for stage in (0, 1):
            names = [n for n in todo if UNITS[n][1] == stage]
            futures = [pool.submit(_run_worker, n) for n in names]  # longest first
            for fut in concurrent.futures.as_completed(futures):
                name, secs, ok, why = fut.result()
                times[name] = secs
                if not ok:
                    log.warning("routepack warm-up worker %s failed (compiled in-process instead): %s",
                                name, why)
                if progress is not None:
                    progress(name, secs, ok)
    return times

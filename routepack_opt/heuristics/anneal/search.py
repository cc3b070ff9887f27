"""Population annealing over feasible layouts at fixed placement and rows (docs/pipeline.md,
step 3): :func:`anneal`, the driver of the package.

Legend: N samples, L layers, P EP ranks, D DP slots, G = D/P shards, R rows, K replicas.

Method — population annealing (Hukushima & Iba 2003; Machta 2010): K replicas walk a geometric
ladder of temperatures from hot to cold (:mod:`~routepack_opt.heuristics.anneal.schedule`). At
each temperature every replica runs Metropolis sweeps (one sweep = N proposals) of moves that
keep every constraint (:mod:`~routepack_opt.heuristics.anneal.moves`); between temperatures the
population is resampled and every replica gets a fresh random stream.

Seeds: the caller's constructive layouts (e.g. length-balanced baselines), the joint-cost greedy
(:mod:`~routepack_opt.heuristics.anneal.greedy`) and random walks (moves at T = ∞) off them.

Energy (mirrors the lexicographic score of docs/model.md; ``η = tie_eps``)::

    E = makespan + η/(2G) · total + η/2 · peak

Since J ≥ 0, total ≤ G·makespan (max-sum: Σ_g Σ_r J ≤ G·max_g Σ_r J; sum-max: Σ_r Σ_g J ≤
G·Σ_r max_g J) and peak ≤ makespan, so the two tie-break terms together stay within [0,
η·makespan]: a makespan difference larger than η·makespan (default 1e-9 relative) can never be
overridden by them, while 1e-9 is ~10⁶ float64 ulps — far above the rounding noise of summing
R·G costs. Moves are compared by ΔE = Δmakespan + η/(2G)·Δtotal + η/2·Δpeak computed from the
component deltas (not as a difference of two large energies), so ties on the makespan are still
broken by total, then peak. The incremental state is described in
:mod:`~routepack_opt.heuristics.anneal.state`.

Determinism: replicas run in parallel (numba ``prange``), each with its own xoshiro256**
stream seeded by splitmix64 from (seed, temperature, replica); resampling draws from
(seed, temperature) (:mod:`~routepack_opt.heuristics.anneal.rng`). With ``max_sweeps`` (or the
config's budget) and a seed the result is bit-identical whatever the thread count.
``time_limit`` makes the search anytime (best so far), and without ``max_sweeps`` the rungs are
shortened so the ladder finishes in time.

Compilation: the kernels compile (or load from numba's cache) on first use, for the load
storage a window needs, inside :func:`warm_storage`, whose time :func:`anneal` takes off its
clock; ``routepack warmup`` (:mod:`routepack_opt.warmup`) does it ahead of time.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from routepack_opt.core.bounds import layout_lower_bound
from routepack_opt.core.checks import check_time_limit
from routepack_opt.core.cost import CostModel, Stage
from routepack_opt.core.errors import InputError
from routepack_opt.core.objective import Objective
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import available_memory
from routepack_opt.heuristics.anneal.config import AnnealConfig, AnnealResult
from routepack_opt.heuristics.anneal.greedy import greedy_seed
from routepack_opt.heuristics.anneal.moves import run
from routepack_opt.heuristics.anneal.problem import Instance
from routepack_opt.heuristics.anneal.rng import rng_states
from routepack_opt.heuristics.anneal.schedule import fit_rung, ladder, moves_per_rung, resample_parents
from routepack_opt.heuristics.anneal.state import Population

__all__ = ["anneal", "Hooks", "layout_energy", "warm_storage", "drive_storage", "STORAGE_PARTS", "STORAGES"]

GREEDY_SHARE = 0.25  # of a time limit, at most, for the joint-cost greedy seed
# of a time limit: the calibration walks stop at half of it, the random walks off the seeds at it
# (the defaults take milliseconds; a config's large calibration_moves or random_walk_sweeps do not)
SETUP_SHARE = 0.5
DEFAULT_K = AnnealConfig().population  # chunks are sized for it (see ``chunk`` below)


def check_population_memory(inst: Instance, K: int) -> None:
    """InputError up front when K replicas of this window cannot be allocated in the memory left."""
    need = K * Population.bytes_per_replica(inst)
    avail = available_memory()
    if avail is not None and need > avail:
        raise InputError(f"anneal: population = {K:,} replicas of this window need "
                         f"{need / 2**30:.1f} GiB ({Population.bytes_per_replica(inst):,} bytes each); only "
                         f"{avail / 2**30:.1f} GiB is available: lower [anneal] population")


def layout_energy(lengths_N, b_NLP, topology: Topology, cost: CostModel, rows: int, objective: Objective,
                  row_N, slot_N, tie_eps: float = 1e-9) -> tuple[float, tuple[float, float, float]]:
    """(energy, (makespan, total, peak)) of one layout by the search's own compiled state."""
    inst = Instance(lengths_N, b_NLP, topology, cost, rows, objective, tie_eps)
    pop = Population(inst, 1)
    r, s = inst.check_layout(row_N, slot_N, "layout")
    pop.init(r[None], s[None])
    a = pop.state.agg[0]
    return float(a[3]), (float(a[0]), float(a[1]), float(a[2]))


@dataclasses.dataclass(frozen=True)
class Hooks:
    """Callbacks of one :func:`anneal` call: ``progress(fraction)`` after each temperature;
    ``stop()`` polled after every chunk of sweeps (True: end early with the best so far — a
    cooperative cancel, e.g. :class:`routepack_opt.api.AsyncPlanner` superseding a window)."""

    progress: Callable[[float], None] | None = None
    stop: Callable[[], bool] | None = None


def anneal(lengths_N, b_NLP, topology: Topology, cost: CostModel, rows: int, objective: Objective,
           seeds: Sequence[tuple] = (), config: AnnealConfig | None = None, seed: int = 0,
           time_limit: float | None = None, max_sweeps: int | None = None,
           hooks: Hooks | None = None) -> AnnealResult:
    """Population annealing for the packing at fixed placement (via ``b_NLP``) and ``rows``.

    ``seeds``: feasible layouts ``(row_N, slot_N)`` from constructive heuristics (validated);
    the joint-cost greedy is added when ``config.greedy_seed``. Budget: ``max_sweeps`` sweeps
    per replica over the ladder (default ``config.sweeps``). ``time_limit`` (seconds, counted
    from the call) is a hard stop that returns the best so far; without ``max_sweeps`` the rungs
    are also shrunk to the measured rate so the whole ladder (hot → cold) fits in the limit
    (``config.fill_time`` stretches them to use all of it). Only ``max_sweeps``/the config
    budget without a time limit is bit-identical for a seed. ``hooks``: progress and cancel
    callbacks (:class:`Hooks`).
    The result is never worse (by the evaluator's lexicographic score) than the best seed.

    The kernels compile (or load from numba's cache) on the first call in a process, off the
    clock (see the module docstring).
    """
    t0 = time.perf_counter()
    cfg = _checked_config(config, time_limit, max_sweeps)
    inst = Instance(lengths_N, b_NLP, topology, cost, rows, objective, cfg.tie_eps)
    t0 += warm_storage(inst.b.dtype, inst.wdtype)  # off the clock (compiles here on first use)
    search = _Search(inst, cfg, int(seed), _Clock(t0, time_limit, hooks or Hooks()))
    tt = time.perf_counter()
    search.seed(seeds)
    search.timings["seeds"] = time.perf_counter() - tt
    tt = time.perf_counter()
    check_population_memory(inst, cfg.population)
    search.calibrate(topology, cost)
    search.populate()
    search.schedule(max_sweeps)
    search.timings["setup"] = time.perf_counter() - tt
    search.walk_ladder()
    return search.result(objective)


def _checked_config(config, time_limit, max_sweeps) -> AnnealConfig:
    """The config (default if None), with the time limit and sweep budget checked."""
    cfg = AnnealConfig() if config is None else config
    if not isinstance(cfg, AnnealConfig):
        raise InputError("anneal: config must be an AnnealConfig")
    if time_limit is not None:
        check_time_limit(time_limit, "anneal: time_limit")
    if max_sweeps is not None and (isinstance(max_sweeps, bool)
                                   or not isinstance(max_sweeps, (int, np.integer))
                                   or max_sweeps < 1):
        raise InputError(f"anneal: max_sweeps must be a positive integer, got {max_sweeps!r}")
    return cfg


@dataclasses.dataclass
class _Clock:
    """One :func:`anneal` call's clock: its start ``t0`` (moved past compilation), the time
    limit and the hooks."""

    t0: float
    time_limit: float | None
    hooks: Hooks

    def at(self, share: float) -> float | None:
        """The time ``share`` of the limit is spent (None: no limit)."""
        return None if self.time_limit is None else self.t0 + share * float(self.time_limit)

    def cancelled(self) -> bool:
        return self.hooks.stop is not None and self.hooks.stop()

    def out_of_time(self, share: float) -> bool:
        """``share`` of the time limit is spent, or stop() says no more."""
        late = self.time_limit is not None and time.perf_counter() >= self.at(share)
        return late or self.cancelled()


class _Search:
    """The phases of one :func:`anneal` call, in order: :meth:`seed`, :meth:`calibrate`,
    :meth:`populate`, :meth:`schedule`, :meth:`walk_ladder`, :meth:`result`; each leaves what
    the next one needs in attributes."""

    def __init__(self, inst: Instance, cfg: AnnealConfig, seed: int, clock: _Clock):
        self.inst, self.cfg, self.rng_seed, self.clock = inst, cfg, seed, clock
        self.timings: dict[str, float] = {}

    def seed(self, seeds: Sequence[tuple]) -> None:
        """The seed layouts (the caller's, validated, and the greedy's), their population and
        energies, and the best one."""
        inst, cfg = self.inst, self.cfg
        layouts = [inst.check_layout(r, s, f"seed {n}") for n, (r, s) in enumerate(seeds)]
        self.greedy_used = False
        if cfg.greedy_seed:
            # the greedy is O(N·R·G·L·P): with a time limit it may take a share of it, else skipped
            g = greedy_seed(inst, self.clock.at(GREEDY_SHARE))
            self.greedy_used = g is not None
            if g is not None:
                layouts.append((g[0].astype(np.int32), g[1].astype(np.int32)))
        if not layouts:
            raise InputError("anneal: no feasible seed layout (pass one, e.g. a length-balanced packing)")
        self.layouts = layouts
        self.seeds_pop = Population(inst, len(layouts))
        self.seeds_pop.init(np.stack([r for r, _ in layouts]), np.stack([s for _, s in layouts]))
        self.seed_energy = self.seeds_pop.energy.copy()
        self.best_seed = int(np.argmin(self.seed_energy))
        # The walks below run in chunks of at least a sweep (the defaults: one chunk, draw for
        # draw as one call), with the clock and stop() read between chunks: a config's sizes
        # never outlive the time limit or a cancel (the ladder then scales from the proposals
        # made so far).
        self.step = max(1, max(cfg.chunk_sweeps * inst.N, 4 * 2048) * DEFAULT_K
                        // max(cfg.population, len(layouts), DEFAULT_K))

    def walk_chunks(self, walk_pop, n_moves, temp, walk_cfg, share: float, probe=None,
                    first: bool = False) -> None:
        """``n_moves`` proposals per replica in chunks, until ``share`` of the time limit is spent
        or stop() says no more (``first``: the first chunk runs whatever the clock says: the
        ladder needs a scale)."""
        done = 0
        while done < n_moves and (first or not self.clock.out_of_time(share)):
            n = min(self.step, n_moves - done)
            run(walk_pop, n, temp, walk_cfg, probe=probe)
            done += n
            first = False

    def calibrate(self, topology: Topology, cost: CostModel) -> None:
        """The temperature ladder, scaled from |ΔE| of random proposals around the seeds (a best
        seed already near the lower bound starts a cooler one; see AnnealConfig.near_gap)."""
        inst, cfg, pop = self.inst, self.cfg, self.seeds_pop
        S = len(self.layouts)
        probe = np.zeros((S, cfg.calibration_moves))
        pop.walk.rng[:] = rng_states(self.rng_seed, -1, S)
        self.walk_chunks(pop, 4 * cfg.calibration_moves, 0.0, cfg.replace(p_guide=0.0),
                         SETUP_SHARE / 2, probe=probe, first=True)
        got = pop.walk.counters[:, 2]
        bound = layout_lower_bound(inst.lengths, inst.b_NLP().sum(axis=0), inst.R, topology, cost)
        self.seed_gap = float(pop.state.agg[self.best_seed, 0]) / bound - 1.0 if bound > 0 else -1.0
        near = inst.N >= cfg.near_min_samples and 0.0 <= self.seed_gap <= cfg.near_gap
        self.quantile = cfg.t_hot_quantile_near if near else cfg.t_hot_quantile
        self.temps, self.t_hot, self.t_cold = ladder(
            np.concatenate([probe[k, :got[k]] for k in range(S)]), self.seed_energy, cfg,
            self.quantile)

    def populate(self) -> None:
        """The K replicas: the seeds in turn, the last ``random_fraction`` of them walked at
        T = ∞ off their seed; the best so far is the best seed."""
        inst, cfg = self.inst, self.cfg
        K = cfg.population
        pop = self.pop = Population(inst, K)
        src = np.arange(K) % len(self.layouts)
        pop.init(self.seeds_pop.state.row[src], self.seeds_pop.state.slot[src])
        n_random = int(round(cfg.random_fraction * K)) if K > 1 else 0
        walk = int(round(cfg.random_walk_sweeps * inst.N))
        if n_random and walk:
            pop.walk.rng[:] = rng_states(self.rng_seed, -2, K)
            walkers = np.arange(K) >= K - n_random
            held = [arr.copy() for arr in pop.state]
            self.walk_chunks(pop, walk, np.inf, cfg.replace(p_guide=0.0), SETUP_SHARE)
            for arr, kept in zip(pop.state, held):  # the first K - n_random replicas stay at their seeds
                arr[~walkers] = kept[~walkers]
        pop.walk.counters[:] = 0
        self.best_e = float(self.seed_energy[self.best_seed])
        self.best_row = self.layouts[self.best_seed][0].copy()
        self.best_slot = self.layouts[self.best_seed][1].copy()

    def schedule(self, max_sweeps: int | None) -> None:
        """Proposals per rung, the chunk size and the deadline (the limit less the time the
        final evaluator check of the best seed takes, twice over)."""
        inst, cfg = self.inst, self.cfg
        te = time.perf_counter()
        self.seed_row = self.layouts[self.best_seed][0].astype(np.int64)
        self.seed_slot = self.layouts[self.best_seed][1].astype(np.int64)
        self.seed_key = inst.evaluator_key(self.seed_row, self.seed_slot)
        reserve = 2.0 * (time.perf_counter() - te) + 0.005
        limit = self.clock.time_limit
        self.deadline = None if limit is None else self.clock.t0 + float(limit) - reserve
        self.timed = self.deadline is not None and max_sweeps is None
        self.per_temp = moves_per_rung((max_sweeps if max_sweeps is not None else cfg.sweeps) * inst.N,
                                       cfg.temperatures)
        # a chunk is chunk_sweeps sweeps of 16 replicas' worth of proposals: a larger population
        # takes shorter chunks, so the clock is read as often as with the default one
        self.chunk = max(1, cfg.chunk_sweeps * inst.N * DEFAULT_K // max(cfg.population, DEFAULT_K))

    def walk_ladder(self) -> None:
        """Every rung: its sweeps (fitted to the time left when timed), the best state, the
        anytime trace, then resampling; until the ladder ends, the time is up or stop()."""
        cfg, pop, N, nT = self.cfg, self.pop, self.inst.N, self.cfg.temperatures
        self.trace, self.sweeps_done, self.stopped = [], 0.0, False
        self.t_run, self.c_run = time.perf_counter(), time.process_time()
        for k in range(nT):
            pop.walk.rng[:] = rng_states(self.rng_seed, k, cfg.population)
            pop.walk.best_e[:] = self.best_e
            temp = float(self.temps[k])
            done = self.fit_rung(k, temp) if self.timed else 0
            while done < self.per_temp[k] and not self.stopped:
                n = min(self.chunk, self.per_temp[k] - done)
                run(pop, n, temp, cfg)
                done += n
                if self.deadline is not None and time.perf_counter() >= self.deadline:
                    self.stopped = True
                if self.clock.cancelled():
                    self.stopped = True
            self.sweeps_done += done / N
            self.end_rung(temp)
            if self.clock.hooks.progress is not None:
                self.clock.hooks.progress((k + 1) / nT)
            if self.stopped:
                break
            if cfg.resample and k + 1 < nT and cfg.population > 1:
                pop.take(resample_parents(pop.energy, self.temps[k], self.temps[k + 1], self.rng_seed, k))

    def fit_rung(self, k: int, temp: float) -> int:
        """Fit rung k and the rest into the time left, at the measured rate (rung 0 first runs a
        pilot chunk to measure it); the proposals already made on this rung."""
        N, done = self.inst.N, 0
        if k == 0 and time.perf_counter() < self.deadline:
            # half a sweep at most: at N = 65,536 a full chunk (2 sweeps × 16 replicas)
            # takes a second, more than a short limit leaves after the seeds
            done = min(self.chunk, self.per_temp[0], max(N // 2, 1))
            run(self.pop, done, temp, self.cfg)
        now = time.perf_counter()
        left = self.deadline - now
        if left <= 0:
            self.stopped = True
        rate = (self.sweeps_done * N + done) / max(now - self.t_run, 1e-9)  # proposals per replica-second
        self.per_temp[k] = fit_rung(self.per_temp[k], done, left, rate, self.cfg.temperatures - k,
                                    self.cfg.fill_time)
        return done

    def end_rung(self, temp: float) -> None:
        """Take the population's best state if it beats the best so far; one point of the
        anytime curve."""
        pop = self.pop
        j = int(np.argmin(pop.walk.best_e))
        if pop.walk.best_e[j] < self.best_e:
            self.best_e = float(pop.walk.best_e[j])
            self.best_row = pop.walk.best_row[j].copy()
            self.best_slot = pop.walk.best_slot[j].copy()
        E = pop.energy
        self.trace.append({"temperature": temp, "best_energy": self.best_e, "mean_energy": float(E.mean()),
                           "min_energy": float(E.min()), "sweeps": self.sweeps_done,
                           "seconds": time.perf_counter() - self.clock.t0})

    def result(self, objective: Objective) -> AnnealResult:
        """The best layout, or the best seed when the evaluator scores it no worse; its state's
        score, and the statistics of the search."""
        inst = self.inst
        final = Population(inst, 1)
        final.init(self.best_row[None], self.best_slot[None])
        row = self.best_row.astype(np.int64)
        slot = self.best_slot.astype(np.int64)
        improved = inst.evaluator_key(row, slot) < self.seed_key
        if not improved and not (np.array_equal(row, self.seed_row) and np.array_equal(slot, self.seed_slot)):
            # the search's best is no better than the best seed by the evaluator: return the seed
            row, slot = self.seed_row, self.seed_slot
            final.init(row[None].astype(np.int32), slot[None].astype(np.int32))
        row, slot = inst.external(row, slot)
        a = final.state.agg[0]
        return AnnealResult(row=row, slot=slot, energy=float(a[3]),
                            score=(float(a[0]), float(a[1]), float(a[2])), objective=objective,
                            stats=self.stats(improved))

    def stats(self, improved: bool) -> dict:
        """The search's statistics (AnnealResult.stats)."""
        cfg, counters = self.cfg, self.pop.walk.counters
        run_seconds = time.perf_counter() - self.t_run
        run_cpu = time.process_time() - self.c_run
        evaluated = int(counters[:, 0].sum())
        return {
            "sweeps": self.sweeps_done, "replicas": cfg.population, "temperatures_done": len(self.trace),
            "temperatures": cfg.temperatures, "moves_proposed": int(counters[:, 3].sum()),
            "moves_evaluated": evaluated, "moves_accepted": int(counters[:, 1].sum()),
            "seconds": time.perf_counter() - self.clock.t0, "search_seconds": run_seconds,
            "search_cpu_seconds": run_cpu,
            "moves_per_second": evaluated / run_seconds if run_seconds > 0 else 0.0,
            # per core: CPU time of the process over the ladder, all threads together
            "moves_per_cpu_second": evaluated / run_cpu if run_cpu > 0 else 0.0,
            "t_hot": self.t_hot, "t_cold": self.t_cold, "t_hot_quantile": self.quantile,
            "seed_gap": self.seed_gap, "seeds": len(self.layouts), "best_seed": self.best_seed,
            "greedy_seed": self.greedy_used,
            "seed_energies": self.seed_energy.tolist(), "improved": bool(improved),
            "stopped_by_time": self.stopped or (self.timed and len(self.trace) < cfg.temperatures),
            "trace": self.trace, "timings": self.timings,
        }


# Load storages (b, W) whose kernels are compiled and loaded in this process; see warm_storage.
_STORAGES_READY: set = set()
_storage_lock = threading.Lock()
STORAGES = ((np.int16, np.int32), (np.int32, np.int32), (np.int64, np.int64))


def warm_storage(b_dtype, w_dtype) -> float:
    """Compile (or load from numba's cache) the search kernels for one load storage —
    :class:`~routepack_opt.heuristics.anneal.problem.Instance` picks (int16, int32) for ordinary
    windows, (int32, int32) when one sample sends ≥ 2^15 tokens to one rank, (int64, int64)
    beyond 2^30 tokens per rank — on a tiny instance. Returns the seconds spent (0.0 when
    already done in this process); :func:`anneal` moves its clock by them, so compiling never
    eats into a time limit."""
    key = (np.dtype(b_dtype).name, np.dtype(w_dtype).name)
    if key in _STORAGES_READY:
        return 0.0
    with _storage_lock:
        if key in _STORAGES_READY:
            return 0.0
        t = time.perf_counter()
        drive_storage(b_dtype, w_dtype)
        _STORAGES_READY.add(key)
        return time.perf_counter() - t


STORAGE_PARTS = ("greedy", "search")


def drive_storage(b_dtype, w_dtype, parts: Sequence[str] = STORAGE_PARTS) -> None:
    """Run the search kernels of one load storage on a tiny instance, so that numba compiles
    (or loads) them. ``parts``: ``"greedy"`` (the joint-cost greedy seed) and/or ``"search"``
    (population init, the calibration probe, the Metropolis loop, the evaluator's block sums).
    The two share only small kernels, so ``routepack warmup`` compiles them in two processes at
    once (:mod:`routepack_opt.warmup`)."""
    cost = CostModel(stages=(Stage("attn", 0.01, 1e-6),), gamma=0.004, row_overhead=50.0)
    topo = Topology(dp=2, ep=2, capacity=64)
    lengths = 3 * np.arange(1, 9, dtype=np.int64)
    b_NLP = np.zeros((8, 1, 2), dtype=np.int64)
    b_NLP[:, 0, 0] = lengths
    cfg = AnnealConfig(population=2, temperatures=2, sweeps=1, calibration_moves=16)
    inst = Instance(lengths, b_NLP, topo, cost, 2, "max-sum", cfg.tie_eps, (b_dtype, w_dtype))
    if "greedy" in parts:
        greedy_seed(inst)
    if "search" in parts:
        row, slot = inst.check_layout(np.arange(8) % 2, (np.arange(8) // 2) % 2, "warm-up layout")
        pop = Population(inst, 2)
        pop.init(np.stack([row, row]), np.stack([slot, slot]))
        run(pop, inst.N, 1.0, cfg, probe=np.zeros((2, cfg.calibration_moves)))
        run(pop, inst.N, np.inf, cfg)
        inst.evaluator_key(row, slot)  # the evaluator's block sums over this storage's view of b

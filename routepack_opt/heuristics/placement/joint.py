"""Joint search of expert placement and packing, aware of migration cost (issue 8).

Legend: N samples, L layers, E experts, P EP ranks.

The paper places experts once on aggregate loads (LPT, Graham 1969) and then packs. But the step
pays row-local peaks, and with a packing fixed the placement can be chosen against those peaks
(:mod:`routepack_opt.heuristics.placement.refine`); a new placement in turn changes which packing
is best. ``joint_search`` alternates the two — block-coordinate descent on the true objective:

    round: placement ← refine_placement(placement | layout)      (swap local search, never worse)
           layout    ← packer(placement, seeds=[layout])          (population annealing)
    until a round does not lower the key, ``max_rounds``, or the time limit.

Both steps are monotone (the packer's result is kept only when better than its seed), so the
result is never worse than (placement0, layout0), e.g. the ``routepack`` plan.

Migration. With ``current_placement`` (the placement materialized now) the first key component is
``makespan + w · migration time`` (:mod:`routepack_opt.heuristics.placement.migration`), and the search is *sticky*: it
also tries keeping the current placement (packing only) and refining from it (moving only experts
that pay for their traffic), and returns the best of the three starts. Without it, migration is
not optimised; the result reports the moves relative to ``placement0``.

Determinism: for a seed, ``max_rounds``, the refinement's passes and a packer with a fixed
iteration budget, the result is bit-identical; a ``time_limit`` makes it anytime.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from routepack_opt.core.cost import CostModel
from routepack_opt.core.errors import InputError
from routepack_opt.core.evaluate import Evaluator, Score
from routepack_opt.core.objective import Objective, check_objective
from routepack_opt.core.placement import Placement, as_placement
from routepack_opt.core.plan import check_placement
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import Window
from routepack_opt.heuristics.anneal import AnnealConfig, anneal
from routepack_opt.heuristics.placement.migration import Migration, align_slots, migration_cost
from routepack_opt.heuristics.placement.refine import RefineConfig, refine_placement

__all__ = ["JointConfig", "JointResult", "joint_search", "anneal_packer", "Packer", "alternate",
           "AlternateRules", "Round"]

# packer(b_NLP, seeds=[(row_N, slot_N), ...], seed, time_limit) -> (row_N, slot_N): a packing
# search at fixed rows for the placement whose per-rank loads are b_NLP.
Packer = Callable[[np.ndarray, list, int, "float | None"], tuple]


@dataclasses.dataclass(frozen=True)
class JointConfig:
    """``max_rounds``: at most this many (refine, pack) rounds per start. ``refine``: the
    placement search per round. ``anneal_sweeps``: the packer's iteration
    budget per round (None: its default, or the time share). ``migration_weight``: multiplies
    migration time in the key (1/k = amortized over k steps). ``sticky``: with a current
    placement, also try keeping it. ``min_rel_gain``: a round must lower the makespan by this
    fraction to continue."""

    refine: RefineConfig = RefineConfig()
    anneal_sweeps: int | None = None
    max_rounds: int = 4
    migration_weight: float = 1.0
    sticky: bool = True
    min_rel_gain: float = 1e-6

    def __post_init__(self):
        if not np.isfinite(self.migration_weight) or self.migration_weight < 0:
            raise InputError(f"joint: migration_weight must be finite and ≥ 0, got {self.migration_weight!r}")
        if isinstance(self.max_rounds, bool) or not isinstance(self.max_rounds, (int, np.integer)) \
                or self.max_rounds < 1:
            raise InputError(f"joint: max_rounds must be an integer ≥ 1, got {self.max_rounds!r}")
        if self.anneal_sweeps is not None and self.anneal_sweeps < 0:
            raise InputError("joint: anneal_sweeps must be ≥ 0")
        if not 0 <= self.min_rel_gain < 1:
            raise InputError("joint: min_rel_gain must be in [0, 1)")


@dataclasses.dataclass(frozen=True)
class JointResult:
    """``score``: the evaluator's score of (placement, layout) — without migration.
    ``migration``: moves vs ``current_placement`` (or vs ``placement0`` when none was given);
    ``objective_value`` = makespan + w·migration time when migration was optimised, else the
    makespan. ``stats``: rounds, per-start keys, wall time, chosen start."""

    placement: Placement
    row: np.ndarray
    slot: np.ndarray
    score: Score
    migration: Migration
    objective_value: float
    stats: dict


def anneal_packer(window: Window, topology: Topology, cost: CostModel, rows: int, objective: Objective,
                  config=None, max_sweeps: int | None = None) -> Packer:
    """The population annealer (:mod:`routepack_opt.heuristics.anneal`) as a packer."""
    cfg = config if config is not None else AnnealConfig()

    def pack(b_NLP, seeds, seed, time_limit):
        if time_limit is not None and time_limit < 0.01:  # no time left: keep the seed
            return seeds[0]
        res = anneal(window.lengths, b_NLP, topology, cost, rows, objective, seeds,
                     config=cfg, seed=seed, time_limit=time_limit, max_sweeps=max_sweeps)
        return np.asarray(res.row, dtype=np.int64), np.asarray(res.slot, dtype=np.int64)

    return pack


class _Scorer:
    """Key = (makespan + w·migration time, total, peak), all through the one evaluator."""

    def __init__(self, ev: Evaluator, objective: Objective, topology, cost, rows, current, weight):
        self.ev, self.objective, self.topology, self.cost = ev, objective, topology, cost
        self.rows, self.current, self.weight = rows, current, weight

    def key(self, placement, row, slot) -> tuple[float, float, float]:
        s = self.ev.score(placement, row, slot, self.rows, self.objective)
        mig = 0.0
        if self.current is not None and self.weight > 0:
            mig = self.weight * migration_cost(self.current, placement, self.topology, self.cost).time_us
        return (s.makespan + mig, s.total, s.peak)


@dataclasses.dataclass(frozen=True)
class AlternateRules:
    """How :func:`alternate` keeps a step and when it stops. ``rounds``: at most this many
    (refine, pack) rounds. ``strict``: a refinement is kept only if it moves something and
    lowers the key, else the loop ends (replica moves, which are not monotone in the exact
    score); otherwise a refinement that raises the key is undone (the row-aware swap
    refinement is monotone: a guard against drift) and the loop ends when one after the first
    moves nothing. ``repack``: pack again after each refinement kept (else refinement only).
    ``min_rel_gain``: a round that lowers the makespan by less than this fraction ends it."""

    rounds: int
    strict: bool = False
    repack: bool = True
    min_rel_gain: float = 0.0


@dataclasses.dataclass(frozen=True)
class Round:
    """One round of :func:`alternate`: the refinement's moves and key, the packing's key (None:
    not packed), the key after the round, whether the refinement and the packing were kept, and
    why the loop stopped there (None: it went on)."""

    index: int
    moves: int
    refine_key: tuple
    pack_key: tuple | None
    key: tuple
    kept: bool
    packed: bool
    stop: str | None = None


# refiner(placement, layout, round) -> (candidate placement, moves); packer(placement, layout,
# round) -> layout; scorer(placement, layout) -> lexicographic key (the one evaluator's)
Refiner = Callable[[Any, Any, int], tuple]
LayoutPacker = Callable[[Any, Any, int], Any]
Scorer = Callable[[Any, Any], tuple]


def alternate(refiner: Refiner, packer: LayoutPacker, scorer: Scorer, placement, layout,
              rules: AlternateRules, stopped: Callable[[], bool] = lambda: False,
              start_key: tuple | None = None) -> tuple:
    """Block-coordinate descent on the true objective: refine the placement for the layout,
    then pack the layout for the placement, each step kept only as ``rules`` say, so the result
    is never worse than the start. Serves the joint placement search (row-aware swaps of a
    permutation) and the replica rounds of the pipeline (row-aware replica moves). ``stopped``
    is polled before each refinement and each packing; ``start_key``: the start's key when the
    caller has it. Returns ``(placement, layout, key, rounds)``."""
    key = scorer(placement, layout) if start_key is None else start_key
    rounds: list[Round] = []
    for rnd in range(1, rules.rounds + 1):
        if stopped():
            break
        cand, moves = refiner(placement, layout, rnd)
        k_ref = scorer(cand, layout)
        if rules.strict and (moves == 0 or k_ref >= key):
            rounds.append(Round(rnd, moves, k_ref, None, key, False, False, "no gain"))
            break
        if k_ref > key:  # cannot happen (the refinement is monotone); guard against drift anyway
            cand, k_ref = placement, key
        if not rules.strict and rnd > 1 and moves == 0:
            rounds.append(Round(rnd, 0, k_ref, None, key, False, False, "placement converged"))
            break
        placement = cand
        if not rules.repack or stopped():
            rounds.append(Round(rnd, moves, k_ref, None, k_ref, True, False, "no packing"))
            key = k_ref
            break
        new_layout = packer(placement, layout, rnd)
        k_pack = scorer(placement, new_layout)
        packed = k_pack < k_ref
        new_key = k_pack if packed else k_ref
        if packed:
            layout = new_layout
        gain = (key[0] - new_key[0]) / key[0] if key[0] > 0 else 0.0
        stop = "small gain" if gain < rules.min_rel_gain else None
        rounds.append(Round(rnd, moves, k_ref, k_pack, new_key, True, packed, stop))
        key = new_key
        if stop:
            break
    return placement, layout, key, rounds


@dataclasses.dataclass(frozen=True)
class _JointRun:
    """What every start of one :func:`joint_search` shares."""

    window: Window
    topology: Topology
    cost: CostModel
    rows: int
    objective: Objective
    scorer: _Scorer
    packer: Packer
    config: JointConfig


def _alternate(run: _JointRun, placement, row, slot, current, seed: int,
               deadline: float | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple, list]:
    """:func:`alternate` with the row-aware swap refinement and ``run.packer``, from
    ``(placement, (row, slot))``; returns ``(placement, row, slot, key, history)``."""
    refine_cfg = dataclasses.replace(run.config.refine, migration_weight=run.config.migration_weight)

    def left() -> float | None:
        return None if deadline is None else max(deadline - time.perf_counter(), 0.0)

    def refiner(pl, layout, rnd):
        t = left()
        ref = refine_placement(run.window, run.topology, run.cost, pl, *layout, run.rows, run.objective,
                               current_placement=current, config=refine_cfg, seed=seed + rnd,
                               time_limit=None if t is None else 0.5 * t)
        return ref.placement, ref.swaps

    def packer(pl, layout, rnd):
        t = left()
        new_row, new_slot = run.packer(run.scorer.ev.rank_loads(pl), [(layout[0].copy(), layout[1].copy())],
                                       seed + 1000 * rnd,
                                       None if t is None else t / max(run.config.max_rounds - rnd + 1, 1))
        return np.asarray(new_row), np.asarray(new_slot)

    def scorer(pl, layout):
        return run.scorer.key(pl, *layout)

    def stopped() -> bool:
        return deadline is not None and time.perf_counter() >= deadline

    rules = AlternateRules(run.config.max_rounds, min_rel_gain=run.config.min_rel_gain)
    key0 = scorer(placement, (row, slot))
    placement, (row, slot), key, rounds = alternate(refiner, packer, scorer, placement, (row, slot), rules,
                                                    stopped, key0)
    history: list[dict] = [{"round": 0, "key": key0}]
    for r in rounds:
        if r.stop == "placement converged":
            history.append({"round": r.index, "key": r.key, "swaps": 0, "stop": r.stop})
        else:
            history.append({"round": r.index, "key": r.key, "swaps": r.moves,
                            "refine_key": r.refine_key, "pack_key": r.pack_key})
    return placement, row, slot, key, history


def joint_search(window: Window, topology: Topology, cost: CostModel, rows: int, objective: Objective,
                 placement0, layout0, time_limit: float | None = None, seed: int = 0,
                 current_placement=None, config: JointConfig = JointConfig(),
                 packer: Packer | None = None) -> JointResult:
    """Alternate row-aware placement refinement and packing from ``(placement0, layout0)``
    (module doc). ``placement0``: a :class:`Placement` without replicas (or its permutation
    array); the result's placement is a :class:`Placement`. ``layout0`` is ``(row_N, slot_N)``,
    feasible at ``rows``; ``packer`` defaults to the population annealer with
    ``config.anneal_sweeps``."""
    t0 = time.perf_counter()
    objective = check_objective(objective)
    L, E = window.num_layers, window.num_experts
    placement0 = as_placement(placement0, topology.ep, "placement0").permutation()  # refined as π
    errs = check_placement(placement0, L, E)
    if errs:
        raise InputError("placement0: " + "; ".join(errs[:3]))
    row0, slot0 = (np.asarray(a, dtype=np.int64) for a in layout0)
    current = None
    if current_placement is not None:
        current = np.asarray(current_placement, dtype=np.int64)
        errs = check_placement(current, L, E)
        if errs:
            raise InputError("current placement: " + "; ".join(errs[:3]))
        placement0 = align_slots(placement0, current, topology.ep)
    if packer is None:
        packer = anneal_packer(window, topology, cost, rows, objective,
                               max_sweeps=config.anneal_sweeps)
    ev = Evaluator(window, topology, cost)
    weight = config.migration_weight if current is not None else 0.0
    scorer = _Scorer(ev, objective, topology, cost, rows, current, weight)
    run = _JointRun(window, topology, cost, rows, objective, scorer, packer, config)
    deadline = None if time_limit is None else t0 + time_limit

    def share(frac):
        if deadline is None:
            return None
        return time.perf_counter() + frac * max(deadline - time.perf_counter(), 0.0)

    starts = {}
    if current is not None and config.sticky:
        # (a) keep the materialized placement: pack only
        b_cur = ev.rank_loads(current)
        d_a = share(0.25)
        r_a, s_a = packer(b_cur, [(row0.copy(), slot0.copy())], seed,
                          None if d_a is None else d_a - time.perf_counter())
        k_a, k_0 = scorer.key(current, r_a, s_a), scorer.key(current, row0, slot0)
        if k_0 <= k_a:
            r_a, s_a, k_a = row0, slot0, k_0
        starts["stay"] = (current.copy(), r_a, s_a, k_a, [{"round": 0, "key": k_a}])
        # (b) refine from the materialized placement (moves only what pays)
        starts["from-current"] = _alternate(run, current.copy(), r_a, s_a, current, seed + 1, share(0.5))
    # (c) refine from placement0 (e.g. LPT) and layout0 (e.g. the routepack packing)
    starts["from-placement0"] = _alternate(run, placement0, row0, slot0, current, seed + 2, deadline)
    name = min(starts, key=lambda n: starts[n][3])
    placement, row, slot, key, _ = starts[name]
    ref = current if current is not None else placement0
    # rank labels are free (the cost is symmetric in them): keep the labelling that moves least
    cands = [align_slots(placement, ref, topology.ep, relabel=r) for r in (False, True)]
    migs = [migration_cost(ref, c, topology, cost) for c in cands]
    pick = min(range(2), key=lambda j: (migs[j].time_us, migs[j].experts_moved))
    placement, mig = cands[pick], migs[pick]
    score = ev.score(placement, row, slot, rows, objective)
    value = score.makespan + (weight * mig.time_us if current is not None else 0.0)
    stats = {"start": name, "wall_s": time.perf_counter() - t0,
             "start_key": scorer.key(placement0, row0, slot0),
             "starts": {n: {"key": v[3], "history": v[4]} for n, v in starts.items()},
             "rounds": len(starts[name][4]) - 1,
             "lower_bound": ev.lower_bound(placement, rows),
             "lower_bound_start": ev.lower_bound(placement0, rows),
             "migration_optimised": current is not None, "migration": mig.as_dict(),
             "objective_value": value}
    return JointResult(placement=Placement.from_permutation(placement, topology.ep), row=row, slot=slot,
                       score=score, migration=mig,
                       objective_value=value, stats=stats)

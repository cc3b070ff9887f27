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

import numpy as np

from routepack_opt.core.cost import CostModel
from routepack_opt.core.errors import InputError
from routepack_opt.core.evaluate import Evaluator, Score
from routepack_opt.core.objective import check_objective
from routepack_opt.core.placement import Placement, as_placement
from routepack_opt.core.plan import check_placement
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import Window
from routepack_opt.heuristics.anneal import AnnealConfig, anneal
from routepack_opt.heuristics.placement.migration import Migration, align_slots, migration_cost
from routepack_opt.heuristics.placement.refine import RefineConfig, refine_placement

__all__ = ["JointConfig", "JointResult", "joint_search", "anneal_packer", "Packer"]

# packer(b_NLP, seeds=[(row_N, slot_N), ...], seed, time_limit) -> (row_N, slot_N): a packing
# search at fixed rows for the placement whose per-rank loads are b_NLP.
Packer = Callable[[np.ndarray, list, int, "float | None"], tuple]


@dataclasses.dataclass(frozen=True)
class JointConfig:
    """``refine``: the placement search per round. ``anneal_sweeps``: the packer's iteration
    budget per round (None: its default, or the time share). ``migration_weight``: multiplies
    migration time in the key (1/k = amortized over k steps). ``sticky``: with a current
    placement, also try keeping it. ``min_rel_gain``: a round must lower the makespan by this
    fraction to continue."""

    refine: RefineConfig = RefineConfig()
    anneal_sweeps: int | None = None
    migration_weight: float = 1.0
    sticky: bool = True
    min_rel_gain: float = 1e-6

    def __post_init__(self):
        if not np.isfinite(self.migration_weight) or self.migration_weight < 0:
            raise InputError(f"joint: migration_weight must be finite and ≥ 0, got {self.migration_weight!r}")
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


def anneal_packer(window: Window, topology: Topology, cost: CostModel, rows: int, objective: str,
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

    def __init__(self, ev: Evaluator, objective: str, topology, cost, rows, current, weight):
        self.ev, self.objective, self.topology, self.cost = ev, objective, topology, cost
        self.rows, self.current, self.weight = rows, current, weight

    def key(self, placement, row, slot) -> tuple[float, float, float]:
        s = self.ev.score(placement, row, slot, self.rows, self.objective)
        mig = 0.0
        if self.current is not None and self.weight > 0:
            mig = self.weight * migration_cost(self.current, placement, self.topology, self.cost).time_us
        return (s.makespan + mig, s.total, s.peak)


def _alternate(window, topology, cost, rows, objective, scorer: _Scorer, packer: Packer,
               placement, row, slot, current, config: JointConfig, seed: int, max_rounds: int,
               deadline: float | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple, list]:
    """Block-coordinate descent: refine placement | layout, then pack | placement."""
    key = scorer.key(placement, row, slot)
    history = [{"round": 0, "key": key}]
    refine_cfg = dataclasses.replace(config.refine, migration_weight=config.migration_weight)
    for rnd in range(1, max_rounds + 1):
        now = time.perf_counter()
        if deadline is not None and now >= deadline:
            break
        left = None if deadline is None else deadline - now
        ref = refine_placement(window, topology, cost, placement, row, slot, rows, objective,
                               current_placement=current, config=refine_cfg, seed=seed + rnd,
                               time_limit=None if left is None else 0.5 * left)
        new_pl = ref.placement
        k_ref = scorer.key(new_pl, row, slot)
        if k_ref > key:  # cannot happen (refinement is monotone); guard against drift anyway
            new_pl, k_ref = placement, key
        if rnd > 1 and ref.swaps == 0:
            history.append({"round": rnd, "key": key, "swaps": 0, "stop": "placement converged"})
            break
        left = None if deadline is None else max(deadline - time.perf_counter(), 0.0)
        b_NLP = scorer.ev.rank_loads(new_pl)
        new_row, new_slot = packer(b_NLP, [(row.copy(), slot.copy())], seed + 1000 * rnd,
                                   None if left is None else left / max(max_rounds - rnd + 1, 1))
        k_pack = scorer.key(new_pl, new_row, new_slot)
        if k_pack < k_ref:
            row, slot, new_key = np.asarray(new_row), np.asarray(new_slot), k_pack
        else:
            new_key = k_ref
        placement = new_pl
        gain = (key[0] - new_key[0]) / key[0] if key[0] > 0 else 0.0
        history.append({"round": rnd, "key": new_key, "swaps": ref.swaps,
                        "refine_key": k_ref, "pack_key": k_pack})
        key = new_key
        if gain < config.min_rel_gain:
            break
    return placement, row, slot, key, history


def joint_search(window: Window, topology: Topology, cost: CostModel, rows: int, objective: str,
                 placement0, layout0, time_limit: float | None = None, seed: int = 0,
                 max_rounds: int = 4, current_placement=None, config: JointConfig = JointConfig(),
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
        starts["from-current"] = _alternate(window, topology, cost, rows, objective, scorer, packer,
                                            current.copy(), r_a, s_a, current, config, seed + 1,
                                            max_rounds, share(0.5))
    # (c) refine from placement0 (e.g. LPT) and layout0 (e.g. the routepack packing)
    starts["from-placement0"] = _alternate(window, topology, cost, rows, objective, scorer, packer,
                                           placement0, row0, slot0, current, config, seed + 2,
                                           max_rounds, deadline)
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

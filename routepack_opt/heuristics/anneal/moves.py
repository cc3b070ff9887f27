"""The Metropolis loop of the annealer: a replica's proposals, their evaluation and acceptance.

Every move keeps every constraint (capacity C, nonempty cells, and with equal samples per slot
N/D samples in each slot). The move kinds live one to a module, each a ``propose_*`` function
returning a :class:`~routepack_opt.heuristics.anneal.proposal.Proposal`:

- :mod:`.move_relocate` — one sample to another cell;
- :mod:`.move_swap` — two samples of different cells exchange cells;
- :mod:`.move_rotate` — three samples rotate over three cells (off by default);

and share the sample draws of :mod:`.sampling` (guided at the bottleneck, the row window).
:func:`propose` draws the kind; a proposal's cost is
:func:`~routepack_opt.heuristics.anneal.proposal.move_delta` and an accepted one is applied by
:func:`~routepack_opt.heuristics.anneal.state.apply_move`, whatever its kind; the undo log that
keeps the best state records the samples it moves (:func:`log_move`). docs/annealer.md says how
to add a move kind.

The random state lives in four registers (s0..s3) that every function taking it returns updated;
the order of the draws is part of the result (same seed, same moves, bit-identical layouts).
"""

from __future__ import annotations

import math

from numba import njit, prange

from routepack_opt.heuristics.anneal.config import AnnealConfig
from routepack_opt.heuristics.anneal.kernels import aggregates
from routepack_opt.heuristics.anneal.move_relocate import (
    guided_target,
    pick_target_first,
    propose_relocation,
    target_in_slot,
)
from routepack_opt.heuristics.anneal.move_rotate import propose_rotation
from routepack_opt.heuristics.anneal.move_swap import fitting_partner, near_partner, propose_swap
from routepack_opt.heuristics.anneal.proposal import RELOCATE, ROTATE, move_delta, n_moved, no_move
from routepack_opt.heuristics.anneal.rng import below, unit, xo
from routepack_opt.heuristics.anneal.sampling import (
    Moves,
    in_window,
    moves_of,
    pick_guided,
    row_window,
    sample_in_window,
    weighted_row,
)
from routepack_opt.heuristics.anneal.state import (
    LOG_SIZE,
    Population,
    State,
    Walk,
    apply_move,
    replica_state,
    replica_walk,
    scratch,
)

__all__ = ["Moves", "moves_of", "row_window", "in_window", "weighted_row",
           "sample_in_window", "pick_guided", "pick_target_first", "near_partner",
           "fitting_partner", "target_in_slot", "guided_target", "propose_swap",
           "propose_relocation", "propose_rotation", "propose", "metropolis", "log_move",
           "save_best", "run_replica", "run_population", "run", "run_one"]


@njit(cache=True, _nrt=False, inline='always')
def propose(s0, s1, s2, s3, st, pb, mv, r0, w):
    """One proposal (a :class:`~routepack_opt.heuristics.anneal.proposal.Proposal`, kind NONE
    when infeasible): the sample i (guided with probability ``p_guide``, else uniform, in the
    row window r0 .. r0 + w − 1 when w < R, or target first for an unguided relocation), the
    kind (swap with probability ``p_swap``, else a relocation; a rotation with probability
    ``p_rotate``, a draw made only when it is > 0), then the kind's partner or target."""
    i = -1
    guided = False
    if mv.p_guide > 0.0:
        x, s0, s1, s2, s3 = xo(s0, s1, s2, s3)
        guided = unit(x) <= mv.p_guide
        if guided:
            i, s0, s1, s2, s3 = pick_guided(s0, s1, s2, s3, st, pb, mv.p_cell)
    x, s0, s1, s2, s3 = xo(s0, s1, s2, s3)
    swap = unit(x) <= mv.p_swap
    rotate = False
    if mv.p_rotate > 0.0:
        x, s0, s1, s2, s3 = xo(s0, s1, s2, s3)
        rotate = unit(x) < mv.p_rotate
    bc = -1
    if i < 0:
        if swap or rotate or pb.eq:
            if w < pb.R:
                i, s0, s1, s2, s3 = sample_in_window(s0, s1, s2, s3, st, pb, r0, w)
                if i < 0:
                    return no_move(), s0, s1, s2, s3
            else:
                x, s0, s1, s2, s3 = xo(s0, s1, s2, s3)
                i = below(x, pb.N)
        else:
            i, bc, s0, s1, s2, s3 = pick_target_first(s0, s1, s2, s3, st, pb, r0, w)
            if i < 0:
                return no_move(), s0, s1, s2, s3
    wm = pb.R if guided else w  # guided moves are never confined to the row window
    if rotate:
        return propose_rotation(s0, s1, s2, s3, st, pb, mv, i, r0, wm)
    if swap:
        return propose_swap(s0, s1, s2, s3, st, pb, mv, i, guided, r0, wm)
    return propose_relocation(s0, s1, s2, s3, st, pb, i, bc, r0, wm)


@njit(cache=True, _nrt=False, inline='always')
def metropolis(dE, temp, s0, s1, s2, s3):
    """(accept, RNG state): an improvement always, a worsening dE with probability e^(−dE/T)
    (one draw, only for a worsening)."""
    if dE > 0.0:
        x, s0, s1, s2, s3 = xo(s0, s1, s2, s3)
        if dE > -temp * math.log(unit(x)):
            return False, s0, s1, s2, s3
    return True, s0, s1, s2, s3


@njit(cache=True, _nrt=False, inline='always')
def log_sample(log, n_log, st, t):
    """Append sample t's (row, slot) to the undo log; its new length."""
    log[n_log, 0] = t
    log[n_log, 1] = st.row[t]
    log[n_log, 2] = st.slot[t]
    return n_log + 1


@njit(cache=True, _nrt=False, inline='always')
def log_move(log, n_log, st, p):
    """Append the places of the samples proposal ``p`` moves (before it is applied): the one
    undo log of every move kind; its new length."""
    n_log = log_sample(log, n_log, st, p.i)
    if p.kind != RELOCATE:
        n_log = log_sample(log, n_log, st, p.j)
    if p.kind == ROTATE:
        n_log = log_sample(log, n_log, st, p.k)
    return n_log


@njit(cache=True, _nrt=False)
def save_best(st, wk, log, n_log):
    """wk.best_row/best_slot = the current layout with the last ``n_log`` logged moves undone
    (latest first, so a sample moved twice gets its oldest place back)."""
    for t in range(st.row.shape[0]):
        wk.best_row[t] = st.row[t]
        wk.best_slot[t] = st.slot[t]
    for k in range(n_log - 1, -1, -1):
        wk.best_row[log[k, 0]] = log[k, 1]
        wk.best_slot[log[k, 0]] = log[k, 2]


@njit(cache=True, _nrt=False, inline='always')
def store_walk(wk, rng, counters, last):
    """Write the loop's locals back to the walk: RNG state, counters, last deltas."""
    for t in range(4):
        wk.rng[t] = rng[t]
        wk.counters[t] = counters[t]
    for t in range(3):
        wk.last[t] = last[t]


@njit(cache=True, _nrt=False)
def run_replica(n_moves, temp, mv, pb, st, wk, sc):
    """``n_moves`` Metropolis proposals at temperature ``temp`` for one replica (state ``st``,
    walk ``wk``, scratch ``sc``; see :mod:`routepack_opt.heuristics.anneal.state`).

    ``wk.probe`` (length > 0): record |ΔE| of each evaluated proposal there and accept nothing
    (used to scale the ladder). ``wk.last`` = the deltas of the last evaluated proposal (checked
    by the tests against the evaluator). The best state seen is the current one until the walk
    leaves it; from then on the undo log (``sc.log``) records what each accepted move overwrites,
    and :func:`save_best` writes it out (at the end, or when the log is full).

    Compiled without numba's reference counting (``_nrt=False``, as are its callees): the
    atomic increments and decrements of array arguments crossing the helpers took about a
    quarter of the time per move. Hence no allocation or array slicing here. The small helpers
    are inlined by numba (``inline='always'``; LLVM left them as calls, each passing every array
    argument as a 7-word struct); the expert kernels stay calls (inlining them was slower). The
    RNG state, counters and last deltas live in locals (stores to arrays would force reloads:
    numba gives LLVM no aliasing information), written back at the end."""
    nprobe = wk.probe.shape[0]
    at_best = False  # the current state is the best seen and not yet written out
    logging = False  # the best state is the current one with sc.log[:n_log] undone
    n_log = 0
    s0, s1, s2, s3 = wk.rng[0], wk.rng[1], wk.rng[2], wk.rng[3]
    n_eval, n_acc, n_probe, n_prop = wk.counters[0], wk.counters[1], wk.counters[2], wk.counters[3]
    l0, l1, l2 = wk.last[0], wk.last[1], wk.last[2]
    w = min(mv.rows, pb.R)  # the row window (w = R: none)
    r0 = 0
    left = 0  # proposals left in the current row window
    for _ in range(n_moves):
        n_prop += 1
        if w < pb.R:
            if left == 0:  # the next row window, from this replica's stream
                x, s0, s1, s2, s3 = xo(s0, s1, s2, s3)
                r0 = below(x, pb.R)
                left = mv.stay
            left -= 1
        p, s0, s1, s2, s3 = propose(s0, s1, s2, s3, st, pb, mv, r0, w)
        if p.kind < 0:
            continue
        n_eval += 1
        ev = move_delta(st, pb, sc, p)
        dE = ev.dms + pb.eps1 * ev.dtot + pb.eps2 * ev.dpk
        l0, l1, l2 = ev.dms, ev.dtot, ev.dpk
        if nprobe > 0:
            if n_probe < nprobe:
                wk.probe[n_probe] = abs(dE)
                n_probe += 1
            continue
        accept, s0, s1, s2, s3 = metropolis(dE, temp, s0, s1, s2, s3)
        if not accept:
            continue
        n_acc += 1
        if at_best and not dE < -1e-12 * abs(st.agg[3]):
            # leaving the best state seen (or not clearly improving on it): from here on log
            # what each move overwrites, so the best state is the current one undone
            at_best = False
            logging = True
            n_log = 0
        if logging:
            if n_log + n_moved(p) > sc.log.shape[0]:  # log full: write the best state out now
                save_best(st, wk, sc.log, n_log)
                logging = False
            else:
                n_log = log_move(sc.log, n_log, st, p)
        apply_move(st, pb, sc, p, ev)
        if st.agg[3] < wk.best_e[0]:
            wk.best_e[0] = st.agg[3]
            at_best = True  # written out at the end, or logged from when the walk leaves it
            logging = False
    if at_best or logging:
        save_best(st, wk, sc.log, n_log if logging else 0)
    store_walk(wk, (s0, s1, s2, s3), (n_eval, n_acc, n_probe, n_prop), (l0, l1, l2))


@njit(cache=True, parallel=True)
def run_population(n_moves, temp, mv, pb, S, V):
    """All replicas in parallel (each one's stream and state are its own)."""
    for k in prange(S.row.shape[0]):
        st = replica_state(S, k)
        aggregates(st, pb)  # the carried sums, exact again (see kernels.update_aggregates)
        run_replica(n_moves, temp, mv, pb, st, replica_walk(V, k), scratch(pb.L, st.W))


def run(pop: Population, n_moves: int, temp: float, cfg: AnnealConfig, probe=None) -> None:
    """``n_moves`` proposals per replica at ``temp`` (``probe`` [K, n]: record |ΔE|, accept
    nothing)."""
    walk = pop.walk if probe is None else pop.walk._replace(probe=probe)
    run_population(n_moves, temp, moves_of(cfg, pop.inst), pop.inst.problem, pop.state, walk)


def run_one(pop: Population, n_moves: int, temp: float, cfg: AnnealConfig, k: int = 0,
            log_size: int = LOG_SIZE) -> None:
    """Replica k alone, serially (no thread launch): for tests stepping one move at a time
    (``log_size``: entries of the undo log that keeps the best state)."""
    st = State(**{f: a[k] for f, a in pop.state._asdict().items()})
    wk = Walk(**{f: a[k:k + 1] if f == "best_e" else a[k] for f, a in pop.walk._asdict().items()})
    aggregates(st, pop.inst.problem)
    run_replica(n_moves, temp, moves_of(cfg, pop.inst), pop.inst.problem, st, wk,
                scratch(pop.inst.L, st.W, log_size))

"""Population annealing of the packing at fixed placement and rows (docs/pipeline.md, step 3).

Modules, each importing only those above it in this list:

- :mod:`.config` — :class:`AnnealConfig` (parameters, from TOML) and :class:`AnnealResult`;
- :mod:`.rng` — splitmix64 seeding and xoshiro256** streams;
- :mod:`.problem` — the instance's constant arrays (:class:`~.problem.Problem` for the kernels)
  and the maps between the caller's layouts and the internal ones;
- :mod:`.kernels` — compiled block costs and cost deltas;
- :mod:`.proposal` — a move as two records (:class:`~.proposal.Proposal`, :class:`~.proposal.Evaluation`)
  and its cost (:func:`~.proposal.move_delta`);
- :mod:`.state` — a replica's incremental state, the population, applying a move (any kind);
- :mod:`.sampling` — the move mix and how a move picks its sample (guided, row window);
- :mod:`.move_relocate`, :mod:`.move_swap`, :mod:`.move_rotate` — one module per move kind;
- :mod:`.moves` — the Metropolis loop (propose, evaluate, accept, undo log);
- :mod:`.greedy` — the joint-cost greedy seed;
- :mod:`.schedule` — temperature ladder, moves per rung under a time limit, resampling;
- :mod:`.search` — :func:`anneal`, the driver.

docs/annealer.md is the recipe for adding a move kind.
"""

from routepack_opt.heuristics.anneal.config import AnnealConfig, AnnealResult
from routepack_opt.heuristics.anneal.greedy import greedy_layout
from routepack_opt.heuristics.anneal.search import (
    STORAGE_PARTS,
    STORAGES,
    Hooks,
    anneal,
    drive_storage,
    layout_energy,
    warm_storage,
)

__all__ = ["AnnealConfig", "AnnealResult", "Hooks", "anneal", "greedy_layout", "layout_energy",
           "warm_storage", "drive_storage", "STORAGE_PARTS", "STORAGES"]

"""Population annealing of the packing at fixed placement and rows (docs/pipeline.md, step 3).

Modules, each importing only those above it in this list:

- :mod:`.config` — :class:`AnnealConfig` (parameters, from TOML) and :class:`AnnealResult`;
- :mod:`.rng` — splitmix64 seeding and xoshiro256** streams;
- :mod:`.problem` — the instance's constant arrays (:class:`~.problem.Problem` for the kernels)
  and the maps between the caller's layouts and the internal ones;
- :mod:`.kernels` — compiled block costs and cost deltas;
- :mod:`.state` — a replica's incremental state, the population, applying a move;
- :mod:`.moves` — one function per move kind and the Metropolis loop;
- :mod:`.greedy` — the joint-cost greedy seed;
- :mod:`.schedule` — temperature ladder, moves per rung under a time limit, resampling;
- :mod:`.search` — :func:`anneal`, the driver.
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

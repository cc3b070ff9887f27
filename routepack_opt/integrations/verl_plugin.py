"""verl plugin (``verl.plugins`` entry point ``routepack``): with ``ROUTEPACK_VERL=1`` in the
environment, loading it swaps verl's ``rearrange_micro_batches`` for RoutePack's.

verl loads every ``verl.plugins`` entry point during ``import verl`` (policy
``VERL_USE_EXTERNAL_PLUGINS``, default ``auto``); this module does nothing unless
``ROUTEPACK_VERL`` is set, so installing RoutePack never changes a verl job by itself.
``ROUTEPACK_COST`` names the cost preset or TOML (default ``qwen3-30b-a3b``).
"""

from __future__ import annotations

import functools
import importlib
import os
import sys

__all__ = ["activate", "PATCHED_MODULES"]

# Where verl 0.9.1 binds rearrange_micro_batches. The engine utilities import it by name, so
# patching seqlen_balancing before they load (verl loads plugins in its __init__) covers them;
# they are patched here only if already imported.
PATCHED_MODULES = ("verl.utils.seqlen_balancing", "verl.workers.engine.utils")


def activate(cost: str | None = None) -> list[str]:
    """Point verl's ``rearrange_micro_batches`` (where verl binds it) at RoutePack's; returns the
    modules patched."""
    # Imported here, not at the top: verl imports this plugin during its own import, and until
    # ROUTEPACK_VERL asks for it the planner (numba, the pipeline) must not load.
    from routepack_opt.integrations import verl as rp_verl

    fn = functools.partial(rp_verl.rearrange_micro_batches,
                           cost=cost or os.environ.get("ROUTEPACK_COST", "qwen3-30b-a3b"))
    fn.__routepack__ = True
    done = []
    for name in PATCHED_MODULES:
        if name != PATCHED_MODULES[0] and name not in sys.modules:
            continue
        try:
            mod = importlib.import_module(name)
        except Exception:  # a verl without this module (or its optional deps): skip it
            continue
        mod.rearrange_micro_batches = fn
        done.append(name)
    return done


if os.environ.get("ROUTEPACK_VERL", "").strip().lower() in ("1", "true", "yes", "on"):
    activate()

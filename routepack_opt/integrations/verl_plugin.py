"""verl plugin (``verl.plugins`` entry point ``routepack``): with ``ROUTEPACK_VERL=1`` in the
environment, loading it swaps verl's ``rearrange_micro_batches`` for RoutePack's.

verl loads every ``verl.plugins`` entry point during ``import verl`` (policy
``VERL_USE_EXTERNAL_PLUGINS``, default ``auto``); this module does nothing unless
``ROUTEPACK_VERL`` is on (``1``, ``true``, ``yes``, ``on``), so installing RoutePack never changes
a verl job by itself. Settings: ``ROUTEPACK_COST`` (preset or TOML, default ``qwen3-30b-a3b``),
``ROUTEPACK_OBJECTIVE``, ``ROUTEPACK_TIME_LIMIT``, ``ROUTEPACK_THREADS`` (see :mod:`routepack_opt.integrations._seam`),
checked here when the plugin loads.

verl logs a plugin's failure only at DEBUG, so this module says itself what happened, once:
an INFO line when it activates; a WARNING when ``ROUTEPACK_VERL`` holds a value it does not
recognise, when the settings are bad (naming the variable) or activation fails (verl's function
stays in every case). When verl's plugins are off (``VERL_USE_EXTERNAL_PLUGINS=none``, or a list
without ``routepack``) this module never runs in that process; :func:`check_environment`, called
when :mod:`routepack_opt.integrations.verl` is imported (e.g. by a driver using ``balance_batch``),
warns then.
"""

from __future__ import annotations

import functools
import importlib
import logging
import sys

from routepack_opt.integrations._verl_env import OFF_VALUES, ON_VALUES, ORIGINAL, check_environment, warn_once

__all__ = ["activate", "check_environment", "PATCHED_MODULES", "ORIGINAL", "ON_VALUES", "OFF_VALUES"]

logger = logging.getLogger("routepack_opt.integrations")

# Where verl 0.9.1 binds rearrange_micro_batches. The engine utilities import it by name, so
# patching seqlen_balancing before they load (verl loads plugins in its __init__) covers them;
# they are patched here only if already imported.
PATCHED_MODULES = ("verl.utils.seqlen_balancing", "verl.workers.engine.utils")
_NOT_GIVEN = object()


def activate(cost=None, objective=None, time_limit=_NOT_GIVEN, max_sweeps=None, seed: int = 0,
             threads=_NOT_GIVEN) -> list[str]:
    """Point verl's ``rearrange_micro_batches`` (where verl binds it) at RoutePack's, with the
    settings given, else ``ROUTEPACK_*``, else the defaults (checked here: a bad one is an
    ``InputError`` naming the keyword or variable). Returns the modules patched; logs one INFO."""
    # Imported here, not at the top: verl imports this plugin during its own import, and until
    # ROUTEPACK_VERL asks for it the planner (numba, the pipeline) must not load.
    from routepack_opt.integrations import verl as rp_verl
    from routepack_opt.integrations._seam import seam_settings

    settings = seam_settings("verl", cost=cost, objective=objective, max_sweeps=max_sweeps, seed=seed,
                             **({} if time_limit is _NOT_GIVEN else {"time_limit": time_limit}),
                             **({} if threads is _NOT_GIVEN else {"threads": threads}))
    fn = functools.partial(rp_verl.rearrange_micro_batches, settings=settings)
    fn.__routepack__ = True  # type: ignore[attr-defined]
    done = []
    for name in PATCHED_MODULES:
        if name != PATCHED_MODULES[0] and name not in sys.modules:
            continue
        try:
            mod = importlib.import_module(name)
        except Exception:  # a verl without this module (or its optional deps): skip it
            continue
        current = getattr(mod, "rearrange_micro_batches", None)
        if current is not None and not getattr(current, "__routepack__", False):
            ORIGINAL.setdefault("rearrange_micro_batches", current)
        mod.rearrange_micro_batches = fn
        done.append(name)
    logger.info("routepack verl: rearrange_micro_batches replaced in %s (objective %s, time limit %s per call)",
                ", ".join(done) or "nothing", settings.objective,
                "none" if settings.time_limit is None else f"{settings.time_limit:g} s")
    return done


def _load() -> None:
    if not check_environment():
        return
    try:
        activate()
    except Exception as exc:  # never break `import verl`; verl would log this only at DEBUG
        warn_once("load", "routepack verl: the plugin did not activate (%s: %s); verl's "
                   "rearrange_micro_batches stays", exc.__class__.__name__, exc)


_load()

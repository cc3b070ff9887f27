"""verl plugin (``verl.plugins`` entry point ``routepack``): with ``ROUTEPACK_VERL=1`` in the
environment, loading it swaps verl's ``rearrange_micro_batches`` for RoutePack's; with
``ROUTEPACK_VERL_BALANCE=1`` it installs the driver hook
(:func:`~routepack_opt.integrations.verl_trainer.install_balance_batch`) on ``RayPPOTrainer``
as soon as ``verl.trainer.ppo.ray_trainer`` is imported in that process: in verl's ``TaskRunner``
Ray actor (``main_ppo_v0``, ``trainer.use_v1=False``), which imports verl and then the trainer
before it builds it. Its settings: ``ROUTEPACK_MAX_TOKEN_LEN`` (required: the workers' cap,
``ppo_max_token_len_per_gpu × sp_size``), ``ROUTEPACK_NUM_EXPERTS`` (plan with the batch's
``routed_experts``), ``ROUTEPACK_EP_SIZE``, ``ROUTEPACK_REDUNDANT_EXPERTS``, ``ROUTEPACK_DP_SIZE``,
``ROUTEPACK_OVERLAP`` (``off``, ``balanced`` or ``1``, ``deferred``), and the seams' common
``ROUTEPACK_COST`` / ``OBJECTIVE`` / ``TIME_LIMIT`` / ``THREADS``; checked when the plugin loads
(a bad one: one WARNING naming it, verl's method stays).

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
import importlib.abc
import logging
import os
import sys

from routepack_opt.integrations._verl_env import OFF_VALUES, ON_VALUES, ORIGINAL, check_environment, warn_once

__all__ = ["activate", "check_environment", "PATCHED_MODULES", "ORIGINAL", "ON_VALUES", "OFF_VALUES",
           "balance_options_from_env", "install_balance_hook", "TRAINER_MODULE", "BALANCE_VARS"]

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


# where verl 0.9.1 defines the trainer the driver hook patches
TRAINER_MODULE = "verl.trainer.ppo.ray_trainer"
# ROUTEPACK_VERL_BALANCE's settings: variable -> install_balance_batch keyword
BALANCE_VARS = {"ROUTEPACK_MAX_TOKEN_LEN": "max_token_len", "ROUTEPACK_NUM_EXPERTS": "num_experts",
                "ROUTEPACK_EP_SIZE": "ep_size", "ROUTEPACK_REDUNDANT_EXPERTS": "redundant_experts",
                "ROUTEPACK_DP_SIZE": "dp_size", "ROUTEPACK_OVERLAP": "overlap"}
_OVERLAP_VALUES = {**{v: False for v in OFF_VALUES if v}, **{v: True for v in ON_VALUES}, "balanced": True,
                   "deferred": "deferred"}


def _switch(var: str) -> bool:
    """Whether ``var`` (``ROUTEPACK_VERL_BALANCE``) is on; one warning for a value it does not know."""
    raw = os.environ.get(var, "")
    value = raw.strip().lower()
    if value in OFF_VALUES:
        return False
    if value not in ON_VALUES:
        warn_once(f"value:{var}", "routepack verl: %s=%r is not recognised (%s switch it on; unset or %s keep it "
                  "off): nothing is installed", var, raw, "/".join(ON_VALUES), "/".join(v for v in OFF_VALUES if v))
        return False
    return True


def balance_options_from_env(environ=None) -> dict:
    """:func:`install_balance_batch`'s keywords from :data:`BALANCE_VARS` (each checked here, a
    bad one an ``InputError`` naming the variable; ``ROUTEPACK_MAX_TOKEN_LEN`` is required)."""
    from routepack_opt.core.checks import check_positive_int
    from routepack_opt.core.errors import InputError

    env = os.environ if environ is None else environ
    out: dict = {}
    for var, key in BALANCE_VARS.items():
        raw = env.get(var, "").strip()
        if not raw:
            continue
        if key == "overlap":
            if raw.lower() not in _OVERLAP_VALUES:
                raise InputError(f"{var}={raw!r}: expected off, balanced (or 1) or deferred")
            out[key] = _OVERLAP_VALUES[raw.lower()]
            continue
        try:
            value = int(raw)
        except ValueError:
            raise InputError(f"{var}={raw!r}: expected an integer") from None
        if key == "redundant_experts":
            from routepack_opt.core.checks import check_redundant_experts

            out[key] = check_redundant_experts(value, f"{var}={raw!r}")
        else:
            out[key] = check_positive_int(value, f"{var}={raw!r}")
    if "max_token_len" not in out:
        raise InputError("ROUTEPACK_VERL_BALANCE is on but ROUTEPACK_MAX_TOKEN_LEN is not set (the workers' "
                         "token cap per micro-batch, ppo_max_token_len_per_gpu × ulysses_sequence_parallel_size)")
    return out


def install_balance_hook(module) -> bool:
    """Install the driver hook on ``module.RayPPOTrainer`` (``verl.trainer.ppo.ray_trainer``) with
    the settings from the environment, once; returns whether it did. Logs one INFO line (the
    hook's own), or one WARNING when the settings are bad (verl's method stays)."""
    cls = getattr(module, "RayPPOTrainer", None)
    if cls is None or getattr(getattr(cls, "_balance_batch", None), "__routepack__", False):
        return False
    try:
        from routepack_opt.integrations.verl_trainer import install_balance_batch

        install_balance_batch(cls, **balance_options_from_env())
    except Exception as exc:  # never break verl's import
        warn_once("balance", "routepack verl: ROUTEPACK_VERL_BALANCE is set but the driver hook was not installed "
                  "(%s: %s); verl's _balance_batch stays", exc.__class__.__name__, exc)
        return False
    return True


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``callback(module)`` right after ``name`` is imported (the trainer module: it cannot
    be imported while ``import verl`` runs the plugins, it imports verl itself)."""

    def __init__(self, name: str, callback):
        self.name, self.callback = name, callback

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _CallbackLoader(spec.loader, self)
                return spec
        return None


class _CallbackLoader(importlib.abc.Loader):
    """A module's own loader, then the callback (everything else delegated to the loader)."""

    def __init__(self, inner, hook: _AfterImport):
        self._inner, self._hook = inner, hook

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        if self._hook in sys.meta_path:
            sys.meta_path.remove(self._hook)
        self._hook.callback(module)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _load_balance() -> None:
    """``ROUTEPACK_VERL_BALANCE=1``: the driver hook on ``RayPPOTrainer``, now if its module is
    loaded, else when it is."""
    if not _switch("ROUTEPACK_VERL_BALANCE"):
        return
    if TRAINER_MODULE in sys.modules:
        install_balance_hook(sys.modules[TRAINER_MODULE])
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(TRAINER_MODULE, install_balance_hook))


def _load() -> None:
    try:
        _load_balance()
    except Exception as exc:  # never break `import verl`
        warn_once("balance", "routepack verl: ROUTEPACK_VERL_BALANCE: the driver hook was not installed (%s: %s)",
                  exc.__class__.__name__, exc)
    if not check_environment():
        return
    try:
        activate()
    except Exception as exc:  # never break `import verl`; verl would log this only at DEBUG
        warn_once("load", "routepack verl: the plugin did not activate (%s: %s); verl's "
                   "rearrange_micro_batches stays", exc.__class__.__name__, exc)


_load()

"""Optional dependencies: torch is an extra, not a requirement.

The planner (``import routepack_opt``, ``solve``, every command but those below) needs no torch. The
torch runtime (:mod:`routepack_opt.runtime`: ``calibrate``, ``measure``, ``verify-runtime``) and the
trainer seams (:mod:`routepack_opt.integrations`) do; in a training environment the trainer's own
torch is used, and ``pip install 'routepack-opt[torch]'`` brings one elsewhere. Where it is missing,
they raise :class:`MissingDependency`, an :class:`InputError`: the CLI prints one ``error:`` line
and exits 2 (docs/README.md, "Install").
"""

from __future__ import annotations

import importlib
from types import ModuleType

from routepack_opt.core.errors import InputError

__all__ = ["MissingDependency", "require"]

# module → the install line that brings it
_INSTALL = {
    "torch": "install your training environment's torch, or pip install 'routepack-opt[torch]'",
    "safetensors": "pip install safetensors (or 'routepack-opt[integrations]')",
}


class MissingDependency(InputError):
    """An optional package a feature needs is not installed; the message says which and how to
    install it."""


def require(module: str, feature: str) -> ModuleType:
    """``module`` imported, or :class:`MissingDependency` naming ``feature`` (what needs it) when
    the package is not installed. A package that is installed but fails to import (a broken
    build, a missing library of its own) raises its own error unchanged."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        top = module.split(".")[0]
        if exc.name not in (module, top):
            raise
        how = _INSTALL.get(top, f"pip install {top}")
        raise MissingDependency(f"{feature} needs {top}, which is not installed: {how}") from None

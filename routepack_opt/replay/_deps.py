"""torch for reading ``.pt`` replay files, imported on first use and only here (the trainer seams'
handles in :mod:`routepack_opt.integrations._deps` share this one)."""

from __future__ import annotations

import functools

from routepack_opt.core.deps import require

__all__ = ["torch"]


@functools.cache
def torch():
    return require("torch", "the trainer seams (routepack_opt.integrations)")

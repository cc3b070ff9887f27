"""Where numba's compiled kernels are cached (docs/cli.md).

numba writes next to the sources (``__pycache__``) or, when that is not writable, into a
per-user cache. ``NUMBA_CACHE_DIR`` moves it (e.g. a directory baked into a container image, or
one shared by the ranks of a node); ``ROUTEPACK_CACHE_DIR`` does the same for RoutePack alone and
is copied into ``NUMBA_CACHE_DIR`` (when that is unset) by :func:`configure_cache` at
``import routepack_opt`` — numba reads it when *it* is imported, so it must be set before. This
module imports nothing heavy.
"""

from __future__ import annotations

import os

__all__ = ["configure_cache"]


def configure_cache() -> str | None:
    """Point numba's cache at ``ROUTEPACK_CACHE_DIR`` unless ``NUMBA_CACHE_DIR`` is already set.
    Cheap (no numba import); effective only if numba has not been imported yet."""
    ours = os.environ.get("ROUTEPACK_CACHE_DIR")
    if ours and not os.environ.get("NUMBA_CACHE_DIR"):
        os.environ["NUMBA_CACHE_DIR"] = ours
    return os.environ.get("NUMBA_CACHE_DIR") or None

"""verl's plugin switch, read without importing anything heavy: ``ROUTEPACK_VERL`` and verl's
``VERL_USE_EXTERNAL_PLUGINS``, the original function the plugin replaced, and one warning per
cause. Shared by :mod:`.verl_plugin` (loaded during ``import verl``) and :mod:`.verl`, which must
not import the plugin module (its import activates the plugin).
"""

from __future__ import annotations

import logging
import os

__all__ = ["ON_VALUES", "OFF_VALUES", "ORIGINAL", "check_environment", "warn_once"]

logger = logging.getLogger("routepack_opt.integrations")

ON_VALUES = ("1", "true", "yes", "on")
OFF_VALUES = ("", "0", "false", "no", "off")
# verl's own function, saved before the first patch (the drop-in's fallback calls it)
ORIGINAL: dict[str, object] = {}
_warned: set[str] = set()


def warn_once(key: str, msg: str, *args) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning(msg, *args)


def check_environment() -> bool:
    """Whether ``ROUTEPACK_VERL`` asks for the plugin; warns once when it does but verl's plugin
    policy (``VERL_USE_EXTERNAL_PLUGINS``) keeps it from loading, or the value is not recognised."""
    raw = os.environ.get("ROUTEPACK_VERL", "")
    value = raw.strip().lower()
    if value in OFF_VALUES:
        return False
    if value not in ON_VALUES:
        warn_once("value", "routepack verl: ROUTEPACK_VERL=%r is not recognised (%s switch RoutePack on; "
                   "unset or %s keep it off): verl's rearrange_micro_batches stays",
                   raw, "/".join(ON_VALUES), "/".join(v for v in OFF_VALUES if v))
        return False
    policy = os.environ.get("VERL_USE_EXTERNAL_PLUGINS", "auto").strip().lower()
    if policy == "none" or (policy != "auto" and "routepack" not in {p.strip() for p in policy.split(",")}):
        warn_once("policy", "routepack verl: ROUTEPACK_VERL=%s is set but VERL_USE_EXTERNAL_PLUGINS=%r keeps "
                   "verl from loading the routepack plugin: RoutePack is not active (set it to 'auto' or "
                   "add 'routepack')", raw, policy)
    return True

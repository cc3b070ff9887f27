"""The one check of each argument that many entry points share (PyVRP's habit: validate once,
at the boundary, with a message a user can act on). Entry points call these instead of writing
the rule again; ``name`` is how the caller's user spells the argument."""

from __future__ import annotations

import math

import numpy as np

from routepack_opt.core.errors import InputError

__all__ = ["check_redundant_experts", "check_time_limit", "check_positive_int", "check_known_options"]


def check_redundant_experts(value, name: str = "redundant_experts") -> int:
    """Redundant expert slots per MoE layer: an integer ≥ 0 (whether E + N fits the EP size is
    :meth:`~routepack_opt.core.topology.Topology.check_experts`'s question)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise InputError(f"{name}: expected an integer ≥ 0, got {value!r}")
    return int(value)


def check_time_limit(value, name: str = "time limit") -> float:
    """A time limit: a finite number of seconds > 0 (None, no limit, is for the caller to allow)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)) \
            or not math.isfinite(value) or value <= 0:
        raise InputError(f"{name} must be a positive number of seconds, got {value!r}")
    return float(value)


def check_positive_int(value, name: str, *, allow_none: bool = False) -> int | None:
    """An integer ≥ 1 (numpy integers too, never a bool or a float such as 2.0); None passes
    only with ``allow_none``."""
    if value is None and allow_none:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InputError(f"{name}: expected a positive integer{' or None' if allow_none else ''}, got {value!r}")
    return int(value)


def check_known_options(given, known, where: str) -> None:
    """Raise naming every key of ``given`` not in ``known`` (with the nearest known spelling),
    instead of Python's ``TypeError: ... got an unexpected keyword argument``."""
    import difflib

    unknown = sorted(set(given) - set(known))
    if not unknown:
        return
    parts = []
    for key in unknown:
        near = difflib.get_close_matches(str(key), [str(k) for k in known], n=1)
        parts.append(f"{key!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
    raise InputError(f"{where}: unknown option{'s' if len(unknown) > 1 else ''} {', '.join(parts)}; "
                     f"known: {', '.join(sorted(known))}")

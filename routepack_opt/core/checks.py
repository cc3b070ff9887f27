"""The one check of each argument that many entry points share (PyVRP's habit: validate once,
at the boundary, with a message a user can act on). Entry points call these instead of writing
the rule again; ``name`` is how the caller's user spells the argument."""

from __future__ import annotations

import math

import numpy as np

from routepack_opt.core.errors import InputError

__all__ = ["check_redundant_experts", "check_time_limit"]


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

"""The two objectives (docs/model.md): how a row × shard cost matrix ``J[r, g]`` becomes a step time.

- ``max-sum``: shards run their rows back to back and wait for each other once, at the end:
  makespan ``max_g Σ_r J[r, g]``;
- ``sum-max``: every row is a synchronisation point: makespan ``Σ_r max_g J[r, g]``.

An :class:`Objective` is a ``StrEnum``: it equals (and serialises as) its string, so plans and
JSON reports read ``"max-sum"`` / ``"sum-max"`` as before.
"""

from __future__ import annotations

from enum import StrEnum

from routepack_opt.core.errors import InputError

__all__ = ["Objective", "check_objective"]


class Objective(StrEnum):
    MAX_SUM = "max-sum"
    SUM_MAX = "sum-max"

    @property
    def code(self) -> int:
        """The integer the numba kernels branch on (0: max-sum, 1: sum-max)."""
        return 0 if self is Objective.MAX_SUM else 1


def check_objective(objective) -> Objective:
    """``objective`` (a string or an :class:`Objective`) as an :class:`Objective`; InputError
    naming the choices otherwise."""
    try:
        return Objective(objective)
    except ValueError:
        choices = ", ".join(o.value for o in Objective)
        raise InputError(f"objective must be one of {choices}, got {objective!r}") from None

"""The two objectives (docs/model.md): how a row × shard cost matrix ``J[r, g]`` becomes a step time.

- ``max-sum``: shards run their rows back to back and wait for each other once, at the end:
  makespan ``max_g Σ_r J[r, g]``;
- ``sum-max``: every row is a synchronisation point: makespan ``Σ_r max_g J[r, g]``.

An :class:`Objective` is a ``StrEnum``: it equals (and serialises as) its string, so plans and
JSON reports read ``"max-sum"`` / ``"sum-max"`` as before. Strings become an :class:`Objective`
once, at the boundary (:func:`check_objective`); inside, code asks the objective
(:meth:`Objective.makespan`, :meth:`Objective.critical_blocks`, :attr:`Objective.other`) and
the compiled kernels its :attr:`~Objective.code`, which only
:mod:`routepack_opt.core.cost_kernel` branches on. Every branch here and there raises on an
objective it does not know, so a third objective cannot silently run as one of these two.
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np

from routepack_opt.core.checks import shown
from routepack_opt.core.errors import InputError

__all__ = ["Objective", "check_objective"]


class Objective(StrEnum):
    MAX_SUM = "max-sum"
    SUM_MAX = "sum-max"

    @property
    def code(self) -> int:
        """The integer the numba kernels read (its position: 0 max-sum, 1 sum-max); only
        :func:`routepack_opt.core.cost_kernel.is_max_sum` branches on it."""
        return list(Objective).index(self)

    @property
    def other(self) -> Objective:
        """The other objective (reports show the plan's makespan under both)."""
        if self is Objective.MAX_SUM:
            return Objective.SUM_MAX
        if self is Objective.SUM_MAX:
            return Objective.MAX_SUM
        raise ValueError(f"no other objective defined for {self!r}")

    def makespan(self, J_RG: np.ndarray) -> float:
        """The first key component of a row × shard cost matrix (numpy's reductions, so the
        one evaluator's figures are these bit for bit)."""
        if self is Objective.MAX_SUM:
            return float(J_RG.sum(axis=0).max())
        if self is Objective.SUM_MAX:
            return float(J_RG.max(axis=1).sum())
        raise ValueError(f"no makespan defined for {self!r}")

    def critical_blocks(self, J_RG: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(rows, shards) of the blocks on the critical path, one per row, whose J sum to the
        makespan: the busiest shard's column (max-sum) or each row's busiest block (sum-max)."""
        R = J_RG.shape[0]
        if self is Objective.MAX_SUM:
            return np.arange(R), np.full(R, int(J_RG.sum(axis=0).argmax()))
        if self is Objective.SUM_MAX:
            return np.arange(R), J_RG.argmax(axis=1)
        raise ValueError(f"no critical path defined for {self!r}")


def check_objective(objective) -> Objective:
    """``objective`` (a string or an :class:`Objective`) as an :class:`Objective`; InputError
    naming the choices otherwise. Strings are parsed at the boundary (``solve``, the CLI, a TOML
    config, the seams' settings, ``ReportConfig``); the public types that also accept a string
    (``Plan``, the evaluator) pass an :class:`Objective` through unchanged."""
    if type(objective) is Objective:
        return objective
    try:
        return Objective(objective)
    except (ValueError, TypeError):
        choices = ", ".join(o.value for o in Objective)
        raise InputError(f"objective must be one of {choices}, got {shown(objective)}") from None

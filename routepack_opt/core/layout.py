"""A layout: which cell (row, DP slot) each sample sits in, and how many rows there are.

Legend: N samples, R rows, D DP slots.

A layout used to travel as a loose ``(row_N, slot_N, rows)`` triple; :class:`Layout` is that triple
frozen and checked once. Compiled kernels still take the raw arrays (``layout.row``,
``layout.slot``): they are read-only int64 arrays, so a kernel can read them but nobody can change
a layout after it is built.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from routepack_opt.core.checks import int_array, is_integer, shown
from routepack_opt.core.errors import InputError

__all__ = ["Layout", "check_rows"]


def check_rows(rows: object, what: str = "rows") -> int:
    """``rows`` as an int, or ``InputError("<what> must be a positive integer, got ...")``.

    The one positive-rows check (booleans are refused: ``True`` is not a row count)."""
    if not is_integer(rows) or rows < 1:
        raise InputError(f"{what} must be a positive integer, got {shown(rows)}")
    return int(rows)


def _frozen_int64(a: object, name: str) -> np.ndarray:
    arr = int_array(a, f"layout: {name}", lo=0).copy()  # a copy: the caller's array stays the caller's
    if arr.ndim != 1:
        raise InputError(f"layout: {name} must be a 1-d array of sample cells, got shape {list(arr.shape)}")
    arr.flags.writeable = False
    return arr


@dataclasses.dataclass(frozen=True, eq=False)
class Layout:
    """``row[i]``, ``slot[i]``: the cell of sample i; ``rows``: R (every cell of the R × D grid is
    used by a valid layout, :meth:`check` says which rules a layout breaks for a given D).

    Built once and immutable: ``row`` and ``slot`` are read-only int64 copies."""

    row: np.ndarray
    slot: np.ndarray
    rows: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "rows", check_rows(self.rows, "layout: rows"))
        row = _frozen_int64(self.row, "row")
        slot = _frozen_int64(self.slot, "slot")
        if row.shape != slot.shape:
            raise InputError(f"layout: row covers {row.size} samples, slot {slot.size}")
        object.__setattr__(self, "row", row)
        object.__setattr__(self, "slot", slot)

    @classmethod
    def of(cls, layout: Layout | tuple, rows: int | None = None) -> Layout:
        """``layout`` itself, or a Layout from ``(row_N, slot_N)`` and ``rows``."""
        if isinstance(layout, Layout):
            return layout
        row, slot = layout
        if rows is None:
            raise InputError("layout: (row, slot) needs rows")
        return cls(row, slot, rows)

    @property
    def num_samples(self) -> int:
        return int(self.row.size)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """``(row_N, slot_N)`` as fresh writable copies, for the compiled kernels and solvers that
        take raw arrays (numba compiles a separate specialisation for read-only arrays, outside
        the warm-up, so the frozen ones are not handed to kernels)."""
        return self.row.copy(), self.slot.copy()

    def cell_index(self, dp: int) -> np.ndarray:
        """``cell_N = row · D + slot``."""
        return self.row * dp + self.slot

    def check(self, dp: int, num_samples: int | None = None) -> list[str]:
        """Structural violations for D = ``dp`` slots (empty list: none): coverage of
        ``num_samples`` samples, cells inside the R × D grid, every cell nonempty. Capacity and
        the topology's row rules are :meth:`routepack_opt.core.plan.Plan.validate`'s."""
        n = self.num_samples if num_samples is None else num_samples
        if self.row.shape != (n,):
            return [f"cells: cover {self.row.size} samples, window has {n}"]
        errs = []
        placed = self.row >= 0
        missing = np.flatnonzero(~placed)
        if missing.size:
            errs.append(f"coverage: samples {missing[:10].tolist()} are in no cell")
        inside = (self.row < self.rows) & (self.slot >= 0) & (self.slot < dp)
        if not inside[placed].all():
            errs.append("cells: a sample sits outside the R × D grid")
            return errs
        members = np.bincount(self.cell_index(dp)[placed], minlength=self.rows * dp)
        empty = np.flatnonzero(members == 0)
        if empty.size:
            errs.append("nonempty: empty cells " + ", ".join(
                f"({c // dp}, {c % dp})" for c in empty[:10].tolist())
                + (f" (+{empty.size - 10} more)" if empty.size > 10 else ""))
        return errs

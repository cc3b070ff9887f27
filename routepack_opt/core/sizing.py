"""Sizes before allocations: a stage whose time or memory grows faster than its input (a table over
the capacity, a graph over loads, a model with a variable per type and bin) states what it would
cost and asks here whether that fits, before it allocates anything.

Memory: at most :data:`MEMORY_BUDGET` bytes for one stage's tables (about 2 GiB), or the size of
the input itself when that is larger. Time: an estimate in seconds against the time left. A stage
that does not fit is skipped (or run in a cheaper form) and says why: :func:`too_costly` returns
that reason, which the caller puts into its certificate or plan info.
"""

from __future__ import annotations

__all__ = ["MEMORY_BUDGET", "too_costly", "fits_memory"]

MEMORY_BUDGET = 2 * 2**30  # bytes one stage's tables may take


def fits_memory(nbytes: float, input_bytes: int = 0) -> bool:
    """Whether a stage may allocate ``nbytes`` (the budget, or the input's own size if larger)."""
    return nbytes <= max(MEMORY_BUDGET, int(input_bytes))


def too_costly(what: str, *, nbytes: float = 0.0, seconds: float = 0.0, time_left: float | None = None,
               input_bytes: int = 0) -> str | None:
    """None when ``what`` fits: ``nbytes`` within the memory budget and ``seconds`` (an estimate)
    within ``time_left`` (None: no limit). Else the reason, for the certificate or plan info."""
    if not fits_memory(nbytes, input_bytes):
        return (f"{what} skipped: it needs about {nbytes / 2**30:,.1f} GiB, over the "
                f"{max(MEMORY_BUDGET, input_bytes) / 2**30:,.1f} GiB memory budget")
    if time_left is not None and seconds > time_left:
        return f"{what} skipped: it needs about {seconds:,.2f} s, {max(time_left, 0.0):,.2f} s left"
    return None

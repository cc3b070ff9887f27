"""The solver libraries, imported on first use and only here.

OR-Tools (CP-SAT), Pyomo and HiGHS take about a second to import together; importing
``routepack_opt`` (or the pipeline, which needs no exact model unless R* escalates) must not pay
for them. Every model module asks these accessors for its library instead of importing it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading

__all__ = ["cp_model", "pyomo", "appsi_highs", "highspy", "highs_threads", "quiet_appsi_highs", "simplex_lp"]


@functools.cache
def cp_model():
    """``ortools.sat.python.cp_model``."""
    from ortools.sat.python import cp_model as module

    return module


@functools.cache
def pyomo():
    """``pyomo.environ``."""
    import pyomo.environ as module

    return module


@functools.cache
def appsi_highs():
    """Pyomo's APPSI HiGHS interface: ``(Highs, TerminationCondition)``."""
    pyomo()
    from pyomo.contrib.appsi.base import TerminationCondition
    from pyomo.contrib.appsi.solvers import Highs

    return Highs, TerminationCondition


@functools.cache
def highspy():
    """``highspy`` (HiGHS' own Python binding)."""
    import highspy as module

    return module


@contextlib.contextmanager
def quiet_appsi_highs():
    """Silence APPSI-HiGHS' warnings (a time-limited solve without a proof logs one per call)
    for the duration of one solve, and restore the logger's level afterwards: the caller's
    logging configuration is not ours to change."""
    logger = logging.getLogger("pyomo.contrib.appsi.solvers.highs")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


_highs_lock = threading.Lock()
_highs_sized_for: list[int] = []  # the thread count HiGHS' scheduler was last sized for, if any


def highs_threads(threads: int | None) -> int:
    """The value to give HiGHS' ``threads`` option (``None``/0: HiGHS chooses), made safe to use.

    HiGHS sizes one process-wide task scheduler at its first solve; a later solve asking for a
    different thread count does not run ("the scheduler has already been initialized to use N
    threads") and returns no solution. Every HiGHS solve here (arc-flow bin packing with one
    thread, the layout MILP with ``num_workers``, the block LPs) states its count through this
    function, which resets the scheduler when the count changes."""
    n = int(threads or 0)
    with _highs_lock:
        if _highs_sized_for and _highs_sized_for[0] != n:
            highspy().Highs.resetGlobalScheduler(True)
        _highs_sized_for[:] = [n]
    return n


def simplex_lp():
    """An empty HiGHS model for the column-generation masters: quiet, one thread, seed 0, no
    presolve, simplex (warm-started as columns and rows are added)."""
    h = highspy().Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", highs_threads(1))
    h.setOptionValue("random_seed", 0)
    h.setOptionValue("presolve", "off")
    h.setOptionValue("solver", "simplex")
    return h

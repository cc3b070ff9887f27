"""The solver libraries, imported on first use and only here.

OR-Tools (CP-SAT), Pyomo and HiGHS take about a second to import together; importing
``routepack_opt`` (or the pipeline, which needs no exact model unless R* escalates) must not pay
for them. Every model module asks these accessors for its library instead of importing it.

Standard output is the caller's (``--json`` prints one object there): HiGHS writes its banner to
file descriptor 1 from the first ``Highs()`` of a process, before any option can silence it, so
:func:`highspy` builds that first instance with descriptor 1 pointed at ``/dev/null``
(:func:`quiet_stdout_fd`). Every HiGHS use (highspy, Pyomo's APPSI interface) goes through it.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import sys
import threading

__all__ = ["cp_model", "pyomo", "appsi_highs", "highspy", "highs_threads", "quiet_appsi_highs", "simplex_lp",
           "quiet_stdout_fd", "loaded", "IMPORT_SECONDS"]

# Seconds the first use of a library costs in a process (import, and HiGHS' first instance),
# measured on a loaded 2-core machine: a stage with less time left does not start it.
IMPORT_SECONDS = {"cp_model": 0.6, "pyomo": 1.2, "highspy": 0.3}


@contextlib.contextmanager
def quiet_stdout_fd():
    """File descriptor 1 points at ``/dev/null`` for the duration (C libraries' prints, not
    Python's ``sys.stdout``, which is flushed first); restored afterwards, C's stdio buffers
    flushed before, so nothing written inside comes out later."""
    try:
        sys.stdout.flush()
    except (AttributeError, OSError, ValueError):
        pass
    try:
        saved = os.dup(1)
    except OSError:  # no descriptor 1 at all: nothing to protect
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        with contextlib.suppress(Exception):
            ctypes.CDLL(None).fflush(None)
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def loaded(name: str) -> bool:
    """Whether the accessor ``name`` (``cp_model``, ``pyomo``, ``highspy``) has run in this
    process (its first use then costs nothing more)."""
    return globals()[name].cache_info().currsize > 0


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
    highspy()  # its first instance (the banner) built quietly before APPSI builds one
    from pyomo.contrib.appsi.base import TerminationCondition
    from pyomo.contrib.appsi.solvers import Highs

    return Highs, TerminationCondition


@functools.cache
def highspy():
    """``highspy`` (HiGHS' own Python binding), its banner already printed (to nowhere)."""
    import highspy as module

    with quiet_stdout_fd():
        module.Highs()
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

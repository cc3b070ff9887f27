"""``routepack warmup``: compile (or load from the cache) every numba kernel ahead of time.

Run it once at install or image build (e.g. ``NUMBA_CACHE_DIR=/opt/routepack-cache routepack
warmup`` in a Dockerfile, the same variable set at run time): the first plan then loads the
machine code in under a second instead of compiling for tens of seconds. Planning calls the same
warm-up itself before its time limit starts (routepack_opt/warmup.py), so this only moves that
one-off cost to a better moment.
"""

from __future__ import annotations

import contextlib
import os
import sys

from routepack_opt.cli.common import add_json, emit, positive_int


def register(sub) -> None:
    p = sub.add_parser("warmup", help="compile/load every numba kernel ahead of time (install, image build)",
                       description="Compile (or load from numba's cache) every kernel the planner "
                       "and the exact models use, for every signature they call. The cache lives "
                       "in NUMBA_CACHE_DIR (or ROUTEPACK_CACHE_DIR) when set.")
    p.add_argument("--group", choices=["all", "plan", "joint", "replicas", "storage", "exact"], default="all",
                   help="which kernels: plan (routepack plan/compare, the Python API, the trainer seams), joint "
                        "(--placement joint, migration), storage "
                        "(the annealer's int32/int64 load storages for huge loads), exact "
                        "(routepack exact's block decomposition), or all (default)")
    p.add_argument("--jobs", type=positive_int, default=None,
                   help="worker processes that compile at once (default: the CPUs this process may "
                        "use; 1: compile in this process only)")
    add_json(p)
    p.set_defaults(func=run)


@contextlib.contextmanager
def _stdout_to_stderr():
    """Solver banners (HiGHS prints one when created) must not reach stdout under --json."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no real file descriptor 1 (e.g. captured): nothing to redirect
        yield
        return
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        _c_fflush()
        os.dup2(saved, 1)
        os.close(saved)


def _c_fflush() -> None:
    """Flush C stdio buffers (a solver's banner may sit there) before fd 1 is restored."""
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except Exception:  # pragma: no cover - no libc (unusual platforms): best effort
        pass


def worker_progress(enabled: bool):
    """A ``warm(progress=)`` callback that prints one line per finished worker unit to stderr."""
    if not enabled:
        return None

    def progress(unit: str, seconds: float, ok: bool) -> None:
        print(f"  {unit}: {'compiled' if ok else 'FAILED (compiled in-process instead)'} "
              f"in {seconds:.1f} s", file=sys.stderr, flush=True)

    return progress


def run(args) -> dict:
    from routepack_opt.warmup import GROUPS, default_jobs, warm

    groups = tuple(GROUPS) if args.group == "all" else (args.group,)
    jobs = args.jobs or default_jobs()
    with _stdout_to_stderr():
        rep = warm(groups, jobs=jobs, progress=worker_progress(not args.json))
    rep["jobs"] = jobs
    if rep.get("error"):
        raise RuntimeError(f"warm-up failed: {rep['error']}")
    text = (f"warmup: {rep['kernels']} numba kernels ({', '.join(groups)}), "
            f"{rep['compiled']} signatures compiled here, {rep['loaded']} loaded from the cache "
            f"({len(rep.get('workers', {}))} worker units, {jobs} at a time) in {rep['seconds']:.2f} s"
            f"\n  cache: {rep['cache_dir']}")
    emit(args, rep, text)
    return rep

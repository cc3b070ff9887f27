"""The Ray cluster behind the replay report's parallel runs and :class:`RayPlanner`: started here
(and stopped), joined at an address, or the one this process already initialised; a reaper
process that kills what a started cluster leaves behind when this process dies; ``ray.init``
with the process's signal handlers kept. Re-exported by :mod:`routepack_opt.integrations.ray`."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator

import numpy as np

from routepack_opt.core.errors import InputError

__all__ = ["ray_cluster", "RayCluster", "check_workers"]


def _ray():
    try:
        import ray
    except ImportError:
        raise InputError("this needs Ray: pip install ray (in routepack-opt's 'integrations' extra)") from None
    return ray


@dataclasses.dataclass(frozen=True)
class RayCluster:
    """The cluster a run uses: ``slots`` windows run at once; ``started``: by this process."""

    slots: int
    started: bool
    address: str | None


@contextlib.contextmanager
def ray_cluster(workers: int | None = None, address: str | None = None) -> Iterator[RayCluster]:
    """``workers``: start a local cluster of that many CPUs (stopped on exit); ``address``: join
    that cluster (``"auto"``, ``"host:6379"``, ``"ray://host:10001"``; disconnected on exit);
    neither: reuse the Ray this process already initialised, else a local cluster of 1 CPU. With
    ``workers`` and a Ray already running here, that one is reused with ``workers`` slots."""
    ray = _ray()
    if workers is not None and address is not None:
        raise InputError("give --workers N (a local cluster) or --address ADDR (a running one), not both")
    if workers is not None and (isinstance(workers, bool) or int(workers) < 1):
        raise InputError(f"--workers must be ≥ 1, got {workers}")
    started = False
    if address is not None:
        if ray.is_initialized():
            raise InputError("Ray is already initialised in this process; drop --address to use it")
        _check_reachable(address)  # Ray itself retries an unreachable GCS for minutes
        try:
            _init_keeping_signals(ray, address=address, logging_level="ERROR", log_to_driver=False)
        except Exception as exc:  # ConnectionError, ValueError, TimeoutError... all one line
            raise InputError(f"--address {address}: cannot join the Ray cluster "
                             f"({exc.__class__.__name__}: {' '.join(str(exc).split())[:200]})") from None
        started = True
    elif not ray.is_initialized():
        workers = check_workers(workers or 1)
        guard = _Reaper.start()  # kills every process Ray starts for us, even after kill -9 of ours
        try:
            _init_keeping_signals(ray, num_cpus=workers, include_dashboard=False, logging_level="ERROR",
                                  log_to_driver=False)
        except BaseException:
            with _signals_deferred():
                with contextlib.suppress(Exception):
                    if ray.is_initialized():
                        ray.shutdown()
                guard.stop()
            raise
        started = True
    else:
        guard = None
    try:
        cpus = int(ray.cluster_resources().get("CPU", 1))
        yield RayCluster(slots=max(1, min(cpus, workers) if workers else cpus), started=started, address=address)
    finally:
        if started:
            with _signals_deferred():  # a second SIGTERM must not cut the shutdown short
                with contextlib.suppress(Exception):
                    ray.shutdown()
                if address is None and guard is not None:
                    guard.stop()


def check_workers(workers) -> int:
    """``--workers``: an integer from 1 to :data:`MAX_WORKERS_PER_CPU` × the CPUs here (each
    worker is a process of its own, a few hundred MB with numba: more than that only queues)."""
    import os

    limit = MAX_WORKERS_PER_CPU * (os.cpu_count() or 1)
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or not 1 <= workers <= limit:
        raise InputError(f"--workers must be an integer in 1..{limit} ({MAX_WORKERS_PER_CPU} × the "
                         f"{os.cpu_count() or 1} CPUs here), got {workers!r:.30}")
    return int(workers)


MAX_WORKERS_PER_CPU = 8

# The reaper: a small process that waits for EOF on a pipe only we hold (our death, kill -9
# included, or :meth:`_Reaper.stop`), then SIGKILLs every process whose environment carries our
# token: the GCS, the raylet, its agents (DashboardAgent, RuntimeEnvAgent), the workers — all
# started after the token was set, all inheriting it. Ray's own reaper kills only its process
# group, which the agents leave.
_REAPER_CODE = r"""
import os, signal, sys, time
token = sys.argv[1].encode()
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
sys.stdin.buffer.read()
me = os.getpid()
for _ in range(int(sys.argv[2])):
    hit = 0
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as fh:
                env = fh.read()
        except OSError:
            continue
        if token in env.split(b"\0"):
            hit += 1
            try:
                os.kill(int(d), signal.SIGKILL)
            except OSError:
                pass
    if not hit:
        break
    time.sleep(0.2)
"""
REAPER_ENV = "ROUTEPACK_RAY_OWNER"


class _Reaper:
    def __init__(self, proc, token: str, old):
        self.proc, self.token, self.old = proc, token, old

    @classmethod
    def start(cls) -> _Reaper:
        import os
        import secrets
        import subprocess
        import sys

        token = f"{REAPER_ENV}={os.getpid()}-{secrets.token_hex(8)}"
        env = {k: v for k, v in os.environ.items() if k != REAPER_ENV}
        proc = subprocess.Popen([sys.executable, "-S", "-c", _REAPER_CODE, token, "50"], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                                start_new_session=True, close_fds=True)
        old = os.environ.get(REAPER_ENV)
        os.environ[REAPER_ENV] = token.split("=", 1)[1]  # inherited by every process Ray starts
        return cls(proc, token, old)

    def stop(self, wait: float = 15.0) -> None:
        """Close the pipe (the reaper kills what is left) and wait for it."""
        import os

        if self.old is None:
            os.environ.pop(REAPER_ENV, None)
        else:
            os.environ[REAPER_ENV] = self.old
        with contextlib.suppress(Exception):
            self.proc.stdin.close()
        with contextlib.suppress(Exception):
            self.proc.wait(wait)


def _init_keeping_signals(ray, **kwargs) -> None:
    """``ray.init`` without Ray's signal handling, and never cut in the middle: ray.init sets a
    SIGTERM handler that exits 15 in silence, and its core worker a C++ one that dumps a stack and
    aborts; an init interrupted half way leaves a driver that crashes at exit. So a SIGINT or
    SIGTERM during the init is held (recorded) until the init is done, then raised as
    KeyboardInterrupt (``error: interrupted``, exit 130; the caller shuts Ray down); our handlers
    (SIGTERM as SIGINT) are put back. Off the main thread, plain ``ray.init``."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        ray.init(**kwargs)
        return
    # Ray's own switch (RAY_DISABLE_FAILURE_SIGNAL_HANDLER, read when ray is imported): the driver's
    # core worker installs no C++ failure handler on SIGTERM
    with contextlib.suppress(Exception):
        import ray._private.ray_constants as ray_constants

        ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True
    held: list[int] = []
    old_term = signal.signal(signal.SIGTERM, lambda signum, frame: held.append(signum))
    old_int = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    utils = None
    with contextlib.suppress(Exception):  # ray.init's own SIGTERM handler (sys.exit(15)): not set
        import ray._private.utils as utils

        old_setter = utils.set_sigterm_handler
        utils.set_sigterm_handler = lambda handler: None
    from routepack_opt.core.inputs import display_name

    if utils is not None:  # Ray stores our command line as UTF-8: a non-UTF-8 file name in it failed
        old_entry = utils.get_entrypoint_name
        utils.get_entrypoint_name = lambda: display_name(old_entry())
    try:
        ray.init(**kwargs)
    except SystemExit as exc:  # Ray's handler after all: sys.exit(SIGTERM)
        if exc.code == signal.SIGTERM:
            raise KeyboardInterrupt from None
        raise
    except (InputError, KeyboardInterrupt):
        raise
    except Exception as exc:  # a raylet or GCS that died or timed out while starting
        if "address" in kwargs:
            raise
        raise InputError(f"Ray could not start a local cluster ({exc.__class__.__name__}: "
                         f"{' '.join(str(exc).split())[:200]})") from None
    finally:
        if utils is not None:
            utils.get_entrypoint_name = old_entry
            utils.set_sigterm_handler = old_setter
        signal.signal(signal.SIGTERM, old_term if old_term is not None else signal.SIG_DFL)
        signal.signal(signal.SIGINT, old_int if old_int is not None else signal.default_int_handler)
    if held:
        raise KeyboardInterrupt


@contextlib.contextmanager
def _signals_deferred():
    """SIGINT/SIGTERM held while Ray shuts down (delivered after, once)."""
    import signal

    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    except (ValueError, OSError, AttributeError):
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _cluster_failure() -> str | None:
    """Why the local cluster this process started is broken (a dead raylet or GCS), else None."""
    with contextlib.suppress(Exception):
        import ray._private.worker as rw

        node = getattr(rw, "_global_node", None)
        if node is not None:
            dead = node.dead_processes()
            if dead:
                return ", ".join(f"{kind} exited with {proc.returncode}" for kind, proc in dead[:3])
    return None


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """A ``host:port`` (or ``ray://host:port``) address must accept a TCP connection."""
    import socket

    hostport = address.removeprefix("ray://")
    if address == "auto" or ":" not in hostport:
        return
    host, _, port = hostport.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except (OSError, ValueError) as exc:
        raise InputError(f"--address {address}: nothing answers there ({exc.__class__.__name__}: {exc}); "
                         "start the cluster (ray start --head) or fix the address") from None

"""``torch.distributed`` plumbing: launching a bounded local process group, EP/EDP groups, and an
all-reduce whose summation order is fixed.

Why an ordered all-reduce: a ring all-reduce sums each element in an order that depends on the
element's offset in the buffer. An expert that moves to another slot changes offset, so with three
or more shards its reduced gradient could differ in the last bit. Gathering every rank's copy and
summing in rank order makes the result depend only on the values, never on the offset.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from routepack_opt.core.checks import (
    INT64_MAX,
    MAX_WORKERS,
    check_choice,
    check_int,
    check_time_limit,
    check_type,
    shown,
)
from routepack_opt.core.errors import InputError

__all__ = ["free_port", "launch", "init_group", "ParallelGroups", "ordered_all_reduce",
           "deterministic"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_group(rank: int, world_size: int, port: int, backend: str = "gloo",
               timeout_s: float = 60.0) -> None:
    """Join the process group at 127.0.0.1:port (gloo on CPU, nccl on GPU)."""
    world_size = check_int(world_size, "world_size", 1, INT64_MAX)
    check_int(rank, "rank", 0, world_size - 1)
    check_int(port, "port", 1, 65535)
    check_choice(backend, "backend", ("gloo", "nccl"))
    check_time_limit(timeout_s, "timeout_s")
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    if backend == "gloo" and "GLOO_SOCKET_IFNAME" not in os.environ and os.path.exists("/sys/class/net/lo"):
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # stay on loopback in containers with odd NICs
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=timeout_s))


class ParallelGroups:
    """EP groups (the P ranks of one EDP shard, Megatron order: shard g = ranks g·P .. g·P+P-1)
    and EDP groups (the G ranks that hold the same expert slots, one per shard)."""

    def __init__(self, world_size: int, ep: int):
        world_size = check_int(world_size, "world_size", 1, INT64_MAX)
        ep = check_int(ep, "ep", 1, world_size)
        if world_size % ep:
            raise InputError(f"ep: world_size={world_size} is not divisible by ep={ep}")
        rank = dist.get_rank()
        self.world_size, self.ep, self.rank = world_size, ep, rank
        self.num_shards = world_size // ep
        self.shard, self.ep_rank = divmod(rank, ep)
        # every rank must create every group, in the same order
        eps = [dist.new_group(list(range(g * ep, (g + 1) * ep))) for g in range(self.num_shards)]
        edps = [dist.new_group([g * ep + p for g in range(self.num_shards)]) for p in range(ep)]
        self.ep_group = eps[self.shard]
        self.edp_group = edps[self.ep_rank]


def ordered_all_reduce(tensors: list[torch.Tensor], group=None) -> None:
    """Sum ``tensors`` over ``group`` in place, adding the ranks' copies in rank order."""
    check_type(tensors, "tensors", (list, tuple), "list of torch.Tensor")
    for i, t in enumerate(tensors):
        check_type(t, f"tensors[{i}]", torch.Tensor, "torch.Tensor")
    n = dist.get_world_size(group)
    if n == 1 or not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    bufs = [torch.empty_like(flat) for _ in range(n)]
    dist.all_gather(bufs, flat, group=group)
    acc = bufs[0].clone()
    for b in bufs[1:]:
        acc += b
    off = 0
    for t in tensors:
        t.copy_(acc[off:off + t.numel()].view_as(t))
        off += t.numel()


def deterministic(seed: int = 0, threads: int | None = 1) -> contextlib.AbstractContextManager[None]:
    """Deterministic torch settings for a block: deterministic algorithms, a fixed seed and (by
    default) one intra-op thread, so every elementwise kernel sees whole, aligned vectors.
    The arguments are checked at the call, before the block is entered."""
    check_int(seed, "seed", 0, INT64_MAX)
    if threads is not None:
        check_int(threads, "threads", 0, MAX_WORKERS)
    return _deterministic(int(seed), threads)


@contextlib.contextmanager
def _deterministic(seed: int, threads: int | None):
    # cuBLAS needs a fixed workspace for deterministic GEMMs (read when its handle is created)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    prev_det = torch.are_deterministic_algorithms_enabled()
    prev_threads = torch.get_num_threads()
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(seed)
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(prev_det)
        torch.set_num_threads(prev_threads)


def launch(fn, world_size: int, args: tuple = (), timeout_s: float = 120.0, retries: int = 2,
           start_method: str = "forkserver") -> None:
    """Run ``fn(rank, port, *args)`` in ``world_size`` fresh processes
    (``torch.multiprocessing.start_processes``) and wait, at most ``timeout_s`` seconds; on
    timeout every child is killed and ``TimeoutError`` raised. A child that fails raises
    ``RuntimeError`` here; a port lost to a race is retried with a new one.

    ``start_method``: "spawn" (a fresh interpreter per rank) or "forkserver" (default): a fresh,
    single-threaded server process imports torch once and forks the ranks from it — as safe as
    spawn (nothing is inherited from this process's threads) and several seconds faster, since
    the ranks do not each import torch."""
    if not callable(fn):
        raise InputError(f"fn: expected a callable, got {type(fn).__name__} {shown(fn, 40)}")
    world_size = check_int(world_size, "world_size", 1, INT64_MAX)
    check_type(args, "args", (tuple, list), "tuple")
    timeout_s = check_time_limit(timeout_s, "timeout_s")
    retries = check_int(retries, "retries", 0, INT64_MAX)
    check_choice(start_method, "start_method", ("forkserver", "spawn"))
    if start_method == "forkserver":
        mp.set_forkserver_preload(["torch", fn.__module__])
    for attempt in range(retries + 1):
        port = free_port()
        prev = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"  # children: no thread pools fighting over cores
        try:
            try:
                ctx = mp.start_processes(fn, args=(port,) + tuple(args), nprocs=world_size,
                                         join=False, start_method=start_method)
            except (OSError, ValueError):
                if start_method == "spawn":
                    raise
                start_method = "spawn"  # no forkserver here (platform, socket path): spawn
                ctx = mp.start_processes(fn, args=(port,) + tuple(args), nprocs=world_size,
                                         join=False, start_method=start_method)
        finally:
            if prev is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = prev
        deadline = time.monotonic() + timeout_s
        try:
            while not ctx.join(timeout=0.2):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{world_size} processes did not finish in {timeout_s:g} s")
            return
        except mp.ProcessRaisedException as exc:
            msg = str(exc)
            if attempt < retries and ("Address already in use" in msg or "EADDRINUSE" in msg):
                continue
            raise RuntimeError(f"a worker process failed: {msg.strip().splitlines()[-1]}") from None
        except mp.ProcessExitedException as exc:
            raise RuntimeError(f"a worker process died: {exc}") from None
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.terminate()
            for p in ctx.processes:
                p.join(5)
                if p.is_alive():
                    p.kill()
                    p.join(1)

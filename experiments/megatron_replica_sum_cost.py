"""CPU time of ``integrations.megatron.sum_replica_grads`` per replicated expert (gloo).

    python experiments/megatron_replica_sum_cost.py [--world 2] [--hidden 2048] [--ffn 1408]
                                                    [--replicated 1 2] [--reps 5]

``--world`` gloo processes on this machine, each an EP rank holding ``2 + replicated`` slots of
SwiGLU experts (fc1 ``[2·ffn, hidden]``, fc2 ``[hidden, ffn]``, fp32 ``.grad``, DeepSeek-V2-Lite
sizes by default); experts ``0 .. replicated-1`` have one copy on every rank. Prints, for each
count, the median wall time of one call on rank 0 (after one warm-up), per replicated expert, and
the bytes rank 0 sent. Loopback TCP: a lower bound on the exchange's cost only through what the
CPU copies and sums; NCCL on a GPU is what ``experiments/megatron_gpu_check.py`` times.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def worker(rank, world, init, args, out):
    import types

    import torch
    import torch.distributed as dist

    from routepack_opt.core.placement import Placement
    from routepack_opt.integrations import megatron as rp_mg

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    lines = []
    for n_rep in args.replicated:
        M = 2 + n_rep  # per rank: the n_rep replicated experts, then 2 of its own
        E = n_rep + 2 * world
        phy2log = [list(range(n_rep)) + [n_rep + 2 * q, n_rep + 2 * q + 1] for q in range(world)]
        pl = Placement(np.array([sum(phy2log, [])]), ep=world, num_experts=E)
        mods = []
        g = torch.Generator().manual_seed(rank)
        for _ in range(M):
            m = torch.nn.Module()
            m.fc1 = torch.nn.Parameter(torch.empty(2 * args.ffn, args.hidden))
            m.fc2 = torch.nn.Parameter(torch.empty(args.hidden, args.ffn))
            for p in m.parameters():
                p.grad = torch.randn(p.shape, generator=g)
            mods.append(m)
        experts = types.SimpleNamespace(local_experts=mods)
        times = []
        for i in range(args.reps + 1):
            dist.barrier()
            t0 = time.perf_counter()
            info = rp_mg.sum_replica_grads([experts], pl, ep_rank=rank)
            if i:
                times.append(time.perf_counter() - t0)
        ms = float(np.median(times)) * 1e3
        lines.append(f"world {world} hidden {args.hidden} ffn {args.ffn}: {n_rep} replicated expert(s): "
                     f"{ms:.1f} ms per call, {ms / n_rep:.1f} ms per replicated expert, "
                     f"{info['bytes_sent'] / 2**20:.1f} MiB sent by rank 0 (median of {args.reps})")
    if rank == 0:
        Path(out).write_text("\n".join(lines) + "\n")
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--ffn", type=int, default=1408)
    ap.add_argument("--replicated", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    if min(args.world, args.hidden, args.ffn, args.reps, *args.replicated) < 1:
        ap.error("every argument must be ≥ 1")
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        mp.spawn(worker, args=(args.world, str(Path(tmp) / "init"), args, str(out)), nprocs=args.world, join=True)
        print(out.read_text(), end="")


if __name__ == "__main__":
    main()

"""Per-call time of a verl rank's look-up of the driver's plan vs planning on the rank, and the
driver's per-step plan time.

    python experiments/verl_driver_lookup.py [--sizes 64 256 1024] [--ranks 4] [--calls 5]
                                             [-o experiments/results/verl_driver_lookup/verl_driver_lookup.md]

Setup: D ranks × B samples per rank (lengths lognormal(6.3, 0.8) clipped to 16..4,000 tokens,
seeded; right-padded ``input_ids`` + ``attention_mask``), ``max_token_len`` = 16,384, the
global batch one mini-batch. The driver: ``install_balance_batch``'s ``_balance_batch`` on a
``DataProto`` of D·B samples with default settings (``DEFAULT_TIME_LIMIT["verl_balance"]``), which
writes the plan columns; its time is the wall clock of the call. A rank: rank 0's chunk (what
verl's dispatch gives it), called as verl's engine calls ``rearrange_micro_batches`` with default
settings, (a) with the plan columns (look-up, record source ``driver``) and (b) without them
(planning on the rank, as before); verl 0.9.1's own function for reference. Per call: wall clock
(median and max of ``--calls``, interleaved in alternating order, on a copy of the chunk as
the dispatch delivers it, after one warm-up call that compiles numba's kernels) and the record's ``planning_s`` (the call up to the micro-batches, without the record's
comparison with verl's count, ``compare=True`` by default). Predicted: the rank's micro-batches
by the one evaluator (dp = 1, length-only: on one rank the count decides it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _lib import report  # noqa: E402

from routepack_opt.integrations._seam import DEFAULT_TIME_LIMIT  # noqa: E402

CAP = 16384


def lengths(n: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(x) for x in np.clip(rng.lognormal(6.3, 0.8, n), 16, 4000)]


def verl_batch(lens):
    import torch
    from tensordict import TensorDict

    B, S = len(lens), int(max(lens))
    mask = (torch.arange(S)[None, :] < torch.as_tensor(lens)[:, None]).to(torch.int64)
    return TensorDict({"input_ids": mask.clone(), "attention_mask": mask}, batch_size=[B])


class _Trainer:
    """What ``RayPPOTrainer._balance_batch`` reads from the trainer."""

    actor_rollout_wg = None
    use_prefix_grouper = False

    def __init__(self, dp_size: int):
        from omegaconf import OmegaConf

        self.config = OmegaConf.create({"actor_rollout_ref": {"actor": {"ppo_mini_batch_size": None}}})
        self.dp_size = dp_size

    def _get_dp_size(self, wg, role):
        return self.dp_size

    def _balance_batch(self, batch, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
        raise AssertionError("verl's own _balance_batch ran")


def bench(B: int, D: int, calls: int, seed: int) -> dict:
    from verl import DataProto
    from verl.utils import seqlen_balancing as vsb

    from routepack_opt.integrations import verl as rp_verl

    N = B * D
    cls = type("T", (_Trainer,), {})
    rp_verl.install_balance_batch(cls, max_token_len=CAP, mini_batch_size=N)
    driver_s, lookup_s, plan_s, verl_s = [], [], [], []
    lookup_plan_s, plan_plan_s, recs_l, recs_p = [], [], [], []
    for c in range(calls + 1):  # call 0: warm-up
        lens = lengths(N, seed + c)
        data = DataProto.from_dict(tensors=dict(verl_batch(lens).items()))
        t0 = time.perf_counter()
        cls(D)._balance_batch(data, {})
        t_driver = time.perf_counter() - t0
        chunk = data.batch[:B].clone()  # what the dispatch sends rank 0: its own memory
        bare = chunk.clone()
        for key in rp_verl.PLAN_COLUMNS:
            del bare[key]
        timed = {}
        for name in (("lookup", "plan") if c % 2 else ("plan", "lookup")):  # alternate the order
            t0 = time.perf_counter()
            rp_verl.rearrange_micro_batches(chunk if name == "lookup" else bare, CAP)
            timed[name] = (time.perf_counter() - t0, rp_verl.last_record())
        (t_lookup, rec_l), (t_plan, rec_p) = timed["lookup"], timed["plan"]
        t0 = time.perf_counter()
        vsb.rearrange_micro_batches(bare, CAP)
        t_verl = time.perf_counter() - t0
        assert rec_l.source == "driver" and rec_p.source == "plan", (rec_l, rec_p)
        if c == 0:
            continue
        driver_s.append(t_driver)
        lookup_s.append(t_lookup)
        plan_s.append(t_plan)
        verl_s.append(t_verl)
        lookup_plan_s.append(rec_l.planning_s)
        plan_plan_s.append(rec_p.planning_s)
        recs_l.append(rec_l)
        recs_p.append(rec_p)
    med = statistics.median
    return {"B per rank": B, "ranks": D, "driver plan ms": 1e3 * med(driver_s), "driver max ms": 1e3 * max(driver_s),
            "look-up ms": 1e3 * med(lookup_s), "look-up max ms": 1e3 * max(lookup_s),
            "look-up planning_s ms": 1e3 * med(lookup_plan_s),
            "plan ms": 1e3 * med(plan_s), "plan max ms": 1e3 * max(plan_s),
            "plan planning_s ms": 1e3 * med(plan_plan_s), "verl ms": 1e3 * med(verl_s),
            "rows driver": med(r.rows for r in recs_l), "rows plan": med(r.rows for r in recs_p),
            "predicted driver ms": med(r.predicted_us for r in recs_l) / 1e3,
            "predicted plan ms": med(r.predicted_us for r in recs_p) / 1e3}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-o", "--out", default=str(ROOT / "experiments/results/verl_driver_lookup/verl_driver_lookup.md"))
    a = ap.parse_args(argv)
    rows = []
    for B in a.sizes:
        rows.append(bench(B, a.ranks, a.calls, a.seed))
        print(rows[-1], file=sys.stderr, flush=True)
    cols = list(rows[0])
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    text = ("# verl: a rank's look-up of the driver's plan vs planning on the rank\n\n"
            f"`{' '.join(['python', 'experiments/verl_driver_lookup.py'] + (argv or sys.argv[1:]))}`, "
            f"{time.strftime('%Y-%m-%d', time.gmtime())}, load average {load:.1f} at the end on "
            f"{os.cpu_count()} cores (shared machine: absolute times vary; rows are interleaved call by call). "
            f"Driver default time limit {DEFAULT_TIME_LIMIT['verl_balance']} s, rank {DEFAULT_TIME_LIMIT['verl']} s.\n\n"
            + (__doc__ or "").split("\n\n", 1)[1] + "\n"
            + "\n".join(report.table(cols, [[r[c] for c in cols] for r in rows],
                                      {c: ".1f" for c in cols if "ms" in c or c.startswith("rows")})) + "\n")
    report.write_text(Path(a.out), text)
    print(text)


if __name__ == "__main__":
    main()

"""Per-call planning time of the trainer seams with default settings, ours vs each framework's own.

    python experiments/seam_latency.py [--sizes 64 256 1024] [--calls 5] [--slime-src DIR]
                                       [-o experiments/results/seam_latency/seam_latency.md]

- verl: one rank's batch of B samples (lengths lognormal(6.3, 0.8) clipped to 16..4,000 tokens,
  mean about 750, seeded; right-padded ``input_ids`` + ``attention_mask``), ``max_token_len`` =
  16,384 (the ``qwen3-30b-a3b`` preset's capacity).
  verl 0.9.1's ``rearrange_micro_batches`` vs ours with default settings (no keyword: cost,
  objective and time limit from ``ROUTEPACK_*`` or the defaults), each called as verl's engine
  calls it. Time per call: wall clock around the call (median of ``--calls``, after one warm-up
  call that compiles or loads numba's kernels).
- slime: one step of B samples (the same lengths) on dp_size = 8 (dynamic batch,
  ``max_tokens_per_gpu`` = 16,384). slime's own ``build_dp_schedule`` (with ``--slime-src``, a
  checkout of THUDM/slime; else the reproduction of its layout that RoutePack's record scores, timed inside the call)
  vs ours with default settings.

Predicted saving: from the seam's record (one evaluator, in the cost preset's µs; ours vs the
framework's own layout of the same input, for verl verl's count on the rank's lengths), and net of
the planning time: both seams are called synchronously today (verl on every rank, slime's
``RolloutManager`` before the step), so planning is on the critical path. slime's default time
limit is a tenth of its own layout's predicted step (here 11-139 ms), the column shows its cap.
Seams plan on one numba thread (``ROUTEPACK_THREADS``, default 1).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _lib import report  # noqa: E402

from routepack_opt.integrations._seam import DEFAULT_TIME_LIMIT  # noqa: E402

PRESET = "qwen3-30b-a3b"
CAP = 16384


def lengths(B: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(x) for x in np.clip(rng.lognormal(6.3, 0.8, B), 16, 4000)]


def verl_batch(lens):
    import torch
    from tensordict import TensorDict

    B, S = len(lens), int(max(lens))
    mask = (torch.arange(S)[None, :] < torch.as_tensor(lens)[:, None]).to(torch.int64)
    return TensorDict({"input_ids": mask.clone(), "attention_mask": mask}, batch_size=[B])


def bench_verl(B: int, calls: int, seed: int) -> dict:
    from verl.utils import seqlen_balancing as vsb

    from routepack_opt.integrations import verl as rp_verl

    lens = lengths(B, seed)
    batch = verl_batch(lens)
    rp_verl.rearrange_micro_batches(batch, CAP)  # warm-up: numba kernels
    ours, theirs, recs = [], [], []
    for _ in range(calls):
        t0 = time.perf_counter()
        vsb.rearrange_micro_batches(batch, CAP)
        theirs.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        rp_verl.rearrange_micro_batches(batch, CAP)
        ours.append(time.perf_counter() - t0)
        recs.append(rp_verl.last_record())
    return _row("verl", B, ours, theirs, recs)


def bench_slime(B: int, calls: int, seed: int, slime_fn) -> dict:
    from routepack_opt.integrations import slime as rp_slime

    lens = lengths(B, seed)
    args = SimpleNamespace(micro_batch_size=1, use_dynamic_batch_size=True, max_tokens_per_gpu=CAP,
                           balance_data=False, balance_by_flops=False)
    tp = {"dp_size": 8, "cp_size": 1, "vpp_size": 1, "microbatch_group_size_per_vp_stage": 1}
    kw = dict(global_batch_size=B, rollout_indices=list(range(B)))
    rp_slime.build_dp_schedule(args, tp, lens, **kw)  # warm-up
    ours, theirs, recs = [], [], []
    for _ in range(calls):
        if slime_fn is not None:
            t0 = time.perf_counter()
            slime_fn(args, tp, lens, **kw)
            theirs.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        rp_slime.build_dp_schedule(args, tp, lens, **kw)
        ours.append(time.perf_counter() - t0)
        (rec,) = rp_slime.last_records()
        recs.append(rec)
        if slime_fn is None:
            theirs.append(rec.theirs_s)
    row = _row("slime", B, ours, theirs, recs)
    row["theirs from"] = "slime" if slime_fn is not None else "reproduction"
    return row


def _row(seam, B, ours, theirs, recs) -> dict:
    med = statistics.median
    return {"seam": seam, "B": B, "time limit s": DEFAULT_TIME_LIMIT[seam],
            "ours ms": 1e3 * med(ours), "ours max ms": 1e3 * max(ours), "theirs ms": 1e3 * med(theirs),
            "rows": recs[-1].rows, "rows theirs": recs[-1].rows_theirs,
            "predicted ms": med(r.predicted_us for r in recs) / 1e3,
            "predicted theirs ms": med(r.predicted_us_theirs for r in recs) / 1e3,
            "saving ms": med(r.saving_us for r in recs) / 1e3,
            "net saving ms": med((r.saving_us - 1e6 * r.planning_s) for r in recs) / 1e3,
            "fallbacks": sum(r.fallback is not None for r in recs)}


def load_slime(src: str | None):
    if src is None:
        return None
    sys.path.insert(0, src)
    from slime.utils.dp_schedule import build_dp_schedule

    return build_dp_schedule


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--slime-src", default=None)
    ap.add_argument("-o", "--out", default=str(ROOT / "experiments/results/seam_latency/seam_latency.md"))
    a = ap.parse_args(argv)
    slime_fn = load_slime(a.slime_src)
    rows = []
    for B in a.sizes:
        rows.append(bench_verl(B, a.calls, a.seed))
        print(rows[-1], file=sys.stderr)
        rows.append(bench_slime(B, a.calls, a.seed, slime_fn))
        print(rows[-1], file=sys.stderr)
    cols = list(rows[0]) + ["theirs from"]
    for r in rows:
        r.setdefault("theirs from", "verl")
    text = ("# Seam latency with default settings\n\n" + (__doc__ or "").split("\n\n", 1)[1] + "\n"
            + "\n".join(report.table(cols, [[r[c] for c in cols] for r in rows],
                                      {c: ".1f" for c in cols if "ms" in c})) + "\n")
    report.write_text(Path(a.out), text)
    print(text)


if __name__ == "__main__":
    main()

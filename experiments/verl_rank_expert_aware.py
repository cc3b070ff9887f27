"""Would expert-aware packing on a verl rank, alone, help? Group step predicted by one evaluator.

    python experiments/verl_rank_expert_aware.py [--windows 10] [--ranks 8] [--ep 8] [--per-rank 32]
        [--time-limit 2.0] [-o experiments/results/verl_rank_expert_aware/verl_rank_expert_aware.md]

A verl rank packs only its own samples; its expert time in micro-batch r is the busiest EP rank's
tokens summed over the EP group's micro-batches r (docs/model.md, ``W[r,g,l,p]``), which it does
not see. Windows: ``routepack_opt.trace.generate_window("qwen3-30b-a3b", N = ranks × per-rank,
seed)`` (calibrated lengths, expert skew and routing dispersion; L = 48, E = 128, top-8), cap =
the preset's 16,384 tokens, D = ``--ranks`` DP ranks, P = ``--ep`` EP ranks, equal samples per
rank (verl's dispatch). One LPT expert placement (the window's loads, what
``expert_map_from_batch`` gives every rank) for all three layouts:

- **length-only per rank** (today without the driver's plan): the driver's length-only balance
  (``balance_batch_partitions`` without routes) cuts the ranks' chunks; each rank packs its chunk
  with the drop-in's rule (certified count, agreed as MAX over the ranks, the best length-only
  baseline at that count: ``rearrange_micro_batches`` itself on a ``TensorDict``);
- **expert-aware per rank, alone**: the same chunks and count; each rank then improves its
  packing for the joint cost it can see, its own tokens only: ``Σ_r [α·T + β·Q + γ·Σ_l max_p
  W_own[r,l,p]]`` under the cap, by first-improvement moves and swaps of its samples between its
  micro-batches (``--moves`` proposals per rank; RoutePack has no rank-alone expert-aware packer
  to call, so this search lives here; its own objective is reported to show it did its work);
- **driver joint plan**: ``plan_cells`` on the whole window with routes (equal samples per rank,
  ``--time-limit`` s), what the look-up returns to the ranks.

Score: ``Evaluator(window, Topology(dp=D, ep=P, capacity=16384), cost).score_layout`` (max-sum),
the predicted step of the group. Reported per window and as median and range of the ratios.
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

from routepack_opt.core.cost import get_preset  # noqa: E402
from routepack_opt.core.evaluate import Evaluator  # noqa: E402
from routepack_opt.core.layout import Layout  # noqa: E402
from routepack_opt.core.topology import Topology  # noqa: E402
from routepack_opt.heuristics.placement.lpt import lpt_placement, swap_refine  # noqa: E402
from routepack_opt.integrations._common import plan_cells  # noqa: E402
from routepack_opt.trace import generate_window  # noqa: E402

PRESET = "qwen3-30b-a3b"


def length_only_chunks(lens, D: int, cap: int) -> list[list[int]]:
    """The driver's length-only balance: rank d's samples."""
    import torch
    from tensordict import TensorDict

    from routepack_opt.integrations import verl as rp_verl

    S = int(max(lens))
    mask = (torch.arange(S)[None, :] < torch.as_tensor(lens)[:, None]).to(torch.int64)
    gb = rp_verl.balance_batch_partitions(TensorDict({"attention_mask": mask}, batch_size=[len(lens)]), D,
                                          max_token_len=cap, cost=PRESET, time_limit=1.0)
    return [list(p) for p in gb.partitions]


def rank_packings(lens, chunks, cap: int) -> tuple[int, list[list[list[int]]]]:
    """Each rank's packing by the drop-in, at the count the ranks agree on (MAX)."""
    import torch
    from tensordict import TensorDict

    from routepack_opt.integrations import verl as rp_verl

    def batch(ids):
        ln = [lens[i] for i in ids]
        mask = (torch.arange(max(ln))[None, :] < torch.as_tensor(ln)[:, None]).to(torch.int64)
        return TensorDict({"attention_mask": mask}, batch_size=[len(ids)])

    rows = max(len(rp_verl.rearrange_micro_batches(batch(c), cap, compare=False)[1]) for c in chunks)
    out = []
    for c in chunks:
        parts = rp_verl.rearrange_micro_batches(batch(c), cap, min_num_micro_batch=rows, compare=False)[1]
        out.append([[c[i] for i in p] for p in parts])
    return rows, out


def own_search(mbs, lens_N, b_NLP, cost, cap: int, moves: int, rng) -> tuple[list[list[int]], float, float]:
    """A rank alone: first-improvement moves/swaps between its micro-batches on its own joint cost
    (attention + γ·Σ_l max_p of its own tokens + row overhead), under the cap. Returns (packing,
    own cost before, after)."""
    alpha = sum(s.alpha for s in cost.stages)
    beta = sum(s.beta for s in cost.stages)
    R = len(mbs)
    mbs = [list(m) for m in mbs]
    T = np.array([lens_N[m].sum() for m in mbs], dtype=np.float64)
    Q = np.array([(lens_N[m].astype(np.float64) ** 2).sum() for m in mbs])
    W = np.stack([b_NLP[m].sum(axis=0) for m in mbs]).astype(np.float64)  # [R, L, P]

    def row_cost(t, q, w_LP):
        return alpha * t + beta * q + cost.gamma * w_LP.max(axis=1).sum()

    J = np.array([row_cost(T[r], Q[r], W[r]) for r in range(R)])
    before = float(J.sum())
    for _ in range(moves):
        r1, r2 = rng.choice(R, 2, replace=False)
        i = mbs[r1][rng.integers(len(mbs[r1]))]
        swap = len(mbs[r1]) == 1 or rng.random() < 0.5
        j = mbs[r2][rng.integers(len(mbs[r2]))] if swap else None
        dl = lens_N[i] - (lens_N[j] if swap else 0)
        dq = float(lens_N[i]) ** 2 - (float(lens_N[j]) ** 2 if swap else 0.0)
        dw = b_NLP[i] - (b_NLP[j] if swap else 0)
        if T[r2] + dl > cap or T[r1] - dl > cap:  # a swap may grow either micro-batch
            continue
        n1 = row_cost(T[r1] - dl, Q[r1] - dq, W[r1] - dw)
        n2 = row_cost(T[r2] + dl, Q[r2] + dq, W[r2] + dw)
        if n1 + n2 < J[r1] + J[r2] - 1e-9:
            T[r1] -= dl
            T[r2] += dl
            Q[r1] -= dq
            Q[r2] += dq
            W[r1] -= dw
            W[r2] += dw
            J[r1], J[r2] = n1, n2
            mbs[r1].remove(i)
            mbs[r2].append(i)
            if swap:
                mbs[r2].remove(j)
                mbs[r1].append(j)
    return mbs, before, float(J.sum())


def layout_of(packings, N: int) -> Layout:
    row = np.empty(N, dtype=np.int64)
    slot = np.empty(N, dtype=np.int64)
    for d, mbs in enumerate(packings):
        for r, mb in enumerate(mbs):
            row[mb], slot[mb] = r, d
    return Layout(row, slot, len(packings[0]))


def one_window(seed: int, D: int, P: int, per_rank: int, time_limit: float, moves: int) -> dict:
    cost = get_preset(PRESET).cost
    w = generate_window(PRESET, num_samples=D * per_rank, seed=seed)
    cap = int(get_preset(PRESET).config.capacity)
    topo = Topology(dp=D, ep=P, capacity=cap, equal_samples_per_slot=True)
    ev = Evaluator(w, topo, cost)
    load = w.expert_loads()
    pl = swap_refine(load, lpt_placement(load, P), P)
    lens_N = w.lengths.astype(np.int64)
    chunks = length_only_chunks(lens_N.tolist(), D, cap)
    rows, lo = rank_packings(lens_N.tolist(), chunks, cap)
    b_NLP = ev.rank_loads(pl)
    rng = np.random.default_rng(seed)
    ea, gain = [], []
    for mbs in lo:
        new, before, after = own_search(mbs, lens_N, b_NLP, cost, cap, moves, rng)
        ea.append(new)
        gain.append(1 - after / before)
    joint = plan_cells(w, topo, cost, placement=pl, time_limit=time_limit, seed=0).plan
    lo_ms = ev.score_layout(pl, layout_of(lo, w.num_samples), "max-sum").makespan / 1e3
    ea_ms = ev.score_layout(pl, layout_of(ea, w.num_samples), "max-sum").makespan / 1e3
    jo_ms = ev.score_layout(pl, Layout(joint.row, joint.slot, joint.rows), "max-sum").makespan / 1e3
    return {"window": seed, "rows per rank": rows, "rows joint": int(joint.rows),
            "length-only ms": lo_ms, "rank expert-aware ms": ea_ms, "driver joint ms": jo_ms,
            "rank-aware / length-only": ea_ms / lo_ms - 1, "joint / length-only": jo_ms / lo_ms - 1,
            "own-cost gain (median rank)": statistics.median(gain)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--windows", type=int, default=10)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--ep", type=int, default=8)
    ap.add_argument("--per-rank", type=int, default=32)
    ap.add_argument("--time-limit", type=float, default=2.0)
    ap.add_argument("--moves", type=int, default=4000)
    ap.add_argument("-o", "--out",
                    default=str(ROOT / "experiments/results/verl_rank_expert_aware/verl_rank_expert_aware.md"))
    a = ap.parse_args(argv)
    rows = []
    for s in range(a.windows):
        rows.append(one_window(s, a.ranks, a.ep, a.per_rank, a.time_limit, a.moves))
        print(rows[-1], file=sys.stderr, flush=True)
    cols = list(rows[0])
    pct = report.pct
    fm = {c: ".1f" for c in cols if c.endswith("ms")}
    fm.update({c: pct for c in cols if "/" in c or "gain" in c})

    def summary(key):
        xs = [r[key] for r in rows]
        return [key, statistics.median(xs), min(xs), max(xs)]

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    text = ("# verl: expert-aware packing on a rank alone vs length-only vs the driver's joint plan\n\n"
            f"`{' '.join(['python', 'experiments/verl_rank_expert_aware.py'] + (argv or sys.argv[1:]))}`, "
            f"{time.strftime('%Y-%m-%d', time.gmtime())}, load average {load:.1f}.\n\n"
            + (__doc__ or "").split("\n\n", 1)[1] + "\n"
            + "\n".join(report.table(["relative to length-only per rank", "median", "min", "max"],
                                      [summary("rank-aware / length-only"), summary("joint / length-only"),
                                       summary("own-cost gain (median rank)")],
                                      {1: pct, 2: pct, 3: pct})) + "\n\n"
            + "\n".join(report.table(cols, [[r[c] for c in cols] for r in rows], fm)) + "\n")
    report.write_text(Path(a.out), text)
    print(text)


if __name__ == "__main__":
    main()

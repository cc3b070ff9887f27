"""A toy RL training loop with RoutePack in it (CPU, seconds on an idle machine).

    python experiments/train_loop_example.py [--steps 3] [--samples 32]

What a trainer does each optimizer step t, in the order the paper's integration (Fig. 6) has it:

1. the rollout of step t+1 finishes with its routing replay (here: ``generate_window`` of a tiny
   model shape, drifting routing) — ``AsyncPlanner.submit`` starts planning it in a background
   thread while step t trains;
2. step t trains on its plan: per DP rank, ``build_microbatches`` packs the plan's cells into
   varlen micro-batches (one per row) with the replayed routes; the DP ranks run here one after
   another with gradient accumulation (``loss_sum`` / tokens), then ``optimizer.step()``;
3. at the step boundary ``AsyncPlanner.result()`` returns the next plan (or, past its deadline,
   a valid length-only fallback; a submit never fails because the previous window is still
   being planned — that one is cancelled) and ``materialize`` moves every re-placed expert's weights,
   gradients and Adam state into its new slot and switches the logical→physical dispatch.

The first window is planned synchronously with ``plan_micro_batches``. The loop also checks the
contract that makes re-placement safe: one step's loss is computed twice, under the current and
under the identity placement, and must be identical (float32 on CPU).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch

from routepack_opt import AsyncPlanner, plan_micro_batches
from routepack_opt.runtime.batches import build_microbatches, routes_from_counts, synthetic_tokens
from routepack_opt.runtime.materialize import materialize
from routepack_opt.runtime.model import TinyMoE, TinyMoEConfig
from routepack_opt.trace import generate_window

MODEL = TinyMoEConfig(vocab=64, hidden=32, heads=2, num_layers=2, num_experts=8, top_k=2, ffn=32)
DP, EP, CAP = 2, 2, 256  # 2 DP slots (one EDP shard of 2 EP ranks), 256-token micro-batches


def rollout(step: int, samples: int, seed: int = 0):
    """The window of optimizer step ``step`` (stand-in for rollout + routing replay)."""
    return generate_window("olmoe-1b-7b", samples, seed, step=step, num_layers=MODEL.num_layers,
                           num_experts=MODEL.num_experts, top_k=MODEL.top_k, capacity=CAP,
                           drift=0.2, group_size_min=4, group_size_max=8)


def plan_kwargs(sweeps: int) -> dict:
    return dict(dp_size=DP, ep_size=EP, max_tokens=CAP, cost="olmoe-1b-7b", objective="max-sum",
                max_sweeps=sweeps, seed=0)


def train_step(model, opt, window, mb_plan, tokens_T) -> float:
    """One optimizer step over the plan's R rows × D slots (gradient accumulation)."""
    routes = routes_from_counts(window, seed=0)
    denom = float((window.lengths - 1).sum())
    batches = [build_microbatches(mb_plan.plan, window, d, tokens_T, routes) for d in range(DP)]
    total = 0.0
    opt.zero_grad(set_to_none=True)
    for r in range(mb_plan.num_micro_batches):  # row by row, as the DP slots would run them
        for d in range(DP):
            loss = model.loss_sum(batches[d].microbatches[r]) / denom
            loss.backward()
            total += float(loss.detach())
    opt.step()
    return total


@torch.no_grad()
def loss_under(model, window, mb_plan, tokens_T) -> float:
    routes = routes_from_counts(window, seed=0)
    denom = float((window.lengths - 1).sum())
    return sum(float(model.loss_sum(mb) / denom) for d in range(DP)
               for mb in build_microbatches(mb_plan.plan, window, d, tokens_T, routes).microbatches)


def run(steps: int = 3, samples: int = 32, sweeps: int = 5, deadline: float = 5.0, verbose: bool = True) -> dict:
    torch.manual_seed(0)
    # one intra-op thread: the planner's thread needs the other core, and spinning torch
    # workers next to a busy numba thread stall both on a small machine
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run(steps, samples, sweeps, deadline, verbose)
    finally:
        torch.set_num_threads(threads)


def _run(steps, samples, sweeps, deadline, verbose) -> dict:
    model = TinyMoE(MODEL)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    window = rollout(0, samples)
    mb = plan_micro_batches(window.lengths, window.counts, **plan_kwargs(sweeps))
    materialize(model.moe_layers, mb.logical_to_physical, opt)
    planner = AsyncPlanner(grace=1.0)  # starts the numba warm-up in the background
    log = []
    for t in range(steps):
        nxt = rollout(t + 1, samples)
        planner.submit(nxt.lengths, nxt.counts, deadline=deadline, **plan_kwargs(sweeps))  # overlaps step t
        tokens = synthetic_tokens(window, MODEL.vocab, seed=t)
        if t == 0:  # re-placement must not change the math: same loss under identity placement
            before = loss_under(model, window, mb, tokens)
            keep = mb.logical_to_physical.copy()
            materialize(model.moe_layers, np.tile(np.arange(MODEL.num_experts), (MODEL.num_layers, 1)), opt)
            ident = loss_under(model, window, mb, tokens)
            materialize(model.moe_layers, keep, opt)
            if before != ident:
                raise AssertionError(f"loss changed under re-placement: {before!r} vs {ident!r}")
        t0 = time.perf_counter()
        loss = train_step(model, opt, window, mb, tokens)
        t_train = time.perf_counter() - t0
        t0 = time.perf_counter()
        new = planner.result()  # step boundary: the next plan
        wait = time.perf_counter() - t0
        move = materialize(model.moe_layers, new.logical_to_physical, opt)
        rep = mb.report
        entry = {"step": t, "loss": loss, "micro_batches": mb.num_micro_batches,
                 # a quick fallback (no plan by the deadline, e.g. kernels still compiling) has no score
                 "makespan_us": rep.get("makespan_max_sum", float("nan")), "gap": rep.get("gap", float("nan")),
                 "fallback": "fallback" in new.report, "experts_moved": move.experts_moved,
                 "train_s": t_train, "wait_for_plan_s": wait}
        log.append(entry)
        if verbose:
            print(f"step {t}: loss {loss:.5f}, {mb.num_micro_batches} micro-batches/rank, predicted "
                  f"{entry['makespan_us'] / 1e3:.2f} ms (gap {entry['gap']:.3f}), trained in {t_train:.2f} s, "
                  f"waited {wait:.2f} s for the next plan, moved {move.experts_moved} experts"
                  + (" [fallback plan]" if entry["fallback"] else ""), flush=True)
        window, mb = nxt, new
    planner.result()  # the last submitted plan (step `steps`): let its thread finish
    planner.close()
    return {"log": log, "replacement_loss_identical": True}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--sweeps", type=int, default=5)
    a = ap.parse_args(argv)
    run(a.steps, a.samples, a.sweeps)
    return 0


if __name__ == "__main__":
    sys.exit(main())

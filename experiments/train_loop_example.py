"""A toy RL training loop with RoutePack in it (CPU, seconds on an idle machine).

    python experiments/train_loop_example.py [--steps 3] [--samples 32] [--redundant-experts N]

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

With ``--redundant-experts N`` the plans replicate hot experts (``plan.replicas``, a
``Placement`` with E + N slots per layer): the model holds E + N slots, DP slot d dispatches as
source rank d mod EP (the even-local rule the planner scored), every expert's replica partial
gradients are summed before ``optimizer.step()`` (``runtime.replicas.sum_replica_grads``), and
``materialize`` migrates each step's replica set. The loss check then compares the current
placement with its slots shuffled (same replica counts: bitwise the same computation).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch

from routepack_opt import AsyncPlanner, plan_micro_batches
from routepack_opt.core.placement import Placement
from routepack_opt.runtime.batches import build_microbatches, routes_from_counts, synthetic_tokens
from routepack_opt.runtime.materialize import materialize
from routepack_opt.runtime.model import TinyMoE, TinyMoEConfig
from routepack_opt.runtime.replicas import sum_replica_grads
from routepack_opt.trace import generate_window

MODEL = TinyMoEConfig(vocab=64, hidden=32, heads=2, num_layers=2, num_experts=8, top_k=2, ffn=32)
DP, EP, CAP = 2, 2, 256  # 2 DP slots (one EDP shard of 2 EP ranks), 256-token micro-batches


def rollout(step: int, samples: int, seed: int = 0):
    """The window of optimizer step ``step`` (stand-in for rollout + routing replay)."""
    return generate_window("olmoe-1b-7b", samples, seed, step=step, num_layers=MODEL.num_layers,
                           num_experts=MODEL.num_experts, top_k=MODEL.top_k, capacity=CAP,
                           drift=0.2, group_size_min=4, group_size_max=8)


def plan_kwargs(sweeps: int, redundant: int = 0) -> dict:
    return dict(dp_size=DP, ep_size=EP, max_tokens=CAP, cost="olmoe-1b-7b", objective="max-sum",
                max_sweeps=sweeps, seed=0, redundant_experts=redundant)


def placement_of(mb_plan):
    """What ``materialize`` takes from a plan: the replicated Placement, or π[l, e]."""
    reps = getattr(mb_plan.plan, "replicas", None)
    return reps if reps is not None else mb_plan.logical_to_physical


def set_source(model, d: int) -> None:
    """DP slot d dispatches as EP rank d mod EP (the even-local rule's q)."""
    for m in model.moe_layers:
        m.source_rank = d % EP


def train_step(model, opt, window, mb_plan, tokens_T) -> float:
    """One optimizer step over the plan's R rows × D slots (gradient accumulation)."""
    routes = routes_from_counts(window, seed=0)
    denom = float((window.lengths - 1).sum())
    batches = [build_microbatches(mb_plan.plan, window, d, tokens_T, routes) for d in range(DP)]
    total = 0.0
    opt.zero_grad(set_to_none=True)
    for r in range(mb_plan.num_micro_batches):  # row by row, as the DP slots would run them
        for d in range(DP):
            set_source(model, d)
            loss = model.loss_sum(batches[d].microbatches[r]) / denom
            loss.backward()
            total += float(loss.detach())
    sum_replica_grads(model.moe_layers)  # replicas: every copy gets its expert's whole gradient
    opt.step()
    return total


@torch.no_grad()
def loss_under(model, window, mb_plan, tokens_T) -> float:
    routes = routes_from_counts(window, seed=0)
    denom = float((window.lengths - 1).sum())
    total = 0.0
    for d in range(DP):
        set_source(model, d)
        for mb in build_microbatches(mb_plan.plan, window, d, tokens_T, routes).microbatches:
            total += float(model.loss_sum(mb) / denom)
    return total


def run(steps: int = 3, samples: int = 32, sweeps: int = 5, deadline: float = 5.0, verbose: bool = True,
        redundant: int = 0) -> dict:
    torch.manual_seed(0)
    # one intra-op thread: the planner's thread needs the other core, and spinning torch
    # workers next to a busy numba thread stall both on a small machine
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run(steps, samples, sweeps, deadline, verbose, redundant)
    finally:
        torch.set_num_threads(threads)


def _run(steps, samples, sweeps, deadline, verbose, redundant=0) -> dict:
    L, E = MODEL.num_layers, MODEL.num_experts
    model = TinyMoE(MODEL, phy2log_LS=Placement.identity(L, E, EP, redundant).phy2log if redundant else None)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    window = rollout(0, samples)
    mb = plan_micro_batches(window.lengths, window.counts, **plan_kwargs(sweeps, redundant))
    materialize(model.moe_layers, placement_of(mb), opt)
    planner = AsyncPlanner(grace=1.0)  # starts the numba warm-up in the background
    log = []
    for t in range(steps):
        nxt = rollout(t + 1, samples)
        planner.submit(nxt.lengths, nxt.counts, deadline=deadline, **plan_kwargs(sweeps, redundant))  # overlaps t
        tokens = synthetic_tokens(window, MODEL.vocab, seed=t)
        if t == 0:  # re-placement must not change the math: same loss under identity placement
            before = loss_under(model, window, mb, tokens)
            keep = placement_of(mb)
            if redundant:  # the same replica counts on shuffled slots: bitwise the same computation
                perm = np.random.default_rng(t).permutation(keep.num_slots)
                other = Placement(keep.phy2log[:, perm], keep.ep, keep.num_experts)
            else:
                other = np.tile(np.arange(E), (L, 1))
            materialize(model.moe_layers, other, opt)
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
        move = materialize(model.moe_layers, placement_of(new), opt)
        rep = mb.report
        entry = {"step": t, "loss": loss, "micro_batches": mb.num_micro_batches,
                 # a quick fallback (no plan by the deadline, e.g. kernels still compiling) has no score
                 "makespan_us": rep.get("makespan_max_sum", float("nan")), "gap": rep.get("gap", float("nan")),
                 "fallback": "fallback" in new.report, "experts_moved": move.experts_moved,
                 "replicas_added": move.replicas_added,
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
    return {"log": log, "replacement_loss_identical": True,
            "slots_per_layer": model.moe_layers[0].num_slots,
            "replicated_experts": int(sum(int((m.logcnt_E > 1).sum()) for m in model.moe_layers))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--sweeps", type=int, default=5)
    ap.add_argument("--redundant-experts", type=int, default=0, metavar="N",
                    help="replicate hot experts into N extra slots per layer ((8 + N) %% 2 == 0)")
    a = ap.parse_args(argv)
    run(a.steps, a.samples, a.sweeps, redundant=a.redundant_experts)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Megatron-Core on a GPU: what the CPU tests cannot run. One prepared script for the day a GPU is lent.

    torchrun --nproc-per-node=NGPU experiments/megatron_gpu_check.py [--out DIR]     # NGPU = EP size

Needs CUDA, megatron-core (``pip install --no-deps megatron-core==0.16.1``), NCCL; Transformer
Engine is optional (used when importable). Every check runs in its own try block, prints one line
``CHECK name: PASS|FAIL|ERROR detail`` and all go to ``DIR/megatron_gpu_check.json`` (rank 0),
so a partial run still reports. Checks, with EP = world size and a real ``MoELayer``
(alltoall dispatcher, SequentialMLP, fp32, TP = PP = 1):

1. ``forward_identical``: output of ``MoELayer.forward`` with RoutePack's placement (experts
   migrated by ``migrate_experts`` over NCCL, ``route`` wrapped by ``apply_expert_placement``)
   equals the output without it (max |diff| reported; fp32 tolerance 1e-5: the combine order
   of a token's k experts may differ).
2. ``grads_follow_experts``: the expert weight grads at slot s equal the baseline grads of
   logical expert ``physical_to_logical[s]``.
3. ``rank_split_matches_plan``: the tokens each EP rank receives (from the remapped routing map)
   equal RoutePack's predicted per-rank loads for these tokens, and the busiest rank is no
   busier than Megatron's contiguous layout.
4. ``distributed_optimizer_migration``: with Megatron's DistributedOptimizer (Adam, fp32 master
   weights) after one step, ``migrate_experts`` moves each expert's master weight,
   ``exp_avg`` and ``exp_avg_sq`` shards with it.
5. ``aux_loss_logical``: the router's aux loss is the same with and without the placement.
6. ``replicated``: a layer with S = E + P slots (one replica per rank: the hottest experts by the
   loads above, ``cli.verify_runtime.replica_check_placement``, the planner's) whose router is the E-expert layer's, its
   slots holding the logical experts' weights, ``apply_expert_placement`` with the replicated
   ``Placement`` and ``source_rank`` = EP rank: output equals the E-expert layer's (fp32, 1e-5);
   each logical expert's grad equals the sum of its replicas' partial grads (1e-4); the tokens
   each EP rank receives equal the even-local prediction (``core.placement.split_counts`` of each
   source rank's per-expert counts, summed by replica rank).
7. ``replica_grad_sum_step``: on that layer, ``integrations.megatron.sum_replica_grads`` over the
   EP group (NCCL): every copy of a replicated expert holds bitwise the same gradient, equal to
   the E-expert layer's grad of that expert (1e-4); after a torch Adam step on both layers every
   copy's weights and moments are bitwise equal and the weights equal the E-expert layer's (1e-5).
   Also reports the sum's time (CUDA-synchronized).
8. ``replica_grad_sum_megatron_ddp``: the same layout under Megatron's ``DistributedDataParallel``
   (all-reduce, no DistributedOptimizer, fp32 grad buffers) and Megatron's Adam: after
   ``finish_grad_sync``, ``sum_replica_grads`` on ``main_grad``, ``optimizer.step()``: every copy's
   ``main_grad`` and weights are bitwise equal.
9. ``distributed_optimizer_replica_migration``: an S-slot layer under Megatron's
   DistributedOptimizer after one step, ``migrate_experts`` from that replicated ``Placement`` to
   another (other replica counts): every slot that changes expert holds a bitwise copy (weights,
   fp32 master, ``exp_avg``, ``exp_avg_sq`` shards) of one of the old holders of its new expert.

    python experiments/megatron_gpu_check.py --dry-run [--world P]   # no GPU: arguments, imports,
                                                                   # the replicated placement, the
                                                                   # grad sum on one CPU process
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULTS: dict[str, dict] = {}


def check(name):
    def deco(fn):
        def run(*a, **k):
            try:
                ok, detail = fn(*a, **k)
                RESULTS[name] = {"status": "PASS" if ok else "FAIL", "detail": detail}
            except Exception as exc:  # report and go on with the next check
                RESULTS[name] = {"status": "ERROR", "detail": f"{exc.__class__.__name__}: {exc}",
                                 "traceback": traceback.format_exc()[-2000:]}
            if int(os.environ.get("RANK", "0")) == 0:
                print(f"CHECK {name}: {RESULTS[name]['status']} {RESULTS[name]['detail']}", flush=True)
        return run
    return deco


def build(E, topk, hidden, ffn, seed):
    import torch
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import TransformerConfig

    try:
        import transformer_engine  # noqa: F401
        use_te = True
    except ImportError:
        use_te = False
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed)
    cfg = TransformerConfig(num_layers=1, hidden_size=hidden, num_attention_heads=4, num_moe_experts=E,
                            moe_router_topk=topk, moe_token_dispatcher_type="alltoall",
                            moe_grouped_gemm=False, add_bias_linear=False, moe_ffn_hidden_size=ffn,
                            moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=1e-2,
                            params_dtype=torch.float32, bf16=False, fp16=False,
                            expert_model_parallel_size=int(os.environ.get("WORLD_SIZE", "1")))
    layer = build_module(get_moe_module_spec(use_te=use_te, num_experts=E, moe_grouped_gemm=False), config=cfg)
    return layer.cuda(), cfg


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "experiments/results/megatron_gpu_check")))
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--topk", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU: check the arguments, the imports, a replicated placement and the grad sum on CPU")
    ap.add_argument("--world", type=int, default=int(os.environ.get("WORLD_SIZE", "2")),
                    help="EP size the dry run plans for (the real run uses WORLD_SIZE)")
    args = ap.parse_args()
    if args.experts < 1 or args.topk < 1 or args.topk > args.experts or args.tokens < 1 or args.world < 1:
        ap.error("need 1 <= topk <= experts, tokens >= 1, world >= 1")
    if args.dry_run:
        dry_run(args)
        return

    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from routepack_opt.core.evaluate import rank_loads
    from routepack_opt.heuristics.placement.lpt import lpt_placement
    from routepack_opt.integrations import megatron as rp_mg

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl")
    ps.initialize_model_parallel(1, 1, expert_model_parallel_size=world)
    ep_group = ps.get_expert_model_parallel_group()
    E, k, H = args.experts, args.topk, 64
    M = E // world
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    layer, cfg = build(E, k, H, 128, seed=1234)
    g = torch.Generator(device="cuda").manual_seed(77 + rank)
    x = torch.randn(args.tokens, 1, H, device="cuda", generator=g)
    x[:, :, :4] += 2.0  # a skewed router input, so placement matters

    def run_layer():
        layer.zero_grad(set_to_none=True)
        xx = x.clone().requires_grad_(True)
        out, _ = layer(xx)
        out.float().pow(2).sum().backward()
        grads = [[p.grad.clone() for p in m.parameters()] for m in layer.experts.local_experts]
        return out.detach(), grads

    # Routing (logical) for the plan: one forward of the router only.
    with torch.no_grad():
        probs, rmap = layer.route(x.view(-1, H))
    counts_E = rmap.sum(0).to(torch.float64)
    dist.all_reduce(counts_E)  # global loads, same on every rank
    load_LE = counts_E.cpu().numpy()[None].astype(np.int64)
    l2p = lpt_placement(load_LE, world)
    p2l = np.argsort(l2p, axis=1)

    base_out, base_grads = run_layer()
    # all ranks' baseline grads by logical expert (ranks hold M experts each)
    flat = torch.cat([t.reshape(-1) for gs in base_grads for t in gs])
    allg = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(allg, flat)
    per_expert = torch.cat(allg).view(E, -1)

    slots = [rp_mg.expert_slot_tensors(layer.experts, include_grads=False)]
    moved = rp_mg.migrate_experts(slots, np.arange(E)[None], p2l, ep_rank=rank, ep_size=world, group=ep_group)
    handle = rp_mg.apply_expert_placement(layer, physical_to_logical=p2l[0])
    new_out, new_grads = run_layer()

    @check("forward_identical")
    def c1():
        d = float((new_out - base_out).abs().max())
        return d <= 1e-5, f"max|diff| = {d:.3g}, experts moved {moved['experts_moved']}"

    @check("grads_follow_experts")
    def c2():
        worst = 0.0
        for s in range(M):
            got = torch.cat([t.reshape(-1) for t in new_grads[s]])
            want = per_expert[int(p2l[0, rank * M + s])]
            worst = max(worst, float((got - want).abs().max()))
        return worst <= 1e-4, f"max|grad diff| = {worst:.3g}"

    @check("rank_split_matches_plan")
    def c3():
        with torch.no_grad():
            _, rmap_p = layer.route(x.view(-1, H))
        got = rp_mg.rank_token_counts(rmap_p.long(), world)
        dist.all_reduce(got)
        pred = rank_loads(load_LE[:, None, :], l2p, world)[0, 0]
        ident = load_LE[0].reshape(world, M).sum(1)
        ok = np.array_equal(got.cpu().numpy(), pred) and pred.max() <= ident.max()
        return ok, f"got {got.tolist()} predicted {pred.tolist()} contiguous {ident.tolist()}"

    @check("aux_loss_logical")
    def c5():
        # the router's own outputs in logical order are unchanged by the wrap
        handle.remove()
        with torch.no_grad():
            p0, m0 = layer.route(x.view(-1, H))
        rp_mg.apply_expert_placement(layer, physical_to_logical=p2l[0])
        with torch.no_grad():
            p1, m1 = layer.route(x.view(-1, H))
        inv = torch.as_tensor(np.argsort(p2l[0]), device=p1.device)
        return bool(torch.equal(p1[:, inv], p0) and torch.equal(m1[:, inv], m0)), "route() logical outputs unchanged"

    @check("distributed_optimizer_migration")
    def c4():
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        model, cfg2 = build(E, k, H, 128, seed=99)
        ddp = DistributedDataParallel(cfg2, DistributedDataParallelConfig(use_distributed_optimizer=True,
                                                                          grad_reduce_in_fp32=True), model)
        opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-3, use_distributed_optimizer=True,
                                                     bf16=False, fp16=False, params_dtype=torch.float32), [ddp])
        out, _ = ddp(x.clone())
        out.float().pow(2).sum().backward()
        ddp.finish_grad_sync()
        opt.step()
        chained = getattr(opt, "chained_optimizers", [opt])
        dopt = next(o for o in chained if any(p in getattr(o, "model_param_group_index_map", {})
                                              for p in model.experts.parameters()))
        snap = [[t.clone() for t in s] for s in rp_mg.expert_slot_tensors(model.experts, dopt, include_grads=False)]
        slots2 = [rp_mg.expert_slot_tensors(model.experts, dopt, include_grads=False)]
        rp_mg.migrate_experts(slots2, np.arange(E)[None], p2l, ep_rank=rank, ep_size=world, group=ep_group)
        # single-rank EP: slot s must now hold the snapshot of slot p2l[s]; multi-rank: compare on each
        # rank the same-rank moves and report the cross-rank count (checked via forward_identical above)
        ok, n = True, 0
        for s in range(M):
            src = int(p2l[0, rank * M + s])
            if src // M == rank:
                n += 1
                ok &= all(torch.equal(a, b) for a, b in zip(slots2[0][s], snap[src - rank * M]))
        keys = len(snap[0])
        return ok, f"{n} same-rank slots checked, {keys} tensors per expert (weights + master/exp_avg/exp_avg_sq shards)"

    shared: dict = {}

    @check("replicated")
    def c6():
        from routepack_opt.cli.verify_runtime import replica_check_placement as replica_placement
        from routepack_opt.core.placement import split_counts

        pl = replica_placement(load_LE.astype(np.float64), world, world)  # one extra slot per rank
        S = pl.num_slots
        S_loc = S // world
        base, _ = build(E, k, H, 128, seed=4321)
        rep, _ = build(S, k, H, 128, seed=4321)
        rep.router = base.router  # route over the E logical experts
        flat_w = torch.cat([torch.cat([p.detach().reshape(-1) for p in m.parameters()])
                            for m in base.experts.local_experts])
        all_w = [torch.empty_like(flat_w) for _ in range(world)]
        dist.all_gather(all_w, flat_w)
        W_E = torch.cat(all_w).view(E, -1)  # logical expert e's parameters, flat
        with torch.no_grad():
            for i, m in enumerate(rep.experts.local_experts):
                e, off = int(pl.phy2log[0, rank * S_loc + i]), 0
                for p in m.parameters():
                    p.copy_(W_E[e, off:off + p.numel()].view_as(p))
                    off += p.numel()
        h6 = rp_mg.apply_expert_placement(rep, pl, source_rank=rank, num_logical_experts=E)
        res = []
        for lay in (base, rep):
            lay.zero_grad(set_to_none=True)
            y, _ = lay(x.clone())
            y.float().pow(2).sum().backward()
            g = torch.cat([torch.cat([p.grad.reshape(-1) for p in m.parameters()]) for m in lay.experts.local_experts])
            all_g = [torch.empty_like(g) for _ in range(world)]
            dist.all_gather(all_g, g)
            res.append((y.detach(), torch.cat(all_g)))
        d_out = float((res[0][0] - res[1][0]).abs().max())
        g_E = res[0][1].view(E, -1)
        g_S = res[1][1].view(S, -1)
        summed = torch.zeros_like(g_E)
        summed.index_add_(0, torch.as_tensor(pl.phy2log[0], device=g_S.device), g_S)
        d_grad = float((summed - g_E).abs().max())
        with torch.no_grad():
            _, rmap_l = base.route(x.view(-1, H))
            _, rmap_s = rep.route(x.view(-1, H))
        got = rp_mg.rank_token_counts(rmap_s.long(), world)
        dist.all_reduce(got)
        c_E = rmap_l.sum(0).long()
        all_c = [torch.empty_like(c_E) for _ in range(world)]
        dist.all_gather(all_c, c_E)
        log2phy, cnt = pl.log2phy()[0], pl.logcnt[0]
        pred = np.zeros(world, dtype=np.int64)
        for q, c_q in enumerate(all_c):
            for e in range(E):
                for j, n in enumerate(split_counts(int(c_q[e]), int(cnt[e]), q)):
                    pred[int(log2phy[e, j]) // S_loc] += n
        h6.remove()
        shared.update(rep=rep, base=base, pl=pl, g_E=g_E)
        ok = d_out <= 1e-5 and d_grad <= 1e-4 and got.cpu().numpy().tolist() == pred.tolist()
        return ok, (f"max|out diff| {d_out:.3g}, max|grad diff| {d_grad:.3g}, rank tokens {got.tolist()} "
                    f"predicted {pred.tolist()}, replicas {int((pl.logcnt > 1).sum())}")

    def gather_slots(fn, lay, n):
        flat = torch.stack([torch.cat([fn(p).reshape(-1) for p in m.parameters()])
                            for m in lay.experts.local_experts])
        parts = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(parts, flat)
        return torch.cat(parts).view(n, -1)

    def copies_of(pl):
        return [np.flatnonzero(pl.phy2log[0] == e) for e in range(pl.num_experts) if pl.logcnt[0, e] > 1]

    @check("replica_grad_sum_step")
    def c7():
        import time

        rep, base, pl, g_E = shared["rep"], shared["base"], shared["pl"], shared["g_E"]
        S, phy = pl.num_slots, torch.as_tensor(pl.phy2log[0], device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        info = rp_mg.sum_replica_grads([rep.experts], pl, ep_rank=rank, group=ep_group)
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        copies = copies_of(pl)
        g_S = gather_slots(lambda p: p.grad, rep, S)
        eq = {"g": all(torch.equal(g_S[c[0]], g_S[s]) for c in copies for s in c)}
        d_g = float((g_S - g_E[phy]).abs().max())
        opts = [torch.optim.Adam(lay.experts.parameters(), lr=1e-3) for lay in (rep, base)]
        for o in opts:
            o.step()
        w_S, w_E = gather_slots(lambda p: p.data, rep, S), gather_slots(lambda p: p.data, base, pl.num_experts)
        for key, fn in (("w", lambda p: p.data), ("exp_avg", lambda p: opts[0].state[p]["exp_avg"]),
                        ("exp_avg_sq", lambda p: opts[0].state[p]["exp_avg_sq"])):
            t = w_S if key == "w" else gather_slots(fn, rep, S)
            eq[key] = all(torch.equal(t[c[0]], t[s]) for c in copies for s in c)
        d_w = float((w_S - w_E[phy]).abs().max())
        ok = all(eq.values()) and d_g <= 1e-4 and d_w <= 1e-5 and info["replicated_experts"] == len(copies)
        return ok, (f"copies bitwise equal {eq}, max|grad - one holder| {d_g:.3g}, max|weight - one holder| "
                    f"{d_w:.3g}, {info['replicated_experts']} replicated experts, {info['bytes_sent']} bytes "
                    f"sent by rank 0, sum {ms:.2f} ms")

    @check("replica_grad_sum_megatron_ddp")
    def c8():
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        pl = shared["pl"]
        S = pl.num_slots
        base2, _ = build(E, k, H, 128, seed=555)
        rep2, cfg2 = build(S, k, H, 128, seed=555)
        rep2.router = base2.router
        W_E = gather_slots(lambda p: p.detach(), base2, E)
        with torch.no_grad():
            for i, m in enumerate(rep2.experts.local_experts):
                e, off = int(pl.phy2log[0, rank * (S // world) + i]), 0
                for p in m.parameters():
                    p.copy_(W_E[e, off:off + p.numel()].view_as(p))
                    off += p.numel()
        ddp = DistributedDataParallel(cfg2, DistributedDataParallelConfig(use_distributed_optimizer=False,
                                                                          grad_reduce_in_fp32=True), rep2)
        opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-3, use_distributed_optimizer=False,
                                                     bf16=False, fp16=False, params_dtype=torch.float32), [ddp])
        h8 = rp_mg.apply_expert_placement(rep2, pl, source_rank=rank, num_logical_experts=E)
        ddp.zero_grad_buffer()
        out, _ = ddp(x.clone())
        out.float().pow(2).sum().backward()
        ddp.finish_grad_sync()
        info = rp_mg.sum_replica_grads([rep2.experts], pl, ep_rank=rank, group=ep_group)
        copies = copies_of(pl)
        g_S = gather_slots(lambda p: p.main_grad, rep2, S)
        opt.step()
        w_S = gather_slots(lambda p: p.data, rep2, S)
        h8.remove()
        eq_g = all(torch.equal(g_S[c[0]], g_S[s]) for c in copies for s in c)
        eq_w = all(torch.equal(w_S[c[0]], w_S[s]) for c in copies for s in c)
        moved = float((w_S - W_E[torch.as_tensor(pl.phy2log[0], device="cuda")]).abs().max())
        return eq_g and eq_w and moved > 0, (f"main_grad copies equal {eq_g}, weights equal after the step {eq_w}, "
                                             f"step moved weights by up to {moved:.3g}, "
                                             f"{info['replicated_experts']} replicated experts")

    @check("distributed_optimizer_replica_migration")
    def c9():
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        from routepack_opt.cli.verify_runtime import replica_check_placement as replica_placement

        old = shared["pl"]
        new = replica_placement(load_LE[:, ::-1].astype(np.float64).copy(), world, world)  # other replicas
        S = old.num_slots
        model, cfg3 = build(S, k, H, 128, seed=98)
        ddp = DistributedDataParallel(cfg3, DistributedDataParallelConfig(use_distributed_optimizer=True,
                                                                          grad_reduce_in_fp32=True), model)
        opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-3, use_distributed_optimizer=True,
                                                     bf16=False, fp16=False, params_dtype=torch.float32), [ddp])
        out, _ = ddp(x.clone())
        out.float().pow(2).sum().backward()
        ddp.finish_grad_sync()
        opt.step()
        chained = getattr(opt, "chained_optimizers", [opt])
        dopt = next(o for o in chained if any(p in getattr(o, "model_param_group_index_map", {})
                                              for p in model.experts.parameters()))

        def flat_all():
            ts = rp_mg.expert_slot_tensors(model.experts, dopt, include_grads=False)
            local = torch.stack([torch.cat([t.reshape(-1).float() for t in slot]) for slot in ts])
            parts = [torch.empty_like(local) for _ in range(world)]
            dist.all_gather(parts, local)
            return torch.cat(parts), len(ts[0])

        before, n_t = flat_all()
        info = rp_mg.migrate_experts([rp_mg.expert_slot_tensors(model.experts, dopt, include_grads=False)],
                                     old, new, ep_rank=rank, ep_size=world, group=ep_group)
        after, _ = flat_all()
        ok = True
        for s in range(S):
            e = int(new.phy2log[0, s])
            if e == int(old.phy2log[0, s]):
                ok &= bool(torch.equal(after[s], before[s]))
            else:  # a copy of one of the expert's old holders (all holders are one expert)
                ok &= any(torch.equal(after[s], before[h]) for h in np.flatnonzero(old.phy2log[0] == e))
        return ok, (f"{info['experts_moved']} slots changed expert, {n_t} tensors per slot (weights + "
                    f"master/exp_avg/exp_avg_sq shards), every slot a copy of an old holder")

    c1(); c2(); c3(); c5(); c4(); c6(); c7(); c8(); c9()
    if rank == 0:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / ".megatron_gpu_check.json.tmp"
        tmp.write_text(json.dumps({"world": world, "experts": E, "topk": k, "tokens": args.tokens,
                                   "results": RESULTS}, indent=1))
        os.replace(tmp, out / "megatron_gpu_check.json")
    ps.destroy_model_parallel()
    dist.destroy_process_group()


def dry_run(args):
    """What runs without a GPU: the imports, the replicated placement the checks plan, and
    ``sum_replica_grads`` on one CPU process holding every slot (copies get the replica-order sum)."""
    import megatron.core  # noqa: F401  (the real run needs it)
    import torch

    from routepack_opt.cli.verify_runtime import replica_check_placement as replica_placement
    from routepack_opt.core.placement import Placement
    from routepack_opt.integrations import megatron as rp_mg

    E, P = args.experts, args.world
    if E % P:
        raise SystemExit(f"error: --experts {E} must be divisible by the EP size {P}")
    load = np.arange(E, 0, -1, dtype=np.float64)[None] ** 2  # skewed loads, hottest expert 0
    pl = replica_placement(load, P, P)
    one = Placement(pl.phy2log, 1, E)  # the same slots on one rank: the CPU sum
    g = torch.Generator().manual_seed(0)
    slots = [[torch.nn.Parameter(torch.zeros(4, 3))] for _ in range(one.num_slots)]
    for (p,) in slots:
        p.grad = torch.randn(4, 3, generator=g)
    part = [p.grad.clone() for (p,) in slots]
    info = rp_mg.sum_replica_grads(slots, one)
    ok = True
    for e in range(E):
        idx = np.flatnonzero(one.phy2log[0] == e)
        want = part[idx[0]].clone()
        for j in idx[1:]:
            want += part[j]
        ok &= all(torch.equal(slots[s][0].grad, want) for s in idx)
    print(f"dry run: EP {P}, E {E}, S {pl.num_slots}, replicated experts {int((pl.logcnt > 1).sum())} "
          f"(phy2log {pl.phy2log[0].tolist()}); CPU grad sum over {info['replicated_experts']} replicated "
          f"experts: {'PASS' if ok else 'FAIL'}")
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()

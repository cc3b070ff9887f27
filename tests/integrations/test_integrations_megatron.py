"""Megatron-Core seam: remapped routing with megatron-core's own pure functions (CPU, fused off)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
moe_utils = pytest.importorskip("megatron.core.transformer.moe.moe_utils",
                                reason="megatron-core is not installed (pip install '.[megatron]')")

from routepack_opt.core.errors import InputError  # noqa: E402
from routepack_opt.core.evaluate import rank_loads  # noqa: E402
from routepack_opt.core.topology import Topology  # noqa: E402
from routepack_opt.core.window import Window  # noqa: E402
from routepack_opt.integrations import megatron as rp_mg  # noqa: E402


def _route(T, E, k, seed, skew=2.0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(T, E, generator=g, dtype=torch.float64)
    logits[:, : E // 4] += skew  # popular experts, all on rank 0 under the identity layout
    return moe_utils.topk_routing_with_score_function(logits, k, score_function="softmax", fused=False)


def _planned_p2l(routing_map, lengths, ep):
    """RoutePack's plan for these tokens: the window built from the router's choices, LPT placement."""
    from routepack_opt.core.cost import get_preset
    from routepack_opt.integrations._common import plan_cells

    T, E = routing_map.shape
    k = int(routing_map[0].sum())
    routes = torch.nonzero(routing_map)[:, 1].reshape(T, 1, k).numpy()
    w = Window.from_routes(lengths, routes, E)
    pc = plan_cells(w, Topology(dp=ep, ep=ep, capacity=int(max(lengths)) * 4), get_preset("qwen3-30b-a3b").cost,
                    max_sweeps=5)
    return w, pc


def test_rank_split_after_remap_equals_planner_rank_loads():
    """After remap_routing, Megatron's contiguous EP split gives exactly the planner's predicted rank loads."""
    E, k, ep = 16, 2, 4
    lengths = [40, 25, 60, 35, 50, 30, 45, 55]
    probs, rmap = _route(sum(lengths), E, k, seed=0)
    w, pc = _planned_p2l(rmap, lengths, ep)
    p2l = pc.physical_to_logical[0]
    probs_p, rmap_p = rp_mg.remap_routing(probs, rmap, p2l)
    got = rp_mg.rank_token_counts(rmap_p.long(), ep).numpy()
    predicted = rank_loads(w.counts, pc.logical_to_physical, ep).sum(axis=0)[0]  # [P] at the one layer
    np.testing.assert_array_equal(got, predicted)
    ident = rp_mg.rank_token_counts(rmap.long(), ep).numpy()
    assert got.max() <= ident.max()  # LPT never has a busier rank than the identity layout here
    assert ident.max() > got.max()    # and the skew makes the identity layout strictly worse


@pytest.mark.parametrize("k, exact", [(2, True), (4, False)])
def test_unpermuted_outputs_identical_with_and_without_remap(k, exact):
    """permute → per-expert FFN → unpermute gives the same output with remapped routing and migrated weights."""
    T, E, H = 64, 8, 6
    probs, rmap = _route(T, E, k, seed=1)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(T, H, generator=g, dtype=torch.float64)
    W_EHH = torch.randn(E, H, H, generator=g, dtype=torch.float64)

    def moe(probs, rmap, W):
        perm, perm_probs, idx = moe_utils.permute(x, rmap, probs=probs, fused=False)
        counts = rmap.sum(0).tolist()
        outs = [chunk @ W[s] for s, chunk in enumerate(torch.split(perm, counts))]
        y = torch.cat(outs) * perm_probs.unsqueeze(-1)
        return moe_utils.unpermute(y, idx, x.shape, routing_map=rmap, fused=False)

    base = moe(probs, rmap, W_EHH)
    p2l = np.random.default_rng(3).permutation(E)
    probs_p, rmap_p = rp_mg.remap_routing(probs, rmap, p2l)
    out = moe(probs_p, rmap_p, W_EHH[torch.as_tensor(p2l)])  # slot s holds logical p2l[s]
    if exact:
        assert torch.equal(out, base)
    else:
        torch.testing.assert_close(out, base, rtol=1e-12, atol=1e-12)


def test_apply_expert_placement_wraps_route_and_undoes():
    """apply_expert_placement permutes route()'s outputs, set() switches the map, remove() restores route."""

    class Layer(torch.nn.Module):  # holds Megatron's route(); the router itself is megatron-core's
        def route(self, hidden_states, padding_mask=None):
            return moe_utils.topk_routing_with_score_function(hidden_states, 2, fused=False)

    layer = Layer()
    h = torch.randn(10, 8, dtype=torch.float64)
    p0, m0 = layer.route(h)
    p2l = np.array([3, 1, 0, 2, 7, 6, 5, 4])
    handle = rp_mg.apply_expert_placement(layer, p2l)
    p1, m1 = layer.route(h)
    assert torch.equal(p1, p0[:, p2l]) and torch.equal(m1, m0[:, p2l])
    handle.set(np.arange(8))
    assert torch.equal(layer.route(h)[1], m0)
    with pytest.raises(InputError, match="already"):
        rp_mg.apply_expert_placement(layer, p2l)
    handle.remove()
    assert "route" not in vars(layer)
    with pytest.raises(InputError, match="permutation"):
        rp_mg.remap_routing(p0, m0, [0, 0, 1, 2, 3, 4, 5, 6])


def test_migrate_experts_moves_weights_and_adam_state_single_rank():
    """migrate_experts (one rank) moves each expert's weights, grads and Adam exp_avg/exp_avg_sq to its new slot."""
    E, H = 6, 4
    experts = torch.nn.Module()
    experts.local_experts = torch.nn.ModuleList([torch.nn.Linear(H, H) for _ in range(E)])
    opt = torch.optim.Adam(experts.parameters())
    loss = sum((m(torch.randn(3, H)) ** 2).sum() * (i + 1) for i, m in enumerate(experts.local_experts))
    loss.backward()
    opt.step()
    old = np.arange(E)[None]
    new = np.array([[2, 0, 1, 5, 3, 4]])
    slots = [rp_mg.expert_slot_tensors(experts, opt)]
    before = [[t.clone() for t in s] for s in slots[0]]
    assert len(before[0]) == 2 * 4  # weight, bias: data, grad, exp_avg, exp_avg_sq each
    rep = rp_mg.migrate_experts(slots, old, new)
    assert rep["experts_moved"] == 6
    for s in range(E):
        for a, b in zip(slots[0][s], before[new[0, s]]):
            assert torch.equal(a, b)
    with pytest.raises(InputError):
        rp_mg.migrate_experts(slots, old, np.array([[0, 0, 1, 2, 3, 4]]))


def _migrate_worker(rank, world, init_file, out):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    E, L, M = 8, 2, 4
    # slot tensors hold their logical id (and a state tensor with 10×) so moves are checkable
    slots = [[[torch.full((3,), float(l * 100 + rank * M + s)), torch.full((2,), 10.0 * (l * 100 + rank * M + s))]
              for s in range(M)] for l in range(L)]
    old = np.tile(np.arange(E), (L, 1))
    new = np.array([[4, 5, 6, 7, 0, 1, 2, 3], [1, 0, 2, 3, 5, 4, 7, 6]])
    rep = rp_mg.migrate_experts(slots, old, new, ep_rank=rank, ep_size=world)
    ok = all(float(slots[l][s][0][0]) == l * 100 + new[l, rank * M + s]
             and float(slots[l][s][1][0]) == 10.0 * (l * 100 + new[l, rank * M + s])
             for l in range(L) for s in range(M))
    with open(f"{out}.{rank}", "w") as fh:
        fh.write(f"{int(ok)} {rep['experts_moved']} {rep['sent']}")
    dist.destroy_process_group()


def test_migrate_experts_across_two_ep_ranks(tmp_path):
    """migrate_experts with a real 2-rank gloo EP group: cross-rank and same-rank moves land in the right slots."""
    import torch.multiprocessing as mp

    mp.spawn(_migrate_worker, args=(2, str(tmp_path / "init"), str(tmp_path / "res")), nprocs=2, join=True)
    res = [(tmp_path / f"res.{r}").read_text().split() for r in range(2)]
    assert all(r[0] == "1" for r in res)
    assert res[0][1] == res[1][1] == "14"  # layer 0: all 8 slots change; layer 1: 6
    assert int(res[0][2]) == 4 and int(res[1][2]) == 4


def _real_moe_layer_worker(rank, init_file, out):
    import warnings

    import torch.distributed as dist

    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=0, world_size=1)
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
    from megatron.core.transformer.moe.moe_layer import MoELayer
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import TransformerConfig

    ps.initialize_model_parallel(1, 1)
    E = 8
    cfg = TransformerConfig(num_layers=1, hidden_size=12, num_attention_heads=4, num_moe_experts=E,
                            use_cpu_initialization=True, moe_token_dispatcher_type="allgather",
                            moe_router_topk=2, moe_grouped_gemm=False, add_bias_linear=False,
                            moe_ffn_hidden_size=16)
    layer = build_module(get_moe_module_spec(use_te=False, num_experts=E, moe_grouped_gemm=False), config=cfg)
    checks = [isinstance(layer, MoELayer)]
    handle = rp_mg.apply_expert_placement(layer, np.arange(E)[::-1].copy())
    checks.append("route" in vars(layer))
    handle.remove()
    checks.append("route" not in vars(layer) and layer.route.__func__ is MoELayer.route)
    slots = rp_mg.expert_slot_tensors(layer.experts)
    checks.append(len(slots) == E and all(len(s) == 2 for s in slots))  # fc1, fc2 weights
    before = [[t.clone() for t in s] for s in slots]
    new = np.random.default_rng(0).permutation(E)[None]
    rp_mg.migrate_experts([slots], np.arange(E)[None], new)
    checks.append(all(torch.equal(a, b) for s in range(E) for a, b in zip(slots[s], before[new[0, s]])))
    ps.destroy_model_parallel()
    dist.destroy_process_group()
    with open(out, "w") as fh:
        fh.write(" ".join(str(int(c)) for c in checks))


def test_real_moe_layer_wrap_and_expert_slots(tmp_path):
    """On megatron-core's real MoELayer (CPU, SequentialMLP): route() wraps and unwraps, and every local
    expert's weights migrate to its new slot. (Its forward needs CUDA: experiments/megatron_gpu_check.py.)"""
    import torch.multiprocessing as mp

    mp.spawn(_real_moe_layer_worker, args=(str(tmp_path / "init"), str(tmp_path / "res")), nprocs=1, join=True)
    assert (tmp_path / "res").read_text().split() == ["1"] * 5

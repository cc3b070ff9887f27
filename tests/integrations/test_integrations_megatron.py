"""Megatron-Core seam: remapped routing with megatron-core's own pure functions (CPU, fused off)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
moe_utils = pytest.importorskip("megatron.core.transformer.moe.moe_utils",
                                reason="megatron-core is not installed (the README's first command installs it)")

from support import spawn_ranks  # noqa: E402

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
    handle = rp_mg.apply_expert_placement(layer, physical_to_logical=p2l)
    p1, m1 = layer.route(h)
    assert torch.equal(p1, p0[:, p2l]) and torch.equal(m1, m0[:, p2l])
    handle.set(physical_to_logical=np.arange(8))
    assert torch.equal(layer.route(h)[1], m0)
    with pytest.raises(InputError, match="already"):
        rp_mg.apply_expert_placement(layer, physical_to_logical=p2l)
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


class _Layer(torch.nn.Module):
    """Holds Megatron's route() over megatron-core's own top-k router, with Megatron's config.num_moe_experts."""

    def __init__(self, E=8):
        super().__init__()
        self.config = type("Cfg", (), {"num_moe_experts": E})()

    def route(self, hidden_states, padding_mask=None):
        return moe_utils.topk_routing_with_score_function(hidden_states, 2, fused=False)


@pytest.mark.parametrize("call, match", [
    (lambda L: rp_mg.apply_expert_placement(L, physical_to_logical=[0, 0, 1, 2, 3, 4, 5, 6]),
     "physical_to_logical: not a permutation of 0..7: 0 appears 2 times, 7 is missing"),
    (lambda L: rp_mg.apply_expert_placement(L, physical_to_logical=np.arange(8)[None]),
     r"expected one layer's map \[E\], got shape \(1, 8\)"),
    (lambda L: rp_mg.apply_expert_placement(L, logical_to_physical=np.arange(4)),
     "4 entries, but the layer has 8 experts"),
    (lambda L: rp_mg.apply_expert_placement(L, physical_to_logical=np.arange(8.0)), "integer expert ids"),
    (lambda L: rp_mg.apply_expert_placement(L, np.arange(8)), "has no direction"),
    (lambda L: rp_mg.apply_expert_placement(L), "pass physical_to_logical="),
    (lambda L: rp_mg.apply_expert_placement(L, rp_mg.ExpertMap(np.tile(np.arange(8), (3, 1)))), "pass layer=l"),
    (lambda L: rp_mg.apply_expert_placement(L, rp_mg.ExpertMap(np.arange(8)), physical_to_logical=np.arange(8)),
     "not several"),
    (lambda L: rp_mg.apply_expert_placement(L, physical_to_logical=np.arange(8)).set([9, 9]),
     "has no direction"),
    (lambda L: rp_mg.apply_expert_placement(L, physical_to_logical=np.arange(8)).set(physical_to_logical=[9, 9]),
     "2 entries, but the layer has 8 experts"),
    (lambda L: rp_mg.apply_expert_placement(L, physical_to_logical=np.arange(8)).set(
        physical_to_logical=[9, 1, 2, 3, 4, 5, 6, 7]), "id 9 at position 0 is outside 0..7"),
])
def test_maps_are_checked_when_given_not_at_first_route(call, match):
    """A bad map to apply_expert_placement or handle.set is one InputError at the call, with no doubled prefix."""
    layer = _Layer()
    with pytest.raises(InputError, match=match) as exc:
        call(layer)
    assert "placement: placement" not in str(exc.value) and len(str(exc.value)) <= 200


def test_expert_map_carries_its_direction():
    """ExpertMap from either direction routes the same; logical_to_physical= equals ExpertMap; layer= picks a row."""
    layer = _Layer()
    h = torch.randn(10, 8, dtype=torch.float64)
    p0, m0 = layer.route(h)
    l2p_LE = np.array([[3, 1, 0, 2, 7, 6, 5, 4], [1, 0, 2, 3, 4, 5, 7, 6]])
    emap = rp_mg.ExpertMap.from_logical_to_physical(l2p_LE)
    assert rp_mg.ExpertMap.from_physical_to_logical(emap.physical_to_logical) == emap
    np.testing.assert_array_equal(np.take_along_axis(emap.physical_to_logical, l2p_LE, 1), np.tile(np.arange(8), (2, 1)))
    p2l_1 = emap.physical_to_logical[1]
    for kw in (dict(placement=emap, layer=1), dict(placement=emap.layer(1)), dict(logical_to_physical=l2p_LE[1]),
               dict(physical_to_logical=p2l_1)):
        handle = rp_mg.apply_expert_placement(layer, **kw)
        p1, m1 = layer.route(h)
        assert torch.equal(p1, p0[:, p2l_1]) and torch.equal(m1, m0[:, p2l_1])
        handle.remove()
    # the wrong direction given as the other keyword is a different map, as it should be
    assert not np.array_equal(np.argsort(l2p_LE[0]), l2p_LE[0])
    with pytest.raises(InputError, match="logical_to_physical layer 1: not a permutation"):
        rp_mg.ExpertMap(np.array([[0, 1, 2, 3, 4, 5, 6, 7], [0, 0, 2, 3, 4, 5, 6, 7]]))
    with pytest.raises(InputError, match="expected an index in 0..1"):
        emap.layer(2)
    with pytest.raises(InputError, match=r"^logical_to_physical: not a permutation"):
        rp_mg.physical_to_logical(np.array([[0, 0, 1]]))


@pytest.mark.parametrize("bad, match", [
    ("topk_ids", "values other than 0/1"),
    ("topk_bool", "have 2 columns but the map has 8 experts"),
    ("map_2d", r"one layer's map \[E\], got shape \(1, 8\)"),
])
def test_remap_routing_names_top_k_indices_and_shapes(bad, match):
    """remap_routing given [T, k] top-k ids (or a [1, E] map) says so, instead of 'expected a permutation of 0..1'."""
    T, E, k = 6, 8, 2
    probs, rmap = _route(T, E, k, seed=4)
    p2l = np.arange(E)
    if bad == "topk_ids":
        top_p, top_i = torch.topk(probs, k, dim=1)
        args = (top_p, top_i * 3 + 2, p2l)  # ids > 1 in an integer [T, k]
    elif bad == "topk_bool":
        args = (probs[:, :k], rmap[:, :k], p2l)
    else:
        args = (probs, rmap, p2l[None])
    with pytest.raises(InputError, match=match):
        rp_mg.remap_routing(*args)


def test_migrate_experts_takes_expert_maps_and_names_the_bad_one():
    """migrate_experts accepts ExpertMaps (either direction built in) and names which map is bad, without doubled prefixes."""
    E = 4
    slots = [[[torch.full((2,), float(s))] for s in range(E)]]
    new = rp_mg.ExpertMap.from_logical_to_physical([[1, 2, 3, 0]])
    rep = rp_mg.migrate_experts(slots, rp_mg.ExpertMap(np.arange(E)), new)
    assert rep["experts_moved"] == 4
    assert [float(slots[0][s][0][0]) for s in range(E)] == new.physical_to_logical[0].tolist()
    with pytest.raises(InputError, match=r"^new_physical_to_logical: not a permutation of 0..3: 1 appears 2 times"):
        rp_mg.migrate_experts(slots, np.arange(E)[None], np.array([[0, 1, 1, 2]]))


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
    spawn_ranks(_migrate_worker, args=(2, str(tmp_path / "init"), str(tmp_path / "res")), nprocs=2)
    res = [(tmp_path / f"res.{r}").read_text().split() for r in range(2)]
    assert all(r[0] == "1" for r in res)
    assert res[0][1] == res[1][1] == "14"  # layer 0: all 8 slots change; layer 1: 6
    assert int(res[0][2]) == 4 and int(res[1][2]) == 4


def _cpu_gating(router, input):
    """megatron-core's ``TopKRouter.gating`` without its move of the weight to CUDA (the CPU recipe)."""
    return torch.nn.functional.linear(input.to(router.weight.dtype), router.weight)


def _real_moe_layer_worker(rank, init_file, out):
    import types
    import warnings

    import torch.distributed as dist

    from routepack_opt.integrations.verl import expert_map_from_batch

    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=0, world_size=1)
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
    from megatron.core.transformer.moe.moe_layer import MoELayer
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import TransformerConfig

    ps.initialize_model_parallel(1, 1)
    torch.manual_seed(0)
    E, k, S, B, H, ep = 8, 2, 16, 4, 12, 4
    cfg = TransformerConfig(num_layers=1, hidden_size=H, num_attention_heads=4, num_moe_experts=E,
                            use_cpu_initialization=True, moe_token_dispatcher_type="allgather",
                            moe_router_topk=k, moe_grouped_gemm=False, add_bias_linear=False,
                            moe_ffn_hidden_size=16, params_dtype=torch.float64)
    layer = build_module(get_moe_module_spec(use_te=False, num_experts=E, moe_grouped_gemm=False), config=cfg)
    layer.router.gating = types.MethodType(_cpu_gating, layer.router)
    checks = {"is_moe_layer": isinstance(layer, MoELayer)}
    handle = rp_mg.apply_expert_placement(layer, physical_to_logical=np.arange(E)[::-1].copy())
    checks["wrapped"] = "route" in vars(layer)
    handle.remove()
    checks["unwrapped"] = "route" not in vars(layer) and layer.route.__func__ is MoELayer.route
    slots = rp_mg.expert_slot_tensors(layer.experts)
    checks["slots"] = len(slots) == E and all(len(s) == 2 for s in slots)  # fc1, fc2 weights

    # One step's map, as verl makes it: the router's top-k ids as routed_experts [B, S, 1, k].
    x = torch.randn(S, B, H, dtype=torch.float64)
    with torch.no_grad():
        base = layer(x)[0]
        _, rmap = layer.route(x)
    ids_TK = torch.nonzero(rmap)[:, 1].reshape(S * B, k)  # token t = s·B + b
    batch = {"routed_experts": ids_TK.reshape(S, B, 1, k).transpose(0, 1).numpy(),
             "attention_mask": np.ones((B, S), dtype=np.int64)}
    l2p = expert_map_from_batch(batch, num_experts=E, ep_size=ep)          # [1, E] logical → physical
    emap = rp_mg.ExpertMap.from_logical_to_physical(l2p)
    checks["map_moves_experts"] = not np.array_equal(l2p[0], np.arange(E))
    before = [[t.clone() for t in s] for s in slots]
    rp_mg.migrate_experts([slots], rp_mg.ExpertMap(np.arange(E)), emap)    # slot s ← logical p2l[s]
    checks["migrated"] = all(torch.equal(a, b) for s in range(E)
                             for a, b in zip(slots[s], before[emap.physical_to_logical[0, s]]))
    handle = rp_mg.apply_expert_placement(layer, emap)
    with torch.no_grad():
        _, rmap_p = layer.route(x)
        after = layer(x)[0]
    load_E = rmap.sum(0).numpy()
    planned_P = np.bincount(l2p[0] // (E // ep), weights=load_E, minlength=ep)
    checks["rank_loads_follow_map"] = rp_mg.rank_token_counts(rmap_p.long(), ep).numpy().tolist() == planned_P.tolist()
    checks["forward_unchanged"] = bool(torch.allclose(after, base, rtol=1e-12, atol=1e-12))
    handle.remove()
    ps.destroy_model_parallel()
    dist.destroy_process_group()
    with open(out, "w") as fh:
        fh.write(" ".join(f"{name}={int(ok)}" for name, ok in checks.items()))


def test_real_moe_layer_cpu_recipe(tmp_path):
    """On megatron-core's real MoELayer on CPU (docs/api.md recipe): route() wraps and unwraps, a verl
    step's map through ExpertMap sends each rank its planned tokens, and with the experts migrated the
    forward output is unchanged."""
    spawn_ranks(_real_moe_layer_worker, args=(str(tmp_path / "init"), str(tmp_path / "res")), nprocs=1)
    res = dict(item.split("=") for item in (tmp_path / "res").read_text().split())
    assert res and all(v == "1" for v in res.values()), res
    assert len(res) == 8


def _replicated_plan(E=16, k=2, ep=4, redundant=4, seed=5):
    """Megatron-core's own top-k routing of 16 samples, planned with replicas (D = P = 4)."""
    from routepack_opt.core.cost import get_preset
    from routepack_opt.integrations._common import plan_cells

    lengths = [30 + 7 * (i % 5) for i in range(16)]
    probs, rmap = _route(sum(lengths), E, k, seed=seed, skew=3.0)
    routes = torch.nonzero(rmap)[:, 1].reshape(-1, 1, k).numpy()
    w = Window.from_routes(lengths, routes, E)
    topo = Topology(dp=ep, ep=ep, capacity=4 * max(lengths), redundant_experts=redundant)
    pc = plan_cells(w, topo, get_preset("qwen3-30b-a3b").cost, max_sweeps=5)
    offs = np.concatenate([[0], np.cumsum(lengths)])
    return w, topo, pc, probs, rmap, offs


def test_replicated_rank_split_equals_planner_even_local_loads():
    """With megatron-core's routing and the planner's replicated placement, remap_routing's [T, S]
    map (even-local rule, source rank q per DP slot) sends every EP rank exactly the tokens the
    one evaluator predicts for each (micro-batch row, layer)."""
    from routepack_opt.core.evaluate import replica_block_W

    w, topo, pc, probs, rmap, offs = _replicated_plan()
    pl = pc.plan.placement_object()
    assert pl.redundant == 4 and (pl.logcnt > 1).any()
    P = topo.ep
    q_D = np.empty(topo.dp, dtype=np.int64)
    q_D[topo.slots_of_shard()] = np.arange(P)[None, :]
    W = replica_block_W(w.counts, pl, pc.plan.row, pc.plan.slot, pc.rows, topo)  # [R·G, L·P]
    for r, row_cells in enumerate(pc.cells):
        got = np.zeros(P, dtype=np.int64)
        for d, ids in enumerate(row_cells):
            tok = np.concatenate([np.arange(offs[i], offs[i + 1]) for i in ids])
            probs_TS, rmap_TS = rp_mg.remap_routing(probs[tok], rmap[tok], pl, source_rank=int(q_D[d]), layer=0)
            assert rmap_TS.shape == (tok.size, pl.num_slots) and int(rmap_TS.sum()) == int(rmap[tok].sum())
            got += rp_mg.rank_token_counts(rmap_TS.long(), P).numpy()
        np.testing.assert_array_equal(got, W[r])


def test_replicated_permute_unpermute_equals_one_holder():
    """permute → per-slot expert (slot s holds logical phy2log[s]'s weights) → unpermute with the
    replicated [T, S] routing gives the output of the unreplicated [T, E] routing; apply_expert_placement
    with a Placement and source_rank= returns the same [T, S] outputs from route()."""
    from routepack_opt.core.placement import Placement

    T, E, H, k, P = 64, 8, 6, 2, 4
    probs, rmap = _route(T, E, k, seed=1)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(T, H, generator=g, dtype=torch.float64)
    W_EHH = torch.randn(E, H, H, generator=g, dtype=torch.float64)

    def moe(probs, rmap, W):
        perm, perm_probs, idx = moe_utils.permute(x, rmap, probs=probs, fused=False)
        outs = [chunk @ W[s] for s, chunk in enumerate(torch.split(perm, rmap.sum(0).tolist()))]
        return moe_utils.unpermute(torch.cat(outs) * perm_probs.unsqueeze(-1), idx, x.shape,
                                   routing_map=rmap, fused=False)

    base = moe(probs, rmap, W_EHH)
    pl = Placement(np.array([[0, 1, 2, 3, 0, 5, 6, 7, 4, 0, 1, 2]]), ep=P, num_experts=E)  # 0 thrice
    for q in range(P):
        probs_p, rmap_p = rp_mg.remap_routing(probs, rmap, pl, source_rank=q)
        per_slot = rmap_p.sum(0)
        assert per_slot[[0, 4, 9]].sum() == rmap[:, 0].sum() and per_slot[[0, 4, 9]].max() - per_slot[[0, 4, 9]].min() <= 1
        out = moe(probs_p, rmap_p, W_EHH[torch.as_tensor(np.array(pl.phy2log[0]))])
        torch.testing.assert_close(out, base, rtol=1e-12, atol=1e-12)

    class Layer:
        def route(self, hidden):
            return probs, rmap

    layer = Layer()
    handle = rp_mg.apply_expert_placement(layer, pl, source_rank=1, num_logical_experts=E)
    got = layer.route(x)
    want = rp_mg.remap_routing(probs, rmap, pl, source_rank=1)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    with pytest.raises(InputError):
        handle.set(pl)  # no source_rank
    with pytest.raises(InputError):
        rp_mg.remap_routing(probs, rmap, pl)
    handle.remove()


def _replicated_moe_layer_worker(rank, init_file, out):
    import types
    import warnings

    import torch.distributed as dist

    from routepack_opt.core.placement import Placement

    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=0, world_size=1)
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import TransformerConfig

    ps.initialize_model_parallel(1, 1)
    E, k, Sq, B, H = 8, 2, 16, 4, 12
    phy2log = np.array([[0, 1, 2, 3, 0, 4, 5, 6, 7, 0, 1, 5]])  # 0 thrice, 1 and 5 twice
    pl = Placement(phy2log, ep=1, num_experts=E)

    def make(n):
        torch.manual_seed(0)
        cfg = TransformerConfig(num_layers=1, hidden_size=H, num_attention_heads=4, num_moe_experts=n,
                                use_cpu_initialization=True, moe_token_dispatcher_type="allgather",
                                moe_router_topk=k, moe_grouped_gemm=False, add_bias_linear=False,
                                moe_ffn_hidden_size=16, params_dtype=torch.float64)
        layer = build_module(get_moe_module_spec(use_te=False, num_experts=n, moe_grouped_gemm=False), config=cfg)
        layer.router.gating = types.MethodType(_cpu_gating, layer.router)
        return layer

    base, rep = make(E), make(pl.num_slots)
    rep.router = base.router  # the replicated layer routes over the E logical experts
    with torch.no_grad():  # slot s holds logical phy2log[s]: every replica the same weights
        for s, e in enumerate(phy2log[0]):
            for a, b in zip(rep.experts.local_experts[s].parameters(), base.experts.local_experts[e].parameters()):
                a.copy_(b)
    handle = rp_mg.apply_expert_placement(rep, pl, source_rank=0, num_logical_experts=E)
    x = torch.randn(Sq, B, H, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    outs = []
    for layer in (base, rep):
        xx = x.clone().requires_grad_(True)
        y = layer(xx)[0]
        y.pow(2).sum().backward()
        outs.append((y.detach(), xx.grad))
    checks = {"forward_equal": torch.allclose(outs[0][0], outs[1][0], rtol=1e-12, atol=1e-12),
              "input_grad_equal": torch.allclose(outs[0][1], outs[1][1], rtol=1e-12, atol=1e-12)}
    with torch.no_grad():
        _, rmap_TS = rep.route(x.view(-1, H))
    per_slot = rmap_TS.sum(0)
    checks["replicas_share_tokens"] = bool((per_slot[[0, 4, 9]] > 0).all()) and \
        int(per_slot[[0, 4, 9]].max() - per_slot[[0, 4, 9]].min()) <= 1
    ok = True
    for e in range(E):  # replica partial grads sum to the one holder's grad
        slots = np.flatnonzero(phy2log[0] == e)
        for i, p in enumerate(base.experts.local_experts[e].parameters()):
            parts = [list(rep.experts.local_experts[s].parameters())[i].grad for s in slots]
            ok &= torch.allclose(sum(parts[1:], parts[0]), p.grad, rtol=1e-10, atol=1e-12)
    checks["replica_grads_sum_to_expert_grad"] = bool(ok)
    handle.remove()
    ps.destroy_model_parallel()
    dist.destroy_process_group()
    with open(out, "w") as fh:
        fh.write(" ".join(f"{name}={int(v)}" for name, v in checks.items()))


def test_replicated_real_moe_layer_cpu(tmp_path):
    """megatron-core's real MoELayer with 12 slots for 8 logical experts (the router of an 8-expert
    layer, apply_expert_placement with a replicated Placement): forward and input grads equal the
    8-expert layer's, replicas share an expert's tokens evenly, and their partial grads sum to it."""
    spawn_ranks(_replicated_moe_layer_worker, args=(str(tmp_path / "init"), str(tmp_path / "res")), nprocs=1)
    res = dict(item.split("=") for item in (tmp_path / "res").read_text().split())
    assert len(res) == 4 and all(v == "1" for v in res.values()), res


def test_migrate_experts_replica_set_change_single_rank():
    """migrate_experts with replicated Placements: after a replica-set change every slot holds its
    new logical expert's weights, grads and Adam state (a new replica copies an old holder's)."""
    from routepack_opt.core.placement import Placement

    E, S, H = 4, 6, 4
    experts = torch.nn.Module()
    experts.local_experts = torch.nn.ModuleList([torch.nn.Linear(H, H) for _ in range(S)])
    old = Placement(np.array([[0, 1, 2, 3, 0, 1]]), ep=1, num_experts=E)
    with torch.no_grad():  # replicas identical, as the runtime keeps them
        for s, e in enumerate(old.phy2log[0]):
            for a, b in zip(experts.local_experts[s].parameters(), experts.local_experts[e].parameters()):
                a.copy_(b)
    opt = torch.optim.Adam(experts.parameters())
    for m in experts.local_experts:
        (m(torch.ones(2, H)) ** 2).sum().backward()
    opt.step()
    slots = [rp_mg.expert_slot_tensors(experts, opt)]
    before = {int(e): [t.clone() for t in slots[0][s]] for s, e in enumerate(old.phy2log[0])}
    new = Placement(np.array([[3, 2, 2, 1, 0, 3]]), ep=1, num_experts=E)  # 0, 1 lose a replica; 2, 3 gain
    rep = rp_mg.migrate_experts(slots, old, new)
    assert rep["experts_moved"] == 4  # slots 2 and 4 keep their expert
    for s, e in enumerate(new.phy2log[0]):
        assert all(torch.equal(a, b) for a, b in zip(slots[0][s], before[int(e)]))
    with pytest.raises(InputError):
        rp_mg.migrate_experts(slots, old, np.arange(S)[None])


_REPLICA_P2L = {2: [0, 1, 2, 3, 4, 5, 6, 7, 0, 1],   # 0, 1: one copy on each rank
                4: [0, 1, 2, 3, 4, 0, 5, 6, 1, 7, 0, 2]}  # 0 on ranks 0, 1, 3; 1 on 0, 2; 2 on 0, 3


def _replica_grad_sum_worker(rank, world, mode, init_file, out):
    """EP rank ``rank`` of ``world``: megatron-core's real MoELayer with S = 8 + world slots (the
    router of an 8-expert layer), every EP rank's tokens (source rank q) routed by
    apply_expert_placement(source_rank=q). Every process runs the whole layer (the full forward
    and backward of every source's tokens) and keeps its own S/world slots' partial grads: the
    grads EP dispatch gives that rank. Then sum_replica_grads over the gloo group, Adam."""
    import json
    import types
    import warnings

    import torch.distributed as dist

    from routepack_opt.core.placement import Placement

    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import TransformerConfig

    ps.initialize_model_parallel(1, 1)
    E, k, Sq, B, H = 8, 2, 16, 4, 12
    pl = Placement(np.array([_REPLICA_P2L[world]]), ep=world, num_experts=E)
    M = pl.slots_per_rank

    def make(n):
        torch.manual_seed(0)
        cfg = TransformerConfig(num_layers=1, hidden_size=H, num_attention_heads=4, num_moe_experts=n,
                                use_cpu_initialization=True, moe_token_dispatcher_type="allgather",
                                moe_router_topk=k, moe_grouped_gemm=False, add_bias_linear=False,
                                moe_ffn_hidden_size=16, params_dtype=torch.float32)
        layer = build_module(get_moe_module_spec(use_te=False, num_experts=n, moe_grouped_gemm=False), config=cfg)
        layer.router.gating = types.MethodType(_cpu_gating, layer.router)
        return layer

    base, rep = make(E), make(pl.num_slots)
    rep.router = base.router
    with torch.no_grad():
        for s, e in enumerate(pl.phy2log[0]):
            for a, b in zip(rep.experts.local_experts[s].parameters(), base.experts.local_experts[e].parameters()):
                a.copy_(b)
    handle = rp_mg.apply_expert_placement(rep, pl, source_rank=0, num_logical_experts=E)
    for q in range(world):  # source rank q's tokens, under q's even-local split
        x = torch.randn(Sq, B, H, generator=torch.Generator().manual_seed(100 + q))
        handle.set(pl, source_rank=q)
        rep(x)[0].pow(2).sum().backward()
        base(x)[0].pow(2).sum().backward()
    handle.remove()
    mine = [rep.experts.local_experts[s] for s in range(rank * M, rank * M + M)]
    params = [p for m in mine for p in m.parameters()]
    if mode == "main_grad":  # Megatron's DDP: grads live in the fp32 buffer, .grad is None
        for p in params:
            p.main_grad, p.grad = p.grad.clone(), None

    def gather(fn):  # [S, n]: every slot's flattened tensors, from every rank
        local = torch.stack([torch.cat([fn(p).reshape(-1) for p in m.parameters()]) for m in mine])
        parts = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(parts, local)
        return torch.cat(parts)

    def grad(p):
        return p.main_grad if mode == "main_grad" else p.grad

    partial = gather(grad)
    if mode == "main_grad":
        rep_ = rp_mg.sum_replica_grads([types.SimpleNamespace(local_experts=mine)], pl, ep_rank=rank)
    else:
        rep_ = rp_mg.sum_replica_grads([list(m.parameters()) for m in mine], pl, ep_rank=rank, layer=0)
    summed = gather(grad)
    ref_g = torch.stack([torch.cat([p.grad.reshape(-1) for p in base.experts.local_experts[e].parameters()])
                         for e in pl.phy2log[0]])
    if mode == "main_grad":
        for p in params:
            p.grad = p.main_grad
    opt = torch.optim.Adam(params, lr=1e-2)
    opt_ref = torch.optim.Adam(base.experts.parameters(), lr=1e-2)
    opt.step()
    opt_ref.step()
    got = {"w": gather(lambda p: p.data), "m": gather(lambda p: opt.state[p]["exp_avg"]),
           "v": gather(lambda p: opt.state[p]["exp_avg_sq"])}
    ref_params = [list(base.experts.local_experts[e].parameters()) for e in pl.phy2log[0]]
    ref = {"w": [lambda p: p.data], "m": [lambda p: opt_ref.state[p]["exp_avg"]],
           "v": [lambda p: opt_ref.state[p]["exp_avg_sq"]]}
    ref = {key: torch.stack([torch.cat([fn[0](p).reshape(-1) for p in ps_]) for ps_ in ref_params])
           for key, fn in ref.items()}
    res = {"replicated": rep_["replicated_experts"], "bytes_sent": rep_["bytes_sent"]}
    if rank == 0:
        copies = [np.flatnonzero(pl.phy2log[0] == e) for e in range(E) if pl.logcnt[0, e] > 1]
        res["partials_differ"] = all(not torch.equal(partial[c[0]], partial[c[1]]) for c in copies)
        res["unreplicated_untouched"] = all(torch.equal(partial[s], summed[s]) for s in range(pl.num_slots)
                                            if pl.logcnt[0, pl.phy2log[0, s]] == 1)
        for key, t in [("g", summed)] + list(got.items()):
            res[f"copies_equal_{key}"] = all(torch.equal(t[c[0]], t[s]) for c in copies for s in c)
        res["max_abs_diff"] = {key: float((t - r).abs().max()) for key, t, r in
                               [("g", summed, ref_g)] + [(k_, got[k_], ref[k_]) for k_ in got]}
        res["scale"] = {key: float(r.abs().max()) for key, r in [("g", ref_g)] + list(ref.items())}
        with open(out, "w") as fh:
            json.dump(res, fh)
    ps.destroy_model_parallel()
    dist.destroy_process_group()


@pytest.mark.parametrize("world, mode", [(2, "grad"), (4, "main_grad")])
def test_sum_replica_grads_real_moe_layer_gloo(tmp_path, world, mode):
    """sum_replica_grads over a real gloo EP group (2 and 4 ranks; .grad and Megatron's main_grad):
    every copy of an expert holds bitwise the same gradient, equal to the one-holder layer's within
    float32 reassociation; after an Adam step every copy's weights and moments are bitwise equal
    and match the one-holder run."""
    import json

    spawn_ranks(_replica_grad_sum_worker, args=(world, mode, str(tmp_path / "init"), str(tmp_path / "res")),
                nprocs=world)
    res = json.loads((tmp_path / "res").read_text())
    assert res["replicated"] == (2 if world == 2 else 3)
    assert res["bytes_sent"] > 0
    for key in ("partials_differ", "unreplicated_untouched", "copies_equal_g", "copies_equal_w",
                "copies_equal_m", "copies_equal_v"):
        assert res[key], (key, res)
    for key, d in res["max_abs_diff"].items():
        assert d <= 1e-5 * res["scale"][key], (key, res)  # float32 reassociation, relative to the size
    print(json.dumps(res))


def test_sum_replica_grads_single_process_and_bad_input():
    """One EP rank holding every slot: copies get the replica-order sum (exactly, float64); the
    arguments are checked."""
    from routepack_opt.core.placement import Placement

    pl = Placement(np.array([[0, 1, 2, 0, 1, 0]]), ep=1, num_experts=3)
    g = torch.Generator().manual_seed(0)
    slots = [[torch.nn.Parameter(torch.randn(4, 3, generator=g, dtype=torch.float64))] for _ in range(6)]
    for s, (p,) in enumerate(slots):
        p.grad = torch.randn(4, 3, generator=g, dtype=torch.float64) if s != 3 else None  # 3: no tokens
    part = [None if p.grad is None else p.grad.clone() for (p,) in slots]
    rep = rp_mg.sum_replica_grads(slots, pl)
    assert rep == {"replicated_experts": 2, "bytes_sent": 0}
    want0 = (part[0] + 0.0) + part[5]  # the empty replica 3 contributes zeros
    want1 = part[1] + part[4]
    for s, want in [(0, want0), (3, want0), (5, want0), (1, want1), (4, want1), (2, part[2])]:
        assert torch.equal(slots[s][0].grad, want)
    for bad, match in [(dict(ep_rank=1), "ep_rank must be in 0..0"), (dict(grad_attr="x"), "grad_attr"),
                       (dict(grad_attr="main_grad"), "no main_grad"), (dict(layer=1), "layer: expected")]:
        with pytest.raises(InputError, match=match):
            rp_mg.sum_replica_grads(slots, pl, **bad)
    with pytest.raises(InputError, match="local slots on this rank"):
        rp_mg.sum_replica_grads(slots[:5], pl)
    with pytest.raises(InputError, match="expected a routepack_opt.core.placement.Placement"):
        rp_mg.sum_replica_grads(slots, np.array([[0, 1, 2, 0, 1, 0]]))


def test_gpu_check_dry_run_runs_on_cpu():
    """experiments/megatron_gpu_check.py --dry-run (no GPU): its arguments, imports, the replicated
    placement it plans and the seam's grad sum on one CPU process; bad arguments are argparse's error."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root))
    script = str(root / "experiments" / "megatron_gpu_check.py")
    ok = subprocess.run([sys.executable, script, "--dry-run", "--world", "4", "--experts", "8"],
                        capture_output=True, text=True, env=env, timeout=300)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "S 12" in ok.stdout and "CPU grad sum" in ok.stdout and "PASS" in ok.stdout
    bad = subprocess.run([sys.executable, script, "--dry-run", "--topk", "0"], capture_output=True, text=True,
                         env=env, timeout=300)
    assert bad.returncode == 2 and "topk" in bad.stderr


def test_expert_map_is_a_placement_and_every_map_routes_alike():
    """ExpertMap is a thin adapter over a Placement (its phy2log is physical_to_logical); a
    Placement without replicas routes as the same column permutation, and one with replicas
    needs source_rank= (the even-local rule) or is refused."""
    from routepack_opt.core.placement import Placement

    T, E, k = 6, 8, 2
    probs, rmap = _route(T, E, k, seed=5)
    p2l = np.array([3, 1, 0, 2, 7, 6, 5, 4])
    emap = rp_mg.ExpertMap.from_physical_to_logical(p2l)
    assert emap.placement == Placement(p2l[None], 1, E)
    ref = rp_mg.remap_routing(probs, rmap, p2l)
    for m in (emap, emap.placement):
        got = rp_mg.remap_routing(probs, rmap, m)
        assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    replicated = Placement(np.concatenate([p2l, [0, 1]])[None], 2, E)
    with pytest.raises(InputError, match="needs source_rank="):
        rp_mg.remap_routing(probs, rmap, replicated)
    assert rp_mg.remap_routing(probs, rmap, replicated, source_rank=0)[0].shape == (T, E + 2)

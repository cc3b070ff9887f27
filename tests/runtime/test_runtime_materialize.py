"""Expert slots, logical→physical dispatch and in-place materialization (single process)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from routepack_opt.core.errors import InputError
from routepack_opt.runtime.dist import deterministic
from routepack_opt.runtime.materialize import materialize
from routepack_opt.runtime.model import TinyMoE, TinyMoEConfig, logical_expert_tensors
from routepack_opt.runtime.moe import MoELayer

CFG = TinyMoEConfig(num_layers=2, num_experts=8, top_k=2)


def _layer_with(placement_E, seed=0):
    torch.manual_seed(seed)
    layer = MoELayer(16, 16, 8, 2)
    g = torch.Generator().manual_seed(seed)
    w = [torch.randn(8, 16, 16, generator=g) for _ in range(3)]  # logical weights
    with torch.no_grad():
        layer.set_phy2log(np.argsort(placement_E))  # slot π[e] holds e
        for p, wl in zip(layer.slots.slot_params(), w):
            p[torch.as_tensor(placement_E)] = wl
        torch.manual_seed(seed)
        layer.router.weight.copy_(torch.randn(8, 16, generator=g))
    return layer


@pytest.mark.parametrize("use_routes", [False, True])
def test_moe_output_and_grads_do_not_depend_on_placement(use_routes):
    """Outputs, input grads and logical expert grads are bitwise equal under any placement
    (router top-k or replayed routes)."""
    rng = np.random.default_rng(0)
    x0 = torch.randn(37, 16, generator=torch.Generator().manual_seed(1))
    routes = torch.as_tensor(np.stack([rng.choice(8, 2, replace=False) for _ in range(37)])) if use_routes else None
    results = []
    with deterministic(0):
        for perm in (np.arange(8), rng.permutation(8), rng.permutation(8)):
            layer = _layer_with(perm)
            x = x0.clone().requires_grad_()
            y, _ = layer(x, routes)
            y.pow(2).sum().backward()
            grads = [p.grad[torch.as_tensor(perm)] for p in layer.slots.slot_params()]  # logical order
            results.append((y.detach(), x.grad, grads, layer.router.weight.grad))
    for y, gx, gw, gr in results[1:]:
        assert torch.equal(y, results[0][0]) and torch.equal(gx, results[0][1])
        assert torch.equal(gr, results[0][3])
        assert all(torch.equal(a, b) for a, b in zip(gw, results[0][2]))


def _trained_model(steps=2):
    """A tiny model after a few Adam steps on random packed data, gradients left in place."""
    model = TinyMoE(CFG)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, foreach=False)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        opt.zero_grad()
        tokens = torch.randint(0, CFG.vocab, (30,), generator=g)
        model(tokens, [0, 12, 30]).logsumexp(-1).sum().backward()
        opt.step()
    return model, opt


def test_materialize_moves_weights_grads_and_adam_state():
    """After materialize, every logical expert has the same weights, grads, exp_avg, exp_avg_sq;
    dispatch follows; bytes = moved experts × their state; unmoved slots untouched."""
    with deterministic(0):
        model, opt = _trained_model()
        before = logical_expert_tensors(model, opt)
        assert {"w_gate", "w_gate.grad", "w_gate.exp_avg", "w_gate.exp_avg_sq"} <= set(before[(0, 0)])
        old = np.stack([m.placement_E.numpy().copy() for m in model.moe_layers])
        new = old.copy()
        new[0, [1, 5, 6]] = old[0, [5, 6, 1]]  # a 3-cycle in layer 0
        new[1] = np.arange(8)[::-1]  # layer 1 reversed: every expert moves
        slot_ptrs = [p.data_ptr() for p in model.expert_parameters()]
        untouched = model.moe_layers[0].slots.w_up_SHF.detach()[[0, 2, 3, 4, 7]].clone()
        rep = materialize(model.moe_layers, new, opt)
        after = logical_expert_tensors(model, opt)
    assert [p.data_ptr() for p in model.expert_parameters()] == slot_ptrs  # in place
    assert set(before) == set(after)
    for key in before:
        for name, t in before[key].items():
            assert torch.equal(t, after[key][name]), (key, name)
    assert np.array_equal(np.stack([m.placement_E.numpy() for m in model.moe_layers]), new)
    assert torch.equal(model.moe_layers[0].slots.w_up_SHF.detach()[[0, 2, 3, 4, 7]], untouched)
    per_expert = 3 * CFG.hidden * CFG.ffn * 4 * 4  # 3 matrices × (weight, grad, exp_avg, exp_avg_sq) × fp32
    assert rep.experts_moved == 3 + 8 and rep.local_copies == 11 and rep.sent == 0
    assert rep.bytes_moved == 11 * per_expert


def test_materialize_same_placement_moves_nothing_and_rejects_bad_placement():
    """The current placement moves 0 bytes; a non-permutation is an InputError."""
    model, opt = _trained_model(1)
    cur = np.stack([m.placement_E.numpy().copy() for m in model.moe_layers])
    assert materialize(model.moe_layers, cur, opt).bytes_moved == 0
    bad = cur.copy()
    bad[0, 0] = bad[0, 1]
    with pytest.raises(InputError):
        materialize(model.moe_layers, bad, opt)
    with pytest.raises(InputError):
        materialize(model.moe_layers, cur[:1], opt)

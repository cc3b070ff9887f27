"""Replicated experts in training (docs/pipeline.md, step 5): even-local dispatch, replica
gradient sums, migration of replica sets, and the equivalence with one holder per expert."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from routepack_opt.cli.verify_runtime import replica_check_placement as replica_placement
from routepack_opt.core.errors import InputError
from routepack_opt.core.placement import Placement, split_counts
from routepack_opt.runtime.dist import deterministic
from routepack_opt.runtime.materialize import materialize
from routepack_opt.runtime.model import TinyMoE, TinyMoEConfig, logical_expert_tensors
from routepack_opt.runtime.moe import replica_slots
from routepack_opt.runtime.replicas import replica_max_diff, sum_replica_grads
from routepack_opt.runtime.verify import VerifyConfig, verify_runtime

CFG = TinyMoEConfig(num_layers=2, num_experts=8, top_k=2)


@pytest.mark.parametrize("q", [0, 1, 2, 3])
def test_dispatch_splits_each_expert_by_the_even_local_rule(q):
    """Tokens each replica slot receives equal core.placement.split_counts for every expert,
    and replica j gets exactly the pairs whose position t has (t + q) mod k == j."""
    rng = np.random.default_rng(q)
    pl = Placement(np.array([[0, 1, 2, 3, 0, 0, 4, 5, 6, 7, 1, 6]]), ep=4, num_experts=8)
    log2phy = torch.tensor(pl.log2phy()[0])
    logcnt = torch.tensor(pl.logcnt[0])
    experts_M = torch.as_tensor(rng.integers(0, 8, size=97))
    slots = replica_slots(experts_M, log2phy, logcnt, q)
    got = torch.bincount(slots, minlength=pl.num_slots).tolist()
    for e in range(8):
        k = int(logcnt[e])
        want = split_counts(int((experts_M == e).sum()), k, q)
        assert [got[int(log2phy[e, j])] for j in range(k)] == want
        t = torch.arange(int((experts_M == e).sum()))
        assert torch.equal(slots[experts_M == e], log2phy[e, (t + q) % k])


def test_replica_grad_sum_and_migration_single_process():
    """After sum_replica_grads every copy of an expert holds the same gradient (the sum of the
    partials in replica order); a replica-set change copies weights, grads and Adam moments
    from a holder, so every expert's state is unchanged and copies stay identical."""
    load = np.random.default_rng(0).random((2, 8))
    a = replica_placement(load, 4, 2)
    b = replica_placement(load[:, ::-1], 4, 2)
    assert not np.array_equal(a.logcnt, b.logcnt)
    with deterministic(0):
        model = TinyMoE(CFG, phy2log_LS=a.phy2log)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2, foreach=False)
        tokens = torch.randint(0, CFG.vocab, (30,), generator=torch.Generator().manual_seed(0))
        model(tokens, [0, 12, 30]).logsumexp(-1).sum().backward()
        layer = model.moe_layers[0]
        e = int(np.flatnonzero(a.logcnt[0] > 1)[0])
        slots = [int(s) for s in a.log2phy()[0, e, :a.logcnt[0, e]]]
        partial = [layer.slots.w_up_SHF.grad[s].clone() for s in slots]
        assert not torch.equal(partial[0], partial[1])  # each replica saw its own tokens
        sum_replica_grads(model.moe_layers)
        want = partial[0].clone()
        for p in partial[1:]:
            want += p
        assert all(torch.equal(layer.slots.w_up_SHF.grad[s], want) for s in slots)
        opt.step()
        assert replica_max_diff(model.moe_layers, opt) == 0.0
        before = logical_expert_tensors(model, opt)
        rep = materialize(model.moe_layers, Placement(b.phy2log, 1, 8), opt)
        after = logical_expert_tensors(model, opt)
    assert rep.replicas_added == rep.replicas_dropped > 0 and rep.bytes_moved > 0
    assert np.array_equal(torch.stack([m.logcnt_E for m in model.moe_layers]).numpy(), b.logcnt)
    assert replica_max_diff(model.moe_layers, opt) == 0.0
    for key in before:
        assert all(torch.equal(t, after[key][n]) for n, t in before[key].items()), key


def test_materialize_refuses_a_placement_of_another_shape():
    """A placement with another number of redundant slots, or a permutation for a replicated
    model, is an InputError (the slot count is fixed)."""
    a = replica_placement(np.ones((2, 8)), 2, 1)
    model = TinyMoE(CFG, phy2log_LS=a.phy2log)
    with pytest.raises(InputError):
        materialize(model.moe_layers, replica_placement(np.ones((2, 8)), 4, 1))
    with pytest.raises(InputError):
        materialize(model.moe_layers, np.tile(np.arange(8), (2, 1)))


def test_replicas_equal_one_holder_single_process():
    """One process, 4 DP slots (q = d mod 2), 4 redundant slots, a replica-set change after
    step 1: replicated == reference within float32 reassociation (and within 1e-9 in float64),
    the shuffled-slot run is bitwise equal, every copy identical."""
    rep = verify_runtime(dataclasses.replace(VerifyConfig(), steps=2, redundant=4, dp=4, placer=replica_placement), world_size=1, ep=1)
    sp = rep["single_process"]
    assert rep["ok"] and sp["moved_bitwise_equal"] and sp["replica_max_diff"] == 0.0
    assert 0.0 < sp["max_abs_diff"] <= 1e-3 and sp["max_abs_diff_float64"] <= 1e-9
    assert sp["replicas_added"] > 0 and sp["bytes_moved"] > 0


def test_replicas_equal_one_holder_with_4_gloo_processes():
    """D=4 gloo ranks, EP P=2, 2 redundant slots, replica-set change after step 1: replicated ==
    reference within float32 reassociation (float64: ≤ 1e-9), the run whose replicas sit on other
    slots and ranks is bitwise equal, all copies on all ranks identical, gradients exchanged."""
    cfg = dataclasses.replace(VerifyConfig(), steps=2, redundant=2, timeout_s=150, placer=replica_placement)
    rep = verify_runtime(cfg, world_size=4, ep=2, single=False)
    d = rep["distributed"]
    assert rep["ok"] and d["moved_bitwise_equal"] and d["replica_max_diff"] == 0.0
    assert d["max_abs_diff"] <= 1e-3 and d["max_abs_diff_float64"] <= 1e-9
    assert d["bytes_sent_cross_rank"] > 0 and all(b > 0 for b in d["replica_grad_bytes_per_step"])


@pytest.mark.slow
def test_replicas_equal_one_holder_with_8_gloo_processes():
    """D=8 gloo ranks, EP P=4 (up to 3 replicas of an expert), 4 redundant slots: as with 4 ranks."""
    cfg = dataclasses.replace(VerifyConfig(), steps=2, redundant=4, timeout_s=200, placer=replica_placement)
    rep = verify_runtime(cfg, world_size=8, ep=4, single=False)
    d = rep["distributed"]
    assert rep["ok"] and rep["max_replicas"] >= 3 and d["moved_bitwise_equal"]
    assert d["replica_max_diff"] == 0.0 and d["max_abs_diff_float64"] <= 1e-9


@pytest.mark.parametrize("args", [["--redundant-experts", "3"], ["--redundant-experts", "-2"],
                                  ["--redundant-experts", "10", "--world-size", "4", "--ep", "2"]])
def test_verify_runtime_bad_redundant_exits_2(run_cli, args):
    """(E + N) not divisible by ep, N < 0, N beyond E·(ep−1) → error: + exit 2."""
    code, out, err = run_cli("verify-runtime", *args)
    assert code == 2 and err.startswith("error:") and "Traceback" not in err


def test_verify_runtime_cli_replicas_json(run_cli):
    """`verify-runtime --world-size 1 --redundant-experts 4 --json` reports max_abs_diff (weights,
    Adam), the float64 check, bitwise-equal shuffled replicas and the bytes moved."""
    import json

    code, out, err = run_cli("verify-runtime", "--world-size", "1", "--steps", "2",
                             "--redundant-experts", "4", "--json")
    rep = json.loads(out)
    assert code == 0 and rep["ok"] is True and rep["redundant_experts"] == 4
    assert rep["max_abs_diff_weights"] <= 1e-3 and rep["max_abs_diff_adam"] <= 1e-3
    assert rep["max_abs_diff_float64"] <= 1e-9 and rep["moved_bitwise_equal"] is True
    assert rep["bytes_moved"] > 0 and rep["replica_max_diff"] == 0.0

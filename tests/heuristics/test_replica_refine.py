"""The replica refinement's moves, one by one, against the one evaluator: the cost each swap and
reassign claims is the evaluator's expert part of the placement it leaves."""

import numpy as np
import pytest

from routepack_opt.core.cost import CostModel, Stage
from routepack_opt.core.cost_kernel import expert_peak_sum, top3
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.core.placement import Placement
from routepack_opt.core.testing import random_layout, random_window
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import Window
from routepack_opt.heuristics.placement.replica_refine import (
    apply_reassign,
    apply_swap,
    block_expert_loads,
    reassign_cost,
    reassign_legal,
    replica_layer,
    swap_cost,
    swap_legal,
)
from routepack_opt.heuristics.placement.replicate import replicated_placement

COST = CostModel((Stage("attn", 0.02, 4e-5),), gamma=0.05, row_overhead=5.0, expert_bytes=1e6)
P, E, SLOTS, L, R, N = 4, 12, 20, 3, 3, 30


def _divisible_case(seed):
    """A window whose every token count is a multiple of 12 = lcm(1..P): every replica count
    k ≤ P divides it, so the even-local rule gives each replica exactly c/k, the refinement's
    linear surrogate is the rule itself, and its claims must equal the evaluator's exactly."""
    w = random_window(num_samples=N, num_layers=L, num_experts=E, top_k=3, max_len=20, seed=seed, skew=2.5)
    w = Window(w.lengths * 12, w.counts * 12, top_k=3)
    topo = Topology(dp=P, ep=P, capacity=100_000, redundant_experts=SLOTS - E)  # one shard
    rng = np.random.default_rng(seed)
    row, slot = random_layout(N, R, P, rng)
    pl = replicated_placement(w.expert_loads(), P, SLOTS)
    return w, topo, row, slot, pl, rng


def _evaluator_expert_part(ev, p2l_LS, row, slot, l):
    """Σ over the blocks of max_p W at layer l, in tokens, by the one evaluator."""
    _, _, M_RGL = ev.costs(Placement(p2l_LS.copy(), P, E), row, slot, R, parts=True)
    return float(M_RGL[:, :, l].sum())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_swap_and_reassign_claims_the_evaluators_cost(seed):
    """Random legal swaps and reassigns, applied one by one: each claimed layer cost equals the
    evaluator's expert part of the resulting placement exactly (integer-valued shares), and the
    carried loads agree with the claim."""
    w, topo, row, slot, pl, rng = _divisible_case(seed)
    ev = Evaluator(w, topo, COST)
    V_LEK = block_expert_loads(w.counts, row, slot, R, topo)
    p2l_LS = np.array(pl.phy2log, dtype=np.int64)
    checked = {"swap": 0, "reassign": 0}
    for l in range(L):
        ly = replica_layer(V_LEK[l].astype(np.float64), p2l_LS[l], P)
        assert expert_peak_sum(ly.W_KP) == _evaluator_expert_part(ev, p2l_LS, row, slot, l)
        Wn = np.empty_like(ly.W_KP)
        for _ in range(40):
            s, t = (int(x) for x in rng.integers(SLOTS, size=2))
            f = int(rng.integers(E))
            if rng.random() < 0.7 and swap_legal(ly, s, t):
                top3(ly.W_KP, ly.tv_K3, ly.ti_K3)
                claimed = swap_cost(ly, s, t, np.inf)
                apply_swap(ly, s, t)
                kind = "swap"
            elif reassign_legal(ly, s, f):
                claimed = reassign_cost(ly, s, f, Wn)
                apply_reassign(ly, s, f)
                kind = "reassign"
            else:
                continue
            assert claimed == _evaluator_expert_part(ev, p2l_LS, row, slot, l), kind
            assert expert_peak_sum(ly.W_KP) == claimed
            checked[kind] += 1
    assert checked["swap"] > 10 and checked["reassign"] > 3, checked

"""The attention term of the layout lower bound (``attention_lower_bound``): valid against brute
force on tiny windows where its longest-sample term beats the mean, and that term's arithmetic."""

import numpy as np
import pytest

from routepack_opt.core.bounds import attention_lower_bound, layout_lower_bound
from routepack_opt.core.cost import CostModel, Stage
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import Window
from routepack_opt.models.brute import brute_force_layout
from routepack_opt.models.layout import LayoutInstance

ATTN = CostModel(stages=(Stage("linear", 0.3, 0.0), Stage("full", 0.05, 0.01)), gamma=0.0, row_overhead=0.0)


def _mean(lengths, topo, cost):
    L = np.asarray(lengths, dtype=np.float64)
    return sum(float((s.alpha * L + s.beta * L ** 2).sum()) for s in cost.stages) / topo.ep


def test_the_longest_sample_term_by_hand():
    """Lengths 10, 6, 6, 6 on P = 2 cells of C = 10 (one stage, a = l²): the mean is 208 / 2 = 104;
    one block (20 tokens) holds at most 100 + 36 + 4/6 · 36 = 160, so the bound is 100 + 48 / 2 =
    124, and the best layout ([10], [6] | [6], [6]) costs 100 + 36 = 136."""
    cost = CostModel(stages=(Stage("q", 0.0, 1.0),), gamma=0.0, row_overhead=0.0)
    topo = Topology(dp=2, ep=2, capacity=10)
    assert attention_lower_bound([10, 6, 6, 6], topo, cost) == pytest.approx(124.0)
    # everything fits in one block: only the longest sample's own cost is left (100 > 112 / 2)
    assert attention_lower_bound([10, 2, 2, 2], topo, cost) == pytest.approx(100.0)


def _window(lengths, layers, experts, top_k, seed):
    """Every token of sample i goes to the same top_k experts (drawn per sample and layer)."""
    rng = np.random.default_rng(seed)
    counts = np.zeros((len(lengths), layers, experts), dtype=np.int64)
    for i, n in enumerate(lengths):
        for layer in range(layers):
            counts[i, layer, rng.choice(experts, size=top_k, replace=False)] = n
    return Window(np.asarray(lengths, dtype=np.int64), counts, top_k=top_k)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("objective", ["max-sum", "sum-max"])
def test_layout_bound_never_exceeds_the_brute_force_optimum(seed, objective):
    """With one long sample and short ones on wide blocks the longest-sample term is above the
    mean, and the whole layout bound stays at or below the brute-force optimum."""
    rng = np.random.default_rng(seed)
    lengths = np.concatenate([[40], rng.integers(1, 8, size=5)]).astype(np.int64)
    w = _window(lengths, 2, 4, 2, seed)
    # one shard of 2 slots in 2 rows, or 2 shards of 2 slots in 1 row (every cell nonempty)
    topo = Topology(dp=2 if seed % 2 else 4, ep=2, capacity=40)
    R = 2 if seed % 2 else 1
    pl = np.tile(np.arange(4), (2, 1))
    cost = CostModel(stages=ATTN.stages, gamma=0.2, row_overhead=5.0)
    inst = LayoutInstance.build(w, topo, cost, pl, R, objective)
    ref = brute_force_layout(inst)
    assert ref.objective is not None
    assert attention_lower_bound(lengths, topo, cost) > _mean(lengths, topo, cost)  # the new term bites
    bound = layout_lower_bound(lengths, inst.evaluator.rank_loads(pl).sum(axis=0), R, topo, cost)
    assert bound <= ref.objective * (1 + 1e-12)
    assert inst.lower_bound() == pytest.approx(bound)

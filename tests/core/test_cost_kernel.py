"""The objective's one definition: Objective's makespan and critical path, and the compiled cost
module's objective branch, which stops on a code it does not know."""

import numpy as np
import pytest

from routepack_opt.core.cost_kernel import BlockCosts, is_max_sum, key_of
from routepack_opt.core.objective import Objective


def _J(seed, R=5, G=3):
    return np.random.default_rng(seed).uniform(1.0, 100.0, size=(R, G))


@pytest.mark.parametrize("seed", range(3))
def test_makespan_and_critical_path_agree(seed):
    """Each objective's critical blocks (one per row) sum to its makespan; max-sum is the busiest
    shard's column sum, sum-max the sum of the row maxima."""
    J = _J(seed)
    assert Objective.MAX_SUM.makespan(J) == J.sum(axis=0).max()
    assert Objective.SUM_MAX.makespan(J) == J.max(axis=1).sum()
    for o in Objective:
        rows, shards = o.critical_blocks(J)
        assert rows.tolist() == list(range(J.shape[0]))
        assert J[rows, shards].sum() == pytest.approx(o.makespan(J), rel=1e-12)
        assert o.other is not o and o.other.other is o
        assert list(Objective)[o.code] is o


@pytest.mark.parametrize("objective", list(Objective))
def test_compiled_key_equals_the_objective_up_to_summation_order(objective):
    """cost_kernel.key_of (the placement search's key) gives the makespan, total and peak of
    Objective on the same blocks, to 1e-12 (block-order sums against numpy's pairwise ones)."""
    R, G = 7, 3
    rng = np.random.default_rng(4)
    att = rng.uniform(0, 50, R * G)
    M = rng.integers(0, 1000, R * G)
    k = np.arange(R * G)
    bk = BlockCosts(att, 0.3, 5.0, k % G, k // G, G, R, objective.code)
    m, t, pk = key_of(bk, M, np.zeros(R * G, dtype=np.int64), np.empty(max(G, R)))
    J = ((att + 0.3 * M) + 5.0).reshape(R, G)
    assert m == pytest.approx(objective.makespan(J), rel=1e-12)
    assert t == pytest.approx(J.sum(), rel=1e-12) and pk == J.max()


def test_unknown_objective_code_raises():
    """A code no objective has stops the compiled kernels instead of running as sum-max."""
    assert is_max_sum(Objective.MAX_SUM.code) and not is_max_sum(Objective.SUM_MAX.code)
    with pytest.raises(ValueError, match="unknown objective"):
        is_max_sum(len(Objective))
    R, G = 2, 2
    k = np.arange(R * G)
    bk = BlockCosts(np.ones(R * G), 1.0, 0.0, k % G, k // G, G, R, len(Objective))
    with pytest.raises(ValueError, match="unknown objective"):
        key_of(bk, np.ones(R * G, dtype=np.int64), np.zeros(R * G, dtype=np.int64), np.empty(2))

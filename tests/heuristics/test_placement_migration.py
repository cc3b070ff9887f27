"""Migration cost: moved experts, bytes and time on hand-built cases; slot alignment."""

import numpy as np
import pytest

from routepack_opt.core.cost import CostModel, Stage, get_preset
from routepack_opt.core.errors import InputError
from routepack_opt.core.plan import check_placement
from routepack_opt.core.topology import Topology
from routepack_opt.heuristics.placement.migration import align_slots, migration_cost, per_expert_time, relabel_ranks

COST = CostModel((Stage("a", 1.0, 0.0),), gamma=1.0, expert_bytes=1000.0, migration_bandwidth=10.0)
TOPO = Topology(dp=4, ep=2, capacity=100)  # G = 2 shards


def test_hand_case_counts_bytes_time():
    """Slot swaps inside a rank move experts (bytes) but cost no rank traffic; cross-rank swaps do."""
    cur = np.array([[0, 1, 2, 3], [0, 1, 2, 3]])
    new = np.array([[1, 0, 2, 3],   # experts 0,1 swap slots inside rank 0
                    [2, 1, 0, 3]])  # experts 0 (rank 0→1) and 2 (rank 1→0) swap ranks
    m = migration_cost(cur, new, TOPO, COST)
    assert m.experts_moved == 4 and m.moved_per_layer.tolist() == [2, 2]
    assert m.rank_changes == 2 and m.max_rank_received == 1
    assert m.bytes_per_shard == 4000.0 and m.bytes_total == 8000.0
    assert m.time_us == pytest.approx(1 * 1000.0 / 10.0)


def test_busiest_rank_sets_time():
    """Time is the busiest rank's received experts over all layers × bytes / bandwidth."""
    topo = Topology(dp=3, ep=3, capacity=100)
    cur = np.array([[0, 1, 2, 3, 4, 5]] * 2)
    # layer 0: e0 (r0) ↔ e2 (r1); layer 1: e1 (r0) ↔ e3 (r1), e4 (r2) ↔ e0 (r0)
    new = np.array([[2, 1, 0, 3, 4, 5], [4, 3, 2, 1, 0, 5]])
    m = migration_cost(cur, new, topo, COST)
    # received: layer0 r0 gets e2, r1 gets e0; layer1 r1 gets e1, r0 gets e3, r2 gets e0, r0 gets e4
    assert m.rank_changes == 6 and m.max_rank_received == 3
    assert m.time_us == pytest.approx(3 * 100.0)


def test_identity_and_free_migration():
    """No change → nothing moves; a cost model without migration figures makes moves free."""
    cur = np.array([[3, 1, 0, 2]])
    assert migration_cost(cur, cur, TOPO, COST).experts_moved == 0
    free = CostModel((Stage("a", 1.0, 0.0),), gamma=1.0)
    assert per_expert_time(free) == 0.0
    assert migration_cost(cur, np.array([[0, 1, 2, 3]]), TOPO, free).time_us == 0.0


def test_align_slots_moves_only_rank_changes(rng):
    """Aligned slots: a permutation with the same per-rank sets, and slot changes = rank changes."""
    L, E, P = 5, 16, 4
    for _ in range(20):
        cur = np.stack([rng.permutation(E) for _ in range(L)])
        new = np.stack([rng.permutation(E) for _ in range(L)])
        topo = Topology(dp=P, ep=P, capacity=1)
        al = align_slots(new, cur, P, relabel=False)
        assert check_placement(al, L, E) == []
        assert ((al // (E // P)) == (new // (E // P))).all()
        m_new, m_al = (migration_cost(cur, x, topo, COST) for x in (new, al))
        assert m_al.experts_moved == m_al.rank_changes == m_new.rank_changes
        assert m_al.time_us == m_new.time_us
        rl = align_slots(new, cur, P)  # relabelled: same expert sets per rank, fewest moves
        assert check_placement(rl, L, E) == []
        for l in range(L):
            sets = lambda pl, l=l: sorted(tuple(np.flatnonzero(pl[l] // (E // P) == p)) for p in range(P))
            assert sets(rl) == sets(new)
        m_rl = migration_cost(cur, rl, topo, COST)
        assert m_rl.experts_moved == m_rl.rank_changes <= m_new.rank_changes


def test_relabel_is_optimal_assignment(rng):
    """The Hungarian relabelling keeps as many experts in place as the best of all P! labellings."""
    import itertools
    P, E = 4, 12
    for _ in range(15):
        cur, new = rng.permutation(E)[None], rng.permutation(E)[None]
        best = max(int(((np.array(perm)[new[0] // 3]) == cur[0] // 3).sum())
                   for perm in itertools.permutations(range(P)))
        assert int((relabel_ranks(new, cur, P)[0] == cur[0] // 3).sum()) == best


def test_preset_expert_bytes():
    """Preset bytes = 3·hidden·moe_intermediate params × (2 B weights + 12 B optimizer state)."""
    cfg = get_preset("qwen3-30b-a3b").config
    cost = get_preset("qwen3-30b-a3b").cost
    assert cost.expert_bytes == 3 * cfg.hidden * cfg.moe_intermediate * 14
    assert per_expert_time(cost) == pytest.approx(cost.expert_bytes / cost.migration_bandwidth)


def test_bad_placement_rejected():
    """A placement that is not a permutation is an input error."""
    with pytest.raises(InputError):
        migration_cost(np.array([[0, 0, 1, 2]]), np.array([[0, 1, 2, 3]]), TOPO, COST)

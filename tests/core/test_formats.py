"""Topology, cost files, presets and plans: validation and round trips."""

import json

import numpy as np
import pytest

from routepack_opt.core.cost import PRESETS, CostModel, Stage, load_cost, resolve_cost, save_cost
from routepack_opt.core.errors import InputError
from routepack_opt.core.plan import Plan, load_plan
from routepack_opt.core.testing import random_layout, random_window
from routepack_opt.core.topology import Topology


@pytest.mark.parametrize("kw, match", [
    (dict(dp=6, ep=4, capacity=10), "not divisible"),
    (dict(dp=0, ep=1, capacity=10), "dp must be"),
    (dict(dp=4, ep=2, capacity=0), "capacity must be"),
    (dict(dp=4, ep=2, capacity=10, shard_of_slot=(0, 0, 0, 1)), "exactly ep"),
    (dict(dp=4, ep=2, capacity=10, row_multiple=0), "row_multiple"),
])
def test_bad_topologies(kw, match):
    """Invalid topologies raise InputError with the reason."""
    with pytest.raises(InputError, match=match):
        Topology(**kw)


def test_topology_shards():
    """Default shards follow Megatron order; custom ones are honoured."""
    t = Topology(dp=4, ep=2, capacity=8)
    assert t.shard_of_slot == (0, 0, 1, 1) and t.num_shards == 2
    t2 = Topology(dp=4, ep=2, capacity=8, shard_of_slot=[1, 0, 1, 0])
    assert t2.slots_of_shard().tolist() == [[1, 3], [0, 2]]
    with pytest.raises(InputError, match="not divisible"):
        t.check_experts(5)


def test_cost_toml_round_trip(tmp_path):
    """A cost model survives save/load exactly."""
    c = CostModel((Stage("lin", 0.02, 0.0), Stage("full", 0.01, 2.5e-7)), gamma=0.004, row_overhead=50.0)
    save_cost(c, tmp_path / "c.toml")
    c2 = load_cost(tmp_path / "c.toml")
    assert c2.stages == c.stages and c2.gamma == c.gamma and c2.row_overhead == c.row_overhead


@pytest.mark.parametrize("text, match", [
    ("gamma = 1.0\n", "missing key"),
    ("gamma = -1.0\n[[stage]]\nname='a'\nalpha=1\nbeta=0\n", "≥ 0"),
    ("gamma = 1.0\n[[stage]]\nname='a'\nalpha=1\n", "missing beta"),
    ("gamma = = 1\n", "not valid TOML"),
    ("gamma = 1.0\nfoo = 2\n[[stage]]\nname='a'\nalpha=1\nbeta=0\n", "unknown key"),
])
def test_bad_cost_files(tmp_path, text, match):
    """Malformed cost files raise InputError with the reason."""
    (tmp_path / "c.toml").write_text(text)
    with pytest.raises(InputError, match=match):
        load_cost(tmp_path / "c.toml")


def test_presets_derived_and_plausible():
    """Every preset derives positive coefficients; the hybrid has a linear stage without beta."""
    for name, p in PRESETS.items():
        c = p.cost
        assert c.gamma > 0 and all(s.alpha > 0 for s in c.stages)
        assert resolve_cost(name) == c
    hybrid = PRESETS["ling-hybrid"].cost
    assert [s.name for s in hybrid.stages] == ["linear_attn", "mla"]
    assert hybrid.stages[0].beta == 0 and hybrid.stages[1].beta > 0
    q = PRESETS["qwen3-30b-a3b"].config
    assert (q.moe_layers, q.experts, q.top_k) == (48, 128, 8)
    d = PRESETS["deepseek-v3"].config
    assert (d.moe_layers, d.experts, d.top_k) == (58, 256, 8)


def _plan(rng, n=10, rows=2, dp=4, ep=2, L=2, E=4):
    topo = Topology(dp=dp, ep=ep, capacity=10**6)
    row, slot = random_layout(n, rows, dp, rng)
    pl = np.stack([rng.permutation(E) for _ in range(L)])
    return Plan(topo, rows, pl, row, slot, objective="sum-max")


def test_plan_json_round_trip(tmp_path, rng):
    """A plan survives save/load, cells listed R × D."""
    p = _plan(rng)
    p.save(tmp_path / "p.json")
    d = json.loads((tmp_path / "p.json").read_text())
    assert d["format"] == "routepack-plan/1" and len(d["cells"]) == 2 and len(d["cells"][0]) == 4
    q = load_plan(tmp_path / "p.json", num_samples=10)
    assert np.array_equal(q.row, p.row) and np.array_equal(q.slot, p.slot)
    assert np.array_equal(q.placement, p.placement) and q.objective == "sum-max"


def test_plan_validate_lists_every_violation(rng):
    """validate() names coverage, nonempty, capacity and row-rule violations; a placement that
    is not one (a layer that is no permutation) is refused when the plan is built."""
    w = random_window(10, 2, 4, 2, max_len=50, seed=4)
    p = _plan(rng)
    assert p.validate(w) == []
    topo = Topology(dp=4, ep=2, capacity=1, min_rows=3, row_multiple=2)
    with pytest.raises(InputError, match="layer 0 is not a permutation"):
        Plan(topo, 2, np.array([[0, 0, 1, 2], [0, 1, 2, 3]]), p.row, p.slot)
    bad = Plan(topo, 2, np.array([[1, 0, 3, 2], [0, 1, 2, 3]]), p.row, p.slot)
    errs = " | ".join(bad.validate(w))
    assert "min_rows" in errs and "capacity" in errs
    row = p.row.copy()  # a plan is immutable: a sample out of every cell is a new plan
    row[0] = -1
    assert any("coverage" in e for e in Plan(p.topology, p.rows, p.placement, row, p.slot).validate(w))

"""verl seam: our rearrange_micro_batches against the real verl package (verl==0.9.1 from PyPI)."""

import os

import numpy as np
import pytest

verl_sb = pytest.importorskip("verl.utils.seqlen_balancing", reason="verl is not installed (pip install '.[verl]')")
torch = pytest.importorskip("torch")

from tensordict import TensorDict  # noqa: E402

from routepack_opt.cost import get_preset  # noqa: E402
from routepack_opt.errors import InputError  # noqa: E402
from routepack_opt.evaluate import Evaluator  # noqa: E402
from routepack_opt.integrations import verl as rp_verl  # noqa: E402
from routepack_opt.integrations._common import length_only_window  # noqa: E402
from routepack_opt.plan import assignment_from_cells  # noqa: E402
from routepack_opt.topology import Topology  # noqa: E402

COST = get_preset("qwen3-30b-a3b").cost


def make_batch(lens, S, E=8, La=2, K=2, seed=0, routes=True):
    """A right-padded verl batch (input_ids, attention_mask, position_ids, routed_experts)."""
    rng = np.random.default_rng(seed)
    B = len(lens)
    mask = torch.zeros(B, S, dtype=torch.int64)
    for b, n in enumerate(lens):
        mask[b, :n] = 1
    data = {"input_ids": torch.randint(0, 100, (B, S)) * mask, "attention_mask": mask,
            "position_ids": torch.cumsum(mask, 1) - 1}
    if routes:
        R = torch.zeros(B, S, La, K, dtype=torch.int64)
        for b, n in enumerate(lens):
            r = np.argsort(rng.random((n - 1, La, E)), axis=2)[:, :, :K]
            R[b, :n - 1] = torch.from_numpy(r)
        data["routed_experts"] = R
    return TensorDict(data, batch_size=[B])


def joint_makespan(lens, parts, cap, objective="max-sum"):
    """Predicted time of a rank's micro-batches under RoutePack's evaluator (dp=1)."""
    w = length_only_window(lens)
    row, slot = assignment_from_cells([[p] for p in parts], len(lens))
    return Evaluator(w, Topology(dp=1, ep=1, capacity=cap), COST).score(
        np.zeros((1, 1), dtype=np.int64), row, slot, len(parts), objective).makespan


def check_valid(batch, mbs, parts, cap):
    lens = batch["attention_mask"].sum(1).tolist()
    flat = sorted(i for p in parts for i in p)
    assert flat == list(range(len(lens)))
    assert all(p for p in parts)
    assert all(sum(lens[i] for i in p) <= cap for p in parts)
    for mb, p in zip(mbs, parts):
        assert torch.equal(mb["input_ids"], batch["input_ids"][p])
    # Outputs computed per micro-batch, concatenated, restored by verl's own function.
    out = torch.cat([mb["input_ids"].float().sum(1) for mb in mbs])
    assert torch.equal(verl_sb.restore_dynamic_batch(out, parts), batch["input_ids"].float().sum(1))


@pytest.mark.parametrize("seed", [0, 1])
def test_valid_and_no_worse_than_verl(seed):
    """Ours is valid (cap, every sample once, restore_dynamic_batch round trip) and no worse than verl's on the joint cost."""
    rng = np.random.default_rng(seed)
    lens = [int(x) for x in np.clip(rng.lognormal(6.3, 0.8, 48), 16, 4000)]
    cap = 4096
    batch = make_batch(lens, max(lens), seed=seed)
    theirs = verl_sb.rearrange_micro_batches(batch, cap)[1]
    mbs, ours = rp_verl.rearrange_micro_batches(batch, cap, max_sweeps=30)
    check_valid(batch, mbs, ours, cap)
    assert len(ours) <= len(theirs)
    for obj in ("max-sum", "sum-max"):
        assert joint_makespan(lens, ours, cap, obj) <= joint_makespan(lens, theirs, cap, obj) * (1 + 1e-9)


def test_row_rules_and_force_group_size():
    """num_batches_divided_by, min_num_micro_batch and force_group_size are honoured like verl's."""
    lens = [100, 300, 50, 400, 200, 250, 120, 80, 60, 90, 30, 10]
    batch = make_batch(lens, 400, routes=False)
    mbs, parts = rp_verl.rearrange_micro_batches(batch, 600, num_batches_divided_by=2, min_num_micro_batch=3,
                                                 max_sweeps=10)
    check_valid(batch, mbs, parts, 600)
    assert len(parts) % 2 == 0 and len(parts) >= 3
    mbs, parts = rp_verl.rearrange_micro_batches(batch, 800, force_group_size=2, max_sweeps=10)
    check_valid(batch, mbs, parts, 800)
    assert all(p[j] % 2 == 0 and p[j + 1] == p[j] + 1 for p in parts for j in range(0, len(p), 2))


def test_nested_input_ids():
    """Nested (jagged) input_ids: lengths from offsets, as verl reads them."""
    lens = [5, 9, 3, 7, 2, 8]
    ids = torch.nested.as_nested_tensor([torch.arange(n) for n in lens], layout=torch.jagged)
    batch = TensorDict({"input_ids": ids}, batch_size=[len(lens)])
    mbs, parts = rp_verl.rearrange_micro_batches(batch, 12, max_sweeps=10)
    assert sorted(i for p in parts for i in p) == list(range(6))
    assert all(sum(lens[i] for i in p) <= 12 for p in parts)


def test_sample_over_cap_and_bad_groups_are_errors():
    """A sample over max_token_len, or a batch not divisible by force_group_size, is one InputError."""
    batch = make_batch([10, 50, 20], 50, routes=False)
    with pytest.raises(InputError, match="exceeds max_token_len"):
        rp_verl.rearrange_micro_batches(batch, 40)
    with pytest.raises(InputError, match="force_group_size"):
        rp_verl.rearrange_micro_batches(batch, 100, force_group_size=2)


def test_expert_map_from_batch_matches_lpt_on_imported_loads():
    """expert_map_from_batch: a permutation per layer; padding/zero-filled rows are not load on expert 0."""
    from routepack_opt.heuristics.placement import lpt_placement, swap_refine
    from routepack_opt.integrations.replay import import_replay

    lens = [30, 12, 25, 40]
    batch = make_batch(lens, 40, E=8, La=3, K=2, seed=4)
    m = rp_verl.expert_map_from_batch(batch, 8, 4)
    assert m.shape == (3, 8) and all(sorted(r) == list(range(8)) for r in m)
    w = import_replay(batch["routed_experts"], format="verl", num_experts=8,
                      attention_mask=batch["attention_mask"]).window
    load = w.expert_loads()
    np.testing.assert_array_equal(m, swap_refine(load, lpt_placement(load, 4), 4))
    assert (load.sum(axis=1) == 2 * sum(lens)).all()  # every token counted top_k times
    # Counting the zero-filled last positions would put 2 extra tokens per sample on expert 0;
    # the import imputes them (at most 1 of each on expert 0 per sample).
    naive_L = np.array([sum(int((batch["routed_experts"][b, :n, l] == 0).sum()) for b, n in enumerate(lens))
                        for l in range(3)])
    assert (load[:, 0] <= naive_L - len(lens)).all()
    with pytest.raises(InputError, match="routed_experts"):
        rp_verl.expert_map_from_batch(make_batch([3, 4], 4, routes=False), 8, 4)


def _dist_worker(rank, world, init_file, result_file):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    lens = [[900, 800, 700, 100, 50, 40], [100, 120, 90, 80, 70, 60]][rank]
    batch = make_batch(lens, 900, routes=False)
    _, parts = rp_verl.rearrange_micro_batches(batch, 1000, dp_group=dist.group.WORLD, max_sweeps=5)
    with open(f"{result_file}.{rank}", "w") as fh:
        fh.write(str(len(parts)))
    dist.destroy_process_group()


def test_dp_group_agrees_on_the_count(tmp_path):
    """With a real gloo dp_group, ranks with different batches agree on the micro-batch count (verl's sync)."""
    import torch.multiprocessing as mp

    mp.spawn(_dist_worker, args=(2, str(tmp_path / "init"), str(tmp_path / "res")), nprocs=2, join=True)
    counts = [int((tmp_path / f"res.{r}").read_text()) for r in range(2)]
    assert counts[0] == counts[1] >= 3


def test_plugin_activate_patches_verl():
    """The verl.plugins entry point swaps verl's function for ours, and pyproject declares it."""
    import tomllib
    from pathlib import Path

    from routepack_opt.integrations import verl_plugin

    old = verl_sb.rearrange_micro_batches
    try:
        assert "verl.utils.seqlen_balancing" in verl_plugin.activate()
        assert getattr(verl_sb.rearrange_micro_batches, "__routepack__", False)
    finally:
        verl_sb.rearrange_micro_batches = old
    py = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert py["project"]["entry-points"]["verl.plugins"]["routepack"] == "routepack_opt.integrations.verl_plugin"

"""verl seam: our rearrange_micro_batches against the real verl package (verl==0.9.1 from PyPI)."""


import numpy as np
import pytest

verl_sb = pytest.importorskip("verl.utils.seqlen_balancing", reason="verl is not installed (pip install '.[verl]')")
torch = pytest.importorskip("torch")

from tensordict import TensorDict  # noqa: E402

from routepack_opt.core.cost import get_preset  # noqa: E402
from routepack_opt.core.errors import InputError  # noqa: E402
from routepack_opt.core.evaluate import Evaluator  # noqa: E402
from routepack_opt.core.plan import assignment_from_cells  # noqa: E402
from routepack_opt.core.topology import Topology  # noqa: E402
from routepack_opt.integrations import verl as rp_verl  # noqa: E402
from routepack_opt.integrations._common import length_only_window  # noqa: E402

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
    from routepack_opt.heuristics.placement.lpt import lpt_placement, swap_refine
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
    py = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert py["project"]["entry-points"]["verl.plugins"]["routepack"] == "routepack_opt.integrations.verl_plugin"


# --- DP balance seam (_balance_batch: equal sample counts per rank) ----------------------------


def _verl_partitions(lens, dp_size):
    """The partition verl's RayPPOTrainer._balance_batch computes (its own functions, called as
    it calls them: FLOP workload, Karmarkar–Karp with equal_size=True). The trainer module itself
    needs torchdata, which verl's CPU install here lacks."""
    workload = verl_sb.calculate_workload(torch.tensor(lens))
    return verl_sb.get_seqlen_balanced_partitions(workload, k_partitions=dp_size, equal_size=True)


def _chunks_layout(lens, chunk_ids, D, cap):
    """A layout from per-rank chunks (global ids per rank): each rank's samples packed into the
    least common number of rows by KK + in-rank repair (what verl's per-rank rearrange does at
    one agreed count)."""
    import time

    from routepack_opt.certify import pack_into_bins
    from routepack_opt.heuristics.equal_counts import _pack_slot

    lens = np.asarray(lens, dtype=np.int64)
    for R in range(1, len(chunk_ids[0]) + 1):
        row = np.empty(lens.size, dtype=np.int64)
        slot = np.empty(lens.size, dtype=np.int64)
        ok = True
        for d, ids in enumerate(chunk_ids):
            ids = np.asarray(ids)
            r = _pack_slot(lens[ids], R, cap, time.perf_counter() + 5.0, pack_into_bins)
            if r is None:
                ok = False
                break
            row[ids], slot[ids] = r, d
        if ok:
            return R, row, slot
    raise AssertionError("no layout")


@pytest.mark.parametrize("routes", [False, True])
def test_balance_batch_equal_counts_valid_and_no_worse_than_verl(routes):
    """Our DP balance gives every rank exactly B/dp samples (verl's dispatch cuts equal chunks),
    keeps every micro-batch under the cap, reorders a real DataProto like verl's _balance_batch,
    and plans no more micro-batches and no worse a joint makespan than verl's partition."""
    from verl import DataProto

    rng = np.random.default_rng(3)
    D, cap, E = 4, 4096, 8
    lens = [int(x) for x in np.clip(rng.lognormal(6.3, 0.8, 64), 16, 4000)]
    td = make_batch(lens, max(lens), E=E, seed=3, routes=routes)
    opts = dict(num_experts=E, ep_size=2) if routes else {}
    dp = DataProto.from_dict(tensors={k: td[k] for k in td.keys()})
    metrics = {}
    gb = rp_verl.balance_batch(dp, D, metrics, max_token_len=cap, max_sweeps=20, **opts)
    m = len(lens) // D
    assert [len(p) for p in gb.partitions] == [m] * D
    assert sorted(i for p in gb.partitions for i in p) == list(range(len(lens)))
    assert gb.plan.topology.equal_samples_per_slot and gb.plan.validate() == []
    assert any(k.startswith("global_seqlen") for k in metrics)
    # the reordered batch: rank d's equal chunk is exactly its planned samples, in micro-batch order
    want = torch.cat([td["input_ids"][p] for p in gb.partitions])
    assert torch.equal(dp.batch["input_ids"], want)
    for d in range(D):
        for mb in gb.micro_batches[d]:
            assert mb and sum(lens[i] for i in mb) <= cap
    # verl's own partition (equal chunks); each rank then packed at the least common count
    chunks = _verl_partitions(lens, D)
    assert [len(c) for c in chunks] == [m] * D
    R, row, slot = _chunks_layout(lens, chunks, D, cap)
    assert gb.num_micro_batches <= R
    if not routes and gb.num_micro_batches == R:
        ev = Evaluator(length_only_window(lens), Topology(dp=D, ep=1, capacity=cap), COST)
        pl = np.zeros((1, 1), dtype=np.int64)
        for obj in ("max-sum", "sum-max"):  # each objective planned for itself
            p = gb.plan if obj == "max-sum" else rp_verl.balance_batch_partitions(
                td, D, max_token_len=cap, max_sweeps=20, objective=obj).plan
            assert (ev.score(pl, p.row, p.slot, R, obj).makespan
                    <= ev.score(pl, row, slot, R, obj).makespan * (1 + 1e-9))


def test_balance_batch_rejects_indivisible_batch():
    """A global batch that does not divide over the DP ranks is one InputError naming N and D
    (verl asserts it too)."""
    td = make_batch([100] * 10, 100, routes=False)
    with pytest.raises(InputError, match=r"N=10 .*D=4"):
        rp_verl.balance_batch_partitions(td, 4, max_token_len=1000)

"""verl seam: our rearrange_micro_batches against the real verl package (verl==0.9.1 from PyPI)."""


import numpy as np
import pytest

verl_sb = pytest.importorskip("verl.utils.seqlen_balancing", reason="verl is not installed (the README's first command installs it)")
torch = pytest.importorskip("torch")

from support import spawn_ranks  # noqa: E402
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


def test_verl_contract_errors_are_verls():
    """Padded length over max_token_len, indivisible groups, a forced group over the cap: verl's exception types and messages."""
    batch = make_batch([10, 50, 20], 50, routes=False)
    for fn in (verl_sb.rearrange_micro_batches, rp_verl.rearrange_micro_batches):
        with pytest.raises(AssertionError, match="max_token_len must be greater than the sequence length"):
            fn(batch, 40)
        with pytest.raises(AssertionError, match="must be divisible by force_group_size 2"):
            fn(batch, 100, force_group_size=2)
        with pytest.raises(ValueError, match="A forced group exceeds max_token_len"):
            fn(make_batch([30, 40, 5, 5], 40, routes=False), 50, force_group_size=2)
    with pytest.raises(InputError):  # and a clear InputError for RoutePack's own callers
        rp_verl.rearrange_micro_batches(batch, 40)


def test_batch_without_input_ids_is_planned_from_the_mask():
    """attention_mask + routed_experts without input_ids (a raw KeyError before): planned from the mask, valid."""
    lens = [30, 12, 25, 40, 7, 33]
    batch = make_batch(lens, 40, seed=1)
    del batch["input_ids"]
    mbs, parts = rp_verl.rearrange_micro_batches(batch, 60, max_sweeps=10)
    assert sorted(i for p in parts for i in p) == list(range(6))
    assert all(sum(lens[i] for i in p) <= 60 for p in parts)
    assert all(torch.equal(mb["attention_mask"], batch["attention_mask"][p]) for mb, p in zip(mbs, parts))


def test_unsupported_batch_falls_back_to_verl_with_one_warning(caplog):
    """A sample without tokens: verl's own function runs (same result), one warning for the cause, a fallback record."""
    lens = [30, 0, 25, 40]
    batch = make_batch([max(n, 1) for n in lens], 40, routes=False)
    batch["attention_mask"][1] = 0
    want = verl_sb.rearrange_micro_batches(batch, 60)[1]
    with caplog.at_level("WARNING", logger="routepack_opt.integrations"):
        for _ in range(2):
            _, parts = rp_verl.rearrange_micro_batches(batch, 60)
            assert parts == want
    assert sum("no tokens" in r.message for r in caplog.records) == 1
    rec = rp_verl.last_record()
    assert rec.fallback is not None and "no tokens" in rec.fallback
    assert rec.metrics()["routepack/fallback"] == 1.0


def test_record_compares_with_verls_own_packing():
    """Each call records rows and predicted time of ours and verl's KK (one evaluator), planning time, saving; flat metrics."""
    rng = np.random.default_rng(5)
    lens = [int(x) for x in np.clip(rng.lognormal(6.3, 0.8, 48), 16, 4000)]
    batch = make_batch(lens, max(lens), routes=False)
    rp_verl.pop_records()
    seen = []
    _, ours = rp_verl.rearrange_micro_batches(batch, 4096, max_sweeps=30, on_record=seen.append)
    theirs = verl_sb.rearrange_micro_batches(batch, 4096)[1]
    (rec,) = rp_verl.pop_records()
    assert seen == [rec] and rec.fallback is None and rec.samples == 48
    assert rec.rows == len(ours) and rec.rows_theirs == len(theirs)
    assert rec.predicted_us == pytest.approx(joint_makespan(lens, ours, 4096))
    assert rec.predicted_us_theirs == pytest.approx(joint_makespan(lens, theirs, 4096))
    assert rec.net_saving_us == pytest.approx(rec.saving_us - 1e6 * rec.planning_s)
    met = rec.metrics()
    assert met["routepack/rows"] == len(ours) and met["routepack/planning_ms"] == pytest.approx(1e3 * rec.planning_s)


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
    spawn_ranks(_dist_worker, args=(2, str(tmp_path / "init"), str(tmp_path / "res")), nprocs=2)
    counts = [int((tmp_path / f"res.{r}").read_text()) for r in range(2)]
    assert counts[0] == counts[1] >= 3


def test_plugin_activate_patches_verl(caplog):
    """The verl.plugins entry point swaps verl's function for ours (one INFO line), and pyproject declares it."""
    import tomllib
    from pathlib import Path

    from routepack_opt.integrations import verl_plugin

    old = verl_sb.rearrange_micro_batches
    try:
        with caplog.at_level("INFO", logger="routepack_opt.integrations"):
            assert "verl.utils.seqlen_balancing" in verl_plugin.activate(time_limit=0.5)
        assert getattr(verl_sb.rearrange_micro_batches, "__routepack__", False)
        assert rp_verl.verl_own() is old
        assert any("rearrange_micro_batches replaced" in r.message and "0.5 s" in r.message for r in caplog.records)
    finally:
        verl_sb.rearrange_micro_batches = old
    py = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert py["project"]["entry-points"]["verl.plugins"]["routepack"] == "routepack_opt.integrations.verl_plugin"


@pytest.mark.parametrize("env, match", [
    ({"ROUTEPACK_VERL": "enabled"}, "ROUTEPACK_VERL='enabled' is not recognised"),
    ({"ROUTEPACK_VERL": "1", "VERL_USE_EXTERNAL_PLUGINS": "none"}, "VERL_USE_EXTERNAL_PLUGINS='none'"),
    ({"ROUTEPACK_VERL": "1", "ROUTEPACK_COST": "bogus"}, "ROUTEPACK_COST='bogus'"),
    ({"ROUTEPACK_VERL": "1", "ROUTEPACK_OBJECTIVE": "fastest"}, "ROUTEPACK_OBJECTIVE='fastest'"),
    ({"ROUTEPACK_VERL": "1", "ROUTEPACK_TIME_LIMIT": "-1"}, "ROUTEPACK_TIME_LIMIT='-1'"),
])
def test_plugin_says_why_it_is_off(monkeypatch, caplog, env, match):
    """Plugin load: an unknown ROUTEPACK_VERL, plugins disabled, or a bad ROUTEPACK_* setting is one warning naming it; verl's function stays."""
    from routepack_opt.integrations import _verl_env, verl_plugin

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(_verl_env, "_warned", set())
    old = verl_sb.rearrange_micro_batches
    with caplog.at_level("WARNING", logger="routepack_opt.integrations"):
        if "VERL_USE_EXTERNAL_PLUGINS" in env:
            verl_plugin.check_environment()  # verl never loads the plugin then
        else:
            verl_plugin._load()
            verl_plugin._load()
    assert verl_sb.rearrange_micro_batches is old
    assert sum(match in r.message for r in caplog.records) == 1


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
        # the plan's columns: rank d's chunk packs into exactly its planned micro-batches (joint
        # cost with routes), looked up without planning
        order = [j for part in gb.partitions for j in part]
        _, parts = rp_verl.rearrange_micro_batches(dp.batch[d * m:(d + 1) * m], cap)
        assert rp_verl.last_record().source == "driver"
        # in the group's run order (row r of every rank together), not re-sorted by the rank
        assert [sorted(order[d * m + i] for i in p) for p in parts] == list(map(sorted, gb.run_order()[d]))
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


def test_planning_failure_keeps_the_count_with_a_baseline(monkeypatch, caplog):
    """A planner error after the ranks agreed on the count: a valid length-only baseline at that count, one warning."""
    def boom(*a, **k):
        raise RuntimeError("boom")

    lens = [100, 300, 50, 400, 200, 250, 120, 80]
    batch = make_batch(lens, 400, routes=False)
    monkeypatch.setattr(rp_verl, "baseline_layouts", boom)
    with caplog.at_level("WARNING", logger="routepack_opt.integrations"):
        mbs, parts = rp_verl.rearrange_micro_batches(batch, 600)
    check_valid(batch, mbs, parts, 600)
    rec = rp_verl.last_record()
    assert "boom" in rec.fallback and rec.rows == len(parts)
    assert sum("boom" in r.message for r in caplog.records) == 1


def test_plugin_serves_verls_own_caller():
    """With the plugin active, verl's prepare_dynamic_batch calls ours with its keywords (the engine's caller needs peft, not installed)."""
    from verl import DataProto

    from routepack_opt.integrations import verl_plugin

    lens = [100, 300, 50, 400, 200, 250, 120, 80]
    batch = make_batch(lens, 400, routes=False)
    old = verl_sb.rearrange_micro_batches
    try:
        verl_plugin.activate(time_limit=1.0)
        rp_verl.pop_records()
        data = DataProto(batch=batch.clone(), non_tensor_batch={"uid": np.arange(8)})
        mbs, idx = verl_sb.prepare_dynamic_batch(data, max_token_len=600, num_batches_divided_by=2,
                                                 min_num_micro_batch=3)
        assert len(idx) % 2 == 0 and len(idx) >= 3 and sorted(i for p in idx for i in p) == list(range(8))
        assert all(sum(lens[i] for i in p) <= 600 for p in idx)
        assert all(mb.non_tensor_batch["uid"].tolist() == p for mb, p in zip(mbs, idx))
        assert len(rp_verl.pop_records()) == 1
    finally:
        verl_sb.rearrange_micro_batches = old


def _real_trainer_base():
    """verl's real RayPPOTrainer (its module needs the integrations extra's RayPPOTrainer deps)."""
    return pytest.importorskip("verl.trainer.ppo.ray_trainer", reason="RayPPOTrainer's dependencies "
                               "(the integrations extra) are not installed").RayPPOTrainer


def _counting(fn):
    """verl's own _balance_batch, noting each call on a trainer's batch (not RoutePack's scoring
    run of it on a lengths-only DataProto, which carries ``routepack_index``)."""
    def _balance_batch(self, batch, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
        if "routepack_index" not in batch.batch.keys():
            self.calls.append(keep_minibatch)
        return fn(self, batch, metrics, logging_prefix=logging_prefix, keep_minibatch=keep_minibatch)

    return _balance_batch


def _trainer_class(**attrs):
    """A subclass of verl's real RayPPOTrainer, built without its __init__ (no Ray workers):
    config, the worker group's dispatch info its own _get_dp_size reads; verl's own
    _balance_batch, its calls counted; _update_actor / _update_critic stubbed."""
    base = _real_trainer_base()

    class T(base):
        use_prefix_grouper = False
        use_reference_policy, use_critic = True, False
        _balance_batch = _counting(base._balance_batch)

        def __init__(self, mini=8, D=2, n=1, **actor):
            from omegaconf import OmegaConf

            self.config = OmegaConf.create({"actor_rollout_ref": {"actor": {"ppo_mini_batch_size": mini, **actor},
                                                                  "rollout": {"n": n}}})
            self.actor_rollout_wg = type("WG", (), {"_dispatch_info": {"actor": list(range(D))}})()
            self.calls = []

        def _update_actor(self, batch):
            return batch

        _update_critic = _update_actor

    for k, v in attrs.items():
        setattr(T, k, v)
    return T


@pytest.mark.parametrize("keep_minibatch", [False, True])
def test_install_balance_batch_keeps_verls_branches(keep_minibatch):
    """install_balance_batch: equal counts per rank (per mini-batch with keep_minibatch), verl's and our metrics, no worse than verl-kk."""
    from verl import DataProto

    cls = _trainer_class()
    own = cls._balance_batch
    old = rp_verl.install_balance_batch(cls, max_token_len=1000, max_sweeps=5, time_limit=None)
    assert old is own
    lens = [100, 300, 50, 400, 200, 250, 120, 80, 60, 90, 30, 10, 700, 20, 340, 150]
    data = DataProto(batch=make_batch(lens, 700, routes=False), non_tensor_batch={"uid": np.arange(16)})
    t, metrics = cls(), {}
    t._balance_batch(data, metrics, keep_minibatch=keep_minibatch)
    assert t.calls == []  # ours ran, not verl's
    order = data.non_tensor_batch["uid"].tolist()
    assert sorted(order) == list(range(16))
    chunks = [order[:8], order[8:]]  # the dispatch's equal chunks
    if keep_minibatch:  # every rank holds half of each mini-batch of 8
        assert all(sum(i < 8 for i in c) == 4 for c in chunks)
    assert any(k.startswith("global_seqlen/") for k in metrics)
    assert metrics["routepack/balance/predicted_ms"] <= metrics["routepack/balance/predicted_ms_theirs"] + 1e-9


def test_install_balance_batch_falls_back_for_prefix_grouper_and_bad_class():
    """use_prefix_grouper runs verl's own _balance_batch; a class without _balance_batch is one clear InputError."""
    from verl import DataProto

    cls = _trainer_class(use_prefix_grouper=True)
    rp_verl.install_balance_batch(cls, max_token_len=800, max_sweeps=5, time_limit=None)
    data = DataProto(batch=make_batch([5, 6, 7, 8], 8, routes=False), non_tensor_batch={"uid": np.arange(4)})
    t = cls()
    t._balance_batch(data, {})
    assert t.calls == [False]
    with pytest.raises(InputError, match="has no _balance_batch"):
        rp_verl.install_balance_batch(object, max_token_len=800)


def test_importing_the_drop_in_first_still_lets_the_plugin_activate(tmp_path):
    """ROUTEPACK_VERL=1: importing routepack's verl module before verl does not spoil the plugin (no circular half-import)."""
    import os
    import subprocess
    import sys

    code = ("import routepack_opt.integrations.verl as rp\n"
            "import verl.utils.seqlen_balancing as sb\n"
            "print('patched' if getattr(sb.rearrange_micro_batches, '__routepack__', False) else 'not patched')\n")
    env = dict(os.environ, ROUTEPACK_VERL="1", VERL_USE_EXTERNAL_PLUGINS="auto")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip().endswith("patched") and "not patched" not in p.stdout
    assert "did not activate" not in p.stderr


def test_balance_with_redundant_experts_carries_a_placement_megatron_takes():
    """balance_batch_partitions(redundant_experts=4) plans with replicas; GlobalBalance.replicas is the
    plan's Placement (phy2log, logcnt, even-local rule), Megatron's seam takes it, and the tokens
    each EP rank gets through remap_routing_replicated (each DP rank's micro-batch with its EP rank
    as source) equal the one evaluator's predicted loads. expert_map_from_batch(redundant_experts=)
    gives a Placement too; redundant_experts=0 plans exactly as before."""
    from routepack_opt.core.evaluate import replica_block_W
    from routepack_opt.core.placement import Placement
    from routepack_opt.integrations import megatron as rp_mg
    from routepack_opt.integrations.verl_balance import _global_window

    rng = np.random.default_rng(7)
    D, ep, E, La, red, cap = 4, 4, 8, 2, 4, 4096
    lens = [int(x) for x in np.clip(rng.lognormal(5.5, 0.7, 32), 16, 2000)]
    td = make_batch(lens, max(lens), E=E, La=La, seed=7)
    opts = dict(max_token_len=cap, num_experts=E, ep_size=ep, max_sweeps=20)
    gb = rp_verl.balance_batch_partitions(td, D, redundant_experts=red, **opts)
    pl = gb.replicas
    assert isinstance(pl, Placement) and pl.redundant == red and (pl.logcnt > 1).any()
    assert pl.phy2log.shape == (La, E + red) and pl.rule == "even-local"
    plan = gb.plan
    window = _global_window(np.array(lens), td, E, None)
    predicted = replica_block_W(window.counts, pl, plan.row, plan.slot, plan.rows, plan.topology)
    topo = plan.topology
    P, G = topo.ep, topo.num_shards
    q_D = np.empty(D, dtype=np.int64)
    q_D[topo.slots_of_shard()] = np.arange(P)[None, :]
    got = np.zeros_like(predicted)
    for d in range(D):
        for r, mb in enumerate(gb.micro_batches[d]):
            for l in range(La):
                # token rows carrying the window's per-expert counts of the micro-batch (the importer's routes)
                c_E = window.counts[mb, l].sum(axis=0)
                rmap = torch.arange(int(c_E.max()))[:, None] < torch.as_tensor(c_E)[None, :]
                _, rmap_TS = rp_mg.remap_routing_replicated(rmap.double(), rmap, pl, int(q_D[d]), layer=l)
                got[r * G + topo.shard_array()[d], l * P:(l + 1) * P] += \
                    rp_mg.rank_token_counts(rmap_TS.long(), P).numpy()
    np.testing.assert_array_equal(got, predicted)

    class Layer:
        def route(self, hidden):
            return None

    rp_mg.apply_expert_placement(Layer(), pl, layer=0, source_rank=0, num_logical_experts=E).remove()
    m = rp_verl.expert_map_from_batch(td, E, ep, redundant_experts=red)
    assert isinstance(m, Placement) and m.redundant == red and m.ep == ep
    plain = rp_verl.balance_batch_partitions(td, D, **opts)
    zero = rp_verl.balance_batch_partitions(td, D, redundant_experts=0, **opts)
    assert plain.replicas is None and zero.replicas is None
    assert plain.partitions == zero.partitions and plain.micro_batches == zero.micro_batches
    assert np.array_equal(plain.plan.placement, zero.plan.placement)
    assert np.array_equal(rp_verl.expert_map_from_batch(td, E, ep), rp_verl.expert_map_from_batch(td, E, ep,
                                                                                                 redundant_experts=0))
    with pytest.raises(InputError, match="redundant_experts needs routed_experts"):
        rp_verl.balance_batch_partitions(td, D, max_token_len=cap, redundant_experts=2)
    with pytest.raises(InputError, match="not divisible by ep=4"):
        rp_verl.expert_map_from_batch(td, E, ep, redundant_experts=3)
    with pytest.raises(InputError, match="redundant_experts: expected an integer"):
        rp_verl.expert_map_from_batch(td, E, ep, redundant_experts=-1)


# --- The driver's plan on the ranks (issue 29: plan once where verl balances) ------------------


def _driver_step(lens, D=2, mini=4, n=2, cap=2048, seed=0):
    """A DataProto balanced by the installed _balance_batch (mini-batches of mini·n samples),
    then cut the way verl 0.9.1's workers cut it: to_tensordict, left_right_2_no_padding, the
    dispatch's equal chunks, the actor's mini-batch iterator (shuffle off). Returns the planned
    mini-batches per rank and each sample's original id (column ``sid``)."""
    from verl import DataProto
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    td = make_batch(lens, max(lens), routes=False, seed=seed)
    td["response_mask"] = td["attention_mask"].clone()
    td["sid"] = torch.arange(len(lens))
    cls = _trainer_class()
    rp_verl.install_balance_batch(cls, max_token_len=cap, max_sweeps=5, time_limit=None, seed=seed)
    t = cls(mini=mini, D=D, n=n)
    data = DataProto(batch=td, non_tensor_batch={"uid": np.arange(len(lens))})
    metrics = {}
    t._balance_batch(data, metrics)
    assert t.calls == [] and metrics["routepack/balance/driver_plan"] == 0.0
    chunks = tu.chunk_tensordict(left_right_2_no_padding(data.to_tensordict()), D)
    per_gpu = mini * n // D
    _driver_step.last = data  # the driver's batch, its plan columns written
    return [list(tu.make_iterator(c, mini_batch_size=per_gpu, epochs=1, seed=42 + d,
                                  dataloader_kwargs={"shuffle": False})) for d, c in enumerate(chunks)]


def test_driver_plan_reaches_the_ranks_through_verls_worker_path():
    """Each rank's rearrange_micro_batches on verl's own mini-batches returns exactly the driver's
    planned micro-batches (same sample sets as the plan columns the driver wrote, in the driver's
    run order, so row r of every rank runs together), without planning: source "driver",
    driver_plan metric 1, valid for restore_dynamic_batch."""
    rng = np.random.default_rng(11)
    lens = [int(x) for x in np.clip(rng.lognormal(6.0, 0.8, 32), 16, 1500)]
    D, mini, n, cap = 2, 4, 2, 2048
    ranks = _driver_step(lens, D, mini, n, cap)
    drv = _driver_step.last.batch
    sid, pid, mbn = (drv[k].numpy() for k in ("sid", "routepack_plan", "routepack_micro_batch"))
    per_rank = len(lens) // D
    for k in range(len(lens) // (mini * n)):
        for d in range(D):
            mb = ranks[d][k]
            rp_verl.pop_records()
            micro, parts = rp_verl.rearrange_micro_batches(mb, cap)
            (rec,) = rp_verl.pop_records()
            assert rec.source == "driver" and rec.fallback is None
            assert rec.metrics()["routepack/driver_plan"] == 1.0 and rec.rows == len(parts)
            # the driver's micro-batches of this rank's mini-batch, in the driver's run order
            chunk = slice(d * per_rank, (d + 1) * per_rank)
            here = np.isin(sid[chunk], mb["sid"].numpy())
            assert len(set(pid[chunk][here])) == 1
            want = [sorted(sid[chunk][here & (mbn[chunk] == j)].tolist()) for j in range(len(parts))]
            assert [sorted(mb["sid"][i].item() for i in p) for p in parts] == want
            assert sorted(i for p in parts for i in p) == list(range(len(mb["sid"])))
            for m, p in zip(micro, parts):
                assert m["sid"].tolist() == [mb["sid"][i].item() for i in p]
            out = torch.cat([m["sid"].float() for m in micro])
            assert torch.equal(verl_sb.restore_dynamic_batch(out, parts), mb["sid"].float())


def test_driver_plan_not_used_for_a_pass_over_several_mini_batches_or_another_cap(caplog):
    """A log-prob pass over a rank's whole chunk (several planned mini-batches) or at another cap is
    a different packing problem: planned on the rank, no warning."""
    from verl.utils import tensordict_utils as tu

    lens = [int(x) for x in np.clip(np.random.default_rng(3).lognormal(6.0, 0.8, 16), 16, 1500)]
    ranks = _driver_step(lens, mini=4, n=2, cap=2048)
    whole = tu.concat_tensordict(ranks[0])
    with caplog.at_level("WARNING", logger="routepack_opt.integrations"):
        for batch, cap in ((whole, 2048), (ranks[0][0], 4096)):
            _, parts = rp_verl.rearrange_micro_batches(batch, cap)
            assert rp_verl.last_record().source == "plan"
            assert sorted(i for p in parts for i in p) == list(range(len(batch["sid"])))
    assert not [r for r in caplog.records if "driver" in r.message]


def _with_plan(batch, mbs, cap):
    """``batch`` with the plan columns of one rank's micro-batches ``mbs``."""
    batch = batch.clone()
    for key, col in rp_verl.plan_columns([[mbs]], len(batch["attention_mask"]), cap).items():
        batch[key] = torch.from_numpy(col)
    return batch


def test_corrupted_driver_plan_falls_back_to_planning_with_one_warning(monkeypatch, caplog):
    """Columns that are not whole micro-batches within verl's rules (a sample missing, a
    micro-batch over the cap, a forced group split, a count off num_batches_divided_by): the rank
    plans as before, one warning per cause over repeated calls, never a crash; whole ones are used."""
    from routepack_opt.integrations import _seam

    monkeypatch.setattr(_seam, "_warned", set())
    lens, cap = [900, 50, 700, 600, 100, 800], 1600
    batch = make_batch(lens, 900, routes=False)
    good = _with_plan(batch, [[0, 4], [1, 5], [2, 3]], cap)  # splits the forced pairs (0, 1) and (4, 5)
    missing = good[[0, 1, 2, 3, 4]]  # sample 5 dropped: micro-batch [1, 5] incomplete
    over = _with_plan(batch, [[0, 5], [1, 2, 3, 4]], cap)  # 1,700 tokens in micro-batch 0
    cases = [(missing, {}, "is incomplete"), (over, {}, "over max_token_len"),
             (good, {"force_group_size": 2}, "splits a forced group"),
             (good, {"num_batches_divided_by": 2}, "not a multiple of 2")]
    with caplog.at_level("WARNING", logger="routepack_opt.integrations"):
        for _ in range(2):
            for b, kw, _ in cases:
                mbs, parts = rp_verl.rearrange_micro_batches(b, cap, **kw)
                assert rp_verl.last_record().source == "plan"
                check_valid(b, mbs, parts, cap)
            _, parts = rp_verl.rearrange_micro_batches(good, cap)
            assert rp_verl.last_record().source == "driver"
            assert sorted(map(sorted, parts)) == [[0, 4], [1, 5], [2, 3]]
    msgs = [r.message for r in caplog.records]
    for _, _, cause in cases:
        assert sum(cause in m for m in msgs) == 1, cause


def _driver_dist_worker(rank, world, init_file, result_file, drop_on_rank):
    import torch.distributed as dist

    from routepack_opt.integrations import verl as rp

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    lens = [int(x) for x in np.clip(np.random.default_rng(9).lognormal(6.0, 0.8, 16), 16, 1500)]
    mb = _driver_step(lens, D=world, mini=8, n=1, cap=2048)[rank][0]
    if rank == drop_on_rank:
        for key in rp.PLAN_COLUMNS:
            del mb[key]
    import logging

    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: seen.append(r.getMessage())  # type: ignore[method-assign]
    logging.getLogger("routepack_opt.integrations").addHandler(handler)
    _, parts = rp.rearrange_micro_batches(mb, 2048, dp_group=dist.group.WORLD)
    peer = int(any("another DP rank cannot use the driver's plan" in m for m in seen))
    with open(f"{result_file}.{rank}", "w") as fh:
        fh.write(f"{rp.last_record().source} {len(parts)} {peer}")
    dist.destroy_process_group()


@pytest.mark.parametrize("drop_on_rank", [-1, 1])
def test_dp_group_agrees_on_the_driver_plan(tmp_path, drop_on_rank):
    """2 gloo ranks: both use the driver's plan (same count); when one rank lacks the columns both
    plan (same collectives, agreed count) and the rank that had its plan says why, once."""
    spawn_ranks(_driver_dist_worker, args=(2, str(tmp_path / "init"), str(tmp_path / "res"), drop_on_rank),
                nprocs=2)
    got = [(tmp_path / f"res.{r}").read_text().split() for r in range(2)]
    assert got[0][1] == got[1][1]
    assert [g[0] for g in got] == (["driver", "driver"] if drop_on_rank < 0 else ["plan", "plan"])
    assert [g[2] for g in got] == (["0", "0"] if drop_on_rank < 0 else ["1", "0"])


# --- One budget per step, a true record, replicas to the workers, overlap (issue 38) -------------


def _installed(mini=8, D=2, **kw):
    cls = _trainer_class()
    rp_verl.install_balance_batch(cls, **kw)
    return cls, cls(mini=mini, D=D)


def test_balance_record_counts_every_mini_batch_and_verls_own_rows():
    """rows = micro-batches one rank runs over the step (summed over the mini-batches), rows_theirs
    = verl's own path run (verl_step_layout on the real RayPPOTrainer._balance_batch); the wall
    time splits into import / plan / apply; the forward passes are in both predictions."""
    from routepack_opt.integrations.verl_balance import VerlStepConfig, verl_step_layout

    rng = np.random.default_rng(3)
    lens = [int(x) for x in np.clip(rng.lognormal(6.0, 0.9, 32), 16, 900)]
    D, mini, cap = 2, 8, 1000
    cls, t = _installed(mini=mini, D=D, max_token_len=cap, max_sweeps=5, time_limit=None)
    from verl import DataProto

    data = DataProto(batch=make_batch(lens, max(lens), routes=False), non_tensor_batch={"uid": np.arange(32)})
    metrics = {}
    t._balance_batch(data, metrics)
    rec = rp_verl.last_record()
    mbs = data.batch["routepack_micro_batch"].numpy()
    plan = data.batch["routepack_plan"].numpy()
    # rank 0's chunk: micro-batches per plan, summed
    chunk = slice(0, 16)
    per_rank = sum(len(set(mbs[chunk][plan[chunk] == p])) for p in np.unique(plan[chunk]))
    assert rec.rows == per_rank == metrics["routepack/balance/rows"]
    theirs = verl_step_layout(np.array(lens), D, VerlStepConfig.from_trainer(t), max_token_len=cap,
                              balance_fn=_real_trainer_base()._balance_batch, trainer=t)
    assert theirs.source == "verl" and rec.rows_theirs == theirs.rows and rec.theirs_source == "verl"
    assert rec.import_s >= 0 and rec.plan_s > 0 and rec.apply_s > 0
    assert rec.import_s + rec.plan_s + rec.apply_s <= rec.planning_s + 1e-6
    assert rec.quick is None or rec.applied == "verl"
    assert rec.budget_s is None
    assert 0 < rec.forward_us < rec.predicted_us and 0 < rec.forward_us_theirs < rec.predicted_us_theirs
    assert metrics["routepack/balance/net_saving_ms"] == pytest.approx(
        metrics["routepack/balance/saving_ms"] - metrics["routepack/balance/added_ms"])


def _verls_real_step(t, data, keep: bool, cap: int, D: int):
    """What verl 0.9.1 runs, by its own code on the real batch: RayPPOTrainer._balance_batch, the
    dispatch's chunks of the worker's tensordict, the actor's mini-batch iterator, then per rank
    rearrange_micro_batches (``use_dynamic_bsz``) at the count the ranks agree on (the least count
    from verl's own start at which every rank's call returns that count, as its all-reduces find
    it) or its micro_batch_size_per_gpu chunks. Returns (uid order, [k][d] micro-batches as uid lists)."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    _real_trainer_base()._balance_batch(t, data, {}, keep_minibatch=keep)
    order = data.non_tensor_batch["uid"].tolist()
    td = data.to_tensordict()
    td["uid_col"] = torch.as_tensor(order)
    td["response_mask"] = td["attention_mask"].clone()
    actor = t.config.actor_rollout_ref.actor
    per_gpu = actor.ppo_mini_batch_size * t.config.actor_rollout_ref.rollout.n // D
    iters = [list(tu.make_iterator(c, mini_batch_size=per_gpu, epochs=1, seed=42 + d,
                                   dataloader_kwargs={"shuffle": False}))
             for d, c in enumerate(tu.chunk_tensordict(left_right_2_no_padding(td), D))]
    out = []
    for k in range(len(iters[0])):
        mbs = [iters[d][k] for d in range(D)]
        if not actor.get("use_dynamic_bsz", True):
            b = actor.ppo_micro_batch_size_per_gpu
            out.append([[c["uid_col"].tolist() for c in tu.chunk_tensordict(mb, per_gpu // b)] for mb in mbs])
            continue
        K = max(len(verl_sb.rearrange_micro_batches(mb, cap)[1]) for mb in mbs)
        while True:
            got = [verl_sb.rearrange_micro_batches(mb, cap, min_num_micro_batch=K)[1] for mb in mbs]
            if all(len(g) == K for g in got):
                break
            K = max(len(g) for g in got)
        out.append([[mb["uid_col"][p].tolist() for p in g] for mb, g in zip(mbs, got)])
    return order, out


@pytest.mark.parametrize("config", [
    dict(keep=False, mini=4, n=2), dict(keep=True, mini=8, n=1), dict(keep=False, mini=2, n=4),
    dict(keep=False, mini=4, n=2, use_dynamic_bsz=False, ppo_micro_batch_size_per_gpu=2)],
    ids=["default", "keep_minibatch", "rollout_n4", "fixed_micro_batches"])
def test_issue49_item1_theirs_is_verls_own_output(config):
    """Issue 49 item 1: in every configuration (verl's default path, keep_minibatch, rollout.n,
    use_dynamic_bsz off) the seam's "theirs" is the layout verl's own code gives the real batch
    (the real RayPPOTrainer._balance_batch on a real DataProto, the actor's slices, verl's
    rearrange_micro_batches): the same order, mini-batches and micro-batches, and rows_theirs."""
    from verl import DataProto

    from routepack_opt.integrations.verl_balance import VerlStepConfig, verl_step_layout

    rng = np.random.default_rng(21)
    lens = [int(x) for x in np.clip(rng.lognormal(6.2, 0.8, 32), 16, 1500)]
    D, cap = 2, 1600
    extra = {k: v for k, v in config.items() if k not in ("keep", "mini", "n")}
    t = _trainer_class()(mini=config["mini"], D=D, n=config["n"], **extra)
    data = DataProto(batch=make_batch(lens, max(lens), routes=False), non_tensor_batch={"uid": np.arange(32)})
    order, want = _verls_real_step(t, data, config["keep"], cap, D)
    got = verl_step_layout(np.array(lens), D, VerlStepConfig.from_trainer(t, config["keep"]), max_token_len=cap,
                           balance_fn=_real_trainer_base()._balance_batch, trainer=t)
    assert got.source == "verl"
    assert got.perm.tolist() == order
    assert got.plans == want
    assert got.rows == sum(len(p[0]) for p in want)
    # the installed seam records that same path as theirs
    cls, t2 = _trainer_class(), None
    rp_verl.install_balance_batch(cls, max_token_len=cap, max_sweeps=3, time_limit=None)
    t2 = cls(mini=config["mini"], D=D, n=config["n"], **extra)
    data = DataProto(batch=make_batch(lens, max(lens), routes=False), non_tensor_batch={"uid": np.arange(32)})
    t2._balance_batch(data, {}, keep_minibatch=config["keep"])
    rec = rp_verl.last_record()
    assert rec.rows_theirs == got.rows and rec.predicted_us <= rec.predicted_us_theirs


def test_issue49_item3_verls_layout_stands_unless_ours_scores_better():
    """Issue 49 item 3: the seam applies ours only when the evaluator scores the whole step
    (update + forward passes) better; otherwise verl's own layout is applied as verl orders it
    (the same batch order as verl's own call) and the record says so (applied_theirs 1, saving 0)."""
    from verl import DataProto

    rng = np.random.default_rng(5)
    lens = [int(x) for x in np.clip(rng.lognormal(6.0, 0.9, 32), 16, 900)]
    batch = make_batch(lens, max(lens), routes=False)
    t_own = _trainer_class()(mini=8, D=2)
    own = DataProto(batch=batch.clone(), non_tensor_batch={"uid": np.arange(32)})
    t_own._balance_batch(own, {})
    # a budget under the quick path's floor: verl's layout stands
    cls, t = _installed(mini=8, D=2, max_token_len=1000, time_limit=1e-6)
    data = DataProto(batch=batch.clone(), non_tensor_batch={"uid": np.arange(32)})
    metrics = {}
    t._balance_batch(data, metrics)
    rec = rp_verl.last_record()
    assert rec.applied == "verl" and metrics["routepack/balance/applied_theirs"] == 1.0
    assert rec.predicted_us == rec.predicted_us_theirs and rec.saving_us == 0.0
    assert "verl's own layout applied" in rec.quick
    m = 16  # the same samples on every rank as verl's own call, in the same mini-batches
    got, ref = data.non_tensor_batch["uid"].tolist(), own.non_tensor_batch["uid"].tolist()
    for d in range(2):
        for k in range(2):
            assert sorted(got[d * m + 8 * k:d * m + 8 * k + 8]) == sorted(ref[d * m + 8 * k:d * m + 8 * k + 8])
    assert metrics["global_seqlen/balanced_max"] == metrics["routepack/balance/global_seqlen_balanced_max_theirs"]


def test_issue49_item4_forward_passes_counted_in_the_choice(monkeypatch):
    """Issue 49 item 4: the forward-only passes are part of the predicted step (recorded apart);
    a plan whose DP split makes them slower by more than its update saves is not taken."""
    from verl import DataProto

    from routepack_opt.integrations import verl_balance

    rng = np.random.default_rng(8)
    lens = [int(x) for x in np.clip(rng.lognormal(6.0, 0.9, 32), 16, 900)]
    batch = make_batch(lens, max(lens))
    kw = dict(mini=8, D=2, max_token_len=1000, num_experts=8, ep_size=2, max_sweeps=5, time_limit=None)
    cls, t = _installed(**kw)
    t._balance_batch(DataProto(batch=batch.clone(), non_tensor_batch={"uid": np.arange(32)}), {})
    base = rp_verl.last_record()
    assert base.applied == "routepack" and base.forward_us > 0 and base.forward_us_theirs > 0
    real = verl_balance.forward_us
    seen = []

    def costly_unless_verls(window, rank_N, *a, **k):  # verl's split (scored first) as it is, any other 1e12 µs
        seen.append(np.asarray(rank_N).copy())
        return real(window, rank_N, *a, **k) if np.array_equal(rank_N, seen[0]) else 1e12

    monkeypatch.setattr(verl_balance, "forward_us", costly_unless_verls)
    cls, t = _installed(**kw)
    t._balance_batch(DataProto(batch=batch.clone(), non_tensor_batch={"uid": np.arange(32)}), {})
    rec = rp_verl.last_record()
    assert len(seen) == 2 and not np.array_equal(seen[0], seen[1])
    assert rec.applied == "verl" and rec.predicted_us == rec.predicted_us_theirs


def test_short_budget_takes_the_quick_path_and_says_so():
    """A budget too short for the search: every mini-batch takes the quick path (still valid, under
    the cap, equal counts), the record says why."""
    from verl import DataProto

    rng = np.random.default_rng(4)
    lens = [int(x) for x in np.clip(rng.lognormal(6.0, 0.9, 32), 16, 900)]
    cls, t = _installed(mini=8, D=2, max_token_len=1000, time_limit=1e-6)
    data = DataProto(batch=make_batch(lens, max(lens), routes=False), non_tensor_batch={"uid": np.arange(32)})
    metrics = {}
    t._balance_batch(data, metrics)
    rec = rp_verl.last_record()
    assert rec.quick is not None and rec.quick.startswith("budget")
    assert metrics["routepack/balance/quick"] == 1.0 and rec.budget_s == pytest.approx(1e-6)
    assert rec.applied == "verl"  # under the quick path's floor: verl's own layout, no greedy run
    order = data.non_tensor_batch["uid"].tolist()
    assert sorted(order) == list(range(32))
    mb = data.batch["routepack_micro_batch"].numpy()
    plan = data.batch["routepack_plan"].numpy()
    for d in range(2):
        sl = slice(16 * d, 16 * d + 16)
        for p in np.unique(plan[sl]):
            for r in np.unique(mb[sl][plan[sl] == p]):
                assert sum(lens[i] for i, keep in zip(order[sl], (plan[sl] == p) & (mb[sl] == r)) if keep) <= 1000


def test_default_budget_is_sized_from_the_predicted_gain(monkeypatch):
    """Without a set limit the step's budget is at most SHARE_OF_GAIN of its predicted gain."""
    from routepack_opt.integrations._seam import SHARE_OF_GAIN, seam_settings

    monkeypatch.delenv("ROUTEPACK_TIME_LIMIT", raising=False)
    st = seam_settings("verl_balance")
    assert st.time_limit_is_default
    assert st.gain_time_limit(100_000.0) == pytest.approx(min(2.0, SHARE_OF_GAIN * 0.1))
    assert st.gain_time_limit(1e9) == 2.0
    assert seam_settings("verl_balance", time_limit=0.1).gain_time_limit(10.0) == 0.1


def test_redundant_experts_reach_the_workers_through_verls_dispatch():
    """install_balance_batch(redundant_experts=N) plans replicas; each mini-batch's Placement rides
    in meta_info to every rank's chunk (verl's to_tensordict + chunk_tensordict, as _update_actor
    and the dispatch send it) and the record says N."""
    from verl import DataProto
    from verl.utils import tensordict_utils as tu

    from routepack_opt.core.placement import Placement

    rng = np.random.default_rng(5)
    lens = [int(x) for x in np.clip(rng.lognormal(5.0, 0.7, 16), 8, 300)]
    cls, t = _installed(mini=8, D=2, max_token_len=1000, num_experts=8, ep_size=2, redundant_experts=2,
                        max_sweeps=5, time_limit=None)
    data = DataProto(batch=make_batch(lens, max(lens)), non_tensor_batch={"uid": np.arange(16)})
    metrics = {}
    t._balance_batch(data, metrics)
    assert metrics["routepack/balance/redundant_experts"] == 2.0
    pls = rp_verl.placements_from_batch(data)
    assert len(pls) == 2 and all(isinstance(p, Placement) and p.phy2log.shape == (2, 10) for p in pls)
    for chunk in tu.chunk_tensordict(data.to_tensordict(), 2):
        got = rp_verl.placements_from_batch(chunk)
        assert [p.phy2log.tolist() for p in got] == [p.phy2log.tolist() for p in pls]
    with pytest.raises(InputError, match="redundant_experts needs num_experts"):
        rp_verl.install_balance_batch(_trainer_class(), max_token_len=1000, redundant_experts=2)


@pytest.mark.parametrize("mode", [True, "deferred"])
def test_overlap_mode_plans_behind_the_log_prob_passes(mode):
    """overlap=True: _balance_batch reorders by the quick plan at once and returns ("deferred":
    leaves the order); the first _update_actor waits for the background plan, applies it and
    records what the step waited for, not the planning time."""
    from verl import DataProto

    calls = []

    class Tr(_trainer_class()):
        def _update_actor(self, batch):
            calls.append(batch.batch["routepack_micro_batch"].clone())
            return batch

    rng = np.random.default_rng(6)
    lens = [int(x) for x in np.clip(rng.lognormal(6.0, 0.9, 32), 16, 900)]
    Tr.__name__ = "Tr"
    rp_verl.install_balance_batch(Tr, max_token_len=1000, max_sweeps=5, time_limit=None, overlap=mode)
    t = Tr(mini=8)
    data = DataProto(batch=make_batch(lens, max(lens), routes=False), non_tensor_batch={"uid": np.arange(32)})
    metrics = {}
    t._balance_batch(data, metrics)
    assert "routepack_micro_batch" not in data.batch.keys()
    assert any(k.startswith("global_seqlen/") for k in metrics) == (mode is True)
    if mode == "deferred":
        assert data.non_tensor_batch["uid"].tolist() == list(range(32))
    rp_verl.pop_records()
    t._update_actor(data)
    (rec,) = rp_verl.pop_records()
    assert len(calls) == 1 and not rec.on_critical_path and any(k.startswith("global_seqlen/") for k in metrics)
    assert metrics["routepack/balance/wait_ms"] >= 0 and rec.added_s <= rec.planning_s
    order = data.non_tensor_batch["uid"].tolist()
    assert sorted(order) == list(range(32))
    assert all(data.batch["attention_mask"][j].sum().item() == lens[i] for j, i in enumerate(order))
    t._update_actor(data)  # nothing pending: passes through
    assert len(calls) == 2 and rp_verl.pop_records() == []
    with pytest.raises(InputError, match="overlap: expected"):
        rp_verl.install_balance_batch(_trainer_class(), max_token_len=1000, overlap="later")


def test_balance_plans_from_the_rollout_hooks_counts_without_routes():
    """A batch carrying the rollout hook's per-sample counts (non_tensor_batch[COUNTS_KEY]) and no
    routed_experts is planned on those counts: the same plan as from the routes (import_ms is only
    the stack), and no route is read; counts of the wrong expert count fall back to verl's own."""
    from verl import DataProto

    from routepack_opt.integrations.replay import import_replay
    from routepack_opt.integrations.rollout_hook import COUNTS_KEY

    rng = np.random.default_rng(6)
    lens = [int(x) for x in np.clip(rng.lognormal(5.0, 0.7, 16), 8, 300)]
    td = make_batch(lens, max(lens))
    counts = import_replay(td["routed_experts"], format="verl", num_experts=8,
                           attention_mask=td["attention_mask"]).window.counts
    kw = dict(mini=8, D=2, max_token_len=1000, num_experts=8, ep_size=2, max_sweeps=5, time_limit=None)
    orders = []
    for with_routes in (True, False):
        cls, t = _installed(**kw)
        batch = td.clone()
        ntb = {"uid": np.arange(16)}
        if not with_routes:
            del batch["routed_experts"]
            col = np.empty(16, dtype=object)
            col[:] = [counts[i] for i in range(16)]
            ntb[COUNTS_KEY] = col
        data = DataProto(batch=batch, non_tensor_batch=ntb)
        t._balance_batch(data, {})
        orders.append((data.non_tensor_batch["uid"].tolist(), data.batch["routepack_micro_batch"].tolist()))
    assert orders[0] == orders[1]
    # counts of another expert count: the plan fails, verl's own _balance_batch runs
    cls, t = _installed(**{**kw, "num_experts": 16})
    batch = td.clone()
    del batch["routed_experts"]
    col = np.empty(16, dtype=object)
    col[:] = [counts[i] for i in range(16)]
    data = DataProto(batch=batch, non_tensor_batch={"uid": np.arange(16), COUNTS_KEY: col})
    t._balance_batch(data, {})
    assert t.calls == [False]


def test_issue49_item1_rank_side_theirs_is_verls_own_count():
    """Issue 49 item 1 (rank side): the drop-in's rows_theirs is what verl's own
    rearrange_micro_batches returns on the same batch (run, not re-implemented), said in
    theirs_source; verl_rank_micro_batches replays the ranks' agreed count on verl's function."""
    from routepack_opt.heuristics.frameworks import verl_rank_micro_batches

    rng = np.random.default_rng(12)
    lens = [int(x) for x in np.clip(rng.lognormal(6.0, 0.9, 24), 16, 1200)]
    batch = make_batch(lens, max(lens), routes=False)
    _, theirs = rp_verl.verl_own()(batch, 1300, num_batches_divided_by=2)
    rp_verl.rearrange_micro_batches(batch, 1300, num_batches_divided_by=2)
    rec = rp_verl.last_record()
    assert rec.theirs_source == "verl" and rec.rows_theirs == len(theirs)
    halves = [np.array(lens[:12]), np.array(lens[12:])]
    parts, src = verl_rank_micro_batches(halves, 1300, row_multiple=2)
    K = len(parts[0])
    assert src == "verl" and all(len(p) == K for p in parts) and K % 2 == 0
    for x, p in zip(halves, parts):  # each rank: verl's own call at the agreed count, the same micro-batches
        td = make_batch(x.tolist(), int(x.max()), routes=False)
        assert rp_verl.verl_own()(td, 1300, num_batches_divided_by=2, min_num_micro_batch=K)[1] == p
    assert K >= max(len(rp_verl.verl_own()(make_batch(x.tolist(), int(x.max()), routes=False), 1300,
                                            num_batches_divided_by=2)[1]) for x in halves)


def test_issue49_item5_budget_under_the_floor_runs_verls_own_call():
    """Issue 49 item 5: once a step has measured the call's floor (verl's rank side, the
    scorings), a budget under it runs verl's own _balance_batch without planning (added_ms 0, the
    record says why), so the seam costs what verl's call costs."""
    from verl import DataProto

    rng = np.random.default_rng(9)
    lens = [int(x) for x in np.clip(rng.lognormal(6.0, 0.9, 32), 16, 900)]
    batch = make_batch(lens, max(lens), routes=False)
    cls, t = _installed(mini=8, D=2, max_token_len=1000, time_limit=1e-6)
    t._balance_batch(DataProto(batch=batch.clone(), non_tensor_batch={"uid": np.arange(32)}), {})
    assert t.calls == [] and rp_verl.last_record().applied == "verl"  # planned: the floor measured
    data, metrics = DataProto(batch=batch.clone(), non_tensor_batch={"uid": np.arange(32)}), {}
    t._balance_batch(data, metrics)
    rec = rp_verl.last_record()
    assert t.calls == [False] and "under the call's floor" in rec.fallback and rec.added_s == 0.0
    assert metrics["routepack/balance/fallback"] == 1.0 and "global_seqlen/balanced_max" in metrics
    own = DataProto(batch=batch.clone(), non_tensor_batch={"uid": np.arange(32)})
    _real_trainer_base()._balance_batch(t, own, {})
    assert data.non_tensor_batch["uid"].tolist() == own.non_tensor_batch["uid"].tolist()

"""slime seam: routepack's build_dp_schedule keeps slime's return contract and every invariant slime's
own tests (tests/test_dp_schedule.py in THUDM/slime) assert. slime is not on PyPI, so these run the
same scenarios against ours instead of importing slime."""

from types import SimpleNamespace

import numpy as np
import pytest

from routepack_opt.core.errors import InputError
from routepack_opt.integrations import slime as rp_slime
from routepack_opt.integrations.slime import build_dp_schedule, plan_dp_schedule

SWEEPS = dict(max_sweeps=20)


def make_args(max_tokens_per_gpu=10, dynamic=True, **kw):
    return SimpleNamespace(micro_batch_size=1, use_dynamic_batch_size=dynamic,
                           max_tokens_per_gpu=max_tokens_per_gpu, balance_data=False,
                           balance_by_flops=False, **kw)


def make_tp(dp_size=1, cp_size=1, vpp_size=1, mb_group=1):
    return {"dp_size": dp_size, "cp_size": cp_size, "vpp_size": vpp_size,
            "microbatch_group_size_per_vp_stage": mb_group}


def assert_invariants(partitions, mbi, nmb, *, dp_size, expected, total_lengths, max_per_bin):
    """slime's documented invariants, checked the way its tests check them."""
    seen = set()
    for r in range(dp_size):
        assert len(mbi[r]) == sum(nmb), f"rank {r}: mbs count mismatch"
        assert [i for mbs in mbi[r] for i in mbs] == list(range(len(partitions[r])))
        assert seen.isdisjoint(partitions[r])
        seen.update(partitions[r])
        assert all(len(mbs) >= 1 for mbs in mbi[r]), "empty micro-batch"
        for mbs in mbi[r]:
            tot = sum(total_lengths[partitions[r][i]] for i in mbs)
            if tot > max_per_bin:
                assert len(mbs) == 1, f"mbs of {tot} tokens > {max_per_bin} holds {len(mbs)} samples"
    assert seen == set(expected)


def test_dynamic_uniform():
    """Uniform lengths, dp=2: the cap holds and every sample is placed once."""
    tl = [5] * 8
    p, m, n, g = build_dp_schedule(make_args(10), make_tp(2), tl, global_batch_size=8,
                                   rollout_indices=list(range(8)), **SWEEPS)
    assert g == [8]
    assert_invariants(p, m, n, dp_size=2, expected=range(8), total_lengths=tl, max_per_bin=10)


def test_oversized_sample_lands_alone():
    """A sample longer than max_tokens_per_gpu·cp_size is alone in its micro-batch (slime's rule)."""
    tl = [15, 3, 3, 3, 3, 3, 3, 3]
    sched = plan_dp_schedule(make_args(10), make_tp(2), tl, global_batch_size=8,
                             rollout_indices=list(range(8)), **SWEEPS)
    p, m, n, _ = sched.as_slime()
    assert_invariants(p, m, n, dp_size=2, expected=range(8), total_lengths=tl, max_per_bin=10)
    r = next(r for r in range(2) if 0 in p[r])
    local = p[r].index(0)
    assert [mbs for mbs in m[r] if local in mbs] == [[local]]
    assert sched.reports[0]["oversize_samples"] == [0]


def test_cp_size_scales_the_cap():
    """The cap is max_tokens_per_gpu · cp_size."""
    tl = [7] * 8
    p, m, n, _ = build_dp_schedule(make_args(5), make_tp(2, cp_size=2), tl, global_batch_size=8,
                                   rollout_indices=list(range(8)), **SWEEPS)
    assert_invariants(p, m, n, dp_size=2, expected=range(8), total_lengths=tl, max_per_bin=10)
    assert all(len(mbs) == 1 for r in range(2) for mbs in m[r])


def test_vpp_rounds_to_mb_group():
    """With vpp_size > 1 the per-rank micro-batch count is a multiple of microbatch_group_size_per_vp_stage."""
    tl = [4] * 32
    p, m, n, _ = build_dp_schedule(make_args(8), make_tp(2, vpp_size=2, mb_group=3), tl,
                                   global_batch_size=16, rollout_indices=list(range(32)), **SWEEPS)
    assert n and all(k % 3 == 0 for k in n)
    assert_invariants(p, m, n, dp_size=2, expected=range(32), total_lengths=tl, max_per_bin=8)


def test_rollout_grouping_keeps_samples_together():
    """A rollout's samples (compact/subagent) stay in one step."""
    ri = [0, 0, 0, 1, 1, 2, 2, 2, 2]
    tl = [3] * 9
    p, m, n, g = build_dp_schedule(make_args(12), make_tp(1), tl, global_batch_size=1, rollout_indices=ri, **SWEEPS)
    assert g == [1, 1, 1]
    cursor, expect = 0, [[0, 1, 2], [3, 4], [5, 6, 7, 8]]
    for s, k in enumerate(n):
        locs = sorted(j for mbs in m[0][cursor:cursor + k] for j in mbs)
        assert sorted(p[0][j] for j in locs) == expect[s]
        cursor += k
    assert_invariants(p, m, n, dp_size=1, expected=range(9), total_lengths=tl, max_per_bin=12)


def test_trims_trailing_rollouts_and_reports_them():
    """Trailing rollouts that do not fill a step are dropped (as slime does) and reported."""
    ri = [0, 0, 1, 2, 2, 3, 4, 4]
    tl = [3] * 8
    sched = plan_dp_schedule(make_args(12), make_tp(1), tl, global_batch_size=2, rollout_indices=ri, **SWEEPS)
    p, m, n, g = sched.as_slime()
    assert g == [2, 2]
    assert sched.dropped_samples == [6, 7]
    assert_invariants(p, m, n, dp_size=1, expected=range(6), total_lengths=tl, max_per_bin=12)


def test_rejects_when_fewer_rollouts_than_gbs():
    """Fewer rollouts than global_batch_size is one clear InputError (slime: AssertionError)."""
    with pytest.raises(InputError, match="num_rollouts"):
        build_dp_schedule(make_args(12), make_tp(1), [3] * 6, global_batch_size=4,
                          rollout_indices=[0, 0, 1, 1, 2, 2])


@pytest.mark.parametrize("bad, match", [
    (dict(tl=[3, 3, 3]), "rollout_indices"),
    (dict(tl=[3, 0, 3, 3]), "at least 1 token"),
    (dict(tp=make_tp(8)), "dp_size 8"),
    (dict(tp={"dp_size": 2}), "missing"),
])
def test_bad_input_is_one_clear_error(bad, match):
    """Mismatched lengths, empty samples, too few samples per rank, bad config → InputError."""
    args = make_args(12, dynamic=bad.get("dynamic", True))
    with pytest.raises(InputError, match=match):
        build_dp_schedule(args, bad.get("tp", make_tp(1)), bad.get("tl", [3, 3, 3, 3]),
                          global_batch_size=4, rollout_indices=[0, 1, 2, 3])


def _slime_routes(rng, lens, La, K, E, hot):
    """slime-format routes (len - 1 recorded) with a skewed expert popularity."""
    p = np.ones(E)
    p[hot] = 12.0
    p /= p.sum()
    out = []
    for n in lens:
        g = rng.gumbel(size=(n - 1, La, E)) + np.log(p)
        out.append(np.argsort(-g, axis=2)[:, :, :K].astype(np.int64))
    return out


def test_routed_experts_plan_with_expert_loads_and_return_the_map():
    """With routed_experts the step plans with expert loads: valid, LPT map per step, no worse than identity placement."""
    from routepack_opt.core.cost import get_preset
    from routepack_opt.core.evaluate import Evaluator
    from routepack_opt.core.plan import assignment_from_cells
    from routepack_opt.core.topology import Topology
    from routepack_opt.integrations.replay import import_replay

    rng = np.random.default_rng(3)
    E, La, K, dp, ep = 8, 2, 2, 4, 2
    tl = [int(x) for x in rng.integers(20, 200, size=32)]
    routes = _slime_routes(rng, tl, La, K, E, hot=[0, 1])
    args = make_args(400, num_experts=E, expert_model_parallel_size=ep)
    sched = plan_dp_schedule(args, make_tp(dp), tl, global_batch_size=32, rollout_indices=list(range(32)),
                             routed_experts=routes, **SWEEPS)
    p, m, n, _ = sched.as_slime()
    assert_invariants(p, m, n, dp_size=dp, expected=range(32), total_lengths=tl, max_per_bin=400)
    l2p = sched.logical_to_physical[0]
    assert l2p.shape == (La, E) and all(sorted(row) == list(range(E)) for row in l2p)
    # Rebuild the step's cells from slime's output and score them with the one evaluator.
    window = import_replay(routes, format="slime", num_experts=E, lengths=tl).window
    R = n[0]
    cells = [[[p[d][i] for i in m[d][r]] for d in range(dp)] for r in range(R)]
    row, slot = assignment_from_cells(cells, 32)
    ev = Evaluator(window, Topology(dp=dp, ep=ep, capacity=400), get_preset("qwen3-30b-a3b").cost)
    ours = ev.score(l2p, row, slot, R, "max-sum").makespan
    ident = ev.score(np.tile(np.arange(E), (La, 1)), row, slot, R, "max-sum").makespan
    assert ours <= ident
    assert sched.reports[0]["score"]["makespan"] == pytest.approx(ours)


def test_routed_experts_count_mismatch_is_an_error():
    """routed_experts with a different sample count than total_lengths is an InputError."""
    rng = np.random.default_rng(0)
    tl = [5] * 4
    routes = _slime_routes(rng, tl[:3], 2, 2, 4, hot=[0])
    with pytest.raises(InputError, match="routed_experts"):
        build_dp_schedule(make_args(10, num_experts=4), make_tp(1), tl, global_batch_size=4,
                          rollout_indices=list(range(4)), routed_experts=routes)


def test_install_patches_the_module_attribute():
    """install() points module.build_dp_schedule at ours (with options) and returns the old one."""
    mod = SimpleNamespace(build_dp_schedule="slime's")
    old = rp_slime.install(mod, max_sweeps=5)
    assert old == "slime's"
    p, m, n, g = mod.build_dp_schedule(make_args(10), make_tp(2), [5] * 4, global_batch_size=4,
                                       rollout_indices=list(range(4)))
    assert_invariants(p, m, n, dp_size=2, expected=range(4), total_lengths=[5] * 4, max_per_bin=10)


def test_off_the_critical_path_net_saving_is_the_saving():
    """on_critical_path=False (slime's train_async: the next rollout is scheduled while one trains):
    the records keep the planning time but do not charge it; install() passes the option on."""
    rng = np.random.default_rng(2)
    tl = [int(x) for x in rng.integers(50, 900, size=16)]
    kw = dict(global_batch_size=8, rollout_indices=list(range(16)), **SWEEPS)
    on = plan_dp_schedule(make_args(2000), make_tp(2), tl, **kw)
    off = plan_dp_schedule(make_args(2000), make_tp(2), tl, on_critical_path=False, **kw)
    assert len(off.records) == 2 and all(not r.on_critical_path and r.planning_s > 0 for r in off.records)
    assert all(r.net_saving_us == r.saving_us for r in off.records)
    assert all(r.net_saving_us == pytest.approx(r.saving_us - 1e6 * r.planning_s) for r in on.records)
    seen = []
    mod = SimpleNamespace(build_dp_schedule=None)
    rp_slime.install(mod, max_sweeps=5, on_critical_path=False, on_record=seen.append)
    mod.build_dp_schedule(make_args(2000), make_tp(2), tl, global_batch_size=8, rollout_indices=list(range(16)))
    assert len(seen) == 2 and not any(r.on_critical_path for r in seen)


def _cells(p, m, n, dp, step=0):
    start = sum(n[:step])
    return [[[p[d][i] for i in m[d][start + r]] for d in range(dp)] for r in range(n[step])]


def test_static_path_keeps_fixed_counts_and_beats_slimes_layout():
    """Static path: micro_batch_size samples per micro-batch, slime's count per rank, predicted time ≤ slime's layout."""
    rng = np.random.default_rng(1)
    tl = [int(x) for x in rng.integers(50, 4000, size=32)]
    args = make_args(None, dynamic=False)
    args.micro_batch_size = 4
    sched = plan_dp_schedule(args, make_tp(2), tl, global_batch_size=32, rollout_indices=list(range(32)), **SWEEPS)
    p, m, n, g = sched.as_slime()
    assert n == [4] and g == [32]
    assert_invariants(p, m, n, dp_size=2, expected=range(32), total_lengths=tl, max_per_bin=sum(tl))
    assert all(len(mbs) == 4 for r in range(2) for mbs in m[r])
    (rec,) = sched.records
    assert rec.rows == rec.rows_theirs == 4 and rec.fallback is None
    assert rec.predicted_us <= rec.predicted_us_theirs
    assert rec.saving_us == pytest.approx(rec.predicted_us_theirs - rec.predicted_us)


def test_static_count_that_does_not_divide_is_slimes_assertion():
    """A static micro-batch count not divisible by dp_size raises AssertionError (and InputError) with slime's message."""
    args = make_args(None, dynamic=False)
    args.micro_batch_size = 2
    with pytest.raises(AssertionError, match="static path: num_mbs \\(3\\)") as exc:
        build_dp_schedule(args, make_tp(2), [5] * 6, global_batch_size=6, rollout_indices=list(range(6)))
    assert isinstance(exc.value, InputError)


def test_packing_safety_margin_shrinks_the_cap():
    """args.packing_safety_margin scales the cap as slime's bins do (0.5 × 1024 → 512 tokens)."""
    rng = np.random.default_rng(2)
    tl = [int(x) for x in rng.integers(100, 500, size=16)]
    args = make_args(1024, packing_safety_margin=0.5)
    p, m, n, _ = build_dp_schedule(args, make_tp(2), tl, global_batch_size=16, rollout_indices=list(range(16)),
                                   **SWEEPS)
    for r in range(2):
        for mbs in m[r]:
            assert sum(tl[p[r][i]] for i in mbs) <= 512


def test_global_batch_tokens_steps_follow_slimes_rule():
    """Token-budget steps: dp-aligned rollout prefixes nearest the budget, the rest dropped (as slime)."""
    tl = [10, 10, 30, 30, 5, 5, 100, 1, 3]
    args = make_args(200, global_batch_tokens=45)
    sched = plan_dp_schedule(args, make_tp(2), tl, global_batch_size=99, rollout_indices=list(range(9)), **SWEEPS)
    # from sample 0: 2 / 4 samples hold 20 / 80 tokens, 20 is nearer 45 → 2 rollouts; from 2: 60
    # tokens at 2 → 2; from 4: 10 at 2, 111 at 4 → 2; from 6: 101 at 2 → 2; sample 8 alone is
    # not a multiple of dp_size → dropped
    assert sched.global_batch_sizes == [2, 2, 2, 2]
    assert sched.dropped_samples == [8]
    p, m, n, _ = sched.as_slime()
    assert_invariants(p, m, n, dp_size=2, expected=range(8), total_lengths=tl, max_per_bin=200)


def test_sample_is_multimodal_separate_keeps_slimes_layout_with_one_warning(caplog):
    """multimodal_aware_packing='separate' with image samples: slime's own layout (kinds never mixed), one warning."""
    tl = [70, 20, 20, 20, 20, 20, 20, 20]
    mm = [True] + [False] * 7
    args = make_args(100, multimodal_aware_packing="separate")
    with caplog.at_level("WARNING", logger="routepack_opt.integrations"):
        for _ in range(2):
            sched = plan_dp_schedule(args, make_tp(2), tl, global_batch_size=8, rollout_indices=list(range(8)),
                                     sample_is_multimodal=mm, **SWEEPS)
    p, m, n, _ = sched.as_slime()
    assert_invariants(p, m, n, dp_size=2, expected=range(8), total_lengths=tl, max_per_bin=100)
    assert all(len({mm[p[r][i]] for i in mbs}) == 1 for r in range(2) for mbs in m[r])
    assert sched.records[0].fallback is not None
    assert sum("multimodal" in rec.message for rec in caplog.records) == 1


def test_record_metrics_are_flat_numbers():
    """A step's record gives routepack/<name> numbers: rows, predicted times, saving, planning time, fallback."""
    sched = plan_dp_schedule(make_args(10), make_tp(2), [5, 3, 7, 2, 9, 4, 6, 1], global_batch_size=8,
                             rollout_indices=list(range(8)), **SWEEPS)
    met = sched.records[0].metrics()
    assert {"routepack/rows", "routepack/rows_theirs", "routepack/predicted_ms", "routepack/predicted_ms_theirs",
            "routepack/saving_ms", "routepack/net_saving_ms", "routepack/planning_ms",
            "routepack/fallback"} <= set(met)
    assert all(isinstance(v, float) for v in met.values())
    assert met["routepack/rows"] == sched.num_microbatches[0] and met["routepack/fallback"] == 0.0
    assert rp_slime.last_records() == sched.records


def test_install_checks_module_and_settings(monkeypatch, caplog):
    """install() on a module without build_dp_schedule, or with a bad ROUTEPACK_COST, is one InputError naming it."""
    with pytest.raises(InputError, match="has no build_dp_schedule"):
        rp_slime.install(SimpleNamespace())
    monkeypatch.setenv("ROUTEPACK_COST", "bogus")
    with pytest.raises(InputError, match="ROUTEPACK_COST='bogus'"):
        rp_slime.install(SimpleNamespace(build_dp_schedule=None))
    monkeypatch.setenv("ROUTEPACK_COST", "qwen3-30b-a3b")
    monkeypatch.setenv("ROUTEPACK_TIME_LIMIT", "soon")
    with pytest.raises(InputError, match="ROUTEPACK_TIME_LIMIT"):
        rp_slime.install(SimpleNamespace(build_dp_schedule=None))
    monkeypatch.delenv("ROUTEPACK_TIME_LIMIT")
    with caplog.at_level("INFO", logger="routepack_opt.integrations"):
        rp_slime.install(SimpleNamespace(build_dp_schedule=None, __name__="fake.rollout"))
    assert any("fake.rollout.build_dp_schedule replaced" in r.message for r in caplog.records)


def test_default_time_limit_is_a_share_of_the_predicted_step(monkeypatch):
    """The default limit shrinks to a tenth of slime's predicted step (≥ 10 ms); a keyword or ROUTEPACK_TIME_LIMIT is kept."""
    from routepack_opt.integrations._seam import DEFAULT_TIME_LIMIT, seam_settings

    monkeypatch.delenv("ROUTEPACK_TIME_LIMIT", raising=False)
    s = seam_settings("slime")
    assert s.step_time_limit(200_000.0) == pytest.approx(0.02)
    assert s.step_time_limit(1e3) == 0.01
    assert s.step_time_limit(1e9) == DEFAULT_TIME_LIMIT["slime"]
    assert seam_settings("slime", time_limit=2.0).step_time_limit(1e3) == 2.0
    assert seam_settings("slime", time_limit=None).step_time_limit(1e3) is None
    monkeypatch.setenv("ROUTEPACK_TIME_LIMIT", "none")
    assert seam_settings("slime").step_time_limit(1e3) is None


def test_seam_threads_setting_is_applied_and_restored(monkeypatch):
    """ROUTEPACK_THREADS / threads= set numba's threads for the call only (default 1); a bad value names the variable."""
    import numba

    from routepack_opt.integrations._seam import seam_settings

    monkeypatch.delenv("ROUTEPACK_THREADS", raising=False)
    assert seam_settings("verl").threads == 1
    assert seam_settings("verl", threads="all").threads is None
    monkeypatch.setenv("ROUTEPACK_THREADS", "many")
    with pytest.raises(InputError, match="ROUTEPACK_THREADS='many'"):
        seam_settings("slime")
    monkeypatch.setenv("ROUTEPACK_THREADS", "1")
    before = numba.get_num_threads()
    with seam_settings("slime").planner_threads():
        assert numba.get_num_threads() == 1
    assert numba.get_num_threads() == before


def test_planning_failure_keeps_slimes_layout_with_one_warning(monkeypatch, caplog):
    """A planner error in a step: slime's own layout for that step (valid), one warning, a fallback record."""
    def boom(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(rp_slime, "plan_cells", boom)
    tl = [5, 3, 7, 2, 9, 4, 6, 1]
    with caplog.at_level("WARNING", logger="routepack_opt.integrations"):
        for _ in range(2):
            # an unbounded search (the default budget of so small a step goes to the quick path)
            sched = plan_dp_schedule(make_args(10), make_tp(2), tl, global_batch_size=4,
                                     rollout_indices=list(range(8)), time_limit=None)
    p, m, n, _ = sched.as_slime()
    assert_invariants(p, m, n, dp_size=2, expected=range(8), total_lengths=tl, max_per_bin=10)
    assert all("boom" in r.fallback for r in sched.records)
    assert sum("boom" in r.message for r in caplog.records) == 1


@pytest.mark.skipif(not __import__("os").environ.get("ROUTEPACK_SLIME_SRC"),
                    reason="slime is not on PyPI; set ROUTEPACK_SLIME_SRC to a THUDM/slime checkout")
@pytest.mark.parametrize("dynamic, margin, tokens", [(True, 1.0, None), (True, 0.6, None), (False, 1.0, None),
                                                     (True, 1.0, 6000)])
def test_record_scores_slimes_real_layout(dynamic, margin, tokens):
    """The layout the record scores as slime's is slime's real build_dp_schedule output (steps, micro-batches, ranks)."""
    import os
    import sys

    sys.path.insert(0, os.environ["ROUTEPACK_SLIME_SRC"])
    from slime.utils.dp_schedule import build_dp_schedule as slime_fn

    rng = np.random.default_rng(7)
    tl = [int(x) for x in np.clip(rng.lognormal(6.0, 0.9, 64), 16, 3000)]
    args = make_args(2048, dynamic=dynamic, packing_safety_margin=margin, global_batch_tokens=tokens)
    args.micro_batch_size = 4
    tp = make_tp(4)
    import inspect

    if (margin != 1.0 or tokens) and "sample_is_multimodal" not in inspect.signature(slime_fn).parameters:
        pytest.skip("this slime predates packing_safety_margin / global_batch_tokens")
    theirs = slime_fn(args, tp, tl, global_batch_size=16, rollout_indices=list(range(64)))
    ours = plan_dp_schedule(args, tp, tl, global_batch_size=16, rollout_indices=list(range(64)), **SWEEPS)
    assert ours.global_batch_sizes == theirs[3]
    assert [r.rows_theirs for r in ours.records] == theirs[2]
    # slime's cells, step by step, scored by the evaluator = the record's predicted_us_theirs
    from routepack_opt.core.cost import get_preset
    from routepack_opt.core.topology import Topology
    from routepack_opt.integrations._common import clip_to_cap, length_only_window, score_cells

    start = 0
    for s, n in enumerate(theirs[2]):
        cells = [[[theirs[0][d][i] for i in theirs[1][d][start + r]] for d in range(4)] for r in range(n)]
        idx = sorted(i for row in cells for c in row for i in c)
        local = [[[idx.index(i) for i in c] for c in row] for row in cells]
        cap = sum(tl) if not dynamic else max(1, int(2048 * margin))
        window = clip_to_cap(length_only_window([tl[i] for i in idx]), cap)[0]  # as the record scores it
        us = score_cells(window, Topology(dp=4, ep=1, capacity=cap),
                         get_preset("qwen3-30b-a3b").cost, local, "max-sum")
        assert ours.records[s].predicted_us_theirs == pytest.approx(us)
        start += n


def test_static_path_with_routed_experts_plans_the_joint_cost():
    """Static path with routed_experts: fixed counts kept, an LPT map per step, predicted time ≤ slime's layout with identity experts."""
    rng = np.random.default_rng(4)
    E, La, K, dp, ep = 8, 2, 2, 4, 2
    tl = [int(x) for x in rng.integers(20, 200, size=32)]
    routes = _slime_routes(rng, tl, La, K, E, hot=[0, 1])
    args = make_args(None, dynamic=False, num_experts=E, expert_model_parallel_size=ep)
    args.micro_batch_size = 2
    sched = plan_dp_schedule(args, make_tp(dp), tl, global_batch_size=32, rollout_indices=list(range(32)),
                             routed_experts=routes, **SWEEPS)
    p, m, n, _ = sched.as_slime()
    assert n == [4] and all(len(mbs) == 2 for r in range(dp) for mbs in m[r])
    assert_invariants(p, m, n, dp_size=dp, expected=range(32), total_lengths=tl, max_per_bin=sum(tl))
    l2p = sched.logical_to_physical[0]
    assert l2p.shape == (La, E) and all(sorted(row) == list(range(E)) for row in l2p)
    assert sched.records[0].predicted_us <= sched.records[0].predicted_us_theirs


def _rank_tokens_through_megatron_seam(pl, cells, routes_N, topo, E, La, K):
    """Per (micro-batch row · EDP shard, layer · EP rank): the token copies each EP rank gets when
    every DP slot's micro-batch goes through integrations.megatron.remap_routing_replicated (its
    EP rank as source rank) — the [R·G, L·P] block the evaluator predicts."""
    torch = pytest.importorskip("torch")
    from routepack_opt.integrations import megatron as rp_mg
    from routepack_opt.integrations.replay import slime_pad_routes

    P, G = topo.ep, topo.num_shards
    q_D = np.empty(topo.dp, dtype=np.int64)
    q_D[topo.slots_of_shard()] = np.arange(P)[None, :]
    shard_D = topo.shard_array()
    pad = slime_pad_routes(La, K, E)[None]
    got = np.zeros((len(cells) * G, La * P), dtype=np.int64)
    for r, row in enumerate(cells):
        for d, ids in enumerate(row):
            if not ids:
                continue
            ids_TLK = np.concatenate([np.concatenate([routes_N[i], pad]) for i in ids])  # slime pads the last token
            for l in range(La):
                rmap = torch.zeros(ids_TLK.shape[0], E, dtype=torch.bool)
                rmap[torch.arange(ids_TLK.shape[0])[:, None], torch.as_tensor(ids_TLK[:, l])] = True
                _, rmap_TS = rp_mg.remap_routing_replicated(rmap.double(), rmap, pl, int(q_D[d]), layer=l)
                got[r * G + shard_D[d], l * P:(l + 1) * P] += rp_mg.rank_token_counts(rmap_TS.long(), P).numpy()
    return got


@pytest.mark.parametrize("dynamic", [True, False])
def test_redundant_experts_carry_the_replicated_placement(dynamic):
    """With redundant_experts the step's replicated Placement travels in SlimeSchedule.placements:
    Megatron's seam takes it (apply_expert_placement, remap_routing_replicated) and the tokens each
    EP rank gets equal the one evaluator's predicted loads for the plan; redundant_experts=0 leaves
    the schedule as it was."""
    from routepack_opt.core.evaluate import replica_block_W
    from routepack_opt.core.placement import Placement
    from routepack_opt.core.topology import Topology
    from routepack_opt.integrations import megatron as rp_mg
    from routepack_opt.integrations.replay import import_replay

    rng = np.random.default_rng(5)
    E, La, K, dp, ep, red = 8, 2, 2, 4, 4, 4
    tl = [int(x) for x in rng.integers(20, 200, size=32)]
    routes = _slime_routes(rng, tl, La, K, E, hot=[0, 1])
    args = make_args(400 if dynamic else None, dynamic=dynamic, num_experts=E, expert_model_parallel_size=ep)
    args.micro_batch_size = 2
    # no wall-clock limit: the plain and redundant_experts=0 schedules below must be the same plan,
    # which the seam's default time limit (a tenth of slime's predicted step) does not promise on a
    # busy machine
    kw = dict(global_batch_size=32, rollout_indices=list(range(32)), routed_experts=routes, time_limit=None,
              **SWEEPS)
    sched = plan_dp_schedule(args, make_tp(dp), tl, redundant_experts=red, **kw)
    pl = sched.placements[0]
    assert isinstance(pl, Placement) and pl.redundant == red and pl.num_layers == La
    assert (pl.logcnt > 1).any() and pl.rule == "even-local"
    np.testing.assert_array_equal(sched.logical_to_physical[0], pl.log2phy()[:, :, 0])
    p, m, n, _ = sched.as_slime()
    cap = 400 if dynamic else sum(tl)
    assert_invariants(p, m, n, dp_size=dp, expected=range(32), total_lengths=tl, max_per_bin=cap)
    cells = [[[p[d][i] for i in m[d][r]] for d in range(dp)] for r in range(n[0])]
    window = import_replay(routes, format="slime", num_experts=E, lengths=tl).window
    topo = Topology(dp=dp, ep=ep, capacity=cap, redundant_experts=red)
    from routepack_opt.core.plan import assignment_from_cells
    row, slot = assignment_from_cells(cells, 32)
    predicted = replica_block_W(window.counts, pl, row, slot, n[0], topo)
    np.testing.assert_array_equal(_rank_tokens_through_megatron_seam(pl, cells, routes, topo, E, La, K), predicted)

    class Layer:  # apply_expert_placement takes it as it comes
        def route(self, hidden):
            return None

    h = rp_mg.apply_expert_placement(Layer(), pl, layer=1, source_rank=3, num_logical_experts=E)
    h.remove()
    plain = plan_dp_schedule(args, make_tp(dp), tl, **kw)
    zero = plan_dp_schedule(args, make_tp(dp), tl, redundant_experts=0, **kw)
    assert plain.placements == zero.placements == [None]
    assert plain.as_slime() == zero.as_slime() and plain.reports[0]["score"] == zero.reports[0]["score"]
    assert all(np.array_equal(a, b) for a, b in zip(plain.logical_to_physical, zero.logical_to_physical))


def test_redundant_experts_without_routes_or_divisible_slots_is_an_error():
    args = make_args(400, num_experts=8, expert_model_parallel_size=4)
    tl = [50] * 8
    with pytest.raises(InputError, match="redundant_experts needs routed_experts"):
        plan_dp_schedule(args, make_tp(4), tl, global_batch_size=8, rollout_indices=list(range(8)),
                         redundant_experts=4)
    routes = _slime_routes(np.random.default_rng(0), tl, 1, 2, 8, hot=[0])
    with pytest.raises(InputError, match="not divisible by ep=4"):
        plan_dp_schedule(args, make_tp(4), tl, global_batch_size=8, rollout_indices=list(range(8)),
                         routed_experts=routes, redundant_experts=3, **SWEEPS)
    with pytest.raises(InputError, match="redundant_experts: expected an integer"):
        plan_dp_schedule(args, make_tp(4), tl, global_batch_size=8, rollout_indices=list(range(8)),
                         routed_experts=routes, redundant_experts=-1)


def test_step_budget_covers_the_whole_step_and_the_record_splits_it():
    """time_limit bounds each step from its start (import, slime's layout, the search); a budget
    spent before the search leaves slime's own layout (the quick path), and the record says so and
    splits the step's wall time into import / plan / apply."""
    rng = np.random.default_rng(8)
    tl = [int(x) for x in rng.integers(20, 300, size=32)]
    args = make_args(600)
    sched = plan_dp_schedule(args, make_tp(4), tl, global_batch_size=16, rollout_indices=list(range(32)),
                             time_limit=1e-7)
    assert len(sched.records) == 2
    for rec in sched.records:
        assert rec.quick is not None and rec.quick.startswith("budget") and rec.budget_s == pytest.approx(1e-7)
        assert rec.predicted_us == pytest.approx(rec.predicted_us_theirs)  # slime's own layout stands
        assert min(rec.import_s, rec.plan_s, rec.apply_s) >= 0
        assert rec.import_s + rec.plan_s + rec.apply_s == pytest.approx(rec.planning_s, abs=1e-6)
        assert rec.metrics()["routepack/quick"] == 1.0
    p, m, n, _ = sched.as_slime()
    assert_invariants(p, m, n, dp_size=4, expected=range(32), total_lengths=tl, max_per_bin=600)
    full = plan_dp_schedule(args, make_tp(4), tl, global_batch_size=16, rollout_indices=list(range(32)),
                            time_limit=None, **SWEEPS)
    assert all(r.quick is None and r.budget_s is None for r in full.records)


def test_issue49_9_install_names_a_misspelled_keyword():
    """install() with a misspelled setting is one InputError naming it and the nearest known one."""
    with pytest.raises(InputError, match="'time_limt' \\(did you mean 'time_limit'\\?\\)"):
        rp_slime.install(SimpleNamespace(build_dp_schedule=None), time_limt=0.1)

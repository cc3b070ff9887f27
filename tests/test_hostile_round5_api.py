"""Hostile inputs, round 5 (issue 50): the public functions check their arguments at entry
through core/checks.py, never cast and wrap, and quote what the user gave ("What was found"
items 8, 10 and 11; "What to build" item 2)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzz_support as fs  # noqa: E402

from routepack_opt.certify import certify_rows, pack_into_bins  # noqa: E402
from routepack_opt.core import checks  # noqa: E402
from routepack_opt.core.errors import InputError  # noqa: E402
from routepack_opt.core.topology import Topology  # noqa: E402
from routepack_opt.integrations.rollout_hook import COUNTS_KEY, counts_from_non_tensor  # noqa: E402
from routepack_opt.models.branch_price import decide_bins  # noqa: E402
from routepack_opt.replay.sample_counts import StreamingCounts, sample_counts, window_from_counts  # noqa: E402

# two samples of 3 tokens, one layer, two experts, top-1
COUNTS = np.array([[[3, 0]], [[1, 2]]], dtype=np.int64)
LENGTHS = np.array([3, 3])


def _wrapped(counts):
    c = counts.copy()
    c[0, 0, 0] += 2**32  # 2³² + 3: an int32 cast would give back 3
    return c


# --- found 8: silent wrap and truncation ---------------------------------------------------------
def test_found8_window_from_counts_refuses_a_count_that_would_wrap():
    """window_from_counts: a count of 2³²+3 is refused (quoted), not turned into 3."""
    with pytest.raises(InputError, match="4294967299"):
        window_from_counts(_wrapped(COUNTS), LENGTHS, top_k=1)
    with pytest.raises(InputError, match="4294967299"):
        window_from_counts(list(_wrapped(COUNTS)), LENGTHS, top_k=1)


@pytest.mark.parametrize("bad, quoted", [(np.array([[2**32 + 3, 0]]), "4294967299"),
                                         (np.array([[1.7, 1.3]]), "1.7"),
                                         (np.array([["3", "0"]]), "U1")])
def test_found8_counts_from_non_tensor_refuses_wrap_fractions_and_strings(bad, quoted):
    """counts_from_non_tensor: 2³²+3, 1.7 and strings are InputErrors quoting the value, never 3, 1, '3'→3."""
    col = np.empty(2, dtype=object)
    col[0], col[1] = bad, np.array([[3, 0]])
    with pytest.raises(InputError, match=quoted):
        counts_from_non_tensor({COUNTS_KEY: col})


def test_found8_counts_from_non_tensor_keeps_good_counts():
    """The exact check keeps good counts as they are: [N, L, E] int32."""
    col = np.empty(2, dtype=object)
    col[0], col[1] = COUNTS[0], COUNTS[1]
    got = counts_from_non_tensor({COUNTS_KEY: col})
    assert got.dtype == np.int32 and np.array_equal(got, COUNTS)


@pytest.mark.parametrize("length", [2**31, 2.7, "2", True, float("inf"), np.float64(3.0)])
def test_found8_streaming_counts_add_refuses_a_length_that_is_no_exact_int32(length):
    """StreamingCounts.add: length 2³¹, 2.7, '2', True, inf are refused (quoted); nothing is stored."""
    st = StreamingCounts(2, 1, 2, 1)
    with pytest.raises(InputError, match="length"):
        st.add(0, np.array([[2, 0]]), length)
    assert st.num_arrived == 0 and not st.counts_NLE.any() and not st.lengths_N.any()


def test_found8_streaming_counts_add_refuses_a_count_that_would_wrap():
    """StreamingCounts.add: a count of 2³¹ is refused, not stored as −2³¹ beside a length of +2³¹."""
    st = StreamingCounts(2, 1, 2, 1)
    with pytest.raises(InputError, match="2147483648"):
        st.add(0, np.array([[2**31, 0]]), 2**31 - 1)
    assert not st.counts_NLE.any() and not st.loads_LE.any()


# --- found 10: public functions without checks ---------------------------------------------------
def test_found10_decide_bins_agrees_with_brute_force_when_k_leaves_a_bin_of_slack():
    """decide_bins on tiny instances, K from the optimum to two above it (the empty pattern is
    listed): the answer is brute force's, never a TypeError, and a packing is a packing."""
    for w, b, C, K, opt in fs.tiny_bin_decisions(np.random.default_rng(5), 25, 13, 3):
        res = decide_bins(w, b, C, K, time_limit=5.0)
        assert res.status == ("feasible" if opt <= K else "infeasible"), (w, b, C, K, opt)
        if res.bins is not None:
            A = np.array(res.bins)
            assert len(A) <= K and (A.sum(axis=0) == b).all() and (A @ w <= C).all()


@pytest.mark.parametrize("args, match", [
    ((np.array([5, 0]), np.array([1, 1]), 10, 2), "w_M"),      # ZeroDivisionError before
    ((np.array([5, -3]), np.array([1, 1]), 10, 2), "w_M"),     # an answer before
    ((np.array([5, 3]), np.array([1, 1]), 10, -1), "K"),       # an answer before
    ((np.array([5, 3]), np.array([1, 1]), 10, 2.5), "2.5"),    # truncated to 2 before
    ((np.array([5, 3]), np.array([1, -1]), 10, 2), "b_M"),
    ((np.array([5, 3]), np.array([1]), 10, 2), "w_M, b_M"),
    ((np.array([5.5, 3]), np.array([1, 1]), 10, 2), "5.5"),
    ((np.array([5, 3]), np.array([1, 1]), True, 2), "C"),
])
def test_found10_decide_bins_refuses_bad_arguments(args, match):
    """decide_bins: zero or negative sizes, K = −1, K = 2.5, ragged types are InputErrors."""
    with pytest.raises(InputError, match=match):
        decide_bins(*args, time_limit=1.0)


@pytest.mark.parametrize("limit", [float("nan"), -1, 0, "10", True])
def test_found10_decide_bins_refuses_a_time_limit_that_is_no_limit(limit):
    """decide_bins: a NaN (no limit before), negative, zero or string time limit is refused."""
    with pytest.raises(InputError, match="time_limit"):
        decide_bins(np.array([5, 3]), np.array([1, 1]), 10, 2, time_limit=limit)


TOPO = Topology(dp=1, ep=1, capacity=10)


@pytest.mark.parametrize("kwargs, match", [
    (dict(topology=None), "topology"),                        # AttributeError before
    (dict(time_limit=-1), "time_limit"), (dict(time_limit=0), "time_limit"),
    (dict(time_limit=float("nan")), "time_limit"), (dict(time_limit="10"), "time_limit"),
    (dict(method="bogus"), "method: expected one of"), (dict(num_workers=0), "num_workers"),
    (dict(window=np.array([3.0, np.inf])), "inf"),             # found 11: quoted, not −2⁶³
])
def test_found10_certify_rows_checks_its_arguments(kwargs, match):
    """certify_rows: topology None, a time limit that is no limit, an unknown method, 0 workers are InputErrors."""
    args = dict(window=np.array([3, 4, 5]), topology=TOPO, time_limit=2.0) | kwargs
    with pytest.raises(InputError, match=match):
        certify_rows(**args)


def test_found10_pack_into_bins_checks_its_arguments():
    """pack_into_bins: an unknown method, a float bin count, a capacity past 2⁴⁰ are InputErrors."""
    for kwargs in (dict(method="bogus"), dict(num_bins=2.5), dict(capacity=2**63)):
        with pytest.raises(InputError):
            pack_into_bins(**(dict(sizes=[5, 4, 3], capacity=8, num_bins=2, time_limit=1.0) | kwargs))


def test_found10_streaming_counts_refuses_top_k_above_the_experts():
    """StreamingCounts(top_k=3, E=2) is refused when built (every later add failed before)."""
    with pytest.raises(InputError, match="top_k"):
        StreamingCounts(2, 1, 2, 3)


torch = pytest.importorskip("torch")
ROUTES = np.array([[[0, 1]], [[1, 2]], [[3, 0]]])  # T=3, L=1, K=2


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float16"])
def test_found10_sample_counts_reads_small_float_tensors_as_float32(dtype):
    """A CPU bf16/fp8 routes tensor is read as float32 (docs/formats.md): the counts of the int routes."""
    want = sample_counts(torch.from_numpy(ROUTES), 4)
    got = sample_counts(torch.from_numpy(ROUTES).to(getattr(torch, dtype)), 4)
    assert torch.equal(got, want)


@pytest.mark.parametrize("make, match", [
    (lambda r: r.to_sparse(), "sparse"),
    (lambda r: r.to("meta"), "meta"),
    (lambda r: torch.quantize_per_tensor(r.float(), 1.0, 0, torch.quint8), "quantized"),
    (lambda r: torch.nested.nested_tensor([r[0], r[1]]), "nested"),
])
def test_found10_sample_counts_refuses_tensors_without_plain_data(make, match):
    """Sparse, meta, quantized and nested tensors are clean InputErrors, not TypeError/NotImplementedError."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that nested/quantized tensors are prototypes
        bad = make(torch.from_numpy(ROUTES))
    with pytest.raises(InputError, match=match):
        sample_counts(bad, 4)


# --- found 11: messages that name values the user never gave -------------------------------------
def test_found11_an_inf_length_is_quoted_not_wrapped():
    """An inf length names inf, never −9223372036854775808."""
    for call in (lambda: window_from_counts(COUNTS, np.array([3.0, np.inf]), top_k=1),
                 lambda: certify_rows(np.array([3.0, np.inf]), TOPO, 1.0)):
        with pytest.raises(InputError) as exc:
            call()
        assert "inf" in str(exc.value) and "9223372036854775808" not in str(exc.value)


@pytest.mark.parametrize("as_tensor", [False, True])
def test_found11_a_float_expert_id_is_quoted_not_wrapped(as_tensor):
    """A float expert id 1e300 is named as 1e+300, never as expert id −9223372036854775808."""
    r = np.array([[[0.0, 1e300]]])
    with pytest.raises(InputError) as exc:
        sample_counts(torch.from_numpy(r) if as_tensor else r, 4)
    assert "1e+300" in str(exc.value) and "9223372036854775808" not in str(exc.value)


# --- the shared validators ------------------------------------------------------------------------
def test_int_array_refuses_before_the_cast_and_keeps_exact_values():
    """checks.int_array: exact integers kept; out-of-range, fractional, NaN, bool, str refused and quoted."""
    assert checks.int_array([1, 2**40], "x").tolist() == [1, 2**40]
    assert checks.int_array(np.array([3.0, 4.0], dtype=np.float16), "x").tolist() == [3, 4]
    for bad, quoted in (([2**31], "2147483648"), ([1.5], "1.5"), ([np.nan], "nan"), ([True], "bool"),
                        (["3"], "U1"), ([[1], [1, 2]], "cannot be read")):
        with pytest.raises(InputError, match=quoted):
            checks.int_array(bad, "x", hi=checks.INT32_MAX)


def test_scalar_validators_are_exact():
    """check_int refuses 2.0, True and '3'; check_number refuses NaN, inf and 10**400; check_choice never KeyErrors."""
    assert checks.check_int(np.int64(3), "n", 1) == 3
    for bad in (2.0, True, "3", None, 0):
        with pytest.raises(InputError, match="n: expected an integer"):
            checks.check_int(bad, "n", 1)
    for bad in (float("nan"), float("inf"), 10**400, True, "1"):
        with pytest.raises(InputError, match="x: expected a finite number"):
            checks.check_number(bad, "x")
    for bad in ("bogus", ["auto"], None):
        with pytest.raises(InputError, match="method: expected one of auto, cpsat"):
            checks.check_choice(bad, "method", ("auto", "cpsat"))


def test_an_input_error_is_one_line():
    """An InputError quoting a 2-D array (its repr spans lines) is one line: the CLI's one error: line."""
    with pytest.raises(InputError) as exc:
        Topology(dp=np.ones((3, 3), dtype=np.int64), ep=1, capacity=8)
    assert "\n" not in str(exc.value) and "dp" in str(exc.value)


def test_unknown_names_are_input_errors_never_key_errors():
    """An unknown seam (or one that is no name at all) is an InputError listing the seams, not a KeyError."""
    from routepack_opt.integrations._seam import seam_settings

    for bad in ("bogus", ["verl"], None):
        with pytest.raises(InputError, match="seam: expected one of verl, slime"):
            seam_settings(bad)


# --- build 2: the torch runtime's entry points ---------------------------------------------------
def test_runtime_layer_and_model_sizes_are_checked_at_entry():
    """MoELayer / ExpertSlots / TinyMoEConfig refuse a bool, a float, top_k > E and negative redundancy, quoted."""
    pytest.importorskip("torch")
    from routepack_opt.runtime.model import TinyMoEConfig
    from routepack_opt.runtime.moe import ExpertSlots, MoELayer

    with pytest.raises(InputError, match="top_k: expected an integer in 1..4, got 5"):
        MoELayer(hidden=4, ffn=4, num_experts=4, top_k=5)
    with pytest.raises(InputError, match="redundant: expected an integer ≥ 0, got -1"):
        MoELayer(hidden=4, ffn=4, num_experts=4, top_k=2, redundant=-1)
    with pytest.raises(InputError, match="hidden: .*got True"):
        ExpertSlots(num_slots=2, hidden=True, ffn=4)
    with pytest.raises(InputError, match="num_slots=.*2⁶³−1 elements"):
        ExpertSlots(num_slots=2**62, hidden=4, ffn=4)
    with pytest.raises(InputError, match="ffn: .*got 2.5"):
        TinyMoEConfig(ffn=2.5)
    with pytest.raises(InputError, match="hidden must be divisible by heads"):
        TinyMoEConfig(hidden=33)


def test_runtime_exchange_plan_refuses_ids_that_would_allocate():
    """exchange_plan: an expert id beyond the slots is refused before bincount sizes a table by it."""
    pytest.importorskip("torch")
    from routepack_opt.runtime.replicas import exchange_plan

    with pytest.raises(InputError, match=r"phy2log_LS\[0\]: expected integers in 0..3"):
        exchange_plan(np.array([[0, 1, 2, 2**62]]), 2, 0)
    with pytest.raises(InputError, match="ep_rank: expected an integer in 0..1, got 2"):
        exchange_plan(np.array([[0, 1, 0, 1]]), 2, 2)
    assert exchange_plan(np.array([[0, 1, 0, 1]]), 2, 0).num_replicated == 2


def test_runtime_dist_checks_before_any_process_group():
    """init_group / ParallelGroups / launch / deterministic refuse bad arguments before torch.distributed is touched."""
    pytest.importorskip("torch")
    from routepack_opt.runtime import dist

    with pytest.raises(InputError, match="backend: expected one of gloo, nccl, got 'mpi'"):
        dist.init_group(0, 1, 29500, backend="mpi")
    with pytest.raises(InputError, match="rank: expected an integer in 0..1, got 2"):
        dist.init_group(2, 2, 29500)
    with pytest.raises(InputError, match="ep: world_size=6 is not divisible by ep=4"):
        dist.ParallelGroups(6, 4)
    with pytest.raises(InputError, match="timeout_s must be a positive number of seconds, got nan"):
        dist.launch(print, 1, timeout_s=float("nan"))
    with pytest.raises(InputError, match="threads: .*got 2.0"):
        dist.deterministic(0, threads=2.0)  # at the call, not when the block is entered


def test_runtime_verify_and_bench_configs_refuse_what_they_cannot_use():
    """VerifyConfig / BenchConfig / fit / scale_window: InputError naming the field, never ZeroDivisionError or a warning."""
    pytest.importorskip("torch")
    import warnings

    from routepack_opt.core.testing import random_window
    from routepack_opt.runtime import bench
    from routepack_opt.runtime.verify import VerifyConfig

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(InputError, match="dp: expected an integer ≤"):
            VerifyConfig(dp=np.uint64(2**63))
        with pytest.raises(InputError, match="device: expected a str"):
            VerifyConfig(device=np.array(["cpu"]))
        with pytest.raises(InputError, match="bench: heads must be ≥ 1"):
            bench.BenchConfig(heads=0)
        with pytest.raises(InputError, match="attn_lengths: expected at least one token count"):
            bench.BenchConfig(attn_lengths=())
        with pytest.raises(InputError, match="bench_config: unknown option 'hiden' \\(did you mean 'hidden'\\?\\)"):
            bench.bench_config("cpu", hiden=8)
        with pytest.raises(InputError, match=r"t: expected times > 0"):
            bench.fit(np.ones((2, 2)), np.array([1.0, 0.0]), ["a", "b"])
        with pytest.raises(InputError, match="scale: expected a number ≥ 1.0, got 0.5"):
            bench.scale_window(random_window(4, 1, 4, 2, max_len=8, seed=0), 0.5, 1)


def test_found2_layer_tensors_past_this_machines_memory_are_an_input_error():
    """Issue 50 (memory, round-5 sweep): ExpertSlots / MoELayer with a size of 2**31 asked torch
    for 64–384 GiB and raised its RuntimeError; now an InputError before anything is allocated."""
    from routepack_opt.runtime.moe import ExpertSlots, MoELayer

    with pytest.raises(InputError, match="GiB, more than this machine's"):
        ExpertSlots(2**31, 4, 4)
    with pytest.raises(InputError, match="GiB, more than this machine's"):
        MoELayer(2**31, 4, 4, 2)
    assert tuple(ExpertSlots(2, 3, 5).w_down_SFH.shape) == (2, 5, 3)

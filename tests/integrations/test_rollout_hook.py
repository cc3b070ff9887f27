"""The rollout-side hook (integrations/rollout_hook.py over replay/sample_counts.py): per-sample counts
equal the import's."""

import asyncio
import types

import numpy as np
import pytest

from routepack_opt.core.errors import InputError
from routepack_opt.integrations import rollout_hook as hook
from routepack_opt.integrations.replay import import_replay
from routepack_opt.replay import sample_counts as sample_counts_mod

torch = pytest.importorskip("torch")
E, La, K = 16, 4, 3


def _routes(rng, T, k=K):
    return np.argsort(rng.random((T, La, E)), axis=2)[:, :, :k].astype(np.int64)


def _verl(rng, B=5, S=12, k=K):
    R = np.zeros((B, S, La, k), np.int16)
    m = np.zeros((B, S), np.int64)
    for i in range(B):
        a, b = int(rng.integers(0, 3)), int(rng.integers(5, S + 1))
        m[i, a:b] = 1
        R[i, a:b] = _routes(rng, b - a, k)
        R[i, b - 1] = 0          # the last position: unrouted (verl #7075)
        R[i, a, 1] = 0           # a hole imputed from the next token
    return R, m


@pytest.mark.parametrize("as_torch", [True, False])
@pytest.mark.parametrize("k", [1, K])
def test_verl_sample_counts_equal_import(rng, as_torch, k):
    R, m = _verl(rng, k=k)
    ref = import_replay(R, format="verl", num_experts=E, attention_mask=m, moe_layer_freq=[1, 1, 0, 1]).window
    for i in range(R.shape[0]):
        r = torch.from_numpy(R[i]) if as_torch else R[i]
        c = hook.sample_counts(r, E, format="verl", attention_mask=m[i], moe_layer_freq=[1, 1, 0, 1])
        assert (torch.is_tensor(c) if as_torch else isinstance(c, np.ndarray))
        np.testing.assert_array_equal(np.asarray(c), ref.counts[i])
        if as_torch:  # the accelerator's path (torch ops), run here on the CPU
            g = sample_counts_mod._torch_counts(r, E, "verl", torch.from_numpy(m[i]), [1, 1, 0, 1], True)
            np.testing.assert_array_equal(g.numpy(), ref.counts[i])
    assert c.dtype in (torch.int32, np.int32)


@pytest.mark.parametrize("as_torch", [True, False])
def test_slime_and_routes_sample_counts_equal_import(rng, as_torch):
    samples = [_routes(rng, int(T)) for T in rng.integers(1, 9, 6)]
    for s in samples:
        s[:, 2] = 0  # dense layer, detected
    conv = (lambda a: torch.from_numpy(a.astype(np.int32))) if as_torch else (lambda a: a)
    ref = import_replay(samples, format="slime", num_experts=E).window
    per = [hook.sample_counts(conv(s), E, format="slime") for s in samples]
    np.testing.assert_array_equal(np.stack([np.asarray(c) for c in per]), ref.counts)
    if as_torch:  # the accelerator's path (torch ops), run here on the CPU
        gpu_path = [sample_counts_mod._torch_counts(conv(s), E, "slime", None, None, True).numpy() for s in samples]
        np.testing.assert_array_equal(np.stack(gpu_path), ref.counts)
    w = hook.window_from_counts(per, ref.lengths, top_k=K)
    np.testing.assert_array_equal(w.counts, ref.counts)
    routes = [s[:, [0, 1, 3]] for s in samples]
    ref2 = import_replay(routes, format="routes", num_experts=E).window
    got = np.stack([np.asarray(hook.sample_counts(conv(r), E)) for r in routes])
    np.testing.assert_array_equal(got, ref2.counts)


def test_torch_hook_refuses_bad_routes(rng):
    """The torch path's checks (on an accelerator; run here on the CPU) and the numpy path's."""
    r = torch.from_numpy(_routes(rng, 5))
    big = r.numpy().copy()
    big[1, 0, 2] = E + 4
    with pytest.raises(InputError, match=r"sample 0 token 1 layer 0 has expert id 20, outside 0\.\.15"):
        hook.sample_counts(big, E)
    with pytest.raises(InputError, match="outside 0..15"):
        sample_counts_mod._torch_counts(r + E, E, "routes", None, None, True)
    bad = r.clone()
    bad[2, 1, 1] = bad[2, 1, 0]
    with pytest.raises(InputError, match="token 2 picks the same expert twice at layer 1"):
        sample_counts_mod._torch_counts(bad, E, "routes", None, None, True)
    z = r.clone()
    z[:, 3] = 0
    with pytest.raises(InputError, match="no routed token"):
        sample_counts_mod._torch_counts(z, E, "verl", torch.ones(5), None, True)
    with pytest.raises(InputError, match="no routed token at layer 3"):
        hook.sample_counts(z, E, format="verl", attention_mask=torch.ones(5))
    with pytest.raises(InputError, match="format: expected one of"):
        hook.sample_counts(r, E, format="megatron")


def test_verl_agent_loop_wrapper_and_driver_window(rng):
    """The wrapper puts each finished sample's counts in extra_fields (as verl 0.9.1's
    _agent_loop_postprocess returns the sample: routed_experts [1, S, La, K] int16 and
    attention_mask [1, S]); verl's DataProto carries them in non_tensor_batch through its
    reorder, and the driver's window from them equals the import of the whole batch."""
    verl = pytest.importorskip("verl")
    R, m = _verl(rng)

    class Worker:
        async def _agent_loop_postprocess(self, i):
            return types.SimpleNamespace(routed_experts=torch.from_numpy(R[i:i + 1]),
                                         attention_mask=torch.from_numpy(m[i:i + 1]), extra_fields={})

    original = hook.install_verl_agent_loop_counts(Worker, E)
    assert Worker._agent_loop_postprocess.__routepack__ and not getattr(original, "__routepack__", False)
    outs = [asyncio.run(Worker()._agent_loop_postprocess(i)) for i in range(R.shape[0])]
    col = np.empty(len(outs), dtype=object)
    col[:] = [o.extra_fields[hook.COUNTS_KEY] for o in outs]   # what verl's _postprocess builds
    data = verl.DataProto.from_dict(tensors={"attention_mask": torch.from_numpy(m)},
                                    non_tensors={hook.COUNTS_KEY: col})
    order = [3, 0, 4, 1, 2]
    data.reorder(torch.tensor(order))
    counts = hook.counts_from_non_tensor(data.non_tensor_batch)
    w = hook.window_from_counts(counts, data.batch["attention_mask"].sum(-1).numpy(), top_k=K)
    ref = import_replay(R, format="verl", num_experts=E, attention_mask=m).window
    np.testing.assert_array_equal(w.counts, ref.counts[order])
    np.testing.assert_array_equal(w.lengths, ref.lengths[order])
    with pytest.raises(InputError, match="has no _agent_loop_postprocess"):
        hook.install_verl_agent_loop_counts(object, E)


def test_slime_sample_counts_into_metadata(rng):
    r = _routes(rng, 6)
    s = types.SimpleNamespace(rollout_routed_experts=torch.from_numpy(r.astype(np.int32)), metadata=None)
    got = hook.slime_sample_counts(s, E)
    np.testing.assert_array_equal(s.metadata[hook.COUNTS_KEY], got)
    np.testing.assert_array_equal(got, import_replay([r], format="slime", num_experts=E).window.counts[0])
    assert hook.slime_sample_counts(types.SimpleNamespace(rollout_routed_experts=None), E) is None


def test_streaming_counts_in_any_order_equal_the_batch_import(rng):
    """Samples added as they finish (any order, counts or routes) give the batch import's window,
    running loads and a length order; bad or repeated samples are refused."""
    R, m = _verl(rng, B=7)
    ref = import_replay(R, format="verl", num_experts=E, attention_mask=m).window
    st = hook.StreamingCounts(7, La, E, K)
    for j, i in enumerate(rng.permutation(7).tolist()):
        if j % 2:
            st.add(i, ref.counts[i], int(ref.lengths[i]))
        else:
            st.add_routes(i, torch.from_numpy(R[i]), E, format="verl", attention_mask=torch.from_numpy(m[i]))
        if j == 2:
            part = st.partial_window()
            assert part.num_samples == 3
            with pytest.raises(InputError, match="4 samples have not arrived"):
                st.window()
    assert st.complete
    w = st.window()
    np.testing.assert_array_equal(w.counts, ref.counts)
    np.testing.assert_array_equal(w.lengths, ref.lengths)
    np.testing.assert_array_equal(st.loads_LE, ref.counts.sum(axis=0))
    assert [int(ref.lengths[i]) for i in st.length_order()] == sorted(ref.lengths.tolist(), reverse=True)
    st2 = hook.StreamingCounts(2, La, E, K)
    st2.add(0, ref.counts[0], int(ref.lengths[0]))
    with pytest.raises(InputError, match="sample 0 was already added"):
        st2.add(0, ref.counts[0], int(ref.lengths[0]))
    with pytest.raises(InputError, match="counts at layer 0 sum to"):
        st2.add(1, ref.counts[1], int(ref.lengths[1]) + 1)
    with pytest.raises(InputError, match="index: expected an integer in 0..1"):
        st2.add(5, ref.counts[1], int(ref.lengths[1]))
    with pytest.raises(InputError, match="num_samples: expected an integer ≥ 1"):
        hook.StreamingCounts(0, La, E, K)

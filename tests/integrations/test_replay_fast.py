"""The compiled import pass (replay/fast.py, replay/kernels.py) against the reference numpy path
(replay/reference.py, ``_from_*``, kept as the oracle and the error path) and a per-token loop."""

import numpy as np
import pytest

from routepack_opt.core.errors import InputError
from routepack_opt.integrations.replay import import_replay
from routepack_opt.replay import fast as fast_path
from routepack_opt.replay import reference

torch = pytest.importorskip("torch")
E, La, K = 16, 4, 3
DTYPES = (np.uint8, np.int64)  # each dtype is one more compiled specialisation per kernel


def _routes(rng, T, L=La, k=K):
    return np.argsort(rng.random((T, L, E)), axis=2)[:, :, :k].astype(np.int64)


def _same(fast, ref):
    """Both paths give the same counts, lengths, max id and report fields."""
    assert fast is not None, "the compiled pass fell back on valid routes"
    np.testing.assert_array_equal(fast[0].counts_NLE, ref[0].counts_NLE)
    np.testing.assert_array_equal(fast[0].lengths_N, ref[0].lengths_N)
    assert fast[0].max_id == ref[0].max_id
    assert fast[1:] == ref[1:]


def _verl_batch(rng, B=6, S=14, k=K, holes=True):
    """Left- and right-padded rows, the last position zero-filled (verl #7075), and some zero rows
    inside the mask (one layer of the first token) to impute from the next routed token."""
    R = np.zeros((B, S, La, k), np.int64)
    m = np.zeros((B, S), np.int64)
    for i in range(B):
        a = int(rng.integers(0, 3))
        b = int(rng.integers(a + 2, S + 1))
        m[i, a:b] = 1
        R[i, a:b] = _routes(rng, b - a, k=k)
        R[i, b - 1] = 0
        if holes and b - a > 2:
            R[i, a, 1] = 0
            R[i, a + 1, 2] = 0
    return R, m


@pytest.mark.parametrize("dtype", DTYPES + (np.int16,))  # int16: what verl 0.9.1 records
def test_verl_matches_reference(rng, dtype):
    R, m = _verl_batch(rng)
    fast = fast_path._fast_verl(R.astype(dtype), m, E, None, None)
    ref = reference._from_verl(R, m, E, None, None)
    _same(fast, ref)
    assert fast[3] > 6  # imputed tokens: each sample's last one and the holes
    # a torch tensor (uint8 as the rollout records int16/uint8) is read as a numpy view, same counts
    _same(fast_path._fast_verl(torch.from_numpy(R.astype(dtype)), torch.from_numpy(m).bool(), E, [1, 0, 1, 1], None),
          reference._from_verl(R, m, E, [1, 0, 1, 1], None))


def test_verl_top1_last_position_only(rng):
    """Top-1: only the last position's expert-0 route is unrouted; expert 0 elsewhere is load."""
    R, m = _verl_batch(rng, k=1, holes=False)
    R[0, np.flatnonzero(m[0])[0]] = 0   # a real route to expert 0, not padding
    _same(fast_path._fast_verl(R, m, E, None, None), reference._from_verl(R, m, E, None, None))


@pytest.mark.parametrize("dtype", DTYPES)
def test_slime_list_and_padded_match_reference(rng, dtype):
    samples = [_routes(rng, int(T)) for T in rng.integers(1, 12, 9)]
    for s in samples:
        s[:, 2] = 0  # a dense layer, detected
    cast = [s.astype(dtype) for s in samples]
    for pad_last in (True, False):
        _same(fast_path._fast_slime(cast, E, None, None, None, pad_last), reference._from_slime(samples, E, None, None, None, pad_last))
    P = np.zeros((9, 13, La, K), dtype)
    for i, s in enumerate(samples):
        P[i, :len(s)] = s
    lens = np.array([len(s) + 1 for s in samples])
    _same(fast_path._fast_slime(P, E, None, None, None, True), reference._from_slime(P, E, None, None, None, True))
    _same(fast_path._fast_slime(P, E, lens, None, None, True), reference._from_slime(P, E, lens, None, None, True))
    _same(fast_path._fast_slime(cast, E, None, [1, 1, 0, 1], None, True),
          reference._from_slime(samples, E, None, [1, 1, 0, 1], None, True))


@pytest.mark.parametrize("dtype", DTYPES)
def test_routes_flat_and_list_match_reference_and_token_loop(rng, dtype):
    lens = rng.integers(1, 10, 7)
    per = [_routes(rng, int(n)) for n in lens]
    flat = np.concatenate(per).astype(dtype)
    _same(fast_path._fast_routes(flat, lens, E, None, None), reference._from_routes(flat, lens, E, None, None))
    _same(fast_path._fast_routes([p.astype(dtype) for p in per], None, E, 2, None), reference._from_routes(per, None, E, 2, None))
    loop = np.zeros((len(per), La, E), np.int64)
    for i, r in enumerate(per):
        for t, l, k in np.ndindex(r.shape):
            loop[i, l, r[t, l, k]] += 1
    np.testing.assert_array_equal(import_replay(flat, num_experts=E, lengths=lens).window.counts, loop)


def test_list_chunks(rng, monkeypatch):
    """A sequence longer than one chunk is read chunk by chunk with the same counts."""
    monkeypatch.setattr(fast_path, "_LIST_CHUNK", 3)
    samples = [_routes(rng, int(T)) for T in rng.integers(1, 6, 8)]
    _same(fast_path._fast_slime(samples, E, None, None, None, True), reference._from_slime(samples, E, None, None, None, True))


@pytest.mark.parametrize("bad", ["range", "dup", "dense", "no_routed"])
def test_bad_routes_fall_back_to_the_reference_message(rng, bad):
    """The compiled pass flags a bad sample and the reference raises its exact message."""
    R, m = _verl_batch(rng, holes=False)
    samples = [_routes(rng, 5) for _ in range(4)]
    samples[2][:, 3] = 0
    for s in samples:
        s[:, 3] = 0
    if bad == "range":
        samples[1][2, 0, 1] = E
        R[3, np.flatnonzero(m[3])[0], 2, 0] = E + 3
    elif bad == "dup":
        samples[1][2, 0, 1] = samples[1][2, 0, 0]
        t = np.flatnonzero(m[3])[0]
        R[3, t, 2, 1] = R[3, t, 2, 0]
    elif bad == "dense":
        samples[3][1, 3] = [1, 2, 3]
    else:
        R[4, :, 1] = 0
    assert fast_path._fast_verl(R, m, E, None, None) is None or bad == "dense"
    assert fast_path._fast_slime(samples, E, None, None, None, True) is None or bad == "no_routed"
    for src, kw in ((R, dict(format="verl", attention_mask=m)), (samples, dict(format="slime"))):
        try:
            ref = reference._from_verl(R, m, E, None, None) if kw["format"] == "verl" else \
                reference._from_slime(samples, E, None, None, None, True)
        except InputError as exc:
            with pytest.raises(InputError, match="^" + __import__("re").escape(str(exc)) + "$"):
                import_replay(src, num_experts=E, **kw)
        else:
            np.testing.assert_array_equal(import_replay(src, num_experts=E, **kw).window.counts, ref[0].counts_NLE)


def test_unsupported_inputs_take_the_reference_path(rng):
    """Non-contiguous arrays and uint64 ids are not the compiled pass's: the reference reads them."""
    R, m = _verl_batch(rng)
    strided = np.asfortranarray(R)
    assert fast_path._fast_verl(strided, m, E, None, None) is None
    assert fast_path._fast_verl(R.astype(np.uint64), m, E, None, None) is None
    np.testing.assert_array_equal(import_replay(strided, format="verl", num_experts=E, attention_mask=m).window.counts,
                                  import_replay(R, format="verl", num_experts=E, attention_mask=m).window.counts)


def test_read_only_samples_in_a_list(rng, recwarn):
    """Read-only samples (an .npz member, np.frombuffer) mixed with writable ones: same counts, no warning."""
    samples = [_routes(rng, int(T)) for T in (4, 6, 3)]
    samples[1].setflags(write=False)
    _same(fast_path._fast_routes(samples, None, E, None, None), reference._from_routes(samples, None, E, None, None))
    assert not [w for w in recwarn if "unsafe cast" in str(w.message)]


def test_warm_import_runs_once_per_kind(monkeypatch):
    """A seam warms the import every step: only the first call of a (format, container, dtype,
    rank) imports anything; another dtype imports again."""
    import numpy as np

    from routepack_opt.replay import importer as replay

    calls = []
    monkeypatch.setattr(replay, "_WARMED", set())
    monkeypatch.setattr(replay, "import_replay", lambda src, **kw: calls.append(kw["format"]))
    routes = [np.zeros((5, 2, 2), dtype=np.int32) + np.array([0, 1], dtype=np.int32)]
    for _ in range(3):
        replay.warm_import(routes, format="slime", num_experts=4, lengths=[6])
    assert calls == ["slime"]
    replay.warm_import([r.astype(np.int16) for r in routes], format="slime", num_experts=4, lengths=[6])
    assert calls == ["slime", "slime"]

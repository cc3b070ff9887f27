"""Routing-replay import (routepack_opt.integrations.replay) and `routepack import-replay`."""

import json

import numpy as np
import pytest

from routepack_opt.core.errors import InputError
from routepack_opt.core.window import Window, load_window
from routepack_opt.integrations.replay import import_replay, slime_pad_routes, window_from_replay


def _routes(rng, T, L, K, E):
    """[T, L, K] routes, K distinct experts per token and layer."""
    return np.argsort(rng.random((T, L, E)), axis=2)[:, :, :K].astype(np.int64)


def _brute_counts(routes_list, E):
    """counts[i, l, e] by a plain loop over tokens."""
    L = routes_list[0].shape[1]
    out = np.zeros((len(routes_list), L, E), dtype=np.int64)
    for i, r in enumerate(routes_list):
        for t in range(r.shape[0]):
            for l in range(L):
                for e in r[t, l]:
                    out[i, l, e] += 1
    return out


def test_plain_routes_match_token_loop(rng):
    """Plain concatenated routes give the same counts as a per-token loop and Window.from_routes."""
    E, L, K = 8, 3, 2
    lens = [5, 1, 9, 4]
    per = [_routes(rng, n, L, K, E) for n in lens]
    w = window_from_replay(np.concatenate(per), format="routes", num_experts=E, lengths=lens)
    assert w.lengths.tolist() == lens
    np.testing.assert_array_equal(w.counts, _brute_counts(per, E))
    np.testing.assert_array_equal(w.counts, Window.from_routes(lens, np.concatenate(per), E).counts)


def test_slime_counts_pad_route_and_drops_dense_layers(rng):
    """slime: length = recorded + 1, the last token counts slime's own pad route, all-zero dense layers are dropped."""
    E, La, K = 8, 4, 2
    samples = []
    for T in (6, 3, 10):
        r = _routes(rng, T, La, K, E)
        r[:, 1] = 0  # dense layer (moe_layer_freq = [1, 0, 1, 1])
        samples.append(r)
    imp = import_replay(samples, format="slime", num_experts=E)
    assert imp.dropped_layers == (1,) and imp.moe_layers == (0, 2, 3)
    assert imp.window.lengths.tolist() == [7, 4, 11]
    pad = slime_pad_routes(La, K, E)[None]
    expect = _brute_counts([np.concatenate([s, pad])[:, [0, 2, 3]] for s in samples], E)
    np.testing.assert_array_equal(imp.window.counts, expect)
    same = import_replay(samples, format="slime", num_experts=E, moe_layer_freq=[1, 0, 1, 1])
    np.testing.assert_array_equal(same.window.counts, imp.window.counts)


def test_slime_moe_layer_freq_int(rng):
    """slime: an integer moe_layer_freq keeps layers l % f == 0 (Megatron's rule)."""
    E, La, K = 4, 4, 1
    samples = [_routes(rng, 5, La, K, E)]
    imp = import_replay(samples, format="slime", num_experts=E, moe_layer_freq=2, pad_last=False)
    assert imp.moe_layers == (0, 2)
    np.testing.assert_array_equal(imp.window.counts, _brute_counts([samples[0][:, [0, 2]]], E))


def test_slime_reads_one_sample_at_a_time(rng):
    """slime import streams: each sample is fetched once, in order, from a lazy sequence."""
    E, La, K = 8, 2, 2
    data = [_routes(rng, T, La, K, E) for T in (4, 5, 6)]
    seen = []

    class Lazy:
        def __len__(self):
            return len(data)

        def __getitem__(self, i):
            seen.append(i)
            return data[i].copy()

    w = window_from_replay(_LazyList(Lazy()), format="slime", num_experts=E)
    assert seen == [0, 1, 2]
    assert w.num_samples == 3


class _LazyList(list):
    """A list subclass that defers element access to a lazy source."""

    def __init__(self, src):
        super().__init__([None] * len(src))
        self._src = src

    def __getitem__(self, i):
        return self._src[i]


def test_verl_padding_and_zero_filled_last_position_are_not_expert_0(rng):
    """verl #7075: padding and the zero-filled last position are not load on expert 0 (imputed, reported)."""
    import torch

    E, La, K, S = 8, 2, 2, 12
    lens = [7, 12, 3]
    true = [_routes(rng, n, La, K, E) for n in lens]
    R = torch.zeros(len(lens), S, La, K, dtype=torch.int64)
    mask = torch.zeros(len(lens), S, dtype=torch.int64)
    for b, (n, r) in enumerate(zip(lens, true)):
        off = S - n if b == 0 else 0  # left padding for sample 0, right for the others
        R[b, off:off + n - 1] = torch.from_numpy(r[:-1])  # the engine does not return the last route
        mask[b, off:off + n] = 1
    imp = import_replay(R, format="verl", num_experts=E, attention_mask=mask)
    assert imp.window.lengths.tolist() == lens
    assert imp.imputed_tokens == len(lens)
    # The last token copies the previous token's routes: expected counts are known exactly.
    fixed = [np.concatenate([r[:-1], r[-2:-1]]) for r in true]
    np.testing.assert_array_equal(imp.window.counts, _brute_counts(fixed, E))
    naive = _brute_counts([np.concatenate([r[:-1], np.zeros_like(r[-1:])]) for r in true], E)
    assert (imp.window.counts[:, :, 0] < naive[:, :, 0]).any()  # naive counting inflates expert 0


@pytest.mark.parametrize("suffix", [".npy", ".pt", ".safetensors", ".npz"])
def test_files_round_trip(rng, tmp_path, suffix):
    """Plain routes from .npy (+ lengths), .pt, .safetensors and .npz give the in-memory counts."""
    import torch

    E, L, K = 6, 2, 2
    lens = np.array([3, 5, 2])
    routes = np.concatenate([_routes(rng, n, L, K, E) for n in lens])
    path = tmp_path / f"r{suffix}"
    kw = {}
    if suffix == ".npy":
        np.save(path, routes)
        np.save(tmp_path / "len.npy", lens)
        kw["lengths"] = str(tmp_path / "len.npy")
    elif suffix == ".pt":
        torch.save({"routes": torch.from_numpy(routes), "lengths": torch.from_numpy(lens)}, path)
    elif suffix == ".npz":
        np.savez(path, routes=routes, lengths=lens)
    else:
        from safetensors.numpy import save_file

        save_file({"routes": routes, "lengths": lens}, str(path))
    w = window_from_replay(str(path), format="routes", num_experts=E, **kw)
    np.testing.assert_array_equal(w.counts, Window.from_routes(lens, routes, E).counts)


@pytest.mark.parametrize("case, match", [
    ("id_too_big", "outside 0..7"),
    ("negative", "outside 0..7"),
    ("wrong_topk", "top-k is 2"),
    ("ragged", "ragged"),
    ("lengths", "tokens but lengths sum"),
    ("duplicate", "same expert twice"),
    ("float", "integer expert ids"),
])
def test_bad_routes_one_clear_error(rng, case, match):
    """Bad routes (ids ≥ E, negative, wrong/ragged top-k, mismatched lengths, duplicates) raise InputError."""
    E, L, K = 8, 2, 2
    lens = [3, 4]
    per = [_routes(rng, n, L, K, E) for n in lens]
    kw = dict(format="routes", num_experts=E, lengths=lens)
    if case == "id_too_big":
        per[1][2, 1, 0] = E
    elif case == "negative":
        per[0][0, 0, 1] = -1
    elif case == "wrong_topk":
        kw["top_k"] = 3
    elif case == "ragged":
        kw = dict(format="slime", num_experts=E)
        per[1] = per[1][:, :, :1]
    elif case == "lengths":
        kw["lengths"] = [3, 5]
    elif case == "duplicate":
        per[1][1, 0, 1] = per[1][1, 0, 0]
    elif case == "float":
        per = [p + 0.5 for p in per]
    src = per if case == "ragged" else np.concatenate(per)
    with pytest.raises(InputError, match=match):
        import_replay(src, **kw)


def test_verl_mask_mismatch_and_slime_lengths(rng):
    """verl without/with a mismatched mask, and slime lengths that are not recorded+1, are InputErrors."""
    E, La, K = 8, 2, 2
    R = np.zeros((2, 5, La, K), dtype=np.int64)
    with pytest.raises(InputError, match="attention_mask"):
        import_replay(R, format="verl", num_experts=E)
    with pytest.raises(InputError, match="does not match"):
        import_replay(R, format="verl", num_experts=E, attention_mask=np.ones((2, 4)))
    samples = [_routes(rng, 4, La, K, E)]
    with pytest.raises(InputError, match="len - 1"):
        import_replay(samples, format="slime", num_experts=E, lengths=[4])


def test_cli_import_replay(run_cli, rng, tmp_path):
    """`routepack import-replay` writes a loadable window atomically; bad input is one error line, exit 2."""
    import torch

    E, La, K = 8, 3, 2
    samples = [torch.from_numpy(_routes(rng, n, La, K, E)) for n in (5, 9, 2)]
    torch.save(samples, tmp_path / "slime.pt")
    code, out, err = run_cli("import-replay", tmp_path / "slime.pt", "--format", "slime",
                             "--num-experts", E, "-o", tmp_path / "w.npz", "--json")
    assert code == 0, err
    rep = json.loads(out)
    w = load_window(tmp_path / "w.npz")
    assert w.lengths.tolist() == [6, 10, 3] and rep["pad_tokens"] == 3
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    code, out, err = run_cli("import-replay", tmp_path / "slime.pt", "--format", "slime",
                             "--num-experts", 4, "-o", tmp_path / "w2.npz")
    assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "w2.npz").exists()
    code, _, err = run_cli("import-replay", tmp_path / "slime.pt", "--format", "slime",
                           "--num-experts", E, "-o", tmp_path / "slime.pt")
    assert code == 2 and "overwrite the input" in err


def test_cli_import_replay_verl_pt(run_cli, rng, tmp_path):
    """`routepack import-replay --format verl` reads a .pt dict (routed_experts + attention_mask) and reports imputed rows."""
    import torch

    E, La, K, S = 8, 2, 2, 9
    lens = [9, 4, 6]
    R = torch.zeros(3, S, La, K, dtype=torch.int64)
    mask = torch.zeros(3, S, dtype=torch.int64)
    for b, n in enumerate(lens):
        R[b, :n - 1] = torch.from_numpy(_routes(rng, n - 1, La, K, E))
        mask[b, :n] = 1
    torch.save({"routed_experts": R, "attention_mask": mask}, tmp_path / "verl.pt")
    code, out, err = run_cli("import-replay", tmp_path / "verl.pt", "--format", "verl", "--num-experts", E,
                             "-o", tmp_path / "w.npz", "--json")
    assert code == 0, err
    assert json.loads(out)["imputed_tokens"] == 3
    assert load_window(tmp_path / "w.npz").lengths.tolist() == lens
    code, _, err = run_cli("import-replay", tmp_path / "verl.pt", "--format", "verl", "--num-experts", E,
                           "--top-k", 3, "-o", tmp_path / "w2.npz")
    assert code == 2 and "top-k" in err

"""Routing-replay import (routepack_opt.replay, re-exported as routepack_opt.integrations.replay) and
`routepack import-replay`."""

import json
from pathlib import Path

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


# --- containers trainers write (issue 29 item 5) ---------------------------------------------------
def _slime_step(rng, E=16, La=4, K=2, lens=(6, 3, 9)):
    """slime's record of one step: per-sample [len - 1, La, K] numpy arrays, layer 1 dense."""
    samples = []
    for n in lens:
        r = _routes(rng, n - 1, La, K, E)
        r[:, 1] = 0
        samples.append(r)
    return samples, list(lens)


def _padded(samples):
    """The samples stacked into one zero-padded [N, T, La, K] array."""
    T = max(len(s) for s in samples)
    out = np.zeros((len(samples), T) + samples[0].shape[1:], dtype=samples[0].dtype)
    for i, s in enumerate(samples):
        out[i, :len(s)] = s
    return out


def _write(kind, path, samples, lens):
    """Write the step in one container; returns the keyword arguments the import needs."""
    import torch

    if kind == "pt_list_numpy":
        torch.save(samples, path)
    elif kind == "pt_list_tensors":
        torch.save([torch.from_numpy(s) for s in samples], path)
    elif kind == "pt_dict":
        torch.save({"rollout_routed_experts": samples, "total_lengths": lens}, path)
    elif kind == "pt_padded":
        torch.save(torch.from_numpy(_padded(samples)), path)
    elif kind == "npz_positional":
        np.savez(path, *samples)
    elif kind == "npz_dict_padded":
        np.savez(path, rollout_routed_experts=_padded(samples), total_lengths=np.array(lens))
    elif kind == "npy_object":
        arr = np.empty(len(samples), dtype=object)
        arr[:] = samples
        np.save(path, arr, allow_pickle=True)
    elif kind == "npy_object_equal_shapes":  # np.array(equal-shape arrays, dtype=object) is 4-D
        np.save(path, np.array([s[:2] for s in samples], dtype=object), allow_pickle=True)
    elif kind == "safetensors_padded":
        from safetensors.numpy import save_file

        save_file({"rollout_routed_experts": _padded(samples), "total_lengths": np.array(lens)}, str(path))
    return {}


_CONTAINERS = {"pt_list_numpy": ".pt", "pt_list_tensors": ".pt", "pt_dict": ".pt", "pt_padded": ".pt",
               "npz_positional": ".npz", "npz_dict_padded": ".npz", "npy_object": ".npy",
               "npy_object_equal_shapes": ".npy", "safetensors_padded": ".safetensors"}


@pytest.mark.parametrize("kind", sorted(_CONTAINERS))
def test_slime_containers_give_the_in_memory_window(rng, tmp_path, kind):
    """Every container slime's routes are saved in (docs/formats.md) imports to the window of the in-memory list."""
    samples, lens = _slime_step(rng)
    if kind == "npy_object_equal_shapes":
        samples, lens = [s[:2] for s in samples], [3] * len(samples)
    path = tmp_path / f"r{_CONTAINERS[kind]}"
    _write(kind, path, samples, lens)
    imp = import_replay(str(path), format="slime", num_experts=16)
    ref = import_replay(samples, format="slime", num_experts=16)
    assert imp.window.lengths.tolist() == lens
    np.testing.assert_array_equal(imp.window.counts, ref.window.counts)
    assert imp.dropped_layers == (1,)
    if "padded" in kind:
        assert imp.padding_rows == sum(max(lens) - 1 - (n - 1) for n in lens)
        assert any("padded" in n for n in imp.notes)


def test_padded_slime_tensor_is_cut_not_called_duplicate(rng):
    """A padded [N, T, La, K] slime tensor: without lengths cut after the last routed row (K ≥ 2), at
    top-1 refused unless lengths are given; all-zero rows inside a list are named as padding."""
    samples, lens = _slime_step(rng)
    imp = import_replay(_padded(samples), format="slime", num_experts=16)
    assert imp.window.lengths.tolist() == lens and "cut at its last routed row" in imp.notes[0]
    with_len = import_replay(_padded(samples), format="slime", num_experts=16, lengths=lens)
    np.testing.assert_array_equal(with_len.window.counts, imp.window.counts)
    assert "cut at its length" in with_len.notes[0]
    top1 = [s[:, :, :1] for s in samples]
    with pytest.raises(InputError, match="top-1 padding cannot be told"):
        import_replay(_padded(top1), format="slime", num_experts=16)
    ok = import_replay(_padded(top1), format="slime", num_experts=16, lengths=lens)
    assert ok.window.lengths.tolist() == lens
    with pytest.raises(InputError, match="lengths: sample 0 has 99 tokens"):
        import_replay(_padded(samples), format="slime", num_experts=16, lengths=[99, 3, 9])
    padded_list = [np.concatenate([s, np.zeros((2,) + s.shape[1:], dtype=s.dtype)]) for s in samples]
    with pytest.raises(InputError, match="all-zero at every layer: padding, not a route"):
        import_replay(padded_list, format="slime", num_experts=16)


def _evil(marker):
    """An object whose unpickling would create ``marker`` (what a full unpickle runs)."""
    import os

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    return Evil()


@pytest.mark.parametrize("suffix", [".pt", ".npy", ".npz"])
def test_unsafe_pickles_are_refused_without_running(tmp_path, monkeypatch, suffix):
    """A pickle that would run code (.pt, object .npy, object .npz member) is refused, short, and never runs."""
    import pickle

    import torch

    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "ran"
    path = Path(f"evil{suffix}")
    if suffix == ".pt":
        torch.save([_evil(marker)], path)
    else:
        import io
        buf = io.BytesIO()
        np.lib.format.write_array_header_1_0(buf, {"descr": "|O", "fortran_order": False, "shape": (1,)})
        pickle.dump(_evil(marker), buf, protocol=3)
        if suffix == ".npy":
            path.write_bytes(buf.getvalue())
        else:
            import zipfile
            with zipfile.ZipFile(path, "w") as zf:
                zf.writestr("arr_0.npy", buf.getvalue())
    with pytest.raises(InputError) as exc:
        import_replay(str(path), format="slime", num_experts=8)
    msg = str(exc.value)
    assert "system" in msg and len(msg) <= 200 and "\x1b" not in msg and "\n" not in msg
    assert not marker.exists()


def test_num_experts_beyond_the_ids_is_accepted_with_a_note(rng):
    """--num-experts 64 with ids reaching 15: the window has E = 64 and one note says so; E = 16 has no note."""
    samples, _ = _slime_step(rng)
    wide = import_replay(samples, format="slime", num_experts=64)
    assert wide.window.num_experts == 64 and wide.max_expert_id == 15
    assert len(wide.notes) == 1 and "reach only 15" in wide.notes[0]
    assert import_replay(samples, format="slime", num_experts=16).notes == ()


@pytest.mark.parametrize("fmt", ["slime", "verl", "routes"])
def test_moe_layer_freq_honoured_in_every_format(rng, fmt):
    """moe_layer_freq keeps layers l % f == 0 in every format: the same counts as slicing the routes by hand."""
    E, La, K = 8, 4, 2
    lens = [4, 6]
    per = [_routes(rng, n, La, K, E) for n in lens]
    if fmt == "slime":
        src, kw = per, dict(pad_last=False)
    elif fmt == "verl":
        R = np.stack([np.concatenate([p, np.zeros((6 - len(p), La, K), dtype=np.int64)]) for p in per])
        mask = np.array([[1] * n + [0] * (6 - n) for n in lens])
        src, kw = R, dict(attention_mask=mask)
    else:
        src, kw = np.concatenate(per), dict(lengths=lens)
    imp = import_replay(src, format=fmt, num_experts=E, moe_layer_freq=2, **kw)
    assert imp.moe_layers == (0, 2) and imp.dropped_layers == (1, 3)
    np.testing.assert_array_equal(imp.window.counts, _brute_counts([p[:, [0, 2]] for p in per], E))


@pytest.mark.parametrize("kw, match", [
    (dict(moe_layer_freq=0), "moe_layer_freq: must be ≥ 1"),
    (dict(moe_layer_freq=[0, 0]), "at least one 1"),
    (dict(moe_layer_freq=True), "moe_layer_freq: expected"),
    (dict(num_experts=99999999999999999999999), "more than 2147483647"),
    (dict(num_experts=0), "positive integer"),
    (dict(num_experts=2.5), "positive integer"),
    (dict(lengths=[[3, 4], [3, 4]]), "expected a 1-D vector"),
])
@pytest.mark.parametrize("fmt", ["slime", "verl", "routes"])
def test_bad_settings_refused_before_reading(tmp_path, fmt, kw, match):
    """Bad moe_layer_freq, num_experts or a 2-D lengths are one short InputError before the routes are read."""
    args = dict(format=fmt, num_experts=8)
    args.update(kw)
    with pytest.raises(InputError, match=match) as exc:
        import_replay(str(tmp_path / "not_read.pt"), **args)  # the file does not exist: it is never opened
    assert len(str(exc.value)) <= 200


@pytest.mark.parametrize("case", ["wrong_format_keys", "routes_npz_positional_lengths", "verl_list",
                                  "text_file", "lengths_float"])
def test_more_bad_containers_one_short_error(rng, tmp_path, case):
    """Wrong keys for the format, mismatched lengths, a list given as verl, a non-routes file: one short error."""
    import torch

    samples, lens = _slime_step(rng)
    path = tmp_path / "r.pt"
    fmt, kw, match = "slime", {}, None
    if case == "wrong_format_keys":
        torch.save({"rollout_routed_experts": samples}, path)
        fmt, match = "routes", "looks like format 'slime'"
    elif case == "routes_npz_positional_lengths":
        path = tmp_path / "r.npz"
        np.savez(path, *samples)
        fmt, kw, match = "routes", dict(lengths=[1, 2, 3]), "has 1 tokens but 5 routes"
    elif case == "verl_list":
        torch.save(samples, path)
        fmt, match = "verl", "list of per-sample arrays"
    elif case == "text_file":
        path.write_text("not a checkpoint " * 50)
        match = "not a readable"
    else:
        kw, match = dict(lengths=[6.5, 3, 9]), "integer token counts"
    with pytest.raises(InputError, match=match) as exc:
        import_replay(str(path), format=fmt, num_experts=16, **kw)
    assert len(str(exc.value)) <= 200 and "\x1b" not in str(exc.value)


def test_plain_routes_as_a_per_sample_list(rng, tmp_path):
    """Plain routes saved per sample (np.savez(*arrays)) have T_i tokens each: the concatenated routes' window."""
    E, L, K = 8, 2, 2
    per = [_routes(rng, n, L, K, E) for n in (3, 1, 4)]
    np.savez(tmp_path / "r.npz", *per)
    w = window_from_replay(str(tmp_path / "r.npz"), format="routes", num_experts=E)
    ref = Window.from_routes([3, 1, 4], np.concatenate(per), E)
    np.testing.assert_array_equal(w.counts, ref.counts)
    assert w.lengths.tolist() == [3, 1, 4]


def test_plan_micro_batches_with_huge_num_experts_is_an_input_error():
    """plan_micro_batches(routes=..., num_experts=2**40): an InputError about memory, not a MemoryError."""
    from routepack_opt.api import plan_micro_batches

    with pytest.raises(InputError, match="needs about"):
        plan_micro_batches([2, 2], routes=np.zeros((4, 1, 1), dtype=np.int64), num_experts=2**40,
                           dp_size=1, ep_size=1, max_tokens=8)


@pytest.mark.parametrize("out, match", [("dir", "is a directory"), ("", "output name is empty"),
                                        ("newdir/", "names a directory")])
def test_cli_import_replay_refuses_bad_outputs_before_importing(run_cli, tmp_path, monkeypatch, out, match):
    """import-replay -o DIR / "" / newdir/: exit 2, one line, before the import (the routes file is bad too), nothing written."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dir").mkdir()
    (tmp_path / "bad.pt").write_text("not routes")
    code, _, err = run_cli("import-replay", "bad.pt", "--format", "slime", "--num-experts", 8, "-o", out)
    assert code == 2 and match in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.pt", "dir"]


@pytest.mark.parametrize("extra, match", [
    (["--num-experts", "99999999999999999999999"], "more than 2147483647"),
    (["--num-experts", "16", "--lengths", "len2d.npy"], "expected a 1-D vector"),
    (["--num-experts", "16", "--moe-layer-freq", "0"], "must be ≥ 1"),
    (["--num-experts", "16", "--moe-layer-freq", "1,x"], "comma list of 0/1"),
    (["--num-experts", "16", "--step", "-1"], "must be ≥ 0"),
    (["--num-experts", "16", "--top-k", "0"], "must be ≥ 1"),
])
def test_cli_import_replay_bad_settings_exit_2(run_cli, rng, tmp_path, monkeypatch, extra, match):
    """import-replay with a huge --num-experts, 2-D --lengths, --moe-layer-freq 0, --step -1: exit 2, one short line."""
    monkeypatch.chdir(tmp_path)
    np.save("flat.npy", np.concatenate([_routes(rng, n, 2, 2, 16) for n in (3, 4)]))
    np.save("len2d.npy", np.array([[3, 4], [3, 4]]))
    code, _, err = run_cli("import-replay", "flat.npy", "--lengths", "len2d.npy" if "len2d.npy" in extra else
                           "len.npy", *extra, "-o", "w.npz")
    assert code == 2 and match in err and len(err.strip().splitlines()) == 1 and len(err) <= 200
    assert not (tmp_path / "w.npz").exists()


def test_cli_import_replay_prints_notes(run_cli, rng, tmp_path, monkeypatch):
    """import-replay prints each note (padding cut, E beyond the ids) on its own line and in --json."""
    monkeypatch.chdir(tmp_path)
    samples, lens = _slime_step(rng)
    np.savez("padded.npz", rollout_routed_experts=_padded(samples))
    code, out, err = run_cli("import-replay", "padded.npz", "--format", "slime", "--num-experts", 64, "-o", "w.npz")
    assert code == 0, err
    notes = [line for line in out.splitlines() if line.startswith("note: ")]
    assert len(notes) == 2 and "padded" in notes[0] and "reach only 15" in notes[1]
    code, out, _ = run_cli("import-replay", "padded.npz", "--format", "slime", "--num-experts", 64, "-o", "w.npz",
                           "--json")
    assert code == 0 and len(json.loads(out)["notes"]) == 2


def test_counts_larger_than_memory_refused_before_allocating(rng, monkeypatch):
    """num_experts whose counts [N, L, E] exceed the memory available: one short InputError, nothing allocated."""
    import routepack_opt.replay.routes as replay

    monkeypatch.setattr(replay, "available_memory", lambda: 2**30)
    samples, _ = _slime_step(rng)
    with pytest.raises(InputError, match=r"need 18\.0 GiB, 1\.0 GiB is available") as exc:
        import_replay(samples, format="slime", num_experts=2**28)
    assert len(str(exc.value)) <= 200
    assert import_replay(samples, format="slime", num_experts=16).window.num_experts == 16

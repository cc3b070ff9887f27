"""Window validation, routes aggregation and .npz round trip."""

import numpy as np
import pytest

from routepack_opt.core.errors import InputError
from routepack_opt.core.testing import random_window
from routepack_opt.core.window import Window, load_window, save_window


def test_valid_window_is_read_only_and_infers_top_k():
    """A valid window infers k from the counts and cannot be mutated."""
    w = random_window(8, 3, 6, 2, seed=1)
    w2 = Window(w.lengths, w.counts)
    assert w2.top_k == 2
    with pytest.raises(ValueError):
        w2.lengths[0] = 5
    assert w2.expert_loads().sum() == 2 * w.lengths.sum() * 3


@pytest.mark.parametrize("mutate, match", [
    (lambda l, c: (l * 0, c), "at least 1 token"),
    (lambda l, c: (-l, c), "at least 1 token"),
    (lambda l, c: (l, c[:, 0]), "expected 3 dimensions"),
    (lambda l, c: (l[:-1], c), "does not match"),
    (lambda l, c: (l, np.where(np.arange(c.size).reshape(c.shape) == 0, -1, c)), "negative"),
    (lambda l, c: (l, c.astype(float) * np.nan), "NaN"),
    (lambda l, c: (l, c + (np.arange(c.size).reshape(c.shape) == 0)), "expected top_k"),
])
def test_bad_windows_raise_precise_errors(mutate, match):
    """Malformed windows raise an InputError naming the problem."""
    w = random_window(6, 2, 4, 2, seed=3)
    lengths, counts = mutate(w.lengths.copy(), w.counts.copy())
    with pytest.raises(InputError, match=match):
        Window(lengths, counts, top_k=2)


def test_count_above_length_rejected():
    """A sample cannot send more tokens to one expert than it has (top-k experts are distinct)."""
    counts = np.array([[[2, 0]]])
    with pytest.raises(InputError, match="only 1 tokens"):
        Window([1], counts, top_k=2)


def test_from_routes_aggregates_counts():
    """Per-token replayed routes aggregate to the counts a direct loop gives."""
    rng = np.random.default_rng(0)
    lengths = np.array([3, 1, 4])
    L, E, K = 2, 5, 2
    routes = np.stack([np.stack([rng.choice(E, K, replace=False) for _ in range(L)]) for _ in range(lengths.sum())])
    w = Window.from_routes(lengths, routes, E)
    direct = np.zeros((3, L, E), int)
    sample = np.repeat(np.arange(3), lengths)
    for t in range(lengths.sum()):
        for l in range(L):
            for e in routes[t, l]:
                direct[sample[t], l, e] += 1
    assert np.array_equal(w.counts, direct) and w.top_k == K


def test_from_routes_rejects_duplicate_expert():
    """A token that picks one expert twice is rejected."""
    with pytest.raises(InputError, match="same expert twice"):
        Window.from_routes([1], np.array([[[1, 1]]]), 3)


def test_npz_round_trip(tmp_path):
    """save_window / load_window preserve every field."""
    w = random_window(5, 2, 4, 2, seed=2).replace(group_ids=np.array([0, 0, 1, 1, 2]), step=7)
    save_window(w, tmp_path / "w.npz")
    w2 = load_window(tmp_path / "w.npz")
    assert np.array_equal(w.lengths, w2.lengths) and np.array_equal(w.counts, w2.counts)
    assert w2.top_k == 2 and w2.step == 7 and np.array_equal(w2.group_ids, w.group_ids)


def test_truncated_npz_is_an_input_error(tmp_path):
    """A truncated .npz gives an InputError, not a zipfile traceback."""
    w = random_window(5, 2, 4, 2, seed=2)
    save_window(w, tmp_path / "w.npz")
    data = (tmp_path / "w.npz").read_bytes()
    (tmp_path / "t.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="not a readable"):
        load_window(tmp_path / "t.npz")


def test_copy_false_takes_arrays_of_the_window_dtypes():
    """Window(copy=False) holds an int64 lengths / C-contiguous int32 counts array as it is
    (read-only from then on) and still copies anything else; the checks run either way."""
    w = random_window(num_samples=12, num_layers=2, num_experts=8, top_k=2, seed=4)
    lengths, counts = w.lengths.copy(), w.counts.copy()
    taken = Window(lengths, counts, top_k=2, copy=False)
    assert np.shares_memory(taken.counts, counts) and np.shares_memory(taken.lengths, lengths)
    assert not counts.flags.writeable
    copied = Window(lengths, counts.astype(np.int64), top_k=2, copy=False)  # wrong dtype: copied
    assert not np.shares_memory(copied.counts, counts) and copied.counts.dtype == np.int32
    assert not np.shares_memory(Window(w.lengths, w.counts).counts, w.counts)  # the default copies
    bad = w.counts.copy()
    bad[0, 0, 0] += 1
    with pytest.raises(InputError):
        Window(w.lengths.copy(), bad, top_k=2, copy=False)


def test_int32_file_loads_without_a_second_copy(tmp_path):
    """An int32 .npz window loads equal to the saved one, int32 and read-only (its array is
    taken, not copied)."""
    w = random_window(num_samples=10, num_layers=2, num_experts=8, top_k=2, seed=5)
    np.savez(tmp_path / "w.npz", lengths=w.lengths, counts=w.counts.astype(np.int32), top_k=2)
    got = load_window(tmp_path / "w.npz")
    assert np.array_equal(got.counts, w.counts) and np.array_equal(got.lengths, w.lengths)
    assert not got.counts.flags.writeable and got.counts.dtype == np.int32

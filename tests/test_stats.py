"""Window statistics (issue 15): routing dispersion, length and skew statistics, ``routepack stats``."""

import json

import numpy as np
import pytest

from routepack_opt.core.window import Window, save_window
from routepack_opt.stats import _subsample_routes, dispersion_of_counts, length_stats, routing_dispersion, skew_stats


def _iid_window(N=300, L=3, E=16, K=2, length=256, seed=0, disjoint=False):
    """Every sample's routes drawn from one distribution (or, with ``disjoint``, from its own
    pair of experts)."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(E) * 2, size=L)
    counts = np.zeros((N, L, E), dtype=np.int64)
    if disjoint:
        e = (2 * np.arange(N)) % E
        counts[np.arange(N), :, e] = length
        counts[np.arange(N), :, e + 1] = length
    else:
        # K distinct experts per token, drawn in proportion to p without replacement (exact
        # per-token routes): the K largest of log p + Gumbel noise, the Gumbel-top-k trick, whose
        # law is that of K successive draws (a loop of rng.choice took 15 s)
        keys = np.log(p)[None, :, None, :] + rng.gumbel(size=(N, L, length, E))
        top = np.argpartition(-keys, K - 1, axis=-1)[..., :K]
        np.add.at(counts, (np.arange(N)[:, None, None, None], np.arange(L)[None, :, None, None], top), 1)
    return Window(np.full(N, length), counts, top_k=K)


def test_subsample_is_a_hypergeometric_draw():
    """Each subsample takes exactly m routes and never more of an expert than the sample has."""
    rng = np.random.default_rng(3)
    c = rng.integers(0, 20, size=(500, 12))
    sub = _subsample_routes(c, c.sum(axis=1), 37, rng)
    assert (sub.sum(axis=1) == 37).all() and (sub <= c).all() and (sub >= 0).all()
    # mean of the draw = m · c / total (unbiased), checked on one row repeated
    row = np.tile(np.array([[5, 0, 15, 30]]), (20000, 1))
    mean = _subsample_routes(row, row.sum(axis=1), 10, rng).mean(axis=0)
    np.testing.assert_allclose(mean, 10 * row[0] / 50, atol=0.05)


def test_dispersion_formula_matches_definition():
    """X = Σ_{p>0} (c − m p)² / (m p) / (E − 1), experts with p = 0 skipped."""
    c = np.array([[3, 1, 0, 4]])
    p = np.array([[0.5, 0.25, 0.0, 0.25]])
    m = 8
    want = ((3 - 4) ** 2 / 4 + (1 - 2) ** 2 / 2 + (4 - 2) ** 2 / 2) / 3
    assert dispersion_of_counts(c, p)[0] == pytest.approx(want)
    assert m == c.sum()


def test_iid_routing_sits_near_one_and_disjoint_far_above():
    """Samples that route like the aggregate give ≈ 0.9–1; sample-specific experts give ≫ 1."""
    iid = routing_dispersion(_iid_window(), tokens=64)
    assert 0.8 < iid["median"] < 1.1 and iid["pairs"] == 900
    dis = routing_dispersion(_iid_window(N=40, disjoint=True), tokens=64)
    assert dis["median"] > 5


def test_dispersion_deterministic_and_skips_short_samples():
    """Same seed → same figures; samples shorter than n tokens are skipped and counted."""
    w = _iid_window(N=60, length=100)
    w = w.replace(lengths=np.r_[np.full(59, 100), 100])
    a, b = routing_dispersion(w, 64, seed=4), routing_dispersion(w, 64, seed=4)
    assert a == b
    assert routing_dispersion(w, 128)["samples_short"] == 60
    assert routing_dispersion(w, 128)["pairs"] == 0


def test_length_and_skew_stats_match_a_loop():
    """Within-group max/median and CV, and per-layer busiest/mean, equal a plain loop over groups/layers."""
    rng = np.random.default_rng(5)
    N, L, E = 90, 3, 8
    lengths = rng.integers(5, 400, N)
    counts = np.zeros((N, L, E), dtype=np.int64)
    for i in range(N):
        for l in range(L):
            counts[i, l] = rng.multinomial(lengths[i], np.ones(E) / E)
    groups = rng.integers(0, 9, N)
    w = Window(lengths, counts, top_k=1, group_ids=groups)
    ls = length_stats(w)
    ratios = [lengths[groups == g].max() / np.median(lengths[groups == g]) for g in np.unique(groups)]
    cvs = [lengths[groups == g].std() / lengths[groups == g].mean() for g in np.unique(groups)]
    assert ls["groups"]["max_over_median_median"] == pytest.approx(np.median(ratios))
    assert ls["groups"]["max_over_median_max"] == pytest.approx(max(ratios))
    assert ls["groups"]["cv_median"] == pytest.approx(np.median(cvs))
    load = counts.sum(axis=0)
    sk = skew_stats(w)
    np.testing.assert_allclose(sk["max_over_mean"]["per_layer"], load.max(axis=1) / load.mean(axis=1))


def test_stats_cli_json_and_implications(run_cli, tmp_path):
    """`routepack stats --json` reports routing_dispersion {median, mean, tokens} and, for a window
    shaped like a preset, the evaluator's implications (reorder gain ≤ the any-plan bound)."""
    from routepack_opt.trace import generate_window

    save_window(generate_window("olmoe-1b-7b", 64, seed=1), tmp_path / "w.npz")
    code, out, err = run_cli("stats", tmp_path / "w.npz", "--json", "--tokens", "32")
    assert code == 0, err
    res = json.loads(out)
    rd = res["routing_dispersion"]
    assert rd["tokens"] == 32 and rd["median"] > 0 and rd["mean"] > 0
    imp = res["implications"]
    assert imp["max-sum"]["reorder_gain"] <= imp["any_plan_max_gain"] + 1e-12
    assert imp["lower_bound_free"] <= imp["lower_bound_lpt"] <= imp["lower_bound_identity"] + 1e-6
    code, out, _ = run_cli("stats", tmp_path / "w.npz")
    assert code == 0 and "routing dispersion at 64 tokens" in out and "placement alone" in out


@pytest.mark.parametrize("args", [["--tokens", "0"], ["--seed", "-1"], ["--max-samples", "0"],
                                  ["--cost", "nope"]])
def test_stats_bad_input_is_one_error_line(run_cli, tmp_path, args):
    """Bad stats options → exit 2 and one error: line."""
    from routepack_opt.trace import generate_window

    save_window(generate_window("olmoe-1b-7b", 16, seed=1, num_layers=2), tmp_path / "w.npz")
    code, _, err = run_cli("stats", tmp_path / "w.npz", *args)
    assert code == 2 and err.count("\n") == 1 and err.startswith("error:")

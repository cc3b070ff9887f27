"""Synthetic traces: exact invariants, determinism, RL-like structure, control, drift."""

import numpy as np

from routepack_opt.trace import generate_sequence, generate_window


def test_invariants_and_determinism():
    """Counts sum to k·len, never exceed len; the same seed gives the same window."""
    w = generate_window("olmoe-1b-7b", 96, seed=5)
    assert (w.counts.sum(axis=2) == w.top_k * w.lengths[:, None]).all()
    assert (w.counts <= w.lengths[:, None, None]).all()
    assert (w.lengths <= 4096).all()
    w2 = generate_window("olmoe-1b-7b", 96, seed=5)
    assert np.array_equal(w.counts, w2.counts) and np.array_equal(w.lengths, w2.lengths)


def test_groups_correlate_lengths_and_routing():
    """Samples of one GRPO group are closer in length and routing than samples of different groups."""
    w = generate_window("qwen3-30b-a3b", 256, seed=1, num_layers=4)
    g = w.group_ids
    sizes = np.bincount(g)
    assert sizes[:-1].min() >= 8 and sizes.max() <= 16
    loglen = np.log(w.lengths)
    within = np.mean([loglen[g == k].var() for k in np.unique(g)])
    assert within < loglen.var()
    frac = w.counts / w.counts.sum(axis=2, keepdims=True)
    same = np.abs(frac[g == 0][0] - frac[g == 0][1]).sum()
    other = np.abs(frac[g == 0][0] - frac[g == g.max()][0]).sum()
    assert same < other


def test_uniform_control():
    """The control has equal lengths and nearly uniform expert loads."""
    w = generate_window("olmoe-1b-7b", 128, seed=2, uniform=True)
    assert len(np.unique(w.lengths)) == 1
    load = w.expert_loads()
    assert (load.std(axis=1) / load.mean(axis=1)).max() < 0.05
    skewed = generate_window("olmoe-1b-7b", 128, seed=2).expert_loads()
    assert (skewed.std(axis=1) / skewed.mean(axis=1)).mean() > 0.3


def test_drift_grows_with_staleness():
    """Routing recorded k steps earlier differs more as k grows; k = 0 is identical."""
    seq = generate_sequence("olmoe-1b-7b", 64, num_steps=1, seed=0)
    assert seq[0].step == 0
    w = generate_window("olmoe-1b-7b", 64, seed=0, step=8)
    diffs = [np.abs(generate_window("olmoe-1b-7b", 64, seed=0, step=8, routing_step=8 - k).counts - w.counts).sum()
             for k in (0, 2, 8)]
    assert diffs[0] == 0 and diffs[0] < diffs[1] < diffs[2]

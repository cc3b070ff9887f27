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


# --- issue 15: calibration knobs; issue 12: streaming, memory check, atomic output -----------------
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402

from routepack_opt.core.errors import InputError  # noqa: E402
from routepack_opt.core.window import load_window  # noqa: E402
from routepack_opt.stats import routing_dispersion, skew_stats  # noqa: E402
from routepack_opt.trace import DEFAULT_DISPERSION, domain_profiles, write_trace  # noqa: E402


def test_default_is_the_calibrated_single_task_setting():
    """Presets' defaults measure near the target dispersion (1.2 at 64 tokens) and the preset's skew."""
    w = generate_window("olmoe-1b-7b", 384, seed=7)
    d = routing_dispersion(w, 64)["median"]
    assert abs(d - DEFAULT_DISPERSION) < 0.1
    mm = skew_stats(w)["max_over_mean"]["median"]
    assert 3.5 < mm < 5.5  # PRESET_SKEW olmoe 4.5 (real OLMoE median per domain and layer)


@pytest.mark.parametrize("target", [2.0, 5.0])
def test_dispersion_knob_hits_its_target(target):
    """--dispersion TARGET gives a window whose measured dispersion is within 15 % of the target."""
    w = generate_window("olmoe-1b-7b", 384, seed=11, dispersion=target)
    assert abs(routing_dispersion(w, 64)["median"] / target - 1) < 0.15


def test_skew_knob_and_legacy_sd():
    """skew = busiest/mean target per layer (median); expert_skew keeps the legacy sd meaning."""
    lo = skew_stats(generate_window("olmoe-1b-7b", 256, seed=2, skew=2.0))["max_over_mean"]["median"]
    hi = skew_stats(generate_window("olmoe-1b-7b", 256, seed=2, skew=6.0))["max_over_mean"]["median"]
    assert 1.6 < lo < 2.5 and 5.0 < hi < 7.0
    a = generate_window("olmoe-1b-7b", 64, seed=2, expert_skew=1.2)
    assert (a.counts.sum(axis=2) == a.top_k * a.lengths[:, None]).all()


def test_real_domain_mixture():
    """--domains olmoe draws each group's routing from a real OLMoE domain profile: more dispersion
    than the single-task window; a wrong expert count is one InputError."""
    names, lp = domain_profiles("olmoe", 16, 64)
    assert "arxiv" in names and lp.shape == (len(names), 16, 64)
    mixed = generate_window("olmoe-1b-7b", 256, seed=3, domains="olmoe")
    assert routing_dispersion(mixed, 64)["median"] > 2.5
    with pytest.raises(InputError, match="8 experts"):
        generate_window("olmoe-1b-7b", 8, domains="mixtral")
    w = generate_window("olmoe-1b-7b", 32, domains="mixtral", num_experts=8, top_k=2)
    assert w.num_experts == 8


def test_streamed_file_equals_in_memory_window(tmp_path, monkeypatch):
    """write_trace streams block by block (several blocks here) and writes exactly generate_window's
    window, counts in the smallest dtype that holds the capacity."""
    import routepack_opt.trace as trace

    # small blocks (2^14 / (4·32) = 128 samples), so a small window spans three, one of them partial
    monkeypatch.setattr(trace, "_BLOCK_ELEMS", 1 << 14)
    kw = dict(num_layers=4, num_experts=32, capacity=3000)
    res = write_trace(tmp_path / "w.npz", "olmoe-1b-7b", 300, seed=4, **kw)
    assert res["block_samples"] == 128
    w = generate_window("olmoe-1b-7b", 300, seed=4, **kw)
    got = load_window(tmp_path / "w.npz")
    assert np.array_equal(got.counts, w.counts) and np.array_equal(got.lengths, w.lengths)
    assert np.array_equal(got.group_ids, w.group_ids)
    with np.load(tmp_path / "w.npz") as z:
        assert z["counts"].dtype == np.int16


def test_huge_sample_count_fails_fast():
    """A window that cannot fit in memory is one InputError before any work (no O(groups²) loop)."""
    with pytest.raises(InputError, match="bytes per sample"):
        generate_window("deepseek-v3", 10**11)


def test_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    """A write that dies mid-stream leaves the previous file untouched and no temporary behind."""
    import routepack_opt.trace as trace

    out = tmp_path / "w.npz"
    out.write_bytes(b"old")
    real = trace._block_counts

    def dying(st, b):
        if b == 1:
            raise RuntimeError("killed")
        return real(st, b)

    monkeypatch.setattr(trace, "_block_counts", dying)
    monkeypatch.setattr(trace, "_BLOCK_ELEMS", 1 << 14)  # blocks of 128 samples: three here
    with pytest.raises(RuntimeError):
        write_trace(out, "olmoe-1b-7b", 300, num_layers=4, num_experts=32, capacity=3000)
    assert out.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["w.npz"]


def test_cli_full_disk_and_huge_n_are_clean_errors(tmp_path):
    """gen-trace under a small file-size limit (a full disk) and with 10^11 samples: exit 2, one
    error: line, the old output kept, no temporary left."""
    out = tmp_path / "w.npz"
    out.write_bytes(b"old")
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (200000, 200000)); "
            "from routepack_opt.cli import main; sys.exit(main(sys.argv[1:]))")
    r = subprocess.run([sys.executable, "-c", code, "gen-trace", "--preset", "olmoe-1b-7b",
                        "--samples", "2000", "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("error:") and r.stderr.count("\n") == 1, r.stderr
    assert out.read_bytes() == b"old" and len(list(tmp_path.iterdir())) == 1
    r = subprocess.run([sys.executable, "-m", "routepack_opt", "gen-trace", "--samples", str(10**11),
                        "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "GiB" in r.stderr


def test_gen_trace_cli_knobs(run_cli, tmp_path):
    """gen-trace --dispersion/--domains/--skew reach the generator; --json reports the skew."""
    code, out, err = run_cli("gen-trace", "--preset", "olmoe-1b-7b", "--samples", "64", "--domains", "olmoe",
                             "-o", tmp_path / "a.npz", "--json")
    assert code == 0, err
    assert json.loads(out)["samples"] == 64
    code, out, err = run_cli("gen-trace", "--preset", "olmoe-1b-7b", "--samples", "64", "--dispersion", "3",
                             "--skew", "2", "--domains", "3", "-o", tmp_path / "b.npz", "--json")
    assert code == 0, err
    for bad in (["--dispersion", "0"], ["--skew", "0.5"], ["--domains", "books"], ["--samples", "0"],
                ["--staleness", "-1"], ["--seed", "-1"]):
        code, _, err = run_cli("gen-trace", "--preset", "olmoe-1b-7b", *bad, "-o", tmp_path / "c.npz")
        assert code == 2 and err.count("\n") == 1, bad


def test_gen_trace_killed_mid_write_keeps_the_old_file(tmp_path):
    """SIGKILL while gen-trace streams its output: the old file is intact (only a temporary is
    left behind, never a truncated W.npz)."""
    import os
    import signal
    import time

    out = tmp_path / "w.npz"
    out.write_bytes(b"old")
    proc = subprocess.Popen([sys.executable, "-m", "routepack_opt", "gen-trace", "--preset", "olmoe-1b-7b",
                             "--samples", "200000", "-o", str(out)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        while proc.poll() is None:  # wait until the temporary exists and holds data, then kill
            tmps = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
            if tmps and tmps[0].stat().st_size > 0:
                os.kill(proc.pid, signal.SIGKILL)
                break
            time.sleep(0.01)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL  # killed mid-write, not finished
    assert out.read_bytes() == b"old"


def test_domain_counts_ship_with_the_package():
    """The real domain counts and their provenance README sit in the package and are package-data."""
    import tomllib
    from importlib import resources
    from pathlib import Path

    data = resources.files("routepack_opt").joinpath("data")
    assert data.joinpath("domain_expert_counts.json").is_file()
    assert "Apache-2.0" in data.joinpath("README.md").read_text()
    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["routepack_opt"]
    assert "data/*.json" in globs and "data/*.md" in globs

"""Hostile inputs, round 4 (issue 39): the reproducers of the issue, one check each — the input
boundary (FIFOs, long names, damaged .npz members, bf16/fp8 tensors), the schema checks (plan
replicas, run.json, steps.jsonl), bounds (--workers, num_samples, verify-runtime), the API's one
validation (AsyncPlanner.submit as plan_micro_batches) and the environment."""

from __future__ import annotations

import json
import os
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzz_support as fs  # noqa: E402

from routepack_opt import api  # noqa: E402
from routepack_opt.core import inputs  # noqa: E402
from routepack_opt.core.errors import InputError  # noqa: E402
from routepack_opt.core.plan import load_plan  # noqa: E402
from routepack_opt.pipeline import solve  # noqa: E402


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return fs.good_files(tmp_path_factory.mktemp("good"))


_one_error = fs.one_error


@pytest.mark.parametrize("arg", ["window", "plan", "--cost", "--config", "--placement"])
def test_a_fifo_is_refused_without_blocking(files, tmp_path, arg):
    fifo = tmp_path / "f.json"
    os.mkfifo(fifo)
    w, p = str(files["window"]), str(files["plan"])
    argv = {"window": ["stats", fifo], "plan": ["evaluate", w, fifo, "--cost", fs.COST],
            "--cost": ["evaluate", w, p, "--cost", fifo],
            "--config": ["plan", w, *fs.TOPO, "--cost", fs.COST, "--config", fifo],
            "--placement": ["plan", w, *fs.TOPO, "--cost", fs.COST, "--placement", fifo]}[arg]
    _one_error(*fs.run_cli([str(a) for a in argv], timeout=10), "named pipe (FIFO)")


def test_fifo_through_the_api_and_the_environment(files, tmp_path, monkeypatch):
    from routepack_opt.integrations._seam import seam_settings

    fifo = tmp_path / "c.toml"
    os.mkfifo(fifo)
    with fs.time_limit(10), pytest.raises(InputError, match="FIFO"):
        api.plan_micro_batches(*fs._window_arrays()[:2], dp_size=2, ep_size=2, max_tokens=1024, cost=str(fifo))
    monkeypatch.setenv("ROUTEPACK_COST", str(fifo))
    with fs.time_limit(10), pytest.raises(InputError, match="ROUTEPACK_COST.*FIFO"):
        seam_settings("verl")


def test_environment_time_limit_inf_is_refused(monkeypatch):
    from routepack_opt.integrations._seam import seam_settings

    monkeypatch.setenv("ROUTEPACK_TIME_LIMIT", "inf")
    with pytest.raises(InputError, match="ROUTEPACK_TIME_LIMIT"):
        seam_settings("verl")
    monkeypatch.setenv("ROUTEPACK_TIME_LIMIT", "none")  # no limit, said so in words
    assert seam_settings("verl").time_limit is None


def test_long_path_component_on_an_input(files):
    _one_error(*fs.run_cli(["stats", "x" * 300 + ".npz"]), "at most 255")


@pytest.mark.parametrize("damage", ["method", "encrypted", "deflate", "negative shape", "overflowing shape"])
def test_damaged_npz_members_are_one_error_line(files, tmp_path, damage):
    src = files["window"]
    kind = {"method": "member_method", "encrypted": "member_encrypted", "deflate": "member_crc"}.get(damage, "shape")
    if kind == "shape":
        out = tmp_path / "w.npz"
        new = "(-1, 2, 8)" if damage == "negative shape" else "(4611686018427387904, 2, 8)"
        with zipfile.ZipFile(src) as z:
            items = {n: z.read(n) for n in z.namelist()}
        raw = items["counts.npy"]
        head_end = raw.index(b"\n") + 1
        head = raw[:head_end].decode("latin1")
        start = head.index("'shape': ") + len("'shape': ")
        head = head[:start] + new + head[head.index(")", start) + 1:]
        items["counts.npy"] = raw[:8] + head[12 if raw[6] == 2 else 10:].encode("latin1") + raw[head_end:]
        body = head[12 if raw[6] == 2 else 10:].encode("latin1")
        items["counts.npy"] = raw[:8] + len(body).to_bytes(4 if raw[6] == 2 else 2, "little") + body + raw[head_end:]
        with zipfile.ZipFile(out, "w") as z:
            for n, b in items.items():
                z.writestr(n, b)
    else:
        seed = next(s for s in range(50) if _targets_counts(src, tmp_path, kind, s))
        out = fs.mutate(src, tmp_path / f"m{seed}", kind, seed)
    outcome, code, err = fs.run_cli(["stats", str(out)])
    assert outcome == "clean2" and code == 2, (damage, outcome, err)


def _targets_counts(src, tmp_path, kind, seed) -> bool:
    d = tmp_path / f"m{seed}"
    d.mkdir()
    import random

    rng = random.Random(seed)
    return rng.choice(["counts", "lengths", "routes", "top_k"]) in ("counts", "lengths")


def test_bf16_and_fp8_tensors_are_read_exactly(files, tmp_path):
    torch = pytest.importorskip("torch")
    r = np.load(files["routes_npy"])
    ln = np.load(files["lengths"])
    ref = tmp_path / "ref.npz"
    assert fs.run_cli(["import-replay", str(files["routes_npz"]), "--num-experts", str(fs.E), "-o", str(ref)])[0] == "ok"
    for dt in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        src = tmp_path / f"{dt}.pt"
        torch.save({"routes": torch.from_numpy(r).to(getattr(torch, dt)), "lengths": torch.from_numpy(ln)}, src)
        out = tmp_path / f"{dt}.npz"
        assert fs.run_cli(["import-replay", str(src), "--num-experts", str(fs.E), "-o", str(out)])[0] == "ok", dt
        with np.load(out) as a, np.load(ref) as b:
            assert np.array_equal(a["counts"], b["counts"]), dt  # expert ids < 16: exact in all three
    st = pytest.importorskip("safetensors.torch")
    src = tmp_path / "bf.safetensors"
    st.save_file({"routes": torch.from_numpy(r).to(torch.bfloat16), "lengths": torch.from_numpy(ln)}, str(src))
    out = tmp_path / "bf_st.npz"
    assert fs.run_cli(["import-replay", str(src), "--num-experts", str(fs.E), "-o", str(out)])[0] == "ok"
    with np.load(out) as a, np.load(ref) as b:
        assert np.array_equal(a["counts"], b["counts"])
    src = tmp_path / "sp.pt"
    torch.save({"routes": torch.from_numpy(r).to_sparse(), "lengths": torch.from_numpy(ln)}, src)
    _one_error(*fs.run_cli(["import-replay", str(src), "--num-experts", str(fs.E), "-o", str(tmp_path / "s.npz")]),
               "sparse")


def test_fp8_table_matches_torch():
    torch = pytest.importorskip("torch")
    for name, fmt in (("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2")):
        codes = torch.arange(256, dtype=torch.uint8).view(getattr(torch, name)).float().numpy()
        ours = inputs._fp8_table(*inputs._FP8[fmt])
        assert np.array_equal(np.isnan(codes), np.isnan(ours)) and np.array_equal(codes[~np.isnan(codes)],
                                                                                  ours[~np.isnan(ours)]), name


@pytest.mark.parametrize("change, match", [
    ({"logcnt": [["2", "2"] + ["1"] * (fs.E - 2)] * 2}, "logcnt"),
    ({"logcnt": [[1.9, 2] + [1] * (fs.E - 2)] * 2}, "logcnt"),
    ({"phy2log": [[2**64] + list(range(1, fs.E)) + [0, 1]] * 2}, "phy2log"),
    ({"phy2log": []}, "phy2log"),
])
def test_replicated_plan_schema(files, tmp_path, change, match):
    plan = json.loads(files["plan_rep"].read_text())
    p = tmp_path / "p.json"
    p.write_text(json.dumps({**plan, **change}))
    with pytest.raises(InputError, match=match):
        load_plan(p)
    assert load_plan(files["plan_rep"]).replicas is not None  # the good one loads


@pytest.mark.parametrize("n", [-1, 10**12, True, 2.0])
def test_load_plan_num_samples(files, n):
    with pytest.raises(InputError, match="num_samples"):
        load_plan(files["plan"], num_samples=n)


def test_solve_refuses_none():
    with pytest.raises(InputError, match="window must be a Window"):
        solve(None, None, None)


def test_submit_validates_as_plan_micro_batches():
    lengths, counts, _ = fs._window_arrays()
    opts = dict(dp_size=2, ep_size=2, max_tokens=1024, cost=fs.COST, redundant_experts=10)
    with pytest.raises(InputError) as a:
        api.plan_micro_batches(lengths, counts, **opts)
    planner = api.AsyncPlanner(warm=False)
    try:
        with pytest.raises(InputError) as b:
            planner.submit(lengths, counts, deadline=1.0, **opts)
    finally:
        planner.close()
    assert str(a.value) == str(b.value)
    with pytest.raises(InputError, match="max_replica_bytes"):  # no fallback over the budget
        api.quick_fallback(lengths, counts, options={**opts, "redundant_experts": 2, "max_replica_bytes": 0})


@pytest.mark.parametrize("text, match", [("[]", "not a JSON object"), ("{", "not valid JSON")])
def test_run_json_of_the_wrong_shape(files, tmp_path, text, match):
    from routepack_opt.report_run import prepare_out_dir

    (tmp_path / "run.json").write_text(text)
    with pytest.raises(InputError, match=match):
        prepare_out_dir(tmp_path, fs._report_config())


@pytest.mark.parametrize("line", ['{"step": 0}', '{"window": "a.npz", "rows": 2}', "[1]"])
def test_steps_line_of_the_wrong_shape(tmp_path, line):
    """A steps.jsonl line of the wrong shape never reaches the report: skipped with a note naming it (issue 50 found 9; was an InputError)."""
    from routepack_opt.report_run import read_steps

    p = tmp_path / "steps.jsonl"
    p.write_text(line + "\n" + '{"window": "b.npz", "error": "x"}\n')
    notes: list[str] = []
    records, _ = read_steps(p, notes)
    assert [r["window"] for r in records] == ["b.npz"] and len(notes) == 1 and "line 1" in notes[0]


@pytest.mark.parametrize("out, match", [("", "not '' or '-'"), ("-", "not '' or '-'")])
def test_replay_report_output_names(files, tmp_path, out, match, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    _one_error(*fs.run_cli(["replay-report", str(run), "-o", out, *fs.TOPO, "--cost", fs.COST]), match)
    assert sorted(os.listdir(tmp_path)) == ["run"]


def test_workers_bounded_before_anything_is_made(files, tmp_path):
    pytest.importorskip("ray")
    run = tmp_path / "run"
    run.mkdir()
    (run / "s.npz").write_bytes(files["window"].read_bytes())
    _one_error(*fs.run_cli(["replay-report", str(run), "-o", str(tmp_path / "o"), *fs.TOPO, "--cost", fs.COST,
                            "--workers", str(2**62)]), "--workers")
    assert not (tmp_path / "o").exists()


def test_report_html_takes_any_name(tmp_path):
    from routepack_opt.report_run import render_report

    name = os.fsdecode(b"step_\xff.npz")
    out = render_report([{"window": name, "error": "x"}], tmp_path / "r.html", title=os.fsdecode(b"run_\xfe"))
    text = out.read_bytes().decode("utf-8")
    assert "step_\\xff.npz" in text and "run_\\xfe" in text


def test_verify_runtime_steps_bounded():
    _one_error(*fs.run_cli(["verify-runtime", "--steps", str(2**62), "--timeout", "20"]), "--steps")


def test_sweep_budget_bounded(files):
    """--max-sweeps 2**62 without a time limit (it ran without end) is one error line naming the
    most sweeps the window takes; the API's solve() refuses it the same way, before any work."""
    _one_error(*fs.run_cli(["plan", str(files["window"]), *fs.TOPO, "--cost", fs.COST, "--max-sweeps", str(2**62)],
                           timeout=60), "max_sweeps")
    from routepack_opt.core.cost import resolve_cost
    from routepack_opt.core.topology import Topology
    from routepack_opt.core.window import load_window

    w = load_window(files["window"])
    with pytest.raises(InputError, match="at most"):
        solve(w, Topology(dp=2, ep=2, capacity=1024), resolve_cost(fs.COST), max_sweeps=2**62)


def test_warnings_hidden_unless_verbose(files, monkeypatch):
    """A warning raised inside a command (numpy's RuntimeWarning) is dropped, unless -v."""
    import warnings

    import routepack_opt.cli as cli
    from routepack_opt.cli import main

    real = cli.build_parser

    def noisy(args):
        warnings.warn("numpy says something", RuntimeWarning, stacklevel=2)
        raise InputError("bad")

    def parser():
        p = real()
        p.set_defaults(func=noisy)
        sub = next(a for a in p._actions if a.dest == "command")
        sub.choices["stats"].set_defaults(func=noisy)
        return p

    monkeypatch.setattr(cli, "build_parser", parser)
    monkeypatch.delenv("ROUTEPACK_DEBUG", raising=False)
    for verbose in (False, True):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            code = main((["-v"] if verbose else []) + ["stats", str(files["window"])])
        assert code == 2
        assert any("numpy says" in str(w.message) for w in seen) == verbose, (verbose, seen)

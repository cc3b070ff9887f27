"""CLI conventions: gen-trace, evaluate, and one error: line + exit 2 for every bad input."""

import json
import subprocess
import sys

import numpy as np
import pytest

from routepack_opt.core.plan import Plan
from routepack_opt.core.testing import random_layout, random_window
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import save_window


@pytest.fixture
def files(tmp_path):
    """A valid window, plan and cost file on disk."""
    rng = np.random.default_rng(0)
    w = random_window(12, 2, 4, 2, max_len=40, seed=1)
    save_window(w, tmp_path / "w.npz")
    row, slot = random_layout(12, 2, 4, rng)
    plan = Plan(Topology(dp=4, ep=2, capacity=200), 2, np.tile(np.arange(4), (2, 1)), row, slot)
    plan.save(tmp_path / "p.json")
    (tmp_path / "c.toml").write_text("gamma = 0.5\nrow_overhead = 3\n[[stage]]\nname = 'a'\nalpha = 1.0\nbeta = 0.01\n")
    return tmp_path


def test_gen_trace_and_evaluate_json(run_cli, tmp_path, files):
    """gen-trace writes a window; evaluate --json prints the score, other makespan, LB and gap."""
    code, out, _ = run_cli("gen-trace", "--preset", "olmoe-1b-7b", "--samples", "32", "--seed", "3",
                           "-o", tmp_path / "g.npz", "--json")
    assert code == 0 and json.loads(out)["samples"] == 32
    code, out, err = run_cli("evaluate", files / "w.npz", files / "p.json", "--cost", files / "c.toml", "--json")
    assert code == 0, err
    rep = json.loads(out)
    for key in ("makespan", "total", "peak", "other_makespan", "lower_bound", "gap"):
        assert key in rep
    assert rep["lower_bound"] <= rep["makespan"] and rep["gap"] >= 1.0


def _mutate_plan(files, fn, name):
    d = json.loads((files / "p.json").read_text())
    fn(d)
    (files / name).write_text(json.dumps(d))
    return files / name


def _npz(files, name, **arrays):
    np.savez(files / name, **arrays)
    return files / name


def _bad_cases(files):
    w = np.load(files / "w.npz")
    L, C = w["lengths"], w["counts"]
    cost = files / "c.toml"
    cases = {
        "counts 2-D": (_npz(files, "a.npz", lengths=L, counts=C[:, 0]), files / "p.json", cost, "dimensions"),
        "negative length": (_npz(files, "b.npz", lengths=-L, counts=C), files / "p.json", cost, "at least 1 token"),
        "zero length": (_npz(files, "c.npz", lengths=L * 0, counts=C), files / "p.json", cost, "at least 1 token"),
        "counts not k·len": (_npz(files, "d.npz", lengths=L + 1, counts=C, top_k=2), files / "p.json", cost, "top_k·len"),
        "NaN counts": (_npz(files, "e.npz", lengths=L, counts=C * np.nan), files / "p.json", cost, "NaN"),
        "missing counts": (_npz(files, "f.npz", lengths=L), files / "p.json", cost, "missing array 'counts'"),
        "truncated npz": (None, files / "p.json", cost, "not a readable"),
        "not a permutation": (files / "w.npz", _mutate_plan(files, lambda d: d["placement"][0].__setitem__(0, 1), "q1.json"), cost, "permutation"),
        "overfull cell": (files / "w.npz", _mutate_plan(files, lambda d: d["topology"].__setitem__("capacity", 5), "q2.json"), cost, "capacity"),
        "D not divisible by P": (files / "w.npz", _mutate_plan(files, lambda d: d["topology"].update(ep=3, shard_of_slot=None), "q3.json"), cost, "not divisible"),
        "E not divisible by P": (files / "w.npz", _mutate_plan(files, lambda d: (d["topology"].update(dp=3, ep=3, shard_of_slot=None), d.__setitem__("cells", [[r[0], r[1], r[2] + r[3]] for r in d["cells"]])), "q4.json"), cost, "divisible"),
        "duplicate sample": (files / "w.npz", _mutate_plan(files, lambda d: d["cells"][0][0].append(d["cells"][1][1][0]), "q5.json"), cost, "twice"),
        "wrong format": (files / "w.npz", _mutate_plan(files, lambda d: d.__setitem__("format", "x"), "q6.json"), cost, "format"),
        "plan missing cells": (files / "w.npz", _mutate_plan(files, lambda d: d.pop("cells"), "q7.json"), cost, "missing key"),
        "cost missing gamma": (files / "w.npz", files / "p.json", _text(files, "c1.toml", "[[stage]]\nalpha=1\nbeta=0\n"), "missing key"),
        "cost not toml": (files / "w.npz", files / "p.json", _text(files, "c2.toml", "gamma = \n"), "TOML"),
        "plan not json": (files / "w.npz", _text(files, "q8.json", "{"), cost, "JSON"),
        "empty cell": (files / "w.npz", _mutate_plan(files, lambda d: (d["cells"][0][1].extend(d["cells"][0][0]), d["cells"][0][0].clear()), "q9.json"), cost, "empty cells"),
        "unknown preset": (files / "w.npz", files / "p.json", "no-such-model", "neither a preset"),
        "plan is a directory": (files / "w.npz", _dir(files, "q10.json"), cost, "is a directory"),
        "missing plan": (files / "w.npz", files / "nope.json", cost, "no such plan file"),
    }
    data = (files / "w.npz").read_bytes()
    (files / "t.npz").write_bytes(data[: len(data) // 3])
    cases["truncated npz"] = (files / "t.npz",) + cases["truncated npz"][1:]
    return cases


def _dir(files, name):
    (files / name).mkdir(exist_ok=True)
    return files / name


def _text(files, name, text):
    (files / name).write_text(text)
    return files / name


def test_bad_inputs_get_one_error_line_and_exit_2(run_cli, files):
    """At least 15 malformed windows/topologies/cost files/plans → one precise error: line, exit 2."""
    cases = _bad_cases(files)
    assert len(cases) >= 15
    for name, (window, plan, cost, match) in cases.items():
        code, out, err = run_cli("evaluate", window, plan, "--cost", cost)
        lines = err.strip().splitlines()
        assert code == 2, (name, code, err)
        assert len(lines) == 1 and lines[0].startswith("error: "), (name, err)
        assert match in lines[0], (name, lines[0])
        assert "Traceback" not in err


def test_usage_errors_exit_2(run_cli):
    """Unknown flags and missing arguments are one error: line with exit 2."""
    code, _, err = run_cli("gen-trace", "--samples", "x")
    assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1
    code, _, err = run_cli("evaluate")
    assert code == 2 and err.startswith("error: ")


def test_console_script_runs():
    """The installed `routepack` entry point answers --help."""
    r = subprocess.run([sys.executable, "-m", "routepack_opt.cli", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "gen-trace" in r.stdout

"""``routepack exact --redundant-experts N`` (issue 26, "Exact"): the joint layout + replica model
from the command line — a plan with phy2log/logcnt that ``evaluate`` re-scores to the reported
makespan, both solvers, and one ``error:`` line with exit 2 for values it cannot take."""

import json

import pytest

from routepack_opt.core.testing import random_window
from routepack_opt.core.window import save_window

TOPO = ["--dp", "2", "--ep", "2", "--capacity", "1000"]


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    t = tmp_path_factory.mktemp("exact_replicas")
    save_window(random_window(6, 2, 4, 2, max_len=30, seed=9, skew=2.5), t / "w.npz")
    (t / "c.toml").write_text("gamma = 1.0\nrow_overhead = 2\n[[stage]]\nname = 'a'\nalpha = 0.01\nbeta = 0.0001\n")
    return t


@pytest.mark.parametrize("solver", ["cpsat", "highs"])
def test_exact_with_replicas_writes_a_replicated_plan(run_cli, d, solver):
    """The joint model proves this tiny window, writes phy2log/logcnt/replica_rule, and the plan
    re-scores (``routepack evaluate``) to the makespan it reported, never above the warm start."""
    out = d / f"p_{solver}.json"
    code, stdout, err = run_cli("exact", d / "w.npz", *TOPO, "--cost", d / "c.toml", "--redundant-experts", "2",
                                "--rows", "2", "--time-limit", "20", "--solver", solver, "-o", out, "--json")
    assert code == 0, err
    res = json.loads(stdout)
    assert res["status"] == "optimal" and res["redundant_experts"] == 2
    assert res["objective"] <= res["warm_start"]["makespan"] + 1e-9
    plan = json.loads(out.read_text())
    assert plan["replica_rule"] == "even-local" and len(plan["phy2log"][0]) == 6
    assert plan["logcnt"] == res["logcnt"]
    code, stdout, err = run_cli("evaluate", d / "w.npz", out, "--cost", d / "c.toml", "--json")
    assert code == 0, err
    assert json.loads(stdout)["makespan"] == pytest.approx(res["objective"], rel=1e-12)


@pytest.mark.parametrize("extra, match", [
    (["--redundant-experts", "1"], "not divisible"),
    (["--redundant-experts", "8"], "exceed"),
    (["--redundant-experts", "2", "--lexicographic"], "--lexicographic"),
    (["--redundant-experts", "2", "--placement", "identity"], "--placement"),
    (["--redundant-experts", "2", "--time-limit", "0"], "--time-limit"),
], ids=["indivisible", "over one per rank", "lexicographic", "placement", "time limit"])
def test_bad_values_are_one_error_line(run_cli, d, extra, match):
    """Values the joint model cannot take exit 2 with exactly one ``error:`` line naming them."""
    code, _, err = run_cli("exact", d / "w.npz", *TOPO, "--cost", d / "c.toml", *extra)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0], err


def test_too_large_window_is_refused(run_cli, tmp_path):
    """A window past the model's size is exit 2, pointing at ``routepack plan``."""
    save_window(random_window(160, 8, 16, 2, max_len=30, seed=0), tmp_path / "big.npz")
    (tmp_path / "c.toml").write_text("gamma = 1.0\nrow_overhead = 2\n[[stage]]\nname = 'a'\nalpha = 0.01\nbeta = 0.0001\n")
    code, _, err = run_cli("exact", tmp_path / "big.npz", "--dp", "16", "--ep", "4", "--capacity", "10000",
                           "--cost", tmp_path / "c.toml", "--redundant-experts", "4", "--rows", "8",
                           "--time-limit", "5", "--warm-time", "0")
    assert code == 2 and "routepack plan" in err, err

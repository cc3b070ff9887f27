"""The entry point's contract: solve() is keyword-only, PlannerParams loads from one TOML file
(unknown sections and keys named), and --config reaches every stage it configures."""

import json

import numpy as np
import pytest

from routepack_opt import pipeline
from routepack_opt.core.cost import PRESETS
from routepack_opt.core.errors import InputError
from routepack_opt.core.layout import Layout, check_rows
from routepack_opt.core.plan import Plan, load_plan
from routepack_opt.core.report import PlanReport
from routepack_opt.core.testing import random_window
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import save_window
from routepack_opt.heuristics.anneal import AnnealConfig
from routepack_opt.heuristics.placement.refine import RefineConfig
from routepack_opt.params import CertifyParams, JointParams, PlannerParams
from routepack_opt.pipeline import solve

COST = PRESETS["olmoe-1b-7b"].cost


@pytest.fixture(scope="module")
def window():
    return random_window(48, 3, 16, 2, max_len=300, seed=5)


def test_defaults_are_the_planner_hard_coded_values():
    """PlannerParams() is the behaviour before the parameters were gathered: 3 joint rounds of 4
    refinement passes, 10 s / 20 % for R* and for the seeds, the default annealer."""
    p = PlannerParams()
    assert p.joint.max_rounds == 3 and p.refine == RefineConfig(max_passes=4)
    assert (p.certify.time_limit, p.certify.share, p.certify.method) == (10.0, 0.2, "auto")
    assert (p.seeds.time_limit, p.seeds.share) == (10.0, 0.2)
    assert p.anneal == AnnealConfig()


def test_params_toml_round_trip(tmp_path):
    """from_toml(file written from to_dict()) gives the same params; sections not given keep
    their defaults (refine keeps the planner's 4 passes when only one key changes)."""
    p = PlannerParams(anneal=AnnealConfig(population=4, sweeps=7), joint=JointParams(max_rounds=1),
                      refine=RefineConfig(max_passes=2, migration_weight=0.5),
                      certify=CertifyParams(time_limit=3.0, method="cpsat"))
    lines = []
    for section, table in p.to_dict().items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in table.items()]
    (tmp_path / "p.toml").write_text("\n".join(lines) + "\n")
    assert PlannerParams.from_toml(tmp_path / "p.toml") == p
    (tmp_path / "q.toml").write_text("[refine]\nmigration_weight = 0.25\n")
    q = PlannerParams.from_toml(tmp_path / "q.toml")
    assert q.refine == RefineConfig(max_passes=4, migration_weight=0.25) and q.anneal == AnnealConfig()


@pytest.mark.parametrize("text, named", [
    ("[bogus]\nx = 1\n", "[bogus]"),
    ("[joint]\nmax_round = 2\n", "max_round"),
    ("[certify]\nmethod = 'magic'\n", "magic"),
    ("[certify]\nshare = 0\n", "share"),
    ("[joint]\nmax_rounds = 0\n", "max_rounds"),
    ("[anneal]\np_rotate = 1.5\n", "p_rotate"),  # the rotation move's switch is a probability
    ("population = 4\nbogus = 1\n", "bogus"),  # no sections: the older ANNEAL.toml form
])
def test_params_errors_name_the_culprit(tmp_path, text, named):
    """An unknown section or key, or a bad value, is an InputError naming it."""
    (tmp_path / "p.toml").write_text(text)
    with pytest.raises(InputError, match=named.replace("[", r"\[").replace("]", r"\]")):
        PlannerParams.from_toml(tmp_path / "p.toml")


def test_sectionless_file_is_read_as_anneal(tmp_path):
    """A file of top-level keys (the older --config ANNEAL.toml) is the [anneal] section."""
    (tmp_path / "a.toml").write_text("population = 4\nsweeps = 5\n")
    assert PlannerParams.from_toml(tmp_path / "a.toml").anneal == AnnealConfig(population=4, sweeps=5)


def test_solve_options_are_keyword_only(window):
    """solve(window, topology, cost, "max-sum", ...) is a TypeError: options are keywords."""
    topo = Topology(dp=4, ep=2, capacity=2000)
    with pytest.raises(TypeError):
        solve(window, topo, COST, "max-sum")  # type: ignore[misc]
    with pytest.raises(InputError, match="PlannerParams"):
        solve(window, topo, COST, params=AnnealConfig())  # type: ignore[arg-type]


def test_solve_plan_is_complete_and_immutable(window):
    """solve() returns a plan built once: typed report, read-only layout, and the same info JSON
    after a save/load round trip."""
    topo = Topology(dp=4, ep=2, capacity=2000)
    p = solve(window, topo, COST, max_sweeps=3, seed=1)
    assert isinstance(p.report, PlanReport) and p.report.search is not None
    assert p.report.evaluation is not None and p.report.evaluation.makespan == p.score["makespan"]
    assert isinstance(p.layout, Layout) and not p.row.flags.writeable
    with pytest.raises(ValueError):
        p.row[0] = 0
    with pytest.raises(AttributeError):
        p.rows = 3  # type: ignore[misc]
    q = Plan.from_json(json.loads(json.dumps(p.to_json())))
    assert q.to_json() == json.loads(json.dumps(p.to_json()))


def test_one_positive_rows_check():
    """check_rows refuses booleans, zero, negatives and non-integers with one message form."""
    assert check_rows(np.int64(3)) == 3
    for bad in (True, 0, -1, 2.0, "2"):
        with pytest.raises(InputError, match="rows must be a positive integer"):
            check_rows(bad)
    with pytest.raises(InputError, match="--rows must be a positive integer"):
        check_rows(0, "--rows")


def test_cli_config_reaches_joint_refine_and_certify(run_cli, tmp_path, window, monkeypatch):
    """routepack plan --config with [joint], [refine] and [certify] sections: the joint search
    runs max_rounds rounds of max_passes refinement passes, R* uses the [certify] limit and
    method (a config changing max_rounds changes what runs)."""
    seen = {}
    real_joint, real_rows = pipeline.joint_search, pipeline.certified_rows

    def joint_spy(*args, **kwargs):
        seen["max_rounds"] = kwargs["config"].max_rounds
        seen["max_passes"] = kwargs["config"].refine.max_passes
        seen["sticky"] = kwargs["config"].sticky
        return real_joint(*args, **kwargs)

    def rows_spy(*args):
        seen["certify"] = args[3:]
        return real_rows(*args)

    monkeypatch.setattr(pipeline, "joint_search", joint_spy)
    monkeypatch.setattr(pipeline, "certified_rows", rows_spy)
    save_window(window, tmp_path / "w.npz")
    (tmp_path / "c.toml").write_text("[joint]\nmax_rounds = 1\nsticky = false\n[refine]\nmax_passes = 2\n"
                                     "[certify]\ntime_limit = 3.0\nmethod = \"cpsat\"\n"
                                     "[anneal]\npopulation = 4\n")
    args = ["plan", tmp_path / "w.npz", "--dp", 4, "--ep", 2, "--capacity", 2000, "--cost", "olmoe-1b-7b",
            "--placement", "joint", "--max-sweeps", 2, "-o", tmp_path / "p.json", "--json"]
    code, out, err = run_cli(*args, "--config", tmp_path / "c.toml")
    assert code == 0, err
    assert seen == {"max_rounds": 1, "max_passes": 2, "sticky": False, "certify": (3.0, "cpsat")}
    joint = load_plan(tmp_path / "p.json").report.joint
    assert joint is None or joint.rounds <= 1
    code, out, err = run_cli(*args)  # without --config: the defaults
    assert code == 0, err
    assert (seen["max_rounds"], seen["max_passes"], seen["certify"]) == (3, 4, (10.0, "auto"))
    (tmp_path / "bad.toml").write_text("[joint]\nrounds = 2\n")
    code, _, err = run_cli(*args, "--config", tmp_path / "bad.toml")
    assert code == 2 and err.startswith("error:") and "rounds" in err

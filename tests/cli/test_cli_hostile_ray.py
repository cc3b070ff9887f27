"""Signals and processes with Ray running (issue 39, item 2), through experiments/ray_signals.py's
probe: ``replay-report`` on a local Ray cluster of 2 CPUs, then SIGTERM after the first
``steps.jsonl`` line (exit 130, one ``error: interrupted`` line, no C++ dump, the lines kept, no
Ray process left) or SIGKILL once the workers are up (no GCS, raylet, agent or worker left)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="ray is not installed (pip install ray==2.60.0)")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments"))
import ray_signals  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return ray_signals.run_dir(tmp_path_factory.mktemp("ray"), 5)


def test_sigterm_mid_run_is_an_interrupt_and_keeps_state(run, tmp_path):
    r = ray_signals.case("sigterm-mid", run, tmp_path / "out", rerun=False)  # (the resume: experiments/)
    assert r["ray_up"] and not r["hang"], r
    assert r["rc"] in (130, 143) and r["stderr"] == ["error: interrupted"] and not r["dump"], r
    assert r["steps_lines_kept"] >= 1 and r["left_after_20s"] == 0, r
    lines = (tmp_path / "out" / "steps.jsonl").read_text().splitlines()
    assert all(line.startswith("{") and line.endswith("}") for line in lines), lines  # whole lines only


def test_kill9_leaves_no_ray_process(run, tmp_path):
    r = ray_signals.case("kill9", run, tmp_path / "out")
    assert r["ray_up"] and r["ray_processes_before"] >= 3, r  # GCS, raylet, agents, workers seen
    assert r["rc"] == -9 and r["left_after_20s"] == 0, r

"""Studies that keep a record (JSON/JSONL) next to their markdown render the markdown from it:
the committed markdown must be what ``render`` makes of the committed record, so a table can be
rewritten (or restyled) without rerunning the study."""

from __future__ import annotations

import json
from pathlib import Path

from _lib import settings


def test_joint_placement_markdown_is_its_record(load_script):
    """render(joint_placement.json) == joint_placement.md, byte for byte."""
    jp = load_script("joint_placement")
    folder = settings.RESULTS / "joint_placement"
    assert jp.render(json.loads((folder / "joint_placement.json").read_text())) == \
        (folder / "joint_placement.md").read_text()


def test_realism_markdown_is_its_record(load_script):
    """render(realism.json) == realism.md for the committed run's setting (512 samples, seed 0,
    8.1 min)."""
    rs = load_script("realism")
    folder = settings.RESULTS / "realism"
    st = rs.Setting(samples=512, seed=0, out=Path("unused"))
    assert rs.render(st, json.loads((folder / "realism.json").read_text()), 8.1 * 60) == \
        (folder / "realism.md").read_text()


def test_exact_study_n24_markdown_is_its_record(load_script):
    """The --max-n 24 markdown (summary + cross-check against the main run) from its JSON lines
    (36 windows, 1.3 min)."""
    ex = load_script("exact_study")
    recs = ex.load(ex.RESULTS / "exact_study_n24.jsonl")
    text = ex.summarise(recs, 36, 1.3 * 60, shipped=True) + ex.crosscheck_md(recs)
    assert text == (ex.RESULTS / "exact_study_n24.md").read_text()


def test_bench_window_markdown_is_its_record(load_script):
    """render(bench_window.json) == bench_window.md: the row-window study's tables come from its
    record."""
    bw = load_script("bench_window")
    folder = settings.RESULTS / "bench_window"
    lines = bw.render(json.loads((folder / "bench_window.json").read_text()))
    assert "\n".join(lines) + "\n" == (folder / "bench_window.md").read_text()


def test_replay_report_markdown_and_report_are_its_records(load_script):
    """render(replay_report.json) == replay_report.md, and the committed report.html shows the mean saving of the committed steps.jsonl."""
    from routepack_opt.report_run import read_steps, summarize

    rr = load_script("replay_report")
    folder = settings.RESULTS / "replay_report"
    assert "\n".join(rr.render(json.loads((folder / "replay_report.json").read_text()))) + "\n" == \
        (folder / "replay_report.md").read_text()
    recs, torn = read_steps(folder / "steps.jsonl")
    mean = summarize(recs)["mean_saving"]
    assert len(recs) == 200 and not torn
    assert f"<b id=mean-saving>{100 * mean:+.2f}%</b>" in (folder / "report.html").read_text()

"""The experiments' shared helpers (``experiments/_lib``): statistics on known inputs, the
markdown table writer, atomic writers and the per-study results folder."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from _lib import report, settings, stats


def test_kendall_tau_matches_definition():
    """Kendall tau-b equals the pair-counting definition, including ties."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        x = rng.integers(0, 5, 9).astype(float)
        y = rng.integers(0, 5, 9).astype(float)
        c = d = tx = ty = 0
        for i, j in itertools.combinations(range(9), 2):
            a, b = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
            c += a * b > 0
            d += a * b < 0
            tx += a == 0
            ty += b == 0
        n0 = 36
        den = np.sqrt((n0 - tx) * (n0 - ty))
        want = (c - d) / den if den else np.nan
        got = stats.kendall_tau(x, y)
        assert (np.isnan(want) and np.isnan(got)) or got == pytest.approx(want)
    assert stats.kendall_tau([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert stats.kendall_tau([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert math.isnan(stats.kendall_tau([1, 1, 1], [1, 2, 3]))


def test_kendall_tau_known_value():
    """One discordant pair out of six: tau = (5 − 1) / 6."""
    assert stats.kendall_tau([1, 2, 3, 4], [1, 2, 4, 3]) == pytest.approx(4 / 6)


def test_block_bootstrap_ci_brackets_the_mean():
    """The moving-block bootstrap CI contains the sample mean and is degenerate for a constant."""
    x = np.sin(np.arange(30) / 3.0) + 1.0
    lo, hi = stats.block_bootstrap_ci(x, stats.block_length(30), reps=500)
    assert lo <= x.mean() <= hi and lo < hi
    assert stats.block_bootstrap_ci(np.full(10, 2.0), 3, reps=100) == (2.0, 2.0)


def test_block_bootstrap_ci_is_seeded_and_handles_edges():
    """Same seed → same interval; an empty series gives nan; a block longer than n is clipped."""
    x = np.arange(12, dtype=float)
    assert stats.block_bootstrap_ci(x, 3, reps=200, seed=5) == stats.block_bootstrap_ci(x, 3, reps=200, seed=5)
    assert all(math.isnan(v) for v in stats.block_bootstrap_ci([], 3))
    lo, hi = stats.block_bootstrap_ci(x, 50, reps=50)
    assert lo == hi == pytest.approx(x.mean())  # one block = the whole series


def test_block_length_is_cube_root_at_least_two():
    """round(n^(1/3)), never below 2."""
    assert [stats.block_length(n) for n in (1, 8, 20, 27, 1000)] == [2, 2, 3, 3, 10]


def test_lag1_autocorrelation():
    """Alternating series → −1, a line → 1, too short or constant → nan."""
    assert stats.lag1([1, -1, 1, -1, 1, -1]) == pytest.approx(-1.0)
    assert stats.lag1([1, 2, 3, 4, 5]) == pytest.approx(1.0)
    assert math.isnan(stats.lag1([1, 2])) and math.isnan(stats.lag1([3, 3, 3, 3]))


def test_mean_ci_pct_format():
    """Mean and its CI in percent, signed, two decimals."""
    assert stats.mean_ci_pct(np.full(5, 0.1), 2, 50) == "+10.00% [+10.00, +10.00]"


def test_markdown_table_renders_known_table():
    """Header, rule and rows; strings kept as they are; per-column formats by name or index;
    None as a dash; values without a format through str."""
    lines = report.table(["preset", "gain", "s", "n"],
                         [("olmoe", 0.0123, 1.5, 3), ("qwen", -0.5, None, 10)],
                         formats={"gain": report.pct, 2: ".2f"})
    assert lines == ["| preset | gain | s | n |",
                     "|---|---|---|---|",
                     "| olmoe | +1.23% | 1.50 | 3 |",
                     "| qwen | -50.00% | — | 10 |"]


def test_markdown_table_alignment_and_errors():
    """Alignment letters become rule cells; a wrong row length or align string is an error."""
    assert report.table(["a", "b", "c"], [], align="lrc")[1] == "|---|---:|:---:|"
    assert report.table(["a", "b"], [(1234.5, "x")], formats={"a": ",.0f"})[2] == "| 1,234 | x |"
    with pytest.raises(ValueError, match="row 0 has 1 cells for 2 columns"):
        report.table(["a", "b"], [(1,)])
    with pytest.raises(ValueError, match="align"):
        report.table(["a", "b"], [], align="l")


def test_table_filled_row_by_row():
    """Table.add returns the row's line as the whole table will show it; lines is the table; a
    format for a column that does not exist is an error."""
    t = report.Table(["what", "rate"], formats={"rate": report.num(".2f", per=1e6, suffix=" M")})
    assert t.add("max-sum", 2_840_000) == "| max-sum | 2.84 M |"
    t.add("sum-max", None)
    assert t.lines() == ["| what | rate |", "|---|---|", "| max-sum | 2.84 M |", "| sum-max | — |"]
    with pytest.raises(ValueError, match="not a column"):
        report.Table(["a"], formats={"b": ".2f"})


def test_pct_and_cell():
    """pct is a signed percentage; a callable format is applied to non-string values only."""
    assert report.pct(0.0) == "+0.00%" and report.pct(-0.01234) == "-1.23%"
    assert report.cell("text", ".2f") == "text" and report.cell(2, lambda v: f"<{v}>") == "<2>"


def test_writers_are_atomic_and_complete(tmp_path):
    """write_md ends with one newline; write_json writes numpy floats; no temporary file is left."""
    md = report.write_md(tmp_path / "sub" / "t.md", ["# t", "", *report.table(["x"], [(1,)])])
    assert md.read_text() == "# t\n\n| x |\n|---|\n| 1 |\n"
    js = report.write_json(tmp_path / "t.json", {"v": np.float64(0.5), "l": [1, 2]})
    assert json.loads(js.read_text()) == {"v": 0.5, "l": [1, 2]}
    report.write_text(js, "again\n")
    assert js.read_text() == "again\n"
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["t.json", "t.md"]


def test_save_fig_writes_png(tmp_path):
    """Figures go through the Agg backend into the given file."""
    plt = report.pyplot()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    path = report.save_fig(fig, tmp_path / "plots" / "f.png", dpi=50)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_results_dir_is_one_folder_per_study(tmp_path):
    """By default a study writes into experiments/results/<study>; --out overrides it."""
    assert settings.results_dir("x", tmp_path / "o") == tmp_path / "o"
    assert (tmp_path / "o").is_dir()
    assert settings.RESULTS.name == "results" and settings.RESULTS.parent == settings.EXPERIMENTS
    assert settings.presets_arg("a,,b") == ("a", "b")


def test_every_results_folder_belongs_to_a_script():
    """experiments/results holds only folders, each named after a script in experiments/ (or the
    referee reading notes), so a result can always be traced to the script that writes it."""
    scripts = {p.stem for p in settings.EXPERIMENTS.glob("*.py")}
    entries = list(settings.RESULTS.iterdir())
    assert all(p.is_dir() for p in entries), [p.name for p in entries if not p.is_dir()]
    assert {p.name for p in entries} - scripts <= {"referee_summary"}

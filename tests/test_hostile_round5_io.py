"""Hostile inputs, round 5 (issue 50 items 1, 3, 4, 9 of "What was found"; issue 49 item 7/10):
outputs that never follow a link into anything, readers that never fault on a file cut short
while it is read, a replay report that trusts only its own lines, and a replay report that plans
with the seams' budget and labels its rows correctly. Each test reproduces one finding."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzz_support as fs  # noqa: E402

from routepack_opt.core.errors import InputError  # noqa: E402
from routepack_opt.core.io import append_bytes, atomic_write_text, check_output_path  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return fs.good_files(tmp_path_factory.mktemp("good"))


_one_error = fs.one_error


# --- the replay report's directories, without Ray (every window already has its line) ----------
REPORT_ARGS = [*fs.TOPO, "--cost", fs.COST]
# --time-limit 0.1 (the verl seam's budget, now the default) given: the same run.json before and after the default
GIVEN = [*REPORT_ARGS, "--time-limit", "0.1"]


def _cfg(**kw):
    from routepack_opt.core.cost import resolve_cost
    from routepack_opt.core.topology import Topology
    from routepack_opt.integrations._seam import DEFAULT_TIME_LIMIT
    from routepack_opt.report_run import ReportConfig

    kw.setdefault("time_limit", DEFAULT_TIME_LIMIT["verl"])  # what the command plans with by default
    return ReportConfig(topology=Topology(dp=2, ep=2, capacity=1024), cost=resolve_cost(fs.COST), **kw)


def _line(window: str, step: int, makespan: float = 100.0, base: float = 125.0, rows: int = 3,
          r_star: int = 2) -> dict:
    """A step line as a run writes it (its savings those of its own makespans)."""
    saving = (base - makespan) / base
    lb = min(90.0, makespan)  # a bound is never above the makespan
    return {"window": window, "step": step, "samples": 16, "tokens": 1800, "layers": 2, "experts": 8,
            "rows": rows, "makespan": makespan, "lower_bound": lb, "gap": makespan / lb, "saving": saving,
            "rows_saved": 1, "best_baseline": "verl/identity",
            "certificate": {"rows": r_star, "status": "optimal", "lower_bound": r_star, "method": "bounds"},
            "baselines": {"verl/identity": {"makespan": base, "saving": saving, "gap": base / 90.0,
                                            "cap_violations": 0, "extra_rows": rows + 1 - r_star, "rows": rows + 1,
                                            "lower_bound": 90.0},
                          "slime/identity": {"error": "ValueError: x"}},
            "ep_imbalance": {"routepack": 0.01, "identity": 0.2, "eplb": 0.05},
            "time_split": {"attention": 60.0, "experts": 35.0, "overhead": 5.0},
            "timings": {"load": 0.01, "certify": 0.02, "plan": 0.03, "total": 0.1}}


def _report_dirs(tmp_path, files, lines, windows=("w0.npz",), **cfg):
    """RUN_DIR with ``windows`` (copies of the good window), OUT_DIR prepared for the command's
    options with ``lines`` in its steps.jsonl."""
    from routepack_opt.report_run import prepare_out_dir

    run, out = tmp_path / "run", tmp_path / "out"
    run.mkdir()
    for name in windows:
        (run / name).write_bytes(files["window"].read_bytes())
    prepare_out_dir(out, _cfg(**cfg))
    (out / "steps.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return run, out


# --- issue 50 found 1: data loss through a link in OUT_DIR ---------------------------------------
@pytest.mark.parametrize("name", ["report.html", "summary.json", "steps.jsonl", "run.json"])
def test_50_1_out_dir_file_linked_to_a_window_is_refused(files, tmp_path, name):
    """Issue 50 found 1: OUT_DIR/<file> a symlink to a window of RUN_DIR was followed (exit 0, the window became HTML/JSON); now exit 2 and the window is intact."""
    run, out = _report_dirs(tmp_path, files, [{"window": "w0.npz", "step": 0, "error": "x"}])
    before = (run / "w0.npz").read_bytes()
    if os.path.lexists(out / name):
        (out / name).unlink()
    (out / name).symlink_to(run / "w0.npz")
    _one_error(*fs.run_cli(["replay-report", str(run), "-o", str(out), *GIVEN]), "symbolic link")
    assert (run / "w0.npz").read_bytes() == before and (out / name).is_symlink()


def test_50_1_out_dir_file_hard_linked_to_a_window_is_refused(files, tmp_path):
    """Issue 50 found 1: OUT_DIR/summary.json a hard link of a window of RUN_DIR is refused as an input (exit 2)."""
    run, out = _report_dirs(tmp_path, files, [{"window": "w0.npz", "step": 0, "error": "x"}])
    os.link(run / "w0.npz", out / "summary.json")
    _one_error(*fs.run_cli(["replay-report", str(run), "-o", str(out), *GIVEN]), "overwrite the input")


# --- issue 50 found 3: FIFO outputs hang in open() -------------------------------------------------
def _cli_subprocess(argv, timeout=60):
    """``routepack ARGV`` in a child (a hang in a blocking open() fails the test, never the suite):
    (exit code, stderr)."""
    r = subprocess.run([sys.executable, "-m", "routepack_opt", *map(str, argv)], capture_output=True, text=True,
                       timeout=timeout, env=ENV, cwd=REPO)
    return r.returncode, r.stderr


def test_50_3_plan_into_a_fifo_without_reader_is_refused_not_blocked(files, tmp_path):
    """Issue 50 found 3: `plan -o FIFO` with no reader blocked forever in open(); now exit 2 at once, the FIFO untouched."""
    fifo = tmp_path / "p.json"
    os.mkfifo(fifo)
    code, err = _cli_subprocess(["plan", files["window"], *fs.TOPO, "--cost", fs.COST, "--max-sweeps", "1",
                                 "-o", fifo])
    assert code == 2 and err.count("\n") == 1 and "named pipe (FIFO)" in err, err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_50_3_fifo_as_report_html_is_refused_not_blocked(files, tmp_path):
    """Issue 50 found 3: a FIFO as OUT_DIR/report.html blocked forever; now exit 2 before any work."""
    run, out = _report_dirs(tmp_path, files, [{"window": "w0.npz", "step": 0, "error": "x"}])
    os.mkfifo(out / "report.html")
    code, err = _cli_subprocess(["replay-report", run, "-o", out, *GIVEN])
    assert code == 2 and err.count("\n") == 1 and "FIFO" in err, err
    assert stat.S_ISFIFO(os.lstat(out / "report.html").st_mode)


@pytest.mark.parametrize("cmd", ["plan", "exact", "gen-trace", "import-replay", "calibrate", "demo"])
def test_50_3_every_writer_refuses_a_link_at_its_output(files, tmp_path, cmd):
    """Issue 50 What to build 3: every command that writes a file refuses a symlink at its output (exit 2) and leaves the link's target as it was."""
    target = tmp_path / "target.bin"
    target.write_bytes(b"keep me")
    link = tmp_path / ("out.npz" if cmd in ("gen-trace", "import-replay") else "out.json")
    w = str(files["window"])
    if cmd == "demo":
        (tmp_path / "d").mkdir()
        link = tmp_path / "d" / "plan.json"
    link.symlink_to(target)
    argv = {"plan": ["plan", w, *fs.TOPO, "--cost", fs.COST, "--max-sweeps", "1", "-o", str(link)],
            "exact": ["exact", w, *fs.TOPO, "--cost", fs.COST, "-o", str(link)],
            "gen-trace": ["gen-trace", "--samples", "4", "-o", str(link)],
            "import-replay": ["import-replay", str(files["routes_npz"]), "--num-experts", str(fs.E), "-o", str(link)],
            "calibrate": ["calibrate", "--quick", "-o", str(link)],
            "demo": ["demo", "--out", str(tmp_path / "d")]}[cmd]
    _one_error(*fs.run_cli(argv, timeout=60), "symbolic link")
    assert target.read_bytes() == b"keep me" and link.is_symlink()


def _mknod_or_skip(path):
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a private /dev/null
    except OSError as exc:
        pytest.skip(f"cannot create a character device here ({exc})")


@pytest.mark.parametrize("kind", ["symlink", "fifo", "chardev", "socket", "dir"])
def test_50_3_the_one_writer_refuses_what_is_not_a_regular_file(tmp_path, kind):
    """Issue 50 What to build 3: atomic_write_text and append_bytes refuse a link, FIFO, device, socket or directory at the final name, never opening it, and leave nothing behind."""
    real = tmp_path / "real.txt"
    real.write_text("old")
    path = tmp_path / "out.txt"
    sock = reader = None
    if kind == "symlink":
        path.symlink_to(real)
    elif kind == "fifo":
        os.mkfifo(path)
        reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a writer that opened it anyway would not block
    elif kind == "chardev":
        _mknod_or_skip(path)
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
    else:
        path.mkdir()
    mode = os.lstat(path).st_mode
    try:
        with pytest.raises(InputError, match=str(path)):
            atomic_write_text(path, "new")
        with pytest.raises(InputError, match=str(path)):
            append_bytes(path, b"new\n")
    finally:
        if sock is not None:
            sock.close()
        if reader is not None:
            os.close(reader)
    assert os.lstat(path).st_mode == mode and real.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt", "real.txt"]


def test_50_3_an_output_that_is_an_input_by_hard_link_or_spelling(tmp_path):
    """Issue 50 What to build 3: an output that resolves to an input (hard link, ./x/../ spelling) is refused by check_output_path and by the writer given its inputs."""
    inp = tmp_path / "w.npz"
    inp.write_bytes(b"input")
    os.link(inp, tmp_path / "hard.npz")
    (tmp_path / "sub").mkdir()
    for out in (tmp_path / "hard.npz", tmp_path / "sub" / ".." / "w.npz"):
        with pytest.raises(InputError, match="overwrite the input"):
            check_output_path(out, inp)
        with pytest.raises(InputError, match="overwrite the input"):
            atomic_write_text(out, "x", inputs=[inp])
    assert inp.read_bytes() == b"input"


# --- issue 50 found 4: SIGBUS on a routes file truncated while it is read -------------------------
_TRUNCATING = """
import os, sys
import routepack_opt.replay.files as files
import routepack_opt.core.inputs as inputs
from routepack_opt.cli import main
path, hook = sys.argv[1], sys.argv[2]
def cut(size=0):
    with open(path, "r+b") as fh:
        fh.truncate(size)
if hook == "npy":  # the array is returned (mapped, before the fix), then the file is cut
    orig = files._read_npy
    def wrapped(fh, where, *a, **k):
        out = orig(fh, where, *a, **k)
        cut(128)
        return out
    files._read_npy = wrapped
elif hook == "pt":
    orig = files._load_pt
    def wrapped(p):
        out = orig(p)
        cut(64)
        return out
    files._load_pt = wrapped
elif hook == "st":  # the routes are read (mapped, before the fix), then the data is cut away
    orig = inputs.SafetensorsFile._raw
    def wrapped(self, key, *a):
        out = orig(self, key, *a)
        if key == "routes":
            cut(self.data_start)
            int(out.sum())  # the reader touches what it got (a mapping of pages no longer in the file)
        return out
    inputs.SafetensorsFile._raw = wrapped
elif hook == "header":  # cut between the header check and the read of the data
    orig = inputs.check_npy_file
    def wrapped(p, *a, **k):
        out = orig(p, *a, **k)
        if str(p) == path:
            cut(160)
        return out
    inputs.check_npy_file = wrapped
    files.inputs.check_npy_file = wrapped
argv = ["import-replay", path, "--num-experts", sys.argv[3], "-o", sys.argv[4]] + sys.argv[5:]
sys.exit(main(argv))
"""


@pytest.mark.parametrize("hook", ["npy", "pt", "st", "header"])
def test_50_4_routes_truncated_while_read_never_kill_the_process(files, tmp_path, hook):
    """Issue 50 found 4: a memory-mapped routes file truncated while import-replay read it killed the process with SIGBUS (rc 135 / -7); now the read is in memory: exit 0 with a valid window, or exit 2 with one error: line."""
    key = {"npy": "routes_npy", "pt": "routes_pt", "st": "routes_st", "header": "routes_npy"}[hook]
    if key not in files:
        pytest.skip(f"{key}: its library is not installed")
    src = tmp_path / files[key].name
    src.write_bytes(files[key].read_bytes())
    extra = ["--lengths", str(files["lengths"])] if key == "routes_npy" else []
    out = tmp_path / "w.npz"
    r = subprocess.run([sys.executable, "-c", _TRUNCATING, str(src), hook, str(fs.E), str(out), *extra],
                       capture_output=True, text=True, timeout=120, env=ENV, cwd=tmp_path)
    assert r.returncode in (0, 2), (r.returncode, r.stderr[-2000:])
    if r.returncode == 2:
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: ") and "truncated" in r.stderr, r.stderr
        assert not out.exists()
    else:
        from routepack_opt.core.window import load_window

        assert load_window(out).num_samples == fs.N
    if hook in ("st", "header"):  # the data was cut before it was read: refused, not imported
        assert r.returncode == 2


# --- issue 50 found 9: replay-report believes any line --------------------------------------------
def test_50_9_lines_for_windows_not_in_run_dir_are_ignored(files, tmp_path):
    """Issue 50 found 9: steps.jsonl lines for ghost.npz and ../../etc/passwd were counted (ok = 3 for 1 window) and named in the HTML; now left out with a note, summary.json as without them."""
    good = _line("w0.npz", 0)
    run, out = _report_dirs(tmp_path, files, [good, _line("ghost.npz", 1, makespan=50.0),
                                              _line("../../etc/passwd", 2, makespan=40.0)])
    code = fs.run_cli(["replay-report", str(run), "-o", str(out), *GIVEN], timeout=120)
    assert code[1] == 0, code
    assert "ignored 2 line(s) for windows that are not in RUN_DIR" in code[2]
    summary = json.loads((out / "summary.json").read_text())
    from routepack_opt.report_run import run_summary

    assert summary["ok"] == summary["windows"] == 1
    assert summary["seconds_saved"] == pytest.approx(run_summary([good])["seconds_saved"])
    html = (out / "report.html").read_text()
    assert "ghost" not in html and "passwd" not in html and "w0.npz" in html


def _mutate(rec: dict, what: str) -> dict:
    r = json.loads(json.dumps(rec))
    b = r["baselines"]["verl/identity"]
    if what == "makespan -5":
        r["makespan"] = -5.0
    elif what == "makespan -1.7e308":
        r["makespan"] = -1.7e308
    elif what == "makespan NaN":
        r["makespan"] = float("nan")
    elif what == "saving 1e300":
        r["saving"] = b["saving"] = 1e300
    elif what == "saving not its makespans'":
        r["saving"] = b["saving"] = 0.9
    elif what == "baseline makespan inf":
        b["makespan"] = float("inf")
    elif what == "step 2**70":
        r["step"] = 2**70
    elif what == "rows 2**70":
        r["rows"] = 2**70
    elif what == "step 0.0":
        r["step"] = 0.0
    elif what == "rows 3.0":
        r["rows"] = 3.0
    elif what == "cap_violations true":
        b["cap_violations"] = True
    elif what == "planning -1e9 s":
        r["timings"]["plan"] = -1e9
    elif what == "best breaks the cap":
        b["cap_violations"] = 4
    elif what == "lower_bound 1e300":
        r["lower_bound"] = 1e300
    return r


@pytest.mark.parametrize("what", ["makespan -5", "makespan -1.7e308", "makespan NaN", "saving 1e300",
                                  "saving not its makespans'", "baseline makespan inf", "step 2**70",
                                  "rows 2**70", "step 0.0", "rows 3.0", "cap_violations true",
                                  "planning -1e9 s", "best breaks the cap", "lower_bound 1e300"])
def test_50_9_lines_with_values_no_run_writes_are_skipped(tmp_path, what):
    """Issue 50 found 9: a line with a makespan of -5, a saving of 1e300, a step of 2**70 or a float where an integer belongs was accepted and changed summary.json; now skipped with a note naming its line, summary.json as without it."""
    from routepack_opt.report_run import read_steps, run_records, run_summary

    good = _line("w0.npz", 0)
    p = tmp_path / "steps.jsonl"
    p.write_text(json.dumps(good) + "\n" + json.dumps(_mutate(good, what)) + "\n")  # the bad line is newest
    notes: list[str] = []
    records, torn = read_steps(p, notes)
    assert not torn and len(records) == 1 and len(notes) == 1 and "line 2" in notes[0], notes
    latest = run_records(records, ["w0.npz"], notes)
    assert run_summary(latest) == run_summary([good])


def test_50_9_the_committed_run_passes_the_line_schema():
    """Issue 50 found 9: the stricter line schema still takes every line a real run wrote (the committed 200-window study)."""
    from routepack_opt.report_run import read_steps

    notes: list[str] = []
    records, torn = read_steps(REPO / "experiments" / "results" / "replay_report" / "steps.jsonl", notes)
    assert notes == [] and not torn and len(records) == 200


def test_50_9_run_json_with_a_float_seed_does_not_resume(tmp_path):
    """Issue 50 found 9: run.json with "seed": 0.0 resumed a run made with seed 0; now exit-2 "other options (seed)"."""
    from routepack_opt.report_run import prepare_out_dir

    cfg = _cfg()
    prepare_out_dir(tmp_path, cfg)
    run = json.loads((tmp_path / "run.json").read_text())
    run["seed"] = 0.0
    (tmp_path / "run.json").write_text(json.dumps(run))
    with pytest.raises(InputError, match=r"other options \(seed\)"):
        prepare_out_dir(tmp_path, cfg)


# --- issue 49 item 7 / What to build 10: budget, rows chart, Steps columns --------------------------
@pytest.mark.parametrize("extra, want", [([], ("verl", 0.1)), (["--format", "slime", "--num-experts", "8"],
                                                                ("slime", 0.25)),
                                         (["--max-sweeps", "3"], (None, None)), (["--time-limit", "2"], (None, 2.0))])
def test_49_10_replay_report_defaults_to_the_seams_budget(extra, want):
    """Issue 49 item 7: replay-report planned with no time limit; now the seams' default per-step budget unless --time-limit or --max-sweeps is given, and it says which."""
    from routepack_opt.cli import build_parser
    from routepack_opt.cli.replay_report import search_budget
    from routepack_opt.integrations._seam import DEFAULT_TIME_LIMIT

    args = build_parser().parse_args(["replay-report", "run", "-o", "out", *REPORT_ARGS, *extra])
    limit, source = search_budget(args)
    seam, given = want
    if seam is not None:
        assert limit == DEFAULT_TIME_LIMIT[seam] and f"the {seam} seam's default per-step budget" in source
    else:
        assert limit == given and source.startswith("given with --")


def test_49_10_summary_and_html_say_the_budget(files, tmp_path):
    """Issue 49 item 7: summary.json and report.html say which budget the report planned with (the verl seam's default here)."""
    run, out = _report_dirs(tmp_path, files, [_line("w0.npz", 0)])
    code = fs.run_cli(["replay-report", str(run), "-o", str(out), *REPORT_ARGS], timeout=120)
    assert code[1] == 0, code
    summary = json.loads((out / "summary.json").read_text())
    assert summary["options"]["time_limit"] == 0.1
    assert summary["budget"].startswith("0.1 s of search per window; the verl seam's default")
    assert "id=budget>Search budget: 0.1 s of search per window" in (out / "report.html").read_text()


def test_49_10_steps_table_has_rows_and_r_star_apart(tmp_path):
    """Issue 49 item 7: the Steps table's single "rows R*" column showed our rows; now `rows` and `R*` are two columns with their own values."""
    from routepack_opt.report_run import render_report

    text = render_report([_line("w0.npz", 0, rows=3, r_star=2)], tmp_path / "r.html").read_text()
    assert "<th>window</th><th>rows</th><th>R*</th>" in text
    assert "<td>w0.npz</td><td>3</td><td>2</td>" in text


def test_49_10_rows_chart_is_labelled_by_what_it_plots():
    """Issue 49 item 7: the rows chart plotted baseline rows − ours under "rows − R*"; its label now says what the bars are, and the bars are baseline rows − ours."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from routepack_opt.report_html import _rows_bars

    recs = [_line("a.npz", 0, rows=3, r_star=2), _line("b.npz", 1, rows=4, r_star=2)]
    fig, ax = plt.subplots()
    _rows_bars(ax, np.arange(2), ["verl"], recs)
    heights = [p.get_height() for p in ax.patches]
    plt.close(fig)
    assert ax.get_ylabel() == "baseline rows − our rows" and "R*" not in ax.get_title()
    assert heights == [r["baselines"]["verl/identity"]["rows"] - r["rows"] for r in recs]

"""``routepack replay-report`` answering in seconds: a 12-window run with replicas, its
``summary.json``, its progress lines without a terminal and a screenshot of ``report.html``.

    python experiments/replay_report_net.py [--windows 12] [-o experiments/results/replay_report/net]

Windows: N = 512 samples (lengths lognormal(6.3, 1.0) clipped to 16..8,192), L = 8 MoE layers,
E = 32 experts, top-2, skewed routing (``random_counts`` skew 1.5), a new seed per step. Run:
``replay-report --dp 8 --ep 8 --capacity 16384 --cost qwen3-30b-a3b --redundant-experts 8
--max-sweeps 10 --workers 1``, stderr a pipe (no TTY), so progress comes as ``k/N windows``
lines. Kept: ``summary.json``, ``progress.txt`` (those lines), ``report.png`` (headless
chromium's screenshot of ``report.html``, when chromium is installed).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _lib import report  # noqa: E402

from routepack_opt.core.testing import random_counts  # noqa: E402
from routepack_opt.core.window import Window, save_window  # noqa: E402


def make_run(run_dir: Path, windows: int) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    for k in range(windows):
        rng = np.random.default_rng(100 + k)
        lens = np.clip(rng.lognormal(6.3, 1.0, 512), 16, 8192).astype(np.int64)
        save_window(Window(lens, random_counts(lens, 8, 32, 2, rng, 1.5), top_k=2), run_dir / f"step_{k}.npz")


def screenshot(html: Path, png: Path) -> bool:
    exe = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
    if exe is None:
        return False
    subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1100,1400", f"--screenshot={png}", html.as_uri()],
                   check=True, capture_output=True, timeout=120)
    return png.exists()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--windows", type=int, default=12)
    ap.add_argument("-o", "--out", default=str(ROOT / "experiments/results/replay_report/net"))
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        run_dir, rep = Path(tmp) / "run", Path(tmp) / "report"
        make_run(run_dir, a.windows)
        cmd = [sys.executable, "-m", "routepack_opt", "replay-report", str(run_dir), "-o", str(rep), "--dp", "8",
               "--ep", "8", "--capacity", "16384", "--cost", "qwen3-30b-a3b", "--redundant-experts", "8",
               "--max-sweeps", "10", "--workers", "1"]
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3000)
        if res.returncode:
            raise SystemExit(f"replay-report failed ({res.returncode}):\n{res.stderr[-3000:]}")
        progress = [ln for ln in res.stderr.splitlines() if " windows, " in ln]
        report.write_text(out / "progress.txt", "\n".join(progress) + "\n")
        summary = json.loads((rep / "summary.json").read_text())
        report.write_json(out / "summary.json", summary)
        shot = screenshot(rep / "report.html", out / "report.png")
    lines = ["# replay-report in seconds (issue 38)", "", (__doc__ or "").split("\n\n", 1)[1].strip(), "",
             f"Command: `python experiments/replay_report_net.py --windows {a.windows}`", "",
             f"- windows: {summary['windows']} (failed {summary['failed']})",
             f"- seconds saved (predicted, vs each step's best cap-keeping baseline): {summary['seconds_saved']:.3f} s",
             f"- planning seconds (measured): {summary['planning_seconds']:.3f} s",
             f"- net seconds saved: {summary['net_seconds_saved']:+.3f} s",
             f"- options: redundant_experts = {summary['options']['redundant_experts']}, "
             f"cost = {summary['options']['cost']}, max_sweeps = {summary['options']['max_sweeps']}",
             f"- progress lines on stderr: {len(progress)} (first: `{progress[0] if progress else ''}`)",
             f"- screenshot: {'report.png' if shot else 'chromium not installed'}", "",
             "CLI summary:", "", "```", res.stdout.strip(), "```"]
    report.write_md(out / "replay_report_net.md", lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()

"""Command-line flags the studies share and where each study writes its results.

Every study writes into ``experiments/results/<study>/`` (``results_dir``), or into ``--out DIR``
when given (tests and smoke runs pass a temporary folder).
"""

from __future__ import annotations

import argparse
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parents[1]
ROOT = EXPERIMENTS.parent
RESULTS = EXPERIMENTS / "results"
PRESETS = ("olmoe-1b-7b", "qwen3-30b-a3b", "ling-hybrid", "deepseek-v3")


def results_dir(study: str, out: Path | str | None = None) -> Path:
    """The folder ``study`` writes into (``out`` if given, else ``experiments/results/<study>``),
    created if missing."""
    path = Path(out) if out is not None else RESULTS / study
    path.mkdir(parents=True, exist_ok=True)
    return path


def parser(doc: str | None, **kwargs) -> argparse.ArgumentParser:
    """An ``ArgumentParser`` described by the first paragraph of the script's docstring, the
    whole docstring shown by ``--help``."""
    first = (doc or "").strip().split("\n\n")[0]
    return argparse.ArgumentParser(description=first, epilog=None,
                                   formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs)


def add_quick(ap: argparse.ArgumentParser, help: str = "smoke-test sizes") -> None:
    ap.add_argument("--quick", action="store_true", help=help)


def add_out(ap: argparse.ArgumentParser, study: str) -> None:
    """``--out DIR``: where the study writes (default ``experiments/results/<study>``)."""
    ap.add_argument("--out", type=Path, default=None,
                    help=f"output folder (default experiments/results/{study})")


def add_seed(ap: argparse.ArgumentParser, default: int = 0) -> None:
    ap.add_argument("--seed", type=int, default=default)


def add_seeds(ap: argparse.ArgumentParser, default: int, help: str = "number of trace seeds") -> None:
    ap.add_argument("--seeds", type=int, default=default, help=help)


def add_presets(ap: argparse.ArgumentParser, default=PRESETS) -> None:
    """``--presets a,b``: comma-separated preset names (parse with ``presets_arg``)."""
    ap.add_argument("--presets", default=",".join(default), help="comma-separated preset names")


def presets_arg(value: str) -> tuple[str, ...]:
    return tuple(p for p in value.split(",") if p)

"""Shared fixtures: paths, a CLI runner, small windows."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from routepack_opt.cli import main as cli_main

REPO = Path(__file__).resolve().parents[1]


def bpp_dir() -> Path | None:
    """The external BPP benchmark collection: ``$ROUTEPACK_BPP_DIR``, else ``<repo>/../shared/data/bpp``
    when it exists; None when neither holds it (a bare clone)."""
    env = os.environ.get("ROUTEPACK_BPP_DIR")
    path = Path(env) if env else REPO.parent / "shared" / "data" / "bpp"
    return path if path.is_dir() and any(path.glob("*.jsonl")) else None


BPP_DIR = bpp_dir()


def require_bpp() -> Path:
    """BPP_DIR, or skip the calling test with a one-line reason."""
    if BPP_DIR is None:
        pytest.skip("BPP benchmark set not found: set ROUTEPACK_BPP_DIR to its directory")
    return BPP_DIR


@pytest.fixture
def run_cli(capsys):
    """Run ``routepack ARGS`` in-process; returns (exit code, stdout, stderr)."""

    def _run(*args):
        code = cli_main([str(a) for a in args])
        out, err = capsys.readouterr()
        return code, out, err

    return _run


@pytest.fixture
def rng():
    return np.random.default_rng(1234)

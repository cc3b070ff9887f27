"""Shared fixtures: paths, a CLI runner, small windows."""

from __future__ import annotations

import numpy as np
import pytest

from routepack_opt.cli import main as cli_main


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

"""The README's two newcomer commands are what CI runs, and they install what the tests use."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys

import pytest
from support import REPO


def _commands() -> list[str]:
    r = subprocess.run([sys.executable, str(REPO / ".ci" / "readme_commands.py"), str(REPO / "README.md")],
                       capture_output=True, text=True, check=True)
    return r.stdout.splitlines()


def test_ci_runs_exactly_the_readme_commands():
    """.ci/run evals the two lines readme_commands.py reads from the README, and nothing is
    installed before them (no pip call of its own)."""
    install, tests = _commands()
    assert "pip install -e \".[test]\"" in install and install.endswith("routepack demo")
    # uv (parallel install and byte-compile) is pinned like everything else the command installs
    assert re.search(r"\buv==\d+\.\d+\.\d+\b", install), "the README's first command installs an unpinned uv"
    assert tests == "python3 -m pytest -q"
    ci = (REPO / ".ci" / "run").read_text()
    assert "readme_commands.py README.md" in ci and 'eval "${cmds[0]}"' in ci and 'eval "${cmds[1]}"' in ci
    body = [ln for ln in ci.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert not any("pip install" in ln for ln in body), "CI installs something the README does not"


def test_readme_verl_pin_is_the_installed_verl():
    """The verl version the first command installs (--no-deps) is the one the seams are tested with."""
    m = re.search(r"verl==([\w.]+)", _commands()[0])
    assert m, "the README's first command installs no pinned verl"
    try:
        installed = importlib.metadata.version("verl")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("verl is not installed: run the README's first command")
    assert installed == m.group(1)

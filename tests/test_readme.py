"""The README's two newcomer commands are what CI runs, and they install what the tests use."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO


def _commands() -> list[str]:
    r = subprocess.run([sys.executable, str(REPO / ".ci" / "readme_commands.py"), str(REPO / "README.md")],
                       capture_output=True, text=True, check=True)
    return r.stdout.splitlines()


def test_ci_runs_exactly_the_readme_commands():
    """.ci/run evals the two lines readme_commands.py reads from the README, and nothing is
    installed before them (no pip call of its own); both install with the lock."""
    install, tests = _commands()
    assert "pip install -c constraints/lock.txt -e \".[test]\"" in install and install.endswith("routepack demo")
    # everything the first command installs by name (torch, uv) comes at the lock's version
    assert re.match(r"python3 -m pip install -c constraints/lock\.txt torch uv && ", install), install
    assert tests == "python3 -m pytest -q"
    ci = (REPO / ".ci" / "run").read_text()
    assert "readme_commands.py README.md" in ci and 'eval "${cmds[0]}"' in ci and 'eval "${cmds[1]}"' in ci
    body = [ln for ln in ci.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert not any("pip install" in ln for ln in body), "CI installs something the README does not"
    # after them: the lowest-version set (its own venv) and the co-install check
    assert ci.index('eval "${cmds[1]}"') < ci.index("bash .ci/lowest") < ci.index("python3 .ci/coinstall.py")


def _pins(path: Path) -> dict[str, str]:
    """name → version of a constraints file's ``name==version`` lines (markers and comments dropped)."""
    out = {}
    for line in path.read_text().splitlines():
        m = re.match(r"([A-Za-z0-9_.-]+)==([^\s;#]+)", line)
        if m:
            out[m.group(1).lower().replace("_", "-")] = m.group(2)
    return out


def _requirements() -> dict[str, list[str]]:
    """pyproject's dependencies and extras: group → requirement strings ('' for the dependencies)."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return {"": project["dependencies"], **project["optional-dependencies"]}


def test_pyproject_has_ranges_and_the_lock_pins_them():
    """The package asks for ranges, torch only in an extra; the lock pins every requirement to a
    version inside its range; constraints/lowest.txt is exactly the dependencies' lower bounds."""
    from packaging.requirements import Requirement

    groups = _requirements()
    lock, lowest = _pins(REPO / "constraints" / "lock.txt"), _pins(REPO / "constraints" / "lowest.txt")
    assert not any(Requirement(r).name == "torch" for r in groups[""]), "torch is a requirement, not an extra"
    assert any(Requirement(r).name == "torch" for r in groups["torch"])
    for group, reqs in groups.items():
        for text in reqs:
            req = Requirement(text)
            if req.name == "routepack-opt":
                continue
            assert not any(s.operator in ("==", "===", "~=") for s in req.specifier), f"{text}: a pin, not a range"
            key = req.name.lower().replace("_", "-")
            assert key in lock, f"{text} ({group or 'dependencies'}) is not in constraints/lock.txt"
            assert req.specifier.contains(lock[key]), f"lock's {key}=={lock[key]} is outside {text}"
    for text in groups[""]:
        req = Requirement(text)
        (low,) = [s.version for s in req.specifier if s.operator == ">="]
        assert req.specifier.contains(lowest[req.name]) and lowest[req.name].startswith(low), (text, lowest)


def test_version_comes_from_one_place():
    """pyproject reads the version from routepack_opt.__version__; the installed metadata agrees."""
    import tomllib

    import routepack_opt

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"] and pyproject["project"]["dynamic"] == ["version"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "routepack_opt.__version__"}
    try:
        installed = importlib.metadata.version("routepack-opt")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("routepack-opt is not installed")
    assert installed == routepack_opt.__version__


def test_readme_verl_pin_is_the_installed_verl():
    """The verl version the first command installs (--no-deps) is the one the seams are tested with."""
    m = re.search(r"verl==([\w.]+)", _commands()[0])
    assert m, "the README's first command installs no pinned verl"
    try:
        installed = importlib.metadata.version("verl")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("verl is not installed: run the README's first command")
    assert installed == m.group(1)

"""Experiment scripts import their shared helpers as ``from _lib import ...`` (running
``python experiments/<study>.py`` puts ``experiments/`` on ``sys.path``); the tests here do the
same, and load a script by path with the ``load_script`` fixture."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
if str(EXPERIMENTS) not in sys.path:
    sys.path.insert(0, str(EXPERIMENTS))


def _load_script(name: str):
    """Import ``experiments/<name>.py`` as module ``_exp_<name>`` (not its plain name, so that a
    script never shadows another module)."""
    spec = importlib.util.spec_from_file_location(f"_exp_{name}", EXPERIMENTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def load_script():
    """``load_script(name)`` imports ``experiments/<name>.py``."""
    return _load_script

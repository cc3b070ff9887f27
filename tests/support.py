"""Paths and the optional BPP benchmark set, shared by test modules (``from support import ...``;
``tests/`` is on ``sys.path`` as the root conftest's folder). Kept out of ``conftest.py``: with a
second ``conftest.py`` in a subfolder, ``from conftest import`` would find whichever was loaded last."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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

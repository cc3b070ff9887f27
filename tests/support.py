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


# Imported once by the fork server that spawn_ranks' ranks fork from (a module that is not
# installed is skipped by multiprocessing). A rank started by mp.spawn is a fresh interpreter that
# imports torch and the trainer again: about 7 s of CPU for torch + megatron-core on these cores.
RANK_PRELOAD = ("torch", "numpy", "tensordict", "megatron.core.transformer.moe.moe_utils",
                "megatron.core.parallel_state", "verl.utils.seqlen_balancing",
                "routepack_opt.integrations.megatron", "routepack_opt.integrations.verl")


def spawn_ranks(fn, args: tuple, nprocs: int) -> None:
    """``torch.multiprocessing.spawn``'s contract — ``fn(rank, *args)`` in ``nprocs`` processes,
    joined, a failing rank raises here — with ranks forked from a fork server that imported
    ``RANK_PRELOAD`` and ``fn``'s module once (a fresh, single-threaded process, as safe as spawn).
    The first start in a session fixes the server's list; later calls reuse the server."""
    import torch.multiprocessing as mp

    mp.set_forkserver_preload([*RANK_PRELOAD, fn.__module__])
    mp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="forkserver")

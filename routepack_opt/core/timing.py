"""Stage timings: ``with timings.stage("anneal"): ...`` instead of pairs of ``perf_counter`` calls."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

__all__ = ["Timings"]


class Timings:
    """Wall-clock seconds per named stage, in the order the stages ended (``seconds``)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the block as stage ``name`` (recorded also when the block raises)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = time.perf_counter() - t0

    def record(self, name: str, seconds: float) -> None:
        self.seconds[name] = float(seconds)

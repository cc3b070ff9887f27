"""Report writers: markdown tables, atomic text and JSON files, matplotlib figures (Agg).

A table is built from a header and rows of values; numbers are formatted per column, so a
script states its columns once instead of hand-writing ``| ... |`` lines::

    table(["preset", "gain", "s"], [("olmoe", 0.0123, 1.5)], formats={"gain": pct, "s": ".2f"})
    # ['| preset | gain | s |', '|---|---|---|', '| olmoe | +1.23% | 1.50 |']

A script that prints each row as it is measured keeps a ``Table`` and prints what ``add`` returns.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

Format = str | Callable[[object], str]
MISSING = "—"
_RULE = {"l": "---", "r": "---:", "c": ":---:", "-": "---"}


def pct(x: float) -> str:
    """A relative change as a signed percentage with two decimals: 0.0123 → ``+1.23%``."""
    return f"{100 * x:+.2f}%"


def num(spec: str, scale: float = 1, suffix: str = "", per: float = 1) -> Callable[[object], str]:
    """A column format: the value times ``scale`` divided by ``per`` through ``spec``, then
    ``suffix``; ``num(".2f", per=1e6, suffix=" M")`` writes 2840000 as ``2.84 M``,
    ``num("+.1f", 100, " %")`` writes 0.125 as ``+12.5 %``. (Dividing by ``per`` rather than
    multiplying by its inverse keeps the digits of a hand-written ``x / 1e6``.)"""
    return lambda x: format(x * scale / per, spec) + suffix


def cell(value, fmt: Format | None = None) -> str:
    """One table cell: strings as they are, None as ``—``, other values through ``fmt`` (a
    format spec such as ``".2f"`` or ``",.0f"``, or a callable), else ``str``."""
    if value is None:
        return MISSING
    if isinstance(value, str):
        return value
    if fmt is None:
        return str(value)
    return fmt(value) if callable(fmt) else format(value, fmt)


def table(columns: Sequence[str], rows: Iterable[Sequence], formats: Mapping[str | int, Format] | None = None,
          align: str | None = None) -> list[str]:
    """A markdown table as lines: header, rule, one line per row. ``formats`` maps a column
    (its header or its index) to a format for that column's non-string values; ``align`` is one
    letter per column (``l``, ``r``, ``c``; ``-`` = unspecified, the default)."""
    n = len(columns)
    fmts: list[Format | None] = [None] * n
    for key, f in (formats or {}).items():
        if not isinstance(key, int) and key not in columns:
            raise ValueError(f"a format for {key!r}, which is not a column: {list(columns)}")
        fmts[key if isinstance(key, int) else list(columns).index(key)] = f
    if align is not None and len(align) != n:
        raise ValueError(f"align has {len(align)} letters for {n} columns")
    rule = [_RULE[a] for a in (align or "-" * n)]
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join(rule) + "|"]
    for i, row in enumerate(rows):
        row = list(row)
        if len(row) != n:
            raise ValueError(f"row {i} has {len(row)} cells for {n} columns: {row!r}")
        lines.append("| " + " | ".join(cell(v, f) for v, f in zip(row, fmts)) + " |")
    return lines


class Table:
    """A table filled row by row: ``add`` stores a row and returns its markdown line (to print
    progress as rows are measured); ``lines`` is the whole table (``table``'s arguments)."""

    def __init__(self, columns: Sequence[str], formats: Mapping[str | int, Format] | None = None,
                 align: str | None = None):
        self.columns, self.formats, self.align = list(columns), dict(formats or {}), align
        self.rows: list[list] = []
        table(self.columns, [], self.formats, align)  # a bad column name or align string fails here

    def add(self, *row) -> str:
        line = table(self.columns, [row], self.formats, self.align)[-1]
        self.rows.append(list(row))
        return line

    def lines(self) -> list[str]:
        return table(self.columns, self.rows, self.formats, self.align)


def write_text(path: Path | str, text: str) -> Path:
    """Write ``text`` atomically (a temporary file in the same folder, then ``os.replace``), so a
    reader or a stopped run never sees half a file. Creates the folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_md(path: Path | str, lines: Iterable[str]) -> Path:
    """Markdown from lines (one newline after each, a final newline), atomically."""
    return write_text(path, "\n".join(lines) + "\n")


def write_json(path: Path | str, obj, indent: int | None = 1) -> Path:
    """JSON atomically; numpy scalars and other floats-like values are written as floats."""
    return write_text(path, json.dumps(obj, indent=indent, default=float) + "\n")


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (no display; imported only when plotting)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_fig(fig, path: Path | str, dpi: int = 120) -> Path:
    """Save ``fig`` to ``path`` (folder created) and close it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path

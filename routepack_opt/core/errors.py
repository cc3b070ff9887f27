"""Error types.

``InputError`` is bad input a user can fix (a malformed window, topology, cost file or plan): the
CLI prints its message as one ``error:`` line and exits 2. Anything else escaping a command is an
internal failure (exit 1).
"""

import json
import tomllib
from pathlib import Path


class RoutePackError(Exception):
    """Base class of RoutePack's own errors."""


class InputError(RoutePackError, ValueError):
    """Bad input: the message says what is wrong and how to fix it."""


class InfeasibleError(RoutePackError):
    """No feasible layout exists for the given window, topology and rows."""


class BinPackUndecided(RoutePackError):
    """Neither a packing into the requested bins nor a proof of impossibility within the limit."""


def _no_constant(name: str):
    """JSON files are strict JSON: ``NaN``, ``Infinity`` and ``-Infinity`` are not numbers there."""
    raise json.JSONDecodeError(f"{name} is not a JSON number (plan files are strict JSON)", name, 0)


def load_document(path, what: str, fmt: str, build):
    """``build(data)`` of the TOML (``fmt="toml"``) or JSON (``"json"``) file at ``path``. A
    missing, unreadable or malformed file, or data ``build`` rejects, is one InputError that
    names the file (``what``: the kind of file, for the message)."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such {what} file")
    try:
        text = path.read_text()
        data = tomllib.loads(text) if fmt == "toml" else json.loads(text, parse_constant=_no_constant)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not valid {fmt.upper()} ({exc})") from None
    except RecursionError:
        raise InputError(f"{path}: nested too deeply to be a {what} file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read the {what} file ({exc.strerror})") from None
    try:
        return build(data)
    except InputError as exc:
        raise InputError(f"{path}: {exc}") from None
    except RecursionError:
        raise InputError(f"{path}: nested too deeply to be a {what} file") from None

"""Error types.

``InputError`` is bad input a user can fix (a malformed window, topology, cost file or plan): the
CLI prints its message as one ``error:`` line and exits 2. Anything else escaping a command is an
internal failure (exit 1).
"""


class RoutePackError(Exception):
    """Base class of RoutePack's own errors."""


class InputError(RoutePackError, ValueError):
    """Bad input: the message says what is wrong and how to fix it. It is one line (the CLI's
    one ``error:`` line): a line break in it, e.g. from the repr of an array the user gave, is
    folded into a space."""

    def __init__(self, *args):
        if len(args) == 1 and isinstance(args[0], str) and ("\n" in args[0] or "\r" in args[0]):
            args = (" ".join(args[0].split()),)
        super().__init__(*args)


class InfeasibleError(RoutePackError):
    """No feasible layout exists for the given window, topology and rows."""


class BinPackUndecided(RoutePackError):
    """Neither a packing into the requested bins nor a proof of impossibility within the limit."""


def load_document(path, what: str, fmt: str, build):
    """``build(data)`` of the TOML (``fmt="toml"``) or JSON (``"json"``) file at ``path``, read
    through the input boundary (:func:`routepack_opt.core.inputs.load_document`): a special file,
    a missing, unreadable or malformed file, or data ``build`` rejects, is one InputError that
    names the file (``what``: the kind of file, for the message)."""
    from routepack_opt.core.inputs import load_document as load

    return load(path, what, fmt, build)

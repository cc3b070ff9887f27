"""Error types.

``InputError`` is bad input a user can fix (a malformed window, topology, cost file or plan): the
CLI prints its message as one ``error:`` line and exits 2. Anything else escaping a command is an
internal failure (exit 1).
"""


class RoutePackError(Exception):
    """Base class of RoutePack's own errors."""


class InputError(RoutePackError, ValueError):
    """Bad input: the message says what is wrong and how to fix it."""


class InfeasibleError(RoutePackError):
    """No feasible layout exists for the given window, topology and rows."""

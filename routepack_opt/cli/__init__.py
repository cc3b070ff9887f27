"""``routepack`` command line (docs/cli.md).

Each command lives in its own module under ``routepack_opt/cli/`` and exposes
``register(subparsers)``, which adds its parser and sets ``func`` (called with the parsed
arguments, returning a dict for ``--json`` or None). Conventions: exit 0 on success, 2 on bad
input with one ``error: ...`` line on stderr (never a traceback), 1 on an internal failure.
Set ``ROUTEPACK_DEBUG=1`` to see tracebacks of internal failures.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import warnings

from routepack_opt.core.errors import InputError

__all__ = ["main", "COMMANDS"]

# Order = order in --help. A module listed here that does not exist yet is skipped.
COMMANDS = ["demo", "gen_trace", "stats", "import_replay", "certify", "plan", "evaluate", "exact", "compare",
            "calibrate", "measure", "verify_runtime", "warmup", "replay_report"]


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse prints usage + exits 2; we want one error: line
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="routepack", description="Plan MoE RL optimizer steps: expert placement "
                     "+ attention-aware packing from routing replay.")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show Python warnings (numpy, torch, ...) on standard error; hidden otherwise")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        try:
            mod = importlib.import_module(f"routepack_opt.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"routepack_opt.cli.{name}":
                continue
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    old_term = _on_sigterm_interrupt()
    verbose = bool(os.environ.get("ROUTEPACK_DEBUG")) or bool(argv) and argv[0] in ("-v", "--verbose")
    try:
        with warnings.catch_warnings():
            if not verbose:  # a warning is no error: stderr holds the one error: line, or nothing
                warnings.simplefilter("ignore")
            return _main(argv)
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _on_sigterm_interrupt():
    """SIGTERM is handled like SIGINT (a clean ``error: interrupted``, temporary files removed);
    returns the previous handler (None off the main thread, where signals cannot be set)."""
    try:
        return signal.signal(signal.SIGTERM, _interrupt)
    except ValueError:
        return None


def _quiet_stdout() -> None:
    """Point standard output at /dev/null: what is left in its buffer cannot fail again at exit."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, ValueError, AttributeError):
        pass
    try:
        sys.stdout = open(os.devnull, "w")
    except OSError:
        pass


def _main(argv: list[str]) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            raise UsageError("missing command; run 'routepack --help'")
        args.func(args)
        return 0
    except (InputError, UsageError) as exc:
        if "standard output" in str(exc):
            _quiet_stdout()
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and the like: not a failure
        _quiet_stdout()
        return 0
    except MemoryError as exc:  # the up-front checks missed it: still one line, no traceback
        print(f"error: out of memory ({_one_line(exc) or 'MemoryError'}): give the process more "
              "memory or plan a smaller window", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    except Exception as exc:  # internal failure
        if os.environ.get("ROUTEPACK_DEBUG"):
            raise
        print(f"error: internal failure: {exc.__class__.__name__}: {_one_line(exc)} "
              "(set ROUTEPACK_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


if __name__ == "__main__":
    sys.exit(main())

"""Shared argument helpers for the commands."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from routepack_opt.core.cost import PRESETS, CostModel, resolve_cost
from routepack_opt.core.errors import InputError
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import Window, load_window

# --- argparse types: bad values are refused while parsing (one error: line, exit 2) ---------------

_INT_MAX = 2**62  # counts, capacities, seeds: far beyond any real value, far inside int64


def _int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if abs(value) > _INT_MAX:
        raise argparse.ArgumentTypeError(f"{text} is out of range (at most 2^62)")
    return value


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def _checked(parse, ok, rule: str, doc: str):
    """An argparse type: ``parse`` the text, then require ``ok(value)`` ("must be <rule>")."""

    def check(text: str):
        value = parse(text)
        if not ok(value):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text}")
        return value

    check.__doc__ = doc
    return check


positive_int = _checked(_int, lambda v: v >= 1, "≥ 1", "An integer ≥ 1.")
nonneg_int = _checked(_int, lambda v: v >= 0, "≥ 0", "An integer ≥ 0 (seeds, steps, staleness).")
positive_float = _checked(_finite, lambda v: v > 0, "> 0", "A finite number > 0 (time limits, timeouts).")
nonneg_float = _checked(_finite, lambda v: v >= 0, "≥ 0", "A finite number ≥ 0.")
scale_float = _checked(_finite, lambda v: v >= 1, "≥ 1", "A finite number ≥ 1 (a divisor that shrinks a window).")


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable result on stdout")


def add_window(p: argparse.ArgumentParser) -> None:
    p.add_argument("window", metavar="W.npz", help="routing-replay window (.npz, docs/formats.md)")


def add_topology(p: argparse.ArgumentParser, preset_flag: bool = True) -> None:
    g = p.add_argument_group("topology")
    g.add_argument("--dp", type=positive_int, help="DP slots D")
    g.add_argument("--ep", type=positive_int, help="EP size P (E %% P == 0, D %% P == 0)")
    g.add_argument("--capacity", type=positive_int, help="token cap C of one micro-batch")
    g.add_argument("--min-rows", type=positive_int, default=1, help="least micro-batches per slot")
    g.add_argument("--row-multiple", type=positive_int, default=1, help="rows must be a multiple of this (PP×VPP)")
    g.add_argument("--equal-samples-per-slot", action="store_true",
                   help="every DP slot holds exactly N/D samples (verl's DP balance; N %% D == 0)")
    add_replica_args(g)
    if preset_flag:
        g.add_argument("--preset", choices=sorted(PRESETS), help="defaults for --dp/--ep/--capacity")


def add_replica_args(g) -> None:
    g.add_argument("--redundant-experts", type=nonneg_int, default=0, metavar="N",
                   help="extra physical expert slots per layer (E + N divisible by --ep): hot experts "
                        "get replicas (docs/model.md); default 0")
    g.add_argument("--max-replica-bytes", type=nonneg_float, metavar="BYTES",
                   help="most expert state (weights, gradients, optimizer) the replicas may add to one "
                        "EP rank; the cost model's expert_bytes per extra slot")


def add_cost(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--cost", required=required, metavar="NAME_OR_TOML",
                   help=f"cost preset ({', '.join(PRESETS)}) or a TOML cost file")


def add_objective(p: argparse.ArgumentParser) -> None:
    p.add_argument("--objective", choices=["max-sum", "sum-max"], default="max-sum",
                   help="execution semantics (default max-sum)")


def topology_from_args(args) -> Topology:
    """--dp/--ep/--capacity, defaulting from --preset or a --cost preset name."""
    cost = getattr(args, "cost", None)
    preset_name = getattr(args, "preset", None) or (cost if cost in PRESETS else None)
    cfg = PRESETS[preset_name].config if preset_name else None
    vals = {}
    for key in ("dp", "ep", "capacity"):
        v = getattr(args, key, None)
        if v is None and cfg is not None:
            v = getattr(cfg, key)
        if v is None:
            raise InputError(f"--{key} is required (or name a preset with --preset)")
        vals[key] = v
    return Topology(dp=vals["dp"], ep=vals["ep"], capacity=vals["capacity"],
                    min_rows=getattr(args, "min_rows", 1), row_multiple=getattr(args, "row_multiple", 1),
                    equal_samples_per_slot=bool(getattr(args, "equal_samples_per_slot", False)),
                    redundant_experts=getattr(args, "redundant_experts", 0) or 0)


def window_from_args(args) -> Window:
    return load_window(args.window)


def cost_from_args(args) -> CostModel:
    return resolve_cost(args.cost)


def output_path(path: str | None, *inputs) -> Path | None:
    """The output path, checked before any work: not an input, not a directory, writable."""
    from routepack_opt.core.io import check_output_path

    return check_output_path(path, *inputs)


def emit(args, result: dict | None, text: str | None = None) -> None:
    """Print ``result`` as JSON with ``--json``, else ``text`` (if any), on standard output — on
    standard error when the command's output file is standard output (``-o -``), so the two never
    mix. A failed write (a full disk behind ``> /dev/full``) is an InputError."""
    from routepack_opt.core.io import is_stdout

    stream = sys.stderr if is_stdout(getattr(args, "output", None)) else sys.stdout
    if getattr(args, "json", False):
        from routepack_opt.core.plan import dumps_strict
        body = dumps_strict(result or {}, indent=1)
    elif text:
        body = text
    else:
        return
    try:
        print(body, file=stream)
        stream.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        name = "standard error" if stream is sys.stderr else "standard output"
        raise InputError(f"cannot write the result to {name} ({exc.strerror or exc})") from None

"""Shared argument helpers for the commands."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from routepack_opt.cost import CostModel, PRESETS, resolve_cost
from routepack_opt.errors import InputError
from routepack_opt.topology import Topology
from routepack_opt.window import Window, load_window


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable result on stdout")


def add_window(p: argparse.ArgumentParser) -> None:
    p.add_argument("window", metavar="W.npz", help="routing-replay window (.npz, docs/formats.md)")


def add_topology(p: argparse.ArgumentParser, preset_flag: bool = True) -> None:
    g = p.add_argument_group("topology")
    g.add_argument("--dp", type=int, help="DP slots D")
    g.add_argument("--ep", type=int, help="EP size P (E %% P == 0, D %% P == 0)")
    g.add_argument("--capacity", type=int, help="token cap C of one micro-batch")
    g.add_argument("--min-rows", type=int, default=1, help="least micro-batches per slot")
    g.add_argument("--row-multiple", type=int, default=1, help="rows must be a multiple of this (PP×VPP)")
    g.add_argument("--equal-samples-per-slot", action="store_true",
                   help="every DP slot holds exactly N/D samples (verl's DP balance; N %% D == 0)")
    if preset_flag:
        g.add_argument("--preset", choices=sorted(PRESETS), help="defaults for --dp/--ep/--capacity")


def add_cost(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--cost", required=required, metavar="NAME_OR_TOML",
                   help=f"cost preset ({', '.join(PRESETS)}) or a TOML cost file")


def add_objective(p: argparse.ArgumentParser) -> None:
    p.add_argument("--objective", choices=["max-sum", "sum-max"], default="max-sum",
                   help="execution semantics (default max-sum)")


def topology_from_args(args) -> Topology:
    """--dp/--ep/--capacity, defaulting from --preset or a --cost preset name."""
    preset_name = getattr(args, "preset", None) or (getattr(args, "cost", None) if getattr(args, "cost", None) in PRESETS else None)
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
                    equal_samples_per_slot=bool(getattr(args, "equal_samples_per_slot", False)))


def window_from_args(args) -> Window:
    return load_window(args.window)


def cost_from_args(args) -> CostModel:
    return resolve_cost(args.cost)


def output_path(path: str | None) -> Path | None:
    if path is None:
        return None
    p = Path(path)
    if p.parent and not p.parent.exists():
        raise InputError(f"{path}: directory {p.parent} does not exist")
    return p


def emit(args, result: dict | None, text: str | None = None) -> None:
    """Print ``result`` as JSON with ``--json``, else ``text`` (if any)."""
    if getattr(args, "json", False):
        from routepack_opt.plan import _jsonable
        print(json.dumps(_jsonable(result or {}), indent=1))
    elif text:
        print(text)

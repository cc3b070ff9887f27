"""The house's shape, measured by an AST scan of ``routepack_opt/`` (issue 40's "must show").

    python experiments/code_metrics.py [--root PATH] [--json OUT] [--list]

Counts, over the package's modules:

- **upward arrows**: imports of ``routepack_opt.integrations`` or ``routepack_opt.cli`` from a
  module outside them (the seams and the command line sit on top; nothing below may reach up),
  plus imports of a higher layer named in ``pyproject.toml``'s import-linter contract
  (``lint-imports`` checks the same contract; this scan needs no install);
- **objective branch sites**: a comparison whose one side names an objective (an identifier with
  ``objective`` or ``obj`` in it, or ``objective_code``/``OBJECTIVE_CODE``/``.code`` of one) and
  whose other side is an objective value (``"max-sum"``/``"sum-max"``, ``Objective.MAX_SUM``/
  ``SUM_MAX``, or the integer code 0/1), plus dict literals keyed by both objective strings —
  the places a third objective would have to be added by hand;
- **Placement type branches**: ``isinstance(…, Placement)`` and every use of ``is_permutation``;
- **long functions**: over 80 and over 150 lines (``def`` to last line, docstring included);
- **wide signatures**: over 12 parameters (``self``/``cls`` not counted; ``*args``/``**kw`` count).

``--list`` prints every site, so a count can be checked by eye.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OBJ_STRINGS = {"max-sum", "sum-max"}
OBJ_ATTRS = {"MAX_SUM", "SUM_MAX"}
OBJ_NAME = re.compile(r"(^|_)(obj|objective)(_|$)|objective|^code$|objective_code", re.IGNORECASE)


def _names(node: ast.AST) -> list[str]:
    """Identifiers an expression reads (names and attribute names)."""
    out = []
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.append(n.id)
        elif isinstance(n, ast.Attribute):
            out.append(n.attr)
    return out


def _is_objective_value(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in OBJ_STRINGS:
        return True
    if isinstance(node, ast.Attribute) and node.attr in OBJ_ATTRS:
        return True
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_is_objective_value(e) for e in node.elts)
    return False


def _names_objective(node: ast.AST) -> bool:
    return any(OBJ_NAME.search(n) for n in _names(node))


def _is_objective_branch(node: ast.Compare) -> bool:
    sides = [node.left, *node.comparators]
    for i, side in enumerate(sides):
        others = sides[:i] + sides[i + 1:]
        if _is_objective_value(side) and any(_names_objective(o) for o in others):
            return True
        if (isinstance(side, ast.Constant) and side.value in (0, 1) and not isinstance(side.value, bool)
                and any(_names_objective(o) for o in others)):
            return True
    return False


class _Scan(ast.NodeVisitor):
    def __init__(self, rel: str):
        self.rel = rel
        self.objective: list[str] = []
        self.placement: list[str] = []
        self.functions: list[tuple[str, int, int]] = []  # (where, lines, params)
        self.imports: list[tuple[str, int]] = []
        self._stack: list[str] = []

    def _where(self, node) -> str:
        return f"{self.rel}:{node.lineno}"

    def visit_Compare(self, node):
        if _is_objective_branch(node):
            self.objective.append(self._where(node))
        self.generic_visit(node)

    def visit_Dict(self, node):
        keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
        if OBJ_STRINGS <= keys:
            self.objective.append(self._where(node))
        self.generic_visit(node)

    def visit_Call(self, node):
        f = node.func
        if isinstance(f, ast.Name) and f.id == "isinstance" and len(node.args) == 2:
            if "Placement" in _names(node.args[1]):
                self.placement.append(self._where(node))
        self.generic_visit(node)

    def visit_Attribute(self, node):
        if node.attr == "is_permutation":
            self.placement.append(self._where(node))
        self.generic_visit(node)

    def _function(self, node):
        a = node.args
        params = [*a.posonlyargs, *a.args, *a.kwonlyargs]
        n = len(params) + (a.vararg is not None) + (a.kwarg is not None)
        if params and params[0].arg in ("self", "cls"):
            n -= 1
        name = ".".join([*self._stack, node.name])
        self.functions.append((f"{self.rel}:{node.lineno} {name}", node.end_lineno - node.lineno + 1, n))
        self._stack.append(node.name)
        self.generic_visit(node)
        self._stack.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_ClassDef(self, node):
        self._stack.append(node.name)
        self.generic_visit(node)
        self._stack.pop()

    def visit_Import(self, node):
        for alias in node.names:
            self.imports.append((alias.name, node.lineno))

    def visit_ImportFrom(self, node):
        if node.level == 0 and node.module:
            self.imports.append((node.module, node.lineno))
            for alias in node.names:
                self.imports.append((f"{node.module}.{alias.name}", node.lineno))


def _layers(root: Path) -> list[list[str]]:
    """The import-linter layer contract of ``pyproject.toml``: top first, each a list of names."""
    try:
        import tomllib
        cfg = tomllib.loads((root / "pyproject.toml").read_text())
    except (OSError, ValueError):
        return []
    for c in cfg.get("tool", {}).get("importlinter", {}).get("contracts", []):
        if c.get("type") == "layers":
            return [[s.strip() for s in re.split(r"[:|]", layer)] for layer in c["layers"]]
    return []


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "routepack_opt" else ""


def scan(root: Path) -> dict:
    pkg = root / "routepack_opt"
    scans = []
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        s = _Scan(rel)
        s.visit(ast.parse(path.read_text(), filename=rel))
        scans.append(s)
    layer_of = {name: i for i, layer in enumerate(_layers(root)) for name in layer}
    upward = []
    for s in scans:
        mod_top = s.rel.split("/")[1].removesuffix(".py")
        for name, line in s.imports:
            top = _top(name)
            if not top or top == mod_top:
                continue
            if top in ("integrations", "cli") and mod_top not in ("integrations", "cli", "__main__"):
                upward.append(f"{s.rel}:{line} -> {name}")
            elif top in layer_of and mod_top in layer_of and layer_of[top] < layer_of[mod_top]:
                upward.append(f"{s.rel}:{line} -> {name}")
    upward = sorted(set(upward))
    objective = [w for s in scans for w in s.objective]
    outside = [w for w in objective if not w.startswith("routepack_opt/models/")]
    functions = [f for s in scans for f in s.functions]
    return {
        "upward_arrows": upward,
        "objective_sites": objective,
        "objective_sites_outside_models": outside,
        "objective_files_outside_models": sorted({w.split(":")[0] for w in outside}),
        "placement_branches": [w for s in scans for w in s.placement],
        "functions_over_80": sorted([f"{w} ({n} lines)" for w, n, _ in functions if n > 80]),
        "functions_over_150": sorted([f"{w} ({n} lines)" for w, n, _ in functions if n > 150]),
        "functions_over_12_params": sorted([f"{w} ({p} params)" for w, _, p in functions if p > 12]),
        "modules_over_600_lines": sorted(f"{s.rel} ({len((root / s.rel).read_text().splitlines())})"
                                         for s in scans if len((root / s.rel).read_text().splitlines()) > 600),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=ROOT, help="a checkout of the project (default: this one)")
    ap.add_argument("--json", type=Path, help="write the full scan here")
    ap.add_argument("--list", action="store_true", help="print every site, not only the counts")
    args = ap.parse_args(argv)
    if not (args.root / "routepack_opt").is_dir():
        print(f"error: {args.root} holds no routepack_opt/ package", file=sys.stderr)
        return 2
    result = scan(args.root)
    for key, items in result.items():
        print(f"{key}: {len(items)}")
        if args.list:
            for item in items:
                print(f"    {item}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

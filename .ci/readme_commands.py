"""Print the README's two newcomer commands, one per line: the first two command lines of the
first ```bash block, trailing ``# comments`` stripped. ``.ci/run`` runs exactly these, and
``tests/test_readme.py`` checks they are what CI and the docs say."""

from __future__ import annotations

import sys


def readme_commands(text: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index("```bash") + 1
    cmds = []
    for line in lines[start:]:
        if line.startswith("```"):
            break
        cmd = line.split(" #", 1)[0].strip()
        if cmd:
            cmds.append(cmd)
    if len(cmds) != 2:
        raise SystemExit(f"README: expected 2 commands in the first bash block, found {len(cmds)}")
    return cmds


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        print("\n".join(readme_commands(f.read())))

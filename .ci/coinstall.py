"""Co-install check: RoutePack (this checkout, with its [torch] and [integrations] extras) resolves
together with each trainer stack's own pins, as an install into an empty Python 3.11 venv would.

Each stack is a dry run (``uv pip install --dry-run``: resolves and prints what it would install,
installs nothing; PyPI's metadata only, no multi-GB torch/vLLM wheels downloaded, which pip's own
``--dry-run`` does). One stack that cannot be resolved (pip's ``ResolutionImpossible``, uv's "No
solution found") fails the check with uv's explanation; every stack's result and the versions it
settles on are printed. Needs the network to PyPI (CI has it). Run by ``.ci/run``;
``python3 .ci/coinstall.py`` by hand (uv from the README's first command).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROUTEPACK = f"routepack-opt[torch,integrations] @ {REPO.as_uri()}"

# name → the stack's own requirements (uv pip install arguments)
STACKS = {
    # verl's [vllm] extra pins torch==2.11.0, vllm==0.24.0, transformers==5.9.0 (and tensordict<=0.10)
    "verl 0.9.1 [vllm]": ["verl[vllm]==0.9.1"],
    "megatron-core 0.16.1": ["megatron-core==0.16.1"],
    # the slime commit tests/integrations/third_party/slime/ is copied from
    "slime @ 624b824 (requirements.txt)": ["-r", str(REPO / "constraints" / "stacks" / "slime-624b824.txt")],
    # numpy 2.2 with the torch of verl 0.9.1's stacks (the pair the old exact pins could not join)
    "numpy 2.2 stack": ["numpy==2.2.6", "torch==2.11.0"],
}
SHOWN = ("routepack-opt", "torch", "numpy", "numba", "ortools", "pyomo", "highspy", "vllm", "verl",
         "megatron-core", "transformers", "tensordict", "ray")


def dry_run(python: str, reqs: list[str]) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "uv", "pip", "install", "--dry-run", "--python", python, ROUTEPACK, *reqs]
    env = {**os.environ, "NO_COLOR": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200)


def main() -> int:
    failed = []
    with tempfile.TemporaryDirectory(prefix="routepack-coinstall-") as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        python = str(venv / "bin" / "python")
        for name, reqs in STACKS.items():
            start = time.monotonic()
            r = dry_run(python, reqs)
            secs = time.monotonic() - start
            out = r.stdout + r.stderr
            if r.returncode != 0:
                kind = "ResolutionImpossible" if "No solution found" in out else f"uv exited {r.returncode}"
                print(f"co-install {name}: FAILED ({kind}, {secs:.0f} s)\n{out.strip()}\n", flush=True)
                failed.append(name)
                continue
            got = dict(re.findall(r"^ \+ ([\w.-]+)==(\S+)", out, flags=re.M))
            count = len(got)
            got["routepack-opt"] = "this checkout" if re.search(r"^ \+ routepack-opt\b", out, flags=re.M) else "?"
            shown = ", ".join(f"{k} {got[k]}" for k in SHOWN if k in got)
            print(f"co-install {name}: resolved, {count} packages ({secs:.0f} s): {shown}", flush=True)
    if failed:
        print(f"co-install check failed for: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

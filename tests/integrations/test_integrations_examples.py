"""The integration examples run end to end, and ours vs slime's real function where a slime checkout is given."""

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
EX = ROOT / "experiments" / "integrations"


def _run(name):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, str(EX / f"{name}_example.py")], capture_output=True, text=True,
                          env=env, timeout=600)


def test_slime_example_runs():
    """experiments/integrations/slime_example.py runs and prints a schedule."""
    p = _run("slime")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "micro-batches per rank per step" in p.stdout


def test_verl_example_runs():
    """experiments/integrations/verl_example.py runs against the real verl and round-trips."""
    pytest.importorskip("verl.utils.seqlen_balancing", reason="verl is not installed (the README's first command installs it)")
    p = _run("verl")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "restore_dynamic_batch round trip: ok" in p.stdout


def test_megatron_example_runs():
    """experiments/integrations/megatron_example.py runs and outputs are identical with the placement."""
    pytest.importorskip("megatron.core.transformer.moe.moe_utils", reason="megatron-core is not installed")
    p = _run("megatron")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "outputs identical with and without the placement: True" in p.stdout


SLIME_SRC = os.environ.get("ROUTEPACK_SLIME_SRC")


@pytest.mark.skipif(not SLIME_SRC, reason="slime is not on PyPI; set ROUTEPACK_SLIME_SRC to a THUDM/slime checkout")
def test_against_real_slime_build_dp_schedule():
    """On the same inputs as slime's real build_dp_schedule: same steps and kept samples, no more micro-batches, lower length-only cost."""
    sys.path.insert(0, SLIME_SRC)
    from slime.utils.dp_schedule import build_dp_schedule as slime_fn

    from routepack_opt.core.cost import get_preset
    from routepack_opt.core.evaluate import Evaluator
    from routepack_opt.core.plan import assignment_from_cells
    from routepack_opt.core.topology import Topology
    from routepack_opt.integrations._common import length_only_window
    from routepack_opt.integrations.slime import build_dp_schedule

    rng = np.random.default_rng(5)
    tl = [int(x) for x in np.clip(rng.lognormal(7.0, 0.9, 130), 16, 9000)]
    ri = [i // 2 for i in range(130)]  # 65 rollouts of 2 samples; gbs 16 → 4 steps, 1 rollout dropped
    args = SimpleNamespace(micro_batch_size=1, use_dynamic_batch_size=True, max_tokens_per_gpu=8192,
                           balance_data=False, balance_by_flops=False)
    tp = {"dp_size": 4, "cp_size": 1, "vpp_size": 1, "microbatch_group_size_per_vp_stage": 1}
    theirs = slime_fn(args, tp, tl, global_batch_size=16, rollout_indices=ri)
    ours = build_dp_schedule(args, tp, tl, global_batch_size=16, rollout_indices=ri, max_sweeps=20)
    assert ours[3] == theirs[3]
    assert sorted(i for p in ours[0] for i in p) == sorted(i for p in theirs[0] for i in p)
    assert sum(ours[2]) <= sum(theirs[2])
    cost = get_preset("qwen3-30b-a3b").cost

    def total(out):
        partitions, mbi, nmb, _ = out
        t, cur = 0.0, 0
        for R in nmb:
            cells = [[[partitions[d][i] for i in mbi[d][cur + r]] for d in range(4)] for r in range(R)]
            idx = sorted(i for row in cells for c in row for i in c)
            pos = {g: j for j, g in enumerate(idx)}
            w = length_only_window([tl[i] for i in idx])
            row, slot = assignment_from_cells([[[pos[i] for i in c] for c in rr] for rr in cells], len(idx))
            t += Evaluator(w, Topology(dp=4, ep=1, capacity=8192), cost).score(
                np.zeros((1, 1), dtype=np.int64), row, slot, R, "max-sum").makespan
            cur += R
        return t

    assert total(ours) <= total(theirs)

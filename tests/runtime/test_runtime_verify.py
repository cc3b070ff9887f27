"""Re-placing experts mid-run changes no loss and no parameter (docs/pipeline.md, step 5), in one process
and across 4 gloo processes (D=4, P=2) with real EP all-to-all dispatch."""

from __future__ import annotations

import dataclasses
import json

import pytest

from routepack_opt.runtime.verify import VerifyConfig, verify_runtime


def test_replacement_is_bitwise_invisible_single_process():
    """One process: losses, dense and logical expert tensors (weights, grads, Adam moments) of the
    re-placed run equal the reference bit for bit, and experts really moved."""
    rep = verify_runtime(dataclasses.replace(VerifyConfig(), steps=2), world_size=1, ep=1)
    sp = rep["single_process"]
    assert rep["ok"] and sp["bitwise_equal"] and sp["max_abs_diff"] == 0.0
    assert sp["experts_moved"] > 0 and sp["bytes_moved"] > 0


def test_replacement_is_bitwise_invisible_with_4_gloo_processes():
    """D=4 gloo processes, EP P=2 (2 shards): re-placed run equals the reference bit for bit,
    cross-rank moves happened, shard replicas agree, and the EP run matches the single-process
    run up to summation order."""
    rep = verify_runtime(dataclasses.replace(VerifyConfig(), steps=2, timeout_s=150), world_size=4, ep=2)
    d = rep["distributed"]
    assert d["bitwise_equal"] and d["max_abs_diff"] == 0.0 and d["replica_max_diff"] == 0.0
    assert d["bytes_sent_cross_rank"] > 0 and d["bytes_moved"] > 0
    assert d["vs_single_process_loss_diff"] < 1e-5
    assert rep["single_process"]["bitwise_equal"]
    assert rep["ok"] and rep["world_size"] == 4


@pytest.mark.parametrize("args", [["--world-size", "3", "--ep", "2"], ["--world-size", "0"],
                                  ["--world-size", "6", "--ep", "3"], ["--steps", "1"],
                                  ["--device", "cuda", "--world-size", "64"]])
def test_verify_runtime_bad_input_exits_2(run_cli, args):
    """World size not divisible by EP, E not divisible by EP, too few steps, CUDA absent or too
    few GPUs → error: + exit 2."""
    code, out, err = run_cli("verify-runtime", *args)
    assert code == 2 and err.startswith("error:") and "Traceback" not in err


def test_verify_runtime_cli_single_process_json(run_cli):
    """`verify-runtime --world-size 1 --json` prints max_abs_diff, bytes_moved, world_size, ok."""
    code, out, err = run_cli("verify-runtime", "--world-size", "1", "--steps", "2", "--json")
    rep = json.loads(out)
    assert code == 0 and rep["ok"] is True and rep["max_abs_diff"] == 0.0
    assert rep["bytes_moved"] > 0 and rep["world_size"] == 1

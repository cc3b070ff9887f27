"""Cold start: the warm-up compiles every signature the planner uses, before any time limit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from types import SimpleNamespace

import numpy as np
import pytest
from support import REPO

from routepack_opt.core.cache import configure_cache
from routepack_opt.core.cost import PRESETS
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import Window, save_window
from routepack_opt.heuristics.anneal import search as anneal_search
from routepack_opt.heuristics.placement.lpt import identity_placement
from routepack_opt.pipeline import solve
from routepack_opt.trace import generate_window
from routepack_opt.warmup import numba_kernels, warm

COST = PRESETS["qwen3-30b-a3b"].cost


def _signatures():
    return {k: set(d.signatures) for k, d in numba_kernels(("plan", "joint", "replicas")).items()}


def _new(before, after):
    return {k: after[k] - before[k] for k in after if after[k] - before[k]}


def test_after_warm_planning_compiles_nothing_new():
    """After warm(), planning realistic windows (both objectives, joint + migration, replicas)
    adds no numba signature: nothing compiles inside a time limit."""
    assert "error" not in warm(("plan", "joint", "replicas"))
    before = _signatures()
    w = generate_window("qwen3-30b-a3b", 160, seed=2, num_layers=3, capacity=8192)
    topo = Topology(dp=8, ep=4, capacity=8192)
    ident = identity_placement(w.num_layers, w.num_experts)
    for objective in ("max-sum", "sum-max"):
        solve(w, topo, COST, objective=objective, placement="lpt", max_sweeps=2, seed=0)
        solve(w, topo, COST, objective=objective, placement="joint", max_sweeps=2, seed=0,
              current_placement=ident)
        solve(w, topo, COST, objective=objective, placement="identity", time_limit=0.2, seed=0)
        solve(w, topo, COST, objective=objective, max_sweeps=2, seed=0, redundant_experts=4)
    new = _new(before, _signatures())
    assert not new, f"compiled after warm(): {new}"


def test_rare_load_storage_compiles_before_the_annealer_clock(monkeypatch):
    """A window whose loads need int32 storage (a sample with ≥ 2^15 tokens on one expert)
    compiles only inside anneal.warm_storage, whose time the annealer takes off its clock."""
    warm()
    marks = {}
    real = anneal_search.warm_storage

    def spy(b_dtype, w_dtype):
        spent = real(b_dtype, w_dtype)
        marks.setdefault("storage", (np.dtype(b_dtype).name, np.dtype(w_dtype).name))
        marks["after"] = _signatures()
        return spent

    monkeypatch.setattr(anneal_search, "warm_storage", spy)
    rng = np.random.default_rng(0)
    lengths = rng.integers(33_000, 40_000, size=8)
    counts = np.zeros((8, 1, 4), dtype=np.int64)
    counts[np.arange(8), 0, rng.integers(0, 4, size=8)] = lengths
    big = Window(lengths, counts, top_k=1)
    solve(big, Topology(dp=2, ep=2, capacity=65_536), COST, objective="max-sum", max_sweeps=2, seed=0)
    assert marks["storage"] == ("int32", "int32")
    new = _new(marks["after"], _signatures())
    assert not new, f"compiled after warm_storage(): {new}"


def test_warm_is_once_per_process_and_thread_safe():
    """Concurrent warm() calls all return one finished warm-up; later calls are free."""
    reports = []
    ts = [threading.Thread(target=lambda: reports.append(warm())) for _ in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(600)
    assert len(reports) == 3 and all("error" not in r for r in reports)
    again = warm()
    assert again["already_warm"] and again["seconds"] == 0.0 and again["kernels"] > 20


def test_warmup_command_json(run_cli):
    """routepack warmup --json reports the kernels, what it compiled or loaded, and the time."""
    code, out, err = run_cli("warmup", "--group", "plan", "--json")
    assert code == 0, err
    rep = json.loads(out)
    assert rep["groups"] == ["plan"] and rep["kernels"] > 20 and rep["signatures"] > 0
    assert {"compiled", "loaded", "seconds", "cache_dir"} <= set(rep)


def test_routepack_cache_dir_sets_numba_cache_dir(monkeypatch):
    """ROUTEPACK_CACHE_DIR becomes NUMBA_CACHE_DIR unless that is set already."""
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setenv("ROUTEPACK_CACHE_DIR", "/tmp/rp-cache")
    assert configure_cache() == "/tmp/rp-cache" and os.environ["NUMBA_CACHE_DIR"] == "/tmp/rp-cache"
    monkeypatch.setenv("NUMBA_CACHE_DIR", "/tmp/numba-own")
    assert configure_cache() == "/tmp/numba-own"


def test_top_level_import_stays_cheap():
    """import routepack_opt imports neither numba, torch nor OR-Tools."""
    code = ("import sys, routepack_opt; bad = [m for m in ('numba', 'torch', 'ortools') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stdout + r.stderr


def _strip_times(x):
    """The plan JSON without wall-clock figures (timings, seconds, rates)."""
    if isinstance(x, dict):
        return {k: _strip_times(v) for k, v in x.items()
                if not any(t in k for t in ("timings", "seconds", "per_second", "per_cpu_second"))}
    if isinstance(x, list):
        return [_strip_times(v) for v in x]
    return x


@pytest.mark.slow
def test_cold_plan_is_bit_identical_to_warm(tmp_path):
    """A plan on a fresh, empty numba cache (ROUTEPACK_CACHE_DIR; routepack plan compiles it in
    parallel worker processes) equals the warm one, minus timings, for a fixed seed and sweep
    budget; the cache the workers wrote then serves every planning kernel, so a warm-up compiles
    nothing and starts no worker."""
    w = generate_window("olmoe-1b-7b", 24, seed=1, num_layers=2, num_experts=8, capacity=4096)
    save_window(w, tmp_path / "w.npz")
    cache = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env.update(PYTHONPATH=str(REPO), ROUTEPACK_CACHE_DIR=str(cache))
    plans = {}
    for run in ("cold", "warm"):
        out = tmp_path / f"{run}.json"
        r = subprocess.run([sys.executable, "-m", "routepack_opt", "plan", str(tmp_path / "w.npz"),
                            "--dp", "4", "--ep", "2", "--capacity", "4096", "--cost", "olmoe-1b-7b",
                            "--max-sweeps", "3", "--seed", "7", "-o", str(out)],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr
        plans[run] = json.loads(out.read_text())
        if run == "cold":
            assert any(cache.rglob("*.nbi")), "the cold run wrote no numba cache into ROUTEPACK_CACHE_DIR"
    assert _strip_times(plans["cold"]) == _strip_times(plans["warm"])
    # the cache the cold run wrote serves every planning kernel: a later warm-up compiles nothing
    r = subprocess.run([sys.executable, "-m", "routepack_opt", "warmup", "--group", "plan", "--jobs", "2", "--json"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["compiled"] == 0 and rep["loaded"] > 0 and rep["cache_dir"] == str(cache)
    assert "workers" not in rep


def test_parallel_warmup_units_cover_their_groups(monkeypatch):
    """warm(jobs=2) hands every unit of the asked groups (and only those) to a worker, stage 0
    before the replica stage, and reports each one's time; joint placement's unit is stage 0,
    handed out after plan:rest (whose small kernels it shares) and the search loop."""
    from routepack_opt import warmup

    groups = ("plan", "joint", "replicas")
    ran = []
    monkeypatch.setattr(warmup, "_unit_cached", lambda name, kernels: False)
    monkeypatch.setattr(warmup, "_run_worker", lambda name: (ran.append(name), (name, 0.5, True, ""))[1])
    times = warmup._compile_in_workers(groups, 2, None)
    assert sorted(ran) == sorted(n for n, u in warmup.UNITS.items() if u[0] in groups)
    assert ran[-1] == "replicas" and set(times) == set(ran)
    order = list(warmup.UNITS)
    assert warmup.UNITS["joint"][1] == 0
    assert order.index("plan:anneal-search") < order.index("plan:rest") < order.index("joint")



def test_groups_for_warms_replica_kernels_only_when_asked():
    """A plan without replicas (the demo's, the golden plans') never waits for the replica
    kernels; one with replicas gets them, and joint placement adds its own group."""
    from routepack_opt.warmup import GROUPS, UNITS, groups_for

    assert groups_for("lpt") == ("plan",)
    assert groups_for("joint") == ("plan", "joint")
    assert groups_for("lpt", 4) == ("plan", "replicas")
    assert groups_for("joint", 8) == ("plan", "joint", "replicas")
    replica_modules = {"routepack_opt.heuristics.placement.replicate", "routepack_opt.heuristics.placement.replica_refine"}
    assert replica_modules <= set(GROUPS["replicas"]) and not replica_modules & set(GROUPS["plan"])
    assert [n for n, u in UNITS.items() if u[0] == "replicas"] == ["replicas"]


def _all_signatures():
    """Every numba kernel of every loaded routepack_opt module, with its signatures (a cache load
    adds one as a compile does, so this counts whatever the warm-up left out)."""
    from numba.core.dispatcher import Dispatcher

    out = {}
    for name, mod in list(sys.modules.items()):
        if name.startswith("routepack_opt") and mod is not None:
            for attr, obj in list(vars(mod).items()):
                if isinstance(obj, Dispatcher) and obj.py_func.__module__ == name:
                    out[f"{name}.{attr}"] = set(obj.signatures)
    return out


# Falkenauer-style triplets filling 4 bins of 1,000 exactly, on which FFD and BFD use 5: a
# near-cap step whose R* needs the overflow tabu search (issue 49 item 7: it compiled there)
_NEAR_CAP = [482, 431, 420, 377, 352, 345, 311, 303, 265, 258, 253, 203]


def test_issue49_7_a_seam_step_after_warmup_compiles_nothing():
    """After warm(), verl's driver _balance_batch (with routes) and rank-side
    rearrange_micro_batches and slime's build_dp_schedule on a near-cap step that needs the tabu
    search add no signature to any numba kernel: nothing compiles inside a seam's budget."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("verl")
    from omegaconf import OmegaConf
    from tensordict import TensorDict
    from verl import DataProto

    from routepack_opt.heuristics import binpack
    from routepack_opt.integrations import slime as rp_slime
    from routepack_opt.integrations import verl as rp_verl

    assert binpack.best_packing(np.array(_NEAR_CAP), 1000)[1] == 5  # FFD/BFD miss the 4 bins
    assert "error" not in warm()
    lens = _NEAR_CAP
    N, S = len(lens), max(lens)
    mask = (torch.arange(S)[None, :] < torch.as_tensor(lens)[:, None]).to(torch.int64)
    rng = np.random.default_rng(0)
    routes = torch.from_numpy(np.argsort(rng.random((N, S, 2, 8)), axis=3)[..., :2].astype(np.int16))

    class Host:
        actor_rollout_wg = None
        config = OmegaConf.create({"actor_rollout_ref": {"actor": {"ppo_mini_batch_size": N}}})

        def _get_dp_size(self, wg, role):
            return 2

        def _balance_batch(self, batch, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
            raise AssertionError("verl's own ran: the seam failed")

    rp_verl.install_balance_batch(Host, max_token_len=1000, num_experts=8, ep_size=2, time_limit=0.5)
    data = DataProto(batch=TensorDict({"input_ids": mask.clone(), "attention_mask": mask,
                                       "routed_experts": routes}, batch_size=[N]))
    before = _all_signatures()
    Host()._balance_batch(data, {})
    rp_verl.rearrange_micro_batches(TensorDict({"input_ids": mask.clone(), "attention_mask": mask},
                                               batch_size=[N]), 1000, time_limit=0.5)
    args = SimpleNamespace(use_dynamic_batch_size=True, max_tokens_per_gpu=1000, balance_data=False)
    tp = {"dp_size": 2, "cp_size": 1, "vpp_size": 1, "microbatch_group_size_per_vp_stage": 1}
    rp_slime.build_dp_schedule(args, tp, lens, global_batch_size=N, rollout_indices=list(range(N)),
                               time_limit=0.5)
    after = _all_signatures()
    new = {k: after[k] - before.get(k, set()) for k in after if after[k] - before.get(k, set())}
    assert not new, f"compiled during a seam call after warm(): {new}"

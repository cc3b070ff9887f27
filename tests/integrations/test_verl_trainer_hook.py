"""verl's driver hook (install_balance_batch) on the real RayPPOTrainer and DataProto: the overlap
modes, what they apply, the install-time checks (issue 49 items 6 and 9, issue 50 item 7)."""

import logging
import time
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("verl.trainer.ppo.ray_trainer", reason="verl's RayPPOTrainer is not importable "
                    "(the integrations extra installs what it needs)")
torch = pytest.importorskip("torch")

from tensordict import TensorDict  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.trainer.ppo.ray_trainer import RayPPOTrainer  # noqa: E402

from routepack_opt.core.errors import InputError  # noqa: E402
from routepack_opt.integrations import _verl_overlap, verl_trainer  # noqa: E402
from routepack_opt.integrations import verl as rp_verl  # noqa: E402
from routepack_opt.integrations._seam import OVERLAP_FIRST_S, seam_settings  # noqa: E402

CAP, E, D = 1000, 8, 2


def _classes(**install_kw):
    """A RayPPOTrainer subclass with only _update_actor / _update_critic stubbed (they record the
    batch they get), our hook installed on it."""
    got = []

    class T(RayPPOTrainer):
        def _update_actor(self, batch):
            got.append(("actor", batch.non_tensor_batch["uid"].tolist(),
                        batch.batch["routepack_micro_batch"].tolist()))
            return batch

        def _update_critic(self, batch):
            return batch

    rp_verl.install_balance_batch(T, **install_kw)
    return T, got


def _trainer(cls, mini=8, dp=D):
    """The real class without its __init__ (which starts Ray worker groups): verl's config and
    a worker group whose dispatch info gives verl's _get_dp_size ``dp`` ranks."""
    from omegaconf import OmegaConf

    t = cls.__new__(cls)
    t.config = OmegaConf.create({"actor_rollout_ref": {"actor": {"ppo_mini_batch_size": mini}, "rollout": {"n": 1}}})
    t.actor_rollout_wg = SimpleNamespace(_dispatch_info={"actor": list(range(dp))})
    return t


def _batch(lens, seed=0, routes=True):
    """A right-padded DataProto (input_ids, attention_mask, int16 routed_experts [B, S, 2, 2]) with uids."""
    rng = np.random.default_rng(seed)
    B, S = len(lens), max(lens)
    mask = (torch.arange(S)[None, :] < torch.as_tensor(lens)[:, None]).to(torch.int64)
    data = {"input_ids": torch.from_numpy(rng.integers(1, 1000, (B, S))) * mask, "attention_mask": mask}
    if routes:
        r = np.argsort(rng.random((B, S, 2, E)), axis=3)[..., :2].astype(np.int16)
        data["routed_experts"] = torch.from_numpy(r) * mask[:, :, None, None].to(torch.int16)
    return DataProto(batch=TensorDict(data, batch_size=[B]), non_tensor_batch={"uid": np.arange(B)})


def _lens(n=32, seed=1):
    rng = np.random.default_rng(seed)
    lens = [int(x) for x in np.clip(rng.lognormal(5.5, 0.7, n), 8, 600)]
    lens[5] = lens[9]  # two samples of equal length (the swap below)
    return lens


KW = dict(max_token_len=CAP, num_experts=E, ep_size=D, max_sweeps=5, time_limit=None, seed=3)


def _check_valid(data, lens):
    """Every sample once, equal counts per rank (the dispatch's equal chunks), each planned
    micro-batch under the cap."""
    uid = data.non_tensor_batch["uid"].tolist()
    assert sorted(uid) == list(range(len(lens)))
    mb = data.batch["routepack_micro_batch"].numpy()
    plan = data.batch["routepack_plan"].numpy()
    n = len(lens) // D
    for d in range(D):
        sl = slice(d * n, (d + 1) * n)
        for key in set(zip(plan[sl], mb[sl])):
            members = [u for u, p, m in zip(uid[sl], plan[sl], mb[sl]) if (p, m) == key]
            assert sum(lens[u] for u in members) <= CAP


@pytest.mark.parametrize("mode", [True, "deferred"])
def test_overlap_modes_plan_the_synchronous_mini_batches(mode, monkeypatch):
    """49.6: both overlap modes apply the very plan of the synchronous mode (same seed and
    max_sweeps: the same order and plan columns), and the update takes the padded tensors
    gathered in the background instead of reordering them again."""
    lens = _lens()
    Sync, got_sync = _classes(**KW)
    data = _batch(lens)
    _trainer(Sync)._balance_batch(data, {})
    sync = (data.non_tensor_batch["uid"].tolist(), data.batch["routepack_micro_batch"].tolist())

    gathered = []
    real = _verl_overlap.prereorder
    monkeypatch.setattr(_verl_overlap, "prereorder", lambda *a: gathered.append(real(*a)) or gathered[-1])
    Ov, got = _classes(**KW, overlap=mode)
    t, data, metrics = _trainer(Ov), _batch(lens), {}
    t._balance_batch(data, metrics)
    t._update_actor(data)
    assert got == [("actor", *sync)]
    rec = rp_verl.last_record()
    assert rec.quick is None and not rec.on_critical_path and rec.predicted_us <= rec.predicted_us_theirs + 1e-6
    for key in ("routed_experts", "input_ids", "attention_mask"):
        assert data.batch[key] is gathered[0][key]  # gathered off the critical path, not again
    _check_valid(data, lens)


def _swap_equal_length(data, lens):
    pos = data.non_tensor_batch["uid"].tolist()
    i, j = pos.index(5), pos.index(9)
    perm = list(range(len(pos)))
    perm[i], perm[j] = j, i
    data.reorder(torch.tensor(perm))


def _swap_tokens_through_numpy(data, lens):
    pos = data.non_tensor_batch["uid"].tolist()
    ids = data.batch["input_ids"].numpy()  # a write through numpy bumps no version counter
    i, j = pos.index(5), pos.index(9)
    ids[[i, j]] = ids[[j, i]]


def _replace_routes(data, lens):
    data.batch["routed_experts"] = data.batch["routed_experts"].flip(0)


def _routes_in_place(data, lens):
    data.batch["routed_experts"][0, 0, 0, 0] += 1


@pytest.mark.parametrize("change,why", [(_swap_equal_length, "rewritten"), (_swap_tokens_through_numpy, "tokens"),
                                        (_replace_routes, "routed_experts"), (_routes_in_place, "routed_experts")])
@pytest.mark.parametrize("mode", [True, "deferred"])
def test_overlap_applies_only_its_own_plan(change, why, mode, caplog):
    """50.7: equal-length samples swapped (by a reorder, or by writes through a numpy view) or
    routed_experts replaced / written in place between _balance_batch and the update: the stale
    plan is not applied; the update re-plans on the quick path (valid, under the cap) and the
    record says why."""
    lens = _lens()
    Ov, got = _classes(**KW, overlap=mode)
    t, data = _trainer(Ov), _batch(lens)
    t._balance_batch(data, {})
    change(data, lens)
    with caplog.at_level(logging.WARNING, logger="routepack_opt.integrations"):
        t._update_actor(data)
    rec = rp_verl.last_record()
    assert rec.quick.startswith("overlap: ") and why in rec.quick and rec.predicted_us is None
    assert len(got) == 1
    _check_valid(data, [int(x) for x in data.batch["attention_mask"].sum(1)[np.argsort(
        data.non_tensor_batch["uid"])]])


def test_a_base_exception_in_the_planning_thread_falls_back_with_its_reason(monkeypatch):
    """50.7: SystemExit raised in the planning thread: the update re-plans on the quick path and
    the record names it (no KeyError: 'plan')."""
    def boom(*a, **k):
        raise SystemExit(3)

    monkeypatch.setattr(verl_trainer, "plan_step", boom)
    lens = _lens()
    Ov, got = _classes(**KW, overlap="deferred")
    t, data = _trainer(Ov), _batch(lens)
    t._balance_batch(data, {})
    t._update_actor(data)
    rec = rp_verl.last_record()
    assert "SystemExit: 3" in rec.quick and len(got) == 1
    _check_valid(data, lens)


def test_overlap_budget_is_the_hidden_time_not_the_import(monkeypatch):
    """49.6: with the default budget the background plan gets the whole default budget on the
    first step (the route import is not charged: it searches), then what the last step's hidden
    time allows (OVERLAP_SHARE of it, less the import and gather)."""
    monkeypatch.delenv("ROUTEPACK_TIME_LIMIT", raising=False)
    lens = _lens()
    Ov, _ = _classes(max_token_len=CAP, num_experts=E, ep_size=D, overlap="deferred")
    t = _trainer(Ov)
    data = _batch(lens)
    t._balance_batch(data, {})
    t._update_actor(data)
    first = rp_verl.last_record()
    assert first.budget_s == pytest.approx(OVERLAP_FIRST_S) and first.quick is None
    assert first.import_s > 0
    data = _batch(lens, seed=2)
    t._balance_batch(data, {})
    t0 = time.perf_counter()
    time.sleep(0.05)  # the log-prob passes
    hidden = time.perf_counter() - t0
    t._update_actor(data)
    second = rp_verl.last_record()
    assert second.budget_s <= verl_trainer.OVERLAP_SHARE * (hidden + 0.01)


def test_install_checks_what_needs_no_batch():
    """49.9: E + N not divisible by EP, ep_size not dividing dp_size, bad integers and misspelled
    keywords are InputErrors at install, naming the argument; unknown seams too."""
    T = type("T", (RayPPOTrainer,), {})
    with pytest.raises(InputError, match="redundant_experts=3"):
        rp_verl.install_balance_batch(T, max_token_len=CAP, num_experts=64, ep_size=8, redundant_experts=3)
    with pytest.raises(InputError, match="ep_size=6: dp_size=8"):
        rp_verl.install_balance_batch(T, max_token_len=CAP, ep_size=6, dp_size=8)
    with pytest.raises(InputError, match="max_token_len: expected a positive integer, got 2.5"):
        rp_verl.install_balance_batch(T, max_token_len=2.5)
    with pytest.raises(InputError, match="'time_limt' \\(did you mean 'time_limit'\\?\\)"):
        rp_verl.install_balance_batch(T, max_token_len=CAP, time_limt=0.1)
    with pytest.raises(InputError, match="'max_sweep'"):
        seam_settings("verl_balance", max_sweep=3)
    with pytest.raises(InputError, match="seam: expected one of .* got 'openrlhf'"):
        seam_settings("openrlhf")
    assert T._balance_batch is RayPPOTrainer._balance_batch  # nothing was installed


def test_each_distinct_failure_cause_warns_once(caplog):
    """49.9: a DP size the EP size does not divide, then a sample without tokens: two warnings
    (one per cause, each naming it), verl's own _balance_batch runs each time; the same cause
    again warns no more."""
    lens = _lens()
    T6, _ = _classes(max_token_len=CAP, ep_size=3, max_sweeps=5, time_limit=None)
    T1, _ = _classes(max_token_len=CAP, max_sweeps=5, time_limit=None)
    empty = list(lens)
    empty[0] = 0
    with caplog.at_level(logging.WARNING, logger="routepack_opt.integrations"):
        for cls, ls in ((T6, lens), (T1, empty), (T6, lens), (T1, empty)):
            data, m = _batch(ls, routes=False), {}
            _trainer(cls)._balance_batch(data, m)
            assert "routepack/balance/rows" not in m and any(k.startswith("global_seqlen/") for k in m)
    msgs = [r.getMessage() for r in caplog.records if "balance_batch planning failed" in r.getMessage()]
    assert len(msgs) == 2 and "ep_size=3" in msgs[0] and "no tokens" in msgs[1]


def test_plugin_variable_installs_the_driver_hook_where_the_trainer_is_imported():
    """49.8: with ROUTEPACK_VERL_BALANCE=1 (and its settings in the environment), the real
    `import verl` then verl's TaskRunner module (main_ppo_v0, which imports RayPPOTrainer) in a
    fresh process find RayPPOTrainer._balance_batch and _update_actor replaced, with the
    variables' settings."""
    import os
    import subprocess
    import sys

    from support import REPO

    code = ("import logging, sys\n"
            "logging.basicConfig(level=logging.INFO)\n"
            "import verl\n"
            "early = 'verl.trainer.ppo.ray_trainer' in sys.modules\n"
            "import verl.trainer.main_ppo_v0 as m\n"
            "T = m.RayPPOTrainer\n"
            "print(early, getattr(T._balance_batch, '__routepack__', False), "
            "getattr(T._update_actor, '__routepack__', False))\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "ROUTEPACK_VERL_BALANCE": "1", "ROUTEPACK_MAX_TOKEN_LEN": "4096",
           "ROUTEPACK_NUM_EXPERTS": "8", "ROUTEPACK_EP_SIZE": "2", "ROUTEPACK_OVERLAP": "deferred",
           "ROUTEPACK_TIME_LIMIT": "0.2", "VERL_USE_EXTERNAL_PLUGINS": "auto"}
    env.pop("ROUTEPACK_VERL", None)
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["False", "True", "True"], r.stdout + r.stderr[-2000:]
    assert "RayPPOTrainer._balance_batch replaced" in r.stderr and "budget 0.2 s" in r.stderr


def test_plugin_settings_are_checked_naming_the_variable():
    """49.8: the driver hook's variables are read like ROUTEPACK_VERL's: each bad value, and a
    missing ROUTEPACK_MAX_TOKEN_LEN, is one InputError naming the variable."""
    from routepack_opt.integrations.verl_plugin import balance_options_from_env

    base = {"ROUTEPACK_MAX_TOKEN_LEN": "4096"}
    assert balance_options_from_env({**base, "ROUTEPACK_OVERLAP": "1", "ROUTEPACK_REDUNDANT_EXPERTS": "0"}) == {
        "max_token_len": 4096, "overlap": True, "redundant_experts": 0}
    with pytest.raises(InputError, match="ROUTEPACK_MAX_TOKEN_LEN is not set"):
        balance_options_from_env({"ROUTEPACK_NUM_EXPERTS": "8"})
    with pytest.raises(InputError, match="ROUTEPACK_EP_SIZE='two'"):
        balance_options_from_env({**base, "ROUTEPACK_EP_SIZE": "two"})
    with pytest.raises(InputError, match="ROUTEPACK_NUM_EXPERTS='0'"):
        balance_options_from_env({**base, "ROUTEPACK_NUM_EXPERTS": "0"})
    with pytest.raises(InputError, match="ROUTEPACK_OVERLAP='later'"):
        balance_options_from_env({**base, "ROUTEPACK_OVERLAP": "later"})


def test_overlap_checks_the_rollout_hooks_counts_it_planned_from():
    """50.7: a batch planned from the rollout hook's counts (no routed_experts): the overlap plan
    equals the synchronous one, and counts rewritten in place before the update make it stale."""
    from routepack_opt.integrations.replay import import_replay
    from routepack_opt.integrations.rollout_hook import COUNTS_KEY

    lens = _lens()

    def with_counts():
        data = _batch(lens)
        counts = import_replay(data.batch["routed_experts"], format="verl", num_experts=E,
                               attention_mask=data.batch["attention_mask"]).window.counts
        del data.batch["routed_experts"]
        col = np.empty(len(lens), dtype=object)
        col[:] = [counts[i].copy() for i in range(len(lens))]
        data.non_tensor_batch[COUNTS_KEY] = col
        return data

    Sync, _ = _classes(**KW)
    data = with_counts()
    _trainer(Sync)._balance_batch(data, {})
    sync = data.non_tensor_batch["uid"].tolist()
    Ov, got = _classes(**KW, overlap="deferred")
    t = _trainer(Ov)
    data = with_counts()
    t._balance_batch(data, {})
    t._update_actor(data)
    assert got[-1][1] == sync and rp_verl.last_record().quick is None
    data = with_counts()
    t._balance_batch(data, {})
    data.non_tensor_batch[COUNTS_KEY][3][0, 0] += 1
    t._update_actor(data)
    assert "routepack_expert_counts" in rp_verl.last_record().quick

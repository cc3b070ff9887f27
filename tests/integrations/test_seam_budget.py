"""The seams' one budget helper (integrations/_seam.py): what verl's plan_step and slime's steps spend."""

import time

import numpy as np
import pytest

from routepack_opt.integrations._seam import SHARE_OF_GAIN, SHARE_OF_STEP, CallBudget, import_skip, seam_settings


def test_default_budget_is_capped_by_the_step_and_the_gain(monkeypatch):
    """Default limit: min(limit, SHARE_OF_STEP × predicted step, SHARE_OF_GAIN × gain); a set one as given."""
    monkeypatch.delenv("ROUTEPACK_TIME_LIMIT", raising=False)
    s = seam_settings("slime")
    assert s.time_limit_is_default and s.time_limit == 0.25
    assert s.call_budget() == 0.25
    assert s.call_budget(predicted_us=1e6) == SHARE_OF_STEP * 1.0
    assert s.call_budget(predicted_us=1e6, gain_us=1e5) == SHARE_OF_GAIN * 0.1
    assert s.call_budget(gain_us=1e5) == s.gain_time_limit(1e5)
    fixed = seam_settings("slime", time_limit=2.0)
    assert fixed.call_budget(predicted_us=1e6, gain_us=1.0) == 2.0
    assert seam_settings("slime", time_limit=None).call_budget(predicted_us=1e6) is None


def test_left_and_short():
    """What is left is shared out after the reserve; under the floor the quick path stands, never with max_sweeps."""
    s = seam_settings("verl_balance", time_limit=1.0)
    b = CallBudget(s, time.perf_counter() - 0.5, 1.0)
    left = b.left(reserve_s=0.1, shares=2)
    assert 0.0 < left <= 0.2
    assert b.short(left, 0.02) is None
    assert b.short(0.005, 0.02) == "budget: 5 ms left"
    assert b.short(-1.0, 0.02) == "budget: 0 ms left"
    assert CallBudget(seam_settings("verl_balance", time_limit=1.0, max_sweeps=3), 0.0, 1.0).short(0.005, 0.02) is None
    assert CallBudget(s, 0.0, None).left() is None


def test_import_skip_names_what_it_overruns():
    assert import_skip(0.05, 0.1, "the step's budget") is None
    assert import_skip(0.05, None, "the step's budget") is None
    assert import_skip(0.2, 0.1, "the step's budget") == ("route import: predicted 200 ms, over the step's budget "
                                                          "(100 ms); planned on lengths")


def _td(lens, E=4, La=1, K=2, routes=False, seed=0):
    """A batch of right-padded masks (and distinct top-K routes) for plan_step."""
    import torch
    from tensordict import TensorDict

    rng = np.random.default_rng(seed)
    S = max(lens)
    mask = (torch.arange(S)[None, :] < torch.as_tensor(lens)[:, None]).to(torch.int64)
    data = {"attention_mask": mask}
    if routes:
        r = np.argsort(rng.random((len(lens), S, La, E)), axis=-1)[..., :K]
        data["routed_experts"] = torch.from_numpy(r) * mask[:, :, None, None]
    return TensorDict(data, batch_size=[len(lens)])


def test_issue49_item5_quick_path_has_a_floor_check():
    """Issue 49 item 5: when what is left of the budget cannot pay for the quick path (its rate ×
    N), verl's own layout is applied without running it, and the plan says why."""
    pytest.importorskip("torch")
    from routepack_opt.integrations.verl_balance import BalanceOptions, StepBudget, plan_step

    lens = np.array([50, 300, 120, 400, 90, 250, 60, 310, 200, 80, 150, 40, 330, 70, 110, 260])
    st = seam_settings("verl_balance", time_limit=0.5)
    sp = plan_step(_td(lens), lens, 2, 8, options=BalanceOptions(800), settings=st,
                   budget=StepBudget(quick_rate_s=1.0), balance_fn=None)
    assert sp.applied == "verl" and "the quick path needs about 16000 ms" in sp.quick
    assert sp.plans == sp.theirs.plans and sp.quick_rate_s is None and sp.ours_us == sp.theirs_us
    fast = plan_step(_td(lens), lens, 2, 8, options=BalanceOptions(800), settings=st,
                     budget=StepBudget(quick_rate_s=1e-9), balance_fn=None)
    assert fast.quick_rate_s is not None and fast.ours_us <= fast.theirs_us


def test_issue49_item5_route_import_predicted_over_its_ceiling_is_skipped():
    """Issue 49 item 5: a route import predicted over its ceiling (rate × entries) is not paid:
    the step is planned on lengths and says so."""
    pytest.importorskip("torch")
    from routepack_opt.integrations.verl_balance import BalanceOptions, StepBudget, plan_step

    lens = np.array([50, 300, 120, 400, 90, 250, 60, 310])
    st = seam_settings("verl_balance", time_limit=0.5, max_sweeps=2)
    opts = BalanceOptions(800, num_experts=4, ep_size=2)
    sp = plan_step(_td(lens, routes=True), lens, 2, 8, options=opts, settings=st,
                   budget=StepBudget(import_rate_s=1.0, skip_import_over_us=1e3), balance_fn=None)
    assert sp.import_rate_s is None and sp.gain_us is None
    assert sp.quick.startswith("route import: predicted") and "planned on lengths" in sp.quick

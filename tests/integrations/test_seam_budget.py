"""The seams' one budget helper (integrations/_seam.py): what verl's plan_step and slime's steps spend."""

import time

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

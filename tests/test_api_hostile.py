"""Hostile input to the API (issue 30): submit refuses bad input with InputError, result() never
raises for a planning failure, and every fallback AsyncPlanner hands back is a valid plan."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from routepack_opt import api
from routepack_opt.api import AsyncPlanner, PlanOptions, plan_micro_batches
from routepack_opt.core.errors import InputError
from routepack_opt.core.window import Window

OPTS = dict(dp_size=4, ep_size=2, max_tokens=64, cost="olmoe-1b-7b")


def _window(N=16, L=2, E=4, k=2, seed=0, max_len=40):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max_len + 1, size=N)
    counts = np.zeros((N, L, E), dtype=np.int64)
    for i, n in enumerate(lengths):
        for l in range(L):
            for _ in range(n):  # each token picks k distinct experts
                counts[i, l, rng.choice(E, size=k, replace=False)] += 1
    return lengths, counts


LEN, CNT = _window()


def _nan_counts():
    c = CNT.astype(float)
    c[0, 0, 0] = np.nan
    return c


def _off_by_one():
    c = CNT.copy()
    c[3, 1, 0] += 1
    return c


@pytest.mark.parametrize("name, args, options", [
    ("cost='nope'", (LEN, CNT), dict(cost="nope")),
    ("NaN counts", (LEN, _nan_counts()), {}),
    ("counts off by one", (LEN, _off_by_one()), {}),
    ("ragged counts", (LEN, [[[1, 2]], [[1]]]), {}),
    ("ragged lengths", ([1, [2, 3]], CNT), {}),
    ("2-D counts", (LEN, CNT[:, 0, :]), {}),
    ("ragged current_placement", (LEN, CNT), dict(current_placement=[[0, 1, 2, 3], [0]])),
    ("current_placement of another shape", (LEN, CNT), dict(current_placement=[[0, 1], [1, 0]])),
    ("placement=[[0,1],[0]]", (LEN, CNT), dict(placement=[[0, 1], [0]])),
    ("E=6 with ep_size=4", _window(N=16, E=6), dict(dp_size=4, ep_size=4)),
    ("a length over max_tokens", (LEN, CNT), dict(max_tokens=8)),
    ("fewer samples than DP ranks", _window(N=3), {}),
])
def test_submit_refuses_bad_input(name, args, options):
    """Each bad input raises InputError in submit() itself, not a fallback with a hidden error."""
    planner = AsyncPlanner(warm=False)
    try:
        with pytest.raises(InputError):
            planner.submit(*args, deadline=5.0, **{**OPTS, **options})
    finally:
        planner.close()


@pytest.mark.parametrize("options", [dict(placement=[[0, 1], [0]]),
                                     dict(placement="joint", current_placement=[[0, 1, 2, 3], [3, 2, 1, 1]])])
def test_plan_micro_batches_refuses_bad_placements(options):
    """A ragged placement, or a bad current_placement with placement='joint', is an InputError
    (as the CLI's --placement-from), never a ValueError or silently dropped."""
    with pytest.raises(InputError):
        plan_micro_batches(LEN, CNT, max_sweeps=1, **{**OPTS, **options})


@st.composite
def _case(draw):
    ep = draw(st.integers(1, 4))
    dp = ep * draw(st.integers(1, 3))
    E = ep * draw(st.integers(1, 3))
    k = draw(st.integers(1, E))
    L = draw(st.integers(1, 3))
    C = draw(st.integers(4, 64))
    N = draw(st.integers(dp, 40))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, C + 1, size=N)
    counts = np.zeros((N, L, E), dtype=np.int64)
    for l in range(L):
        for i in range(N):  # the top-k of each token: k distinct experts, lengths[i] times
            picks = np.argsort(rng.random((int(lengths[i]), E)), axis=1)[:, :k]
            counts[i, l] += np.bincount(picks.ravel(), minlength=E)
    opts = dict(dp_size=dp, ep_size=ep, max_tokens=C, cost="olmoe-1b-7b",
                min_micro_batches=draw(st.integers(1, 2)), pp_multiple=draw(st.integers(1, 2)),
                equal_samples_per_slot=draw(st.booleans()))
    if draw(st.booleans()):
        opts["current_placement"] = np.argsort(rng.random((L, E)), axis=1)
    return lengths, counts, opts


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_case())
def test_every_quick_fallback_is_valid(case):
    """Over random shapes and topologies: a window submit() accepts gets a quick fallback that
    passes Plan.validate(), or the certified fallback, or an InputError only where no plan exists."""
    lengths, counts, options = case
    opts = PlanOptions.of(options)
    try:
        window = api.checked_window(lengths, counts, None, None, opts)
    except InputError:
        return  # refused up front, as submit() would
    job = api._Job(window, opts, 0.0, api.Future())
    try:
        mb = api._quick_plan(job)
    except InputError:
        try:
            mb = AsyncPlanner(warm=False)._certified_fallback(job)
        except InputError as exc:
            assert "no valid plan exists" in str(exc)
            return
    assert mb.plan.validate(window) == []
    assert sorted(i for rank in mb.micro_batches for m in rank for i in m) == list(range(window.num_samples))


def test_result_after_an_impossible_deadline_is_a_valid_plan():
    """A 1 ms deadline and no grace: result() returns a valid fallback at once, never raises."""
    planner = AsyncPlanner(grace=0, warm=False)
    try:
        planner.submit(LEN, CNT, deadline=1e-3, current_placement=np.tile(np.arange(4)[::-1], (2, 1)),
                       **OPTS)
        mb = planner.result()
        assert mb.plan.validate(Window(LEN, CNT)) == []
    finally:
        planner.close()

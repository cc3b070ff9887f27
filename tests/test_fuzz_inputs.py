"""Hostile-input fuzzer, short profile (issue 39, item 5): good files of every format the package
reads (window .npz, plan JSON with and without replicas, cost and config TOML, routes .npz / .npy /
.pt / .safetensors, a lengths .npy, steps.jsonl, run.json) are mutated (truncation, bit flips,
spliced bytes, dtype and shape changes in the array headers, damaged zip members, JSON values of
the wrong type or range, special files, odd names) and read by the package's readers, in-process
(the CLI's ``main`` where a cheap command reads the format) under a timeout. Each case must end
in a clean result or exit 2 with one ``error:`` line (an ``InputError`` at the API): no traceback,
no exit 1, no hang, no warning, no input or old output changed, no temporary file left
(tests/fuzz_support.py). ``ROUTEPACK_FUZZ_EXAMPLES`` sets the random examples (default 60); the
long profile is experiments/hostile_sweep_r4.py."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import fuzz_support as fs
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("ROUTEPACK_FUZZ_EXAMPLES", "60"))


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    files = fs.good_files(tmp_path_factory.mktemp("good"))
    return fs.reader_cases(files)


def _check(case, kind, seed):
    with tempfile.TemporaryDirectory() as tmp:
        outcome, detail = fs.one_case(case, kind, seed, Path(tmp))
    assert outcome in ("ok", "clean2"), (case[0], kind, seed, outcome, detail[:500])
    return outcome


def test_good_files_are_read(cases):
    """Every reader takes its good file: the fuzzer's refusals are of the mutations, not of all."""
    for fmt, good, read in cases:
        with tempfile.TemporaryDirectory() as tmp:
            outcome, detail = read(good, Path(tmp))
        assert outcome == "ok", (fmt, outcome, detail[:300])


def test_every_format_and_mutation(cases):
    """Each format × each mutation (seed 0) once: a clean result or one error: line."""
    seen = {"ok": 0, "clean2": 0}
    for case in cases:
        for kind in fs.mutations_for(case[0]):
            seen[_check(case, kind, 0)] += 1
    assert seen["clean2"] > 0.5 * sum(seen.values())  # most mutations are refused


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_random_mutations(cases, data):
    case = data.draw(st.sampled_from(cases), label="reader")
    kind = data.draw(st.sampled_from(fs.mutations_for(case[0])), label="mutation")
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    _check(case, kind, seed)


# --- the public API (issue 50, "What to build" 9) -------------------------------------------------
# Every cheap public target of fuzz_support.api_targets, one argument replaced at a time by a
# hostile value (a fixed list of the usual suspects, or a drawn int, float, string, list or numpy
# array of any dtype and shape): an InputError, or a result that passes the target's check when
# the value is in the argument's kind. A call is bounded by fuzz_support.run_target's alarm
# (20 s: a hang is a finding, not a slow test); derandomized, so the examples are the same on
# every run. Sizes that h4's guards bound (C = 2³¹ in decide_bins and the arc-flow model) are
# not drawn: the integers drawn are small or out of every argument's range.
API_EXAMPLES = int(os.environ.get("ROUTEPACK_FUZZ_API_EXAMPLES", "300"))
_HOSTILE = fs.hostile_values()


@pytest.fixture(scope="module")
def api_targets(tmp_path_factory):
    return [t for t in fs.api_targets(tmp_path_factory.mktemp("api")) if t is not None and t.cheap]


def _numpy_values():
    from hypothesis.extra import numpy as hnp

    dtypes = st.sampled_from(["?", "i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f2", "f4", "f8", "c8",
                              "<U2", "M8[s]", "m8[s]", ">i4", ">f8"])
    return dtypes.flatmap(lambda dt: hnp.arrays(np.dtype(dt), hnp.array_shapes(min_dims=0, max_dims=3, max_side=3)))


def _hostile_strategy():
    ints = st.integers(-2**70, 64) | st.sampled_from([2**63 - 1, 2**63, 2**64 + 3])
    return st.one_of(st.sampled_from([v for _, v in _HOSTILE]), ints, st.floats(), st.text(max_size=4),
                     st.lists(st.integers(-3, 2**40), max_size=3), st.lists(st.lists(st.integers(0, 4), max_size=2),
                                                                           max_size=2),
                     st.none(), st.booleans(), _numpy_values())


@settings(max_examples=API_EXAMPLES, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_public_api_refuses_hostile_arguments(api_targets, data):
    """Each public function with one hostile argument: an InputError naming what was given, or a
    valid result for a value of the argument's kind; never another exception, a hang or a warning."""
    target = data.draw(st.sampled_from(api_targets), label="target")
    arg = data.draw(st.sampled_from(sorted(target.kinds)), label="argument")
    value = data.draw(_hostile_strategy(), label="value")
    assume(not fs.pending(target.name, arg, value))
    outcome, detail = fs.run_target(target, arg, value)
    assert outcome in ("ok", "clean2"), (target.name, arg, fs.shown_value(value), outcome, detail[:300])

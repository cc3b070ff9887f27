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
import pytest
from hypothesis import HealthCheck, given, settings
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

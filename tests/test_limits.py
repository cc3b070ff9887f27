"""Time limits and memory: every stage draws on one clock, long kernels stop at a deadline, and a
window too large for the memory left is refused before it is read."""

import time
import zipfile

import numpy as np
import pytest

from routepack_opt import pipeline
from routepack_opt.core.bounds import is_packing
from routepack_opt.core.cost import PRESETS
from routepack_opt.core.errors import InputError
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import check_window_memory, load_window
from routepack_opt.heuristics import cells
from routepack_opt.heuristics.anneal.greedy import CANDIDATE_BLOCKS, greedy_seed
from routepack_opt.heuristics.anneal.problem import Instance
from routepack_opt.heuristics.placement.lpt import lpt_placement
from routepack_opt.models.layout import solve_layout
from routepack_opt.trace import generate_window

COST = PRESETS["olmoe-1b-7b"].cost


@pytest.fixture(scope="module")
def window():
    return generate_window("olmoe-1b-7b", 160, seed=5, num_layers=4)


def _problem(window, topo, rows):
    b = Evaluator(window, topo, COST).rank_loads(lpt_placement(window.expert_loads(), topo.ep))
    return Instance(window.lengths, b, topo, COST, rows, "max-sum", 1e-9)


def test_greedy_in_chunks_equals_one_pass(window):
    """The joint-cost greedy run one sample per call gives the one-pass layout, trying every
    block or (candidates=3) a seeded sample of them, whose stream carries across the calls."""
    topo = Topology(dp=8, ep=4, capacity=4096)
    rows = pipeline.resolve_rows(window, topo, None)[0]
    pb = _problem(window, topo, rows)
    assert pb.R * pb.G > 3
    for candidates in (CANDIDATE_BLOCKS, 3):
        whole = greedy_seed(pb, chunk_ops=1e18, candidates=candidates)
        assert whole is not None
        again = greedy_seed(pb, chunk_ops=1, candidates=candidates)  # one sample per call
        assert np.array_equal(again[0], whole[0]) and np.array_equal(again[1], whole[1])


def test_sampled_greedy_is_a_valid_layout(window):
    """Trying each sample in a few sampled blocks still gives a feasible layout (every cell
    filled, capacity kept), different from the exhaustive one and deterministic."""
    topo = Topology(dp=8, ep=4, capacity=4096)
    pb = _problem(window, topo, pipeline.resolve_rows(window, topo, None)[0])
    full = greedy_seed(pb)
    few = greedy_seed(pb, candidates=2)
    assert few is not None and full is not None
    row, slot = pb.external(*few)
    pb.check_layout(row, slot, "sampled greedy")  # raises on an empty or overfull cell
    assert not (np.array_equal(few[0], full[0]) and np.array_equal(few[1], full[1]))
    again = greedy_seed(pb, candidates=2)
    assert np.array_equal(again[0], few[0]) and np.array_equal(again[1], few[1])


def test_greedy_stops_at_a_past_deadline(window):
    """A deadline already passed: the greedy gives up (None) instead of running on."""
    topo = Topology(dp=8, ep=4, capacity=4096)
    pb = _problem(window, topo, pipeline.resolve_rows(window, topo, None)[0])
    assert greedy_seed(pb, deadline=time.perf_counter() - 1.0) is None


def test_repair_in_pieces_equals_one_pass(monkeypatch):
    """The cap repair run a few cells per compiled call ends in the layout of one call per pass."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(50, 900, size=400)
    cells0 = rng.integers(0, 64, size=400)
    whole = cells0.copy()
    ok = cells.repair_capacity(lengths, whole, 8, 8, 2000)
    for piece_ops in (1, 3 * (400 + 64)):
        monkeypatch.setattr(cells, "_REPAIR_PIECE_OPS", piece_ops)
        again = cells0.copy()
        assert cells.repair_capacity(lengths, again, 8, 8, 2000) == ok
        assert np.array_equal(again, whole)


def test_repair_stops_at_a_past_deadline():
    """With the deadline gone the repair reports failure (the caller's last resort takes over)."""
    rng = np.random.default_rng(4)
    lengths = rng.integers(50, 900, size=400)
    cell_N = rng.integers(0, 64, size=400)
    tokens = np.bincount(cell_N, weights=lengths, minlength=64)
    assert (tokens > 2000).any()
    assert cells.repair_capacity(lengths, cell_N, 8, 8, 2000, deadline=time.perf_counter() - 1) is False


def test_stages_before_the_search_count_against_the_limit(window, monkeypatch):
    """When R* certification alone uses up the time limit, no search runs, the plan is the best
    baseline (valid), and it says so."""
    topo = Topology(dp=8, ep=4, capacity=4096)
    real = pipeline.certified_rows

    def slow_rows(*args, **kwargs):
        time.sleep(0.3)
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "certified_rows", slow_rows)
    p = pipeline.solve(window, topo, COST, time_limit=0.2)
    assert p.validate(window) == []
    assert "no search" in p.info["fallback"]
    assert "search" not in p.info


def test_search_gets_what_the_earlier_stages_left(window, monkeypatch):
    """The annealer's time limit is the pipeline's limit less what placement, R* and the seeds
    used (and the final-scoring reserve), not the whole limit again."""
    topo = Topology(dp=8, ep=4, capacity=4096)
    seen = {}
    real = pipeline.anneal

    def spy(*args, **kwargs):
        seen["time_limit"] = kwargs["time_limit"]
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "anneal", spy)
    pipeline.solve(window, topo, COST, time_limit=5.0, max_sweeps=2)
    assert 0 < seen["time_limit"] <= 5.0 - 0.02  # at least the reserve's floor is kept back


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf")])
def test_pipeline_time_limit_must_be_positive_and_finite(window, bad):
    """A zero, negative, NaN or infinite time limit is an input error."""
    with pytest.raises(InputError, match="time limit"):
        pipeline.solve(window, Topology(dp=8, ep=4, capacity=4096), COST, time_limit=bad)


def test_exact_model_build_stops_at_the_limit(window):
    """An exact model too large to build in the limit returns the warm start (never worse) with
    the build timeout recorded, instead of running past the limit."""
    topo = Topology(dp=8, ep=4, capacity=4096)
    rows = pipeline.resolve_rows(window, topo, None)[0]
    pl = lpt_placement(window.expert_loads(), topo.ep)
    row, slot = next(iter(pipeline.baseline_layouts(window, topo, rows).values())).arrays()
    for solver in ("cpsat", "highs"):
        res = solve_layout(window, topo, COST, pl, rows, "max-sum", solver=solver, time_limit=1e-4,
                           warm_start=(row, slot))
        assert res.status in ("feasible", "unknown")
        assert res.row is not None and np.array_equal(res.row, row) and np.array_equal(res.slot, slot)
        assert res.info.get("returned") == "warm start"
        assert "build_timeout" in res.info


def _fake_npz(path, shape, dtype="<i2"):
    """An .npz whose counts header claims ``shape`` (no data behind it: never read)."""
    header = {"descr": dtype, "fortran_order": False, "shape": tuple(shape)}
    with zipfile.ZipFile(path, "w") as z:
        with z.open("counts.npy", "w") as fh:
            np.lib.format.write_array_header_1_0(fh, header)
        with z.open("lengths.npy", "w") as fh:
            np.lib.format.write_array(fh, np.ones(shape[0] if shape[0] < 10 else 1, dtype=np.int64))
    return path


def test_window_too_large_for_memory_is_refused_up_front(tmp_path):
    """A window whose counts would not fit in memory is an input error naming the size, raised
    from the file's header before any of it is read."""
    path = _fake_npz(tmp_path / "huge.npz", (10**9, 48, 256))
    with pytest.raises(InputError, match=r"needs about .* GiB .* per sample"):
        load_window(path)


def test_memory_check_passes_small_windows():
    """A small window passes the memory check (nothing is raised)."""
    check_window_memory((1024, 48, 256), np.dtype(np.int16))


def test_cli_huge_window_is_one_error_line(run_cli, tmp_path):
    """`routepack plan` on a window too large for memory: exit 2, one error: line."""
    path = _fake_npz(tmp_path / "huge.npz", (10**9, 48, 256))
    code, out, err = run_cli("plan", path, "--dp", "8", "--ep", "4", "--capacity", "4096",
                             "--cost", "olmoe-1b-7b")
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "GiB" in lines[0]


def test_mbs_kernel_cut_and_continued_equals_one_call():
    """MBS' cut by its deadline after every bin and continued from its partial packing builds
    the bins of one uncut call."""
    from routepack_opt.heuristics import binpack

    sizes = np.sort(np.random.default_rng(7).integers(5, 60, size=300))[::-1].copy()
    whole = np.full(300, -1, dtype=np.int64)
    bins, done = binpack._mbs_kernel(sizes, 100, 500, whole, 0, np.inf)
    assert done
    out = np.full(300, -1, dtype=np.int64)
    nb, calls, done = 0, 0, False
    while not done:
        nb, done = binpack._mbs_kernel(sizes, 100, 500, out, nb, 0.0)  # one bin per call
        calls += 1
    assert nb == bins and calls == bins and np.array_equal(out, whole)


def test_mbs_out_of_time_still_returns_a_packing():
    """When MBS' first pass is cut by its deadline, FFD/BFD finish it with the items left: a
    valid packing, never worse than FFD/BFD."""
    from routepack_opt.heuristics import binpack

    sizes = np.random.default_rng(8).integers(5, 60, size=300)  # ~100 bins: the first bin is built
    bin_N, used = binpack.minimum_bin_slack(sizes, 100, time_limit=1e-9)
    assert is_packing(sizes, 100, bin_N) and used == np.unique(bin_N).size
    assert used <= binpack.best_packing(sizes, 100)[1]
    order = np.argsort(-sizes, kind="stable")
    out, bins, done = binpack._mbs_pass(sizes[order], 100, 500, deadline=0.0)  # cut after 1 bin
    assert not done and is_packing(sizes[order], 100, out) and bins == np.unique(out).size


def test_tabu_run_stops_at_its_deadline():
    """The overflow tabu kernel reads the clock: with its deadline gone it stops before its first
    iteration (the clock is read before every ``every``-th, from the first) instead of running
    its whole budget."""
    from routepack_opt.heuristics import binpack

    rng = np.random.default_rng(9)
    sizes = rng.integers(20, 45, size=400)
    K = int(np.ceil(sizes.sum() / 100))  # tight: overflow left after a few iterations
    init = np.arange(400) % K
    t = time.perf_counter()
    for every in (16, 1):
        _, F_past = binpack._overflow_tabu(sizes, 100, K, init, 10**9, 0, 5, t - 1.0, every)
        _, F_0 = binpack._overflow_tabu(sizes, 100, K, init, 0, 0, 5, np.inf, every)
        assert F_past == F_0 > 0


def test_bin_packing_model_too_large_is_not_built(monkeypatch):
    """A CP-SAT bin-packing model over its size cap is skipped (no memory blow-up): the answer
    keeps the proved bound and says the model was skipped."""
    from routepack_opt.models import binpack as exact

    monkeypatch.setattr(exact, "CPSAT_MAX_VARS", 1)
    monkeypatch.setattr(exact, "ARCFLOW_MAX_ARCS", 0)  # force the CP-SAT route
    sizes = [49, 49, 49, 34, 34, 34, 17, 17, 17]  # FFD-hard: needs the exact model to close
    res = exact.solve_bin_packing(sizes, 100, max_bins=3, time_limit=5.0, presolve=False)
    assert "skipped" in res.method and res.lower_bound <= 3
    assert res.status in ("unknown", "feasible")

"""Packed micro-batches from a plan and replayed routes (routepack_opt.runtime.batches)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from routepack_opt.core.errors import InputError
from routepack_opt.core.plan import Plan
from routepack_opt.core.testing import random_layout, random_window
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import Window
from routepack_opt.runtime.batches import build_microbatches, routes_from_counts, sample_offsets, synthetic_tokens


def _plan(window, rows, dp, ep, seed=0):
    row, slot = random_layout(window.num_samples, rows, dp, np.random.default_rng(seed))
    E, L = window.num_experts, window.num_layers
    return Plan(Topology(dp=dp, ep=ep, capacity=window.total_tokens), rows,
                np.tile(np.arange(E), (L, 1)), row, slot)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_routes_from_counts_round_trip(seed):
    """Per-token routes rebuilt from counts aggregate back to exactly the same counts."""
    w = random_window(12, 3, 8, 3, max_len=15, seed=seed)
    routes = routes_from_counts(w, seed=seed)
    assert routes.shape == (w.total_tokens, 3, 3)
    back = Window.from_routes(w.lengths, routes, w.num_experts)  # also checks distinct top-k
    assert np.array_equal(back.counts, w.counts)


def test_microbatches_cover_rank_tokens_and_restore_order():
    """Each rank's R micro-batches hold its cells' samples packed, with correct cu_seqlens,
    positions, token/route slices, and restore_order puts outputs back in window order."""
    w = random_window(20, 2, 4, 2, max_len=9, seed=3)
    plan = _plan(w, rows=2, dp=4, ep=2)
    tokens = synthetic_tokens(w, vocab=50, seed=1)
    routes = routes_from_counts(w, seed=0)
    offs = sample_offsets(w.lengths)
    cells = plan.cells()
    seen = []
    for d in range(4):
        rb = build_microbatches(plan, w, d, tokens, routes)
        assert len(rb.microbatches) == plan.rows
        for r, mb in enumerate(rb.microbatches):
            assert mb.sample_ids.tolist() == cells[r][d]
            assert mb.lengths == w.lengths[cells[r][d]].tolist()
            assert mb.cu_seqlens.dtype == torch.int32 and mb.cu_seqlens[-1] == mb.num_tokens
            for i, a, b in zip(cells[r][d], mb.cu_seqlens[:-1].tolist(), mb.cu_seqlens[1:].tolist()):
                assert mb.position_ids_T[a:b].tolist() == list(range(w.lengths[i]))
                assert mb.tokens_T[a:b].tolist() == tokens[offs[i]:offs[i] + w.lengths[i]].tolist()
                assert torch.equal(mb.routes_TLK[a:b], torch.as_tensor(routes[offs[i]:offs[i] + w.lengths[i]]))
        # outputs = token_index itself: restoring gives the rank's tokens in ascending window order
        restored = rb.restore([mb.token_index_T for mb in rb.microbatches])
        mine = sorted(i for r in range(plan.rows) for i in cells[r][d])
        expect = np.concatenate([np.arange(offs[i], offs[i] + w.lengths[i]) for i in mine])
        assert restored.tolist() == expect.tolist()
        seen += expect.tolist()
    assert sorted(seen) == list(range(w.total_tokens))


def test_microbatches_reject_bad_input():
    """A plan that does not match the window, a rank outside 0..D-1, or wrong-shaped routes → InputError."""
    w = random_window(20, 2, 4, 2, max_len=9, seed=3)
    plan = _plan(w, rows=2, dp=4, ep=2)
    other = random_window(21, 2, 4, 2, max_len=9, seed=4)
    with pytest.raises(InputError):
        build_microbatches(plan, other, 0)
    with pytest.raises(InputError):
        build_microbatches(plan, w, 4)
    with pytest.raises(InputError):
        build_microbatches(plan, w, 0, routes_TLK=np.zeros((3, 2, 2), dtype=np.int64))

"""The set-partitioning LP of the block decomposition (:mod:`routepack_opt.models.layout_blocks`,
step 2): ``min Σ c_B λ_B`` s.t. every sample covered once and ``Σ λ_B = R·G``, over the enumerated
blocks, solved by HiGHS with column generation; its duals (π, μ) drive the reduced-cost filter.

Legend: m enumerated blocks, N samples.

Source: the Dantzig–Wolfe / Gilmore–Gomory master over enumerated columns (column generation).
"""

from __future__ import annotations

import math
import time

import numpy as np

from routepack_opt.models import _solvers

__all__ = ["block_members", "ColumnLp", "set_partitioning_duals"]


def block_members(masks: np.ndarray, N: int) -> np.ndarray:
    """[m, N] 0/1 membership of each sample in each block."""
    return ((masks[:, None] >> np.arange(N, dtype=np.int64)[None, :]) & 1).astype(np.int8)


class ColumnLp:
    """A HiGHS model built column-wise: rows first (bounds), then columns with sparse entries."""

    def __init__(self, row_lo, row_hi, time_limit: float):
        highspy = _solvers.highspy()
        self.h = h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("threads", _solvers.highs_threads(1))
        h.setOptionValue("time_limit", float(max(time_limit, 0.01)))
        row_lo = np.asarray(row_lo, dtype=np.float64)
        h.addRows(row_lo.size, row_lo, np.asarray(row_hi, dtype=np.float64), 0,
                  np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, np.float64))
        self.num_col = 0

    def add_cols(self, cost, lower, upper, cols: list[tuple[np.ndarray, np.ndarray]]):
        starts = np.zeros(len(cols), dtype=np.int32)
        idx, val = [], []
        n = 0
        for k, (ri, rv) in enumerate(cols):
            starts[k] = n
            idx.append(ri)
            val.append(rv)
            n += len(ri)
        idx = np.concatenate(idx).astype(np.int32) if idx else np.zeros(0, np.int32)
        val = np.concatenate(val).astype(np.float64) if val else np.zeros(0, np.float64)
        self.h.addCols(len(cols), np.asarray(cost, np.float64), np.asarray(lower, np.float64),
                       np.asarray(upper, np.float64), n, starts, idx, val)
        first = self.num_col
        self.num_col += len(cols)
        return np.arange(first, self.num_col)


def set_partitioning_duals(bits: np.ndarray, cost: np.ndarray, num_blocks: int, t_end: float):
    """Column generation for min Σ c λ, cover = 1, Σ λ = num_blocks, λ ≥ 0, over the enumerated
    blocks. Returns (π, μ), the duals of the last restricted master: the filter's identity holds
    for any duals; converged ones make it tight."""
    m, N = bits.shape
    big = 10.0 * (float(np.abs(cost).max(initial=1.0)) * num_blocks + 1.0)
    lp = ColumnLp(np.r_[np.ones(N), num_blocks], np.r_[np.ones(N), num_blocks], t_end - time.perf_counter())
    # artificial columns: one per row, so every restricted master is feasible
    lp.add_cols(np.full(N + 1, big), np.zeros(N + 1), np.full(N + 1, np.inf),
                [(np.array([r]), np.array([1.0])) for r in range(N + 1)])
    in_master = np.zeros(m, dtype=bool)
    lp.h.run()
    y = np.asarray(lp.h.getSolution().row_dual, dtype=np.float64)
    pi, mu = y[:N], float(y[N])
    value = math.inf
    for _ in range(200):
        rc = cost - bits @ pi - mu
        rc[in_master] = np.inf
        cand = np.flatnonzero(rc < -1e-9 * (1.0 + abs(value) if math.isfinite(value) else 1.0))
        if cand.size == 0:
            break
        if cand.size > 3000:
            cand = cand[np.argpartition(rc[cand], 3000)[:3000]]
        in_master[cand] = True
        cols = [(np.r_[np.flatnonzero(bits[j]), N], np.ones(int(bits[j].sum()) + 1)) for j in cand]
        lp.add_cols(cost[cand], np.zeros(cand.size), np.full(cand.size, np.inf), cols)
        lp.h.setOptionValue("time_limit", float(max(t_end - time.perf_counter(), 0.01)))
        lp.h.run()
        sol = lp.h.getSolution()
        y = np.asarray(sol.row_dual, dtype=np.float64)
        pi, mu = y[:N], float(y[N])
        value = lp.h.getInfo().objective_function_value
        if time.perf_counter() > t_end:
            break
    return pi, mu

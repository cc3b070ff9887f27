"""Exact decision for equal-count layouts (CP-SAT): do N samples fit R rows × D slots of capacity
C with every cell nonempty and exactly m = N / D samples per slot?

Legend: N samples, D DP slots, R rows, C cap, m = N / D.

Model:
    x[i,r,d] ∈ {0,1}                 sample i in cell (r, d)
    coverage  Σ_{r,d} x[i,r,d] = 1;  capacity  Σ_i len_i x[i,r,d] ≤ C;  nonempty  Σ_i x[i,r,d] ≥ 1
    counts    Σ_{r,i} x[i,r,d] = m   for every slot d
Symmetry (cost-free, so any permutation of slots and of rows inside a slot maps solutions to
solutions): the longest sample sits in cell (0, 0).
Used by :func:`routepack_opt.certify.certify_rows` only where bounds and constructions do not
close.
"""

from __future__ import annotations

import numpy as np

from routepack_opt.core.checks import (
    INT32_MAX,
    MAX_CAPACITY,
    MAX_WORKERS,
    check_int,
    check_time_limit,
    int_array,
)
from routepack_opt.core.errors import InputError
from routepack_opt.models import _solvers
from routepack_opt.models.binpack import cpsat_solver

__all__ = ["decide_equal_counts"]


def decide_equal_counts(lengths, dp: int, rows: int, capacity: int, time_limit: float,
                        hint=None, num_workers: int = 1) -> tuple[str, np.ndarray | None, np.ndarray | None]:
    """(status, row_N, slot_N): ``feasible`` with a layout, ``infeasible`` (proved), or
    ``unknown`` (time ran out)."""
    len_N = int_array(lengths, "lengths", ndim=1, lo=1)
    if len_N.size == 0:
        raise InputError("lengths: no samples")
    check_int(dp, "dp", 1, INT32_MAX)
    check_int(rows, "rows", 1, INT32_MAX)
    check_int(capacity, "capacity", 1, MAX_CAPACITY)
    time_limit = check_time_limit(time_limit, "time_limit")
    check_int(num_workers, "num_workers", 1, MAX_WORKERS)
    cp_model = _solvers.cp_model()
    N, D, R, C = len_N.size, int(dp), int(rows), int(capacity)
    if N % D or R * D > N or (len_N > C).any():
        return "infeasible", None, None
    m = N // D
    md = cp_model.CpModel()
    x = {(i, r, d): md.new_bool_var(f"x[{i},{r},{d}]") for i in range(N) for r in range(R) for d in range(D)}
    for i in range(N):  # coverage
        md.add_exactly_one(x[i, r, d] for r in range(R) for d in range(D))
    for r in range(R):
        for d in range(D):
            md.add(sum(int(len_N[i]) * x[i, r, d] for i in range(N)) <= C)  # capacity
            md.add_bool_or([x[i, r, d] for i in range(N)])  # nonempty
    for d in range(D):  # equal counts
        md.add(sum(x[i, r, d] for i in range(N) for r in range(R)) == m)
    md.add(x[int(np.argmax(len_N)), 0, 0] == 1)  # symmetry: the longest sample in cell (0, 0)
    if hint is not None:
        hr, hs = hint
        for (i, r, d), v in x.items():
            md.add_hint(v, int(hr[i] == r and hs[i] == d))
    solver = cpsat_solver(time_limit, num_workers)
    st = solver.solve(md)
    if st in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        row_N = np.empty(N, dtype=np.int64)
        slot_N = np.empty(N, dtype=np.int64)
        for (i, r, d), v in x.items():
            if solver.value(v):
                row_N[i], slot_N[i] = r, d
        return "feasible", row_N, slot_N
    if st == cp_model.INFEASIBLE:
        return "infeasible", None, None
    return "unknown", None, None

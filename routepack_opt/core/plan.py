"""The plan: a :class:`Placement` of experts plus a packing of samples into R rows × D cells (docs/formats.md).

Internally a layout is two arrays, ``row_N`` and ``slot_N`` (the cell of each sample); the JSON
form lists cells as ``R × D`` lists of sample ids.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from routepack_opt.core.checks import check_type
from routepack_opt.core.errors import InputError, load_document
from routepack_opt.core.inputs import INT_MAX, check_memory, int_matrix, is_int
from routepack_opt.core.io import atomic_write_text
from routepack_opt.core.layout import Layout, check_rows
from routepack_opt.core.objective import Objective, check_objective
from routepack_opt.core.placement import Placement, as_placement
from routepack_opt.core.report import PlanReport
from routepack_opt.core.topology import Topology

__all__ = ["Plan", "load_plan", "PLAN_FORMAT", "cells_from_assignment", "assignment_from_cells",
           "check_placement", "placement_from_ranks"]

PLAN_FORMAT = "routepack-plan/1"


def cells_from_assignment(row_N, slot_N, rows: int, dp: int) -> list[list[list[int]]]:
    """``R × D`` lists of sample ids (ascending) from per-sample row and slot."""
    row_N = np.asarray(row_N, dtype=np.int64)
    slot_N = np.asarray(slot_N, dtype=np.int64)
    cells: list[list[list[int]]] = [[[] for _ in range(dp)] for _ in range(rows)]
    order = np.lexsort((np.arange(row_N.size), slot_N, row_N))
    for i in order.tolist():
        cells[row_N[i]][slot_N[i]].append(i)
    return cells


def assignment_from_cells(cells, num_samples: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-sample (row, slot) from cells; -1 where a sample is in no cell. Raises on duplicates."""
    row_N = np.full(num_samples, -1, dtype=np.int64)
    slot_N = np.full(num_samples, -1, dtype=np.int64)
    for r, row in enumerate(cells):
        for d, cell in enumerate(row):
            for i in cell:
                if not 0 <= i < num_samples:
                    raise InputError(f"plan: sample id {i} in cell ({r}, {d}) is outside 0..{num_samples - 1}")
                if row_N[i] >= 0:
                    raise InputError(f"plan: sample {i} appears twice (cells ({row_N[i]}, {slot_N[i]}) and ({r}, {d}))")
                row_N[i], slot_N[i] = r, d
    return row_N, slot_N


def check_placement(placement, num_layers: int | None = None, num_experts: int | None = None) -> list[str]:
    """Violations of the placement rule: each ``π[l]`` a permutation of 0..E-1."""
    errs = []
    pl = np.asarray(placement)
    if pl.ndim != 2:
        return [f"placement: expected [L, E], got shape {pl.shape}"]
    L, E = pl.shape
    if num_layers is not None and L != num_layers:
        errs.append(f"placement: {L} layers, window has {num_layers}")
    if num_experts is not None and E != num_experts:
        errs.append(f"placement: {E} experts per layer, window has {num_experts}")
    ref = np.arange(E)
    for l in range(L):
        if not np.array_equal(np.sort(pl[l]), ref):
            errs.append(f"placement: layer {l} is not a permutation of 0..{E - 1}")
    return errs


def placement_from_ranks(rank_LE, load_LE, ep: int) -> np.ndarray:
    """Slots from per-expert ranks (each rank holding exactly M = E/P experts): rank p's experts
    take slots ``p·M ..`` by decreasing load, ties by expert id (the order LPT fills them)."""
    rank_LE = np.asarray(rank_LE, dtype=np.int64)
    load_LE = np.asarray(load_LE)
    L, E = rank_LE.shape
    M = E // ep
    placement = np.empty((L, E), dtype=np.int64)
    ids = np.arange(E)
    for l in range(L):
        order = np.lexsort((ids, -load_LE[l], rank_LE[l]))
        r = rank_LE[l, order]
        pos = ids - np.searchsorted(r, r)
        if r.min() < 0 or r.max() >= ep or not (np.bincount(r, minlength=ep) == M).all():
            raise InputError(f"placement: layer {l} does not give every rank the same number of experts")
        placement[l, order] = r * M + pos
    return placement


@dataclasses.dataclass(frozen=True)
class Plan:
    """A plan. ``placement`` is its :class:`Placement` (``phy2log[l, s]``, the logical expert
    of physical slot s; rank = slot // (S/P)), with or without replicas; ``row`` and ``slot``
    give each sample's cell, ``rows`` is R — together the plan's :attr:`layout`. ``score``,
    ``lower_bound``, ``certificate`` and ``report`` are reports:
    :func:`routepack_opt.core.evaluate.evaluate_plan` recomputes the scores.

    ``placement`` may be given as a permutation ``π[l, e]`` (an [L, E] array of slots): it is
    converted once, here, into the :class:`Placement` without replicas.

    Immutable: built once, complete (``routepack_opt.pipeline.build_plan`` builds a scored one;
    ``dataclasses.replace`` gives a changed copy). ``info`` is the report's JSON form."""

    topology: Topology
    rows: int
    placement: Placement
    row: np.ndarray
    slot: np.ndarray
    objective: Objective = Objective.MAX_SUM
    score: dict | None = None
    lower_bound: float | None = None
    certificate: dict | None = None
    report: PlanReport = PlanReport()
    layout: Layout = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.topology, Topology):
            raise InputError(f"plan: topology must be a Topology, got {type(self.topology).__name__}")
        object.__setattr__(self, "placement", as_placement(self.placement, self.topology.ep))
        try:
            object.__setattr__(self, "objective", check_objective(self.objective))
        except InputError as exc:
            raise InputError(f"plan: {exc}") from None
        if not isinstance(self.report, PlanReport):
            raise InputError(f"plan: report must be a PlanReport, got {type(self.report).__name__}")
        try:
            layout = Layout(self.row, self.slot, self.rows)
        except InputError:  # kept as built; validate() names what is wrong
            layout = None
        if layout is not None:
            object.__setattr__(self, "layout", layout)
            object.__setattr__(self, "rows", layout.rows)
            object.__setattr__(self, "row", layout.row)
            object.__setattr__(self, "slot", layout.slot)
        else:
            object.__setattr__(self, "row", np.asarray(self.row, dtype=np.int64))
            object.__setattr__(self, "slot", np.asarray(self.slot, dtype=np.int64))

    @classmethod
    def from_layout(cls, topology: Topology, placement, layout: Layout,
                    objective: Objective | str = Objective.MAX_SUM, **reports) -> Plan:
        """A plan from a :class:`Layout` (``reports``: ``score``, ``lower_bound``,
        ``certificate``, ``report``). ``placement``: a :class:`Placement` or a permutation
        ``π[l, e]``."""
        check_type(layout, "layout", Layout)
        return cls(topology, layout.rows, placement, layout.row, layout.slot, check_objective(objective), **reports)

    @property
    def replicas(self) -> Placement | None:
        """The placement when it holds replicas, else None (a shorthand for
        ``placement.redundant > 0``)."""
        return None if self.placement.is_permutation else self.placement

    @property
    def expert_placement(self) -> Placement:
        """The placement the evaluator scores (the same object as :attr:`placement`)."""
        return self.placement

    def placement_object(self) -> Placement:
        """The plan's :class:`Placement` (the same object as :attr:`placement`)."""
        return self.placement

    @property
    def info(self) -> dict:
        """The report as the JSON object of a plan file's ``info`` (a fresh dict each call)."""
        return self.report.to_json()

    @property
    def num_samples(self) -> int:
        return int(self.row.size)

    def cells(self) -> list[list[list[int]]]:
        return cells_from_assignment(self.row, self.slot, self.rows, self.topology.dp)

    def cell_index(self) -> np.ndarray:
        """``cell_N = row · D + slot``."""
        return self.row * self.topology.dp + self.slot

    # --- validation ------------------------------------------------------------------------
    def validate(self, window=None) -> list[str]:
        """Every violated rule in words (empty list: valid). With a window, also capacity and
        coverage against its samples."""
        topo = self.topology
        errs: list[str] = []
        try:
            check_rows(self.rows, "rows:")
        except InputError as exc:
            return [str(exc)]
        if self.rows < topo.min_rows:
            errs.append(f"rows: {self.rows} < min_rows {topo.min_rows}")
        if self.rows % topo.row_multiple:
            errs.append(f"rows: {self.rows} is not a multiple of row_multiple {topo.row_multiple}")
        L = E = None
        if window is not None:
            L, E = window.num_layers, window.num_experts
        pl = self.placement
        if L is not None and (pl.num_layers, pl.num_experts) != (L, E):
            errs.append(f"placement: for L={pl.num_layers}, E={pl.num_experts}; window has L={L}, E={E}")
        if pl.ep != topo.ep:
            errs.append(f"placement: built for ep={pl.ep}, topology has ep={topo.ep}")
        if pl.redundant != topo.redundant_experts:
            errs.append(f"placement: {pl.redundant} redundant slots per layer"
                        f"{'' if pl.redundant else ' (the plan has no replicas, no phy2log)'}, "
                        f"topology has redundant_experts={topo.redundant_experts}")
        n = self.num_samples if window is None else window.num_samples
        if self.row.shape != (n,) or self.slot.shape != (n,):
            errs.append(f"cells: cover {self.row.size} samples, window has {n}")
            return errs
        missing = np.flatnonzero(self.row < 0)
        if missing.size:
            errs.append(f"coverage: samples {missing[:10].tolist()} are in no cell")
        inr = (self.row >= 0) & (self.row < self.rows) & (self.slot >= 0) & (self.slot < topo.dp)
        if not inr[self.row >= 0].all():
            errs.append("cells: a sample sits outside the R × D grid")
            return errs
        cell = (self.row * topo.dp + self.slot)[self.row >= 0]
        members = np.bincount(cell, minlength=self.rows * topo.dp)
        empty = np.flatnonzero(members == 0)
        if empty.size:
            errs.append("nonempty: empty cells " + ", ".join(
                f"({c // topo.dp}, {c % topo.dp})" for c in empty[:10].tolist())
                + (f" (+{empty.size - 10} more)" if empty.size > 10 else ""))
        if topo.equal_samples_per_slot:
            if n % topo.dp:
                errs.append(f"equal samples: N={n} samples do not divide over D={topo.dp} slots")
            else:
                per_D = np.bincount(self.slot[self.row >= 0], minlength=topo.dp)
                bad = np.flatnonzero(per_D != n // topo.dp)
                if bad.size:
                    errs.append(f"equal samples: every slot must hold N/D = {n // topo.dp} samples; "
                                + ", ".join(f"slot {d} holds {int(per_D[d])}" for d in bad[:10].tolist())
                                + (f" (+{bad.size - 10} more)" if bad.size > 10 else ""))
        if window is not None:
            lens = window.lengths[self.row >= 0]
            tokens = np.bincount(cell, weights=lens, minlength=self.rows * topo.dp)
            over = np.flatnonzero(tokens > topo.capacity)
            for c in over[:10].tolist():
                errs.append(f"capacity: cell ({c // topo.dp}, {c % topo.dp}) holds {int(tokens[c])} "
                            f"tokens > capacity {topo.capacity}")
        return errs

    # --- JSON ----------------------------------------------------------------------------------
    def to_json(self) -> dict:
        d = {"format": PLAN_FORMAT, "topology": self.topology.to_dict(), "rows": int(self.rows),
             "placement": self.placement.first_slots.tolist(), "cells": self.cells(),
             "objective": self.objective}
        if self.placement.redundant:  # the format: phy2log and logcnt only when replicated
            d.update(self.placement.to_json())
        if self.score is not None:
            d["score"] = self.score
        if self.lower_bound is not None:
            d["lower_bound"] = float(self.lower_bound)
        if self.certificate is not None:
            d["certificate"] = self.certificate
        info = self.report.to_json()
        if info:
            d["info"] = info
        return d

    def save(self, path: str | Path) -> None:
        # Strict JSON (never Infinity/NaN): a non-finite number is refused before anything is written.
        atomic_write_text(path, dumps_strict(self.to_json(), indent=1) + "\n")

    @classmethod
    def from_json(cls, d: dict, num_samples: int | None = None) -> Plan:
        if not isinstance(d, dict):
            raise InputError("plan: expected a JSON object")
        if d.get("format") != PLAN_FORMAT:
            raise InputError(f"plan: format must be '{PLAN_FORMAT}', got {d.get('format')!r}")
        missing = [k for k in ("topology", "rows", "placement", "cells") if k not in d]
        if missing:
            raise InputError(f"plan: missing key(s) {', '.join(missing)}")
        topo = Topology.from_dict(d["topology"])
        rows = d["rows"]
        check_rows(rows, "plan: rows")
        cells = d["cells"]
        if (not isinstance(cells, list) or len(cells) != rows
                or not all(isinstance(r, list) and len(r) == topo.dp for r in cells)
                or not all(isinstance(c, list) for r in cells for c in r)
                or not all(is_int(i) for r in cells for c in r for i in c)):
            raise InputError(f"plan: cells must be {rows} rows × {topo.dp} slots of integer sample-id lists")
        bad = next((i for r in cells for c in r for i in c if not 0 <= i <= INT_MAX), None)
        if bad is not None:
            raise InputError(f"plan: sample id {bad} is outside 0..{INT_MAX}")
        placement = int_matrix(d["placement"], "plan: placement")  # no floats, strings or booleans
        if "phy2log" in d:
            pl = Placement.from_json(d, topo.ep)
            if not np.array_equal(placement, pl.first_slots):
                raise InputError("plan: placement must list each logical expert's first replica slot "
                                 "(the lowest slot holding it in phy2log)")
        else:
            errs = check_placement(placement)
            if errs:
                raise InputError("plan: " + errs[0])
            if placement.shape[1] % topo.ep:
                raise InputError(f"plan: placement: E={placement.shape[1]} not divisible by ep={topo.ep}")
            pl = Placement.from_permutation(placement, topo.ep)
        # Without the window's N, a plan holds samples 0..n-1, n the number of ids it lists: the
        # arrays are sized by that count, never by the largest id (id 10^8 would cost 1.6 GB).
        n = num_samples if num_samples is not None else sum(len(c) for r in cells for c in r)
        check_num_samples(n)
        row_N, slot_N = assignment_from_cells(cells, n)
        objective = d.get("objective", Objective.MAX_SUM)  # checked by __post_init__
        info = d.get("info", {})
        if not isinstance(info, dict):
            raise InputError(f"plan: info must be a JSON object, got {type(info).__name__} {info!r:.40}")
        return cls(topology=topo, rows=rows, placement=pl, row=row_N, slot=slot_N,
                   objective=objective, score=d.get("score"), lower_bound=d.get("lower_bound"),
                   certificate=d.get("certificate"), report=PlanReport.from_json(info))


def _jsonable(x):
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    return x


def dumps_strict(obj, **kw) -> str:
    """``json.dumps`` that refuses NaN and infinities (not JSON) with an InputError naming the cause."""
    try:
        return json.dumps(_jsonable(obj), allow_nan=False, **kw)
    except ValueError:
        raise InputError("result holds a non-finite number (NaN or infinity): the cost model or "
                         "input makes the score overflow; use finite, realistic coefficients") from None


def check_num_samples(n) -> int:
    """``num_samples`` of a plan: an integer in 0..2^31-1 whose per-sample arrays fit in memory."""
    if not is_int(n) and not isinstance(n, np.integer) or isinstance(n, (bool, np.bool_)):
        raise InputError(f"num_samples: expected an integer, got {type(n).__name__} {n!r:.40}")
    if not 0 <= int(n) <= INT_MAX:
        raise InputError(f"num_samples: {n} is out of range 0..{INT_MAX}")
    check_memory(16 * int(n), f"num_samples={n}")
    return int(n)


def load_plan(path: str | Path, num_samples: int | None = None) -> Plan:
    if num_samples is not None:
        num_samples = check_num_samples(num_samples)
    return load_document(path, "plan", "json", lambda d: Plan.from_json(d, num_samples=num_samples))

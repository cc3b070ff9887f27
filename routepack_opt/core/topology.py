"""Parallel topology: DP slots, EP size, EDP shards, micro-batch capacity and row rules (docs/model.md)."""

from __future__ import annotations

import dataclasses

import numpy as np

from routepack_opt.core.checks import shown
from routepack_opt.core.errors import InputError

__all__ = ["Topology"]

# Far above any real cluster or micro-batch, far inside int64 (token sums of a cell stay exact).
_LIMITS = {"dp": 2**24, "ep": 2**24, "capacity": 2**40, "min_rows": 2**24, "row_multiple": 2**24,
           "redundant_experts": 2**24}


@dataclasses.dataclass(frozen=True)
class Topology:
    """``dp`` DP slots in ``G = dp / ep`` shards of ``ep`` slots sharing one EP communicator.

    ``shard_of_slot[d]`` is slot d's shard (default ``d // ep``, Megatron order). ``capacity`` is
    the token cap of one micro-batch; a plan's rows R obey ``R ≥ min_rows`` and
    ``R % row_multiple == 0`` (pipeline parallelism, e.g. PP × VPP).

    Equal sample counts per slot (``equal_samples_per_slot=True``, default off): every DP slot
    holds exactly N / D samples over all its rows, as verl's DP balance (``_balance_batch``)
    dispatches equal sample *counts* to every rank. It needs N % D == 0 (checked against the
    window by :meth:`check_samples`, as verl asserts divisibility too). Rows are still free per
    slot: a slot's N / D samples may split unevenly over its R cells. What it changes:

    - validity: a layout whose slots hold unequal counts is invalid (``Plan.validate``);
    - R*: R rows are feasible iff the samples split into D groups of N / D samples, each packable
      into R nonempty bins of capacity C (``certify_rows``; bounds, a count-constrained
      first-fit, then CP-SAT where they do not close);
    - search: relocations stay within a slot (another row), swaps go anywhere (both keep every
      slot's count); seeds keep the counts (verl-kk, the joint-cost greedy with a per-slot
      quota; nemo-ffd is skipped);
    - exact models: Σ_{r,i} x[i, (r, d)] = N / D for every slot d (the block decomposition is
      skipped: its per-block row subproblems do not see slot totals).

    Redundant expert slots (``redundant_experts``, default 0): every MoE layer has
    S = E + redundant_experts physical expert slots, S/ep per rank, so a hot logical expert may
    have several replicas (docs/model.md, "Placement"). E + redundant_experts must be divisible by
    ep; 0 is a placement without replicas (a permutation).
    """

    dp: int
    ep: int
    capacity: int
    shard_of_slot: tuple[int, ...] | None = None
    min_rows: int = 1
    row_multiple: int = 1
    equal_samples_per_slot: bool = False
    redundant_experts: int = 0

    def __post_init__(self):
        if not isinstance(self.equal_samples_per_slot, (bool, np.bool_)):
            raise InputError("topology: equal_samples_per_slot must be true or false, got "
                             f"{shown(self.equal_samples_per_slot)}")
        object.__setattr__(self, "equal_samples_per_slot", bool(self.equal_samples_per_slot))
        for name in ("dp", "ep", "capacity", "min_rows", "row_multiple", "redundant_experts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise InputError(f"topology: {name} must be an integer, got {shown(value)}")
            if value < (0 if name == "redundant_experts" else 1):
                raise InputError(f"topology: {name} must be ≥ {0 if name == 'redundant_experts' else 1}, "
                                 f"got {value}")
            if value > _LIMITS[name]:
                raise InputError(f"topology: {name} = {value} is out of range (at most {_LIMITS[name]:,})")
            object.__setattr__(self, name, int(value))
        if self.dp % self.ep:
            raise InputError(
                f"topology: dp={self.dp} is not divisible by ep={self.ep} "
                "(each EDP shard holds exactly ep DP slots)"
            )
        G = self.dp // self.ep
        if self.shard_of_slot is None:
            sos = tuple(d // self.ep for d in range(self.dp))
        else:
            try:
                raw = list(self.shard_of_slot)
            except TypeError:
                raw = None
            # integers only: a float shard (0.5) would be truncated to another shard silently
            if raw is None or not all(isinstance(s, (int, np.integer)) and not isinstance(s, (bool, np.bool_))
                                      for s in raw):
                raise InputError("topology: shard_of_slot must be a list of integers") from None
            sos = tuple(int(s) for s in raw)
            if len(sos) != self.dp:
                raise InputError(f"topology: shard_of_slot has {len(sos)} entries for dp={self.dp}")
            if min(sos) < 0 or max(sos) >= G:  # before any array is sized by them (2^31, 2^64)
                raise InputError(f"topology: shard_of_slot must name shards 0..{G - 1}, got "
                                 f"{min(sos) if min(sos) < 0 else max(sos)}")
            sizes = np.bincount(np.asarray(sos, dtype=np.int64), minlength=G)
            if (sizes != self.ep).any():
                raise InputError(
                    f"topology: shard_of_slot must name shards 0..{G - 1}, each exactly ep={self.ep} "
                    f"times; got sizes {sizes.tolist()}"
                )
        object.__setattr__(self, "shard_of_slot", sos)

    @property
    def num_shards(self) -> int:
        """G = D / P."""
        return self.dp // self.ep

    G = num_shards

    def shard_array(self) -> np.ndarray:
        """``shard_D[d]``: the shard of DP slot d."""
        return np.asarray(self.shard_of_slot, dtype=np.int64)

    def slots_of_shard(self) -> np.ndarray:
        """``slots_GP[g, j]``: the j-th DP slot (ascending) of shard g."""
        shard_D = self.shard_array()
        return np.argsort(shard_D, kind="stable").reshape(self.num_shards, self.ep)

    def num_slots(self, num_experts: int) -> int:
        """S = E + redundant_experts physical expert slots per layer."""
        return num_experts + self.redundant_experts

    def check_experts(self, num_experts: int) -> None:
        """Raise unless S = E + redundant_experts is divisible by P (each EP rank holds S/P
        expert slots)."""
        if self.redundant_experts:
            S = num_experts + self.redundant_experts
            if S % self.ep:
                lo = self.redundant_experts - S % self.ep
                hi = lo + self.ep
                raise InputError(
                    f"--redundant-experts {self.redundant_experts}: E={num_experts} + "
                    f"{self.redundant_experts} = {S} slots is not divisible by ep={self.ep} "
                    f"(each EP rank holds the same number of slots); use "
                    + (f"{lo} or {hi}" if lo >= 0 else f"{hi}"))
            return
        if num_experts % self.ep:
            raise InputError(
                f"topology: E={num_experts} experts is not divisible by ep={self.ep} "
                "(each EP rank holds E/ep expert slots)"
            )

    def check_samples(self, num_samples: int) -> None:
        """Raise unless the window's N samples can be split equally over the slots (only with
        ``equal_samples_per_slot``)."""
        if self.equal_samples_per_slot and num_samples % self.dp:
            raise InputError(
                f"topology: equal_samples_per_slot needs N divisible by D, got N={num_samples} "
                f"samples and D={self.dp} DP slots (N % D = {num_samples % self.dp}): "
                f"drop {num_samples % self.dp} or add "
                f"{self.dp - num_samples % self.dp} samples (verl too requires the batch to divide "
                "by the DP size)")

    def samples_per_slot(self, num_samples: int) -> int | None:
        """N / D with ``equal_samples_per_slot`` (checked), else None."""
        if not self.equal_samples_per_slot:
            return None
        self.check_samples(num_samples)
        return num_samples // self.dp

    def row_ok(self, rows: int) -> bool:
        return rows >= self.min_rows and rows % self.row_multiple == 0

    def to_dict(self) -> dict:
        return {"dp": self.dp, "ep": self.ep, "capacity": self.capacity,
                "shard_of_slot": list(self.shard_of_slot), "min_rows": self.min_rows,
                "row_multiple": self.row_multiple,
                # written only when on: plans without the option stay byte-identical
                **({"equal_samples_per_slot": True} if self.equal_samples_per_slot else {}),
                **({"redundant_experts": self.redundant_experts} if self.redundant_experts else {})}

    @classmethod
    def from_dict(cls, d: dict) -> Topology:
        if not isinstance(d, dict):
            raise InputError("topology: expected an object with dp, ep, capacity")
        missing = [k for k in ("dp", "ep", "capacity") if k not in d]
        if missing:
            raise InputError(f"topology: missing key(s) {', '.join(missing)}")
        return cls(dp=d["dp"], ep=d["ep"], capacity=d["capacity"],
                   shard_of_slot=d.get("shard_of_slot"), min_rows=d.get("min_rows", 1),
                   row_multiple=d.get("row_multiple", 1),
                   equal_samples_per_slot=d.get("equal_samples_per_slot", False),
                   redundant_experts=d.get("redundant_experts", 0))

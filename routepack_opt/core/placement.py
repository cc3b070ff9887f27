"""Expert placement with replicas: the one :class:`Placement` type (docs/model.md, "Placement").

Legend: L layers, E logical experts, S = E + redundant physical expert slots per layer, P EP
ranks (each holds S/P consecutive slots: rank(s) = s // (S/P)), K the most replicas of one expert.

A placement is, per layer, ``phy2log[l, s]``: the logical expert held by physical slot s (EPLB's
and SGLang's convention). Every logical expert has ``logcnt[l, e] ≥ 1`` replicas; its replicas
in ascending slot order are ``log2phy[l, e, 0..logcnt-1]`` (padded with −1). Without redundant
slots (S = E) a placement is a permutation, and ``permutation()`` is today's ``π[l, e]``, the
physical slot of logical expert e (the two are inverse permutations of each other).

**Replica-selection rule** (``REPLICA_RULE = "even-local"``): each source DP slot splits its own
micro-batch's tokens of logical expert e evenly over e's replicas, in token order, round-robin
from an offset given by its EP rank q inside the shard: the t-th token of e in the micro-batch goes
to replica ``(t + q) mod k`` (k = logcnt). Replica j of e thus receives, from a micro-batch holding
c tokens of e,

    split(c, k, j, q) = ⌊c / k⌋ + [ (j − q) mod k < c mod k ]

tokens. The rule needs no global information (the dispatch computes each token's position among
the micro-batch's tokens of its expert anyway, to sort by expert), is the same on every rank, and
the rotation by q spreads the remainders of the P source slots of a shard over the replicas. The
one evaluator (:mod:`routepack_opt.core.evaluate`) scores exactly this integer split; the search
uses the linear surrogate c·n_p/k (n_p: replicas of e on rank p), which
:func:`surrogate_rank_matrix` builds.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from routepack_opt.core.errors import InputError

__all__ = ["Placement", "REPLICA_RULE", "split_counts", "as_placement", "slot_array"]

REPLICA_RULE = "even-local"


def split_counts(c: int, k: int, q: int) -> list[int]:
    """Tokens each of k replicas receives from a source slot with EP rank q holding c tokens
    of the expert (the rule above, in plain Python: the reference the kernels are tested on)."""
    base, rem = divmod(int(c), int(k))
    return [base + (1 if (j - q) % k < rem else 0) for j in range(k)]


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.array(a, dtype=np.int64)
    a.flags.writeable = False
    return a


@dataclasses.dataclass(frozen=True, eq=False)
class Placement:
    """``phy2log[l, s]`` for ``ep`` ranks and ``num_experts`` logical experts; checked when built.

    Rules: S = phy2log.shape[1] ≥ E and S % ep == 0; every value in 0..E-1; every logical expert
    in every layer has at least one slot (``logcnt ≥ 1``). Replicas of one expert may share a rank
    (pointless, but not wrong); the planners never do that."""

    phy2log: np.ndarray
    ep: int
    num_experts: int
    rule: str = REPLICA_RULE

    def __post_init__(self):
        if self.rule != REPLICA_RULE:
            raise InputError(f"placement: unknown replica rule {self.rule!r} (known: {REPLICA_RULE})")
        for name in ("ep", "num_experts"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise InputError(f"placement: {name} must be a positive integer, got {v!r}")
            object.__setattr__(self, name, int(v))
        try:
            p2l = np.asarray(self.phy2log)
        except (TypeError, ValueError):
            raise InputError("placement: phy2log must be L lists of S integers") from None
        if p2l.ndim != 2 or (p2l.size and p2l.dtype.kind not in "iu"):
            raise InputError(f"placement: phy2log must be an integer [L, S] array, got shape {list(p2l.shape)}")
        L, S = p2l.shape
        E = self.num_experts
        if S < E:
            raise InputError(f"placement: {S} physical slots for {E} logical experts (need S ≥ E)")
        if S % self.ep:
            raise InputError(f"placement: S={S} physical slots (E={E} + {S - E} redundant) is not "
                             f"divisible by ep={self.ep}; choose a redundant count with "
                             f"(E + redundant) % ep == 0")
        if p2l.size and (p2l.min() < 0 or p2l.max() >= E):
            raise InputError(f"placement: phy2log values must be logical experts 0..{E - 1}")
        p2l = _frozen(p2l)
        object.__setattr__(self, "phy2log", p2l)
        cnt = np.zeros((L, E), dtype=np.int64)
        for l in range(L):
            cnt[l] = np.bincount(p2l[l], minlength=E)
        missing = np.argwhere(cnt == 0)
        if missing.size:
            l, e = missing[0].tolist()
            raise InputError(f"placement: logical expert {e} has no slot at layer {l} "
                             f"({missing.shape[0]} (layer, expert) pairs without a slot)")
        object.__setattr__(self, "_logcnt", _frozen(cnt))

    # --- construction ---------------------------------------------------------------------
    @classmethod
    def from_permutation(cls, placement_LE, ep: int) -> Placement:
        """The placement of today's ``π[l, e]`` (slot of logical expert e): no replicas."""
        pl = np.asarray(placement_LE, dtype=np.int64)
        if pl.ndim != 2:
            raise InputError(f"placement: expected [L, E], got shape {list(pl.shape)}")
        L, E = pl.shape
        ref = np.arange(E)
        for l in range(L):
            if not np.array_equal(np.sort(pl[l]), ref):
                raise InputError(f"placement: layer {l} is not a permutation of 0..{E - 1}")
        p2l = np.empty_like(pl)
        for l in range(L):
            p2l[l, pl[l]] = ref
        return cls(p2l, ep, E)

    @classmethod
    def identity(cls, num_layers: int, num_experts: int, ep: int, redundant: int = 0) -> Placement:
        """Slot s holds expert ``s mod E``: today's identity, and with redundant slots a second
        copy of experts 0..redundant−1 (on other ranks than their first: slots e and e + E are
        ≥ E ≥ S/P apart). A placement that needs no loads (the deadline fallbacks)."""
        S = num_experts + redundant
        return cls(np.tile(np.arange(S, dtype=np.int64) % num_experts, (num_layers, 1)), ep, num_experts)

    @classmethod
    def from_ranks(cls, rank_LEK, logcnt_LE, ep: int, load_LE=None) -> Placement:
        """Slots from per-replica ranks: ``rank_LEK[l, e, j]`` is the rank of e's j-th replica
        (j < logcnt). Each rank's replicas take its slots by decreasing per-replica load
        (``load/logcnt``, ties by expert id); every rank must receive exactly S/P replicas."""
        rank_LEK = np.asarray(rank_LEK, dtype=np.int64)
        cnt = np.asarray(logcnt_LE, dtype=np.int64)
        L, E = cnt.shape
        S = int(cnt[0].sum()) if L else E
        if (cnt.sum(axis=1) != S).any():
            raise InputError("placement: every layer needs the same number of physical slots")
        if S % ep:
            raise InputError(f"placement: S={S} slots not divisible by ep={ep}")
        M = S // ep
        w_LE = np.zeros((L, E)) if load_LE is None else np.asarray(load_LE, dtype=np.float64) / cnt
        p2l = np.empty((L, S), dtype=np.int64)
        for l in range(L):
            e_R = np.repeat(np.arange(E), cnt[l])
            j_R = np.concatenate([np.arange(c) for c in cnt[l]])
            r_R = rank_LEK[l, e_R, j_R]
            if r_R.min() < 0 or r_R.max() >= ep or not (np.bincount(r_R, minlength=ep) == M).all():
                raise InputError(f"placement: layer {l} does not give every rank {M} slots")
            order = np.lexsort((e_R, -w_LE[l, e_R], r_R))
            r_sorted = r_R[order]
            pos = np.arange(S) - np.searchsorted(r_sorted, r_sorted)
            p2l[l, r_sorted * M + pos] = e_R[order]
        return cls(p2l, ep, E)

    # --- derived --------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return int(self.phy2log.shape[0])

    @property
    def num_slots(self) -> int:
        """S = E + redundant."""
        return int(self.phy2log.shape[1])

    @property
    def redundant(self) -> int:
        return self.num_slots - self.num_experts

    @property
    def slots_per_rank(self) -> int:
        return self.num_slots // self.ep

    @property
    def logcnt(self) -> np.ndarray:
        """``logcnt[l, e]``: replicas of logical expert e at layer l (≥ 1)."""
        return self._logcnt  # type: ignore[attr-defined]

    @property
    def is_permutation(self) -> bool:
        return self.redundant == 0

    def log2phy(self) -> np.ndarray:
        """``log2phy[l, e, j]``: slot of e's j-th replica (ascending slots), −1 past logcnt."""
        L, S = self.phy2log.shape
        K = int(self.logcnt.max()) if self.logcnt.size else 1
        out = np.full((L, self.num_experts, K), -1, dtype=np.int64)
        for l in range(L):
            order = np.argsort(self.phy2log[l], kind="stable")  # slots grouped by expert, ascending
            e_sorted = self.phy2log[l, order]
            j = np.arange(S) - np.searchsorted(e_sorted, e_sorted)
            out[l, e_sorted, j] = order
        return out

    def replica_ranks(self) -> np.ndarray:
        """``rank_LEK[l, e, j]``: rank of e's j-th replica, −1 past logcnt."""
        s = self.log2phy()
        return np.where(s >= 0, s // self.slots_per_rank, -1)

    @functools.cached_property
    def first_slots(self) -> np.ndarray:
        """``[L, E]``: the slot of each logical expert's first replica (the lowest slot holding
        it); ``π[l, e]`` without replicas, and a plan file's ``placement`` (docs/formats.md)."""
        return _frozen(self.log2phy()[:, :, 0])

    def permutation(self) -> np.ndarray:
        """``π[l, e]`` (slot of logical expert e) of a placement without replicas."""
        if self.redundant:
            raise InputError("placement: a placement with replicas is not a permutation")
        return self.first_slots

    def surrogate_rank_matrix(self) -> np.ndarray:
        """``F[l, e, p] = n_{e,p} / logcnt[l, e]``: the share of e's tokens the linear surrogate
        sends to rank p (n_{e,p} replicas of e on p). Without replicas, a 0/1 matrix."""
        L, E, P = self.num_layers, self.num_experts, self.ep
        F = np.zeros((L, E, P))
        rank_S = np.arange(self.num_slots) // self.slots_per_rank
        for l in range(L):
            np.add.at(F[l], (self.phy2log[l], rank_S), 1.0)
        return F / self.logcnt[:, :, None]

    def extra_slots_per_rank(self) -> float:
        """Slots a rank holds beyond E/P: redundant / P."""
        return self.redundant / self.ep

    def __eq__(self, other) -> bool:
        """Equal slots for the same ranks, experts and rule (an immutable value)."""
        if not isinstance(other, type(self)):
            return NotImplemented
        return (self.ep, self.num_experts, self.rule) == (other.ep, other.num_experts, other.rule) \
            and np.array_equal(self.phy2log, other.phy2log)

    def __hash__(self) -> int:
        return hash((self.ep, self.num_experts, self.rule, self.phy2log.shape, self.phy2log.tobytes()))

    # --- JSON -----------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"phy2log": self.phy2log.tolist(), "logcnt": self.logcnt.tolist(), "replica_rule": self.rule}

    @classmethod
    def from_json(cls, d: dict, ep: int, num_experts: int | None = None) -> Placement:
        from routepack_opt.core.inputs import int_matrix  # the one schema check of plan JSON

        p2l = int_matrix(d.get("phy2log"), "plan: phy2log")
        cnt_raw = d.get("logcnt")
        if cnt_raw is None:
            raise InputError("plan: a plan with phy2log needs logcnt (L lists of E integers)")
        cnt = int_matrix(cnt_raw, "plan: logcnt", lo=1, hi=p2l.shape[1], rows=p2l.shape[0])
        E = num_experts if num_experts is not None else (cnt.shape[1] if cnt.ndim == 2 else -1)
        pl = cls(p2l, ep, E, rule=d.get("replica_rule", REPLICA_RULE))
        if cnt.shape != pl.logcnt.shape or not np.array_equal(cnt, pl.logcnt):
            raise InputError("plan: logcnt does not match phy2log (logcnt[l][e] must count e's slots)")
        return pl


def slot_array(name: str, value) -> np.ndarray:
    """``value`` as an [L, E] int64 array, or an InputError naming ``name`` (ragged lists,
    floats, booleans and the like are refused, not truncated)."""
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{name}: cannot be read as an [L, E] array of expert slots ({exc})") from None
    if arr.dtype == object or arr.ndim != 2:
        raise InputError(f"{name}: expected an [L, E] array of integers, got "
                         f"{'a ragged or mixed list' if arr.dtype == object else f'shape {tuple(arr.shape)}'}")
    if arr.dtype.kind not in "iu":
        raise InputError(f"{name}: expected integers, got dtype {arr.dtype}")
    return arr.astype(np.int64)


def as_placement(value, ep: int, name: str = "placement") -> Placement:
    """The one conversion at the boundary: a :class:`Placement` as it is, or a permutation
    ``π[l, e]`` (an [L, E] array of slots) as the placement without replicas. Every layer below
    takes a :class:`Placement`."""
    if isinstance(value, Placement):
        return value
    return Placement.from_permutation(slot_array(name, value), ep)

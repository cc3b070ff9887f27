"""Megatron-Core: a logical→physical expert placement without touching the dispatcher.

Legend: T tokens, E experts (logical ids or physical slots), P EP size, M = E/P slots per rank,
L MoE layers.

Megatron lays experts out contiguously: EP rank p holds slots ``p·M .. p·M + M - 1``
(``local_expert_indices = ep_rank · num_local_experts + i``), and the token dispatcher reads
column s of the router's ``[T, E]`` ``probs``/``routing_map`` as slot s. So permuting those
columns by ``physical_to_logical`` between ``MoELayer.route`` and the dispatcher's preprocess
sends logical expert ``physical_to_logical[s]``'s tokens to slot s. The router itself (routing
replay, aux loss, expert bias, z-loss) stays logical: only its outputs are permuted.

Each slot's weights must hold the expert mapped to it: :func:`migrate_experts` moves, between
optimizer steps, every expert whose slot changes — its weights, grads, and the optimizer's fp32
master + ``exp_avg`` + ``exp_avg_sq`` (Megatron's ``DistributedOptimizer`` shards: each
expert-data-parallel rank moves the shard it owns, which lies at the same offsets on the source
and destination rank because every EP rank has the same local expert layout). It follows
``routepack_opt.runtime.materialize``: every read before any write (chains a→b→c→a are safe),
one ``all_to_all_single`` per EP group in a canonical order both sides derive from the two
placements.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

from routepack_opt.core.errors import InputError
from routepack_opt.core.placement import Placement
from routepack_opt.integrations import _deps

if TYPE_CHECKING:
    import torch

__all__ = ["ExpertMap", "remap_routing", "remap_routing_replicated", "apply_expert_placement",
           "PlacementHandle", "rank_token_counts", "expert_slot_tensors", "migrate_experts",
           "physical_to_logical", "sum_replica_grads"]


# --- maps with their direction -----------------------------------------------------------------
def _as_int_map(value, what: str) -> np.ndarray:
    """An integer numpy copy of a map (list, array or tensor); floats and bools are refused."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        value = value.detach().cpu().numpy()
    try:
        arr = np.array(value)
    except Exception:
        raise InputError(f"{what}: cannot be read as an array of expert ids") from None
    if arr.dtype.kind not in "iu":
        raise InputError(f"{what}: expected integer expert ids, got dtype {arr.dtype}")
    return arr.astype(np.int64)


def _permutation_error(row_E: np.ndarray, what: str) -> str | None:
    """Why ``row_E`` is not a permutation of 0..E-1 (None if it is), naming the first culprit."""
    E = row_E.shape[0]
    bad = np.flatnonzero((row_E < 0) | (row_E >= E))
    if bad.size:
        return f"{what}: id {int(row_E[bad[0]])} at position {int(bad[0])} is outside 0..{E - 1}"
    seen_E = np.bincount(row_E, minlength=E)
    if (seen_E != 1).any():
        twice, missing = int(np.flatnonzero(seen_E > 1)[0]), int(np.flatnonzero(seen_E == 0)[0])
        return (f"{what}: not a permutation of 0..{E - 1}: {twice} appears {int(seen_E[twice])} times, "
                f"{missing} is missing")
    return None


def _check_map_LE(map_LE: np.ndarray, what: str) -> None:
    if map_LE.ndim != 2 or map_LE.shape[1] < 1:
        raise InputError(f"{what}: expected [L, E] (one permutation per MoE layer), got shape {map_LE.shape}")
    for l in range(map_LE.shape[0]):
        err = _permutation_error(map_LE[l], f"{what} layer {l}" if map_LE.shape[0] > 1 else what)
        if err:
            raise InputError(err)


@dataclasses.dataclass(frozen=True, eq=False)
class ExpertMap:
    """A :class:`~routepack_opt.core.placement.Placement` without replicas, built from a map
    whose direction is named (a thin adapter: :attr:`placement` is what the seam uses).

    ``logical_to_physical[l, e]``: the slot (physical expert, ``p·M + i`` on EP rank p) of logical
    expert e at MoE layer l; ``physical_to_logical[l, s]``: the logical expert in slot s, its
    inverse. The two are both permutations of 0..E-1, so a bare array of either passes every
    check: build one with :meth:`from_logical_to_physical` (what RoutePack's planners, verl's
    ``expert_map_from_batch`` and slime's ``SlimeSchedule.logical_to_physical`` return) or
    :meth:`from_physical_to_logical` (what Megatron's dispatcher needs), and every function here
    picks the direction it needs.
    """

    logical_to_physical: np.ndarray  # [L, E]
    placement: Placement = dataclasses.field(init=False, repr=False)  # phy2log = physical_to_logical

    def __post_init__(self):
        l2p = _as_int_map(self.logical_to_physical, "logical_to_physical")
        if l2p.ndim == 1:
            l2p = l2p[None]
        _check_map_LE(l2p, "logical_to_physical")
        l2p.setflags(write=False)
        object.__setattr__(self, "logical_to_physical", l2p)
        # one rank holds every slot: the map carries no EP size (Megatron's p·M + i is the caller's)
        object.__setattr__(self, "placement", Placement.from_permutation(l2p, 1))

    @classmethod
    def from_logical_to_physical(cls, logical_to_physical) -> ExpertMap:
        """From ``[L, E]`` (or one layer's ``[E]``) logical expert → slot."""
        return cls(logical_to_physical)

    @classmethod
    def from_physical_to_logical(cls, physical_to_logical) -> ExpertMap:
        """From ``[L, E]`` (or one layer's ``[E]``) slot → logical expert."""
        p2l = _as_int_map(physical_to_logical, "physical_to_logical")
        p2l = p2l[None] if p2l.ndim == 1 else p2l
        _check_map_LE(p2l, "physical_to_logical")
        return cls(np.argsort(p2l, axis=1))

    @property
    def physical_to_logical(self) -> np.ndarray:
        """``[L, E]``: the logical expert in each slot."""
        return self.placement.phy2log.copy()

    @property
    def num_layers(self) -> int:
        return int(self.logical_to_physical.shape[0])

    @property
    def num_experts(self) -> int:
        return int(self.logical_to_physical.shape[1])

    def layer(self, l: int) -> ExpertMap:
        """MoE layer l's map alone (``[1, E]``)."""
        return ExpertMap(self.logical_to_physical[_layer_index(self.placement, l)][None])

    def __eq__(self, other) -> bool:
        return isinstance(other, ExpertMap) and np.array_equal(self.logical_to_physical, other.logical_to_physical)

    __hash__ = None  # type: ignore[assignment]


def physical_to_logical(logical_to_physical_LE) -> np.ndarray:
    """``p2l[l, s]``: the logical expert in slot s (inverse permutation per layer)."""
    l2p = _as_int_map(logical_to_physical_LE, "logical_to_physical")
    _check_map_LE(l2p, "logical_to_physical")
    return np.argsort(l2p, axis=-1).astype(np.int64)


def _placement_of(value) -> Placement | None:
    """The :class:`Placement` behind a map object (an :class:`ExpertMap`'s, or a Placement
    itself); None for a bare array or list, which carries no direction."""
    if isinstance(value, ExpertMap):
        return value.placement
    return value if isinstance(value, Placement) else None


def _layer_index(pl: Placement, layer) -> int:
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not 0 <= layer < pl.num_layers:
        raise InputError(f"layer: expected an index in 0..{pl.num_layers - 1}, got {layer!r}")
    return int(layer)


_DIRECTION = ("pass physical_to_logical= (slot → expert), logical_to_physical= (expert → slot, what the "
              "schedules return) or an ExpertMap")


def _one_layer_p2l(who: str, placement, physical_to_logical, logical_to_physical, layer,
                   num_experts: int | None) -> np.ndarray:
    """The ``[E]`` slot → logical map of one layer, from exactly one of an :class:`ExpertMap`
    (with ``layer`` when it has several), ``physical_to_logical=[E]`` or ``logical_to_physical=[E]``."""
    given = [x is not None for x in (placement, physical_to_logical, logical_to_physical)]
    if sum(given) != 1:
        raise InputError(f"{who}: {_DIRECTION}" if not any(given) else f"{who}: give one map (an ExpertMap, "
                         "physical_to_logical= or logical_to_physical=), not several")
    if placement is not None:
        pl = _placement_of(placement)
        if pl is None:
            raise InputError(f"{who}: a bare array has no direction; {_DIRECTION}")
        if pl.redundant:
            raise InputError(f"{who}: a replicated Placement needs source_rank= (this rank's EP rank)")
        if layer is None and pl.num_layers != 1:
            raise InputError(f"{who}: the map has {pl.num_layers} layers; pass layer=l for this MoE layer")
        row_E = pl.phy2log[0 if layer is None else _layer_index(pl, layer)]
    else:
        if layer is not None:
            raise InputError(f"{who}: layer= selects a row of an ExpertMap; pass this layer's [E] map alone")
        what = "physical_to_logical" if physical_to_logical is not None else "logical_to_physical"
        row = _as_int_map(physical_to_logical if physical_to_logical is not None else logical_to_physical, what)
        if row.ndim != 1:
            raise InputError(f"{what}: expected one layer's map [E], got shape {row.shape} (for an [L, E] map "
                             "pass row l, or ExpertMap(...) with layer=l)")
        if num_experts is not None and row.shape[0] != num_experts:
            raise InputError(f"{what}: {row.shape[0]} entries, but the layer has {num_experts} experts")
        err = _permutation_error(row, what)
        if err:
            raise InputError(err)
        row_E = row if physical_to_logical is not None else np.argsort(row).astype(np.int64)
    if num_experts is not None and row_E.shape[0] != num_experts:
        raise InputError(f"{who}: the map has {row_E.shape[0]} experts, the layer has {num_experts}")
    return row_E


def _layer_num_experts(moe_layer) -> int | None:
    n = getattr(getattr(moe_layer, "config", None), "num_moe_experts", None)
    return int(n) if isinstance(n, (int, np.integer)) and not isinstance(n, bool) else None


# --- the seam ----------------------------------------------------------------------------------
def _perm_index(physical_to_logical_E, E: int, device):
    torch = _deps.torch()

    pl = _placement_of(physical_to_logical_E)
    if pl is None:
        row = _as_int_map(physical_to_logical_E, "physical_to_logical")
    elif pl.redundant:
        raise InputError("remap_routing: a replicated Placement needs source_rank= (this rank's EP "
                         "rank q: the even-local rule starts each expert's round-robin at q)")
    elif pl.num_layers != 1:
        raise InputError(f"physical_to_logical: the map has {pl.num_layers} layers; pass .layer(l)")
    else:
        row = pl.phy2log[0]
    if row.ndim != 1:
        raise InputError(f"physical_to_logical: expected one layer's map [E], got shape {row.shape}")
    if row.shape[0] != E:
        raise InputError(f"probs and routing_map have {E} columns but the map has {row.shape[0]} experts: "
                         "pass Megatron's [T, E] outputs over all experts (top-k ids [T, k]: scatter them "
                         "into a [T, E] mask first)")
    err = _permutation_error(row, "physical_to_logical")
    if err:
        raise InputError(err)
    return torch.as_tensor(np.array(row), dtype=torch.long, device=device)


def _check_router_outputs(probs, routing_map) -> None:
    if probs.shape != routing_map.shape or probs.dim() != 2:
        raise InputError(f"probs {tuple(probs.shape)} and routing_map {tuple(routing_map.shape)} must both be [T, E]")
    torch = _deps.torch()
    if routing_map.dtype != torch.bool and bool(((routing_map != 0) & (routing_map != 1)).any()):
        raise InputError(f"routing_map: holds values other than 0/1 (top-k expert ids [T, k]?); remap_routing "
                         f"takes Megatron's boolean [T, E] routing_map, got {routing_map.dtype} "
                         f"{tuple(routing_map.shape)}")


def remap_routing(probs, routing_map, physical_to_logical_E, *, source_rank: int | None = None,
                  layer: int | None = None):
    """Permute the router's ``[T, E]`` outputs from logical columns to physical slots: column s
    of the result is logical expert ``physical_to_logical_E[s]`` (an ``[E]`` array or a one-layer
    :class:`ExpertMap`).

    With replicas, ``physical_to_logical_E`` is a :class:`~routepack_opt.core.placement.Placement`
    (``layer=`` picks its MoE layer when it has several) and ``source_rank`` this rank's EP rank
    q: see :func:`remap_routing_replicated`."""
    if source_rank is not None:
        pl = _placement_of(physical_to_logical_E)
        if pl is None:
            raise InputError("remap_routing: source_rank= goes with a Placement (a bare array has no replicas)")
        return remap_routing_replicated(probs, routing_map, pl, source_rank, layer)
    if layer is not None:
        raise InputError("remap_routing: layer= goes with a replicated Placement and source_rank=")
    _check_router_outputs(probs, routing_map)
    idx = _perm_index(physical_to_logical_E, probs.shape[1], probs.device)
    return probs.index_select(1, idx), routing_map.index_select(1, idx)


def _replica_columns(placement: Placement, layer: int | None, E: int):
    """``(phy2log_S, logcnt_S, j_S)`` of one MoE layer: slot s holds logical expert phy2log[s],
    which has logcnt_S[s] replicas; s is its replica j_S[s] (ascending slot order)."""
    if placement.num_experts != E:
        raise InputError(f"probs and routing_map have {E} columns but the placement has "
                         f"{placement.num_experts} logical experts")
    if layer is None:
        if placement.num_layers != 1:
            raise InputError(f"remap_routing: the placement has {placement.num_layers} layers; pass layer=l")
        layer = 0
    layer = _layer_index(placement, layer)
    p2l_S = placement.phy2log[int(layer)]
    log2phy_EK = placement.log2phy()[int(layer)]
    j_S = np.empty_like(p2l_S)
    for e in range(E):
        slots = log2phy_EK[e][log2phy_EK[e] >= 0]
        j_S[slots] = np.arange(slots.size)
    return p2l_S, placement.logcnt[int(layer)][p2l_S], j_S


def remap_routing_replicated(probs, routing_map, placement: Placement, source_rank: int,
                             layer: int | None = None):
    """The router's ``[T, E]`` logical outputs → ``[T, S]`` physical slots (S = E + redundant)
    under the even-local rule (:mod:`routepack_opt.core.placement`, the rule the planner scores):
    the t-th token (row order) routed to logical expert e goes to e's replica
    ``j = (t + source_rank) mod k``, slot ``log2phy[e, j]``; its prob goes with it. Every token
    keeps its top-k: one replica of each chosen expert. The layer's experts and token dispatcher
    must be built for S experts (``num_moe_experts = S``, S/P per EP rank) while the router keeps
    its E logical outputs."""
    torch = _deps.torch()

    _check_router_outputs(probs, routing_map)
    if isinstance(source_rank, bool) or not isinstance(source_rank, (int, np.integer)) or source_rank < 0:
        raise InputError(f"source_rank: expected this rank's EP rank (an integer ≥ 0), got {source_rank!r}")
    E = int(probs.shape[1])
    p2l_S, k_S, j_S = _replica_columns(placement, layer, E)
    dev = probs.device
    p2l = torch.as_tensor(np.array(p2l_S), dtype=torch.long, device=dev)
    k = torch.as_tensor(k_S, dtype=torch.long, device=dev)
    j = torch.as_tensor(j_S, dtype=torch.long, device=dev)
    routed_TE = routing_map.bool()
    t_TE = torch.cumsum(routed_TE.long(), dim=0) - 1  # position among the tokens routed to e
    chosen_TS = routed_TE[:, p2l] & ((t_TE[:, p2l] + int(source_rank)) % k == j)
    probs_TS = torch.where(chosen_TS, probs[:, p2l], torch.zeros((), dtype=probs.dtype, device=dev))
    return probs_TS, chosen_TS.to(routing_map.dtype)


def rank_token_counts(routing_map_TE, ep_size: int):
    """Token copies each EP rank receives: ``[P]`` from a physical ``routing_map [T, E]``."""
    T, E = routing_map_TE.shape
    if E % ep_size:
        raise InputError(f"E={E} is not divisible by ep_size={ep_size}")
    return routing_map_TE.reshape(T, ep_size, E // ep_size).sum(dim=(0, 2))


@dataclasses.dataclass
class PlacementHandle:
    """The wrapped layer's current map; :meth:`set` switches it (after :func:`migrate_experts`),
    :meth:`remove` restores the layer's own ``route``."""

    layer: Any
    physical_to_logical: Any  # torch.LongTensor [E] on the router's device (lazily moved)
    _orig_route: object = None
    num_experts: int | None = None
    # with replicas: (Placement, source_rank, layer) for remap_routing_replicated
    replicated: tuple | None = None

    def set(self, placement: ExpertMap | Placement | None = None, *, physical_to_logical=None,
            logical_to_physical=None, layer: int | None = None, source_rank: int | None = None) -> None:
        """Switch to a new map, checked now (not at the next ``route()``): an :class:`ExpertMap`
        (``layer=l`` when it has several layers) or one layer's ``[E]`` map by keyword; or a
        replicated :class:`~routepack_opt.core.placement.Placement` with ``source_rank=``."""
        self._switch("set", placement, physical_to_logical, logical_to_physical, layer, source_rank)

    def _switch(self, who: str, placement, physical_to_logical, logical_to_physical, layer,
                source_rank=None) -> None:
        torch = _deps.torch()

        if source_rank is not None:  # the even-local replica rule (any Placement, or an ExpertMap: k = 1)
            pl = _placement_of(placement)
            if pl is None or physical_to_logical is not None or logical_to_physical is not None:
                raise InputError(f"{who}: source_rank= goes with one map, a Placement (or an ExpertMap)")
            if isinstance(source_rank, bool) or not isinstance(source_rank, (int, np.integer)) or source_rank < 0:
                raise InputError(f"{who}: source_rank= must be this rank's EP rank (an integer ≥ 0), "
                                 f"got {source_rank!r}")
            if self.num_experts is not None and pl.num_experts != self.num_experts:
                raise InputError(f"{who}: the placement has {pl.num_experts} logical experts, the "
                                 f"router {self.num_experts}")
            _replica_columns(pl, layer, pl.num_experts)  # checks layer now
            self.replicated = (pl, int(source_rank), layer)
            self.physical_to_logical = None
            return
        self.replicated = None
        row_E = _one_layer_p2l(who, placement, physical_to_logical, logical_to_physical, layer, self.num_experts)
        self.num_experts = int(row_E.shape[0])
        self.physical_to_logical = torch.as_tensor(np.array(row_E), dtype=torch.long)

    def remove(self) -> None:
        if "route" in vars(self.layer):
            del self.layer.route


def apply_expert_placement(moe_layer, placement: ExpertMap | Placement | None = None, *,
                           physical_to_logical=None, logical_to_physical=None, layer: int | None = None,
                           source_rank: int | None = None, num_logical_experts: int | None = None
                           ) -> PlacementHandle:
    """Wrap ``moe_layer.route`` (Megatron-Core ``MoELayer``) so its ``(probs, routing_map)`` come
    out in physical slot order; returns a handle to switch or undo.

    The map, checked here (a permutation of the layer's ``config.num_moe_experts`` experts):
    an :class:`ExpertMap` (with ``layer=l`` when it holds several MoE layers), or this layer's
    ``[E]`` map by keyword, ``physical_to_logical=`` or ``logical_to_physical=``. A bare array
    is refused: both directions are permutations, so nothing could catch the wrong one.

    Replicas: a :class:`~routepack_opt.core.placement.Placement` with ``source_rank=`` (this
    rank's EP rank) makes ``route()`` return ``[T, S]`` slot columns by the even-local rule
    (:func:`remap_routing_replicated`); the layer's experts and dispatcher hold S slots while its
    router keeps E logical outputs (``num_logical_experts=E`` checks the placement against it;
    ``config.num_moe_experts`` is then S).
    """
    if not hasattr(moe_layer, "route"):
        raise InputError("apply_expert_placement: the layer has no route() (Megatron-Core MoELayer expected)")
    if "route" in vars(moe_layer):
        raise InputError("apply_expert_placement: this layer already has a placement; use the handle's set()")
    orig = moe_layer.route
    n_logical = num_logical_experts if source_rank is not None else _layer_num_experts(moe_layer)
    handle = PlacementHandle(moe_layer, None, orig, n_logical)
    handle._switch("apply_expert_placement", placement, physical_to_logical, logical_to_physical, layer,
                   source_rank)

    def route(hidden_states, *args, **kwargs):
        probs, routing_map = orig(hidden_states, *args, **kwargs)
        if handle.replicated is not None:
            pl, q, l = handle.replicated
            return remap_routing_replicated(probs, routing_map, pl, q, l)
        idx = handle.physical_to_logical  # checked by set(): only its width against the router's
        if idx.device != probs.device:
            idx = handle.physical_to_logical = idx.to(probs.device)
        if probs.dim() != 2 or probs.shape[1] != idx.numel():
            raise InputError(f"apply_expert_placement: route() returned probs {tuple(probs.shape)}; the map has "
                             f"{idx.numel()} experts")
        return probs.index_select(1, idx), routing_map.index_select(1, idx)

    moe_layer.route = route
    return handle


def expert_slot_tensors(experts, optimizer=None, include_grads: bool = True) -> list[list]:
    """Per local slot, every tensor that belongs to that expert, in a fixed order: parameters
    (``SequentialMLP.local_experts[s]``; for grouped MLPs the parameters named ``weight{s}`` /
    ``bias{s}``), their grads, and optimizer state — a torch optimizer's per-parameter tensors,
    or a Megatron ``DistributedOptimizer``'s fp32 master + ``exp_avg`` + ``exp_avg_sq`` shard
    (``_get_main_param_and_optimizer_states``) where this rank owns one."""
    torch = _deps.torch()

    per_slot = _slot_params(experts, "expert_slot_tensors")
    out = []
    for params in per_slot:
        ts = []
        for p in params:
            ts.append(p.data)
            if include_grads and p.grad is not None:
                ts.append(p.grad)
            if include_grads and getattr(p, "main_grad", None) is not None:
                ts.append(p.main_grad)
            ts.extend(_optimizer_tensors(optimizer, p, torch))
        out.append(ts)
    return out


def _slot_params(experts, who: str) -> list[list]:
    """Per local slot, the expert's parameters: a ``SequentialMLP`` (``local_experts``), a grouped
    MLP (``weight{s}`` / ``bias{s}``), or already a list of per-slot parameter lists."""
    if hasattr(experts, "local_experts"):
        return [list(m.parameters()) for m in experts.local_experts]
    n = getattr(experts, "num_local_experts", None)
    if n is not None:
        return [[p for name, p in experts.named_parameters()
                 if name.rsplit(".", 1)[-1] in (f"weight{s}", f"bias{s}")] for s in range(n)]
    if isinstance(experts, (list, tuple)) and all(isinstance(x, (list, tuple)) for x in experts):
        return [list(x) for x in experts]
    raise InputError(f"{who}: expected a SequentialMLP (local_experts), a grouped MLP with "
                     "num_local_experts, or a list of per-slot parameter lists")


def _grad_of(p, grad_attr: str | None, torch):
    """The tensor holding p's gradient: ``main_grad`` (Megatron's DDP grad buffer) when p has one,
    else ``.grad`` (zeros when backward left it None: a replica that got no tokens)."""
    if grad_attr in (None, "main_grad") and getattr(p, "main_grad", None) is not None:
        return p.main_grad
    if grad_attr == "main_grad":
        raise InputError("sum_replica_grads: grad_attr='main_grad' but a parameter has no main_grad")
    if p.grad is None:
        p.grad = torch.zeros_like(p)
    return p.grad


def sum_replica_grads(experts, placement: Placement, *, ep_rank: int = 0, group=None,
                      layer: int | None = None, grad_attr: str | None = None) -> dict:
    """Give every copy of a replicated expert its expert's whole gradient (Megatron seam).

    With replicas each slot's backward leaves a *partial* gradient ``g_j`` (the tokens its
    replica j got). For every logical expert with ``logcnt > 1`` this replaces every local copy's
    gradient by ``((g_0 + g_1) + …) + g_{k-1}``, in replica order (ascending global slot), the
    same bits on every holder; one ``all_to_all_single`` of raw bytes over the EP ``group``
    (the exchange plan and the sum are :mod:`routepack_opt.runtime.replicas`'s, shared).

    ``experts``: this rank's experts of every MoE layer of ``placement`` in order (a list, one
    ``SequentialMLP`` / grouped MLP / list of per-slot parameter lists per layer), or one layer's
    with ``layer=l``. ``ep_rank``: this rank's EP rank (``placement.ep`` ranks, ``S/ep`` local
    slots each). ``grad_attr``: None takes each parameter's ``main_grad`` (Megatron's DDP grad
    buffer, where gradient accumulation fusion writes) when it has one, else ``.grad``;
    ``"main_grad"`` / ``"grad"`` force one. Every rank of the EP group calls it, after backward and
    before ``optimizer.step()`` (docs/api.md: where, with DDP and the DistributedOptimizer).
    Returns ``{"replicated_experts", "bytes_sent"}`` (this rank's)."""
    torch = _deps.torch()
    from routepack_opt.runtime.replicas import exchange_plan, sum_slot_partials

    who = "sum_replica_grads"
    pl = _placement_of(placement)
    if pl is None:
        raise InputError(f"{who}: expected a routepack_opt.core.placement.Placement, got {type(placement).__name__}")
    placement = pl
    if grad_attr not in (None, "main_grad", "grad"):
        raise InputError(f"{who}: grad_attr must be None, 'main_grad' or 'grad', got {grad_attr!r}")
    P = placement.ep
    if isinstance(ep_rank, bool) or not isinstance(ep_rank, (int, np.integer)) or not 0 <= ep_rank < P:
        raise InputError(f"{who}: ep_rank must be in 0..{P - 1} (the placement has ep={P}), got {ep_rank!r}")
    if layer is not None:
        p2l_LS = placement.phy2log[_layer_index(placement, layer)][None]
        experts_L = [experts]
    else:
        if isinstance(experts, (list, tuple)) and not _is_slot_lists(experts):
            experts_L = list(experts)
        elif placement.num_layers == 1:
            experts_L = [experts]
        else:
            raise InputError(f"{who}: the placement has {placement.num_layers} MoE layers: pass a list of "
                             "that many layers' experts, or one layer's with layer=l")
        if len(experts_L) != placement.num_layers:
            raise InputError(f"{who}: {len(experts_L)} layers' experts for a placement of "
                             f"{placement.num_layers} MoE layers")
        p2l_LS = placement.phy2log
    M = placement.slots_per_rank
    grads_LS = []
    for l, ex in enumerate(experts_L):
        params_S = _slot_params(ex, who)
        if len(params_S) != M:
            raise InputError(f"{who}: layer {l} has {len(params_S)} local slots on this rank; the placement "
                             f"has {M} (S={placement.num_slots} over ep={P})")
        grads_LS.append([[_grad_of(p, grad_attr, torch) for p in ps] for ps in params_S])
    if P > 1:
        dist = _deps.torch_distributed()
        if not dist.is_initialized() or dist.get_world_size(group) != P:
            raise InputError(f"{who}: the placement has ep={P}: call it on every rank of an initialized "
                             f"EP process group of {P} ranks (group=)")
    plan = exchange_plan(p2l_LS, P, int(ep_rank))
    sent = sum_slot_partials(grads_LS, plan, P, int(ep_rank), group)
    return {"replicated_experts": plan.num_replicated, "bytes_sent": int(sent)}


def _is_slot_lists(experts) -> bool:
    """One layer given as per-slot parameter lists (a list of lists of tensors)."""
    return bool(experts) and all(isinstance(x, (list, tuple)) for x in experts) and \
        all(hasattr(t, "shape") for x in experts for t in x)


def _optimizer_tensors(optimizer, p, torch) -> list:
    if optimizer is None:
        return []
    get = getattr(optimizer, "_get_main_param_and_optimizer_states", None)
    if get is not None:  # Megatron DistributedOptimizer
        try:
            d = get(p)
        except KeyError:  # this rank owns no shard of p
            return []
        return [d[k] for k in sorted(d) if torch.is_tensor(d[k]) and d[k].dim() > 0]
    state = getattr(optimizer, "state", {}).get(p, {})
    return [state[k] for k in sorted(state) if torch.is_tensor(state[k]) and state[k].dim() > 0]


def _slot_map(value, what: str) -> Placement:
    """A map for :func:`migrate_experts`: a Placement, an ExpertMap's, or a bare ``[L, E]``
    array read as slot → logical expert (the direction that function documents)."""
    pl = _placement_of(value)
    if pl is not None:
        return pl
    p2l = _as_int_map(value, what)
    if p2l.ndim != 2:
        raise InputError(f"{what}: expected [L, E] (one permutation per MoE layer), got shape {p2l.shape}")
    _check_map_LE(p2l, what)
    return Placement(p2l, 1, p2l.shape[1])


def _raw(tensors) -> torch.Tensor:
    torch = _deps.torch()

    return torch.cat([t.detach().reshape(-1).view(torch.uint8).clone() for t in tensors])


def _write(tensors, raw) -> None:
    off = 0
    for t in tensors:
        n = t.numel() * t.element_size()
        t.copy_(raw[off:off + n].view(t.dtype).view(t.shape))
        off += n


def migrate_experts(slot_tensors, old_physical_to_logical, new_physical_to_logical, *, ep_rank: int = 0,
                    ep_size: int = 1, group=None) -> dict:
    """Move experts whose slot changes from the old to the new placement.

    ``slot_tensors[l][s]``: this rank's tensors of local slot s at MoE layer l (e.g.
    :func:`expert_slot_tensors` per layer); ``*_physical_to_logical[l, s]`` global maps ``[L, E]``,
    identical on every rank of the EP ``group`` (or :class:`ExpertMap` s, which carry their
    direction). With replicas both maps are :class:`~routepack_opt.core.placement.Placement` s
    (``phy2log [L, S]``, S/P local slots): a slot whose expert changes copies it from an old holder
    (one on its own rank if any), so a new replica starts as an exact copy (weights, grads,
    optimizer state; a DistributedOptimizer's shard at the same offsets) and a dropped one is
    overwritten. Returns what moved (the same ``experts_moved`` on every rank)."""
    torch = _deps.torch()
    dist = _deps.torch_distributed()

    L = len(slot_tensors)
    old_pl, new_pl = (_slot_map(m, f"{name}_physical_to_logical")
                      for name, m in (("old", old_physical_to_logical), ("new", new_physical_to_logical)))
    old, new = old_pl.phy2log, new_pl.phy2log
    if old.shape != new.shape or old.shape[0] != L or old_pl.num_experts != new_pl.num_experts:
        raise InputError(f"placements must both be [L={L}, S] over the same experts, got {old.shape} "
                         f"and {new.shape} (the number of slots S = E + redundant is fixed)")
    E = old.shape[1]  # slots per layer (E, or S = E + redundant with replicas)
    if E % ep_size:
        raise InputError(f"E={E} is not divisible by ep_size={ep_size}")
    M = E // ep_size
    if any(len(s) != M for s in slot_tensors):
        raise InputError(f"each layer needs {M} local slots on this rank")
    local: list[tuple[int, int, int]] = []
    send: dict[int, list[tuple[int, int]]] = {q: [] for q in range(ep_size)}
    recv: dict[int, list[tuple[int, int]]] = {q: [] for q in range(ep_size)}
    moved = 0
    with torch.no_grad():
        for l in range(L):  # canonical order: layer, then destination slot
            for dst in np.flatnonzero(old[l] != new[l]).tolist():
                # the source: the expert's old holder on the destination rank if any, else old
                # replica dst mod k (every holder is identical; one holder without replicas)
                holders = np.flatnonzero(old[l] == new[l, dst])
                pd = dst // M
                same = holders[holders // M == pd]
                src = int(same[0]) if same.size else int(holders[dst % holders.size])
                ps = src // M
                moved += 1
                if ps == ep_rank and pd == ep_rank:
                    local.append((l, src - ps * M, dst - pd * M))
                elif ps == ep_rank:
                    send[pd].append((l, src - ps * M))
                elif pd == ep_rank:
                    recv[ps].append((l, dst - pd * M))
        local_raw = [(l, d, _raw(slot_tensors[l][s])) for (l, s, d) in local]  # all reads first
        n_send = sum(len(v) for v in send.values())
        n_recv = sum(len(v) for v in recv.values())
        bytes_sent = bytes_recv = 0
        received = []
        if ep_size > 1 and moved:  # same on every rank: all call the collective or none
            sizes = [sum(t.numel() * t.element_size() for t in slot_tensors[l][0]) for l in range(L)]
            device = slot_tensors[0][0][0].device
            parts = [_raw(slot_tensors[l][s]) for q in range(ep_size) for (l, s) in send[q]]
            send_buf = torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8, device=device)
            in_splits = [sum(sizes[l] for (l, _) in send[q]) for q in range(ep_size)]
            out_splits = [sum(sizes[l] for (l, _) in recv[q]) for q in range(ep_size)]
            recv_buf = torch.empty(sum(out_splits), dtype=torch.uint8, device=device)
            dist.all_to_all_single(recv_buf, send_buf, out_splits, in_splits, group=group)
            off = 0
            for q in range(ep_size):
                for (l, s) in recv[q]:
                    received.append((l, s, recv_buf[off:off + sizes[l]]))
                    off += sizes[l]
            bytes_sent, bytes_recv = int(send_buf.numel()), int(recv_buf.numel())
        for l, d, raw in local_raw + received:  # then every write
            _write(slot_tensors[l][d], raw)
    return {"experts_moved": moved, "local_copies": len(local), "sent": n_send, "received": n_recv,
            "bytes_sent": bytes_sent, "bytes_received": bytes_recv}

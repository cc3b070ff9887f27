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
from typing import TYPE_CHECKING

import numpy as np

from routepack_opt.core.errors import InputError
from routepack_opt.core.plan import check_placement
from routepack_opt.integrations import _deps

if TYPE_CHECKING:
    import torch

__all__ = ["remap_routing", "apply_expert_placement", "PlacementHandle", "rank_token_counts",
           "expert_slot_tensors", "migrate_experts", "physical_to_logical"]


def physical_to_logical(logical_to_physical_LE) -> np.ndarray:
    """``p2l[l, s]``: the logical expert in slot s (inverse permutation per layer)."""
    l2p = np.asarray(logical_to_physical_LE, dtype=np.int64)
    errs = check_placement(l2p)
    if errs:
        raise InputError("placement: " + errs[0])
    return np.argsort(l2p, axis=-1).astype(np.int64)


def _perm_index(physical_to_logical_E, E: int, device):
    torch = _deps.torch()

    idx = torch.as_tensor(np.asarray(physical_to_logical_E), dtype=torch.long, device=device)
    if idx.dim() != 1 or idx.numel() != E or not torch.equal(torch.sort(idx).values, torch.arange(E, device=device)):
        raise InputError(f"physical_to_logical: expected a permutation of 0..{E - 1}")
    return idx


def remap_routing(probs, routing_map, physical_to_logical_E):
    """Permute the router's ``[T, E]`` outputs from logical columns to physical slots: column s
    of the result is logical expert ``physical_to_logical_E[s]``."""
    if probs.shape != routing_map.shape or probs.dim() != 2:
        raise InputError(f"probs {tuple(probs.shape)} and routing_map {tuple(routing_map.shape)} must both be [T, E]")
    idx = _perm_index(physical_to_logical_E, probs.shape[1], probs.device)
    return probs.index_select(1, idx), routing_map.index_select(1, idx)


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

    layer: object
    physical_to_logical: object  # torch.LongTensor [E] on the router's device (lazily moved)
    _orig_route: object = None

    def set(self, physical_to_logical_E) -> None:
        torch = _deps.torch()

        self.physical_to_logical = torch.as_tensor(np.asarray(physical_to_logical_E), dtype=torch.long)

    def remove(self) -> None:
        if "route" in vars(self.layer):
            del self.layer.route


def apply_expert_placement(moe_layer, physical_to_logical_E) -> PlacementHandle:
    """Wrap ``moe_layer.route`` (Megatron-Core ``MoELayer``) so its ``(probs, routing_map)`` come
    out in physical slot order. One layer, one ``[E]`` map; returns a handle to switch or undo."""
    if not hasattr(moe_layer, "route"):
        raise InputError("apply_expert_placement: the layer has no route() (Megatron-Core MoELayer expected)")
    if "route" in vars(moe_layer):
        raise InputError("apply_expert_placement: this layer already has a placement; use the handle's set()")
    orig = moe_layer.route
    handle = PlacementHandle(moe_layer, None, orig)
    handle.set(physical_to_logical_E)

    def route(hidden_states, *args, **kwargs):
        probs, routing_map = orig(hidden_states, *args, **kwargs)
        if handle.physical_to_logical.device != probs.device:
            handle.physical_to_logical = handle.physical_to_logical.to(probs.device)
        return remap_routing(probs, routing_map, handle.physical_to_logical)

    moe_layer.route = route
    return handle


def expert_slot_tensors(experts, optimizer=None, include_grads: bool = True) -> list[list]:
    """Per local slot, every tensor that belongs to that expert, in a fixed order: parameters
    (``SequentialMLP.local_experts[s]``; for grouped MLPs the parameters named ``weight{s}`` /
    ``bias{s}``), their grads, and optimizer state — a torch optimizer's per-parameter tensors,
    or a Megatron ``DistributedOptimizer``'s fp32 master + ``exp_avg`` + ``exp_avg_sq`` shard
    (``_get_main_param_and_optimizer_states``) where this rank owns one."""
    torch = _deps.torch()

    if hasattr(experts, "local_experts"):
        per_slot = [list(m.parameters()) for m in experts.local_experts]
    else:
        n = getattr(experts, "num_local_experts", None)
        if n is None:
            raise InputError("expert_slot_tensors: expected a SequentialMLP (local_experts) or a "
                             "grouped MLP with num_local_experts")
        per_slot = [[p for name, p in experts.named_parameters()
                     if name.rsplit(".", 1)[-1] in (f"weight{s}", f"bias{s}")] for s in range(n)]
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
    identical on every rank of the EP ``group``. Returns what moved (the same ``experts_moved``
    on every rank)."""
    torch = _deps.torch()
    dist = _deps.torch_distributed()

    old = np.asarray(old_physical_to_logical, dtype=np.int64)
    new = np.asarray(new_physical_to_logical, dtype=np.int64)
    L = len(slot_tensors)
    if old.shape != new.shape or old.ndim != 2 or old.shape[0] != L:
        raise InputError(f"placements must both be [L={L}, E], got {old.shape} and {new.shape}")
    E = old.shape[1]
    for name, m in (("old", old), ("new", new)):
        errs = check_placement(m, L, E)
        if errs:
            raise InputError(f"{name} physical_to_logical: {errs[0]}")
    if E % ep_size:
        raise InputError(f"E={E} is not divisible by ep_size={ep_size}")
    M = E // ep_size
    if any(len(s) != M for s in slot_tensors):
        raise InputError(f"each layer needs {M} local slots on this rank")
    old_l2p = np.argsort(old, axis=1)
    local, send, recv = [], {q: [] for q in range(ep_size)}, {q: [] for q in range(ep_size)}
    moved = 0
    with torch.no_grad():
        for l in range(L):  # canonical order: layer, then destination slot
            for dst in np.flatnonzero(old[l] != new[l]).tolist():
                src = int(old_l2p[l, new[l, dst]])
                ps, pd = src // M, dst // M
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

"""Materialize a new expert placement at a step boundary (docs/pipeline.md, step 5).

A placement is, per layer, ``phy2log[s]``: the logical expert held by global slot s
(:class:`routepack_opt.core.placement.Placement`; a permutation ``π[l, e]`` is the case without
replicas). Every slot whose logical expert changes is rewritten, *in place*, in the existing slot
tensors: weights, gradients if present, and optimizer state (every tensor state of the slot
parameters whose leading dimension is the slot dimension: Adam's ``exp_avg``, ``exp_avg_sq``, a
per-slot ``step`` if an optimizer keeps one), copied from one slot that held that expert before.
Then each layer's map is switched. Slots whose expert does not change are not touched.

Replicas. A new replica of e (e gains a slot) copies e's whole state from an existing holder —
the one on the destination rank if there is one (a local copy), else replica ``s mod k_old`` of
the old ones (spreading the senders); every holder is identical (runtime/replicas.py), so any
source gives the same bytes. A dropped replica's slot is freed by being overwritten with its new
occupant's state; nothing of it survives. The number of slots S = E + redundant is fixed.

Adam's ``step`` in ``torch.optim.Adam`` is one scalar per slot *tensor*, shared by all the experts
in it; every expert has taken the same number of steps, so it needs no move.

Across ranks (P > 1, one EP group per EDP shard, every shard moves its own copy): one
``all_to_all_single`` per EP group carries exactly the rewritten slots, packed as raw bytes in a
canonical order (layer, then new slot) that sender and receiver both derive from the two
placements — no count exchange is needed. All reads (send buffers and same-rank copies) happen
before any write, so a chain of moves (a→b, b→c, c→a) is safe.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
import torch.distributed as dist

from routepack_opt.core.checks import check_type
from routepack_opt.core.errors import InputError
from routepack_opt.core.placement import as_placement
from routepack_opt.runtime.moe import MoELayer, check_moe_layers

__all__ = ["MoveReport", "materialize", "slot_state_tensors"]


@dataclasses.dataclass(frozen=True)
class MoveReport:
    """What one rank moved. ``experts_moved`` counts (layer, slot) pairs whose logical expert
    changed anywhere in the EP group (the same on every rank; without replicas, the moved experts);
    ``replicas_added`` / ``replicas_dropped``: Σ over (layer, expert) of the rise / fall of logcnt
    (same on every rank); the rest is this rank's share."""

    experts_moved: int
    local_copies: int  # slots rewritten from a holder on this rank
    sent: int  # slot states this rank sent to other ranks
    received: int
    bytes_local: int
    bytes_sent: int
    bytes_received: int
    replicas_added: int = 0
    replicas_dropped: int = 0

    @property
    def bytes_moved(self) -> int:
        """Bytes this rank wrote into new slots (same-rank copies + received)."""
        return self.bytes_local + self.bytes_received

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["bytes_moved"] = self.bytes_moved
        return d


def slot_state_tensors(layer: MoELayer, optimizer=None) -> list[torch.Tensor]:
    """Every tensor with a slot dimension that belongs to ``layer``'s experts, in a fixed order:
    per slot parameter, its data, its grad (if present), its optimizer state tensors (sorted by
    key) whose leading dimension is the slot count."""
    check_type(layer, "layer", MoELayer)
    if optimizer is not None:
        check_type(optimizer, "optimizer", torch.optim.Optimizer)
    S = layer.slots.num_slots
    out = []
    for p in layer.slots.slot_params():
        out.append(p.data)
        if p.grad is not None:
            out.append(p.grad)
        state = optimizer.state.get(p, {}) if optimizer is not None else {}
        for key in sorted(state):
            v = state[key]
            if torch.is_tensor(v) and v.dim() > 0 and v.shape[0] == S:
                out.append(v)
    return out


def _expert_bytes(tensors: list[torch.Tensor], s: int) -> torch.Tensor:
    """The raw bytes of local slot ``s`` across ``tensors`` (a copy)."""
    return torch.cat([t[s].reshape(-1).view(torch.uint8) for t in tensors])


def _write_expert(tensors: list[torch.Tensor], s: int, raw: torch.Tensor) -> None:
    off = 0
    for t in tensors:
        n = t[s].numel() * t.element_size()
        t[s].copy_(raw[off:off + n].view(t.dtype).view(t[s].shape))
        off += n


def _new_phy2log(layers: list[MoELayer], new) -> np.ndarray:
    """``[L, S]`` phy2log of ``new``: a :class:`Placement` (an ``[L, E]`` permutation is taken
    as the one without replicas)."""
    L = len(layers)
    E = layers[0].num_experts if layers else 0
    S = layers[0].num_slots if layers else 0
    ep = layers[0].ep_size if layers else 1
    new = as_placement(new, ep, "new placement")
    if new.num_layers != L or new.num_experts != E or new.num_slots != S:
        raise InputError(f"new placement: {new.num_layers} layers × {new.num_slots} slots for "
                         f"{new.num_experts} experts; the model has {L} × {S} for {E} (the "
                         f"number of redundant slots is fixed at {S - E}; a permutation [L, E] "
                         f"has none)")
    if ep > 1 and new.ep != ep:  # one process: any ep
        raise InputError(f"new placement: ep={new.ep}, the model's EP size is {ep}")
    return np.asarray(new.phy2log)


@torch.no_grad()
def materialize(layers: list[MoELayer], new_placement, optimizer=None, group=None) -> MoveReport:
    """Rewrite every slot of ``layers`` whose logical expert changes under ``new_placement`` (a
    :class:`Placement`, or an ``[L, E]`` permutation π of global slots for a model without
    replicas, docs/model.md) — weights, grads, optimizer state — and switch dispatch.

    ``group``: the EP process group (None: one process holding all slots). Every rank of the
    group must call this with the same placement.
    """
    layers = check_moe_layers(layers)
    if optimizer is not None:
        check_type(optimizer, "optimizer", torch.optim.Optimizer)
    new_LS = _new_phy2log(layers, new_placement)
    P = layers[0].ep_size if layers else 1
    me = layers[0].ep_rank if layers else 0
    S = layers[0].slots_per_rank if layers else 0
    E = layers[0].num_experts if layers else 0
    # moves in canonical order (layer, new global slot) — identical on every rank
    send: dict[int, list] = {q: [] for q in range(P)}
    recv: dict[int, list] = {q: [] for q in range(P)}
    local = []
    moved = cross = added = dropped = 0
    for l, layer in enumerate(layers):
        old_S = layer.phy2log_S.cpu().numpy()
        old_cnt = np.bincount(old_S, minlength=E)
        new_cnt = np.bincount(new_LS[l], minlength=E)
        added += int(np.maximum(new_cnt - old_cnt, 0).sum())
        dropped += int(np.maximum(old_cnt - new_cnt, 0).sum())
        for dst in np.flatnonzero(old_S != new_LS[l]).tolist():
            e = int(new_LS[l, dst])
            holders = np.flatnonzero(old_S == e)
            pd = dst // S
            same = holders[holders // S == pd]
            src = int(same[0]) if same.size else int(holders[dst % holders.size])
            ps = src // S
            moved += 1
            cross += ps != pd
            if ps == me and pd == me:
                local.append((l, src - ps * S, dst - pd * S))
            elif ps == me:
                send[pd].append((l, src - ps * S))
            elif pd == me:
                recv[ps].append((l, dst - pd * S))
    tensors_L = [slot_state_tensors(layer, optimizer) for layer in layers]
    nbytes_L = [sum(t[0].numel() * t.element_size() for t in ts) for ts in tensors_L]

    # read everything first
    local_raw = [_expert_bytes(tensors_L[l], s) for (l, s, _) in local]
    received_raw: list[tuple[int, int, torch.Tensor]] = []
    if cross:
        device = layers[0].phy2log_S.device
        parts = [_expert_bytes(tensors_L[l], s) for q in range(P) for (l, s) in send[q]]
        send_buf = torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8, device=device)
        in_splits = [sum(nbytes_L[l] for (l, _) in send[q]) for q in range(P)]
        out_splits = [sum(nbytes_L[l] for (l, _) in recv[q]) for q in range(P)]
        recv_buf = torch.empty(sum(out_splits), dtype=torch.uint8, device=device)
        dist.all_to_all_single(recv_buf, send_buf, out_splits, in_splits, group=group)
        off = 0
        for q in range(P):
            for (l, s) in recv[q]:
                received_raw.append((l, s, recv_buf[off:off + nbytes_L[l]]))
                off += nbytes_L[l]
    # then write
    for (l, _, d), raw in zip(local, local_raw):
        _write_expert(tensors_L[l], d, raw)
    for l, d, raw in received_raw:
        _write_expert(tensors_L[l], d, raw)
    for l, layer in enumerate(layers):
        layer.set_phy2log(new_LS[l])
    return MoveReport(
        experts_moved=moved, local_copies=len(local),
        sent=sum(len(v) for v in send.values()), received=sum(len(v) for v in recv.values()),
        bytes_local=sum(nbytes_L[l] for (l, _, _) in local),
        bytes_sent=sum(nbytes_L[l] for v in send.values() for (l, _) in v),
        bytes_received=sum(nbytes_L[l] for v in recv.values() for (l, _) in v),
        replicas_added=added, replicas_dropped=dropped)

"""Materialize a new expert placement at a step boundary (docs/pipeline.md, step 5).

Every expert whose physical slot changes is moved, *in place*, into the existing slot tensors:
its weights, its gradients if present, and its optimizer state (every tensor state of the slot
parameters whose leading dimension is the slot dimension: Adam's ``exp_avg``, ``exp_avg_sq``, a
per-slot ``step`` if an optimizer keeps one). Then the logical→physical map ``placement_E`` of each
layer is switched. Experts whose slot does not change are not touched.

Adam's ``step`` in ``torch.optim.Adam`` is one scalar per slot *tensor*, shared by all the experts
in it; every expert has taken the same number of steps, so it needs no move.

Across ranks (P > 1, one EP group per EDP shard, every shard moves its own replica): one
``all_to_all_single`` per EP group carries exactly the changed experts, packed as raw bytes in a
canonical order (layer, then logical expert) that sender and receiver both derive from the two
placements — no count exchange is needed. All reads (send buffers and same-rank copies) happen
before any write, so a chain of moves (a→b, b→c, c→a) is safe.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
import torch.distributed as dist

from routepack_opt.core.errors import InputError
from routepack_opt.core.plan import check_placement
from routepack_opt.runtime.moe import MoELayer

__all__ = ["MoveReport", "materialize", "slot_state_tensors"]


@dataclasses.dataclass(frozen=True)
class MoveReport:
    """What one rank moved. ``experts_moved`` counts (layer, expert) pairs whose slot changed
    anywhere in the EP group (the same on every rank); the rest is this rank's share."""

    experts_moved: int
    local_copies: int  # moved inside this rank (slot changed, rank did not)
    sent: int  # experts this rank sent to other ranks
    received: int
    bytes_local: int
    bytes_sent: int
    bytes_received: int

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


@torch.no_grad()
def materialize(layers: list[MoELayer], new_placement_LE, optimizer=None, group=None) -> MoveReport:
    """Move every expert of ``layers`` whose slot changes to its slot under ``new_placement_LE``
    (``[L, E]`` global slots, docs/model.md) — weights, grads, optimizer state — and switch dispatch.

    ``group``: the EP process group (None: one process holding all E slots). Every rank of the
    group must call this with the same placement.
    """
    new_LE = np.asarray(new_placement_LE, dtype=np.int64)
    E = layers[0].num_experts if layers else 0
    errs = check_placement(new_LE, len(layers), E)
    if errs:
        raise InputError("new placement: " + "; ".join(errs[:3]))
    P = layers[0].ep_size if layers else 1
    me = layers[0].ep_rank if layers else 0
    S = E // P if P else 0
    # moves in canonical order (layer, logical expert) — identical on every rank
    send: dict[int, list] = {q: [] for q in range(P)}
    recv: dict[int, list] = {q: [] for q in range(P)}
    local = []
    moved = 0
    cross = 0
    for l, layer in enumerate(layers):
        old_E = layer.placement_E.cpu().numpy()
        for e in np.flatnonzero(old_E != new_LE[l]).tolist():
            src, dst = int(old_E[e]), int(new_LE[l, e])
            ps, pd = src // S, dst // S
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
        device = layers[0].placement_E.device
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
        layer.placement_E.copy_(torch.as_tensor(new_LE[l], device=layer.placement_E.device))
    return MoveReport(
        experts_moved=moved, local_copies=len(local),
        sent=sum(len(v) for v in send.values()), received=sum(len(v) for v in recv.values()),
        bytes_local=sum(nbytes_L[l] for (l, _, _) in local),
        bytes_sent=sum(nbytes_L[l] for v in send.values() for (l, _) in v),
        bytes_received=sum(nbytes_L[l] for v in recv.values() for (l, _) in v))

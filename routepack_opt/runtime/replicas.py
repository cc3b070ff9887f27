"""Replicated experts in training: one gradient, one update for every copy (docs/pipeline.md, step 5).

Legend: S_loc local slots per EP rank, P EP ranks, k = logcnt[e] replicas of logical expert e,
replica j in 0..k-1 at global slot ``log2phy[e, j]`` (ascending slots), on rank ``slot // S_loc``.

With the even-local dispatch (:mod:`routepack_opt.runtime.moe`) replica j of e computes its GEMMs
on its own rows only, so after backward its gradient is the *partial* ``g_j = Σ_{rows of j} ∂L/∂W``.
The expert's gradient is ``g = g_0 + g_1 + … + g_{k-1}``; :func:`sum_replica_grads` gives it to
every holder, summed in replica order ``((g_0 + g_1) + g_2) + …`` on every holder, so every copy
holds the same bits. ``g_j`` depends only on j's rows (j, k and the source ranks), never on the
slot or rank holding replica j, so the sum — and the whole run — is bitwise the same for any
placement with the same ``logcnt``; against one holder per expert it differs only by float32
reassociation (k partial sums instead of one GEMM reduction).

Communication: rank r_i of replica i sends ``g_i`` to every other rank holding a replica of e
(one ``all_to_all_single`` of raw bytes per EP group, canonical order (layer, expert, i, rank) that
both sides derive from the placement; no count exchange). An expert with k replicas on k ranks
costs k(k-1) expert-gradient transfers per step (k = 2: one each way, the same bytes as a
two-rank all-reduce). After this, the EDP all-reduce across shards runs as without replicas.

Optimizer state: **replicated**. Every holder keeps its own Adam moments for its copy; it sees the
same summed gradient and the same weights, so the same elementwise update keeps weights and
moments identical with no further communication. The alternative, owner-updated and broadcast,
would save the moments on non-owners (2× the weight bytes per replica for Adam) but add a weight
broadcast per step as large as the gradient exchange, and a migration would have to re-home the
moments; replicated state keeps one code path (every slot is a full expert) and makes a new
replica a plain copy of an existing holder (:mod:`routepack_opt.runtime.materialize`).
"""

from __future__ import annotations

import dataclasses
from typing import cast

import numpy as np
import torch
import torch.distributed as dist

from routepack_opt.core.checks import INT64_MAX, check_int, check_type, int_array, shown
from routepack_opt.core.errors import InputError
from routepack_opt.runtime.materialize import slot_state_tensors
from routepack_opt.runtime.moe import MoELayer, check_moe_layers

__all__ = ["ReplicaExchange", "replica_exchange_plan", "exchange_plan", "sum_replica_grads",
           "sum_slot_partials", "replica_max_diff"]


@dataclasses.dataclass(frozen=True)
class ReplicaExchange:
    """Who sends which replica's partial gradient where, for one EP group (same on every rank).

    ``experts``: per layer, ``(e, [global slots of e's replicas, ascending])`` for every e with k > 1;
    ``send[q]`` / ``recv[q]``: this rank's ``(layer, local slot)`` it sends to rank q /
    ``(layer, e, j)`` it receives from q, in canonical order."""

    experts: list[list[tuple[int, list[int]]]]
    send: dict[int, list[tuple[int, int]]]
    recv: dict[int, list[tuple[int, int, int]]]

    @property
    def num_replicated(self) -> int:
        return sum(len(x) for x in self.experts)


def replica_exchange_plan(layers: list[MoELayer]) -> ReplicaExchange:
    """The exchange of :func:`sum_replica_grads` for the layers' current placements."""
    layers = check_moe_layers(layers)
    if not layers:
        return exchange_plan([], 1, 0)
    return exchange_plan([cast(torch.Tensor, layer.phy2log_S).cpu().numpy() for layer in layers], layers[0].ep_size,
                         layers[0].ep_rank)


def exchange_plan(phy2log_LS, ep_size: int, ep_rank: int) -> ReplicaExchange:
    """The replica exchange of EP rank ``ep_rank`` from global slot → logical maps, one ``[S]``
    row per MoE layer (the same on every rank; S/ep_size local slots per rank). Shared with
    :func:`routepack_opt.integrations.megatron.sum_replica_grads`."""
    P = check_int(ep_size, "ep_size", 1, INT64_MAX)
    me = check_int(ep_rank, "ep_rank", 0, P - 1)
    if isinstance(phy2log_LS, (list, tuple)):
        phy2log_LS = [int_array(p2l, f"phy2log_LS[{l}]", ndim=1) for l, p2l in enumerate(phy2log_LS)]
    elif isinstance(phy2log_LS, np.ndarray) or torch.is_tensor(phy2log_LS):
        phy2log_LS = list(int_array(phy2log_LS, "phy2log_LS", ndim=2))
    else:
        raise InputError(f"phy2log_LS: expected an [L, S] array or a list of [S] rows, got "
                         f"{type(phy2log_LS).__name__} {shown(phy2log_LS, 40)}")
    for l, p2l in enumerate(phy2log_LS):
        if p2l.shape[0] % P:
            raise InputError(f"phy2log_LS[{l}]: {p2l.shape[0]} slots are not divisible by ep_size={P}")
        int_array(p2l, f"phy2log_LS[{l}]", lo=0, hi=p2l.shape[0] - 1)  # expert ids < E ≤ S
    experts: list[list[tuple[int, list[int]]]] = []
    send: dict[int, list[tuple[int, int]]] = {q: [] for q in range(P)}
    recv: dict[int, list[tuple[int, int, int]]] = {q: [] for q in range(P)}
    for l, p2l in enumerate(phy2log_LS):
        p2l = np.asarray(p2l)
        S = p2l.shape[0] // P
        cnt = np.bincount(p2l, minlength=int(p2l.max()) + 1 if p2l.size else 0)
        rows = []
        for e in np.flatnonzero(cnt > 1).tolist():
            slots = np.flatnonzero(p2l == e).tolist()  # ascending: replica j = slots[j]
            rows.append((e, slots))
            ranks = sorted({s // S for s in slots})
            for j, s in enumerate(slots):
                src = s // S
                for dst in ranks:
                    if dst == src:
                        continue
                    if src == me:
                        send[dst].append((l, s - src * S))
                    if dst == me:
                        recv[src].append((l, e, j))
        experts.append(rows)
    return ReplicaExchange(experts, send, recv)


def _grads(layer: MoELayer) -> list[torch.Tensor]:
    out = []
    for p in layer.slots.slot_params():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        out.append(p.grad)
    return out


@torch.no_grad()
def sum_replica_grads(layers: list[MoELayer], group=None,
                      plan: ReplicaExchange | None = None) -> int:
    """Replace every local replica's partial gradient by its expert's full gradient
    ``((g_0 + g_1) + …) + g_{k-1}`` (see module doc). ``group``: the EP process group (None: one
    process holding all slots). Returns the bytes this rank sent. Every rank of the group calls
    it after backward, before the EDP all-reduce and the optimizer step."""
    layers = check_moe_layers(layers)
    if plan is not None:
        check_type(plan, "plan", ReplicaExchange)
    plan = plan or replica_exchange_plan(layers)
    if not plan.num_replicated:
        return 0
    grads_L = [_grads(layer) for layer in layers]
    grads_LS = [[[g[s] for g in gs] for s in range(layers[0].slots_per_rank)] for gs in grads_L]
    return sum_slot_partials(grads_LS, plan, layers[0].ep_size, layers[0].ep_rank, group,
                             cast(torch.Tensor, layers[0].phy2log_S).device)


@torch.no_grad()
def sum_slot_partials(grads_LS: list[list[list[torch.Tensor]]], plan: ReplicaExchange, ep_size: int,
                      ep_rank: int, group=None, device=None) -> int:
    """The exchange and sum of :func:`sum_replica_grads` on per-slot tensors: ``grads_LS[l][s]``
    is this rank's list of gradient tensors of local slot s at layer l (the same shapes and
    dtypes in every slot of a layer, written in place). Every holder of a replicated expert ends
    with ``((g_0 + g_1) + …) + g_{k-1}`` in replica (ascending slot) order, the same bits on every
    holder. Returns the bytes this rank sent (one ``all_to_all_single`` when ``ep_size > 1``)."""
    check_type(grads_LS, "grads_LS", (list, tuple), "list of per-slot gradient lists")
    check_type(plan, "plan", ReplicaExchange)
    ep_size = check_int(ep_size, "ep_size", 1, INT64_MAX)
    check_int(ep_rank, "ep_rank", 0, ep_size - 1)
    if not plan.num_replicated:
        return 0
    P, me = int(ep_size), int(ep_rank)
    S = len(grads_LS[0]) if grads_LS else 1
    nbytes_L = [sum(t.numel() * t.element_size() for t in gs[0]) if gs else 0 for gs in grads_LS]
    # read: this rank's own partials (copies), then the others' over one all-to-all
    partial: dict[tuple[int, int, int], list[torch.Tensor]] = {}
    for l, rows in enumerate(plan.experts):
        for e, slots in rows:
            for j, s in enumerate(slots):
                if s // S == me:
                    partial[(l, e, j)] = [t.clone() for t in grads_LS[l][s - me * S]]
    bytes_sent = sum(nbytes_L[l] for v in plan.send.values() for (l, _) in v)
    if P > 1:  # the plan is the same on every rank: all of them take part
        if device is None:
            device = grads_LS[0][0][0].device
        parts = [torch.cat([t.reshape(-1).view(torch.uint8) for t in grads_LS[l][s]])
                 for q in range(P) for (l, s) in plan.send[q]]
        send_buf = torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8, device=device)
        in_splits = [sum(nbytes_L[l] for (l, _) in plan.send[q]) for q in range(P)]
        out_splits = [sum(nbytes_L[l] for (l, _, _) in plan.recv[q]) for q in range(P)]
        recv_buf = torch.empty(sum(out_splits), dtype=torch.uint8, device=device)
        dist.all_to_all_single(recv_buf, send_buf, out_splits, in_splits, group=group)
        off = 0
        for q in range(P):
            for (l, e, j) in plan.recv[q]:
                ts = []
                for t in grads_LS[l][0]:
                    n = t.numel() * t.element_size()
                    ts.append(recv_buf[off:off + n].view(t.dtype).view(t.shape))
                    off += n
                partial[(l, e, j)] = ts
    # write: the sum in replica order into every local holder
    for l, rows in enumerate(plan.experts):
        for e, slots in rows:
            local = [s - me * S for s in slots if s // S == me]
            if not local:
                continue
            acc = [t.clone() for t in partial[(l, e, 0)]]
            for j in range(1, len(slots)):
                for a, t in zip(acc, partial[(l, e, j)]):
                    a += t
            for s in local:
                for g, a in zip(grads_LS[l][s], acc):
                    g.copy_(a)
    return bytes_sent


def replica_max_diff(layers: list[MoELayer], optimizer=None) -> float:
    """Largest |difference| between two local replicas of one expert (weights, grads, optimizer
    state): 0.0 when every local copy is identical."""
    layers = check_moe_layers(layers)
    if optimizer is not None:
        check_type(optimizer, "optimizer", torch.optim.Optimizer)
    worst = 0.0
    for layer in layers:
        first = layer.slots.first_slot
        p2l = cast(torch.Tensor, layer.phy2log_S)[first:first + layer.slots_per_rank].tolist()
        ts = slot_state_tensors(layer, optimizer)
        seen: dict[int, int] = {}
        for s, e in enumerate(p2l):
            if e in seen:
                for t in ts:
                    worst = max(worst, float((t[s].double() - t[seen[e]].double()).abs().max()))
            else:
                seen[e] = s
    return worst

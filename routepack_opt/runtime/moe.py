"""An MoE layer whose experts live in pre-allocated physical slot tensors.

Legend (shape suffixes): T tokens, H hidden, F expert FFN width, E logical experts, K top-k,
S physical slots of the layer (E + redundant), S_loc = S/P local slots, P EP ranks,
M = T·K (token, choice) pairs.

The router (or the replayed routes) speaks *logical* expert ids. ``phy2log_S[s]`` is the logical
expert held by global physical slot s (docs/model.md, "Placement"; rank = s // S_loc); this rank
owns slots ``rank·S_loc .. rank·S_loc + S_loc - 1``, stored as ``w_gate_SHF``, ``w_up_SHF``,
``w_down_SFH``. Without redundant slots (S = E) the map is a permutation and ``placement_E`` its
inverse (the slot of logical expert e). Re-placing experts (:mod:`routepack_opt.runtime.materialize`)
moves slices of these tensors and rewrites ``phy2log_S``; nothing else changes.

**Replicas** (logcnt[e] = k > 1 slots hold e): the dispatch follows the even-local rule of
:mod:`routepack_opt.core.placement` exactly. The pair of a micro-batch that is the t-th (in token
order) of the pairs routed to e goes to e's replica ``j = (t + q) mod k`` (replicas in ascending
slot order, q = ``source_rank``, this rank's EP rank). Each replica's GEMMs then see only its own
rows, so its weight gradient is a *partial* sum; :mod:`routepack_opt.runtime.replicas` sums the
k partials in replica order j = 0..k-1 on every holder after backward.

Why results do not depend on the placement, bit for bit (docs/pipeline.md, step 5):
- every expert GEMM sees exactly the same rows in the same order wherever the expert lives
  (pairs sorted stably by slot keep token order inside an expert; with EP the receiver orders an
  expert's rows by (source rank, token order)); with replicas, replica j's rows depend only on
  j, k and the sources, not on the slot or rank that holds replica j;
- every re-ordering of rows is a permutation (gather by a unique index), whose backward scatters
  without accumulation collisions — exact;
- the combine ``Σ_k w[t,k]·y[t,k]`` and the gradient of the token copies reduce over k in a fixed
  order, in the logical (token, choice) layout.
Replication itself (k > 1 versus one holder) splits an expert's rows over k GEMMs and sums k
partial weight gradients, so it changes results only by float32 reassociation.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from routepack_opt.core.checks import INT64_MAX, check_int, check_redundant_experts, check_type, shown
from routepack_opt.core.errors import InputError

__all__ = ["ExpertSlots", "MoELayer", "AllToAll", "swiglu", "replica_slots"]


def swiglu(x_MH: torch.Tensor, w_gate_HF: torch.Tensor, w_up_HF: torch.Tensor,
           w_down_FH: torch.Tensor) -> torch.Tensor:
    """One expert: ``(silu(x W_gate) ⊙ x W_up) W_down``."""
    for arg, name in ((x_MH, "x_MH"), (w_gate_HF, "w_gate_HF"), (w_up_HF, "w_up_HF"), (w_down_FH, "w_down_FH")):
        check_type(arg, name, torch.Tensor, "torch.Tensor")
    return (F.silu(x_MH @ w_gate_HF) * (x_MH @ w_up_HF)) @ w_down_FH


def replica_slots(experts_M: torch.Tensor, log2phy_EK: torch.Tensor, logcnt_E: torch.Tensor,
                  source_rank: int) -> torch.Tensor:
    """Global physical slot of every (token, choice) pair under the even-local rule
    (:mod:`routepack_opt.core.placement`): the t-th pair of expert e (in pair order, which is
    token order inside one expert) goes to replica ``(t + source_rank) mod logcnt[e]``, i.e. slot
    ``log2phy[e, j]``. Vectorised: t = position in a stable sort by expert."""
    for arg, name in ((experts_M, "experts_M"), (log2phy_EK, "log2phy_EK"), (logcnt_E, "logcnt_E")):
        check_type(arg, name, torch.Tensor, "torch.Tensor")
    check_int(source_rank, "source_rank", 0, INT64_MAX)
    M = experts_M.numel()
    if M == 0:
        return experts_M.clone()
    order = torch.argsort(experts_M, stable=True)
    e_sorted = experts_M[order]
    first = torch.searchsorted(e_sorted, e_sorted)  # first index of each pair's expert group
    t_M = torch.empty_like(experts_M)
    t_M[order] = torch.arange(M, device=experts_M.device) - first
    k_M = logcnt_E[experts_M]
    j_M = (t_M + source_rank) % k_M
    return log2phy_EK[experts_M, j_M]


def check_moe_layers(layers, name: str = "layers") -> list:
    """``layers`` as a list when it is a list or tuple of :class:`MoELayer` (the entry check of
    the functions that take a model's MoE layers), else an InputError naming ``name``."""
    if not isinstance(layers, (list, tuple)):
        raise InputError(f"{name}: expected a list of MoELayer, got {type(layers).__name__} {shown(layers, 40)}")
    for i, layer in enumerate(layers):
        check_type(layer, f"{name}[{i}]", MoELayer)
    return list(layers)


def _check_fits(elements: int, dtype, device) -> None:
    """An InputError, before allocating, when ``elements`` of ``dtype`` on a CPU ``device`` are
    more than this machine's physical memory (an accelerator's own allocator answers for its)."""
    if torch.device(device if device is not None else "cpu").type != "cpu":
        return
    import os

    try:
        phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not on this platform
        return
    nbytes = elements * torch.empty((), dtype=dtype).element_size()
    if nbytes > phys:
        raise InputError(f"the slot tensors need {nbytes / 2**30:,.1f} GiB, more than this machine's "
                         f"{phys / 2**30:,.1f} GiB of memory")


class ExpertSlots(nn.Module):
    """``num_slots`` physical expert slots (SwiGLU experts) of one MoE layer on one EP rank."""

    def __init__(self, num_slots: int, hidden: int, ffn: int, first_slot: int = 0,
                 device=None, dtype=None):
        num_slots = check_int(num_slots, "num_slots", 0, INT64_MAX)
        hidden = check_int(hidden, "hidden", 1, INT64_MAX)
        ffn = check_int(ffn, "ffn", 1, INT64_MAX)
        first_slot = check_int(first_slot, "first_slot", 0, INT64_MAX)
        if num_slots * hidden * ffn > INT64_MAX:
            raise InputError(f"num_slots={num_slots} × hidden={hidden} × ffn={ffn}: a slot tensor of more "
                             "than 2⁶³−1 elements")
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.num_slots = num_slots
        self.first_slot = first_slot  # global id of local slot 0 (= rank · S)
        _check_fits(3 * num_slots * hidden * ffn, dtype, device)
        try:
            self.w_gate_SHF = nn.Parameter(torch.zeros(num_slots, hidden, ffn, **kw))
            self.w_up_SHF = nn.Parameter(torch.zeros(num_slots, hidden, ffn, **kw))
            self.w_down_SFH = nn.Parameter(torch.zeros(num_slots, ffn, hidden, **kw))
        except (torch.OutOfMemoryError, MemoryError, RuntimeError) as exc:  # the device said no
            if "alloc" not in str(exc).lower() and not isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
                raise
            raise InputError(f"num_slots={num_slots} × hidden={hidden} × ffn={ffn}: the slot tensors do not "
                             f"fit this device's memory ({exc.__class__.__name__})") from None

    def slot_params(self) -> list[nn.Parameter]:
        """The slot tensors, in a fixed order (materialization packs them in this order)."""
        return [self.w_gate_SHF, self.w_up_SHF, self.w_down_SFH]

    def run(self, x_MH: torch.Tensor, counts_S: list[int]) -> torch.Tensor:
        """Rows of ``x_MH`` are grouped by local slot (``counts_S[s]`` rows each, slot order);
        returns the expert outputs in the same row order. One GEMM chain per slot, on exactly
        that slot's rows, so its result does not depend on which slot holds the expert."""
        chunks = x_MH.split(counts_S)
        gates = self.w_gate_SHF.unbind(0)
        ups = self.w_up_SHF.unbind(0)
        downs = self.w_down_SFH.unbind(0)
        outs = []
        for s, chunk in enumerate(chunks):
            # an empty chunk stays in the graph (shape [0, H]) so autograd reaches every collective
            outs.append(swiglu(chunk, gates[s], ups[s], downs[s]) if counts_S[s] else chunk)
        return torch.cat(outs)


class AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with autograd: the backward sends gradients back along the same
    splits, reversed."""

    @staticmethod
    def forward(ctx, x, out_splits: list[int], in_splits: list[int], group):
        ctx.splits = (out_splits, in_splits, group)
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        out_splits, in_splits, group = ctx.splits
        grad_in = grad_out.new_empty((sum(in_splits),) + tuple(grad_out.shape[1:]))
        dist.all_to_all_single(grad_in, grad_out.contiguous(), in_splits, out_splits, group=group)
        return grad_in, None, None, None


class MoELayer(nn.Module):
    """Router + expert slots + logical→physical dispatch, optionally expert-parallel.

    ``ep_group`` (a ``torch.distributed`` process group of P ranks, or None for one process that
    holds all E slots) carries the token all-to-all. This rank's position in it is ``ep_rank``.
    """

    def __init__(self, hidden: int, ffn: int, num_experts: int, top_k: int, ep_size: int = 1,
                 ep_rank: int = 0, ep_group=None, device=None, dtype=None, redundant: int = 0):
        hidden = check_int(hidden, "hidden", 1, INT64_MAX)
        ffn = check_int(ffn, "ffn", 1, INT64_MAX)
        num_experts = check_int(num_experts, "num_experts", 1, INT64_MAX)
        check_int(top_k, "top_k", 1, num_experts)
        ep_size = check_int(ep_size, "ep_size", 1, INT64_MAX)
        check_int(ep_rank, "ep_rank", 0, ep_size - 1)
        redundant = check_redundant_experts(redundant, "redundant")
        if (num_experts + redundant) * hidden * max(ffn, num_experts) > INT64_MAX:
            raise InputError(f"num_experts={num_experts} + redundant={redundant} slots × hidden={hidden} × "
                             f"ffn={ffn}: tensors of more than 2⁶³−1 elements")
        super().__init__()
        S = num_experts + redundant
        if S % ep_size:
            raise InputError(f"E={num_experts} + redundant={redundant} slots not divisible by ep={ep_size}")
        self.num_experts, self.top_k, self.num_slots = num_experts, top_k, S
        self.ep_size, self.ep_rank, self.ep_group = ep_size, ep_rank, ep_group
        self.source_rank = ep_rank  # q of the even-local rule (single process: set per DP slot)
        S_loc = S // ep_size
        _check_fits(hidden * num_experts + 3 * S_loc * hidden * ffn, dtype, device)  # router + slots
        self.router = nn.Linear(hidden, num_experts, bias=False, device=device, dtype=dtype)
        self.slots = ExpertSlots(S_loc, hidden, ffn, first_slot=ep_rank * S_loc, device=device, dtype=dtype)
        self.register_buffer("phy2log_S", torch.arange(S, device=device) % num_experts, persistent=True)
        # derived from phy2log_S (buffers, so .to(device) moves them)
        self.register_buffer("logcnt_E", torch.ones(num_experts, dtype=torch.long, device=device),
                             persistent=False)
        self.register_buffer("log2phy_EK", torch.zeros(num_experts, 1, dtype=torch.long, device=device),
                             persistent=False)
        self._refresh_maps()

    @property
    def redundant(self) -> int:
        return self.num_slots - self.num_experts

    @property
    def slots_per_rank(self) -> int:
        return self.slots.num_slots

    def _refresh_maps(self) -> None:
        """Derive logcnt_E and log2phy_EK (replicas in ascending slot order) from phy2log_S."""
        p2l = self.phy2log_S
        E = self.num_experts
        cnt = torch.bincount(p2l, minlength=E)
        if int(cnt.min()) < 1 or cnt.numel() != E:
            raise ValueError("phy2log: every logical expert needs at least one slot")
        order = torch.argsort(p2l, stable=True)
        e_sorted = p2l[order]
        j = torch.arange(self.num_slots, device=p2l.device) - torch.searchsorted(e_sorted, e_sorted)
        log2phy = torch.full((E, int(cnt.max())), -1, dtype=torch.long, device=p2l.device)
        log2phy[e_sorted, j] = order
        self.logcnt_E, self.log2phy_EK = cnt, log2phy

    @torch.no_grad()
    def set_phy2log(self, phy2log_S) -> None:
        """Switch dispatch to ``phy2log_S`` (weights are not touched: materialize moves them)."""
        self.phy2log_S.copy_(torch.as_tensor(np.array(phy2log_S, dtype=np.int64), device=self.phy2log_S.device))
        self._refresh_maps()

    @property
    def placement_E(self) -> torch.Tensor:
        """``π[e]``, the slot of logical expert e (a layer without redundant slots only)."""
        if self.redundant:
            raise ValueError("placement_E: a layer with replicas has no permutation; use phy2log_S")
        return self.log2phy_EK[:, 0].clone()

    def local_experts(self) -> list[tuple[int, int]]:
        """(logical expert, local slot) of every slot this rank holds, by (logical id, slot)."""
        S, first = self.slots.num_slots, self.slots.first_slot
        p2l = self.phy2log_S[first:first + S].tolist()
        return sorted((e, s) for s, e in enumerate(p2l))

    def forward(self, x_TH: torch.Tensor, routes_TK: torch.Tensor | None = None):
        logits_TE = self.router(x_TH)
        if routes_TK is None:
            routes_TK = logits_TE.topk(self.top_k, dim=-1).indices
        # combine weights over the chosen (logical) experts: placement-free by construction
        w_TK = torch.softmax(logits_TE.gather(1, routes_TK), dim=-1)
        y_TKH = self.expert_outputs(x_TH, routes_TK)
        return (w_TK.unsqueeze(-1) * y_TKH).sum(dim=1), routes_TK

    def expert_outputs(self, x_TH: torch.Tensor, routes_TK: torch.Tensor) -> torch.Tensor:
        """``y[t, k]`` = output of logical expert ``routes[t, k]`` on token t, wherever it lives."""
        T, K = routes_TK.shape
        H = x_TH.shape[1]
        phys_M = replica_slots(routes_TK.reshape(-1), self.log2phy_EK, self.logcnt_E, self.source_rank)
        order_M = torch.argsort(phys_M, stable=True)  # by slot; token order kept inside a slot
        inv_M = torch.argsort(order_M)
        # token copies in (token, choice) order; the backward sums the K copies in fixed order
        x_MH = x_TH.unsqueeze(1).expand(T, K, H).reshape(T * K, H)
        xs_MH = x_MH[order_M]
        if self.ep_size == 1:
            counts_S = torch.bincount(phys_M, minlength=self.num_slots).tolist()
            ys_MH = self.slots.run(xs_MH, counts_S)
        else:
            ys_MH = self._ep_dispatch(xs_MH, phys_M)
        return ys_MH[inv_M].reshape(T, K, -1)

    def _ep_dispatch(self, xs_MH: torch.Tensor, phys_M: torch.Tensor) -> torch.Tensor:
        """Rows sorted by global slot → their owner ranks (all-to-all) → expert GEMMs → back."""
        P, S, group = self.ep_size, self.slots.num_slots, self.ep_group
        send_PS = torch.bincount(phys_M, minlength=self.num_slots).reshape(P, S)
        recv_PS = torch.empty_like(send_PS)  # recv_PS[q, s]: rows source q sends to my slot s
        dist.all_to_all_single(recv_PS.view(-1), send_PS.view(-1).contiguous(), group=group)
        in_splits = send_PS.sum(1).tolist()
        out_splits = recv_PS.sum(1).tolist()
        recv_MH = AllToAll.apply(xs_MH, out_splits, in_splits, group)
        # received rows are (source, slot, token order); regroup by (slot, source, token order)
        slot_of_row = torch.repeat_interleave(torch.arange(S, device=phys_M.device).repeat(P),
                                              recv_PS.reshape(-1))
        perm = torch.argsort(slot_of_row, stable=True)
        ys = self.slots.run(recv_MH[perm], recv_PS.sum(0).tolist())
        back_MH = ys[torch.argsort(perm)]
        return AllToAll.apply(back_MH, in_splits, out_splits, group)

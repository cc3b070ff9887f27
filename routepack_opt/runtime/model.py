"""A tiny MoE language model for runtime checks: per-sample causal attention over packed
micro-batches, and MoE layers with expert slots (:class:`~routepack_opt.runtime.moe.MoELayer`).

Legend (shape suffixes): T tokens of a packed micro-batch, H hidden, V vocabulary, E experts,
L layers, F expert FFN width, S local slots.

Components are built from a small frozen config (torchtitan's habit). Initialization is keyed by
the seed and by *logical* expert id, so two runs with different placements start from the same
logical model.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from routepack_opt.core.checks import INT64_MAX, check_bool, check_int, check_type, int_array
from routepack_opt.core.errors import InputError
from routepack_opt.runtime.moe import MoELayer

__all__ = ["TinyMoEConfig", "TinyMoE", "varlen_causal_attention", "logical_expert_tensors"]


@dataclasses.dataclass(frozen=True)
class TinyMoEConfig:
    """Sizes of the tiny model. ``hidden·ffn`` is a multiple of 16, so every expert slice of a
    slot tensor starts on a 64-byte boundary (same SIMD alignment in every slot)."""

    vocab: int = 64
    hidden: int = 32
    heads: int = 2
    num_layers: int = 2
    num_experts: int = 8
    top_k: int = 2
    ffn: int = 32
    seed: int = 0

    def __post_init__(self):
        for key in ("vocab", "hidden", "heads", "num_layers", "num_experts", "ffn"):
            check_int(getattr(self, key), key, 1, INT64_MAX)
        check_int(self.top_k, "top_k", 1, self.num_experts)
        check_int(self.seed, "seed", 0, INT64_MAX)
        if self.hidden % self.heads:
            raise InputError(f"hidden must be divisible by heads, got hidden={self.hidden}, heads={self.heads}")
        if (int(self.hidden) * int(self.ffn)) % 16:
            raise InputError(f"hidden·ffn must be a multiple of 16, got hidden={self.hidden}, ffn={self.ffn}")


def varlen_causal_attention(q_hTd: torch.Tensor, k_hTd: torch.Tensor, v_hTd: torch.Tensor,
                            cu_seqlens: list[int]) -> torch.Tensor:
    """Causal attention inside each packed sample (the varlen semantics of FlashAttention),
    as one causal SDPA call per sample. Inputs ``[heads, T, head_dim]``."""
    for arg, name in ((q_hTd, "q_hTd"), (k_hTd, "k_hTd"), (v_hTd, "v_hTd")):
        check_type(arg, name, torch.Tensor, "torch.Tensor")
        if arg.dim() != 3:
            raise InputError(f"{name}: expected [heads, T, head_dim], got shape {list(arg.shape)}")
    cu = int_array(cu_seqlens.cpu() if torch.is_tensor(cu_seqlens) else cu_seqlens, "cu_seqlens", ndim=1,
                   lo=0, hi=int(q_hTd.shape[1]))
    if cu.size < 2 or (cu[1:] < cu[:-1]).any():
        raise InputError(f"cu_seqlens: expected ≥ 2 non-decreasing sample boundaries, got {cu.tolist()[:8]}")
    outs = []
    for a, b in zip(cu_seqlens[:-1], cu_seqlens[1:]):
        outs.append(F.scaled_dot_product_attention(q_hTd[:, a:b], k_hTd[:, a:b], v_hTd[:, a:b],
                                                   is_causal=True))
    return torch.cat(outs, dim=1)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Block(nn.Module):
    def __init__(self, cfg: TinyMoEConfig, ep_size: int, ep_rank: int, ep_group, redundant: int = 0):
        super().__init__()
        H = cfg.hidden
        self.heads = cfg.heads
        self.attn_norm = RMSNorm(H)
        self.qkv = nn.Linear(H, 3 * H, bias=False)
        self.proj = nn.Linear(H, H, bias=False)
        self.moe_norm = RMSNorm(H)
        self.moe = MoELayer(H, cfg.ffn, cfg.num_experts, cfg.top_k, ep_size, ep_rank, ep_group,
                            redundant=redundant)

    def forward(self, x_TH, cu_seqlens: list[int], routes_TK=None):
        T, H = x_TH.shape
        q, k, v = self.qkv(self.attn_norm(x_TH)).split(H, dim=1)
        to_heads = lambda t: t.reshape(T, self.heads, H // self.heads).transpose(0, 1)  # noqa: E731
        a = varlen_causal_attention(to_heads(q), to_heads(k), to_heads(v), cu_seqlens)
        x_TH = x_TH + self.proj(a.transpose(0, 1).reshape(T, H))
        y, _ = self.moe(self.moe_norm(x_TH), routes_TK)
        return x_TH + y


class TinyMoE(nn.Module):
    """Embedding → L × (attention + MoE) → norm → LM head. ``ep_group`` None: one process holds
    all experts; else this rank holds slots ``ep_rank·S/P ..`` of every layer (S = E + redundant).

    ``phy2log_LS`` (``[L, S]``, docs/model.md "Placement"; default: slot s holds expert s mod E)
    places the experts; every replica of an expert starts from the same logical weights."""

    def __init__(self, cfg: TinyMoEConfig, ep_size: int = 1, ep_rank: int = 0, ep_group=None,
                 phy2log_LS=None):
        check_type(cfg, "cfg", TinyMoEConfig)
        ep_size = check_int(ep_size, "ep_size", 1, INT64_MAX)
        check_int(ep_rank, "ep_rank", 0, ep_size - 1)
        if phy2log_LS is not None:
            phy2log_LS = int_array(phy2log_LS, "phy2log_LS", ndim=2, lo=0, hi=cfg.num_experts - 1)
            if phy2log_LS.shape[0] != cfg.num_layers or phy2log_LS.shape[1] < cfg.num_experts:
                raise InputError(f"phy2log_LS: expected shape [{cfg.num_layers}, S ≥ {cfg.num_experts}], "
                                 f"got {list(phy2log_LS.shape)}")
        super().__init__()
        self.cfg = cfg
        redundant = 0 if phy2log_LS is None else int(np.asarray(phy2log_LS).shape[1]) - cfg.num_experts
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg, ep_size, ep_rank, ep_group, redundant)
                                    for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden)
        self.head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        self._init_weights(phy2log_LS)

    @property
    def moe_layers(self) -> list[MoELayer]:
        return [b.moe for b in self.blocks]

    def dense_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """Parameters replicated on every rank (everything but expert slots), by name."""
        return [(n, p) for n, p in self.named_parameters() if ".slots." not in n]

    def expert_parameters(self) -> list[nn.Parameter]:
        return [p for m in self.moe_layers for p in m.slots.slot_params()]

    @torch.no_grad()
    def _init_weights(self, phy2log_LS) -> None:
        cfg = self.cfg
        g = torch.Generator().manual_seed(cfg.seed)
        for n, p in self.named_parameters():
            if ".slots." in n:
                continue
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (0.5 / p.shape[-1] ** 0.5))
        H, Fw, E = cfg.hidden, cfg.ffn, cfg.num_experts
        for l, moe in enumerate(self.moe_layers):
            if phy2log_LS is not None:
                moe.set_phy2log(np.asarray(phy2log_LS)[l])
            # logical weights of all E experts (same draw whatever the placement) → own slots
            w_gate = torch.randn(E, H, Fw, generator=g) / H ** 0.5
            w_up = torch.randn(E, H, Fw, generator=g) / H ** 0.5
            w_down = torch.randn(E, Fw, H, generator=g) / Fw ** 0.5
            for e, s in moe.local_experts():
                moe.slots.w_gate_SHF[s] = w_gate[e]
                moe.slots.w_up_SHF[s] = w_up[e]
                moe.slots.w_down_SFH[s] = w_down[e]

    def forward(self, tokens_T, cu_seqlens, routes_TLK=None):
        cu = cu_seqlens.tolist() if torch.is_tensor(cu_seqlens) else list(cu_seqlens)
        x = self.embed(tokens_T)
        for l, block in enumerate(self.blocks):
            x = block(x, cu, None if routes_TLK is None else routes_TLK[:, l])
        return self.head(self.norm(x))

    def loss_sum(self, mb) -> torch.Tensor:
        """Summed next-token cross-entropy inside each sample of micro-batch ``mb`` (the last
        token of a sample has no target)."""
        logits_TV = self(mb.tokens_T, mb.cu_seqlens, mb.routes_TLK)
        T = logits_TV.shape[0]
        ends = mb.cu_seqlens[1:].long() - 1
        has_next = torch.ones(T, dtype=torch.bool, device=logits_TV.device)
        has_next[ends] = False
        target = torch.roll(mb.tokens_T, -1)
        return F.cross_entropy(logits_TV[has_next], target[has_next], reduction="sum")


def logical_expert_tensors(model: TinyMoE, optimizer=None, all_replicas: bool = False) -> dict:
    """Copies of every expert this rank holds, keyed by (layer, logical expert): weights, grads
    (if present) and tensor optimizer state — what must be invariant under re-placement. An
    expert with several local replicas: the first (lowest slot); with ``all_replicas`` the key is
    (layer, logical expert, local slot) and every replica is listed."""
    check_type(model, "model", TinyMoE)
    check_bool(all_replicas, "all_replicas")
    out: dict = {}
    for l, moe in enumerate(model.moe_layers):
        for e, s in moe.local_experts():
            key = (l, e, s) if all_replicas else (l, e)
            if key in out:
                continue
            d = {}
            for p, name in zip(moe.slots.slot_params(), ("w_gate", "w_up", "w_down")):
                d[name] = p.detach()[s].clone()
                if p.grad is not None:
                    d[name + ".grad"] = p.grad[s].clone()
                if optimizer is not None:
                    for k, v in optimizer.state.get(p, {}).items():
                        if torch.is_tensor(v) and v.dim() > 0:
                            d[f"{name}.{k}"] = v[s].clone()
            out[key] = d
    return out

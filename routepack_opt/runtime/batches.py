"""Packed micro-batches of one DP rank from a plan, with the replayed routes sliced to their tokens.

Legend (shape suffixes): N samples, T tokens, L MoE layers, K router top-k, R rows (micro-batches
per DP slot), n samples of one micro-batch.

Tokens of the whole window are laid out in sample order (sample 0's tokens, then sample 1's, ...),
which is how routing replay records them (:meth:`routepack_opt.core.window.Window.from_routes`). A
micro-batch concatenates the tokens of its cell's samples ("packing"); ``cu_seqlens`` marks the
sample boundaries so attention stays per sample (varlen attention), ``position_ids`` restart at 0
in every sample, and ``token_index`` says where each packed token sits in the window order, so the
outputs of a rank's micro-batches can be put back in sample order (``restore_order``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from routepack_opt.core.checks import INT64_MAX, check_int, check_type, int_array
from routepack_opt.core.errors import InputError
from routepack_opt.core.plan import Plan
from routepack_opt.core.window import Window

__all__ = ["MicroBatch", "RankBatches", "build_microbatches", "routes_from_counts",
           "synthetic_tokens", "sample_offsets"]


@dataclasses.dataclass(frozen=True)
class MicroBatch:
    """One packed micro-batch (cell ``(row, dp_rank)`` of a plan)."""

    row: int
    dp_rank: int
    sample_ids: torch.Tensor  # [n] window sample ids, in packing order
    tokens_T: torch.Tensor  # [T] token ids, samples concatenated
    cu_seqlens: torch.Tensor  # [n + 1] int32 sample boundaries (FlashAttention varlen convention)
    position_ids_T: torch.Tensor  # [T] position inside its sample
    token_index_T: torch.Tensor  # [T] index of each packed token in the window's token order
    routes_TLK: torch.Tensor | None  # [T, L, K] replayed logical expert ids, or None

    @property
    def num_tokens(self) -> int:
        return int(self.tokens_T.shape[0])

    @property
    def lengths(self) -> list[int]:
        return torch.diff(self.cu_seqlens).tolist()


@dataclasses.dataclass(frozen=True)
class RankBatches:
    """The R micro-batches of one DP rank and the order that restores per-sample outputs:
    ``torch.cat(outputs_of_microbatches)[restore_order]`` lists the rank's tokens in window
    order (ascending sample id, then position)."""

    dp_rank: int
    microbatches: list[MicroBatch]
    restore_order: torch.Tensor  # [T_rank]

    def restore(self, outputs: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(outputs)[self.restore_order]


def sample_offsets(lengths_N) -> np.ndarray:
    """``offsets[i]`` = first token of sample i in window order (exclusive prefix sum)."""
    lengths_N = int_array(lengths_N, "lengths", ndim=1, lo=0)
    return np.concatenate([[0], np.cumsum(lengths_N)[:-1]]).astype(np.int64)


def synthetic_tokens(window: Window, vocab: int, seed: int = 0) -> np.ndarray:
    """Token ids ``tokens_T`` in window order (stand-in for the rollout's real tokens)."""
    check_type(window, "window", Window)
    vocab = check_int(vocab, "vocab", 1, INT64_MAX)
    rng = np.random.default_rng(check_int(seed, "seed", 0, INT64_MAX))
    return rng.integers(0, vocab, size=window.total_tokens, dtype=np.int64)


def routes_from_counts(window: Window, seed: int | None = 0) -> np.ndarray:
    """Per-token replayed routes ``routes_TLK`` whose aggregate is exactly ``window.counts``.

    For each (sample, layer) the k·len expert copies, sorted by expert, are dealt to tokens in
    stride ``len``: token t takes copies t, t+len, ..., t+(k-1)·len. An expert's copies are a
    contiguous run of at most len (counts ≤ len), so a token never gets one expert twice. With a
    seed, tokens are then shuffled within the sample (independently per layer).
    """
    check_type(window, "window", Window)
    if seed is not None:
        check_int(seed, "seed", 0, INT64_MAX)
    lengths_N, counts_NLE, K = window.lengths, window.counts, window.top_k
    N, L, E = counts_NLE.shape
    routes_TLK = np.empty((window.total_tokens, L, K), dtype=np.int64)
    offs_N = sample_offsets(lengths_N)
    rng = None if seed is None else np.random.default_rng(seed)
    experts = np.arange(E)
    for i in range(N):
        n = int(lengths_N[i])
        for l in range(L):
            copies = np.repeat(experts, counts_NLE[i, l])  # k·n, sorted by expert
            r_nK = copies.reshape(K, n).T
            if rng is not None:
                r_nK = r_nK[rng.permutation(n)]
            routes_TLK[offs_N[i]:offs_N[i] + n, l] = r_nK
    return routes_TLK


def build_microbatches(plan: Plan, window: Window, dp_rank: int, tokens_T=None,
                       routes_TLK=None, device: str | torch.device = "cpu") -> RankBatches:
    """The R packed micro-batches of DP rank ``dp_rank`` under ``plan``.

    ``tokens_T`` (window order, default: zeros) and ``routes_TLK`` (replayed routes in window
    order, optional) are sliced to each micro-batch's tokens. Raises :class:`InputError` if the
    plan does not match the window or the rank is out of range.
    """
    check_type(plan, "plan", Plan)
    check_type(window, "window", Window)
    errs = plan.validate(window)
    if errs:
        raise InputError("plan does not match the window: " + "; ".join(errs[:3]))
    D = plan.topology.dp
    dp_rank = check_int(dp_rank, "dp_rank", 0, D - 1)
    T_total = window.total_tokens
    if tokens_T is None:
        tokens_T = np.zeros(T_total, dtype=np.int64)
    tokens_T = torch.as_tensor(np.asarray(tokens_T), dtype=torch.long)
    if tokens_T.shape != (T_total,):
        raise InputError(f"tokens: expected {T_total} token ids (window order), got shape {tuple(tokens_T.shape)}")
    if routes_TLK is not None:
        routes_TLK = torch.as_tensor(np.asarray(routes_TLK), dtype=torch.long)
        want = (T_total, window.num_layers, window.top_k)
        if tuple(routes_TLK.shape) != want:
            raise InputError(f"routes: expected shape {list(want)}, got {list(routes_TLK.shape)}")
    offs_N = sample_offsets(window.lengths)
    cells = plan.cells()
    mbs: list[MicroBatch] = []
    index_parts = []
    for r in range(plan.rows):
        ids = np.asarray(cells[r][dp_rank], dtype=np.int64)
        lens = window.lengths[ids]
        # token_index: for each sample its contiguous window range, concatenated (vectorised)
        starts = np.repeat(offs_N[ids], lens)
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        pos = np.arange(int(cu[-1]), dtype=np.int64) - np.repeat(cu[:-1], lens)
        tok_idx = torch.from_numpy(starts + pos)
        index_parts.append(tok_idx)
        mbs.append(MicroBatch(
            row=r, dp_rank=int(dp_rank), sample_ids=torch.from_numpy(ids).to(device),
            tokens_T=tokens_T[tok_idx].to(device),
            cu_seqlens=torch.from_numpy(cu).to(torch.int32).to(device),
            position_ids_T=torch.from_numpy(pos).to(device),
            token_index_T=tok_idx.to(device),
            routes_TLK=None if routes_TLK is None else routes_TLK[tok_idx].to(device)))
    all_idx = torch.cat(index_parts)
    restore = torch.argsort(all_idx, stable=True).to(device)
    return RankBatches(dp_rank=int(dp_rank), microbatches=mbs, restore_order=restore)

"""slime's own layout of a step, as ``slime.utils.dp_schedule`` builds it: token-budget steps,
first-fit bins under the cap, bins split to an aligned count, dealt to ranks (round-robin, or
Karmarkar–Karp on per-sample weights). The seam scores it against ours and falls back to it.
"""

from __future__ import annotations

import numpy as np

from routepack_opt.core.errors import InputError
from routepack_opt.heuristics.cells import kk_partition
from routepack_opt.integrations._seam import FrameworkAssertionError

__all__ = ["MULTIMODAL_SEPARATE", "token_steps", "slime_layout"]

MULTIMODAL_SEPARATE = ("separate", "separate_raw")


def token_steps(rids: list, by_rollout: dict, lengths: list[int], budget: int, dp: int) -> list[list]:
    """slime's token-budget steps (``args.global_batch_tokens``): from each start, the prefixes of
    the remaining rollouts whose sample count is a positive multiple of ``dp`` are candidates;
    the step ends at the first candidate reaching ``budget`` tokens, or at the candidate before it
    when that one is strictly nearer the budget; without one reaching it, the step is all the rest.
    A step whose sample count is not such a multiple ends the schedule (its rollouts are dropped)."""
    if budget <= 0:
        raise InputError(f"target_tokens must be positive, got {budget}")
    n_R = np.array([len(by_rollout[r]) for r in rids], dtype=np.int64)
    t_R = np.array([sum(lengths[i] for i in by_rollout[r]) for r in rids], dtype=np.int64)
    steps, start, n = [], 0, len(rids)
    while start < n:
        cnt = np.cumsum(n_R[start:])
        tok = np.cumsum(t_R[start:])
        aligned = np.flatnonzero((cnt >= dp) & (cnt % dp == 0))
        end = n  # exclusive
        reach = aligned[tok[aligned] >= budget]
        if reach.size:
            c = int(reach[0])
            before = aligned[aligned < c]
            end = start + c + 1
            if before.size and budget - tok[before[-1]] < tok[c] - budget:
                end = start + int(before[-1]) + 1
        count = int(n_R[start:end].sum())
        if count < dp or count % dp:
            break
        steps.append(rids[start:end])
        start = end
    return steps


def _first_fit(len_n: list[int], cap: int, mm: list[bool] | None = None, padded: bool = False) -> list[list[int]]:
    """slime's first-fit: each sample into the first bin it fits (sum ≤ cap), else a new bin; an
    oversize sample opens its own. With ``mm`` (multimodal flags) a bin holds one kind only, and
    with ``padded`` a multimodal bin costs ``count · max length``."""
    bins: list[list[int]] = []
    tot: list[int] = []
    peak: list[int] = []
    kind: list[bool] = []
    for i, x in enumerate(len_n):
        m = bool(mm[i]) if mm is not None else False
        for j in range(len(bins)):
            if mm is not None and kind[j] != m:
                continue
            load = max(peak[j], x) * (len(bins[j]) + 1) if (m and padded) else tot[j] + x
            if load <= cap:
                bins[j].append(i)
                tot[j] += x
                peak[j] = max(peak[j], x)
                break
        else:
            bins.append([i])
            tot.append(x)
            peak.append(x)
            kind.append(m)
    return bins


def _split_to(bins: list[list[int]], target: int, len_n: list[int]) -> None:
    """slime's alignment: split the bin with the most tokens (among those of ≥ 2 samples; ties
    to the later bin) into two halves by LPT until there are ``target`` bins or none can split."""
    while len(bins) < target:
        cand = [(sum(len_n[i] for i in b), j) for j, b in enumerate(bins) if len(b) > 1]
        if not cand:
            return
        _, j = max(cand)
        halves: list[list[int]] = [[], []]
        sums = [0, 0]
        for i in sorted(bins[j], key=lambda i: -len_n[i]):
            h = 0 if sums[0] <= sums[1] else 1
            halves[h].append(i)
            sums[h] += len_n[i]
        bins[j] = halves[0]
        bins.append(halves[1])


def _deal(bins: list[list[int]], dp: int, weight_n=None) -> list[list[list[int]]]:
    """Bins to ranks as slime does: round-robin (bin k → rank k mod dp), or with ``weight_n`` KK
    over the bins' summed weights with equal counts; each rank's bins in index order. Returns
    ``cells[r][d]``."""
    K = len(bins)
    if weight_n is None:
        part_K = np.arange(K) % dp
    else:
        part_K = kk_partition([sum(weight_n[i] for i in b) for b in bins], dp, equal_size=True)
    per_rank = [[bins[k] for k in range(K) if part_K[k] == d] for d in range(dp)]
    R = K // dp
    return [[list(per_rank[d][r]) for d in range(dp)] for r in range(R)]


def _static_message(n: int, K: int, mbs: int, dp: int, group: int) -> str:
    return (f"static path: num_mbs ({K}) is not a multiple of dp_size * mb_group ({dp * group}); got "
            f"step_size={n}, micro_batch_size={mbs}, dp_size={dp}, mb_group={group}. Splitting static "
            "mbs would break the fixed-size invariant; adjust the config so step_size % "
            "(dp_size * micro_batch_size * mb_group) == 0.")


def slime_layout(step_len: list[int], *, dynamic: bool, cap: int, mbs: int, dp: int, group: int,
                  weight_n=None, mm=None, mm_mode: str = "off") -> list[list[list[int]]] | None:
    """slime's own layout of one step (``cells[r][d]``, local indices), or None where slime's
    bin splitting cannot reach the aligned count (slime asserts there)."""
    align = dp * group
    n = len(step_len)
    if dynamic:
        use_mm = mm is not None and mm_mode in MULTIMODAL_SEPARATE and any(mm)
        bins = _first_fit(step_len, cap, mm if use_mm else None, padded=mm_mode == "separate")
        target = max(-(-len(bins) // align) * align, align)
        _split_to(bins, target, step_len)
        if len(bins) != target:
            return None
    else:
        bins = [list(range(i, min(i + mbs, n))) for i in range(0, n, mbs)]
        if len(bins) % align:
            raise FrameworkAssertionError(_static_message(n, len(bins), mbs, dp, group))
    return _deal(bins, dp, weight_n)

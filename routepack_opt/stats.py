"""Window statistics that decide how much placement and packing can win (``routepack stats``).

Legend: N samples, L layers, E experts, K top-k, B a block of samples, M = B·L rows.

- **Routing dispersion** at n tokens (issue 15): for every sample i with ≥ n tokens and every
  layer l, subsample the routes of n tokens of sample i without replacement — a multivariate
  hypergeometric draw of m = K·n routes from its K·len routes (counts do not say which routes
  belong to one token, so routes, not tokens, are drawn; a sample of exactly n tokens is used as
  is) — giving counts c; with p the window's aggregate expert distribution at layer l,
  ``X = Σ_{e: p_e > 0} (c_e − m p_e)² / (m p_e) / (E − 1)``. Median and mean over (i, l).
  X ≈ 1: samples route like the aggregate (a multinomial draw from p gives E[X] = 1 − Σp²/(E−1)
  ≈ 1; tokens with K *distinct* experts give a little less, e.g. 0.89 for 64 experts top-6);
  larger X: sample-specific routing (co-activation) that packing can exploit.
- **Skew** per layer: busiest / mean expert load and the CV of expert loads.
- **Lengths**: CV, max / median, and the same within GRPO groups when ``group_ids`` exist.
"""

from __future__ import annotations

import numpy as np

from routepack_opt.certify import pack_into_bins
from routepack_opt.core.errors import InputError
from routepack_opt.core.evaluate import Evaluator
from routepack_opt.core.objective import Objective
from routepack_opt.core.window import Window
from routepack_opt.heuristics.baselines import verl_kk_layout
from routepack_opt.pipeline import resolve_placement, resolve_rows

__all__ = ["routing_dispersion", "dispersion_of_counts", "length_stats", "skew_stats",
           "window_stats", "implications"]


def _subsample_routes(c_ME: np.ndarray, total_M: np.ndarray, m: int, rng) -> np.ndarray:
    """A multivariate hypergeometric draw of ``m`` routes from every row of ``c_ME`` (conditional
    hypergeometrics expert by expert, vectorised over rows; ``total_M`` = row sums ≥ m)."""
    out = np.zeros_like(c_ME)
    need = np.full(c_ME.shape[0], m, dtype=np.int64)
    rest = total_M.astype(np.int64).copy()
    for e in range(c_ME.shape[1] - 1):
        good = c_ME[:, e]
        x = rng.hypergeometric(good, rest - good, need)
        out[:, e] = x
        need -= x
        rest -= good
    out[:, -1] = need  # the last expert takes what is left (exactly its conditional draw)
    return out


def dispersion_of_counts(c_ME: np.ndarray, p_ME: np.ndarray) -> np.ndarray:
    """``X`` per row for counts ``c`` (m = row sum) against distributions ``p`` (rows sum to 1)."""
    c = c_ME.astype(np.float64)
    m = c.sum(axis=1, keepdims=True)
    mp = m * p_ME
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p_ME > 0, (c - mp) ** 2 / np.where(mp > 0, mp, 1.0), 0.0)
    E = c_ME.shape[1]
    return terms.sum(axis=1) / max(E - 1, 1)


def routing_dispersion(window: Window, tokens: int = 64, seed: int = 0,
                       max_samples: int | None = 4096) -> dict:
    """Routing dispersion of ``window`` at ``tokens`` tokens (module docstring): ``{"median",
    "mean", "tokens", "pairs", "samples_used", "samples_short"}``. Deterministic for a ``seed``;
    at most ``max_samples`` eligible samples are used (a seeded random subset; None = all)."""
    if isinstance(tokens, bool) or not isinstance(tokens, (int, np.integer)) or tokens < 1:
        raise InputError(f"--tokens must be a positive integer, got {tokens!r}")
    if max_samples is not None and max_samples < 1:
        raise InputError(f"max_samples must be ≥ 1, got {max_samples}")
    rng = np.random.default_rng(np.random.SeedSequence([abs(int(seed)), 15]))
    K, (_, L, E) = window.top_k, window.counts.shape
    eligible = np.flatnonzero(window.lengths >= tokens)
    if max_samples is not None and eligible.size > max_samples:
        eligible = np.sort(rng.choice(eligible, size=max_samples, replace=False))
    res = {"tokens": int(tokens), "samples_used": int(eligible.size),
           "samples_short": int(np.count_nonzero(window.lengths < tokens))}
    if eligible.size == 0:
        res.update(median=float("nan"), mean=float("nan"), pairs=0)
        return res
    load_LE = window.expert_loads().astype(np.float64)
    p_LE = load_LE / load_LE.sum(axis=1, keepdims=True)
    m = K * int(tokens)
    B = max(1, (1 << 20) // (L * E))
    xs = []
    for lo in range(0, eligible.size, B):
        idx = eligible[lo:lo + B]
        c_ME = np.asarray(window.counts[idx], dtype=np.int64).reshape(-1, E)
        total_M = np.repeat(K * window.lengths[idx], L)
        sub = _subsample_routes(c_ME, total_M, m, rng)
        p_ME = np.broadcast_to(p_LE[None], (idx.size, L, E)).reshape(-1, E)
        xs.append(dispersion_of_counts(sub, p_ME))
    x = np.concatenate(xs)
    res.update(median=float(np.median(x)), mean=float(x.mean()), pairs=int(x.size))
    return res


def length_stats(window: Window) -> dict:
    """CV, max/median of lengths; within GRPO groups (when ``group_ids`` exist) the median and max
    over groups of the group's max/median and CV."""
    len_N = window.lengths.astype(np.float64)
    med = float(np.median(len_N))
    out = {"samples": window.num_samples, "tokens": window.total_tokens, "mean": float(len_N.mean()),
           "median": med, "max": int(window.lengths.max()), "min": int(window.lengths.min()),
           "cv": float(len_N.std() / len_N.mean()), "max_over_median": float(len_N.max() / med)}
    if window.group_ids is not None:
        _, g_N = np.unique(window.group_ids, return_inverse=True)
        order = np.lexsort((len_N, g_N))
        g_sorted, l_sorted = g_N[order], len_N[order]
        starts = np.flatnonzero(np.r_[True, g_sorted[1:] != g_sorted[:-1]])
        sizes = np.diff(np.r_[starts, g_sorted.size])
        gmax = l_sorted[starts + sizes - 1]
        lo_mid, hi_mid = starts + (sizes - 1) // 2, starts + sizes // 2
        gmed = 0.5 * (l_sorted[lo_mid] + l_sorted[hi_mid])
        gsum = np.add.reduceat(l_sorted, starts)
        gsq = np.add.reduceat(l_sorted ** 2, starts)
        gmean = gsum / sizes
        gcv = np.sqrt(np.maximum(gsq / sizes - gmean ** 2, 0.0)) / gmean
        ratio = gmax / gmed
        out["groups"] = {"count": int(starts.size), "size_median": float(np.median(sizes)),
                         "max_over_median_median": float(np.median(ratio)),
                         "max_over_median_max": float(ratio.max()),
                         "cv_median": float(np.median(gcv))}
    return out


def skew_stats(window: Window) -> dict:
    """Per-layer busiest/mean expert load and CV of expert loads (median, min, max over layers)."""
    load_LE = window.expert_loads().astype(np.float64)
    mean_L = load_LE.mean(axis=1)
    mm_L = load_LE.max(axis=1) / mean_L
    cv_L = load_LE.std(axis=1) / mean_L
    return {"max_over_mean": {"median": float(np.median(mm_L)), "min": float(mm_L.min()),
                              "max": float(mm_L.max()), "per_layer": mm_L.tolist()},
            "cv": {"median": float(np.median(cv_L)), "min": float(cv_L.min()), "max": float(cv_L.max()),
                   "per_layer": cv_L.tolist()},
            "ceiling": window.num_experts / window.top_k}


def implications(window: Window, topology, cost) -> dict:
    """What the statistics imply for this topology and cost, all from the one evaluator: the
    length-only baseline (identity placement + verl-KK packing, R*), reorder (LPT + the same
    packing), and the bounds. ``any_plan_max_gain`` = 1 − placement-free LB / baseline: no plan
    (placement + packing) can gain more. ``placement_lb_drop`` = 1 − placement-free LB / LB of
    the identity placement: how far any placement can lower the bound at all."""
    ev = Evaluator(window, topology, cost)
    R, cert = resolve_rows(window, topology, None)
    row, slot = verl_kk_layout(window.lengths, topology, R, exact_pack=pack_into_bins)
    ident, _ = resolve_placement(window, topology, "identity")
    lpt, _ = resolve_placement(window, topology, "lpt")
    out = {"rows": int(R)}
    for objective in Objective:
        base = ev.score(ident, row, slot, R, objective).makespan
        reo = ev.score(lpt, row, slot, R, objective).makespan
        out[objective] = {"baseline": base, "reorder": reo, "reorder_gain": (base - reo) / base}
    lb_id = ev.lower_bound(ident, R)
    lb_lpt = ev.lower_bound(lpt, R)
    lb_free = ev.placement_free_lower_bound(R)
    base = out[Objective.MAX_SUM]["baseline"]
    J, A_SRG, M_RGL = ev.costs(ident, row, slot, R, parts=True)
    load_LE = window.expert_loads().astype(np.float64)
    expert_free = cost.gamma * np.maximum(load_LE.sum(axis=1) / topology.ep, load_LE.max(axis=1)).sum()
    out.update(lower_bound_identity=lb_id, lower_bound_lpt=lb_lpt, lower_bound_free=lb_free,
               placement_lb_drop=1 - lb_free / lb_id, any_plan_max_gain=1 - lb_free / base,
               expert_share_of_lb=float(expert_free / topology.num_shards / lb_free))
    return out


def window_stats(window: Window, tokens: int = 64, seed: int = 0, max_samples: int | None = 4096) -> dict:
    """Size, lengths, skew and routing dispersion of ``window``. Where no sample has ``tokens``
    tokens the dispersion is undefined: its ``median`` and ``mean`` are None (JSON null), with
    ``pairs`` 0 and every sample counted in ``samples_short``."""
    disp = routing_dispersion(window, tokens, seed, max_samples)
    if disp["pairs"] == 0:
        disp.update(median=None, mean=None)
    return {"samples": window.num_samples, "layers": window.num_layers, "experts": window.num_experts,
            "top_k": window.top_k, "lengths": length_stats(window), "skew": skew_stats(window),
            "routing_dispersion": disp}

"""Synthetic routing-replay traces that look like MoE RL data (``routepack gen-trace``).

Legend: N samples, L layers, E experts, K top-k, Dm domains.

What the generator models, and why:
- GRPO prompt groups (size 8–16): samples of one prompt share the prompt length, a difficulty
  that scales their response lengths (lengths correlate within a group), and a domain.
- Long-tailed response lengths (log-normal), truncated at the capacity: RL rollouts that hit the
  max response length are common.
- Expert popularity skewed per layer (log-normal popularity, sd ``expert_skew``); a domain
  preference per (domain, layer) — samples of one prompt group route alike; per-group and
  per-sample variation on top.
- Drift: the popularity logits follow a random walk over policy updates (``drift`` per step), so a
  sequence of windows (optimizer steps) drifts, and ``routing_step`` lets a window's samples be
  routed by an older policy (replay staleness).
- Control: ``uniform=True`` gives equal lengths and uniform routing.

Counts are exact: Σ_e counts = k·len and counts ≤ len (probabilities are capped at 1/k by water
filling, drawn multinomially, then any overflow is moved to experts with room).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from routepack_opt.cost import get_preset
from routepack_opt.errors import InputError
from routepack_opt.window import Window

__all__ = ["TraceConfig", "trace_config", "generate_window", "generate_sequence"]


@dataclasses.dataclass(frozen=True)
class TraceConfig:
    num_layers: int
    num_experts: int
    top_k: int
    capacity: int
    group_size_min: int = 8
    group_size_max: int = 16
    prompt_mean: float = 0.06  # mean prompt length, fraction of capacity
    response_mean: float = 0.22  # median response length, fraction of capacity
    length_sigma: float = 0.8  # log-normal spread of response lengths (0 = equal in a group)
    group_length_share: float = 0.6  # share of the log-variance explained by the prompt group
    expert_skew: float = 0.7  # sd of per-layer log expert popularity (0 = uniform)
    num_domains: int = 6
    domain_strength: float = 0.6  # sd of per-(domain, layer) preference logits
    group_noise: float = 0.3  # sd of per-group logits
    sample_noise: float = 0.3  # sd of per-sample logits
    drift: float = 0.05  # sd of the per-step random walk of popularity logits
    uniform: bool = False  # control: equal lengths, uniform routing

    def __post_init__(self):
        for key in ("num_layers", "num_experts", "top_k", "capacity", "group_size_min",
                    "group_size_max", "num_domains"):
            v = getattr(self, key)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                raise InputError(f"trace: {key} must be a positive integer, got {v!r}")
        if self.top_k > self.num_experts:
            raise InputError(f"trace: top_k={self.top_k} exceeds num_experts={self.num_experts}")
        if self.group_size_min > self.group_size_max:
            raise InputError("trace: group_size_min > group_size_max")
        for key in ("prompt_mean", "response_mean", "length_sigma", "group_length_share",
                    "expert_skew", "domain_strength", "group_noise", "sample_noise", "drift"):
            v = getattr(self, key)
            if not np.isfinite(v) or v < 0:
                raise InputError(f"trace: {key} must be finite and ≥ 0, got {v!r}")
        if self.group_length_share > 1:
            raise InputError("trace: group_length_share must be in [0, 1]")
        if self.prompt_mean + self.response_mean > 1:
            raise InputError("trace: prompt_mean + response_mean must be ≤ 1 (fractions of capacity)")


def trace_config(preset: str = "qwen3-30b-a3b", **overrides) -> TraceConfig:
    """The preset's shape (L, E, k, capacity) with any field overridden."""
    cfg = get_preset(preset).config
    base = dict(num_layers=cfg.moe_layers, num_experts=cfg.experts, top_k=cfg.top_k,
                capacity=cfg.capacity)
    unknown = set(overrides) - {f.name for f in dataclasses.fields(TraceConfig)}
    if unknown:
        raise InputError(f"trace: unknown option(s) {', '.join(sorted(unknown))}")
    base.update(overrides)
    return TraceConfig(**base)


def _rng(*key: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([abs(int(k)) for k in key]))


def _policy_logits(cfg: TraceConfig, seed: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-layer popularity logits [L, E] and domain preferences [Dm, L, E] at a policy step."""
    L, E = cfg.num_layers, cfg.num_experts
    rng = _rng(seed, 1)
    base = rng.normal(0.0, cfg.expert_skew, size=(L, E))
    dom = rng.normal(0.0, cfg.domain_strength, size=(cfg.num_domains, L, E))
    for t in range(1, step + 1):  # random walk of the policy's routing
        r = _rng(seed, 2, t)
        base = base + r.normal(0.0, cfg.drift, size=(L, E))
        dom = dom + r.normal(0.0, cfg.drift, size=(cfg.num_domains, L, E))
    return base, dom


def _capped_probs(logits: np.ndarray, cap: float) -> np.ndarray:
    """Softmax over the last axis with every probability ≤ cap (water filling on the rows that
    need it)."""
    E = logits.shape[-1]
    flat = logits.reshape(-1, E)
    p = np.exp(flat - flat.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    rows = np.flatnonzero(p.max(axis=1) > cap)
    if rows.size:
        q = p[rows]
        for _ in range(64):
            over = q > cap
            if not over.any():
                break
            fixed = np.where(over, cap, 0.0)
            free = np.where(over, 0.0, q)
            mass_left = 1.0 - fixed.sum(axis=1, keepdims=True)
            q = fixed + free * (mass_left / np.maximum(free.sum(axis=1, keepdims=True), 1e-300))
        p[rows] = np.minimum(q, cap)
    return p.reshape(logits.shape)


def _draw_counts(lengths_N: np.ndarray, probs_NLE: np.ndarray, k: int, rng) -> np.ndarray:
    N, L, E = probs_NLE.shape
    n = np.repeat(k * lengths_N, L)
    pv = probs_NLE.reshape(N * L, E)
    pv = pv / pv.sum(axis=1, keepdims=True)
    counts = rng.multinomial(n, pv).astype(np.int64)
    cap = np.repeat(lengths_N, L)
    over_rows = np.flatnonzero((counts > cap[:, None]).any(axis=1))
    for j in over_rows:  # rare: move overflow to the most probable experts with room
        c, m = counts[j], cap[j]
        excess = int(np.maximum(c - m, 0).sum())
        c[:] = np.minimum(c, m)
        for e in np.argsort(-pv[j], kind="stable"):
            if excess == 0:
                break
            add = min(m - c[e], excess)
            c[e] += add
            excess -= add
    return counts.reshape(N, L, E)


def generate_window(preset: str = "qwen3-30b-a3b", num_samples: int = 1024, seed: int = 0,
                    step: int = 0, routing_step: int | None = None, **overrides) -> Window:
    """One synthetic window (optimizer step ``step``) of a preset-shaped model.

    ``routing_step`` (default ``step``) is the policy version whose routing the samples get:
    ``routing_step = step - k`` is routing replay recorded k policy updates earlier.
    """
    cfg = trace_config(preset, **overrides)
    if num_samples < 1:
        raise InputError(f"trace: num_samples must be ≥ 1, got {num_samples}")
    if step < 0 or (routing_step is not None and routing_step < 0):
        raise InputError("trace: step and routing_step must be ≥ 0")
    routing_step = step if routing_step is None else routing_step
    N, L, E, K, C = num_samples, cfg.num_layers, cfg.num_experts, cfg.top_k, cfg.capacity
    rng = _rng(seed, 3, step)  # the samples of this step (same whatever policy routes them)

    # --- GRPO groups --------------------------------------------------------------------------
    sizes = []
    while sum(sizes) < N:
        sizes.append(int(rng.integers(cfg.group_size_min, cfg.group_size_max + 1)))
    sizes[-1] -= sum(sizes) - N
    group_N = np.repeat(np.arange(len(sizes)), sizes)
    n_groups = len(sizes)

    # --- lengths --------------------------------------------------------------------------------
    if cfg.uniform:
        lengths = np.full(N, max(1, int(round((cfg.prompt_mean + cfg.response_mean) * C))), dtype=np.int64)
    else:
        prompt_G = np.clip(rng.lognormal(np.log(cfg.prompt_mean * C), 0.5, n_groups), 16, 0.5 * C)
        s_g = cfg.length_sigma * np.sqrt(cfg.group_length_share)
        s_i = cfg.length_sigma * np.sqrt(1.0 - cfg.group_length_share)
        mu_G = np.log(cfg.response_mean * C) + rng.normal(0.0, s_g, n_groups)
        resp = rng.lognormal(mu_G[group_N], s_i)
        lengths = np.rint(prompt_G[group_N] + resp).astype(np.int64)
        lengths = np.clip(lengths, 1, C)

    # --- routing --------------------------------------------------------------------------------
    if cfg.uniform:
        logits = np.zeros((N, L, E))
        domain_G = np.zeros(n_groups, dtype=np.int64)
    else:
        base_LE, dom_DLE = _policy_logits(cfg, seed, routing_step)
        domain_G = rng.integers(0, cfg.num_domains, n_groups)
        group_GLE = rng.normal(0.0, cfg.group_noise, size=(n_groups, L, E)).astype(np.float32)
        sample_NLE = rng.normal(0.0, cfg.sample_noise, size=(N, L, E)).astype(np.float32)
        logits = (base_LE[None] + dom_DLE[domain_G[group_N]] + group_GLE[group_N] + sample_NLE)
    # cap a little under 1/k so multinomial noise rarely overflows len (overflow is repaired)
    probs = _capped_probs(np.asarray(logits, dtype=np.float64), 0.9 / K)
    # common random numbers: the same draw for every routing_step, so staleness shows drift only
    counts = _draw_counts(lengths, probs, K, _rng(seed, 4, step))
    return Window(lengths, counts, top_k=K, group_ids=group_N, step=step)


def generate_sequence(preset: str = "qwen3-30b-a3b", num_samples: int = 1024, num_steps: int = 20,
                      seed: int = 0, staleness: int = 0, **overrides) -> list[Window]:
    """Windows of ``num_steps`` consecutive optimizer steps with drifting routing. With
    ``staleness`` k > 0, step t's samples are routed by the policy of step max(t - k, 0)."""
    return [generate_window(preset, num_samples, seed, step=t, routing_step=max(t - staleness, 0),
                            **overrides) for t in range(num_steps)]

"""Synthetic routing-replay traces that look like MoE RL data (``routepack gen-trace``).

Legend: N samples, L layers, E experts, K top-k, Dm domains, G groups, B a block of samples.

What the generator models, and why:
- GRPO prompt groups (size 8–16): samples of one prompt share the prompt length, a difficulty
  that scales their response lengths (lengths correlate within a group), and a domain.
- Long-tailed response lengths (log-normal), truncated at the capacity: RL rollouts that hit the
  max response length are common.
- Expert popularity skewed per layer, calibrated to real figures (issue 15): each layer's
  busiest/mean expert load is drawn around ``skew`` (median over layers; spread ``skew_spread`` in
  log space) — real: OLMoE 2.5–7.8 per domain and layer (median ≈ 4.5, computed from the shipped
  ``data/domain_expert_counts.json``), DeepSeek-V3/R1 serving median 5–8 (max 13.7).
- Co-activation: sample-specific routing = per-(domain, layer), per-group and per-sample logits
  (shapes ``domain_strength``, ``group_noise``, ``sample_noise``), scaled together so the window's
  routing dispersion at ``dispersion_tokens`` tokens (``routepack_opt.stats``) hits ``dispersion``.
  The scale is found by bisection on a fixed pilot window — a measured mapping, not a formula
  (target → measured dispersion per preset: experiments/results/realism/realism.md, section 1).
  Default 1.2: one real web-text stream measured 1.18 (a single-task RL batch is near that end);
  before this calibration the presets sat at ≈ 3–4.7.
- ``domains="olmoe"`` / ``"mixtral"``: each prompt group draws one of the real per-domain expert
  profiles of those models (interpolated across layers), with within-domain noise on top;
  ``domains=K`` (an int) gives K synthetic domains.
- Drift: the popularity logits follow a random walk over policy updates (``drift`` per step), so a
  sequence of windows (optimizer steps) drifts, and ``routing_step`` lets a window's samples be
  routed by an older policy (replay staleness).
- Control: ``uniform=True`` gives equal lengths and uniform routing.

Counts are exact: Σ_e counts = k·len and counts ≤ len (probabilities are capped at 0.9/k by water
filling, drawn multinomially, then any overflow is moved to experts with room).

Scale: counts are generated in blocks of samples whose random streams are keyed by the block
(never by the machine's memory), so ``generate_window`` and the streaming ``write_trace`` give the
same window for a seed; ``write_trace`` holds ~``PER_SAMPLE_BYTES`` per sample plus one block.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from importlib import resources
from pathlib import Path

import numpy as np

from routepack_opt.core.cost import get_preset
from routepack_opt.core.errors import InputError
from routepack_opt.core.window import Window, available_memory, counts_dtype, write_window_npz
from routepack_opt.stats import routing_dispersion

__all__ = ["TraceConfig", "trace_config", "generate_window", "generate_sequence", "write_trace",
           "domain_profiles", "routing_scale", "memory_needed", "DEFAULT_DISPERSION", "PRESET_SKEW", "PER_SAMPLE_BYTES"]

DEFAULT_DISPERSION = 1.2  # calibrated single-task setting (real single stream: 1.18 at 64 tokens)
# median busiest/mean expert load per layer: olmoe from the shipped OLMoE counts (median over the
# six base-model domains × three layers); the others from DeepSeek-V3/R1 serving (median 5–8)
# — an assumption for qwen3 and ling-hybrid, which publish no such figure.
PRESET_SKEW = {"olmoe-1b-7b": 4.5, "deepseek-v3": 6.5, "qwen3-30b-a3b": 6.5, "ling-hybrid": 6.5}
SKEW_SPREAD = 0.3  # sd of log(busiest/mean) across layers: DeepSeek's max 13.7 vs median ~6.5
PER_SAMPLE_BYTES = 64  # lengths, group ids and length-generation temporaries (int64/float64)
_BLOCK_ELEMS = 1 << 21  # samples per block = this // (L·E): blocks of ~16 MB float64
# Declared domain of the generator's sizes (real MoE models: E ≤ 384, L ≤ 94). Beyond them the
# dispersion calibration alone (512 pilot samples × min(L, 4) × E, ~20 times) runs for minutes.
MAX_EXPERTS = 4096
MAX_LAYERS = 4096
MAX_DOMAINS = 4096
# The routing policy (per-domain logits [Dm + 1, L, E], float64) is drawn for the window and again
# for every pilot of the calibration: at most 2^25 elements (256 MiB; real shapes: < 2^18).
MAX_POLICY_ELEMS = 2**25
# The policy's random walk draws (Dm + 1)·L·E normals per optimizer step: at most this many in all
# (a few seconds), so `--step 10^9` is refused instead of running for days.
MAX_DRIFT_DRAWS = 5 * 10**8


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
    skew: float = 4.5  # median over layers of busiest/mean expert popularity (1 = uniform)
    skew_spread: float = SKEW_SPREAD  # sd of log(busiest/mean) across layers
    expert_skew: float | None = None  # legacy: sd of log popularity (overrides skew)
    dispersion: float | None = None  # target routing dispersion (None: DEFAULT_DISPERSION, see below)
    dispersion_tokens: int = 64  # n of the dispersion the target refers to
    domains: str | None = None  # None: synthetic domains; "olmoe" / "mixtral": real profiles
    num_domains: int = 6
    # Shapes of the sample-specific logits (sd's relative to each other). With ``dispersion`` set
    # (or all three left at None) they are scaled together to hit the target; setting one of them
    # without ``dispersion`` uses the given sd's as they are (legacy raw mode).
    domain_strength: float | None = None  # per-(domain, layer) preference (default 0.6)
    group_noise: float | None = None  # per-group (default 0.3)
    sample_noise: float | None = None  # per-sample (default 0.3)
    drift: float = 0.05  # sd of the per-step random walk of popularity logits
    uniform: bool = False  # control: equal lengths, uniform routing

    def __post_init__(self):
        for key in ("num_layers", "num_experts", "top_k", "capacity", "group_size_min",
                    "group_size_max", "num_domains", "dispersion_tokens"):
            v = getattr(self, key)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                raise InputError(f"trace: {key} must be a positive integer, got {v!r}")
        for key, most in (("num_experts", MAX_EXPERTS), ("num_layers", MAX_LAYERS), ("num_domains", MAX_DOMAINS)):
            if getattr(self, key) > most:
                raise InputError(f"trace: {key} = {getattr(self, key):,} is out of range (at most {most:,})")
        policy = (self.num_domains + 1) * self.num_layers * self.num_experts
        if policy > MAX_POLICY_ELEMS:
            raise InputError(f"trace: (domains + 1) × L × E = {self.num_domains + 1} × {self.num_layers} × "
                             f"{self.num_experts} = {policy:,} policy logits, at most {MAX_POLICY_ELEMS:,}: "
                             "use fewer domains, layers or experts")
        if self.top_k > self.num_experts:
            raise InputError(f"trace: top_k={self.top_k} exceeds num_experts={self.num_experts}")
        if self.group_size_min > self.group_size_max:
            raise InputError("trace: group_size_min > group_size_max")
        for key in ("prompt_mean", "response_mean", "length_sigma", "group_length_share",
                    "skew", "skew_spread", "expert_skew", "dispersion", "domain_strength",
                    "group_noise", "sample_noise", "drift"):
            v = getattr(self, key)
            if v is None and key in ("expert_skew", "dispersion", "domain_strength", "group_noise",
                                     "sample_noise"):
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) \
                    or not np.isfinite(v) or v < 0:
                raise InputError(f"trace: {key} must be finite and ≥ 0, got {v!r}")
        if self.group_length_share > 1:
            raise InputError("trace: group_length_share must be in [0, 1]")
        if self.prompt_mean + self.response_mean > 1:
            raise InputError("trace: prompt_mean + response_mean must be ≤ 1 (fractions of capacity)")
        if self.skew < 1:
            raise InputError(f"trace: skew is busiest/mean expert load, ≥ 1; got {self.skew}")
        if self.dispersion is not None and not 0 < self.dispersion <= 1000:
            raise InputError(f"trace: dispersion must be in (0, 1000], got {self.dispersion}")
        if self.domains is not None and self.domains not in _DOMAIN_MODELS:
            raise InputError(f"trace: domains must be one of {', '.join(_DOMAIN_MODELS)} "
                             f"(or a number of synthetic domains), got {self.domains!r}")
        if self.domains is not None:
            domain_profiles(self.domains, self.num_layers, self.num_experts)  # checks E

    @property
    def raw_noise(self) -> bool:
        """Legacy mode: sd's given, no dispersion target — use them unscaled."""
        return self.dispersion is None and self.domains is None and any(
            v is not None for v in (self.domain_strength, self.group_noise, self.sample_noise))

    def shapes(self) -> tuple[float, float, float]:
        d, g, s = self.domain_strength, self.group_noise, self.sample_noise
        return (0.6 if d is None else float(d), 0.3 if g is None else float(g),
                0.3 if s is None else float(s))


def trace_config(preset: str = "qwen3-30b-a3b", **overrides) -> TraceConfig:
    """The preset's shape (L, E, k, capacity) and calibrated skew, with any field overridden.
    ``domains`` may be "olmoe", "mixtral" or an int (that many synthetic domains)."""
    cfg = get_preset(preset).config
    base = dict(num_layers=cfg.moe_layers, num_experts=cfg.experts, top_k=cfg.top_k,
                capacity=cfg.capacity, skew=PRESET_SKEW.get(preset, 4.5))
    unknown = set(overrides) - {f.name for f in dataclasses.fields(TraceConfig)}
    if unknown:
        raise InputError(f"trace: unknown option(s) {', '.join(sorted(unknown))}")
    base.update(overrides)
    skew, E, k = overrides.get("skew"), base["num_experts"], base["top_k"]
    if isinstance(skew, (int, float)) and isinstance(E, int) and isinstance(k, int) and k >= 1 and skew > E / k:
        # busiest/mean load ≤ E/k: a token picks an expert at most once
        raise InputError(f"trace: skew is busiest/mean expert load, at most E/k = {E}/{k} = {E / k:g}; "
                         f"got {skew:g}")
    dom = base.get("domains")
    if isinstance(dom, (int, np.integer)) and not isinstance(dom, bool):
        base["domains"], base["num_domains"] = None, int(dom)
    elif isinstance(dom, str) and dom.isdigit():
        base["domains"], base["num_domains"] = None, int(dom)
    return TraceConfig(**base)


def _rng(*key: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([abs(int(k)) for k in key]))


# --- real per-domain profiles -----------------------------------------------------------------
_DOMAIN_MODELS = {"olmoe": ("OLMoE-1B-7B", 16), "mixtral": ("Mixtral-8x7B", 32)}


@functools.cache
def _domain_records(model: str) -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
    name, _ = _DOMAIN_MODELS[model]
    text = resources.files("routepack_opt").joinpath("data/domain_expert_counts.json").read_text()
    recs = [r for r in json.loads(text)["records"] if r["model"] == name]
    layers = np.asarray(recs[0]["layers"], dtype=np.float64)
    counts = np.asarray([r["counts"] for r in recs], dtype=np.float64)  # [Dm, recorded layers, E]
    return tuple(r["domain"] for r in recs), layers, counts


def domain_profiles(model: str, num_layers: int, num_experts: int) -> tuple[tuple[str, ...], np.ndarray]:
    """Domain names and log expert distributions ``[Dm, L, E]`` of a real model ("olmoe":
    OLMoE-1B-7B, 6 domains, 64 experts; "mixtral": Mixtral-8x7B, 5 domains, 8 experts) from the
    shipped counts (data/README.md), interpolated across ``num_layers``: only layers 0, 7, 15 were
    recorded; a layer at relative depth x mixes its two neighbours' log profiles linearly and then
    rescales the deviations so the spread (and hence the skew) interpolates too, instead of being
    averaged away."""
    names, rec_layers, counts_DRE = _domain_records(model)
    E = counts_DRE.shape[2]
    if num_experts != E:
        raise InputError(f"trace: domains '{model}' has {E} experts per layer; use --experts {E} "
                         f"(or a number of synthetic domains)")
    depth = _DOMAIN_MODELS[model][1]
    lp = np.log((counts_DRE + 0.5) / (counts_DRE + 0.5).sum(axis=2, keepdims=True))
    dev = lp - lp.mean(axis=2, keepdims=True)
    sd_DR = dev.std(axis=2)
    pos_R = rec_layers / (depth - 1)
    out = np.empty((counts_DRE.shape[0], num_layers, E))
    for l in range(num_layers):
        x = l / (num_layers - 1) if num_layers > 1 else 0.0
        j = int(np.clip(np.searchsorted(pos_R, x, side="right") - 1, 0, len(pos_R) - 2))
        w = float(np.clip((x - pos_R[j]) / (pos_R[j + 1] - pos_R[j]), 0.0, 1.0))
        mix = (1 - w) * dev[:, j] + w * dev[:, j + 1]
        want = (1 - w) * sd_DR[:, j] + w * sd_DR[:, j + 1]
        out[:, l] = mix * (want / np.maximum(mix.std(axis=1), 1e-12))[:, None]
    return names, out


# --- popularity ----------------------------------------------------------------------------------
def _layer_skew_logits(cfg: TraceConfig, z_LE: np.ndarray, rng) -> np.ndarray:
    """Per-layer logits ``sd_l · z_l`` with sd_l chosen (bisection) so each layer's busiest/mean
    popularity hits its target ``skew · exp(skew_spread · N(0,1))`` (capped below E·0.9/k)."""
    L, E = z_LE.shape
    ceiling = 0.97 * E * 0.9 / cfg.top_k
    target_L = np.clip(cfg.skew * np.exp(cfg.skew_spread * rng.normal(size=L)), 1.0, max(ceiling, 1.0))
    lo, hi = np.zeros(L), np.full(L, 8.0)
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        ratio = E * _capped_probs(mid[:, None] * z_LE, 0.9 / cfg.top_k).max(axis=1)
        up = ratio < target_L
        lo, hi = np.where(up, mid, lo), np.where(up, hi, mid)
    return 0.5 * (lo + hi)[:, None] * z_LE


def _policy_logits(cfg: TraceConfig, seed: int, step: int, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-layer popularity logits [L, E] and domain preferences [Dm, L, E] at a policy step."""
    L, E = cfg.num_layers, cfg.num_experts
    rng = _rng(seed, 1)
    z = rng.normal(0.0, 1.0, size=(L, E))
    if cfg.domains is not None:
        base = np.zeros((L, E))
        dom = domain_profiles(cfg.domains, L, E)[1]
    else:
        base = cfg.expert_skew * z if cfg.expert_skew is not None else _layer_skew_logits(cfg, z, _rng(seed, 1, 1))
        dom = rng.normal(0.0, scale * cfg.shapes()[0], size=(cfg.num_domains, L, E))
        if cfg.num_domains == 1:  # one domain: no between-domain difference (part of base)
            dom[:] = 0.0
    for t in range(1, step + 1):  # random walk of the policy's routing
        r = _rng(seed, 2, t)
        base = base + r.normal(0.0, cfg.drift, size=(L, E))
        dom = dom + r.normal(0.0, cfg.drift, size=dom.shape)
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


# --- one window, block by block ---------------------------------------------------------------
_GROUP_BLOCK = 64  # group noise is drawn for blocks of this many groups (keyed by block)


@dataclasses.dataclass
class _Setup:
    cfg: TraceConfig
    seed: int
    step: int
    lengths_N: np.ndarray
    group_N: np.ndarray
    domain_G: np.ndarray
    base_LE: np.ndarray
    dom_DLE: np.ndarray
    scale: float
    block: int

    @property
    def num_samples(self) -> int:
        return int(self.lengths_N.shape[0])

    def num_blocks(self) -> int:
        return -(-self.num_samples // self.block)


def _block_size(cfg: TraceConfig) -> int:
    return int(np.clip(_BLOCK_ELEMS // (cfg.num_layers * cfg.num_experts), 1, 4096))


def _check_num_samples(num_samples) -> int:
    if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)) or num_samples < 1:
        raise InputError(f"trace: num_samples must be a positive integer, got {num_samples!r}")
    return int(num_samples)


def _setup(cfg: TraceConfig, N: int, seed: int, step: int, routing_step: int, scale: float) -> _Setup:
    C = cfg.capacity
    rng = _rng(seed, 3, step)  # the samples of this step (same whatever policy routes them)
    # --- GRPO groups: enough sizes for N samples drawn at once, cut where they cover N -----------
    max_groups = N // cfg.group_size_min + 1
    sizes = rng.integers(cfg.group_size_min, cfg.group_size_max + 1, size=max_groups)
    ends = np.cumsum(sizes)
    n_groups = int(np.searchsorted(ends, N)) + 1
    sizes = sizes[:n_groups]
    sizes[-1] -= int(ends[n_groups - 1]) - N
    group_N = np.repeat(np.arange(n_groups), sizes)
    # --- lengths ---------------------------------------------------------------------------------
    if cfg.uniform:
        lengths = np.full(N, max(1, int(round((cfg.prompt_mean + cfg.response_mean) * C))), dtype=np.int64)
    else:
        prompt_G = np.clip(rng.lognormal(np.log(cfg.prompt_mean * C), 0.5, n_groups), 16, 0.5 * C)
        s_g = cfg.length_sigma * np.sqrt(cfg.group_length_share)
        s_i = cfg.length_sigma * np.sqrt(1.0 - cfg.group_length_share)
        mu_G = np.log(cfg.response_mean * C) + rng.normal(0.0, s_g, n_groups)
        resp = rng.lognormal(mu_G[group_N], s_i)
        resp += prompt_G[group_N]
        lengths = np.clip(np.rint(resp), 1, C).astype(np.int64)
        del resp
    # --- routing policy ------------------------------------------------------------------------
    if cfg.uniform:
        L, E = cfg.num_layers, cfg.num_experts
        base, dom, domain_G = np.zeros((L, E)), np.zeros((1, L, E)), np.zeros(n_groups, dtype=np.int64)
    else:
        base, dom = _policy_logits(cfg, seed, routing_step, scale)
        domain_G = rng.integers(0, dom.shape[0], n_groups)
    return _Setup(cfg, seed, step, lengths, group_N, domain_G, base, dom, scale, _block_size(cfg))


def _block_counts(st: _Setup, b: int) -> np.ndarray:
    """Counts [n_b, L, E] of block ``b`` (samples b·B .. b·B + B − 1)."""
    cfg, B = st.cfg, st.block
    L, E, K = cfg.num_layers, cfg.num_experts, cfg.top_k
    lo, hi = b * B, min(st.num_samples, (b + 1) * B)
    len_b = st.lengths_N[lo:hi]
    if cfg.uniform:
        probs = np.full((hi - lo, L, E), 1.0 / E)
    else:
        _, gn, sn = cfg.shapes()
        grp_b = st.group_N[lo:hi]
        logits = st.base_LE[None] + st.dom_DLE[st.domain_G[grp_b]]
        if st.scale > 0 and gn > 0:
            gb0, gb1 = grp_b[0] // _GROUP_BLOCK, grp_b[-1] // _GROUP_BLOCK
            noise = np.concatenate([_rng(st.seed, 5, st.step, gb).standard_normal(
                (_GROUP_BLOCK, L, E), dtype=np.float32) for gb in range(gb0, gb1 + 1)])
            logits += (st.scale * gn) * noise[grp_b - gb0 * _GROUP_BLOCK]
            del noise
        if st.scale > 0 and sn > 0:
            logits += (st.scale * sn) * _rng(st.seed, 6, st.step, b).standard_normal(
                (hi - lo, L, E), dtype=np.float32)
        probs = _capped_probs(logits, 0.9 / K)  # a little under 1/k: overflow of len is rare
        del logits
    # common random numbers: the same draw for every routing_step, so staleness shows drift only
    return _draw_counts(len_b, probs, K, _rng(st.seed, 4, st.step, b))


# --- dispersion calibration (measured mapping scale → dispersion) --------------------------------
_PILOT_SAMPLES, _PILOT_LAYERS, _PILOT_SEED = 512, 4, 2**31 - 1


def _pilot_dispersion(cfg: TraceConfig, scale: float) -> float:
    pc = dataclasses.replace(cfg, num_layers=min(cfg.num_layers, _PILOT_LAYERS))
    st = _setup(pc, _PILOT_SAMPLES, _PILOT_SEED, 0, 0, scale)
    counts = np.concatenate([_block_counts(st, b) for b in range(st.num_blocks())])
    w = Window(st.lengths_N, counts, top_k=pc.top_k)
    return routing_dispersion(w, cfg.dispersion_tokens, seed=0, max_samples=None)["median"]


@functools.lru_cache(maxsize=256)
def routing_scale(cfg: TraceConfig) -> float:
    """The factor on the sample-specific logits (domain, group, sample shapes) that gives the
    target dispersion, by bisection in log scale on a fixed pilot window (512 samples, ≤ 4 layers,
    common random numbers). With real domain profiles and no target: the within-domain scale of
    the calibrated single-task setting. Targets below the floor (scale 0) give 0."""
    if cfg.uniform:
        return 0.0
    if cfg.raw_noise:
        return 1.0
    if cfg.domains is not None and cfg.dispersion is None:
        single = dataclasses.replace(cfg, domains=None, num_domains=1, dispersion=DEFAULT_DISPERSION)
        return routing_scale(single)
    target = DEFAULT_DISPERSION if cfg.dispersion is None else cfg.dispersion
    if _pilot_dispersion(cfg, 0.0) >= target:
        return 0.0
    lo, hi = 1e-3, 1.0
    while _pilot_dispersion(cfg, hi) < target:
        lo, hi = hi, 2 * hi
        if hi > 64:
            return hi  # target beyond reach of the logit noise (capping saturates)
    for _ in range(14):
        mid = float(np.sqrt(lo * hi))
        if _pilot_dispersion(cfg, mid) < target:
            lo = mid
        else:
            hi = mid
    return float(np.sqrt(lo * hi))


# --- memory ----------------------------------------------------------------------------------------
def memory_needed(cfg: TraceConfig, num_samples: int, in_memory: bool) -> int:
    """Bytes needed: ``PER_SAMPLE_BYTES`` per sample (+ int32 counts L·E·4 per sample when the
    whole window is built in memory) + one block's float64 logits/probabilities and int64 counts."""
    L, E = cfg.num_layers, cfg.num_experts
    per = PER_SAMPLE_BYTES + (4 * L * E if in_memory else 0)
    block = 5 * 8 * _block_size(cfg) * L * E
    # the policy: z, base and per-domain logits [Dm, L, E] float64, with a step's draw beside them;
    # the dispersion calibration's pilot window: 512 samples × min(L, 4) × E, as a block is
    policy = 8 * L * E * (2 * cfg.num_domains + 3)
    pilot = 0 if cfg.uniform else (5 * 8 + 4) * _PILOT_SAMPLES * min(L, _PILOT_LAYERS) * E
    return num_samples * per + block + policy + pilot


def _check_memory(cfg: TraceConfig, num_samples: int, in_memory: bool) -> None:
    need = memory_needed(cfg, num_samples, in_memory)
    avail = available_memory()
    if avail is not None and need > avail:
        fixed = memory_needed(cfg, 0, in_memory)
        per = memory_needed(cfg, 1, in_memory) - fixed
        raise InputError(
            f"trace: {num_samples} samples need ≈ {need / 2**30:.1f} GiB ({per} bytes per sample "
            f"+ {fixed / 2**30:.2f} GiB for a block, the routing policy of L={cfg.num_layers} × "
            f"E={cfg.num_experts} × {cfg.num_domains} domains and its calibration) but only "
            f"{avail / 2**30:.1f} GiB is available; use fewer samples, experts or domains"
            + ("" if not in_memory else " or the streaming writer (gen-trace)"))


# --- public API -----------------------------------------------------------------------------------
def _prepare(preset, num_samples, seed, step, routing_step, overrides):
    cfg = trace_config(preset, **overrides)
    N = _check_num_samples(num_samples)
    checks = (("seed", seed), ("step", step)) + ((("routing_step", routing_step),) if routing_step is not None else ())
    for name, v in checks:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise InputError(f"trace: {name} must be an integer ≥ 0, got {v!r}")
    routing_step = step if routing_step is None else routing_step
    draws = routing_step * (cfg.num_domains + 1) * cfg.num_layers * cfg.num_experts
    if draws > MAX_DRIFT_DRAWS:
        raise InputError(f"trace: routing drifts step by step from step 0; step {routing_step:,} at "
                         f"L={cfg.num_layers}, E={cfg.num_experts}, {cfg.num_domains} domains needs "
                         f"{draws:.3g} random draws (at most {MAX_DRIFT_DRAWS:.0e}): use a smaller --step")
    return cfg, N, routing_step


def generate_window(preset: str = "qwen3-30b-a3b", num_samples: int = 1024, seed: int = 0,
                    step: int = 0, routing_step: int | None = None, **overrides) -> Window:
    """One synthetic window (optimizer step ``step``) of a preset-shaped model, in memory.

    ``routing_step`` (default ``step``) is the policy version whose routing the samples get:
    ``routing_step = step - k`` is routing replay recorded k policy updates earlier. Any
    :class:`TraceConfig` field may be overridden (e.g. ``dispersion=3.0``, ``domains="olmoe"``).
    """
    cfg, N, routing_step = _prepare(preset, num_samples, seed, step, routing_step, overrides)
    _check_memory(cfg, N, in_memory=True)
    st = _setup(cfg, N, seed, step, routing_step, routing_scale(cfg))
    counts = np.empty((N, cfg.num_layers, cfg.num_experts), dtype=np.int32)
    for b in range(st.num_blocks()):
        lo = b * st.block
        blk = _block_counts(st, b)
        counts[lo:lo + blk.shape[0]] = blk
    return Window(st.lengths_N, counts, top_k=cfg.top_k, group_ids=st.group_N, step=step,
                  copy=False)  # counts was built for it: one copy in memory, not two


def write_trace(path: str | Path, preset: str = "qwen3-30b-a3b", num_samples: int = 1024, seed: int = 0,
                step: int = 0, routing_step: int | None = None, **overrides) -> dict:
    """Generate a window like :func:`generate_window` (same seed → the same window) and stream it
    to ``path`` block by block (atomic; counts in the smallest int dtype that holds the capacity).
    Memory: ``PER_SAMPLE_BYTES`` per sample + one block, checked before any work. Returns a
    summary (sizes, tokens, lengths, expert-load CV)."""
    cfg, N, routing_step = _prepare(preset, num_samples, seed, step, routing_step, overrides)
    _check_memory(cfg, N, in_memory=False)
    st = _setup(cfg, N, seed, step, routing_step, routing_scale(cfg))
    load_LE = np.zeros((cfg.num_layers, cfg.num_experts), dtype=np.int64)

    def blocks():
        for b in range(st.num_blocks()):
            blk = _block_counts(st, b)
            load_LE[:] += blk.sum(axis=0)
            yield blk

    write_window_npz(path, st.lengths_N, blocks(), (N, cfg.num_layers, cfg.num_experts),
                     counts_dtype(cfg.capacity), cfg.top_k, st.group_N, step)
    mean_L = load_LE.mean(axis=1)
    return {"path": str(path), "samples": N, "layers": cfg.num_layers, "experts": cfg.num_experts,
            "top_k": cfg.top_k, "tokens": int(st.lengths_N.sum()), "max_length": int(st.lengths_N.max()),
            "mean_length": float(st.lengths_N.mean()),
            "expert_load_cv": float((load_LE.std(axis=1) / mean_L).mean()),
            "skew_max_over_mean": float(np.median(load_LE.max(axis=1) / mean_L)),
            "routing_scale": st.scale, "block_samples": st.block}


def generate_sequence(preset: str = "qwen3-30b-a3b", num_samples: int = 1024, num_steps: int = 20,
                      seed: int = 0, staleness: int = 0, **overrides) -> list[Window]:
    """Windows of ``num_steps`` consecutive optimizer steps with drifting routing. With
    ``staleness`` k > 0, step t's samples are routed by the policy of step max(t - k, 0)."""
    return [generate_window(preset, num_samples, seed, step=t, routing_step=max(t - staleness, 0),
                            **overrides) for t in range(num_steps)]

"""Calibrate the cost model with torch kernels, and measure plans with them.

Legend (shape suffixes): N samples, L MoE layers, E experts, P EP ranks, D DP slots, G shards,
R rows, H hidden, F expert FFN width, M rows of an expert GEMM.

**Kernels** (one transformer layer of a small model, forward + backward, the training step):
- attention of a packed micro-batch: QKV projection, causal SDPA per sample (the varlen
  semantics), output projection — time ≈ α·T + β·Q + c_a with T = Σ len, Q = Σ len²;
- the expert work of one EP rank at one layer: one SwiGLU GEMM chain per local expert on its
  tokens — time ≈ γ·W + c_e with W the rank's routed tokens.

**Calibration** fits (α, β, c_a) and (γ, c_e) by non-negative least squares on relative error
(timings span orders of magnitude; a plain fit would ignore the small points) and writes the
cost model for a model of ``layers`` layers: one stage with ``alpha = layers·α``,
``beta = layers·β``; ``gamma = γ``; ``row_overhead = layers·(f_a + f_e + 2·a2a)``, where f_a and
f_e are *measured*: the time of a one-token micro-batch's attention and of one token's expert
work (forward + backward; the kernels' fixed cost per micro-batch, launches included), and
``a2a`` (``all_to_all_us``, given) is the latency of one dispatch + combine pair, which one
process cannot measure (docs/model.md, "The per-micro-batch overhead"). The fits' intercepts
(c_a, c_e) are reported beside them.

**Measurement** runs, for a plan on a scaled-down window (lengths and counts divided by ``scale``
so CPU time stays bounded), every cell's attention and every (row, shard, layer, rank) expert
workload, and composes ``J[r,g] = layers·max_{d∈g} A[r,d] + Σ_l max_p X[r,g,l,p]`` — docs/model.md with
measured times in place of the model — then both objectives' makespans. The prediction for the
same scaled window comes from :mod:`routepack_opt.core.evaluate` with the calibrated cost.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import time

import numpy as np
import torch

from routepack_opt.core.checks import (
    INT64_MAX,
    check_bool,
    check_int,
    check_known_options,
    check_number,
    check_type,
    int_array,
    shown,
)
from routepack_opt.core.cost import CostModel, Stage
from routepack_opt.core.errors import InputError
from routepack_opt.core.evaluate import rank_loads, row_shard_costs, score_from_J
from routepack_opt.core.objective import Objective
from routepack_opt.core.plan import Plan
from routepack_opt.core.window import Window
from routepack_opt.runtime.model import varlen_causal_attention
from routepack_opt.runtime.moe import swiglu

__all__ = ["BenchConfig", "bench_config", "resolve_device", "KernelBench", "nnls", "fit",
           "calibrate", "measure_plan", "scale_window"]


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """The small model and the measurement grid."""

    hidden: int = 128
    heads: int = 2
    ffn: int = 256
    layers: int = 2  # transformer layers (attention + MoE) the cost file describes
    experts_per_rank: int = 4  # calibration: a rank's tokens are split over this many experts
    attn_lengths: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024)
    attn_max_tokens: int = 2048  # calibration micro-batches hold at most this many tokens
    expert_tokens: tuple[int, ...] = (16, 64, 256, 1024, 4096)
    repeats: int = 3
    warmup: int = 1
    measure_max_cell: int = 1024  # default scale keeps every scaled cell at most this long
    measure_max_tokens: int = 8192  # ... and the scaled window at most this many tokens
    cpu_threads: int = 1  # intra-op threads on CPU (0: torch's default). One thread: timings on a
    # shared machine are not wrecked by OpenMP threads waiting for a descheduled partner
    seed: int = 0

    def __post_init__(self):
        for key in ("hidden", "heads", "ffn", "layers", "experts_per_rank", "repeats"):
            check_int(getattr(self, key), key)  # the type here; the ranges below, in bench's words
        for key in ("attn_max_tokens", "measure_max_cell", "measure_max_tokens"):
            check_int(getattr(self, key), key, 1, INT64_MAX)
        for key in ("warmup", "cpu_threads", "seed"):
            check_int(getattr(self, key), key, 0, INT64_MAX)
        for key in ("attn_lengths", "expert_tokens"):
            check_type(getattr(self, key), key, (tuple, list), "tuple of token counts")
            if not int_array(getattr(self, key), key, ndim=1, lo=1).size:
                raise InputError(f"{key}: expected at least one token count, got {shown(getattr(self, key))}")
        for key in ("hidden", "heads", "ffn", "layers", "experts_per_rank", "repeats"):
            if getattr(self, key) < 1:
                raise InputError(f"bench: {key} must be ≥ 1")
        if self.hidden % self.heads:
            raise InputError("bench: hidden must be divisible by heads")


def bench_config(device: str = "cpu", quick: bool = False, **overrides) -> BenchConfig:
    """Defaults per device: CPU small and short; CUDA larger; ``quick`` for tests (seconds)."""
    check_type(device, "device", (str, torch.device), "device name (cpu, cuda[:i])")
    check_bool(quick, "quick")
    check_known_options(overrides, [f.name for f in dataclasses.fields(BenchConfig)], "bench_config")
    if quick:
        base = dict(hidden=64, heads=2, ffn=128, attn_lengths=(8, 32, 96, 192), attn_max_tokens=384,
                    expert_tokens=(16, 64, 256, 768), repeats=3, measure_max_cell=256,
                    measure_max_tokens=2048)
    elif str(device).startswith("cuda"):
        base = dict(hidden=1024, heads=8, ffn=1024,
                    attn_lengths=(128, 256, 512, 1024, 2048, 4096, 8192), attn_max_tokens=16384,
                    expert_tokens=(128, 512, 2048, 8192, 32768), repeats=5,
                    measure_max_cell=16384, measure_max_tokens=1 << 20)
    else:
        base = {}
    base.update(overrides)
    return BenchConfig(**base)


def resolve_device(name: str) -> torch.device:
    """``cpu`` or ``cuda[:i]``; :class:`InputError` if CUDA is asked for and not available."""
    check_type(name, "--device", (str, torch.device), "device name (cpu, cuda[:i])")
    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError):
        raise InputError(f"--device: unknown device {name!r} (use cpu or cuda)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda: CUDA is not available on this machine")
    if dev.type not in ("cpu", "cuda"):
        raise InputError(f"--device: {name!r} is not supported (use cpu or cuda)")
    return dev


class KernelBench:
    """Weights of one layer of the small model on a device, and timers for its kernels (µs)."""

    def __init__(self, cfg: BenchConfig, device="cpu"):
        check_type(cfg, "cfg", BenchConfig)
        self.cfg = cfg
        self.device = resolve_device(device)
        self.dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        g = torch.Generator().manual_seed(cfg.seed)
        H, Fw = cfg.hidden, cfg.ffn
        mk = lambda *shape: (torch.randn(*shape, generator=g) / shape[0] ** 0.5).to(  # noqa: E731
            self.device, self.dtype).requires_grad_()
        self.w_qkv = mk(H, 3 * H)
        self.w_o = mk(H, H)
        self.experts = [(mk(H, Fw), mk(H, Fw), mk(Fw, H)) for _ in range(cfg.experts_per_rank)]
        self._x = torch.randn(64, H, generator=g).to(self.device, self.dtype)
        self._cache: dict = {}

    def _input(self, T: int) -> torch.Tensor:
        if self._x.shape[0] < T:
            self._x = torch.randn(max(T, 2 * self._x.shape[0]), self.cfg.hidden,
                                  device=self.device, dtype=self.dtype)
        return self._x[:T].detach().requires_grad_()

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @property
    def clock(self) -> str:
        """CPU with one intra-op thread: the thread's CPU time (kernels run inline in this thread),
        which preemption by other processes on a shared machine does not inflate. Else wall time
        (synchronized on CUDA)."""
        if self.device.type == "cpu" and self.cfg.cpu_threads == 1:
            return "thread_cpu_time"
        return "wall_time"

    def _time(self, fn) -> float:
        clock = time.thread_time if self.clock == "thread_cpu_time" else time.perf_counter
        for _ in range(self.cfg.warmup):
            fn()
        ts = []
        for _ in range(self.cfg.repeats):
            self._sync()
            t0 = clock()
            fn()
            self._sync()
            ts.append(clock() - t0)
        # the minimum: the kernel's own time, least disturbed by other load on the machine
        return min(ts) * 1e6

    def attention_us(self, lengths) -> float:
        """One layer's attention, forward + backward, on a packed micro-batch of ``lengths``."""
        lengths = tuple(sorted(int(x) for x in lengths if x > 0))
        key = ("attn", lengths)
        if key in self._cache:
            return self._cache[key]
        if not lengths:
            return 0.0
        H, nh = self.cfg.hidden, self.cfg.heads
        cu = [0] + list(itertools.accumulate(lengths))
        T = cu[-1]

        def step():
            x = self._input(T)
            q, k, v = (x @ self.w_qkv).split(H, dim=1)
            heads = lambda t: t.reshape(T, nh, H // nh).transpose(0, 1)  # noqa: E731
            a = varlen_causal_attention(heads(q), heads(k), heads(v), cu)
            out = a.transpose(0, 1).reshape(T, H) @ self.w_o
            out.backward(torch.ones_like(out))
            self.w_qkv.grad = self.w_o.grad = None

        self._cache[key] = t = self._time(step)
        return t

    def experts_us(self, tokens_per_expert) -> float:
        """One EP rank's expert work at one layer, forward + backward: a SwiGLU chain per local
        expert on its tokens (``tokens_per_expert``, at most ``experts_per_rank`` nonzero used
        cyclically over the weight sets)."""
        counts = tuple(sorted((int(c) for c in tokens_per_expert if c > 0), reverse=True))
        key = ("experts", counts)
        if key in self._cache:
            return self._cache[key]
        if not counts:
            return 0.0
        ws = self.experts

        def step():
            for j, n in enumerate(counts):
                wg, wu, wd = ws[j % len(ws)]
                y = swiglu(self._input(n), wg, wu, wd)
                y.backward(torch.ones_like(y))
            for w in ws:
                for t in w:
                    t.grad = None

        self._cache[key] = t = self._time(step)
        return t


@contextlib.contextmanager
def _threads(dev: torch.device, cfg: BenchConfig):
    prev = torch.get_num_threads()
    if dev.type == "cpu" and cfg.cpu_threads > 0:
        torch.set_num_threads(cfg.cpu_threads)
    try:
        yield
    finally:
        torch.set_num_threads(prev)


# ------------------------------------------------------------------------------------------
# Fitting
# ------------------------------------------------------------------------------------------


def _float_array(value, name: str, ndim: int, bound: float = 1e100) -> np.ndarray:
    """``value`` as a finite float64 array of rank ``ndim`` (integers and floats; not bools,
    strings, complex or objects) of magnitude ≤ ``bound`` (so that the squares of a least-squares
    fit stay finite), else an InputError naming ``name``."""
    try:
        arr = np.asarray(value)
    except Exception as exc:  # noqa: BLE001 - ragged lists and the like
        raise InputError(f"{name}: cannot be read as an array of numbers ({type(exc).__name__})") from None
    if arr.dtype.kind not in "iuf":
        raise InputError(f"{name}: expected numbers, got dtype {arr.dtype} ({shown(value)})")
    if arr.ndim != ndim:
        raise InputError(f"{name}: expected {ndim} dimension{'s' if ndim != 1 else ''}, got shape {tuple(arr.shape)}")
    with np.errstate(over="ignore"):
        arr = arr.astype(np.float64)
    if not np.isfinite(arr).all() or (np.abs(arr) > bound).any():
        raise InputError(f"{name}: expected finite numbers of magnitude ≤ {bound:g}, got {shown(value)}")
    return arr


def nnls(A: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Non-negative least squares ``min ||A x - b||, x ≥ 0`` for a few columns: the best of the
    unconstrained least-squares fits over every subset of free columns that come out ≥ 0
    (exact for k ≤ ~10 columns; the optimum is the LS fit on its own support)."""
    A = _float_array(A, "A", 2)
    b = _float_array(b, "b", 1)
    if b.shape[0] != A.shape[0]:
        raise InputError(f"b: expected {A.shape[0]} values (one per row of A), got shape {tuple(b.shape)}")
    if A.shape[1] > 16:
        raise InputError(f"A: expected at most 16 columns (every subset is tried), got {A.shape[1]}")
    k = A.shape[1]
    best, best_res = np.zeros(k), float(np.sum(b * b))
    for r in range(1, k + 1):
        for cols in itertools.combinations(range(k), r):
            x_s, *_ = np.linalg.lstsq(A[:, cols], b, rcond=None)
            if (x_s < 0).any():
                continue
            x = np.zeros(k)
            x[list(cols)] = x_s
            res = float(np.sum((A @ x - b) ** 2))
            if res < best_res - 1e-12 * max(1.0, best_res):
                best, best_res = x, res
    return best


def fit(X: np.ndarray, t: np.ndarray, names: list[str]) -> dict:
    """Non-negative fit of ``t ≈ X @ coef`` minimising relative error; reports R² (on raw
    times) and relative residuals."""
    X = _float_array(X, "X", 2, 1e50)  # ≤ 1e50 and t ≥ 1e-50: the weighted fit stays finite too
    t = _float_array(t, "t", 1, 1e50)
    if t.shape[0] != X.shape[0] or not t.size:
        raise InputError(f"t: expected {X.shape[0]} times (one per row of X, at least one), got shape {tuple(t.shape)}")
    if (t < 1e-50).any():
        raise InputError(f"t: expected times > 0 (≥ 1e-50), got {shown(t)}")
    check_type(names, "names", (list, tuple), "list of coefficient names")
    if len(names) != X.shape[1] or not all(isinstance(n, str) for n in names):
        raise InputError(f"names: expected {X.shape[1]} names (one per column of X), got {shown(names)}")
    w = 1.0 / np.maximum(t, 1e-9)
    coef = nnls(X * w[:, None], t * w)
    pred = X @ coef
    ss_res = float(np.sum((t - pred) ** 2))
    ss_tot = float(np.sum((t - t.mean()) ** 2))
    rel = (pred - t) / t
    return {"coef": dict(zip(names, coef.tolist())), "r2": 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0,
            "rel_residual_median": float(np.median(np.abs(rel))),
            "rel_residual_max": float(np.max(np.abs(rel))), "points": int(t.size),
            "residuals_us": (t - pred).tolist()}


def calibrate(device: str = "cpu", cfg: BenchConfig | None = None,
              all_to_all_us: float = 0.0) -> tuple[CostModel, dict]:
    """Measure the small model's kernels on ``device``, fit the coefficients, return the cost
    model (for ``cfg.layers`` layers) and the fit report. ``row_overhead`` is measured: per
    layer, a one-token micro-batch's attention plus one token's expert work, plus
    ``2 · all_to_all_us`` (one dispatch + combine pair forward, their transposes backward)."""
    if cfg is not None:
        check_type(cfg, "cfg", BenchConfig)
    check_number(all_to_all_us, "all_to_all_us", 0.0)
    dev = resolve_device(device)
    cfg = cfg or bench_config(dev.type)
    t0 = time.perf_counter()
    kb = KernelBench(cfg, dev)
    rng = np.random.default_rng(cfg.seed)
    with _threads(dev, cfg):
        # attention: k samples of length ℓ (T and Q vary independently), plus mixed batches
        rows, times = [], []
        batches = [[ell] * k for ell in cfg.attn_lengths for k in (1, 2, 4, 8)
                   if ell * k <= cfg.attn_max_tokens]
        for _ in range(max(2, len(batches) // 4)):
            lens = rng.integers(cfg.attn_lengths[0], cfg.attn_lengths[-1] + 1, size=8)
            keep = lens[np.cumsum(lens) <= cfg.attn_max_tokens]
            batches.append(keep.tolist() if keep.size else [int(lens[0])])
        for lens in batches:
            T, Q = sum(lens), sum(x * x for x in lens)
            rows.append([T, Q, 1.0])
            times.append(kb.attention_us(lens))
        attn = fit(np.array(rows), np.array(times), ["alpha", "beta", "intercept"])
        # experts: W tokens split unevenly over the rank's experts
        rows, times = [], []
        for W in cfg.expert_tokens:
            for _ in range(2):
                share = rng.dirichlet(np.ones(cfg.experts_per_rank))
                c = np.floor(share * W).astype(int)
                c[0] += W - c.sum()
                rows.append([W, 1.0])
                times.append(kb.experts_us(c))
        expert = fit(np.array(rows), np.array(times), ["gamma", "intercept"])
        one = np.zeros(cfg.experts_per_rank, dtype=np.int64)
        one[0] = 1
        fixed_attn, fixed_exp = kb.attention_us([1]), kb.experts_us(one)
    a, e = attn["coef"], expert["coef"]
    a2a = float(all_to_all_us)
    overhead = {"measured_kernels_us": cfg.layers * (fixed_attn + fixed_exp),
                "one_token_attention_us": fixed_attn, "one_token_experts_us": fixed_exp,
                "fit_intercepts_us": cfg.layers * (a["intercept"] + e["intercept"]),
                "all_to_all_us": a2a, "all_to_all_total_us": cfg.layers * 2.0 * a2a}
    cost = CostModel(stages=(Stage("attn", cfg.layers * a["alpha"], cfg.layers * a["beta"]),),
                     gamma=e["gamma"],
                     row_overhead=overhead["measured_kernels_us"] + overhead["all_to_all_total_us"],
                     name=f"calibrated-{dev.type}")
    report = {"device": str(dev), "dtype": str(kb.dtype).replace("torch.", ""),
              "clock": kb.clock,
              "threads": cfg.cpu_threads if dev.type == "cpu" and cfg.cpu_threads else torch.get_num_threads(),
              "config": dataclasses.asdict(cfg),
              "attention": attn, "expert": expert, "row_overhead": overhead,
              "cost": {"alpha": cost.stages[0].alpha, "beta": cost.stages[0].beta,
                       "gamma": cost.gamma, "row_overhead": cost.row_overhead},
              "seconds": round(time.perf_counter() - t0, 2)}
    return cost, report


# ------------------------------------------------------------------------------------------
# Measuring a plan
# ------------------------------------------------------------------------------------------


def scale_window(window: Window, scale: float, layers: int) -> tuple[np.ndarray, np.ndarray]:
    """Scaled-down ``lengths_N`` (≥ 1) and ``counts_NLE`` (first ``layers`` layers, each count
    scaled with its sample's length and rounded)."""
    check_type(window, "window", Window)
    check_number(scale, "scale", 1.0)
    check_int(layers, "layers", 1, INT64_MAX)
    lengths = window.lengths.astype(np.float64)
    len_s = np.maximum(1, np.rint(lengths / scale)).astype(np.int64)
    counts = window.counts[:, :layers].astype(np.float64) * (len_s / lengths)[:, None, None]
    return len_s, np.rint(counts).astype(np.int64)


def _r2(meas: np.ndarray, pred: np.ndarray) -> float:
    meas, pred = np.ravel(meas), np.ravel(pred)
    ss_tot = float(np.sum((meas - meas.mean()) ** 2))
    return 1.0 - float(np.sum((meas - pred) ** 2)) / ss_tot if ss_tot > 0 else 1.0


def _corr2(meas: np.ndarray, pred: np.ndarray) -> float:
    meas, pred = np.ravel(meas), np.ravel(pred)
    if meas.std() == 0 or pred.std() == 0:
        return 1.0 if np.allclose(meas, meas.mean()) else 0.0
    return float(np.corrcoef(meas, pred)[0, 1] ** 2)


@dataclasses.dataclass(frozen=True)
class _ScaledPlan:
    """A plan's workloads on the scaled-down window (the measurement's and the prediction's)."""

    scale: float
    layers: int
    len_s: np.ndarray       # [N] scaled lengths
    counts_s: np.ndarray    # [N, Lm, E] scaled expert counts
    cell_N: np.ndarray      # [N] cell r·D + d of each sample
    tok_RGLE: np.ndarray    # [R, G, Lm, E] tokens of each (row, shard) block per (layer, expert)


def _scaled_plan(window: Window, plan: Plan, cfg: BenchConfig, scale: float | None) -> _ScaledPlan:
    """Scale the window (by ``scale``, default: small enough for ``cfg``'s measurement caps) and
    gather the plan's expert workloads per (row, shard) block."""
    topo = plan.topology
    D, G, R, Lm, E = topo.dp, topo.num_shards, plan.rows, cfg.layers, window.num_experts
    cell_N = plan.row * D + plan.slot
    cell_tokens = np.bincount(cell_N, weights=window.lengths, minlength=R * D)
    if scale is None:
        scale = max(1.0, math.ceil(cell_tokens.max() / cfg.measure_max_cell),
                    math.ceil(window.total_tokens / cfg.measure_max_tokens))
    if not scale >= 1:
        raise InputError(f"--scale must be ≥ 1, got {scale}")
    len_s, counts_s = scale_window(window, scale, Lm)
    rg_N = plan.row * G + topo.shard_array()[plan.slot]
    tok_RGLE = np.zeros((R * G, Lm * E), dtype=np.int64)
    np.add.at(tok_RGLE, rg_N, counts_s.reshape(len(len_s), Lm * E))
    return _ScaledPlan(scale, Lm, len_s, counts_s, cell_N, tok_RGLE.reshape(R, G, Lm, E))


def _rank_of_experts(plan: Plan, l: int, per_rank: int) -> np.ndarray:
    """[E] the EP rank holding each expert at layer l."""
    return plan.placement.first_slots[l] // per_rank


def _measure_kernels(kb: KernelBench, plan: Plan, sp: _ScaledPlan) -> tuple[np.ndarray, np.ndarray]:
    """Measured ``A_RD`` (every cell's attention, × layers) and ``X_RGLP`` (every block's expert
    work per layer and rank), µs."""
    D, P, G, R = plan.topology.dp, plan.topology.ep, plan.topology.num_shards, plan.rows
    Lm = sp.layers
    per_rank = sp.tok_RGLE.shape[3] // P
    order = np.argsort(sp.cell_N, kind="stable")
    bounds = np.searchsorted(sp.cell_N[order], np.arange(R * D + 1))
    A_RD = np.zeros(R * D)
    for c in range(R * D):  # attention per cell, one layer, × Lm layers
        A_RD[c] = Lm * kb.attention_us(sp.len_s[order[bounds[c]:bounds[c + 1]]])
    X_RGLP = np.zeros((R, G, Lm, P))
    for l in range(Lm):
        rank_E = _rank_of_experts(plan, l, per_rank)
        experts_of = [np.flatnonzero(rank_E == p) for p in range(P)]
        for r in range(R):
            for g in range(G):
                for p in range(P):
                    X_RGLP[r, g, l, p] = kb.experts_us(sp.tok_RGLE[r, g, l, experts_of[p]])
    return A_RD.reshape(R, D), X_RGLP


def _predicted_kernels(plan: Plan, sp: _ScaledPlan, cost: CostModel, calib_report: dict | None
                       ) -> tuple[np.ndarray, np.ndarray]:
    """The cost model's ``A_RD`` and ``X_RGLP`` for the same kernels, with the calibration's
    intercepts when it ran here."""
    D, P, G, R = plan.topology.dp, plan.topology.ep, plan.topology.num_shards, plan.rows
    Lm = sp.layers
    per_rank = sp.tok_RGLE.shape[3] // P
    a_cost = cost.stages[0]
    c_attn = 0.0
    c_exp = 0.0
    if calib_report is not None:
        c_attn = Lm * calib_report["attention"]["coef"]["intercept"]
        c_exp = calib_report["expert"]["coef"]["intercept"]
    T_RD = np.bincount(sp.cell_N, weights=sp.len_s.astype(float), minlength=R * D).reshape(R, D)
    Q_RD = np.bincount(sp.cell_N, weights=sp.len_s.astype(float) ** 2, minlength=R * D).reshape(R, D)
    A_pred_RD = a_cost.alpha * T_RD + a_cost.beta * Q_RD + c_attn
    W_RGLP = np.zeros((R, G, Lm, P))
    for l in range(Lm):
        rank_E = _rank_of_experts(plan, l, per_rank)
        for p in range(P):
            W_RGLP[:, :, l, p] = sp.tok_RGLE[:, :, l, rank_E == p].sum(axis=2)
    return A_pred_RD, cost.gamma * W_RGLP + c_exp


def measure_plan(window: Window, plan: Plan, cost: CostModel | None = None, device: str = "cpu",
                 cfg: BenchConfig | None = None, scale: float | None = None,
                 layers: int | None = None) -> dict:
    """Time every cell's attention and every (row, shard, layer, rank) expert workload of
    ``plan`` with real kernels on a scaled-down window; compose both objectives' step times and
    compare with the evaluator's prediction under ``cost`` (default: calibrate now, on the same
    device and model, for ``layers`` layers)."""
    check_type(window, "window", Window)
    check_type(plan, "plan", Plan)
    if cost is not None:
        check_type(cost, "cost", CostModel)
    if cfg is not None:
        check_type(cfg, "cfg", BenchConfig)
    if scale is not None:
        check_number(scale, "--scale", 1.0)
    if layers is not None:
        check_int(layers, "layers", 1, INT64_MAX)
    errs = plan.validate(window)
    if errs:
        raise InputError("plan does not match the window: " + "; ".join(errs[:3]))
    plan.topology.check_experts(window.num_experts)
    dev = resolve_device(device)
    topo = plan.topology
    Lm = min(window.num_layers, layers or (cfg.layers if cfg else 2))
    if Lm < 1:
        raise InputError("--layers must be ≥ 1")
    base_cfg = cfg or bench_config(dev.type)
    cfg = dataclasses.replace(base_cfg, layers=Lm, experts_per_rank=window.num_experts // topo.ep)
    t_start = time.perf_counter()
    calib_report = None
    if cost is None:
        cost, calib_report = calibrate(str(dev), cfg)
    sp = _scaled_plan(window, plan, cfg, scale)
    t_meas = time.perf_counter()
    with _threads(dev, cfg):
        A_RD, X_RGLP = _measure_kernels(KernelBench(cfg, dev), plan, sp)
    seconds_measuring = time.perf_counter() - t_meas
    J_meas = A_RD[:, topo.slots_of_shard()].max(axis=2) + X_RGLP.max(axis=3).sum(axis=2)
    # prediction: the one evaluator, same scaled window, same layers
    b_NLP = rank_loads(sp.counts_s, plan.placement.first_slots[:Lm], topo.ep)
    J_pred = row_shard_costs(sp.len_s, b_NLP, plan.row, plan.slot, plan.rows, topo, cost)
    # per-kernel agreement: attention per cell and expert per workload, intercepts included
    A_pred_RD, X_pred = _predicted_kernels(plan, sp, cost, calib_report)
    agreement = {
        # with the calibration's intercepts (known only when calibrated here) ...
        "attention_cell_r2": _r2(A_RD, A_pred_RD) if calib_report else None,
        "expert_workload_r2": _r2(X_RGLP, X_pred) if calib_report else None,
        # ... and offset-free: squared correlation of measured and modelled kernel times
        "attention_cell_corr2": _corr2(A_RD, A_pred_RD),
        "expert_workload_corr2": _corr2(X_RGLP, X_pred),
    }
    times = {"seconds_measuring": round(seconds_measuring, 2), "seconds": round(time.perf_counter() - t_start, 2)}
    return _plan_report(dev, plan, sp, cost, calib_report, J_meas, J_pred, agreement, times)


def _plan_report(dev, plan: Plan, sp: _ScaledPlan, cost: CostModel, calib_report: dict | None,
                 J_meas: np.ndarray, J_pred: np.ndarray, agreement: dict, times: dict) -> dict:
    """The measurement's report: both objectives measured against predicted, the fit of J and
    of every kernel (``agreement``), the cost model used, the calibration's quality, ``times``."""
    topo, R, Lm = plan.topology, plan.rows, sp.layers
    objectives = {}
    for obj in Objective:
        m = score_from_J(J_meas, obj).makespan
        p_ = score_from_J(J_pred, obj).makespan
        objectives[obj] = {"measured_us": m, "predicted_us": p_, "ratio": m / p_ if p_ > 0 else float("inf")}
    notes = []
    med = float(np.median(sp.len_s))
    if med < 64:
        notes.append(f"scaled samples are short (median {med:.0f} tokens): fixed per-sample and "
                     "per-kernel costs, which the cost model has no term for, dominate; use a smaller "
                     "--scale or a smaller window for a faithful check")
    a_cost = cost.stages[0]
    return {
        "notes": notes,
        "device": str(dev), "scale": float(sp.scale), "layers": Lm, "rows": R, "dp": topo.dp, "ep": topo.ep,
        "shards": topo.num_shards, "cells": R * topo.dp, "expert_workloads": int(R * topo.num_shards * Lm * topo.ep),
        "scaled_tokens": int(sp.len_s.sum()), "objectives": objectives,
        "J_r2": _r2(J_meas, J_pred),
        "J_rel_err_mean": float(np.mean(np.abs(J_meas - J_pred) / J_meas)),
        **agreement,
        "cost": {"alpha": a_cost.alpha, "beta": a_cost.beta, "gamma": cost.gamma,
                 "row_overhead": cost.row_overhead, "name": cost.name},
        "calibration": None if calib_report is None else {
            "attention_r2": calib_report["attention"]["r2"], "expert_r2": calib_report["expert"]["r2"],
            "seconds": calib_report["seconds"]},
        **times,
        "J_measured": J_meas.tolist(), "J_predicted": J_pred.tolist(),
    }

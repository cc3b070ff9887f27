"""Statistics for the studies: a moving-block bootstrap CI of a mean over serially correlated
steps, the lag-1 autocorrelation that says whether blocks matter, and Kendall's tau-b."""

from __future__ import annotations

import math

import numpy as np


def block_bootstrap_ci(x, block: int, reps: int = 2000, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Moving-block bootstrap (Künsch 1989) percentile CI of the mean of a serially correlated
    series: resample overlapping blocks of ``block`` consecutive values, concatenate to length n.
    (nan, nan) for an empty series."""
    x = np.asarray(x, dtype=np.float64)
    n = x.size
    if n == 0:
        return (math.nan, math.nan)
    block = max(1, min(block, n))
    rng = np.random.default_rng(seed)
    nb = -(-n // block)
    starts = rng.integers(0, n - block + 1, size=(reps, nb))
    idx = (starts[:, :, None] + np.arange(block)).reshape(reps, -1)[:, :n]
    means = x[idx].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def block_length(n: int) -> int:
    """n^(1/3) rounded (the usual rate for the moving-block bootstrap of a mean), at least 2."""
    return max(2, int(round(n ** (1 / 3))))


def lag1(x) -> float:
    """Lag-1 autocorrelation; nan for fewer than 3 values or a constant series."""
    x = np.asarray(x, dtype=np.float64)
    if x.size < 3 or x.std() == 0:
        return math.nan
    return float(np.corrcoef(x[:-1], x[1:])[0, 1])


def kendall_tau(x, y) -> float:
    """Kendall's tau-b (ties in either ranking handled), O(n²) with numpy; nan when either
    ranking is all ties."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    i, j = np.triu_indices(x.size, 1)
    sx = np.sign(x[i] - x[j])
    sy = np.sign(y[i] - y[j])
    n0 = i.size
    nx, ny = np.count_nonzero(sx == 0), np.count_nonzero(sy == 0)
    den = math.sqrt((n0 - nx) * (n0 - ny))
    return float((sx * sy).sum() / den) if den > 0 else math.nan


def mean_ci_pct(x, block: int, reps: int) -> str:
    """``+m.mm% [+lo, +hi]``: the mean of relative gains ``x`` with its block-bootstrap 95% CI,
    in percent."""
    lo, hi = block_bootstrap_ci(x, block, reps)
    return f"{100 * np.mean(x):+.2f}% [{100 * lo:+.2f}, {100 * hi:+.2f}]"

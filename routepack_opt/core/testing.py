"""Small random windows and layouts for tests and property checks (not a trace model: see
:mod:`routepack_opt.trace` for realistic RL traces)."""

from __future__ import annotations

import numpy as np

from routepack_opt.core.window import Window


def random_counts(lengths_N, num_layers: int, num_experts: int, top_k: int, rng, skew: float = 1.0) -> np.ndarray:
    """Counts with Σ_e = k·len and each ≤ len: every token picks k distinct experts (exact)."""
    lengths_N = np.asarray(lengths_N, dtype=np.int64)
    N = lengths_N.size
    counts = np.zeros((N, num_layers, num_experts), dtype=np.int64)
    logits = rng.normal(0.0, skew, size=(num_layers, num_experts))
    for i in range(N):
        for l in range(num_layers):
            # Gumbel top-k per token: k distinct experts, popularity ∝ exp(logits)
            g = logits[l][None, :] + rng.gumbel(size=(lengths_N[i], num_experts))
            top = np.argpartition(-g, top_k - 1, axis=1)[:, :top_k]
            counts[i, l] = np.bincount(top.ravel(), minlength=num_experts)
    return counts


def random_window(num_samples: int = 16, num_layers: int = 2, num_experts: int = 4, top_k: int = 2,
                  max_len: int = 20, seed: int = 0, min_len: int = 1, skew: float = 1.0) -> Window:
    """A small random window (exact invariants) for unit and property tests."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_len, max_len + 1, size=num_samples)
    counts = random_counts(lengths, num_layers, num_experts, top_k, rng, skew)
    return Window(lengths, counts, top_k=top_k)


def random_layout(num_samples: int, rows: int, dp: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """A random assignment with every cell nonempty (needs num_samples ≥ rows·dp); no capacity."""
    cells = rows * dp
    if num_samples < cells:
        raise ValueError("need at least rows·dp samples")
    cell_N = np.concatenate([rng.permutation(cells), rng.integers(0, cells, num_samples - cells)])
    cell_N = cell_N[rng.permutation(num_samples)]
    return cell_N // dp, cell_N % dp

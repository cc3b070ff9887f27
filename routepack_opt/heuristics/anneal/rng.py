"""Random numbers of the annealer: splitmix64 seeding and xoshiro256** streams (Blackman & Vigna
2018), one stream per (seed, temperature, replica), so results do not depend on the thread count.

The Python side derives stream states and single uniforms from integer keys; the compiled side
steps a state held in four registers (``s0..s3``) and threads it through the move functions as
plain values (stores to an array would force reloads: numba gives LLVM no aliasing information).
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["rng_states", "uniform", "xo", "below", "unit"]

_U64 = np.uint64
_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> tuple[int, int]:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    z = x
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x, z ^ (z >> 31)


def _stream_key(*parts: int) -> int:
    x = 0x5EED
    for p in parts:
        x, z = _splitmix64((x ^ (int(p) & _MASK64)) & _MASK64)
        x ^= z
    return x


def rng_states(seed: int, rung: int, K: int) -> np.ndarray:
    """xoshiro256** states [K, 4] for replica streams of one rung (never all zero). Rungs −1
    (ladder calibration) and −2 (random walks off the seeds) are the setup's own streams."""
    out = np.empty((K, 4), dtype=np.uint64)
    for k in range(K):
        x = _stream_key(seed, rung, k)
        for j in range(4):
            x, z = _splitmix64(x)
            out[k, j] = z or 1
    return out


def uniform(seed: int, *parts: int) -> float:
    """One double in [0, 1) from the key (seed, *parts) (e.g. the resampling offset of a rung)."""
    return (_splitmix64(_stream_key(seed, *parts))[1] >> 11) * 2.0**-53


@njit(cache=True, _nrt=False, inline='always')
def _rotl(x, k):
    return (x << _U64(k)) | (x >> _U64(64 - k))


@njit(cache=True, _nrt=False, inline='always')
def xo(s0, s1, s2, s3):
    """One xoshiro256** step on a state held in registers: (output, new state)."""
    result = _rotl(s1 * _U64(5), 7) * _U64(9)
    t = s1 << _U64(17)
    s2 ^= s0
    s3 ^= s1
    s1 ^= s2
    s0 ^= s3
    s2 ^= t
    s3 = _rotl(s3, 45)
    return result, s0, s1, s2, s3


@njit(cache=True, _nrt=False, inline='always')
def below(x, n):
    """Integer in [0, n) from one output, n < 2^32 (multiply-shift, Lemire 2019)."""
    return np.int64(((x >> _U64(32)) * _U64(n)) >> _U64(32))


@njit(cache=True, _nrt=False, inline='always')
def unit(x):
    """Double in (0, 1] from one output."""
    return (np.float64(x >> _U64(11)) + 1.0) * (1.0 / 9007199254740992.0)

"""A counter-based random stream: uniform draws as a pure function of (key, position).

Samplers must recompute any step alone (exact resume, plan validation, one rank's window), so
their randomness cannot be a stream consumed in order. Each draw here is splitmix64's finaliser
of ``key + position * golden``: the sequence splitmix64 itself generates (it passes BigCrush),
indexed directly. The arithmetic is fixed here, not borrowed from numpy's Generator methods,
whose outputs numpy may change between versions; only ``SeedSequence`` (whose output numpy
keeps stable) turns a seed and a spawn key into the 64-bit key.
"""

from __future__ import annotations

import numpy as np
from numba import njit

GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # splitmix64's increment (2**64 over the golden ratio)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


@njit(cache=True, inline="always")
def mix64(z):  # pragma: no cover - compiled
    """splitmix64's finaliser of the uint64 ``z`` (in kernels; ``mix64.py_func`` on arrays): its
    one copy, whose outputs the streams here, the neighbour draws, the graphs' checksums and
    generator and the plans' digests all depend on."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def stream_key(seed: int, *spawn_key: int) -> np.uint64:
    """The 64-bit key of the stream named by ``seed`` and ``spawn_key`` (e.g. a tag, an epoch)."""
    ss = np.random.SeedSequence(seed, spawn_key=spawn_key)
    return np.uint64(ss.generate_state(1, np.uint64)[0])


def bits(key: np.uint64, positions: np.ndarray) -> np.ndarray:
    """64 random bits per position of the stream ``key``: same shape as ``positions``, uint64."""
    with np.errstate(over="ignore"):  # the arithmetic is modulo 2**64 by design
        return mix64.py_func(key + positions.astype(np.uint64) * GOLDEN)


def uniform(key: np.uint64, positions: np.ndarray) -> np.ndarray:
    """Uniform draws in [0, 1) (53 bits each) at ``positions`` of the stream ``key``: float64."""
    return (bits(key, positions) >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))

"""An open-addressed table of ids (linear probing, at most half full): the one set of ids a
kernel builds per batch or subgraph, sized by it, never by the dataset or graph (issue 48).

``keys`` holds the ids (-1: an empty slot); a caller keeps what it maps each id to in arrays of
its own, indexed by the same slot.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from solar.schedule.draw.rng import mix64


@njit(cache=True)
def id_table(room):  # pragma: no cover - compiled
    """An empty table for ``room`` ids at most half full: (keys, mask)."""
    size = 16
    while size < 2 * room:
        size *= 2
    return np.full(size, -1, np.int64), np.uint64(size - 1)


@njit(cache=True, inline="always")
def find(keys, x, mask):  # pragma: no cover - compiled
    """The slot of id ``x`` (>= 0) in ``keys``: where it is, or the empty slot where it goes."""
    i = np.intp(mix64(np.uint64(x)) & mask)
    while keys[i] != x and keys[i] >= 0:
        i = (i + np.intp(1)) & np.intp(mask)
    return i

"""An open-addressed table of ids (linear probing, at most half full): the one set of ids a
kernel builds per batch or subgraph, sized by it, never by the dataset or graph (issue 48).

``keys`` holds the ids (-1: an empty slot); a caller keeps what it maps each id to in arrays of
its own, indexed by the same slot. :func:`marks` is the same table with a stamp a slot: a set
per stamp, emptied by taking a new stamp, not by clearing.
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


@njit(cache=True)
def marks(room):  # pragma: no cover - compiled
    """An empty set of up to ``room`` ids per stamp (:func:`id_table`, with a stamp a slot),
    read with :func:`first_mark`: ``(table, stamp, mask)``. A new stamp starts an empty set
    (no clearing), so one table serves every batch of a pass, sized by the largest."""
    table, mask = id_table(room)
    return table, np.full(table.shape[0], -1, np.int64), mask


@njit(cache=True, inline="always")
def first_mark(table, stamp, mask, x, tag):  # pragma: no cover - compiled
    """Mark id ``x`` (>= 0) under stamp ``tag``: True if it was not marked under it yet (slots
    of other stamps are free)."""
    i = np.intp(mix64(np.uint64(x)) & mask)
    for _ in range(table.shape[0]):  # bounded: a full table raises, never spins
        if stamp[i] != tag:
            stamp[i] = tag
            table[i] = x
            return True
        if table[i] == x:
            return False
        i = (i + np.intp(1)) & np.intp(mask)
    raise AssertionError("first_mark: the set is full (sized too small)")

"""The keys a window of the trace touches, numbered densely: its planner's tables are sized by
them, never by the dataset (issue 48: at N = 10^8 a table of every (rank, sample) key is
gigabytes per rank planned; a window's keys are the accesses of two windows of steps).

``keys`` are the window's distinct keys, sorted; key ``keys[v]`` is local key ``v`` in every
table of the window (next uses' backward pass, page mates' table, who holds what). Sorted, the
numbering keeps the keys' order and is found again with ``searchsorted``; :func:`key_index`
finds a key from a kernel (page mates, which are named by sample, not by access).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from solar.schedule.draw.idtable import find, id_table
from solar.schedule.draw.rng import mix64


def key_space(parts: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
    """The distinct keys of ``parts`` (int64, sorted) and each part's keys as local keys
    (int64 indices into them)."""
    if not parts:
        return np.zeros(0, np.int64), []
    keys = np.unique(np.concatenate(parts) if len(parts) > 1 else parts[0]).astype(np.int64)
    return keys, [np.searchsorted(keys, p).astype(np.int64) for p in parts]


@njit(cache=True, nogil=True)
def key_index(keys):  # pragma: no cover - compiled
    """A hash of ``keys`` (distinct, >= 0) to their positions: ``(table, mask, local)``, read
    with :func:`local_key`."""
    table, mask = id_table(keys.shape[0])
    local = np.empty(table.shape[0], np.int64)
    for v in range(keys.shape[0]):
        i = find(table, keys[v], mask)
        table[i] = keys[v]
        local[i] = v
    return table, mask, local


@njit(cache=True, inline="always")
def local_key(table, mask, local, x):  # pragma: no cover - compiled
    """Key ``x``'s local key in :func:`key_index`'s hash, or -1 if it is not one of them."""
    i = find(table, x, mask)
    return local[i] if table[i] == x else -1


@njit(cache=True)
def marks(room):  # pragma: no cover - compiled
    """An empty set of up to ``room`` ids per stamp, read with :func:`first_mark`:
    ``(table, stamp, mask)``. A new stamp starts an empty set (no clearing), so one table
    serves every batch of a pass, sized by the largest."""
    table, mask = id_table(room)
    return table, np.full(table.shape[0], -1, np.int64), mask


@njit(cache=True, inline="always")
def first_mark(table, stamp, mask, x, tag):  # pragma: no cover - compiled
    """Mark id ``x`` (>= 0) under stamp ``tag``: True if it was not marked under it yet (slots
    of other stamps are free)."""
    i = np.intp(mix64(np.uint64(x)) & mask)
    while stamp[i] == tag and table[i] != x:
        i = (i + np.intp(1)) & np.intp(mask)
    if stamp[i] == tag:
        return False
    stamp[i] = tag
    table[i] = x
    return True


@njit(cache=True, nogil=True)
def distinct_batches(ids, offsets, world, sample_out, rank_out, counts):  # pragma: no cover
    """Per (step, rank) batch ``g`` of ``ids`` (``offsets``), its distinct ids in
    first-occurrence order (``rank_out``: ``g % world``; ``counts[g // world, g % world]``:
    how many), seen ids marked in one :func:`marks` set, a stamp a batch. Returns the number
    kept."""
    room = 0
    for g in range(offsets.shape[0] - 1):
        room = max(room, offsets[g + 1] - offsets[g])
    table, stamp, mask = marks(room)
    n = 0
    for g in range(offsets.shape[0] - 1):
        c = 0
        for j in range(offsets[g], offsets[g + 1]):
            x = ids[j]
            if first_mark(table, stamp, mask, x, g):
                sample_out[n] = x
                rank_out[n] = g % world
                n += 1
                c += 1
        counts[g // world, g % world] = c
    return n

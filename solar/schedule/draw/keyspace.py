"""The keys a window of the trace touches, numbered densely: its planner's tables are sized by
them, never by the dataset (issue 48: at N = 10^8 a table of every (rank, sample) key is
gigabytes per rank planned; a window's keys are the accesses of two windows of steps).

``keys`` are the window's keys, sorted (its distinct keys; or every key of their span, where
that is less than ``OFFSET_SPAN`` times its accesses); key ``keys[v]`` is local key ``v`` in
every table of the window (next uses' backward pass, page mates' table, who holds what).
Sorted, the numbering keeps the keys' order: the keys of a run of rows (a page's mates) are a
run of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from solar.schedule.draw.idtable import first_mark, marks

# Keys' span per access below which every key of the span is numbered by offset: an arange
# and a subtraction cost less than the sort, even with a few keys unused per access.
OFFSET_SPAN = 6

# Peak bytes of key_space per access (python bench/keyspace_memory.py: tracemalloc, 2·10^6
# accesses, spans 0.5 to 1000 per access): the offset
# path holds the local keys (8) and the span's keys (8 per key); the sort path its argsort,
# sorted copy, mask and local keys (41) and the distinct keys (8 per key).
OFFSET_BYTES, SORT_BYTES, KEY_BYTES = 8, 41, 8


@dataclass(frozen=True)
class Numbering:
    """A window's keys numbered densely (:func:`number_keys`): ``keys`` (int64, sorted), and
    part ``e``'s access ``i`` as local key ``arrays[e][i] - shift``. ``by_offset``: the
    arrays are the parts themselves (no copy: the kernels subtract ``shift``, the span's first
    key); else each part's local keys (fresh arrays; ``shift`` 0)."""

    keys: np.ndarray
    arrays: list[np.ndarray]
    shift: int
    by_offset: bool

    def local(self, e: int) -> np.ndarray:
        """Part ``e``'s local keys as an array of their own (a planner reorders it)."""
        return self.arrays[e] - self.shift if self.by_offset else self.arrays[e]


def number_keys(parts: list[np.ndarray]) -> Numbering:
    """The keys of ``parts`` (int64) numbered densely: where their span is less than
    ``OFFSET_SPAN`` times their count, every key of the span, numbered by offset (no sort,
    no copy); else the distinct keys, by one sort of them all (np.unique's hash and
    searchsorted's random probes cost several times more at a window's size)."""
    sizes = [p.size for p in parts]
    total = sum(sizes)
    if total == 0:
        return Numbering(np.zeros(0, np.int64), [np.zeros(0, np.int64) for _ in parts], 0, False)
    lo = min(int(p.min()) for p in parts if p.size)
    hi = max(int(p.max()) for p in parts if p.size)
    if hi - lo < OFFSET_SPAN * total:
        arrays = [p.astype(np.int64, copy=False) for p in parts]
        return Numbering(np.arange(lo, hi + 1, dtype=np.int64), arrays, lo, True)
    every = np.concatenate(parts).astype(np.int64, copy=False)
    order = np.argsort(every)
    ordered = every[order]
    new = np.empty(ordered.size, np.bool_)
    new[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=new[1:])
    keys = ordered[new]
    del ordered
    local = np.empty(every.size, np.int64)
    local[order] = np.cumsum(new) - 1
    return Numbering(keys, np.split(local, np.cumsum(sizes)[:-1]), 0, False)


def key_space(parts: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
    """:func:`number_keys`' keys and each part's local keys as arrays of their own."""
    n = number_keys(parts)
    return n.keys, [n.local(e) for e in range(len(parts))]


@njit(cache=True, nogil=True)
def distinct_batches(ids, offsets, world, sample_out, rank_out, counts,
                     distinct):  # pragma: no cover  # fmt: skip
    """Per (step, rank) batch ``g`` of ``ids`` (``offsets``), its distinct ids in
    first-occurrence order (``rank_out``: ``g % world``; ``counts[g // world, g % world]``:
    how many), seen ids marked in one :func:`marks` set, a stamp a batch; ``distinct``: the
    batches' ids are distinct already (Sampler.distinct), kept as they are, no set. Returns
    the number kept."""
    room = 0
    for g in range(offsets.shape[0] - 1):
        room = max(room, offsets[g + 1] - offsets[g])
    table, stamp, mask = marks(0 if distinct else room)
    n = 0
    for g in range(offsets.shape[0] - 1):
        c = 0
        for j in range(offsets[g], offsets[g + 1]):
            x = ids[j]
            if distinct or first_mark(table, stamp, mask, x, g):
                sample_out[n] = x
                rank_out[n] = g % world
                n += 1
                c += 1
        counts[g // world, g % world] = c
    return n

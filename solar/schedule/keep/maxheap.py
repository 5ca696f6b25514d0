"""Per-rank indexed max-heaps of cells keyed by next use: Belady's "farthest next use" in O(1).

Rank r's heap is row r of two (P, cells) arrays, ``key[r, i]`` and ``heap[r, i]`` (the cell at
heap position i), and of a (P, cells, fields) array whose field ``f`` holds each cell's heap
position, ``cells[r, s, f]``, so that a cell's key can be changed in place. The other fields are
the caller's: what it keeps per cell sits beside the position (one cache miss finds both, 14 %
of the planner's time at 10^7 samples). The heaps are 4-ary (binary, 4-, 8- and 16-ary
measured alike at 10^5 cells: the cost is the misses at the bottom levels, whatever the arity).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from solar.schedule.policy import NEVER

ARITY = 4


@njit(cache=True, inline="always")
def _put(key, heap, cells, f, r, i, k, s):
    """Heap position ``i`` of rank r holds cell ``s`` with key ``k``; the cell knows it."""
    key[r, i] = k
    heap[r, i] = s
    cells[r, s, f] = i


@njit(cache=True, inline="always")
def sift_up(key, heap, cells, f, r, i):
    """Move rank r's heap entry at position ``i`` up while its key exceeds its parent's."""
    k = key[r, i]
    s = heap[r, i]
    while i > 0:
        p = (i - 1) // ARITY
        if key[r, p] >= k:
            break
        _put(key, heap, cells, f, r, i, key[r, p], heap[r, p])
        i = p
    _put(key, heap, cells, f, r, i, k, s)


@njit(cache=True, inline="always")
def sift_down(key, heap, cells, f, r, i):
    """Move rank r's heap entry at position ``i`` down while a child's key exceeds it."""
    n = key.shape[1]
    k = key[r, i]
    s = heap[r, i]
    while True:
        first = ARITY * i + 1
        if first >= n:
            break
        c = first
        for j in range(first + 1, min(first + ARITY, n)):
            if key[r, j] > key[r, c]:
                c = j
        if key[r, c] <= k:
            break
        _put(key, heap, cells, f, r, i, key[r, c], heap[r, c])
        i = c
    _put(key, heap, cells, f, r, i, k, s)


@njit(cache=True)
def rekey(key, heap, cells, f, r, s, n):
    """Set the key of rank r's cell ``s`` to ``n`` and restore the heap."""
    i = cells[r, s, f]
    old = key[r, i]
    key[r, i] = n
    if n > old:
        sift_up(key, heap, cells, f, r, i)
    elif n < old:
        sift_down(key, heap, cells, f, r, i)


def empty_heaps(world: int, cells: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-rank heaps over ``cells`` cells, all keys NEVER: (key, heap), each (P, cells); cell
    s at heap position s."""
    heap = np.tile(np.arange(cells, dtype=np.int32), (world, 1))
    return np.full((world, cells), NEVER, np.int64), heap

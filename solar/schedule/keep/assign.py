"""Who serves what within one global batch: rank affinity and balancing of reads.

These are numba kernels called by the policies for one global step ``[a, b)`` of the access
sequence; ``rank_out[i] = -1`` marks an access not yet assigned.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from solar.schedule.policy import HIT


@njit(cache=True, inline="always")
def step_caps(g, world, cap_of, cap):
    """Per-rank caps for a global batch of ``g``: nominal shares as even as possible."""
    base = g // world
    extra = g % world
    for r in range(world):
        cap[r] = cap_of[base + 1] if r < extra else cap_of[base]


@njit(cache=True)
def assign_affinity(seq, a, b, holder, hslot, count, cap, rank_out, slot_out, flags):
    """A sample held by rank r goes to r while r is under its cap (a hit from its slot)."""
    for i in range(a, b):
        h = holder[seq[i]]
        if h >= 0 and count[h] < cap[h]:
            rank_out[i] = h
            slot_out[i] = hslot[seq[i]]
            flags[i] = HIT
            count[h] += 1
        else:
            rank_out[i] = -1
            slot_out[i] = -1
            flags[i] = 0


@njit(cache=True, inline="always")
def _before(x, y, reads, count):
    """Whether rotation position ``x`` precedes ``y`` in (reads, batch, rotation) order."""
    if reads[x] != reads[y]:
        return reads[x] < reads[y]
    if count[x] != count[y]:
        return count[x] < count[y]
    return x < y


@njit(cache=True, inline="always")
def _sift_down(heap, n, i, reads, count):
    """Restore the min-heap below ``heap[i]`` after its key grew (or it was replaced)."""
    x = heap[i]
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and _before(heap[c + 1], heap[c], reads, count):
            c += 1
        if not _before(heap[c], x, reads, count):
            break
        heap[i] = heap[c]
        i = c
    heap[i] = x


@njit(cache=True, inline="always")
def _rank_at(j, start, world):
    """The rank at rotation position ``j`` of a step whose turn starts at rank ``start``."""
    r = start + j
    return r - world if r >= world else r


@njit(cache=True)
def _heap_of_ranks(start, world, count, reads, cap, heap, rd, ct):
    """Fill ``heap`` with the rotation positions of the ranks under their cap; its size.

    ``rd``/``ct`` receive reads/count in rotation order, so that sifting compares contiguous
    memory and the last tie-break is a plain comparison of positions.
    """
    n = 0
    for j in range(world):
        r = _rank_at(j, start, world)
        rd[j] = reads[r]
        ct[j] = count[r]
        if count[r] < cap[r]:
            heap[n] = j
            n += 1
    for h in range(n // 2 - 1, -1, -1):
        _sift_down(heap, n, h, rd, ct)
    return n


@njit(cache=True)
def assign_balanced(a, b, k, world, count, reads, cap, rank_out):
    """Unassigned accesses go to the rank with the fewest reads, then the smallest batch.

    Ties rotate with the step ``k`` so that no rank is favoured: among equals, the first rank
    in the order ``k % world, k % world + 1, ...`` wins. The ranks under their cap sit in a
    binary min-heap on exactly that total order, so each placement costs O(log P) and makes
    the same choice as a scan of all P ranks; building the heap costs O(P) per step, O(1/B)
    per access. The caps must leave room for every access (they do: each rank's cap is at
    least its nominal share of the step).
    """
    start = k % world
    heap = np.empty(world, np.int64)
    rd = np.empty(world, np.int64)
    ct = np.empty(world, np.int64)
    n = -1  # built on the first read: a step served wholly by hits needs no heap
    for i in range(a, b):
        if rank_out[i] >= 0:
            continue
        if n < 0:
            n = _heap_of_ranks(start, world, count, reads, cap, heap, rd, ct)
        if n == 0:
            raise ValueError("assign_balanced: the caps leave no room for an access")
        j = heap[0]
        r = _rank_at(j, start, world)
        rank_out[i] = r
        count[r] += 1
        reads[r] += 1
        rd[j] += 1
        ct[j] += 1
        if count[r] >= cap[r]:
            # Full: it leaves the heap, the last leaf taking the root's place.
            n -= 1
            heap[0] = heap[n]
        _sift_down(heap, n, 0, rd, ct)


@njit(cache=True)
def assign_round_robin(a, b, k, world, count, cap, rank_out):
    """Unassigned accesses go round-robin over the ranks under their cap (SOLAR's artifact)."""
    r = k % world
    for i in range(a, b):
        if rank_out[i] >= 0:
            continue
        while count[r] >= cap[r]:
            r = (r + 1) % world
        rank_out[i] = r
        count[r] += 1
        r = (r + 1) % world


@njit(cache=True)
def assign_interleaved(a, b, world, count, rank_out, slot_out, flags):
    """DistributedSampler's split: position j of the global batch goes to rank j % world."""
    for i in range(a, b):
        r = (i - a) % world
        rank_out[i] = r
        slot_out[i] = -1
        flags[i] = 0
        count[r] += 1

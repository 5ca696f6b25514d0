"""Who serves what within one global batch: rank affinity and balancing of reads.

These are numba kernels called by the policies for one global step ``[a, b)`` of the access
sequence; ``rank_out[i] = -1`` marks an access not yet assigned.
"""

from __future__ import annotations

from numba import njit

from solar.schedule._common import HIT


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


@njit(cache=True)
def assign_balanced(a, b, k, world, count, reads, cap, rank_out):
    """Unassigned accesses go to the rank with the fewest reads, then the smallest batch.

    Ties rotate with the step ``k`` so that no rank is favoured.
    """
    for i in range(a, b):
        if rank_out[i] >= 0:
            continue
        best = -1
        for j in range(world):
            r = (k + j) % world
            if count[r] >= cap[r]:
                continue
            if (
                best < 0
                or reads[r] < reads[best]
                or (reads[r] == reads[best] and count[r] < count[best])
            ):
                best = r
        rank_out[i] = best
        count[best] += 1
        reads[best] += 1


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

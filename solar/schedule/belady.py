"""The ``solar`` policy: rank affinity plus Belady eviction with bypass.

Each rank keeps a max-heap of its C slots keyed by the next use of the sample in the slot
(empty or dead slots have key NEVER and so sit on top). A read is admitted only if its next use
is sooner than the farthest one in the heap, replacing it; otherwise it bypasses the buffer.
With affinity, a held sample's next use is its next global appearance, so with one rank this is
exactly Belady's optimal replacement for the access sequence.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from solar.config import BufferConfig, RunConfig
from solar.schedule._common import (
    ADMIT,
    HIT,
    NEVER,
    RELEASE,
    EpochSchedule,
    OccupantContents,
    cap_table,
    slot_count,
)
from solar.schedule.assign import assign_affinity, assign_balanced, step_caps
from solar.schedule.order import sample_dtype, step_bounds


@njit(cache=True, inline="always")
def _sift_up(key, heap, pos, r, i):
    k = key[r, i]
    s = heap[r, i]
    while i > 0:
        p = (i - 1) >> 1
        if key[r, p] >= k:
            break
        key[r, i] = key[r, p]
        heap[r, i] = heap[r, p]
        pos[r, heap[r, i]] = i
        i = p
    key[r, i] = k
    heap[r, i] = s
    pos[r, s] = i


@njit(cache=True, inline="always")
def _sift_down(key, heap, pos, r, i):
    n = key.shape[1]
    k = key[r, i]
    s = heap[r, i]
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and key[r, c + 1] > key[r, c]:
            c += 1
        if key[r, c] <= k:
            break
        key[r, i] = key[r, c]
        heap[r, i] = heap[r, c]
        pos[r, heap[r, i]] = i
        i = c
    key[r, i] = k
    heap[r, i] = s
    pos[r, s] = i


@njit(cache=True, nogil=True)
def _solar_steps(
    seq, nu, bounds, k0, world, cap_of,  # inputs: one epoch; k0 is its first global step
    holder, hslot, key, heap, pos, occupant,  # buffer state, carried across calls
    rank_out, slot_out, flags, counts,  # outputs
):  # fmt: skip
    cap_slots = key.shape[1]
    count = np.zeros(world, np.int64)
    reads = np.zeros(world, np.int64)
    cap = np.zeros(world, np.int64)
    for k in range(bounds.shape[0] - 1):
        a, b = bounds[k], bounds[k + 1]
        step_caps(b - a, world, cap_of, cap)
        count[:] = 0
        reads[:] = 0
        assign_affinity(seq, a, b, holder, hslot, count, cap, rank_out, slot_out, flags)
        assign_balanced(a, b, k0 + k, world, count, reads, cap, rank_out)
        # Buffer updates in access order: a sample hit in this step has its key equal to its
        # position here, which is sooner than any read's next use, so it is never evicted
        # before it is served.
        for i in range(a, b):
            x = seq[i]
            r = rank_out[i]
            n = nu[i]
            if flags[i] & HIT:
                s = slot_out[i]
                key[r, pos[r, s]] = n
                _sift_up(key, heap, pos, r, pos[r, s])
                if n == NEVER:
                    flags[i] |= RELEASE
                    holder[x] = -1
                    occupant[r, s] = -1
                continue
            h = holder[x]
            if h >= 0:
                # Held by a rank already at its cap: that rank keeps it for its next use.
                s = hslot[x]
                key[h, pos[h, s]] = n
                _sift_up(key, heap, pos, h, pos[h, s])
                if n == NEVER:
                    holder[x] = -1
                    occupant[h, s] = -1
            elif cap_slots > 0 and n < key[r, 0]:
                s = heap[r, 0]
                old = occupant[r, s]
                if old >= 0:
                    holder[old] = -1
                occupant[r, s] = x
                holder[x] = r
                hslot[x] = s
                key[r, 0] = n
                _sift_down(key, heap, pos, r, 0)
                flags[i] = ADMIT
                slot_out[i] = s
        counts[k, :] = count


class SolarPolicy(OccupantContents):
    """Rank affinity and per-rank Belady eviction; state carried across epochs, O(N + P·C)."""

    needs_next_use = True

    def __init__(self, run: RunConfig, buffer: BufferConfig) -> None:
        self.run = run
        world, c = run.world_size, slot_count(run, buffer)
        self.holder = np.full(run.num_samples, -1, np.int32)
        self.hslot = np.full(run.num_samples, -1, np.int32)
        self.key = np.full((world, c), NEVER, np.int64)
        self.heap = np.tile(np.arange(c, dtype=np.int32), (world, 1))
        self.pos = self.heap.copy()
        self.occupant = np.full((world, c), -1, sample_dtype(run.num_samples))
        self.cap_of = cap_table(run, buffer)
        self.bounds = step_bounds(run)

    def plan_epoch(self, k: int, seq: np.ndarray, next_use: np.ndarray | None) -> EpochSchedule:
        """Decide epoch ``k``; ``next_use`` is required."""
        assert next_use is not None
        out = EpochSchedule.empty(self.run)
        _solar_steps(
            seq, next_use, self.bounds, k * self.run.steps_per_epoch, self.run.world_size,
            self.cap_of, self.holder, self.hslot, self.key, self.heap, self.pos, self.occupant,
            out.rank, out.slot, out.flags, out.counts,
        )  # fmt: skip
        return out

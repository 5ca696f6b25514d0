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
    Progress,
    Schedule,
    by_epoch,
    cap_table,
    position_dtype,
    slot_count,
)
from solar.schedule.assign import assign_affinity, assign_balanced, step_caps


@njit(cache=True)
def next_use(seq, num_samples, out):
    """``out[i]``: position of the next access to ``seq[i]``, or the maximum of out's type.

    One backward sweep; ``out`` may be int32 to halve the planner's largest array.
    """
    never = np.iinfo(out.dtype).max
    last = np.full(num_samples, never, out.dtype)
    for i in range(seq.shape[0] - 1, -1, -1):
        x = seq[i]
        out[i] = last[x]
        last[x] = i


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


@njit(cache=True)
def _solar_steps(
    seq, nu, bounds, k0, world, cap_of,  # inputs
    holder, hslot, key, heap, pos, occupant,  # buffer state, carried across calls
    rank_out, slot_out, flags, counts,  # outputs
):  # fmt: skip
    cap_slots = key.shape[1]
    never = np.iinfo(nu.dtype).max
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
            n = NEVER if nu[i] == never else np.int64(nu[i])
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
        counts[k0 + k, :] = count


def schedule(
    run: RunConfig, buffer: BufferConfig, seq: np.ndarray, progress: Progress | None = None
) -> Schedule:
    """Plan ``seq`` with rank affinity and per-rank Belady eviction."""
    out = Schedule.empty(run)
    nu = np.empty(seq.shape[0], position_dtype(seq.shape[0]))
    next_use(seq, run.num_samples, nu)
    world, c = run.world_size, slot_count(run, buffer)
    holder = np.full(run.num_samples, -1, np.int32)
    hslot = np.full(run.num_samples, -1, np.int32)
    key = np.full((world, c), NEVER, np.int64)
    heap = np.tile(np.arange(c, dtype=np.int32), (world, 1))
    pos = heap.copy()
    occupant = np.full((world, c), -1, seq.dtype)
    cap_of = cap_table(run, buffer)

    def kernel(bounds: np.ndarray, k0: int) -> None:
        _solar_steps(
            seq, nu, bounds, k0, world, cap_of,
            holder, hslot, key, heap, pos, occupant,
            out.rank, out.slot, out.flags, out.counts,
        )  # fmt: skip

    by_epoch(run, kernel, progress)
    return out

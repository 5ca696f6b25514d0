"""The ``lru`` and ``fifo`` baselines: DistributedSampler's interleaved split, per-rank cache.

Every read is admitted; LRU evicts the least recently used slot, FIFO the oldest admission.
Each rank caches independently, so membership is kept per (rank, sample).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from solar.config import BufferConfig, RunConfig
from solar.schedule.draw.order import sample_dtype, step_bounds
from solar.schedule.keep.assign import assign_interleaved
from solar.schedule.policy import ADMIT, HIT, EpochSchedule, OccupantContents, slot_count


@njit(cache=True, inline="always")
def _unlink(r, s, prev, nxt, head, tail):
    p, n = prev[r, s], nxt[r, s]
    if p >= 0:
        nxt[r, p] = n
    else:
        head[r] = n
    if n >= 0:
        prev[r, n] = p
    else:
        tail[r] = p


@njit(cache=True, inline="always")
def _push_front(r, s, prev, nxt, head, tail):
    prev[r, s] = -1
    nxt[r, s] = head[r]
    if head[r] >= 0:
        prev[r, head[r]] = s
    head[r] = s
    if tail[r] < 0:
        tail[r] = s


@njit(cache=True, nogil=True)
def _interleaved_steps(
    seq, bounds, world, lru,
    slot_of, occupant, prev, nxt, head, tail,
    rank_out, slot_out, flags, counts,
):  # fmt: skip
    cap_slots = occupant.shape[1]
    for k in range(bounds.shape[0] - 1):
        a, b = bounds[k], bounds[k + 1]
        assign_interleaved(a, b, world, counts[k], rank_out, slot_out, flags)
        for i in range(a, b):
            x, r = seq[i], rank_out[i]
            s = slot_of[r, x]
            if s >= 0:
                flags[i] = HIT
                slot_out[i] = s
                if lru:
                    _unlink(r, s, prev, nxt, head, tail)
                    _push_front(r, s, prev, nxt, head, tail)
            elif cap_slots > 0:
                # The list's tail is the least recently used slot (LRU) or, since hits do not
                # move slots, the oldest admission (FIFO).
                s = tail[r]
                old = occupant[r, s]
                if old >= 0:
                    slot_of[r, old] = -1
                occupant[r, s] = x
                slot_of[r, x] = s
                _unlink(r, s, prev, nxt, head, tail)
                _push_front(r, s, prev, nxt, head, tail)
                flags[i] = ADMIT
                slot_out[i] = s


class InterleavedPolicy(OccupantContents):
    """DistributedSampler's interleaved split with a per-rank LRU (or FIFO) cache."""

    needs_next_use = False

    def __init__(self, run: RunConfig, buffer: BufferConfig, lru: bool) -> None:
        self.run, self.lru = run, lru
        world, c = run.world_size, slot_count(run, buffer)
        self.slot_of = np.full((world, run.num_samples), -1, np.int32)
        self.occupant = np.full((world, c), -1, sample_dtype(run.num_samples))
        # Slots 0..c-1 in a doubly linked list per rank, slot 0 at the head.
        idx = np.arange(c, dtype=np.int32)
        self.prev = np.tile(idx - 1, (world, 1))
        self.nxt = np.tile(np.where(idx + 1 < c, idx + 1, -1).astype(np.int32), (world, 1))
        self.head = np.full(world, 0 if c else -1, np.int32)
        self.tail = np.full(world, c - 1, np.int32)
        self.bounds = step_bounds(run)

    def plan_epoch(self, k: int, seq: np.ndarray, next_use: np.ndarray | None) -> EpochSchedule:
        out = EpochSchedule.empty(self.run)
        _interleaved_steps(
            seq, self.bounds, self.run.world_size, self.lru,
            self.slot_of, self.occupant, self.prev, self.nxt, self.head, self.tail,
            out.rank, out.slot, out.flags, out.counts,
        )  # fmt: skip
        return out

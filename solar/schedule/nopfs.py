"""The ``nopfs`` baseline: NoPFS's static, frequency-ranked fill, with no eviction.

Knowing the seed, each rank counts how often it will access every sample under the interleaved
split over the whole run and keeps the C most frequent (ties: first accessed first). A kept
sample is stored at its first access and served from the buffer afterwards.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from solar.config import BufferConfig, RunConfig
from solar.schedule._common import ADMIT, HIT, EpochSchedule, slot_count
from solar.schedule.assign import assign_interleaved
from solar.schedule.epochs import EpochOrder
from solar.schedule.order import interleaved_ranks, step_bounds


@njit(cache=True, nogil=True)
def _frequencies(seq, ranks, base, freq, first):
    """Count one epoch's accesses per (rank, sample); ``base`` is its first global position."""
    for i in range(seq.shape[0]):
        r, x = ranks[i], seq[i]
        if freq[r, x] == 0:
            first[r, x] = base + i
        freq[r, x] += 1


@njit(cache=True, nogil=True)
def _nopfs_steps(seq, bounds, world, slot_of, loaded, rank_out, slot_out, flags, counts):
    for k in range(bounds.shape[0] - 1):
        a, b = bounds[k], bounds[k + 1]
        assign_interleaved(a, b, world, counts[k], rank_out, slot_out, flags)
        for i in range(a, b):
            x, r = seq[i], rank_out[i]
            s = slot_of[r, x]
            if s < 0:
                continue
            flags[i] = HIT if loaded[r, x] else ADMIT
            loaded[r, x] = True
            slot_out[i] = s


class NopfsPolicy:
    """NoPFS: each rank keeps its C most frequently accessed samples, filled at first use."""

    needs_next_use = False

    def __init__(self, run: RunConfig, buffer: BufferConfig, order: EpochOrder) -> None:
        self.run = run
        world, n = run.world_size, run.num_samples
        # Frequencies over the whole run, one epoch at a time: NoPFS's static ranking.
        freq = np.zeros((world, n), np.int32)
        first = np.zeros((world, n), np.int64)
        ranks = interleaved_ranks(run)
        for k in range(run.epochs):
            _frequencies(order.served(k), ranks, k * run.samples_per_epoch, freq, first)
        self.slot_of = np.full((world, n), -1, np.int32)
        for r in range(world):
            seen = np.flatnonzero(freq[r])
            kept = seen[np.lexsort((first[r, seen], -freq[r, seen]))[: buffer.capacity]]
            self.slot_of[r, kept] = np.arange(kept.size, dtype=np.int32)
        self.loaded = np.zeros((world, n), np.bool_)
        self.bounds = step_bounds(run)
        self.slots = slot_count(run, buffer)

    def plan_epoch(self, k: int, seq: np.ndarray, next_use: np.ndarray | None) -> EpochSchedule:
        out = EpochSchedule.empty(self.run)
        _nopfs_steps(
            seq, self.bounds, self.run.world_size, self.slot_of, self.loaded,
            out.rank, out.slot, out.flags, out.counts,
        )  # fmt: skip
        return out

    def contents(self, r: int) -> np.ndarray:
        held = np.flatnonzero(self.loaded[r])
        out = np.full(self.slots, -1, np.int64)
        out[self.slot_of[r, held]] = held
        return out

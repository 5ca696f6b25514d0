"""The ``nopfs`` baseline: NoPFS's static, frequency-ranked fill, with no eviction.

Knowing the seed, each rank counts how often it will access every sample under the interleaved
split over the whole run and keeps the C most frequent in RAM and the next D in its second
tier (ties: first accessed first). A kept sample is stored at its first access and served from
its tier afterwards.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from solar.config import BufferConfig, RunConfig
from solar.schedule.draw.epochs import EpochOrder
from solar.schedule.draw.order import interleaved_ranks, step_bounds
from solar.schedule.keep.assign import assign_interleaved
from solar.schedule.policy import (
    ADMIT,
    HIT,
    TADMIT,
    THIT,
    EpochSchedule,
    slot_count,
    tier_slot_count,
)


@njit(cache=True, nogil=True)
def _frequencies(seq, ranks, base, freq, first):
    """Count one epoch's accesses per (rank, sample); ``base`` is its first global position."""
    for i in range(seq.shape[0]):
        r, x = ranks[i], seq[i]
        if freq[r, x] == 0:
            first[r, x] = base + i
        freq[r, x] += 1


@njit(cache=True, nogil=True)
def _nopfs_steps(seq, bounds, world, c, slot_of, loaded, rank_out, slot_out, tslot_out, flags,
                 counts):  # fmt: skip
    """``slot_of[r, x]``: the cell rank r keeps x in (RAM slots 0..c-1, then tier slots), -1."""
    for k in range(bounds.shape[0] - 1):
        a, b = bounds[k], bounds[k + 1]
        assign_interleaved(a, b, world, counts[k], rank_out, slot_out, flags)
        for i in range(a, b):
            x, r = seq[i], rank_out[i]
            s = slot_of[r, x]
            if s < 0:
                continue
            if s < c:
                flags[i] = HIT if loaded[r, x] else ADMIT
                slot_out[i] = s
            else:
                flags[i] = THIT if loaded[r, x] else TADMIT
                tslot_out[i] = s - c
            loaded[r, x] = True


class NopfsPolicy:
    """NoPFS: each rank keeps its C (then D) most frequently accessed samples in RAM (then its
    tier), filled at first use."""

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
        self.slots, self.tier = slot_count(run, buffer), tier_slot_count(run, buffer)
        self.slot_of = np.full((world, n), -1, np.int32)
        for r in range(world):
            seen = np.flatnonzero(freq[r])
            kept = seen[np.lexsort((first[r, seen], -freq[r, seen]))[: self.slots + self.tier]]
            self.slot_of[r, kept] = np.arange(kept.size, dtype=np.int32)
        self.loaded = np.zeros((world, n), np.bool_)
        self.bounds = step_bounds(run)

    def plan_epoch(self, k: int, seq: np.ndarray, next_use: np.ndarray | None) -> EpochSchedule:
        out = EpochSchedule.empty(self.run, with_tier=self.tier > 0)
        # Without a tier no tier slot is written: a writable stand-in for the read-only -1s.
        tslot = out.tslot if self.tier else np.empty(0, np.int32)
        _nopfs_steps(
            seq, self.bounds, self.run.world_size, self.slots, self.slot_of, self.loaded,
            out.rank, out.slot, tslot, out.flags, out.counts,
        )  # fmt: skip
        return out

    def contents(self, r: int) -> np.ndarray:
        held = np.flatnonzero(self.loaded[r])
        out = np.full(self.slots + self.tier, -1, np.int64)
        out[self.slot_of[r, held]] = held
        return out

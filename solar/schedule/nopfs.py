"""The ``nopfs`` baseline: NoPFS's static, frequency-ranked fill, with no eviction.

Knowing the seed, each rank counts how often it will access every sample under the interleaved
split over the whole run and keeps the C most frequent (ties: first accessed first). A kept
sample is stored at its first access and served from the buffer afterwards.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from solar.config import BufferConfig, RunConfig
from solar.schedule._common import ADMIT, HIT, Progress, Schedule, by_epoch
from solar.schedule.assign import assign_interleaved
from solar.schedule.order import interleaved_ranks


@njit(cache=True)
def _frequencies(seq, ranks, epoch_len, freq, first):
    for i in range(seq.shape[0]):
        r, x = ranks[i % epoch_len], seq[i]
        if freq[r, x] == 0:
            first[r, x] = i
        freq[r, x] += 1


@njit(cache=True)
def _nopfs_steps(seq, bounds, k0, world, slot_of, loaded, rank_out, slot_out, flags, counts):
    for k in range(bounds.shape[0] - 1):
        a, b = bounds[k], bounds[k + 1]
        assign_interleaved(a, b, world, counts[k0 + k], rank_out, slot_out, flags)
        for i in range(a, b):
            x, r = seq[i], rank_out[i]
            s = slot_of[r, x]
            if s < 0:
                continue
            flags[i] = HIT if loaded[r, x] else ADMIT
            loaded[r, x] = True
            slot_out[i] = s


def schedule(
    run: RunConfig, buffer: BufferConfig, seq: np.ndarray, progress: Progress | None = None
) -> Schedule:
    """Plan ``seq`` with NoPFS's static fill."""
    out = Schedule.empty(run)
    world, n = run.world_size, run.num_samples
    freq = np.zeros((world, n), np.int32)
    first = np.zeros((world, n), np.int64)
    _frequencies(seq, interleaved_ranks(run), run.samples_per_epoch, freq, first)
    slot_of = np.full((world, n), -1, np.int32)
    for r in range(world):
        seen = np.flatnonzero(freq[r])
        kept = seen[np.lexsort((first[r, seen], -freq[r, seen]))[: buffer.capacity]]
        slot_of[r, kept] = np.arange(kept.size, dtype=np.int32)
    loaded = np.zeros((world, n), np.bool_)

    def kernel(bounds: np.ndarray, k0: int) -> None:
        _nopfs_steps(
            seq, bounds, k0, world, slot_of, loaded, out.rank, out.slot, out.flags, out.counts
        )

    by_epoch(run, kernel, progress)
    return out

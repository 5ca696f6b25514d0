"""What every policy produces, and the epoch-by-epoch driver they share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from solar.config import BufferConfig, RunConfig
from solar.schedule.order import step_bounds

# Per-access flags of a plan (a uint8 bit set).
HIT = 1  # served from `slot` as the buffer holds it at the start of the step
ADMIT = 2  # a read whose bytes are stored into `slot` once the step's batch is assembled
RELEASE = 4  # a hit that is the sample's last use: `slot` holds nothing useful after the step

NEVER = np.iinfo(np.int64).max  # "next use" of a sample that is not used again


def position_dtype(num_accesses: int) -> np.dtype:
    """Narrowest type for access positions; its maximum stands for NEVER in stored arrays."""
    return np.dtype(np.int32 if num_accesses < np.iinfo(np.int32).max else np.int64)


Progress = Callable[[int], None]


@dataclass
class Schedule:
    """A policy's decisions, indexed by global access position (run order).

    ``rank[i]`` serves access ``i`` (int16: at most 32767 ranks); ``slot[i]`` is its buffer
    slot (-1 for a read that is not admitted); ``flags[i]`` holds HIT/ADMIT/RELEASE;
    ``counts[k, r]`` is rank r's local batch size at global step k.
    """

    rank: np.ndarray
    slot: np.ndarray
    flags: np.ndarray
    counts: np.ndarray

    @classmethod
    def empty(cls, run: RunConfig) -> Schedule:
        n = run.num_accesses
        return cls(
            rank=np.empty(n, np.int16),
            slot=np.empty(n, np.int32),
            flags=np.zeros(n, np.uint8),
            counts=np.zeros((run.num_steps, run.world_size), np.int32),
        )


def slot_count(run: RunConfig, buffer: BufferConfig) -> int:
    """Slots a rank's buffer needs: its capacity, but never more than N (it holds no more)."""
    return min(buffer.capacity, run.num_samples)


def cap_table(run: RunConfig, buffer: BufferConfig) -> np.ndarray:
    """``cap[b]``: the largest local batch allowed to a rank whose nominal share is ``b``."""
    return np.array([buffer.cap(b) for b in range(run.batch_size + 2)], dtype=np.int64)


def by_epoch(run: RunConfig, kernel: Callable[[np.ndarray, int], None], progress: Progress | None):
    """Call ``kernel(bounds, first_step)`` once per epoch with the epoch's global step bounds."""
    local = step_bounds(run)
    for e in range(run.epochs):
        kernel(local + e * run.samples_per_epoch, e * run.steps_per_epoch)
        if progress is not None:
            progress(run.steps_per_epoch)

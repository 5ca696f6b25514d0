"""What every policy produces and the interface every policy implements."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from solar.config import BufferConfig, RunConfig

# Per-access flags of a plan (a uint8 bit set).
HIT = 1  # served from `slot` as the buffer holds it at the start of the step
ADMIT = 2  # a read whose bytes are stored into `slot` once the step's batch is assembled
RELEASE = 4  # a hit that is the sample's last use: `slot` holds nothing useful after the step

NEVER = np.iinfo(np.int64).max  # "next use" of a sample that is not used again


Progress = Callable[[int], None]


@dataclass
class EpochSchedule:
    """A policy's decisions for one epoch, indexed by position within the epoch.

    ``rank[i]`` serves the epoch's access ``i`` (int16: at most 32767 ranks); ``slot[i]`` is its
    buffer slot (-1 for a read that is not admitted); ``flags[i]`` holds HIT/ADMIT/RELEASE;
    ``counts[t, r]`` is rank r's local batch size at the epoch's step t.
    """

    rank: np.ndarray  # (samples per epoch,) int16
    slot: np.ndarray  # (samples per epoch,) int32
    flags: np.ndarray  # (samples per epoch,) uint8
    counts: np.ndarray  # (steps per epoch, P) int32

    @classmethod
    def empty(cls, run: RunConfig) -> EpochSchedule:
        n = run.samples_per_epoch
        return cls(
            rank=np.empty(n, np.int16),
            slot=np.empty(n, np.int32),
            flags=np.zeros(n, np.uint8),
            counts=np.zeros((run.steps_per_epoch, run.world_size), np.int32),
        )


class Policy(Protocol):
    """A planning policy: its state carries over from epoch to epoch (O(N + P·C) for solar)."""

    needs_next_use: bool  # plan_epoch wants next uses (Belady), or None will do

    def plan_epoch(self, k: int, seq: np.ndarray, next_use: np.ndarray | None) -> EpochSchedule:
        """Decide run epoch ``k``, whose served samples are ``seq``; ``next_use`` (global
        positions, NEVER for none) is given when the policy's ``needs_next_use`` is true."""
        ...

    def contents(self, r: int) -> np.ndarray:
        """The sample each of rank r's slots holds for later use now (-1: none): (slots,)."""
        ...


class OccupantContents:
    """``contents`` for policies that keep ``occupant`` (P, slots): the sample in each slot."""

    occupant: np.ndarray

    def contents(self, r: int) -> np.ndarray:
        return self.occupant[r].astype(np.int64)


def slot_count(run: RunConfig, buffer: BufferConfig) -> int:
    """Slots a rank's buffer needs: its capacity, but never more than N (it holds no more)."""
    return min(buffer.capacity, run.num_samples)


def cap_table(run: RunConfig, buffer: BufferConfig) -> np.ndarray:
    """``cap[b]``: the largest local batch allowed to a rank whose nominal share is ``b``."""
    return np.array([buffer.cap(b) for b in range(run.batch_size + 2)], dtype=np.int64)

"""What every policy produces and the interface every policy implements."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from solar.config import BufferConfig, RunConfig
from solar.errors import SolarError

# Per-access flags of a plan (a uint8 bit set). ``slot`` names a RAM slot, ``tslot`` a slot of
# the rank's second tier (a file on local NVMe).
HIT = 1  # served from RAM `slot` as the buffer holds it at the start of the step
ADMIT = 2  # once the step's batch is assembled, its row is stored into RAM `slot`
RELEASE = 4  # a hit that is the sample's last use: its slot holds nothing useful after the step
THIT = 8  # served from tier `tslot` as the tier holds it at the start of the step
TADMIT = 16  # once the batch is assembled, its row is written into tier `tslot`
DEMOTE = 32  # with ADMIT: first, what RAM `slot` holds is written into tier `tslot`
# With ADMIT: not served. A row sharing a page with the step's reads, read with them (its
# bytes come with pages read anyway) only to be stored. A step's side rows follow its batch.
SIDE = 64
# A host plan's miss read at the step by another rank of the host (solar.schedule.keep.hostplan):
# copied from that rank's shared batch memory, neither read nor stored by this rank.
PEER = 128

NEVER = np.iinfo(np.int64).max  # "next use" of a sample that is not used again
# A sampler's trace names an access by a global position: (epoch << EPOCH_SHIFT) + its index
# within the epoch's accesses, ordering them whatever the epochs' lengths (traces.py).
EPOCH_SHIFT = 40


Progress = Callable[[int], None]
NextUse = Callable[[np.ndarray], np.ndarray]  # samples -> their next uses (global positions)


@dataclass
class EpochSchedule:
    """A policy's decisions for one epoch, indexed by position within the epoch.

    ``rank[i]`` serves the epoch's access ``i`` (int16: at most 32767 ranks); ``slot[i]`` is its
    RAM slot and ``tslot[i]`` its tier slot (-1: none); ``flags[i]`` holds the flags above;
    ``counts[t, r]`` is rank r's local batch size at the epoch's step t. A policy that adds
    side rows (SIDE) gives the epoch's accesses itself, ``sample``, and ``sides[t, r]``: rank
    r's side rows at step t, after its batch.
    """

    rank: np.ndarray  # (accesses,) int16: the samples an epoch serves, and any side rows
    slot: np.ndarray  # (accesses,) int32
    flags: np.ndarray  # (accesses,) uint8
    counts: np.ndarray  # (steps per epoch, P) int32
    tslot: np.ndarray  # (accesses,) int32; without a tier a read-only view of -1s
    sample: np.ndarray | None = None  # (accesses,) with side rows: the samples, sides included
    sides: np.ndarray | None = None  # (steps per epoch, P) int32: side rows per rank and step

    @property
    def access_counts(self) -> np.ndarray:
        """``counts[t, r]`` plus rank r's side rows at step t: its accesses, (steps, P)."""
        return self.counts if self.sides is None else self.counts + self.sides

    @classmethod
    def empty(cls, run: RunConfig, with_tier: bool = False, n: int | None = None) -> EpochSchedule:
        """Room for an epoch's decisions: ``n`` accesses (default: the samples an epoch serves)."""
        n = run.samples_per_epoch if n is None else n
        return cls(
            rank=np.empty(n, np.int16),
            slot=np.empty(n, np.int32),
            flags=np.zeros(n, np.uint8),
            counts=np.zeros((run.steps_per_epoch, run.world_size), np.int32),
            tslot=np.full(n, -1, np.int32) if with_tier else no_tier(n),
        )


def no_tier(n: int) -> np.ndarray:
    """``tslot`` of accesses that never touch a tier: n read-only -1s in no memory."""
    return np.broadcast_to(np.int32(-1), (n,))


class Policy(Protocol):
    """A planning policy: its state carries over from epoch to epoch (O(N + P·C) for solar)."""

    needs_next_use: bool  # plan_epoch wants next uses (Belady), or None will do

    def plan_epoch(self, k: int, seq: np.ndarray, next_use: np.ndarray | None) -> EpochSchedule:
        """Decide run epoch ``k``, whose served samples are ``seq``; ``next_use`` (global
        positions, NEVER for none) is given when the policy's ``needs_next_use`` is true."""
        ...

    def contents(self, r: int) -> np.ndarray:
        """The sample each of rank r's slots holds for later use now (-1: none): RAM slots,
        then tier slots: (slots + tier slots,)."""
        ...


class OccupantContents:
    """``contents`` for policies that keep ``occupant`` (P, slots): the sample in each slot."""

    occupant: np.ndarray

    def contents(self, r: int) -> np.ndarray:
        return self.occupant[r].astype(np.int64)


def slot_count(run: RunConfig, buffer: BufferConfig) -> int:
    """Slots a rank's buffer needs: its capacity, but never more than N (it holds no more)."""
    return min(buffer.capacity, run.num_samples)


def tier_slot_count(run: RunConfig, buffer: BufferConfig) -> int:
    """Slots a rank's tier needs: its capacity, but never more than the samples RAM leaves."""
    return min(buffer.tier, run.num_samples - slot_count(run, buffer))


def cap_table(run: RunConfig, buffer: BufferConfig) -> np.ndarray:
    """``cap[b]``: the largest local batch allowed to a rank whose nominal share is ``b``."""
    return np.array([buffer.cap(b) for b in range(run.batch_size + 2)], dtype=np.int64)


# The policies by name (their factories: solar/schedule/keep/policies.py).
POLICIES = ("solar", "lru", "fifo", "solar-artifact", "nopfs")
# Those of a general sampler's trace (solar.schedule.draw.traces): the baselines take the
# sampler's own split (rank r's share of each global batch), each rank a cache of its own.
TRACE_POLICIES = ("solar", "lru", "static", "nopfs")
TIERED = ("solar", "nopfs")  # the policies that plan a second tier


def check_policy(name: str, buffer: BufferConfig, traced: bool = False) -> None:
    """Refuse an unknown policy (for a general sampler's trace if ``traced``), or one that
    cannot plan ``buffer``'s second tier."""
    names = TRACE_POLICIES if traced else POLICIES
    if name not in names:
        what = "for this sampler " if traced else ""
        raise SolarError(f"policy: unknown {name!r} {what}(choose from {', '.join(names)})")
    if buffer.tier and name not in (("solar",) if traced else TIERED):
        raise SolarError(
            f"policy {name!r} has no second tier (tier_size {buffer.tier}): "
            f"use {'solar' if traced else ' or '.join(TIERED)}"
        )

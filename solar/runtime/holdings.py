"""The holdings stage: the RAM slot buffer and the tier, and the step they match.

:class:`Holdings` is the sole owner of ``at``, the step whose start the buffer and tier match
(-1: none, until a refill). It gathers a step's hits into a batch and applies the step's
updates (the plan's admissions, demotions and tier writes; overwriting a slot is the eviction,
decided by the planner: for the ``solar`` policy Belady in solar/schedule/keep/belady.py).
After a resume or a jump it refills itself to a step through the :class:`Refill` it was built
with: :class:`RawRefill` (rows as stored) or, where a deterministic transform's rows are held,
the transform stage's (solar.runtime.transforms).

A rank's buffer is a host of one rank. With one buffer per host (a host plan,
solar/schedule/keep/hostplan.py) the host's RAM buffer is one shared region (solar/host/region.py)
every local rank maps, with a staging area where a row read for several local ranks is put by
its reader for the others, and the host's tier one file they all opened
(solar/cache/nodetier.py): the :class:`Host` the holdings are built with. Per step ``k`` a
rank:

1. gathers its hits from the host's slots and reads its tier hits from the host's tier (both
   as they stand at the step's start), its own misses from storage into its batch rows;
2. puts its reads that other local ranks need into the staging area;
3. waits at the host's barrier (every local rank has done 1-2: no slot or tier slot is read
   for step k after it);
4. copies its ``PEER`` rows from the staging area, then applies the updates the plan gives
   it (only a row's reader stores it): demotions, admissions, tier admissions, its tier
   writes waited for; where the host updates a cell twice in the step, in the plan's
   phases, with a barrier before those that update a cell another rank updated since the
   last one (solar/schedule/keep/hostplan.py ``host_phases``);
5. waits at the host's barrier (every store and tier write of step k is done before any hit
   of step k + 1, and every staging row is taken before it is overwritten).

No lock: the plan orders every write before the reads that depend on it. The barrier is the
region's own (solar/host/barrier.py), each wait labelled with its step and phase: a rank
that runs other steps than its host's (it left an epoch early, or seeked alone) fails the
barrier in one line instead of matching a peer's other step. A rank alone (:class:`Alone`, a
host of one rank with a private buffer: the mode decided at construction, once) has nothing to
stage, take or wait for (its phases, where it updates a cell twice in a step, follow one
another without a barrier); its tier hits are read ahead with its storage reads
(solar.runtime.reads), where a host's cannot be (another local rank may write the slot until the
step starts), and its tier writes run on into later steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import wait
from typing import Any, Protocol

import numpy as np

from solar.cache.nodetier import NodeTierFile
from solar.cache.slots import SlotBuffer, copy_rows
from solar.cache.tier import TierFile
from solar.errors import SolarError
from solar.host.barrier import REFILL, REFILLED, STAGED, STORED, UPDATED
from solar.host.region import NodeRegion
from solar.io.info import KeyInfo
from solar.io.reader import Reader
from solar.runtime.steps import Steps
from solar.schedule.plans.rankplan import StepPlan

Key = tuple[tuple[int, ...], Any]  # a key's sample shape and dtype
Barrier = Callable[[int, int], None]  # waits for the host's ranks at (step, phase)


class Refill(Protocol):
    """Fills buffer and tier cells with samples (a refill to a step)."""

    def fill(self, k: int, cells: np.ndarray, samples: np.ndarray) -> int:
        """Read ``samples`` into ``cells`` (buffer slots, then tier slots past the buffer's
        capacity) for a start at step ``k``; the bytes read from storage."""
        ...


class Host:
    """One rank's view of its host's shared buffer, staging area and tier (see the module's
    docstring). ``region`` must have room for :meth:`region_parts`; ``barrier(k, phase)``
    waits for every local rank at step ``k``'s ``phase`` (the region's
    :class:`~solar.host.barrier.HostBarrier`); ``tier``: the host's tier file, or None."""

    reads_tier = True  # tier hits read at the step: another local rank may write their slot

    def __init__(self, region: NodeRegion, slots: int, stage_rows: int, keys: list[Key],
                 barrier: Barrier, tier: NodeTierFile | None = None) -> None:  # fmt: skip
        self.slots = [region.carve((slots, *shape), dt) for shape, dt in keys]
        self.staging = [region.carve((max(stage_rows, 1), *shape), dt) for shape, dt in keys]
        self.barrier = barrier
        self.tier = tier
        self.barriers = 0  # figures: barriers waited at, and their seconds
        self.barrier_seconds = 0.0

    @staticmethod
    def region_parts(slots: int, stage_rows: int, keys: list[Key]) -> list[Key]:
        """What the region holds, in carving order (:meth:`NodeRegion.size_of`)."""
        return [((slots, *s), d) for s, d in keys] + [((max(stage_rows, 1), *s), d)
                                                      for s, d in keys]  # fmt: skip

    def wait(self, k: int, phase: int) -> None:
        """Wait for every local rank at step ``k``'s ``phase``."""
        t0 = time.perf_counter()
        self.barrier(k, phase)
        self.barrier_seconds += time.perf_counter() - t0
        self.barriers += 1

    def written(self) -> None:
        """This rank's tier writes on disk (another local rank may read them next)."""
        if self.tier is not None:
            self.tier.wait_writes()

    def stored(self, k: int) -> None:
        """Step ``k``'s updates by this rank done: its tier writes on disk, then every local
        rank's (before any hit of k + 1)."""
        self.written()
        self.wait(k, STORED)

    def close(self) -> None:
        """This rank is done with the host's buffer (a peer still waiting for it fails)."""
        close = getattr(self.barrier, "close", None)
        if close is not None:
            close()


class Alone:
    """A host of one rank: a private buffer (``staging`` of no rows: nothing shared), no
    barrier to wait at, tier hits read ahead with the storage reads (``reads_tier`` False) and
    tier writes that run on into later steps. What :class:`Host` answers, at no cost."""

    reads_tier = False
    barriers = 0
    barrier_seconds = 0.0

    def __init__(self, arrays: list[np.ndarray], tier: TierFile | None) -> None:
        self.staging = [a[:0] for a in arrays]
        self.tier = tier

    def wait(self, k: int, phase: int) -> None:
        """Nothing to wait for: no other rank shares the buffer."""

    def written(self) -> None:
        """Nothing to wait for: no other rank reads its tier (its writes run on)."""

    def stored(self, k: int) -> None:
        """Step ``k``'s updates applied: its tier writes may go on (held reads wait for them)."""
        if self.tier is not None:
            self.tier.done_writing(k)

    def close(self) -> None:
        """Nothing shared to leave."""


class Holdings:
    """A rank's RAM buffer and tier in one process, and the step they match: its own (a host
    of one rank: ``host`` an :class:`Alone`), or its share of its ``host``'s (a collective of
    the host's ranks every step, and at a refill). ``host`` is the one its ``refill`` has."""

    def __init__(self, buffer: SlotBuffer, tier: TierFile | None, steps: Steps,
                 refill: Refill, host: Host | Alone) -> None:  # fmt: skip
        self.buffer = buffer
        self.tier = tier
        self.steps = steps
        self.host = host
        self._refill = refill
        self._at = 0  # an empty buffer and tier are the plan's state before step 0

    @property
    def at(self) -> int:
        """The step whose start the buffer and tier match; -1: none until refilled."""
        return self._at

    def lose(self) -> None:
        """The buffer matches no step (a step is being assembled, or one failed)."""
        self._at = -1

    def refill(self, k: int) -> int:
        """Make the buffer and tier match step ``k``: read what later hits need (the tier's
        held reads must be dropped first). The bytes read."""
        cells, samples = self.steps.refill_at(k)
        self._at = -1  # until the refill succeeds, the buffer matches no step
        nbytes = self._refill.fill(k, cells, samples)
        self._at = k
        return nbytes

    def gather(self, step: StepPlan, into: list[np.ndarray]) -> None:
        """Copy step's RAM hits into batch rows ``into`` (per key); a host's tier hits are
        read too (no local rank updates a cell before the step's first host barrier)."""
        self.buffer.gather(step.hit_slots, into, step.hit_rows)
        if self.host.reads_tier and step.tier_rows.size:
            assert self.tier is not None
            futures = self.tier.submit_read(step.tier_slots, into, step.tier_rows)
            wait(futures)
            for f in futures:
                f.result()  # the first failure, if any (one line)

    def settle(self, k: int, step: StepPlan, batch: list[np.ndarray]) -> None:
        """Complete step ``k``'s ``batch`` (rows shared with the host's other ranks exchanged,
        repeats copied) and apply its buffer and tier updates, in the plan's order: the
        holdings then match step ``k + 1``."""
        host = self.host
        if step.stage_rows.size:  # rows read here that other local ranks need
            for stg, out in zip(host.staging, batch, strict=True):
                copy_rows(out, step.stage_rows, stg, step.stage_at)
        host.wait(k, STAGED)  # every local rank's hits gathered, its shared reads staged
        if step.peer_rows.size:  # rows another local rank read for this one
            for stg, out in zip(host.staging, batch, strict=True):
                copy_rows(stg, step.peer_at, out, step.peer_rows)
        if step.copy_dst.size:  # a sample drawn twice in the batch: read once, copied
            for rows in batch:
                copy_rows(rows, step.copy_src, rows, step.copy_dst)
        if step.phase_waits is not None:  # the buffer updates a cell twice: its phases in turn
            for n, waits in enumerate(step.phase_waits.tolist()):
                if waits:
                    host.written()
                    host.wait(k, UPDATED)  # another rank's updates of this phase's cells done
                self._update(_phase(step, n), batch)
        else:
            self._update(step, batch)
        host.stored(k)  # every store done (before any hit of k + 1), staging taken
        self._at = k + 1

    def _update(self, step: StepPlan, batch: list[np.ndarray]) -> None:
        buf, tier = self.buffer, self.tier
        if step.demote_slots.size:  # first: the stores below overwrite these slots
            assert tier is not None
            tier.submit_write(step.demote_tslots, buf.arrays, step.demote_slots)
        buf.store(batch, step.admit_rows, step.admit_slots)
        if step.tadmit_rows.size:
            assert tier is not None
            tier.submit_write(step.tadmit_tslots, batch, step.tadmit_rows)

    def reset(self, k: int) -> None:
        """Start the tier's run of steps at ``k`` (its held reads dropped: they would start
        only when steps that will not be served are)."""
        if self.tier is not None:
            self.tier.reset(k)

    def close(self) -> None:
        """Remove the tier file; leave the host's buffer."""
        if self.tier is not None:
            self.tier.close()
        self.host.close()


def _phase(step: StepPlan, n: int) -> StepPlan:
    """``step`` with only its updates of phase ``n``."""
    assert step.demote_phase is not None and step.admit_phase is not None
    assert step.tadmit_phase is not None
    d, a, t = step.demote_phase == n, step.admit_phase == n, step.tadmit_phase == n
    return step._replace(
        demote_slots=step.demote_slots[d], demote_tslots=step.demote_tslots[d],
        admit_rows=step.admit_rows[a], admit_slots=step.admit_slots[a],
        tadmit_rows=step.tadmit_rows[t], tadmit_tslots=step.tadmit_tslots[t],
    )  # fmt: skip


class RawRefill:
    """A refill of rows as stored: read into the buffer's slots, and through staging memory
    (``rows`` of a batch at a time) into the tier's. With a ``host``, of the host's buffer and
    tier: this local rank reads every ``per_host``-th row from its ``local`` index, between
    two host barriers (a collective of the host's ranks)."""

    def __init__(self, reader: Reader, buffer: SlotBuffer, tier: TierFile | None,
                 keys: tuple[KeyInfo, ...], rows: int, host: Host | Alone,
                 local: int = 0, per_host: int = 1) -> None:  # fmt: skip
        self.reader = reader
        self.buffer = buffer
        self.tier = tier
        self.keys = keys
        self.rows = max(1, rows)
        self.host = host
        self.local, self.per_host = local, per_host

    def fill(self, k: int, cells: np.ndarray, samples: np.ndarray) -> int:
        self.host.wait(k, REFILL)  # no local rank still gathers hits from the slots overwritten
        mine = slice(self.local, None, self.per_host)
        nbytes = self._fill(cells[mine], samples[mine])
        self.host.wait(k, REFILLED)  # the buffer and tier whole before any rank's first hit
        return nbytes

    def _fill(self, cells: np.ndarray, samples: np.ndarray) -> int:
        buf, tier = self.buffer, self.tier
        ram = cells < buf.capacity
        if not np.all(ram) and tier is None:
            raise SolarError("buffer: a refill names a tier cell, and there is no tier")
        nbytes = self.reader.read(samples[ram], buf.arrays, cells[ram]) if np.any(ram) else 0
        if tier is None or np.all(ram):
            return nbytes
        tslots, samples = cells[~ram] - buf.capacity, samples[~ram]
        staging = [np.empty((self.rows, *k.sample_shape), k.native_dtype) for k in self.keys]
        for lo in range(0, samples.size, self.rows):
            part = slice(lo, lo + self.rows)
            rows = np.arange(samples[part].size)
            nbytes += self.reader.read(samples[part], staging, rows)
            tier.submit_write(tslots[part], staging, rows)  # copied before it returns
        tier.wait_writes()
        return nbytes

"""The holdings stage: the RAM slot buffer and the tier, and the step they match.

:class:`Holdings` is the sole owner of ``at``, the step whose start the buffer and tier match
(-1: none, until a refill). It gathers a step's hits into a batch and applies the step's
updates (the plan's admissions, demotions and tier writes; overwriting a slot is the eviction,
decided by the planner: for the ``solar`` policy Belady in solar/schedule/belady.py).
After a resume or a jump it refills itself to a step through the :class:`Refill` it was built
with: :class:`RawRefill` (rows as stored) or, where a deterministic transform's rows are held,
the transform stage's (solar.runtime.transforms).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from solar.cache.slots import SlotBuffer, copy_rows
from solar.cache.tier import TierFile
from solar.io.info import KeyInfo
from solar.io.reader import Reader
from solar.runtime.steps import Steps
from solar.schedule import ADMIT, DEMOTE
from solar.schedule.rankplan import StepPlan


class Refill(Protocol):
    """Fills buffer and tier cells with samples (a refill to a step)."""

    def fill(self, k: int, cells: np.ndarray, samples: np.ndarray) -> int:
        """Read ``samples`` into ``cells`` (buffer slots, then tier slots past the buffer's
        capacity) for a start at step ``k``; the bytes read from storage."""
        ...


class Holdings:
    """A rank's RAM buffer and tier in one process, and the step they match."""

    def __init__(
        self, buffer: SlotBuffer, tier: TierFile | None, steps: Steps, refill: Refill
    ) -> None:
        self.buffer = buffer
        self.tier = tier
        self.steps = steps
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
        """Copy step's RAM hits into batch rows ``into`` (per key)."""
        self.buffer.gather(step.hit_slots, into, step.hit_rows)

    def settle(self, k: int, step: StepPlan, batch: list[np.ndarray]) -> None:
        """Complete step ``k``'s ``batch`` (repeats copied) and apply its buffer and tier
        updates, in the plan's order: the holdings then match step ``k + 1``."""
        if step.copy_dst.size:  # a sample drawn twice in the batch: read once, copied
            for rows in batch:
                copy_rows(rows, step.copy_src, rows, step.copy_dst)
        if step.in_order:
            self._update_in_order(k, step, batch)
        else:
            self._update(step, batch)
        if self.tier is not None:
            self.tier.done_writing(k)
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

    def _update_in_order(self, k: int, step: StepPlan, batch: list[np.ndarray]) -> None:
        """A slot updated twice in the step (rare): one update at a time, in access order."""
        assert self.tier is not None
        for flag, src, dst in self.steps.actions(k):
            if flag != DEMOTE:  # src is an access of the step: its batch row
                src = step.row(src)
            one_src, one_dst = np.array([src]), np.array([dst])
            if flag == ADMIT:
                self.buffer.store(batch, one_src, one_dst)
            else:
                self.tier.submit_write(one_dst, self.buffer.arrays if flag == DEMOTE else batch,
                                       one_src)  # fmt: skip

    def reset(self, k: int) -> None:
        """Start the tier's run of steps at ``k`` (its held reads dropped: they would start
        only when steps that will not be served are)."""
        if self.tier is not None:
            self.tier.reset(k)

    def close(self) -> None:
        """Remove the tier file."""
        if self.tier is not None:
            self.tier.close()


class RawRefill:
    """A refill of rows as stored: read into the buffer's slots, and through staging memory
    (a batch's worth at a time) into the tier's."""

    def __init__(self, reader: Reader, buffer: SlotBuffer, tier: TierFile | None,
                 keys: tuple[KeyInfo, ...], rows: int) -> None:  # fmt: skip
        self.reader = reader
        self.buffer = buffer
        self.tier = tier
        self.keys = keys
        self.rows = max(1, rows)

    def fill(self, k: int, cells: np.ndarray, samples: np.ndarray) -> int:
        buf, tier = self.buffer, self.tier
        ram = cells < buf.capacity
        nbytes = self.reader.read(samples[ram], buf.arrays, cells[ram])
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

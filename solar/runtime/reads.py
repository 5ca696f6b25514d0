"""The read stage: a step's storage and tier reads, started ahead into its batch memory.

:class:`Reads` starts one step's reads (the executor reads the bytes: solar/io/executor.py);
:class:`ReadAhead` keeps the next ``depth`` steps' reads under way and, once the consumer
takes a step, waits for its reads and writes their figures. A step's reads land in its own
batch memory, never in the slot buffer: the buffer is written only by the holdings stage, on
the consuming thread, in step order, so no read in flight races a store.
"""

from __future__ import annotations

import collections
import time
from concurrent.futures import Future, wait

import numpy as np

from solar.cache.tier import TierFile
from solar.io.executor import combine, step_io
from solar.io.reader import Reader
from solar.runtime.memory import BatchMemory, InFlight, ReadFigures
from solar.runtime.packing import Misses, RandomMisses
from solar.runtime.steps import Steps
from solar.schedule.plans.rankplan import StepPlan


class Reads:
    """Starts a step's reads: from storage into its raw rows, from the tier into the rows
    it holds (raw, or transformed where a deterministic transform's rows are held)."""

    def __init__(
        self,
        steps: Steps,
        reader: Reader,
        memory: BatchMemory,
        tier: TierFile | None,
        tier_into_out: bool,
        misses: Misses | None = None,
    ) -> None:
        self.steps = steps
        self.reader = reader
        # Where the storage reads come from: the source's pages, or packed windows
        # (solar/runtime/packing.py), decided at construction.
        self.misses: Misses = RandomMisses(reader) if misses is None else misses
        self.memory = memory
        self.tier = tier
        self.tier_into_out = tier_into_out

    def start(self, k: int) -> InFlight:
        """Start step ``k``'s storage and tier reads, straight into its batch memory."""
        step = self.steps.plan(k)
        io = InFlight(step)
        # Only reads need their batch ahead of time; a step of hits takes memory when it is
        # assembled, so that recently freed (cache-warm) batch memory is reused.
        reads, read_rows = step.storage_reads()  # the batch's reads, then its side rows
        if reads.size or step.tier_rows.size:
            self.memory.provide(io, *self.steps.rows(k, step))
            if reads.size:
                io.futures = self.misses.submit(k, reads, io.batch, read_rows)
            io.storage = len(io.futures)
            # (Without a tier here, a node's: its holdings read its hits at the step.)
            if step.tier_rows.size and self.tier is not None:
                assert io.out is not None or not self.tier_into_out
                into = io.out[1] if io.out is not None and self.tier_into_out else io.batch
                try:
                    io.futures += self.tier.read_step(k, step.tier_slots, into, step.tier_rows)
                except BaseException:
                    wait(io.futures)  # no read may still write into memory handed back
                    raise
        if self.tier is not None:  # after this step's reads: they see the slots as it starts
            self.tier.expect_writes(k, step.tier_writes)
        return io

    def start_first(self) -> InFlight | None:
        """The run's first step's storage reads, started before its plan is made: where the
        sampler draws each rank's batch and nothing is held, every row is read whatever the
        plan keeps. :meth:`confirm` checks the plan once it is there."""
        ids = self.steps.first_batch()
        if ids.size == 0:
            return None
        rows = np.arange(ids.size, dtype=np.int64)
        none = np.zeros(0, np.int64)
        plan = StepPlan(0, ids, read_rows=rows, hit_rows=none, hit_slots=none, admit_rows=none,
                        admit_slots=none)  # fmt: skip
        io = InFlight(plan, provisional=True)
        self.memory.provide(io, ids.size, ids.size)  # (no side rows at the first step)
        io.futures = self.reader.submit(ids, io.batch, rows)
        io.storage = len(io.futures)
        return io

    def confirm(self, k: int, io: InFlight) -> InFlight:
        """Step ``k`` read ahead of its plan (:meth:`start_first`), now with its plan: its
        side rows read too, or, should the plan read other rows (never, for a valid plan),
        read again as planned."""
        try:
            step = self.steps.plan(k)
        except BaseException:
            wait(io.futures)  # none may write into memory handed back
            raise
        if (step.hit_rows.size or step.tier_rows.size or step.rows_needed > len(io.batch[0])
                or not np.array_equal(step.samples, io.plan.samples)):  # fmt: skip
            wait(io.futures)  # none may write into memory handed back
            return self.start(k)
        if step.side_samples.size:
            sides = np.arange(step.size, step.rows_needed, dtype=np.int64)
            io.futures += self.reader.submit(step.side_samples, io.batch, sides)
            io.storage = len(io.futures)
        io.plan, io.provisional = step, False
        return io


class ReadAhead:
    """Keeps the reads of the next ``depth`` steps under way.

    Invariant: the queue holds consecutive steps, the first being the next one served. A
    step queued before its plan was made (``provisional``) is confirmed against it when
    taken, before any later step starts: their reads queue behind its own.
    """

    def __init__(self, reads: Reads, depth: int, first_ahead: bool = False) -> None:
        self.reads = reads
        self._depth = depth
        # The first step read before its plan (a sampler that splits its own batches, no
        # tier): decided here, once.
        self._first_ahead = first_ahead
        self._queue: collections.deque[InFlight] = collections.deque()
        self._landed = 0  # at the last take: steps queued after it whose reads had all ended

    @property
    def depth(self) -> int:
        """Steps read ahead of the one taken."""
        return self._depth

    @depth.setter
    def depth(self, steps: int) -> None:
        """From the next take on (steps already started stay queued: a shallower queue
        drains to its depth as they are taken)."""
        if steps < 0:
            raise ValueError(f"read-ahead depth must be >= 0, got {steps}")
        self._depth = steps

    def start_first(self) -> None:
        """Start the run's first step's reads before its plan, where that is this run's mode
        and nothing is queued or planned yet (the caller knows nothing is held)."""
        if not self._first_ahead or self._queue or self.reads.steps.planned_any:
            return
        io = self.reads.start_first()
        if io is not None:
            self._queue.append(io)

    def take(self, k: int, last: int) -> InFlight:
        """Step ``k``'s reads (started now if they were not), after starting those up to
        ``min(k + depth, last)``."""
        if not self._queue or self._queue[0].plan.step != k:
            self.drain()
            self._queue.append(self.reads.start(k))
        if self._queue[0].provisional:
            self._queue[0] = self.reads.confirm(k, self._queue[0])
        # Counted before starting more: the queue's occupancy as the consumer arrives.
        ahead = list(self._queue)[1 : 1 + self._depth]
        self._landed = sum(all(f.done() for f in io.futures) for io in ahead)
        while self._queue[-1].plan.step < min(k + self._depth, last):
            self._queue.append(self.reads.start(self._queue[-1].plan.step + 1))
        return self._queue.popleft()

    def finish(self, io: InFlight) -> None:
        """Wait for ``io``'s reads (all of them, even if one failed: none writes into its
        batch after) and write their figures. A step of hits costs no waiting at all."""
        if not io.futures:
            io.read = ReadFigures(read_ahead=self._depth, ready_ahead=self._landed)
            return
        t0 = time.perf_counter()
        wait(io.futures)
        stall = time.perf_counter() - t0
        got = step_io(io.futures[: io.storage])
        tier_bytes, tier_busy = combine(io.futures[io.storage :])
        # The tier's reads run on the reader threads too: their time is the read stage's.
        io.read = ReadFigures(got.nbytes, got.busy + tier_busy, stall, tier_bytes, got.decode,
                              got.longest, self._depth, self._landed)  # fmt: skip

    def pending(self, k: int) -> list[Future]:
        """Step ``k``'s reads not yet done, if it is next (else none)."""
        if not self._queue or self._queue[0].plan.step != k:
            return []
        return [f for f in self._queue[0].futures if not f.done()]

    def ready(self, k: int) -> bool:
        """Whether step ``k`` is next and its reads are all done, none failed."""
        if not self._queue or self._queue[0].plan.step != k:
            return False
        futures = self._queue[0].futures
        return all(f.done() and not f.cancelled() and f.exception() is None for f in futures)

    def wait(self) -> None:
        """Wait for every read under way, keeping them queued (a benchmark's epoch ends when
        its reads, also those read ahead into the next epoch, have)."""
        wait([f for io in self._queue for f in io.futures])

    def drain(self) -> None:
        """Wait for every read under way (results discarded, cancelled ones skipped), then
        forget them."""
        wait([f for io in self._queue for f in io.futures])
        self._queue.clear()

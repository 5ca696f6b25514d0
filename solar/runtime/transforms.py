"""The transform stage: scheduling a step's per-sample transforms on the workers.

Two assemblies, chosen at construction (solar.runtime.pipeline):

* :class:`TransformAssembly`: the buffer holds raw rows. A step is settled as soon as its
  reads are in, then every row is transformed into the delivered batch.
* :class:`HeldTransformAssembly`: a deterministic transform whose rows the buffer holds.
  Hits are gathered transformed, straight into the delivered batch; only storage reads are
  transformed, and the step is settled (its admissions stored) once they are.

Both assemble the next steps whose reads are done while a step's transforms run, so that the
workers (solar.runtime.workers: threads or processes) never idle while the trainer computes.
"""

from __future__ import annotations

import collections
import time
from concurrent.futures import FIRST_COMPLETED, wait
from typing import Any

import numpy as np

from solar.cache.slots import SlotBuffer
from solar.cache.tier import TierFile
from solar.dist import abort_job_on_error
from solar.io.info import KeyInfo
from solar.io.reader import Reader
from solar.runtime.assembly import Assembly
from solar.runtime.holdings import Holdings
from solar.runtime.memory import BatchMemory, InFlight, TransformFigures
from solar.runtime.reads import ReadAhead
from solar.runtime.steps import Steps
from solar.runtime.workers import TransformPool
from solar.transform import Rows


class TransformAssembly(Assembly):
    """Raw rows held: settle, then transform every row of the batch."""

    def __init__(self, steps: Steps, queue: ReadAhead, memory: BatchMemory, holdings: Holdings,
                 pool: TransformPool, ahead: int, comm: Any) -> None:  # fmt: skip
        super().__init__(steps, queue, memory, holdings)
        self.pool = pool
        self.ahead = ahead  # steps assembled ahead of the one served
        self.comm = comm  # a failed transform ends the job
        self.ready: collections.deque[InFlight] = collections.deque()

    def next_step(self) -> int:
        return self.ready[0].plan.step if self.ready else self.holdings.at

    def take(self, k: int) -> InFlight:
        io = self.ready.popleft() if self.ready else self.assemble(k)
        self.assemble_ahead()
        return io

    def shape(self, k: int, io: InFlight) -> None:
        super().shape(k, io)
        self.start(k, io, np.arange(io.plan.size))

    def start(self, k: int, io: InFlight, rows: np.ndarray) -> None:
        """Start transforming ``rows`` of step ``k`` (raw, ``io.batch``) into the same rows
        of the delivered batch."""
        assert io.out is not None
        io.transforms = self.pool.submit(
            io.batch, io.out[1], self.steps.transform_job(k, io.plan, rows)
        )
        io.shaped = TransformFigures(
            transformed=int(rows.size), transform_workers=self.pool.workers
        )

    def assemble_ahead(self) -> None:
        """Assemble the next steps whose reads are done, so that their transforms run while
        the trainer computes on this one."""
        last = self.steps.last_planned
        while len(self.ready) < self.ahead and 0 <= self.holdings.at <= last:
            if not self.queue.ready(self.holdings.at):
                return  # its reads are late: it is assembled when it is asked for
            try:
                self.ready.append(self.assemble(self.holdings.at))
            except Exception:
                # Left unassembled: the buffer matches no step until refilled, and the step
                # fails (or not) in its own turn.
                self.holdings.lose()
                return

    def finish(self, k: int, io: InFlight) -> None:
        """Wait for step ``k``'s transforms, assembling the next steps as their reads land,
        so that their transforms queue behind these and the workers never idle."""
        t0 = time.perf_counter()
        io.transforms = self.pool.due(k, io.transforms)  # (a worker's step: here if late)
        try:
            while running := [f for f in io.transforms if not f.done()]:
                more = len(self.ready) < self.ahead
                landing = self.queue.pending(self.holdings.at) if more else []
                wait([*running, *landing], return_when=FIRST_COMPLETED)
                self.assemble_ahead()
        except BaseException:
            wait(io.transforms)  # (an interrupt) none may write into memory handed back
            raise
        waited = time.perf_counter() - t0
        with abort_job_on_error(self.comm):  # a user's transform failed: the job ends
            busy = sum(f.result() for f in io.transforms)  # the first failure, if any
        io.shaped = io.shaped._replace(transform_seconds=busy, waited=waited)

    def wait(self) -> None:
        wait([f for io in self.ready for f in io.transforms])

    def drain(self) -> None:
        self.pool.forget()  # (steps a worker was to deliver: not waited for)
        self.wait()
        self.ready.clear()


class HeldTransformAssembly(TransformAssembly):
    """A deterministic transform's rows held: hits gathered transformed, storage reads
    transformed, the step settled once they are."""

    def shape(self, k: int, io: InFlight) -> None:
        assert io.out is not None
        self.holdings.gather(io.plan, io.out[1])
        self.start(k, io, io.plan.read_rows)

    def finish(self, k: int, io: InFlight) -> None:
        super().finish(k, io)
        assert io.out is not None
        self.holdings.settle(k, io.plan, io.out[1])  # admitted once transformed
        self.assemble_ahead()


class TransformedRefill:
    """A refill of a deterministic transform's held rows: read from storage, transformed,
    stored in the buffer (or tier) cells, a batch's worth at a time."""

    def __init__(self, reader: Reader, pool: TransformPool, buffer: SlotBuffer,
                 tier: TierFile | None, steps: Steps, keys: tuple[KeyInfo, ...],
                 out_keys: tuple[KeyInfo, ...], rows: int) -> None:  # fmt: skip
        self.reader, self.pool, self.steps = reader, pool, steps
        self.buffer, self.tier = buffer, tier
        self.keys, self.out_keys = keys, out_keys
        self.rows = max(1, rows)

    def fill(self, k: int, cells: np.ndarray, samples: np.ndarray) -> int:
        n, buf, nbytes = self.rows, self.buffer, 0
        raw, out = (self.pool.staging(keys, n) for keys in (self.keys, self.out_keys))
        e, t = divmod(k, self.steps.spe)
        for lo in range(0, samples.size, n):
            ids, dst = samples[lo : lo + n], cells[lo : lo + n]
            rows = np.arange(ids.size)
            nbytes += self.reader.read(ids, raw, rows)
            futures = self.pool.submit(raw, out, Rows(e, t, ids, np.zeros_like(ids), rows))
            wait(futures)
            for f in futures:
                f.result()  # the first failure, if any
            ram = dst < buf.capacity
            buf.store(out, rows[ram], dst[ram])
            if not np.all(ram):
                assert self.tier is not None
                self.tier.submit_write(dst[~ram] - buf.capacity, out, rows[~ram])
                self.tier.wait_writes()  # before ``out`` is overwritten
        return nbytes

"""The node buffer at run time: one rank's share of a node plan (solar/schedule/nodeplan.py).

The host's RAM buffer is one shared region (solar/host/region.py) that every local rank maps;
so is a staging area where a row read for several local ranks is put by its reader for the
others; the host's tier, if any, is one file they all opened (solar/cache/nodetier.py). Per
step ``k`` a rank:

1. gathers its hits from the node's slots and reads its tier hits from the node's tier (both
   as they stand at the step's start), its own misses from storage into its batch rows;
2. puts its reads that other local ranks need into the staging area;
3. waits at the host's barrier (every local rank has done 1-2: no slot or tier slot is read
   for step k after it);
4. copies its ``PEER`` rows from the staging area, then applies the updates the plan gives
   it (only a row's reader stores it): demotions, admissions, tier admissions, its tier
   writes waited for; where the host updates a cell twice in the step, in the plan's
   phases, with a barrier before those that update a cell another rank updated since the
   last one (solar/schedule/nodeplan.py ``host_phases``);
5. waits at the host's barrier (every store and tier write of step k is done before any hit
   of step k + 1, and every staging row is taken before it is overwritten).

No lock: the plan orders every write before the reads that depend on it. The barrier is the
region's own (solar/host/barrier.py), each wait labelled with its step and phase: a rank
that runs other steps than its host's (it left an epoch early, or seeked alone) fails the
barrier in one line instead of matching a peer's other step.

:class:`SharedHoldings` is the Loader's holdings stage with ``share="node"``: reads land in
batch memory ahead (solar.runtime.reads), :meth:`SharedHoldings.gather` is step 1's hits and
:meth:`SharedHoldings.settle` steps 2-5.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import wait
from typing import Any

import numpy as np

from solar.cache.nodetier import NodeTierFile
from solar.cache.slots import SlotBuffer, copy_rows
from solar.errors import SolarError
from solar.host.barrier import REFILL, REFILLED, STAGED, STORED, UPDATED
from solar.host.region import NodeRegion
from solar.io.info import KeyInfo
from solar.io.reader import Reader
from solar.runtime.holdings import Holdings
from solar.runtime.steps import Steps
from solar.schedule.rankplan import StepPlan

Key = tuple[tuple[int, ...], Any]  # a key's sample shape and dtype
Read = Callable[[np.ndarray, list[np.ndarray], np.ndarray], int]  # Reader.read's signature
Barrier = Callable[[int, int], None]  # waits for the host's ranks at (step, phase)


class NodeHoldings:
    """One rank's view of its host's shared buffer, staging area and tier (see the module's
    docstring). ``region`` must have room for :meth:`region_parts`; ``barrier(k, phase)``
    waits for every local rank at step ``k``'s ``phase`` (the region's
    :class:`~solar.host.barrier.HostBarrier`); ``tier``: the node's tier file, or None."""

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

    def _wait(self, k: int, phase: int) -> None:
        t0 = time.perf_counter()
        self.barrier(k, phase)
        self.barrier_seconds += time.perf_counter() - t0
        self.barriers += 1

    def close(self) -> None:
        """This rank is done with the host's buffer (a peer still waiting for it fails)."""
        close = getattr(self.barrier, "close", None)
        if close is not None:
            close()

    def refill(self, cells: np.ndarray, samples: np.ndarray, local: int, per_host: int,
               read: Read, rows: int, k: int = 0) -> int:  # fmt: skip
        """Resume at step ``k``: fill the node's ``cells`` (RAM slots, then tier slots past
        them) with ``samples`` (:meth:`~solar.schedule.nodestream.NodeWindow.refill_at`), this
        local rank reading every ``per_host``-th from its ``local`` index, tier rows through staging
        memory ``rows`` at a time; a collective of the host's ranks. The bytes read."""
        mine = slice(local, None, per_host)
        cells, samples = cells[mine], samples[mine]
        capacity = self.slots[0].shape[0]
        ram = cells < capacity
        if not np.all(ram) and self.tier is None:
            raise SolarError("node buffer: a refill names a tier cell, and the node has no tier")
        nbytes = read(samples[ram], self.slots, cells[ram]) if np.any(ram) else 0
        if self.tier is not None and not np.all(ram):
            tslots, samples = cells[~ram] - capacity, samples[~ram]
            staging = [np.empty((rows, *b.shape[1:]), b.dtype) for b in self.slots]
            for lo in range(0, samples.size, rows):
                part = slice(lo, lo + rows)
                at = np.arange(samples[part].size)
                nbytes += read(samples[part], staging, at)
                self.tier.submit_write(tslots[part], staging, at)  # copied before it returns
            self.tier.wait_writes()
        self._wait(k, REFILLED)  # the buffer and tier are whole before any rank's first hit
        return nbytes


class SharedHoldings(Holdings):
    """A rank's holdings in a node buffer: hits gathered from the host's shared slots (as
    :class:`Holdings`) and tier hits read from its shared tier, then at :meth:`settle` the
    step's rows exchanged through the staging rows between two host barriers and its updates
    applied (a collective of the host's ranks every step, and at a refill)."""

    def __init__(self, node: NodeHoldings, keys: tuple[KeyInfo, ...], steps: Steps,
                 refill: NodeRefill) -> None:  # fmt: skip
        super().__init__(SlotBuffer.over(node.slots, keys), node.tier, steps, refill)
        self.node = node

    def gather(self, step: StepPlan, into: list[np.ndarray]) -> None:
        """Copy the step's RAM hits, and read its tier hits, into batch rows ``into``: the
        node's cells as the step starts (no rank updates them before the step's first host
        barrier)."""
        super().gather(step, into)
        if step.tier_rows.size:
            assert self.tier is not None
            futures = self.tier.submit_read(step.tier_slots, into, step.tier_rows)
            wait(futures)
            for f in futures:
                f.result()  # the first failure, if any (one line)

    def settle(self, k: int, step: StepPlan, batch: list[np.ndarray]) -> None:
        node = self.node
        for stg, out in zip(node.staging, batch, strict=True):
            copy_rows(out, step.stage_rows, stg, step.stage_at)
        node._wait(k, STAGED)  # every local rank's hits gathered and its shared reads staged
        for stg, out in zip(node.staging, batch, strict=True):
            copy_rows(stg, step.peer_at, out, step.peer_rows)
        if step.copy_dst.size:  # a sample drawn twice in the batch: once in, then copied
            for rows in batch:
                copy_rows(rows, step.copy_src, rows, step.copy_dst)
        if step.phase_waits is None:
            self._update(step, batch)
        else:  # the host updates a cell twice: its phases in turn
            for n, waits in enumerate(step.phase_waits.tolist()):
                if waits:
                    self._written()
                    node._wait(k, UPDATED)  # another rank's updates of this phase's cells done
                self._update(_phase(step, n), batch)
        self._written()
        node._wait(k, STORED)  # every store done (before any hit of k + 1), every staged row taken
        self._at = k + 1

    def close(self) -> None:
        super().close()
        self.node.close()

    def _written(self) -> None:
        """This rank's tier writes on disk (another rank may read them next)."""
        if self.tier is not None:
            self.tier.wait_writes()


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


class NodeRefill:
    """A refill of the host's buffer and tier: this local rank reads every ``per_host``-th
    row of it from its ``local`` index (a collective of the host's ranks); tier rows go
    through staging memory ``rows`` at a time."""

    def __init__(self, node: NodeHoldings, reader: Reader, local: int, per_host: int,
                 rows: int) -> None:  # fmt: skip
        self.node, self.reader, self.local, self.per_host = node, reader, local, per_host
        self.rows = max(1, rows)

    def fill(self, k: int, cells: np.ndarray, samples: np.ndarray) -> int:
        self.node._wait(k, REFILL)  # no local rank still gathers hits from the slots overwritten
        return self.node.refill(cells, samples, self.local, self.per_host, self.reader.read,
                                self.rows, k)  # fmt: skip

"""The node buffer at run time: one rank's share of a node plan (solar/schedule/nodeplan.py).

The host's RAM buffer is one shared region (solar/cache/shared.py) that every local rank maps;
so is a staging area where a row read for several local ranks is put by its reader for the
others. Per step ``k`` a rank:

1. gathers its hits from the node's slots (as they stand at the step's start) and reads its
   own misses from storage into its batch rows;
2. puts its reads that other local ranks need into the staging area;
3. waits at the host's barrier (every local rank has done 1-2);
4. copies its ``PEER`` rows from the staging area, stores the admissions it read into the
   node's slots (only a row's reader stores it);
5. waits at the host's barrier (every store of step k is done before any hit of step k + 1,
   and every staging row is taken before it is overwritten).

No lock: the plan orders every write before the reads that depend on it, the barriers are the
ranks' own collectives. RAM buffer only (a node tier is not run yet). The barrier is the
region's own (solar/cache/hostbarrier.py), each wait labelled with its step and phase: a rank
that runs other steps than its host's (it left an epoch early, or seeked alone) fails the
barrier in one line instead of matching a peer's other step.

:class:`NodeHoldings` runs a :class:`NodeStep` alone (bench/node_runtime.py, tests);
:class:`SharedHoldings` is the Loader's holdings stage with ``share="node"``: the same steps
1-5 inside the pipeline, where reads land in batch memory ahead (solar.runtime.reads),
:meth:`~solar.runtime.holdings.Holdings.gather` is step 1's hits and :meth:`SharedHoldings.settle`
steps 2-5.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from solar.cache.hostbarrier import REFILL, REFILLED, STAGED, STORED
from solar.cache.shared import NodeRegion
from solar.cache.slots import SlotBuffer, copy_rows
from solar.errors import SolarError
from solar.io.info import KeyInfo
from solar.io.reader import Reader
from solar.runtime.holdings import Holdings
from solar.runtime.steps import Steps
from solar.schedule import ADMIT, HIT, PEER, SIDE, THIT
from solar.schedule.nodeplan import Hosts, NodeEpoch
from solar.schedule.rankplan import RankPlan, StepPlan

Key = tuple[tuple[int, ...], Any]  # a key's sample shape and dtype
Read = Callable[[np.ndarray, list[np.ndarray], np.ndarray], int]  # Reader.read's signature
Barrier = Callable[[int, int], None]  # waits for the host's ranks at (step, phase)


@dataclass(frozen=True)
class NodeStep:
    """What rank r does at one step of a node plan (rows index its batch, then side rows)."""

    samples: np.ndarray  # (size,) served, in the rank's access order
    read_rows: np.ndarray  # rows read from storage by this rank (batch and side rows)
    read_samples: np.ndarray
    hit_rows: np.ndarray
    hit_slots: np.ndarray
    admit_rows: np.ndarray
    admit_slots: np.ndarray
    stage_rows: np.ndarray  # rows this rank puts into the staging area ...
    stage_at: np.ndarray  # ... at these staging rows
    peer_rows: np.ndarray  # rows this rank takes from the staging area ...
    peer_at: np.ndarray  # ... from these staging rows
    rows_needed: int


def node_steps(ne: NodeEpoch, rank: int) -> list[NodeStep]:
    """Rank ``rank``'s steps of one node epoch (every rank can compute every rank's)."""
    hosts = ne.hosts
    group = hosts.groups[hosts.host_of(rank)]
    ranks = ne.ranks
    out = []
    for t in range(ranks.step_offsets.shape[1] - 1):
        # Staging rows of the step: the host accesses some local rank takes as a PEER row.
        peer_at = []
        for q in group:
            lo = ranks.rank_offsets[q]
            a, b = lo + ranks.step_offsets[q, t], lo + ranks.step_offsets[q, t + 1]
            peer_at.append(ne.at[a:b][(ranks.flags[a:b] & PEER) != 0])
        shared = np.unique(np.concatenate(peer_at)) if peer_at else np.zeros(0, np.int64)
        lo = ranks.rank_offsets[rank]
        a, b = lo + ranks.step_offsets[rank, t], lo + ranks.step_offsets[rank, t + 1]
        f, x, at = ranks.flags[a:b], ranks.sample[a:b].astype(np.int64), ne.at[a:b]
        side = (f & SIDE) != 0
        hit = (f & HIT) != 0
        if np.any(f & THIT):
            raise SolarError("node buffer: a node tier is not run yet")
        peer = (f & PEER) != 0
        own = ~(hit | peer)
        rows = np.arange(b - a, dtype=np.int64)
        admit = (f & ADMIT) != 0
        stage = own & np.isin(at, shared)
        out.append(NodeStep(
            x[~side], rows[own], x[own], rows[hit], ranks.slot[a:b][hit].astype(np.int64),
            rows[admit], ranks.slot[a:b][admit].astype(np.int64),
            rows[stage], np.searchsorted(shared, at[stage]),
            rows[peer], np.searchsorted(shared, at[peer]), int(b - a),
        ))  # fmt: skip
    return out


class NodeHoldings:
    """One rank's view of its host's shared buffer and staging area (see the module's
    docstring). ``region`` must have room for :meth:`region_parts`; ``barrier(k, phase)``
    waits for every local rank at step ``k``'s ``phase`` (the region's
    :class:`~solar.cache.hostbarrier.HostBarrier`, or a communicator's barrier)."""

    def __init__(self, region: NodeRegion, slots: int, stage_rows: int, keys: list[Key],
                 barrier: Barrier) -> None:  # fmt: skip
        self.slots = [region.carve((slots, *shape), dt) for shape, dt in keys]
        self.staging = [region.carve((max(stage_rows, 1), *shape), dt) for shape, dt in keys]
        self.barrier = barrier
        self.barriers = 0  # figures: barriers waited at, and their seconds
        self.barrier_seconds = 0.0
        self._served = 0  # the steps :meth:`serve` ran (its barriers' labels)

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
               read: Read, k: int = 0) -> int:  # fmt: skip
        """Resume at step ``k``: fill the node's ``cells`` with ``samples``
        (:func:`host_refill_at`), this local rank reading every ``per_host``-th from its
        ``local`` index; a collective of the host's ranks. The bytes read."""
        mine = slice(local, None, per_host)
        if np.any(cells >= self.slots[0].shape[0]):
            raise SolarError("node buffer: a refill names a tier cell (a node tier is not run)")
        nbytes = read(samples[mine], self.slots, cells[mine]) if samples[mine].size else 0
        self._wait(k, REFILLED)  # the buffer is whole before any rank's first hit
        self._served = k
        return nbytes

    def serve(self, step: NodeStep, batch: list[np.ndarray], read: Read) -> int:
        """Run one step into ``batch`` (per key, at least ``step.rows_needed`` rows); the
        bytes read from storage. A collective of the host's ranks."""
        k = self._served
        self._served += 1
        for buf, out in zip(self.slots, batch, strict=True):
            copy_rows(buf, step.hit_slots, out, step.hit_rows)
        nbytes = read(step.read_samples, batch, step.read_rows) if step.read_rows.size else 0
        for stg, out in zip(self.staging, batch, strict=True):
            copy_rows(out, step.stage_rows, stg, step.stage_at)
        self._wait(k, STAGED)  # every hit gathered, every staging row put
        for stg, out in zip(self.staging, batch, strict=True):
            copy_rows(stg, step.peer_at, out, step.peer_rows)
        for buf, out in zip(self.slots, batch, strict=True):
            copy_rows(out, step.admit_rows, buf, step.admit_slots)
        self._wait(k, STORED)  # every store done, every staging row taken
        return nbytes


class SharedHoldings(Holdings):
    """A rank's holdings in a node buffer: hits gathered from the host's shared slots (as
    :class:`Holdings`), then at :meth:`settle` the step's rows exchanged through the staging
    rows between two host barriers and its admissions stored (a collective of the host's ranks
    every step, and at a refill)."""

    def __init__(self, node: NodeHoldings, keys: tuple[KeyInfo, ...], steps: Steps,
                 refill: NodeRefill) -> None:  # fmt: skip
        super().__init__(SlotBuffer.over(node.slots, keys), None, steps, refill)
        self.node = node

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
        self.buffer.store(batch, step.admit_rows, step.admit_slots)
        node._wait(k, STORED)  # every store done (before any hit of k + 1), every staged row taken
        self._at = k + 1

    def close(self) -> None:
        super().close()
        self.node.close()


class NodeRefill:
    """A refill of the host's buffer: this local rank reads every ``per_host``-th row of it
    from its ``local`` index (a collective of the host's ranks)."""

    def __init__(self, node: NodeHoldings, reader: Reader, local: int, per_host: int) -> None:
        self.node, self.reader, self.local, self.per_host = node, reader, local, per_host

    def fill(self, k: int, cells: np.ndarray, samples: np.ndarray) -> int:
        self.node._wait(k, REFILL)  # no local rank still gathers hits from the slots overwritten
        return self.node.refill(cells, samples, self.local, self.per_host, self.reader.read, k)


def host_refill_at(
    epochs: list[NodeEpoch], host: int, k: int, slots: int, tier_slots: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """``(cells, samples)`` host ``host``'s buffer must hold to start at global step ``k`` of
    the run whose node plan ``epochs`` are (from epoch 0): a replay of the host's plan."""
    parts = [ne.host.rank(host) for ne in epochs]
    plan = RankPlan.from_parts(host, parts, slots, tier_slots=tier_slots)
    return plan.refill_at(k)


def stage_rows_needed(epochs: list[NodeEpoch], hosts: Hosts) -> int:
    """The most staging rows any host needs at any step of ``epochs``."""
    most = 0
    for ne in epochs:
        for group in hosts.groups:
            for t in range(ne.ranks.step_offsets.shape[1] - 1):
                ats = []
                for q in group:
                    lo = ne.ranks.rank_offsets[q]
                    a = lo + ne.ranks.step_offsets[q, t]
                    b = lo + ne.ranks.step_offsets[q, t + 1]
                    ats.append(ne.at[a:b][(ne.ranks.flags[a:b] & PEER) != 0])
                most = max(most, np.unique(np.concatenate(ats)).size)
    return most

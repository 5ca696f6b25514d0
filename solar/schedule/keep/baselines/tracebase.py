"""Baselines for a general sampler's trace, on the sampler's own rank split: ``lru`` (each rank
caches every read, evicting its least recently used), ``static`` (each rank's buffer holds
the ids it drew most often in a pre-sampled epoch, filled on first use, never evicted: what
DiskGNN and GIDS keep) and ``nopfs`` (the same, ranked by the run's own access counts, as NoPFS
ranks by its clairvoyant frequencies). Ids are (rank, sample) pairs as in
:mod:`solar.schedule.draw.traces`.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from solar.config import BufferConfig, RunConfig
from solar.errors import SolarError
from solar.schedule.draw.traces import TraceOrder
from solar.schedule.keep.maxheap import empty_heaps, rekey
from solar.schedule.policy import ADMIT, EPOCH_SHIFT, HIT, EpochSchedule, no_tier, slot_count

POS_FIELD = 0  # fields of ``cells``: heap position, then the pair held


@njit(cache=True, nogil=True)
def _lru_steps(pair, bounds, base, holder, key, heap, cells, rank, slot_out, flags):
    """LRU per rank, step by step: a step's hits (held as it starts) are marked used first,
    then each read takes the least recently used cell (heap keys: minus the last use)."""
    cap = key.shape[1]
    for k in range(bounds.shape[0] - 1):
        a, b = bounds[k], bounds[k + 1]
        for i in range(a, b):
            s = holder[pair[i]]
            slot_out[i] = s
            flags[i] = HIT if s >= 0 else 0
            if s >= 0:
                rekey(key, heap, cells, POS_FIELD, rank[i], s, -(base + i))
        if cap == 0:
            continue
        for i in range(a, b):
            if flags[i]:
                continue
            r = rank[i]
            s = heap[r, 0]
            old = cells[r, s, 1]
            if old >= 0:
                holder[old] = -1
            cells[r, s, 1] = pair[i]
            holder[pair[i]] = s
            rekey(key, heap, cells, POS_FIELD, r, s, -(base + i))
            slot_out[i] = s
            flags[i] = ADMIT


@njit(cache=True, nogil=True)
def _static_steps(pair, home, filled, slot_out, flags):
    """A pair with a home slot is read and stored there on first use, a hit ever after."""
    for i in range(pair.shape[0]):
        s = home[pair[i]]
        slot_out[i] = s
        if s < 0:
            flags[i] = 0
        elif filled[pair[i]]:
            flags[i] = HIT
        else:
            filled[pair[i]] = True
            flags[i] = ADMIT


class TraceLRU:
    """Per-rank LRU over a sampler's trace."""

    needs_next_use = False

    def __init__(self, run: RunConfig, buffer: BufferConfig, order: TraceOrder) -> None:
        self.run, self.order = run, order
        world, c = run.world_size, slot_count(run, buffer)
        self.holder = np.full(run.num_samples * world, -1, np.int32)  # pair -> slot
        self.key, self.heap = empty_heaps(world, c)
        self.cells = np.full((world, c, 2), -1, np.int64)  # heap position, pair
        self.cells[:, :, POS_FIELD] = self.heap

    def plan_epoch(self, k: int, seq: np.ndarray, next_use: np.ndarray | None) -> EpochSchedule:
        t = self.order.epoch(k)
        n = t.pair.size
        out = EpochSchedule(t.rank, np.empty(n, np.int32), np.zeros(n, np.uint8), t.counts,
                            no_tier(n))  # fmt: skip
        _lru_steps(t.pair, t.bounds, np.int64(k) << EPOCH_SHIFT, self.holder, self.key,
                   self.heap, self.cells, t.rank, out.slot, out.flags)  # fmt: skip
        return out

    def contents(self, r: int) -> np.ndarray:
        ids = self.cells[r, :, 1]
        return np.where(ids >= 0, ids - r * self.run.num_samples, -1)


class TraceStatic:
    """Per rank, the C ids drawn most often in a pre-sampled epoch (or, ``whole_run``, over
    the run itself), kept for the whole run."""

    needs_next_use = False

    def __init__(
        self, run: RunConfig, buffer: BufferConfig, order: TraceOrder, whole_run: bool = False
    ) -> None:
        self.run, self.order = run, order
        n, world, c = run.num_samples, run.world_size, slot_count(run, buffer)
        counts = np.zeros(n * world, np.int64)  # per (rank, sample) pair
        if whole_run:
            for k in range(run.epochs):
                counts += np.bincount(order.epoch(k).pair, minlength=counts.size)
        else:
            draws = _presample(order)
            ranks = np.repeat(np.arange(draws.offsets.size - 1) % world, np.diff(draws.offsets))
            counts += np.bincount(ranks * n + draws.ids, minlength=counts.size)
        self.home = np.full(n * world, -1, np.int32)
        self.filled = np.zeros(n * world, np.bool_)
        for r in range(world):
            mine = counts[r * n : (r + 1) * n]
            top = np.argsort(-mine, kind="stable")[:c]
            top = top[mine[top] > 0]
            self.home[r * n + top] = np.arange(top.size, dtype=np.int32)
        self._c = c

    def plan_epoch(self, k: int, seq: np.ndarray, next_use: np.ndarray | None) -> EpochSchedule:
        t = self.order.epoch(k)
        n = t.pair.size
        out = EpochSchedule(t.rank, np.empty(n, np.int32), np.zeros(n, np.uint8), t.counts,
                            no_tier(n))  # fmt: skip
        _static_steps(t.pair, self.home, self.filled, out.slot, out.flags)
        return out

    def contents(self, r: int) -> np.ndarray:
        n = self.run.num_samples
        mine = slice(r * n, (r + 1) * n)
        held = np.flatnonzero((self.home[mine] >= 0) & self.filled[mine])
        out = np.full(self._c, -1, np.int64)
        out[self.home[mine][held]] = held
        return out


def _presample(order: TraceOrder):
    """An epoch drawn but not served (the run's epoch E) where the sampler has one, else the
    run's first epoch: what a static cache is filled from."""
    run = order.run
    try:
        return order.draws(run.epochs)
    except (IndexError, SolarError):
        return order.draws(0)

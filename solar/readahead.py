"""The read-ahead queue: steps whose storage reads are under way, in step order."""

from __future__ import annotations

import collections
from collections.abc import Callable
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from solar.schedule.rankplan import StepPlan


@dataclass
class InFlight:
    """A step whose reads have been started into its own batch memory."""

    plan: StepPlan
    tensors: list[Any]  # torch tensors sharing ``batch``; empty until memory is taken
    batch: list[np.ndarray]  # (size, *sample shape) per key
    futures: list[Future]  # its reads: from storage first, then from the tier
    storage: int = 0  # futures[:storage] read from storage
    index: np.ndarray | None = None  # the delivered batch's ids, when not the plan's (exchange)
    # Once assembled: (bytes read, reader busy seconds, seconds waited, tier bytes).
    figures: tuple[int, float, float, int] = (0, 0.0, 0.0, 0)
    # Stage figures (solar/stages.py): of the busy seconds, decoding; the longest read job;
    # the read-ahead depth when the step was taken, and the steps after it already read.
    decode_seconds: float = 0.0
    latency: float = 0.0
    depth: int = 0
    landed: int = 0
    # With a transform: the transformed batch (tensors, numpy views) and its tasks' futures.
    out: tuple[list[Any], list[np.ndarray]] | None = None
    transforms: list[Future] = field(default_factory=list)
    transformed: int = 0  # rows being transformed
    settled: bool = False  # its buffer and tier updates are applied
    provisional: bool = False  # read before its plan was made: ``plan`` names only its reads


class ReadAhead:
    """Keeps the reads of the next ``depth`` steps under way.

    Invariant: the queue holds consecutive steps, the first being the next one served. A
    step's reads land in its own batch memory, never in the slot buffer: the buffer is written
    only on the consuming thread, in step order, so no read in flight races a store.
    """

    def __init__(
        self,
        start: Callable[[int], InFlight],
        depth: int,
        confirm: Callable[[int, InFlight], InFlight] | None = None,
    ) -> None:
        self._start = start
        # A step queued before its plan was made (``provisional``) is confirmed against it
        # when taken, before any later step starts: their reads queue behind its own.
        self._confirm = confirm
        self._depth = depth
        self._queue: collections.deque[InFlight] = collections.deque()
        self.landed = 0  # at the last take: steps queued after it whose reads had all ended

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

    def take(self, k: int, last: int) -> InFlight:
        """Step ``k``'s reads (started now if they were not), after starting those up to
        ``min(k + depth, last)``."""
        if not self._queue or self._queue[0].plan.step != k:
            self.drain()
            self._queue.append(self._start(k))
        if self._queue[0].provisional:
            assert self._confirm is not None, "a provisional step and no way to confirm it"
            self._queue[0] = self._confirm(k, self._queue[0])
        # Counted before starting more: the queue's occupancy as the consumer arrives.
        ahead = list(self._queue)[1 : 1 + self._depth]
        self.landed = sum(all(f.done() for f in io.futures) for io in ahead)
        while self._queue[-1].plan.step < min(k + self._depth, last):
            self._queue.append(self._start(self._queue[-1].plan.step + 1))
        return self._queue.popleft()

    @property
    def started(self) -> bool:
        """Whether any step's reads are queued."""
        return bool(self._queue)

    def head(self, io: InFlight) -> None:
        """Queue ``io``, started by the caller, as the next step (the queue must be empty)."""
        assert not self._queue, "a step queued before the one started first"
        self._queue.append(io)

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

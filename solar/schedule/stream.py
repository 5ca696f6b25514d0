"""One rank's plan, one epoch at a time: the next epoch is planned while this one runs.

A :class:`RankStream` hands the runtime a window of the rank's plan (a :class:`RankPlan` over
the current epoch and whatever later epochs are already planned). Planning runs in one
background thread (the numba kernels release the GIL), one epoch ahead of the consumer; memory
holds the planner's state, O(N + P·C), and the window, whatever the number of epochs. A jump
backwards (a resume, or an epoch served again) replans from epoch 0 without keeping anything
until the wanted epoch: a replay whose cost is the planning time of the epochs before it; or,
given a directory of planner snapshots (:mod:`solar.schedule.snapshot`, which rank 0 writes
after each epoch it plans), from the nearer of the planner and the newest snapshot at or
before the wanted epoch. The first epoch is planned from :meth:`RankStream.start` on (the
Loader calls it as it is constructed). A sampler that draws each rank's batches draws them once
per run, into the stream's :attr:`~EpochsAhead.drawn`: the planner's draws, kept (with the
sampler's output of each batch) for the runtime to serve.
"""

from __future__ import annotations

import contextlib
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from solar._process import ProcessLocal
from solar.schedule import snapshot
from solar.schedule._common import slot_count, tier_slot_count
from solar.schedule.draws import RankDraws
from solar.schedule.plan import Plan
from solar.schedule.planner import Planner, RankEpoch
from solar.schedule.rankplan import RankPlan, _replay
from solar.schedule.samplers import NO_EXTRAS, extras_of
from solar.schedule.spec import PlanSpec
from solar.schedule.traces import default_horizon


class EpochsAhead:
    """A plan stream: one planner per process, planning the next epoch in one thread while
    the current one is served, and the window of consecutive epochs ``_parts`` from epoch
    ``_first`` that the runtime is handed (:class:`RankStream`, and the node version in
    solar/schedule/nodestream.py). A subclass makes the planner (``_new_planner``), plans one
    epoch with it (``_next_epoch``), replans to an epoch (``_restart_at``) and makes the window
    of its parts (``_current``)."""

    _thread_name = "solar-plan"
    spec: PlanSpec
    rank: int
    spe: int  # steps per epoch
    wait_seconds: float
    _parts: list
    _first: int
    _initial: np.ndarray | None  # the buffer (sample per cell) as epoch _first starts
    _window: Any

    def start(self) -> None:
        """Begin planning the first epoch in the background (the first batch waits for it),
        unless planning has begun."""
        if self._parts or self._first:
            return
        bg = self._bg.get()
        if bg.planner is None:
            bg.planner = self._new_planner()
        self._submit()

    @property
    def planned_end(self) -> int:
        """The first global step not yet planned (without waiting)."""
        self._collect(wait=False)
        return (self._first + len(self._parts)) * self.spe

    def window(self, k: int, trim: bool = True) -> Any:
        """A window of the plan that holds global step ``k``: planned now if it must be.

        With ``trim`` (the step being served, not one read ahead), epochs before k's are
        dropped from the window."""
        w = self._window
        if w is not None and self._bg.here() is not None:
            # The common case, every step: k is in the window (in its first epoch, if trimming).
            end = min(w.end_step, w.first_step + self.spe) if trim else w.end_step
            if w.first_step <= k < end:
                return w
        e = k // self.spe
        end = self._first + len(self._parts)
        if self._first <= e < end and not (trim and self._restarts(e)):
            self._collect(wait=False)
        else:
            with self._planning(k):  # this rank waits for step k's plan meanwhile
                self._reach(e)
        if trim and e > self._first:
            # Epochs before e are done with: the buffer state at e's start replaces them.
            self._initial = self._initial_at(e)
            self._parts = self._parts[e - self._first :]
            self._first = e
            self._window = None
        return self._current()

    def _restarts(self, e: int) -> bool:
        """Whether serving epoch ``e`` restarts the planning, wherever the window ends (a
        host's ranks decide it alike: NodeStream)."""
        return False

    def _reach(self, e: int) -> None:
        """Make epoch ``e`` (not in the window) the window's: the next epoch, waited for, or
        planned again from where it can be."""
        if not (e == self._first + len(self._parts) and self._extend()):
            self._restart_at(e)

    def _planning(self, k: int) -> contextlib.AbstractContextManager:
        """While this rank waits for step ``k``'s plan (a host's rank shows it to its host)."""
        return contextlib.nullcontext()

    def _extend(self) -> bool:
        """Add the epoch after the window (waiting for the planner if need be)."""
        return self._bg.get().future is not None and self._collect(wait=True)

    def _initial_at(self, e: int) -> np.ndarray:
        """The buffer as epoch ``e`` of the window starts."""
        return self._current().contents_at(e * self.spe)

    def _restart_at(self, epoch: int) -> None:
        raise NotImplementedError

    def _current(self) -> Any:
        raise NotImplementedError

    def _reset_planning(self) -> None:
        self._bg: ProcessLocal[_Planning] = ProcessLocal(self._new_planning)

    def _new_planning(self) -> _Planning:
        """This process's planner and planning thread. In a forked child the thread did not
        come along and the planner's state may be half-updated by it: the child keeps the
        epochs already planned and replans the rest when needed."""
        self._window = None
        return _Planning()

    @property
    def drawn(self) -> RankDraws:
        """This rank's draws of the run (this process's): drawn once by the planner, or by the
        runtime if no planner here draws them (a plan given, or every rank planned), and
        kept until served (:meth:`RankDraws.forget_before`). Epochs held: the one served, the
        one planned ahead and the planner's look-ahead (bytes: ``bench/sample_once.py``)."""
        bg = self._bg.get()
        if bg.drawn is None:
            spec = self.spec
            horizon = default_horizon(spec.run, spec.sampler) if spec.horizon is None \
                else spec.horizon  # fmt: skip
            bg.drawn = RankDraws(spec.sampler, spec.run, self.rank, horizon + 2)
        return bg.drawn

    def _new_planner(self) -> Any:
        raise NotImplementedError

    def _next_epoch(self, planner: Any) -> Any:
        raise NotImplementedError

    def _submit(self) -> None:
        """Start planning the planner's next epoch in the background, if any remain."""
        bg = self._bg.get()
        assert bg.planner is not None
        if bg.future is None and bg.planner.epoch < self.spec.run.epochs:
            if bg.pool is None:
                bg.pool = ThreadPoolExecutor(1, thread_name_prefix=self._thread_name)
            bg.future = bg.pool.submit(self._next_epoch, bg.planner)

    def _settled_planner(self) -> Any:
        """The process's planner once no epoch is being planned with it (None: none yet)."""
        bg = self._bg.get()
        if bg.future is not None:
            bg.future.result()  # the planner is in use until then
            bg.future = None
        return bg.planner

    def _collect(self, wait: bool) -> bool:
        """Append the background epoch to the window if it is done (or ``wait``)."""
        bg = self._bg.get()
        if bg.future is None or not (wait or bg.future.done()):
            return False
        t0 = time.perf_counter()
        part = bg.future.result()
        self.wait_seconds += time.perf_counter() - t0
        bg.future = None
        if part.epoch == self._first + len(self._parts):
            self._parts.append(part)
            self._window = None
        self._submit()
        return True

    def close(self, abandon: bool = False) -> None:
        """Stop the planning thread (after its current epoch); ``abandon`` (an error path):
        its epochs not begun are cancelled."""
        bg = self._bg.drop()  # a forked child never touches its parent's thread
        if bg is not None and bg.pool is not None:
            bg.pool.shutdown(wait=True, cancel_futures=abandon)


class RankStream(EpochsAhead):
    """Rank ``rank``'s steps of ``spec``'s run, planned epoch by epoch in the background."""

    def __init__(
        self,
        spec: PlanSpec,
        rank: int,
        plan: Plan | None = None,
        snapshots: str | os.PathLike | None = None,
    ) -> None:
        self.spec = spec
        self.rank = rank
        self.plan = plan  # a Plan to read epochs from (made, or a file proven safe), or None
        self.snapshots = snapshots  # a directory of planner snapshots (rank 0 writes), or None
        self.slots = slot_count(spec.run, spec.buffer)
        self.tier_slots = tier_slot_count(spec.run, spec.buffer)
        self.spe = int(spec.run.steps_per_epoch)
        self.wait_seconds = 0.0  # time callers waited for planning (replays included)
        self._reset()

    def _reset(self) -> None:
        self._reset_planning()
        self._parts: list[RankEpoch] = []  # consecutive epochs, from self._first
        self._first = 0
        self._initial: np.ndarray | None = None  # buffer contents as epoch self._first starts
        self._window: RankPlan | None = None

    def __getstate__(self) -> dict:
        return {"spec": self.spec, "rank": self.rank, "plan": self.plan, "slots": self.slots,
                "tier_slots": self.tier_slots, "spe": self.spe,
                "wait_seconds": self.wait_seconds, "snapshots": self.snapshots}  # fmt: skip

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset()

    # -- planning ------------------------------------------------------------------------------
    def start(self) -> None:
        """Begin planning the first epoch in the background (the first batch waits for it),
        unless a plan was given or planning has begun."""
        if self.plan is None:
            super().start()

    def _new_planner(self) -> Planner:
        """A planner from epoch 0: of this rank alone, unless rank 0 saves snapshots (they hold
        every rank's state: then every rank is planned)."""
        drawn = self.drawn if extras_of(self.spec.sampler) is not NO_EXTRAS else None
        return Planner(self.spec, only_rank=self.rank if self.snapshots is None else None,
                       draws=drawn)  # fmt: skip

    def _next_epoch(self, planner: Planner) -> RankEpoch:
        """Plan the next epoch (in the background thread); rank 0 then saves a snapshot."""
        part = planner.next_rank(self.rank)
        if self.snapshots is not None and self.rank == 0:
            snapshots = self.snapshots
            snapshot.save_or_warn(lambda: snapshot.save(snapshots, planner), "planner snapshot")
        return part

    def _restart_at(self, epoch: int) -> None:
        """Replan from scratch (or from where the planner is) up to ``epoch``; keep only it.
        From a plan: replay the buffer through the epochs before it."""
        t0 = time.perf_counter()
        if self.plan is not None:
            state = np.full(self.slots + self.tier_slots, -1, np.int64)
            for k in range(epoch):
                p = self.plan.rank_epoch(self.rank, k)
                _replay(p.sample, p.slot, p.tslot, p.flags, 0, p.sample.size, self.slots, state)
            self._initial, self._first = state, epoch
            self._parts = [self.plan.rank_epoch(self.rank, epoch)]
            self._window = None
            self.wait_seconds += time.perf_counter() - t0
            return
        planner = self._settled_planner()
        bg = self._bg.get()
        # Where the planner can go on from: not past ``epoch`` (it never plans backwards).
        at = -1 if planner is None or planner.epoch > epoch else planner.epoch
        if at < epoch and self.snapshots is not None:
            restored = snapshot.load(self.snapshots, self.spec, epoch, after=at)
            if restored is not None:
                planner, at = restored, restored.epoch  # nearer than where the planner is
        if planner is None or at < 0:
            planner = self._new_planner()
        bg.planner = planner
        while planner.epoch < epoch:
            planner.skip()
        self._initial = planner.contents(self.rank)
        self._first = epoch
        self._parts = [self._next_epoch(planner)]
        self._window = None
        self.wait_seconds += time.perf_counter() - t0
        self._submit()

    # -- the window ----------------------------------------------------------------------------
    @property
    def planned_end(self) -> int:
        """The first global step not yet planned (without waiting); from a plan, the next
        epoch is a file read away: read ahead into it."""
        if self.plan is not None:
            return min(self._first + len(self._parts) + 1, self.spec.run.epochs) * self.spe
        return super().planned_end

    def _extend(self) -> bool:
        """Add the epoch after the window (read from the plan, or waited for)."""
        if self.plan is None:
            return super()._extend()
        if not self._parts:  # (the first epoch: restarted at, the buffer replayed to it)
            return False
        self._parts.append(self.plan.rank_epoch(self.rank, self._first + len(self._parts)))
        self._window = None
        return True

    def _current(self) -> RankPlan:
        if self._window is None:
            last = self._first + len(self._parts)
            self._window = RankPlan.from_parts(
                self.rank, self._parts, self.slots, first_step=self._first * self.spe,
                initial=self._initial, complete=last == self.spec.run.epochs,
                tier_slots=self.tier_slots,
            )  # fmt: skip
        return self._window


@dataclass
class _Planning:
    """A stream's planner and its planning thread, in one process."""

    planner: Any = None  # a Planner, or a NodePlanner
    drawn: RankDraws | None = None  # the rank's draws (EpochsAhead.drawn)
    pool: ThreadPoolExecutor | None = None
    future: Future | None = None

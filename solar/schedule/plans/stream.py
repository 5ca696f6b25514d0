"""A rank's plan, one epoch at a time, of every grouping: the next epoch is planned while this
one runs.

A :class:`RankStream` hands the runtime a window of rank ``rank``'s plan over the current epoch
and whatever later epochs are already planned (a
:class:`~solar.schedule.plans.rankplan.RankPlan`): of its own buffer (a host of one rank), or
of its share of its host's (``hosts``: the host plan, schedule/keep/hostplan.py).
Planning runs in one background thread (the numba kernels release the GIL), one epoch ahead of
the consumer; memory holds the planner's state, O(N + P·C), and the window, whatever the number
of epochs. The epochs come from a planner, or from a plan given (made, or a file proven safe:
:class:`FileEpochs`, read by the same thread). The first epoch is planned from
:meth:`RankStream.start` on (the Loader calls it as it is constructed). A sampler that draws
each rank's batches draws them once per run, into :attr:`~RankStream.drawn`: the planner's
draws, kept (with the sampler's output of each batch) for the runtime to serve.

A jump backwards (a resume, or an epoch served again) replans from epoch 0 without keeping
anything until the wanted epoch: a replay whose cost is the planning time of the epochs before
it; or, given a directory of planner snapshots (:mod:`solar.schedule.plans.snapshot`, which rank 0
writes after each epoch it plans, of every rank or host), from the nearer of the planner and the
newest snapshot at or before the wanted epoch.

Given a :class:`~solar.schedule.plans.packing.PackModel`, the same thread decides, as it plans each
epoch, where the rank's misses of that epoch are read from (:meth:`RankStream.windows`: random
pages, or a window packed in plan order; schedule/plans/packing.py): from the rank's own storage
reads, so that on a host's buffer each rank packs the misses the host plan gives it to read. The
runtime obeys (solar/runtime/packing.py). An epoch planned ahead is packed while the one before
is served (``lead``); the run's first epoch, or one replanned in the foreground (a resume), is
not: its first window is read at random while the next is packed.

A host's ranks given its communicator plan together (schedule/plans/hostplanners.py): where the
sampler fixes each rank's batch, the host's buffer is planned in parts (solar/schedule/
keep/hostparts.py), each local rank drawing its own batches, planning its part from every local
rank's draws and putting its view together from every part (solar/schedule/plans/hostview.py);
otherwise local rank 0 plans and publishes each epoch of its host and the others take it. What
they exchange is bytes (schedule/plans/hostpayload.py) in rounds of a communicator the planning
thread owns (solar/host/exchange.py): every local rank makes the same rounds in the same order,
so a jump forward plans on (every epoch, on every local rank alike) and a jump back (with
snapshots, also one past the next epoch), or a close, first stops the host's planning threads
together, decided alike on every local rank from the epoch served. A rank failing alone closes
alone (``close(abandon=True)``). Without the host's communicator a rank plans its host itself:
the plan is a pure function of the inputs, the same either way.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from solar._process import ProcessLocal
from solar.host.exchange import Interrupted
from solar.schedule.draw.draws import RankDraws
from solar.schedule.draw.samplers import NO_EXTRAS, extras_of
from solar.schedule.draw.traces import default_horizon
from solar.schedule.keep.grouping import Hosts, stage_bound
from solar.schedule.keep.hostplan import HostPlanner
from solar.schedule.keep.hostrun import host_parts, host_run_spec
from solar.schedule.keep.planner import Planner, RankEpoch
from solar.schedule.plans import hostpayload as payload
from solar.schedule.plans import snapshot
from solar.schedule.plans.hostplanners import Checks, EpochReader, PartPlanner, exchange_of
from solar.schedule.plans.packing import EpochWindows, PackModel, epoch_windows
from solar.schedule.plans.plan import Plan
from solar.schedule.plans.rankplan import RankPlan, Share, _replay
from solar.schedule.policy import slot_count, tier_slot_count
from solar.schedule.spec import PlanSpec


class OwnPlanner:
    """A rank's own buffer's :class:`~solar.schedule.keep.planner.Planner` (a host of one rank),
    driven as a :class:`~solar.schedule.keep.hostplan.HostPlanner` is: :meth:`next` the rank's part
    of the next epoch; ``planner`` skips epochs and holds the contents."""

    def __init__(self, planner: Planner, rank: int) -> None:
        self.planner, self.rank = planner, rank
        self.only_host = planner.only_rank

    @property
    def epoch(self) -> int:
        return self.planner.epoch

    def next(self) -> RankEpoch:
        return self.planner.next_rank(self.rank)


class FileEpochs:
    """A plan's epochs read in order as a planner's are planned: :meth:`next` the next epoch
    (rank ``rank``'s part of a plan per rank; a plan grouped by host, its epoch), ``skip()``
    and ``contents(host)``, the buffer (``cells``, ``slots`` of them RAM) as the next epoch
    starts, by a replay of the plan."""

    only_host = -1  # (never snapshotted)

    def __init__(self, plan: Plan, rank: int, host: int, cells: int, slots: int) -> None:
        self.plan, self.rank, self.host, self.slots = plan, rank, host, slots
        self.epoch = 0
        self.state = np.full(cells, -1, np.int64)
        self.planner = self

    def next(self) -> Any:
        k = self.epoch
        if self.plan.hosts is None:
            out = p = self.plan.rank_epoch(self.rank, k)
        else:
            out = self.plan.epoch(k)
            p = out.host.rank(self.host)
        _replay(p.sample, p.slot, p.tslot, p.flags, 0, p.sample.size, self.slots, self.state)
        self.epoch += 1
        return out

    def skip(self) -> None:
        self.next()

    def contents(self, host: int) -> np.ndarray:
        return self.state.copy()


class RankStream:
    """Rank ``rank``'s steps of ``spec``'s run, planned epoch by epoch in the background (or
    read from ``plan``): of its own buffer, or (``hosts``, or a plan grouped by host) of its
    share of its host's; ``stage_rows``, the host's staging rows (default: the bound of
    :func:`~solar.schedule.keep.grouping.stage_bound`); ``comm``, the host's communicator its host's
    ranks plan together over; ``snapshots``, a directory of planner snapshots (rank 0
    writes); ``packing``, the model its misses' windows are decided by (None: all random)."""

    def __init__(self, spec: PlanSpec, rank: int, plan: Plan | None = None,
                 snapshots: str | os.PathLike | None = None, *, hosts: Hosts | None = None,
                 stage_rows: int | None = None, comm: Any = None,
                 packing: PackModel | None = None) -> None:  # fmt: skip
        self.spec, self.rank, self.plan, self.snapshots = spec, rank, plan, snapshots
        self.packing = packing
        self.hosts = plan.hosts if hosts is None and plan is not None else hosts
        self.spe = int(spec.run.steps_per_epoch)
        self.wait_seconds = 0.0  # time callers waited for planning (replays included)
        self.pid = os.getpid()  # the process that joined its host (a forked child cannot)
        self.exchange: Any = None
        self.parts: Any = None
        self.check: Checks | None = None
        self.group: tuple[int, ...]
        if self.hosts is None:  # a buffer of its own: a host of one rank
            self.host, self.group, self.local = rank, (rank,), 0
            self.slots = slot_count(spec.run, spec.buffer)
            self.tier_slots = tier_slot_count(spec.run, spec.buffer)
            self.stage_rows = 0
            self.share = Share.alone(rank, self.slots, self.tier_slots, self.spe)
        else:
            self._join(self.hosts, stage_rows, comm)
        # Whether a rank of this host saves host planner snapshots (the host's ranks decide
        # alike how its plan is made).
        self.host_saves = self._saves() if self.exchange is None else any(self.exchange.extras)
        # A buffer in parts with the exchange: every local rank plans its part from the ranks'
        # draws (on the host of a rank saving snapshots, that rank plans every host's every part
        # and its host's ranks take its epochs: they hold every host's state).
        self.parted = self.exchange is not None and self.parts is not None and not self.host_saves
        self._barrier: Any = None  # the host's barrier, once watched (watch)
        self._reset()

    def _join(self, hosts: Hosts, stage_rows: int | None, comm: Any) -> None:
        """This rank's place in its host's buffer and, with the host's communicator, the
        exchange of the host's ranks (a collective now, in the foreground)."""
        spec, rank = self.spec, self.rank
        self.host = hosts.host_of(rank)
        self.group = hosts.groups[self.host]
        self.local = self.group.index(rank)
        host_spec = host_run_spec(spec, hosts, host=self.host)
        self.slots = host_spec.slots
        self.tier_slots = tier_slot_count(host_spec.run, host_spec.buffer)
        stage = stage_bound(spec, hosts) if stage_rows is None else stage_rows
        self.stage_rows = max(1, int(stage))
        self.exchange = exchange_of(comm, hosts, self.host, self.local, self._saves())
        self.parts = host_parts(host_spec, hosts, self.host)
        tag = payload.digest(spec.fingerprint, hosts, self.host)
        self.check = Checks(hosts, self.host, rank, self.spe, spec.run.num_samples, self.slots,
                            self.tier_slots, tag, self.parts)  # fmt: skip
        self.share = Share(rank, self.host, self.local, self.group, self.slots, self.tier_slots,
                           self.stage_rows, self.spe, spec.equal_batches)  # fmt: skip

    def _reset(self) -> None:
        self._bg: ProcessLocal[_Planning] = ProcessLocal(self._new_planning)
        self._parts: list = []  # consecutive epochs, from self._first
        self._first = 0
        self._initial: np.ndarray | None = None  # the buffer (cells) as epoch _first starts
        self._window: RankPlan | None = None
        self._windows: dict[int, EpochWindows] = {}  # by epoch, of the epochs planned (packing)

    _KEEP = ("spec", "rank", "plan", "snapshots", "packing", "hosts", "spe", "wait_seconds", "pid",
             "parts", "check", "share", "host", "group", "local", "slots", "tier_slots",
             "stage_rows", "host_saves")  # fmt: skip

    def __getstate__(self) -> dict:
        return {k: self.__dict__[k] for k in self._KEEP}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.exchange, self.parted = None, False  # (a copy plans its host itself)
        self._barrier = None
        self._reset()

    # -- the window ----------------------------------------------------------------------------
    def start(self) -> None:
        """Begin planning (or reading) the first epoch in the background (the first batch waits
        for it), unless planning has begun."""
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

    def window(self, k: int, trim: bool = True) -> RankPlan:
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
            if self._bg.get().planner is not None:  # (a forked child replans when needed)
                self._submit()  # the epoch after e, if not planned or being planned
        return self._current()

    def _current(self) -> RankPlan:
        if self._window is None:
            complete = self._first + len(self._parts) == self.spec.run.epochs
            self._window = self._view(self._parts, self._first, self._initial, complete)
        return self._window

    def _view(self, parts: list, first: int, initial: np.ndarray | None,
              complete: bool) -> RankPlan:  # fmt: skip
        """This rank's plan over consecutive epochs ``parts`` from epoch ``first``."""
        return RankPlan(self.share, parts, first * self.spe, initial, complete)

    def windows(self, epoch: int) -> EpochWindows | None:
        """The windows the planner decided for ``epoch`` (planned, not yet dropped), or None
        (not planned, or no packing)."""
        self._collect(wait=False)
        return self._windows.get(epoch)

    def _initial_at(self, e: int) -> np.ndarray:
        """The buffer as epoch ``e`` of the window starts (taken with it from the exchange, or
        derived)."""
        initial = getattr(self._parts[e - self._first], "initial", None)
        return self._current().contents_at(e * self.spe) if initial is None else initial

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

    # -- the planner ---------------------------------------------------------------------------
    def _saves(self) -> bool:
        """Whether this rank saves planner snapshots (rank 0, given a directory)."""
        return self.snapshots is not None and self.rank == 0

    def _reads_epochs(self) -> bool:
        """Whether this rank takes its host's epochs from local rank 0 (plans nothing)."""
        return self.exchange is not None and self.local != 0 and not self.parted

    def _new_planner(self) -> Any:
        """A planner from epoch 0, or a reader of the plan given. Of this rank's buffer, or its
        host's, alone, unless it saves snapshots (they hold every rank's or host's state); a
        reader of local rank 0's epochs on the others; with a buffer in parts, of this rank's
        part, from the draws its host's ranks post."""
        if self.plan is not None:
            return FileEpochs(self.plan, self.rank, self.host, self.slots + self.tier_slots,
                              self.slots)  # fmt: skip
        if self.hosts is None:
            drawn = self.drawn if extras_of(self.spec.sampler) is not NO_EXTRAS else None
            alone = self.rank if self.snapshots is None else None
            return OwnPlanner(Planner(self.spec, only_rank=alone, draws=drawn), self.rank)
        check = self.check
        assert check is not None
        if self._reads_epochs():
            return EpochReader(self.exchange, check)
        if self.parted:
            return PartPlanner(self.spec, self.hosts, self.rank, self.exchange, self.parts,
                               self.drawn.own, check)  # fmt: skip
        return HostPlanner(self.spec, self.hosts, only_host=None if self._saves() else self.host,
                           source=self.drawn.source)  # fmt: skip

    def _next_epoch(self, planner: Any) -> Any:
        """Plan the next epoch (in the background thread), or take local rank 0's; local rank
        0 publishes it, rank 0 saves a snapshot. With a buffer in parts every local rank
        plans and posts its part, then takes every part."""
        if isinstance(planner, EpochReader | PartPlanner):
            return planner.next()
        if self.exchange is None:
            part = planner.next()
        else:
            assert self.check is not None
            contents = planner.planner.contents(self.host)
            ne = planner.next()
            data = payload.pack(ne, self.host, np.asarray(contents, np.int64), self.check.tag)
            got = self.exchange.post(payload.WHOLE, ne.epoch, data)
            # Local rank 0 keeps its part, as the others.
            part = self.check.epoch(self.exchange, got[0], ne.epoch)
        if self._saves() and planner.only_host is None:
            snapshots = self.snapshots
            assert snapshots is not None
            state = planner.planner if isinstance(planner, OwnPlanner) else planner
            snapshot.save_or_warn(lambda: snapshot.save(snapshots, state), "planner snapshot")
        return part

    def _decided(self, planner: Any, ahead: bool) -> tuple[Any, EpochWindows | None]:
        """The next epoch (:meth:`_next_epoch`) and, with packing, where this rank reads its
        misses in it (``ahead``: planned while the epoch before is served)."""
        part = self._next_epoch(planner)
        if self.packing is None:
            return part, None
        e, spe = part.epoch, self.spe
        view = self._view([part], e, None, True)
        reads = [view.step(k).storage_reads()[0] for k in range(e * spe, (e + 1) * spe)]
        return part, epoch_windows(e, reads, e * spe, self.packing, lead=ahead and e > 0)

    def _keep(self, windows: EpochWindows | None) -> None:
        """Hold an epoch's windows beside its plan (those of epochs dropped go)."""
        self._windows = {e: w for e, w in self._windows.items() if e >= self._first}
        if windows is not None:
            self._windows[windows.epoch] = windows

    def _restored(self, epoch: int, after: int) -> Any:
        """A planner restored from the newest snapshot at or before ``epoch``, after
        ``after``; None if none."""
        assert self.snapshots is not None
        if self.hosts is None:
            got = snapshot.load(self.snapshots, self.spec, epoch, after=after)
            return None if got is None else OwnPlanner(got, self.rank)
        node = functools.partial(HostPlanner, self.spec, self.hosts)
        return snapshot.load(self.snapshots, self.spec, epoch, after, self.hosts, node)

    def _restart_at(self, epoch: int) -> None:
        """Replan up to ``epoch`` (from where the planner is, if not past it; else from a
        snapshot, or from 0); keep only it."""
        t0 = time.perf_counter()
        p: Any = None
        if self.exchange is not None:  # a jump back: the host's planning threads stop first
            self._stop(epoch)
        if not self.parted:  # (a part's planner is never resumed: see _stop)
            p = self._settled_planner()
        at = -1 if p is None or p.epoch > epoch else p.epoch
        if at < epoch and self.snapshots is not None and self.plan is None \
                and not self._reads_epochs() and not self.parted:  # fmt: skip
            p = self._restored(epoch, at) or p  # nearer (a part's planner replans: whole)
            at = -1 if p is None or p.epoch > epoch else p.epoch
        if p is None or at < 0:
            p = self._new_planner()
        self._bg.get().planner = p
        while p.epoch < epoch:
            p.planner.skip()
        self._first = epoch
        if self.exchange is None:
            self._initial = p.planner.contents(self.host)
            part, windows = self._decided(p, ahead=False)
        else:  # the contents as the epoch starts come with it
            part, windows = self._decided(p, ahead=False)
            self._initial = part.initial
        self._parts = [part]
        self._windows = {}
        self._keep(windows)
        self._window = None
        self.wait_seconds += time.perf_counter() - t0
        self._submit()

    def _submit(self) -> None:
        """Start planning the planner's next epoch in the background, if any remain."""
        bg = self._bg.get()
        assert bg.planner is not None
        # One epoch ahead of the one served, no further: each epoch planned is a plan held.
        end = min(self.spec.run.epochs, self._first + 2)
        if bg.future is None and bg.planner.epoch < end:
            if bg.pool is None:
                bg.pool = ThreadPoolExecutor(1, thread_name_prefix="solar-plan")
            bg.future = bg.pool.submit(self._decided, bg.planner, True)

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
        if wait and self.exchange is not None:
            self.exchange.wait(bg.future)  # (its peers and the host barrier checked meanwhile)
        t0 = time.perf_counter()
        part, windows = bg.future.result()
        self.wait_seconds += time.perf_counter() - t0
        bg.future = None
        if part.epoch == self._first + len(self._parts):
            self._parts.append(part)
            self._keep(windows)
            self._window = None
        self._submit()
        return True

    # -- a host's ranks planning together ------------------------------------------------------
    def watch(self, barrier: Any) -> None:
        """Show every wait of this rank for its plan to its host's ``barrier`` (a
        :class:`~solar.host.barrier.HostBarrier`), which checks, while the host's ranks
        wait, that they wait for the same step: one that took another epoch or step than its
        host's is named at once, in one line (else it would wait for payloads its host's
        ranks never post, and they for it at their barrier)."""
        self._barrier = barrier
        if self.exchange is not None:
            self.exchange.watch = barrier.check_planning
            self.exchange.limit_s = barrier.timeout_s  # (its waits give up as the barrier's)

    @contextlib.contextmanager
    def _planning(self, k: int) -> Iterator[None]:
        """This rank waits for step ``k``'s plan meanwhile (shown to its watched barrier)."""
        if self._barrier is None:
            yield
            return
        self._barrier.planning(k)
        try:
            yield
        finally:
            self._barrier.planning(None)

    def _restarts(self, e: int) -> bool:
        """With the exchange, whether serving epoch ``e`` restarts the host's planning (a
        collective stop), decided alike on every local rank: from the epoch against the
        window's first, which the host's barrier keeps in step, never from how far each rank
        has collected. A jump back restarts; with snapshots, so does a jump past the next
        epoch (rank 0 loads the nearest); a jump forward otherwise plans on."""
        if self.exchange is None:
            return False
        return e < self._first or (self.host_saves and e > self._first + 1)

    def _reach(self, e: int) -> None:
        """Make epoch ``e`` (not in the window) the window's: the next epoch, waited for, or
        planned again from where it can be."""
        self._in_child()  # (before deciding: a forked child never stops its parent's host)
        if self.exchange is None:
            if not (e == self._first + len(self._parts) and self._extend()):
                self._restart_at(e)
        elif self._restarts(e) or self._bg.get().planner is None:
            self._restart_at(e)  # (whatever this rank's window holds: its peers' may differ)
        else:
            self._advance(e)

    def _extend(self) -> bool:
        """Add the epoch after the window (waiting for the planner if need be)."""
        bg = self._bg.get()
        if bg.future is None and bg.planner is not None:
            self._submit()  # (not begun if the window was as far ahead as planning goes)
        return bg.future is not None and self._collect(wait=True)

    def _advance(self, epoch: int) -> None:
        """Plan on to ``epoch`` (a jump forward, with the exchange): every local rank plans
        every epoch in order, whichever it skips; the epochs before it are dropped."""
        t0 = time.perf_counter()
        while self._first + len(self._parts) <= epoch:
            if self._bg.get().future is None:
                self._submit()
            self._collect(wait=True)
            if len(self._parts) > 1 and self._first < epoch:
                self._initial = self._initial_at(self._first + 1)
                self._parts = self._parts[1:]
                self._first += 1
                self._window = None
        self.wait_seconds += time.perf_counter() - t0

    def _new_planning(self) -> _Planning:
        """This process's planner and planning thread. In a forked child the thread did not
        come along and the planner's state may be half-updated by it: the child keeps the
        epochs already planned and replans the rest when needed (and drops the exchange)."""
        self._in_child()
        self._window = None
        return _Planning()

    def _in_child(self) -> None:
        """In a forked child, drop the exchange (its parent's): it plans its host itself."""
        if os.getpid() != self.pid:
            self.exchange, self.parted = None, False

    def _stop(self, epoch: int) -> None:
        """Stop the host's planning threads together (solar/host/exchange.py) and drop the
        epoch being planned, if any: each rank's may be another (the next epoch is planned as
        soon as the last is collected). A part's planner is dropped (a restart replans)."""
        assert self.exchange is not None
        self.exchange.stop(self._join_thread, epoch)

    def _join_thread(self) -> None:
        bg = self._bg.here()
        if bg is None or bg.future is None:
            return
        assert self.exchange is not None
        try:
            self.exchange.wait(bg.future)
        except Interrupted:
            pass
        bg.future = None

    def close(self, abandon: bool = False) -> None:
        """Stop the planning thread (after its current epoch); ``abandon`` (an error path):
        its epochs not begun are cancelled. With the exchange, together with the host's ranks
        (a collective of the host's communicator: every local rank closes its stream); with
        ``abandon`` (the host's other ranks may never close), alone."""
        if self.exchange is not None and os.getpid() == self.pid:
            if abandon:
                self.exchange.abandon()
            else:
                self.exchange.close(self._join_thread)
        bg = self._bg.drop()  # a forked child never touches its parent's thread
        if bg is not None and bg.pool is not None:
            bg.pool.shutdown(wait=True, cancel_futures=abandon)


@dataclass
class _Planning:
    """A stream's planner and its planning thread, in one process."""

    planner: Any = None  # an OwnPlanner, HostPlanner, EpochReader, PartPlanner or FileEpochs
    drawn: RankDraws | None = None  # the rank's draws (RankStream.drawn)
    pool: ThreadPoolExecutor | None = None
    future: Future | None = None

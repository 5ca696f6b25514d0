"""One rank's share of its host's node plan, one epoch at a time (``MemoryConfig(share="node")``).

The node version of :class:`~solar.schedule.stream.RankStream`: a :class:`NodeStream` plans
its host's buffer (solar/schedule/nodeplan.py: Belady over the union of the host's ranks'
accesses) one epoch ahead in a background thread, and hands the runtime a :class:`NodeWindow`
whose :meth:`~NodeWindow.step` is this rank's :class:`~solar.schedule.rankplan.StepPlan`:
its hits in the node's slots, its own storage reads, the admissions it stores (only a row's
reader stores it), and its ``PEER`` rows, read at the same step by another local rank and
taken from the host's staging rows (``stage_rows``/``stage_at``, ``peer_rows``/``peer_at``).
:meth:`~NodeWindow.refill_at` is the host's buffer state (every local rank fills its share).

Where the sampler fixes each rank's batch, the host's buffer is planned in parts
(solar/schedule/nodeparts.py): each local rank draws only its own batches and posts them, one
section per part; plans its part from every local rank's section of it; posts the part; and
puts its view of the epoch together from every part (solar/schedule/nodeview.py). Otherwise
(a sampler with affinity: every host planned at once, as the split of a global batch needs;
or rank 0 saving snapshots) local rank 0 plans and publishes each epoch's host part and the
host's other ranks map it. What they exchange is bytes in sealed memfds
(solar/schedule/hostpayload.py) named in rounds of a communicator the planning thread owns
(solar/host/exchange.py; the planners that take part: solar/schedule/hostplanners.py): every
local rank makes the same rounds in the same order, so a jump forward plans on (every epoch, on
every local rank alike) and a jump back (with snapshots, also one past the next epoch), or a
close, first stops the host's planning threads together, decided alike on every local rank
from the epoch served. A rank failing alone closes alone (``close(abandon=True)``). Without the
host's communicator (one rank per host, a test) a rank plans its host itself: the plan is a
pure function of the inputs, the same either way. With equal batches on several hosts,
:meth:`~NodeWindow.transfer` is the rank's exchange of the host's surplus rows with other hosts'
ranks (solar/schedule/nodeequal.py). With a tier, the step's tier hits and tier writes too, its
updates cut into the host's phases where the host updates a cell twice
(:func:`~solar.schedule.nodeplan.host_phases`). (A node plan file is read by
solar/schedule/nodefile.py's subclass.) A jump back replans from epoch 0, or, given a directory
of node planner snapshots (rank 0 saves one after each epoch it plans, of every host:
solar/schedule/snapshot.py), from the newest one of this grouping at or before the epoch.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from solar.errors import CorruptPlanError, SolarError
from solar.host.exchange import Interrupted
from solar.schedule import hostpayload as payload
from solar.schedule import snapshot
from solar.schedule._common import ADMIT, DEMOTE, HIT, PEER, SIDE, TADMIT, THIT, tier_slot_count
from solar.schedule.grouping import Hosts, NodeEpoch
from solar.schedule.hostplanners import Checks, EpochReader, PartPlanner, exchange_of
from solar.schedule.hostrun import host_parts, node_spec
from solar.schedule.nodeequal import node_transfer
from solar.schedule.nodeplan import NodePlanner, host_phases
from solar.schedule.rankplan import RankPlan, StepPlan
from solar.schedule.snapshot import save_or_warn
from solar.schedule.spec import PlanSpec
from solar.schedule.stream import EpochsAhead
from solar.schedule.transfer import Transfer


class NodeWindow:
    """Consecutive epochs of the node plan, from epoch ``first``, seen by rank ``rank``;
    ``initial``: the host's buffer (sample per slot) as they start (None: empty)."""

    def __init__(self, stream: NodeStream, parts: list[NodeEpoch], first: int,
                 initial: np.ndarray | None, complete: bool) -> None:  # fmt: skip
        self.stream, self.parts, self.initial, self.complete = stream, parts, initial, complete
        self.spe = stream.spe
        self.first_step = first * self.spe
        self.end_step = self.first_step + len(parts) * self.spe
        self._host: RankPlan | None = None

    def host_plan(self) -> RankPlan:
        """The host's buffer plan over the window (its decisions, the host as one rank)."""
        if self._host is None:
            s = self.stream
            self._host = RankPlan.from_parts(
                s.host, [ne.host.rank(s.host) for ne in self.parts], s.slots,
                first_step=self.first_step, initial=self.initial, complete=self.complete,
                tier_slots=s.tier_slots,
            )  # fmt: skip
        return self._host

    def step(self, k: int) -> StepPlan:
        """Rank's step ``k``: its accesses in service order, then its side rows."""
        if not self.first_step <= k < self.end_step:
            raise IndexError(f"step {k} is outside steps {self.first_step}..{self.end_step - 1}")
        s = self.stream
        e, t = divmod(k - self.first_step, self.spe)
        ne = self.parts[e]
        ranks, so = ne.ranks, ne.ranks.step_offsets

        def span(q: int) -> slice:
            lo = ranks.rank_offsets[q]
            return slice(int(lo + so[q, t]), int(lo + so[q, t + 1]))

        # The host's staging rows of the step: its accesses some local rank takes as PEER, in
        # sample order (every local rank computes the same, or takes the published ones).
        if ne.staged is not None:
            shared = ne.staged[1][ne.staged[0][t] : ne.staged[0][t + 1]]
        else:
            taken = [ne.at[span(q)][(ranks.flags[span(q)] & PEER) != 0] for q in s.group]
            shared = np.unique(np.concatenate(taken))
        if shared.size > s.stage_rows:
            raise SolarError(f"node buffer: step {k} shares {shared.size} rows between local "
                             f"ranks, more than the {s.stage_rows} staging rows made for a "
                             "batch of at most the sampler's bound")  # fmt: skip
        mine = span(s.rank)
        f, at = ranks.flags[mine], ne.at[mine]
        x, slot = ranks.sample[mine].astype(np.int64), ranks.slot[mine].astype(np.int64)
        if np.any(f & (THIT | TADMIT | DEMOTE)) and not s.tier_slots:
            raise CorruptPlanError(f"node plan: step {k} uses a tier the node does not have")
        side = (f & SIDE) != 0
        served = int(np.count_nonzero(~side))
        if np.any(side[:served]):
            raise CorruptPlanError(f"node plan: step {k}'s side rows do not follow its batch")
        hit, peer, admit = (f & HIT) != 0, (f & PEER) != 0, (f & ADMIT) != 0
        thit = (f & THIT) != 0
        own = ~(hit | thit | peer)
        rows = np.arange(f.size, dtype=np.int64)
        stage = own & np.isin(at, shared)
        tier: dict = {}
        if s.tier_slots:
            tslot = ranks.tslot[mine].astype(np.int64)
            demote, tadmit = (f & DEMOTE) != 0, (f & TADMIT) != 0
            tier = dict(tier_rows=rows[thit], tier_slots=tslot[thit], demote_slots=slot[demote],
                        demote_tslots=tslot[demote], tadmit_rows=rows[tadmit],
                        tadmit_tslots=tslot[tadmit])  # fmt: skip
            # The host's phases: where it updates a cell twice, in turn.
            u = self._host_updates(t, ne)
            phase, waits = host_phases(u[:, 1], u[:, 3], u[:, 4], u[:, 5])
            if waits.size > 1:
                of = np.full(f.size, -1, np.int64)
                me = u[:, 1] == s.local
                of[u[me, 2]] = phase[me]
                tier.update(phase_waits=waits, demote_phase=of[demote], admit_phase=of[admit],
                            tadmit_phase=of[tadmit])  # fmt: skip
        peer_at = np.searchsorted(shared, at[peer]).astype(np.int64)
        stage_at = np.searchsorted(shared, at[stage]).astype(np.int64)
        if ne.staged is not None and not (_found(shared, peer_at, at[peer])
                                          and _found(shared, stage_at, at[stage])):  # fmt: skip
            raise CorruptPlanError(f"node plan (shared epoch): step {k}'s staging set does not "
                                   "hold the rows its ranks stage and take")  # fmt: skip
        return StepPlan(
            k, x[:served], rows[own & ~side], rows[hit], slot[hit], rows[admit], slot[admit],
            side_samples=x[side], stage_rows=rows[stage], stage_at=stage_at,
            peer_rows=rows[peer], peer_at=peer_at, **tier,
        )  # fmt: skip

    def _host_updates(self, t: int, ne: NodeEpoch) -> np.ndarray:
        """The host's buffer and tier updates at local step ``t`` of ``ne``, in the host's
        access order: rows ``(at, local rank, access, flags, slot, tslot)`` (access: its
        index in that rank's step), int64."""
        ranks, so = ne.ranks, ne.ranks.step_offsets
        parts = []
        for q, r in enumerate(self.stream.group):
            lo = ranks.rank_offsets[r]
            a, b = int(lo + so[r, t]), int(lo + so[r, t + 1])
            j = np.flatnonzero(ranks.flags[a:b] & (ADMIT | TADMIT | DEMOTE))
            parts.append(np.stack([ne.at[a + j], np.full(j.size, q), j, ranks.flags[a + j],
                                   ranks.slot[a + j], ranks.tslot[a + j]], axis=1))  # fmt: skip
        out = np.concatenate(parts).astype(np.int64)
        return out[np.argsort(out[:, 0], kind="stable")]

    def transfer(self, k: int) -> Transfer | None:
        """With equal batches on several hosts, step ``k``'s exchange: the rows this rank
        serves over its share go to ranks of other hosts (solar/schedule/nodeequal.py); else
        None."""
        if not self.stream.spec.equal_batches:
            return None
        if not self.first_step <= k < self.end_step:
            raise IndexError(f"step {k} is outside steps {self.first_step}..{self.end_step - 1}")
        e, t = divmod(k - self.first_step, self.spe)
        ne = self.parts[e]
        so = ne.ranks.step_offsets if ne.all_steps is None else ne.all_steps
        return node_transfer(so, t, self.stream.rank, ne.hosts.count)

    def step_actions(self, k: int) -> list[tuple[int, int, int]]:
        """(Never asked: a node step is never ``in_order``; where its host updates a cell
        twice, its phases order the updates.)"""
        raise SolarError("node buffer: no step is applied access by access")

    def contents_at(self, k: int) -> np.ndarray:
        """The host's buffer at the start of step ``k`` (sample per slot, -1: empty)."""
        return self.host_plan().contents_at(k)

    def refill_at(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(slots, samples)`` the host's buffer must hold to start at step ``k``."""
        return self.host_plan().refill_at(k)


class NodeStream(EpochsAhead):
    """Rank ``rank``'s share of its host's node plan of ``spec``'s run (ranks grouped by
    ``hosts``), planned epoch by epoch in the background. ``stage_rows``: the host's staging
    rows (rows one local rank reads for others at a step, at most)."""

    plan = None  # (NodeFileStream's: a node plan file)
    _thread_name = "solar-nodeplan"

    def __init__(self, spec: PlanSpec, rank: int, hosts: Hosts, stage_rows: int,
                 snapshots: str | os.PathLike | None = None, comm: Any = None) -> None:  # fmt: skip
        self.spec, self.rank, self.hosts = spec, rank, hosts
        self.snapshots = snapshots  # a directory of node planner snapshots (rank 0 writes)
        self.host = hosts.host_of(rank)
        self.group = hosts.groups[self.host]
        self.local = self.group.index(rank)
        host_spec = node_spec(spec, hosts, host=self.host)
        self.slots = host_spec.slots
        self.tier_slots = tier_slot_count(host_spec.run, host_spec.buffer)
        self.stage_rows = max(1, int(stage_rows))
        self.spe = int(spec.run.steps_per_epoch)
        self.wait_seconds = 0.0
        self.pid = os.getpid()  # the process that joined its host (a forked child cannot)
        # With the host's communicator, the exchange of the host's ranks (a collective now,
        # in the foreground; solar/host/exchange.py), and what names this run's payloads.
        self.exchange = exchange_of(comm, hosts, self.host, self.local, self._saves())
        tag = payload.digest(spec.fingerprint, hosts, self.host)
        # Whether a rank of this host saves node planner snapshots (the host's ranks decide
        # alike how its plan is made).
        self.host_saves = self._saves() if self.exchange is None else any(self.exchange.extras)
        # A buffer in parts (solar/schedule/nodeparts.py) with the exchange: every local rank
        # plans its part from the ranks' draws (on the host of a rank saving snapshots, that
        # rank plans every host's every part and its host's ranks take its epochs: they hold
        # every host's state).
        self.parts = host_parts(host_spec, hosts, self.host)
        # How this rank checks its host's ranks' payloads.
        self.check = Checks(hosts, self.host, rank, self.spe, spec.run.num_samples, self.slots,
                            self.tier_slots, tag, self.parts)  # fmt: skip
        self.parted = self.exchange is not None and self.parts is not None and not self.host_saves
        self._barrier: Any = None  # the host's barrier, once watched (watch)
        self._reset()

    def _reset(self) -> None:
        self._reset_planning()
        self._parts: list[NodeEpoch] = []
        self._first = 0
        self._initial: np.ndarray | None = None
        self._window: NodeWindow | None = None

    def __getstate__(self) -> dict:
        keep = ("spec", "rank", "hosts", "host", "group", "local", "slots", "tier_slots",
                "stage_rows", "spe", "wait_seconds", "snapshots", "pid", "parts",
                "check")  # fmt: skip
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.exchange, self.parted = None, False  # (a copy plans its host itself)
        self._barrier = None
        self._reset()

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

    def _saves(self) -> bool:
        """Whether this rank saves node planner snapshots (rank 0, given a directory)."""
        return self.snapshots is not None and self.rank == 0

    def _reads_epochs(self) -> bool:
        """Whether this rank takes its host's epochs from local rank 0 (plans nothing)."""
        return self.exchange is not None and self.local != 0 and not self.parted

    def _new_planner(self) -> NodePlanner | EpochReader | PartPlanner:
        """A node planner from epoch 0: of this rank's host alone, unless it saves snapshots
        (they hold every host's state); a reader of local rank 0's epochs on the others; with
        a buffer in parts, of this rank's part, from the draws its host's ranks post."""
        if self._reads_epochs():
            assert self.exchange is not None
            return EpochReader(self.exchange, self.check)
        if self.parted:
            assert self.exchange is not None and self.parts is not None
            return PartPlanner(self.spec, self.hosts, self.rank, self.exchange, self.parts,
                               self.drawn.own, self.check)  # fmt: skip
        return NodePlanner(self.spec, self.hosts, only_host=None if self._saves() else self.host,
                           source=self.drawn.source)  # fmt: skip

    def _next_epoch(self, planner: NodePlanner | EpochReader | PartPlanner) -> NodeEpoch:
        """Plan the next epoch (in the background thread), or take local rank 0's; local rank
        0 publishes it, rank 0 saves a snapshot. With a buffer in parts every local rank
        plans and posts its part, then takes every part."""
        if isinstance(planner, EpochReader | PartPlanner):
            return planner.next()
        if self.exchange is None:
            part = planner.next()
        else:
            contents = planner.planner.contents(self.host)
            ne = planner.next()
            data = payload.pack(ne, self.host, np.asarray(contents, np.int64), self.check.tag)
            got = self.exchange.post(payload.WHOLE, ne.epoch, data)
            # Local rank 0 keeps its part, as the others.
            part = self.check.epoch(self.exchange, got[0], ne.epoch)
        if self._saves() and planner.only_host is None:
            snapshots = self.snapshots
            assert snapshots is not None
            save_or_warn(lambda: snapshot.save(snapshots, planner), "node planner snapshot")
        return part

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
        self._in_child()  # (before deciding: a forked child never stops its parent's host)
        if self.exchange is None:
            super()._reach(e)
        elif self._restarts(e) or self._bg.get().planner is None:
            self._restart_at(e)  # (whatever this rank's window holds: its peers' may differ)
        else:
            self._advance(e)

    def _restart_at(self, epoch: int) -> None:
        """Replan up to ``epoch`` (from where the planner is, if not past it; else from 0)."""
        t0 = time.perf_counter()
        p: Any = None  # (a NodePlanner or EpochReader)
        if self.exchange is not None:  # a jump back: the host's planning threads stop first
            self._stop(epoch)
        if not self.parted:  # (a part's planner is never resumed: see _stop)
            p = self._settled_planner()
        at = -1 if p is None or p.epoch > epoch else p.epoch
        if (
            at < epoch
            and self.snapshots is not None
            and not self._reads_epochs()
            and not self.parted
        ):  # nearer (a part's planner replans: snapshots are whole)
            node = functools.partial(NodePlanner, self.spec, self.hosts)
            p = snapshot.load(self.snapshots, self.spec, epoch, at, self.hosts, node) or p
            at = -1 if p is None or p.epoch > epoch else p.epoch
        if p is None or at < 0:
            p = self._new_planner()
        self._bg.get().planner = p
        while p.epoch < epoch:
            p.planner.skip()
        self._first = epoch
        if self.exchange is None:
            self._initial = p.planner.contents(self.host)
            self._parts = [self._next_epoch(p)]
        else:  # the contents as the epoch starts come with it
            self._parts = [self._next_epoch(p)]
            self._initial = self._parts[0].initial
        self._window = None
        self.wait_seconds += time.perf_counter() - t0
        self._submit()

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

    def _new_planning(self) -> Any:
        self._in_child()
        return super()._new_planning()

    def _in_child(self) -> None:
        """In a forked child, drop the exchange (its parent's): it plans its host itself."""
        if os.getpid() != self.pid:
            self.exchange, self.parted = None, False

    def _collect(self, wait: bool) -> bool:
        bg = self._bg.get()
        if wait and bg.future is not None and self.exchange is not None:
            self.exchange.wait(bg.future)  # (its peers and the host barrier checked meanwhile)
        return super()._collect(wait)

    def _stop(self, epoch: int) -> None:
        """Stop the host's planning threads together (solar/host/exchange.py) and drop the
        epoch being planned, if any: each rank's may be another (the next epoch is planned as
        soon as the last is collected). A part's planner is dropped (a restart replans)."""
        assert self.exchange is not None
        self.exchange.stop(self._join, epoch)

    def _join(self) -> None:
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
        """Stop planning: with the exchange, together with the host's ranks (a collective of
        the host's communicator: every local rank closes its stream); with ``abandon`` (an
        error path: the host's other ranks may never close), alone."""
        if self.exchange is not None and os.getpid() == self.pid:
            if abandon:
                self.exchange.abandon()
            else:
                self.exchange.close(self._join)
        super().close(abandon)

    def _initial_at(self, e: int) -> np.ndarray:
        """The host's buffer as epoch ``e`` of the window starts (taken with it from the
        exchange, or derived)."""
        initial = self._parts[e - self._first].initial
        return super()._initial_at(e) if initial is None else initial

    def _current(self) -> NodeWindow:
        if self._window is None:
            last = self._first + len(self._parts)
            self._window = NodeWindow(self, self._parts, self._first, self._initial,
                                      last == self.spec.run.epochs)  # fmt: skip
        return self._window


def _found(shared: np.ndarray, where: np.ndarray, rows: np.ndarray) -> bool:
    """Whether ``shared[where]`` is ``rows`` (a staging set received is untrusted)."""
    return not where.size or (int(where.max()) < shared.size
                              and bool(np.all(shared[where] == rows)))  # fmt: skip

"""One rank's share of its host's node plan, one epoch at a time (``Loader(share="node")``).

The node version of :class:`~solar.schedule.stream.RankStream`: a :class:`NodeStream` plans
its host's buffer (solar/schedule/nodeplan.py: Belady over the union of the host's ranks'
accesses) one epoch ahead in a background thread, and hands the runtime a :class:`NodeWindow`
whose :meth:`~NodeWindow.step` is this rank's :class:`~solar.schedule.rankplan.StepPlan`:
its hits in the node's slots, its own storage reads, the admissions it stores (only a row's
reader stores it), and its ``PEER`` rows, read at the same step by another local rank and
taken from the host's staging rows (``stage_rows``/``stage_at``, ``peer_rows``/``peer_at``).
:meth:`~NodeWindow.refill_at` is the host's buffer state (every local rank fills its share).

Local rank 0 plans its host (with a sampler with affinity, every host, as the split of a global
batch needs) and publishes each epoch's host part; the host's other ranks map it
(solar/schedule/nodeboard.py). Without the host's communicator (one rank per host, a test) a
rank plans its host itself: the plan is a pure function of the inputs, the same either way. RAM
buffer only; no plan file, no snapshots (a jump back replans from epoch 0).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from solar.errors import CorruptPlanError, SolarError
from solar.schedule._common import ADMIT, HIT, PEER, SIDE, THIT
from solar.schedule.nodeboard import BoardReader, board_of
from solar.schedule.nodeplan import Hosts, NodeEpoch, NodePlanner, node_spec
from solar.schedule.rankplan import RankPlan, StepPlan
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
        # sample order (every local rank computes the same, or takes local rank 0's).
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
        if np.any(f & THIT):
            raise CorruptPlanError(f"node plan: step {k} has a tier hit (no node tier is run)")
        side = (f & SIDE) != 0
        served = int(np.count_nonzero(~side))
        if np.any(side[:served]):
            raise CorruptPlanError(f"node plan: step {k}'s side rows do not follow its batch")
        hit, peer, admit = (f & HIT) != 0, (f & PEER) != 0, (f & ADMIT) != 0
        own = ~(hit | peer)
        rows = np.arange(f.size, dtype=np.int64)
        stage = own & np.isin(at, shared)
        peer_at = np.searchsorted(shared, at[peer]).astype(np.int64)
        stage_at = np.searchsorted(shared, at[stage]).astype(np.int64)
        if ne.staged is not None and not (_found(shared, peer_at, at[peer])
                                          and _found(shared, stage_at, at[stage])):  # fmt: skip
            raise CorruptPlanError(f"node plan (shared epoch): step {k}'s staging set does not "
                                   "hold the rows its ranks stage and take")  # fmt: skip
        return StepPlan(
            k, x[:served], rows[own & ~side], rows[hit], slot[hit], rows[admit], slot[admit],
            side_samples=x[side], stage_rows=rows[stage], stage_at=stage_at,
            peer_rows=rows[peer], peer_at=peer_at,
        )  # fmt: skip

    def transfer(self, k: int) -> Transfer | None:
        """No exchange of rows (a node buffer runs without equal batches)."""
        return None

    def step_actions(self, k: int) -> list[tuple[int, int, int]]:
        """(Never asked: without a tier no step applies its updates in order.)"""
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

    plan = None  # never a plan file
    tier_slots = 0
    _thread_name = "solar-nodeplan"

    def __init__(self, spec: PlanSpec, rank: int, hosts: Hosts, stage_rows: int,
                 comm: Any = None) -> None:  # fmt: skip
        self.spec, self.rank, self.hosts = spec, rank, hosts
        self.host = hosts.host_of(rank)
        self.group = hosts.groups[self.host]
        self.local = self.group.index(rank)
        self.slots = node_spec(spec, hosts, host=self.host).slots
        self.stage_rows = max(1, int(stage_rows))
        self.spe = int(spec.run.steps_per_epoch)
        self.wait_seconds = 0.0
        # With the host's communicator: local rank 0 plans, the others map its epochs (a
        # collective now, in the foreground; solar/schedule/nodeboard.py).
        self.board = board_of(comm, spec, hosts, self.host, rank)
        self._reset()

    def _reset(self) -> None:
        self._reset_planning()
        self._parts: list[NodeEpoch] = []
        self._first = 0
        self._initial: np.ndarray | None = None
        self._window: NodeWindow | None = None

    def __getstate__(self) -> dict:
        keep = ("spec", "rank", "hosts", "host", "group", "local", "slots", "stage_rows", "spe",
                "wait_seconds")  # fmt: skip
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.board = None  # (a copy plans its host itself)
        self._reset()

    def _new_planner(self) -> NodePlanner | BoardReader:
        if self.board is not None and not self.board.publisher:
            return BoardReader(self.board, self._unpack)
        return NodePlanner(self.spec, self.hosts, only_host=self.host)

    def _next_epoch(self, planner: NodePlanner | BoardReader) -> NodeEpoch:
        if self.board is None or isinstance(planner, BoardReader):
            return planner.next()
        contents = planner.planner.contents(self.host)
        ne = planner.next()
        self.board.publish(ne, contents)
        return self._unpack(ne.epoch)  # local rank 0 keeps its host's part, like the others

    def _unpack(self, epoch: int) -> NodeEpoch:
        assert self.board is not None
        return self.board.epoch(epoch, self.spec.run.num_samples, self.slots)

    def start(self) -> None:
        """Begin planning the first epoch in the background, unless planning has begun."""
        bg = self._bg.get()
        if bg.planner is None and not self._parts:
            bg.planner = self._new_planner()
            self._submit()

    def _restart_at(self, epoch: int) -> None:
        """Replan up to ``epoch`` (from where the planner is, if not past it; else from 0)."""
        t0 = time.perf_counter()
        p = self._settled_planner()
        if p is None or p.epoch > epoch:
            p = self._bg.get().planner = self._new_planner()
        while p.epoch < epoch:
            p.planner.skip()
        self._first = epoch
        if self.board is None:
            self._initial = p.planner.contents(self.host)
            self._parts = [p.next()]
        else:  # the contents as the epoch starts come with it
            self._parts = [self._next_epoch(p)]
            self._initial = self._parts[0].initial
        self._window = None
        self.wait_seconds += time.perf_counter() - t0
        self._submit()

    def close(self) -> None:
        """Stop planning (a rank waiting for local rank 0's epoch stops waiting)."""
        if self.board is not None:
            self.board.closed = True
        super().close()
        if self.board is not None:
            self.board.close()

    @property
    def planned_end(self) -> int:
        """The first global step not yet planned (without waiting)."""
        self._collect(wait=False)
        return (self._first + len(self._parts)) * self.spe

    def window(self, k: int, trim: bool = True) -> NodeWindow:
        """A window of the plan that holds global step ``k`` (planned now if it must be); with
        ``trim``, the epochs before k's are dropped."""
        e = k // self.spe
        end = self._first + len(self._parts)
        if self._first <= e < end:
            self._collect(wait=False)
        elif not (e == end and self._bg.get().future is not None and self._collect(wait=True)):
            self._restart_at(e)
        if trim and e > self._first:
            ne = self._parts[e - self._first]
            self._initial = ne.initial if ne.initial is not None else \
                self._current().contents_at(e * self.spe)  # fmt: skip
            self._parts = self._parts[e - self._first :]
            self._first = e
            self._window = None
        return self._current()

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


def stage_bound(spec: PlanSpec, hosts: Hosts) -> int:
    """Staging rows a host needs at most: a shared row is needed by two local ranks or more,
    each rank's step has at most the sampler's bound of distinct ids."""
    return max(1, hosts.local * spec.sampler.batch_bound(spec.run) // 2)

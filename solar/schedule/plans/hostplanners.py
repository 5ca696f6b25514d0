"""The planners a :class:`~solar.schedule.plans.stream.RankStream` of a host's share drives where
its host's ranks exchange their plans (solar/host/exchange.py): an :class:`EpochReader` takes local
rank 0's epochs; a :class:`PartPlanner` plans this rank's part of the host's buffer from every
local rank's draws and puts its view of the host's epoch together from every part; each built
with its collaborators (the exchange, the parts, the checks of what peers post:
:class:`Checks`). And the exchange itself, made by the host's ranks together
(:func:`exchange_of`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from solar.errors import CorruptPlanError, SolarError
from solar.host.exchange import HostExchange
from solar.schedule.draw.draws import EpochDraws
from solar.schedule.keep.grouping import HostEpoch, Hosts
from solar.schedule.keep.hostparts import Parts
from solar.schedule.keep.hostplan import HostPlanner
from solar.schedule.plans import hostpayload as payload
from solar.schedule.plans.hostview import assemble
from solar.schedule.spec import PlanSpec


@dataclass(frozen=True)
class Checks:
    """How rank ``rank`` of host ``host`` checks what its host's ranks post (payloads are
    untrusted: solar/schedule/plans/hostpayload.py): the run's ``steps`` per epoch and
    ``num_samples``, the host's ``slots`` and ``tier`` cells, the run's ``tag``, the buffer's
    ``parts`` (None: planned whole)."""

    hosts: Hosts
    host: int
    rank: int
    steps: int
    num_samples: int
    slots: int
    tier: int
    tag: tuple[int, int]
    parts: Parts | None = None

    def epoch(self, ex: HostExchange, rec: np.ndarray | None, epoch: int) -> HostEpoch:
        """Epoch ``epoch`` of this host's plan, from local rank 0's record ``rec``."""
        if rec is None:
            raise CorruptPlanError(f"host plan: local rank 0 posted no epoch {epoch}")
        return payload.unpack(ex.open(rec), epoch=epoch, hosts=self.hosts, host=self.host,
                              rank=self.rank, steps=self.steps, num_samples=self.num_samples,
                              slots=self.slots, tier=self.tier, tag=self.tag)  # fmt: skip

    def part(self, ex: HostExchange, rec: np.ndarray | None, epoch: int, j: int) -> HostEpoch:
        """Part ``j`` of the host's buffer at ``epoch``, from the record of the local rank that
        plans it (its cells, this rank's rows of that part)."""
        parts = self.parts
        assert parts is not None
        if rec is None:
            raise CorruptPlanError(f"host plan: local rank {j} posted no part of epoch {epoch}")
        return payload.unpack_part(ex.open(rec), epoch=epoch, hosts=self.hosts, host=self.host,
                                   rank=self.rank, steps=self.steps, num_samples=self.num_samples,
                                   layout=parts, part=j, slots=parts.size(self.slots, j),
                                   tier=parts.size(self.tier, j), tag=self.tag)  # fmt: skip

    def draws(self, ex: HostExchange, rec: np.ndarray | None, epoch: int, r: int,
              part: int) -> EpochDraws:  # fmt: skip
        """Part ``part``'s section of rank ``r``'s draws of ``epoch``, from its record."""
        assert self.parts is not None
        if rec is None:
            raise CorruptPlanError(f"host plan: rank {r} posted no draws of epoch {epoch}")
        return payload.unpack_draws(ex.open(rec), epoch=epoch, rank=r, steps=self.steps,
                                    layout=self.parts, part=part, num_samples=self.num_samples,
                                    tag=self.tag)  # fmt: skip


class EpochReader:
    """A planner's stand-in on the host's other ranks: its epochs are local rank 0's, taken in
    the exchange's rounds (the stream drives it as it drives a :class:`HostPlanner`)."""

    def __init__(self, ex: HostExchange, check: Checks) -> None:
        self.ex, self.check = ex, check
        self.epoch = 0
        self.planner = self  # (the stream skips epochs and asks contents through .planner)

    def skip(self) -> None:
        """Go past an epoch without taking it (local rank 0 skips it too)."""
        self.epoch += 1

    def next(self) -> HostEpoch:
        """The next epoch, as local rank 0 published it (a round: waits for it)."""
        ne = self.check.epoch(self.ex, self.ex.post(payload.WHOLE, self.epoch)[0], self.epoch)
        self.epoch += 1
        return ne


class PartPlanner:
    """Rank ``rank``'s planner of its part of its host's buffer (``parts``:
    solar/schedule/keep/hostparts.py) and the draws it plans from: every local rank's, exchanged
    an epoch at a time in epoch order over ``ex`` (each rank draws its own batches, ``own``,
    and posts them, one section per part), as far ahead as the planner looks before each
    epoch is planned (so that every local rank makes the same rounds in the same order). Each
    epoch it plans its part, posts it, takes every part (checked by ``check``) and puts its
    rank's view together (solar/schedule/plans/hostview.py). One per start or restart (a restart
    stops the exchange's rounds first: solar/host/exchange.py)."""

    def __init__(self, spec: PlanSpec, hosts: Hosts, rank: int, ex: HostExchange, parts: Parts,
                 own: Callable[[int], EpochDraws], check: Checks) -> None:  # fmt: skip
        self.spec, self.rank, self.ex, self.parts, self.own, self.check = \
            spec, rank, ex, parts, own, check  # fmt: skip
        self.host = hosts.host_of(rank)
        self.group = list(hosts.groups[self.host])
        self.local = self.group.index(rank)
        self._drawn: dict[tuple[int, int], EpochDraws] = {}
        self._lock = threading.Lock()
        self._through = -1  # draws exchanged through this epoch
        self._planned = -1  # the last epoch planned: its draws are never asked again
        self.node = HostPlanner(spec, hosts, only_host=self.host, part=self.local,
                                source=self.draws)  # fmt: skip
        self.horizon = max(int(getattr(p.order, "horizon", 0)) for p in self.node.planner.planners)
        self.planner = self  # (the stream skips epochs and asks contents through .planner)

    @property
    def epoch(self) -> int:
        return self.node.epoch

    def contents(self, host: int) -> np.ndarray:
        """This part's cells before the next epoch (numbered within the part)."""
        return self.node.planner.contents(host)

    def skip(self) -> None:
        """Plan the next epoch, post nothing (every rank of the host skips it too)."""
        self._ahead()
        self.node.planner.skip()
        self._planned_through(self.node.epoch - 1)

    def _ahead(self) -> None:
        """Exchange the draws the planner may look at as it plans its next epoch."""
        end = min(self.epoch + self.horizon, self.spec.run.epochs - 1)
        with self._lock:
            self._exchange_through(end)

    def draws(self, epoch: int, r: int) -> EpochDraws:
        """Rank ``r``'s draws of ``epoch`` that this part needs (exchanged before the epoch
        the planner plans, or now, in order). Kept until the epoch is planned: the planner asks
        an epoch's as it looks ahead and again as it plans it."""
        with self._lock:  # (the planner draws two epochs at once, on two threads)
            if epoch <= self._planned:
                raise SolarError(f"host plan: draws of epoch {epoch} asked again after it was "
                                 "planned")  # fmt: skip
            self._exchange_through(epoch)
            return self._drawn[(epoch, r)]

    def _exchange_through(self, epoch: int) -> None:
        """The host's ranks' draws of every epoch through ``epoch``, one round each."""
        while self._through < epoch:
            k = self._through + 1
            mine = self.parts.split(self.own(k))  # kept: the runtime serves it
            got = self.ex.post(payload.DRAWS, k,
                               payload.pack_draws(mine, k, self.rank, self.check.tag))  # fmt: skip
            for q, r in enumerate(self.group):
                self._drawn[(k, r)] = mine[q] if q == self.local else \
                    self.check.draws(self.ex, got[q], k, r, self.local)  # fmt: skip
            self._through = k

    def _planned_through(self, epoch: int) -> None:
        with self._lock:
            self._planned = epoch
            for k in [k for k in self._drawn if k[0] <= epoch]:
                del self._drawn[k]

    def next(self) -> HostEpoch:
        """Plan this part's next epoch, post it, and return this rank's view of the host's."""
        self._ahead()
        contents = self.contents(self.host)
        mine = self.node.next()
        self._planned_through(mine.epoch)
        data = payload.pack(mine, self.host, np.asarray(contents, np.int64), self.check.tag,
                            self.local)  # fmt: skip
        got = self.ex.post(payload.PART, mine.epoch, data)
        views = [self.check.part(self.ex, got[j], mine.epoch, j) for j in range(self.parts.count)]
        return assemble(views, self.rank, self.group, self.parts, self.check.slots,
                        self.check.tier)  # fmt: skip


def exchange_of(comm: Any, hosts: Hosts, host: int, local: int,
                 saves: bool) -> HostExchange | None:  # fmt: skip
    """The exchange of this rank's host where several ranks share it and a communicator is
    given (a collective of ``comm``), else None: the rank plans its host itself. ``saves``:
    this rank saves host planner snapshots (every local rank learns whether one does)."""
    if comm is None:
        return None
    size = len(hosts.groups[host])
    if size < 2:
        if hasattr(comm, "dup") and not hasattr(comm, "Dup"):
            comm.dup().Free()  # (torch.distributed: every rank creates every host's groups)
        return None
    return HostExchange(comm, host, local, size, int(saves), payload.KINDS)

"""The planners a :class:`~solar.schedule.nodestream.NodeStream` drives where its host's ranks
exchange their plans (solar/host/exchange.py): an :class:`EpochReader` takes local rank 0's
epochs; a :class:`PartPlanner` plans this rank's part of the host's buffer from every local
rank's draws and puts its view of the host's epoch together from every part. And the exchange
itself, made by the host's ranks together (:func:`exchange_of`)."""

from __future__ import annotations

import threading
from typing import Any, Protocol

import numpy as np

from solar.errors import CorruptPlanError, SolarError
from solar.host.exchange import HostExchange
from solar.schedule import hostpayload as payload
from solar.schedule.draws import EpochDraws
from solar.schedule.grouping import Hosts, NodeEpoch
from solar.schedule.nodeplan import NodePlanner
from solar.schedule.nodeview import assemble


class NodeStream(Protocol):
    """What the planners read of the stream that drives them (solar/schedule/nodestream.py;
    named here, not imported: that module imports this one): its place on the host, its
    exchange, parts and draws, and the check of local rank 0's payload."""

    spec: Any
    spe: int
    rank: int
    hosts: Hosts
    host: int
    group: Any
    local: int
    exchange: HostExchange | None
    parts: Any
    tag: Any
    slots: int
    tier_slots: int

    @property
    def drawn(self) -> Any: ...  # (a property of NodeStream's)

    def _unpack(self, rec: np.ndarray | None, epoch: int) -> NodeEpoch: ...


class EpochReader:
    """A planner's stand-in on the host's other ranks: its epochs are local rank 0's, taken in
    the exchange's rounds (``NodeStream`` drives it as it drives a :class:`NodePlanner`)."""

    def __init__(self, stream: NodeStream) -> None:
        self.stream = stream
        self.epoch = 0
        self.planner = self  # (NodeStream skips epochs and asks contents through .planner)

    def skip(self) -> None:
        """Go past an epoch without taking it (local rank 0 skips it too)."""
        self.epoch += 1

    def next(self) -> NodeEpoch:
        """The next epoch, as local rank 0 published it (a round: waits for it)."""
        s = self.stream
        assert s.exchange is not None
        got = s.exchange.round(payload.WHOLE, self.epoch)
        ne = s._unpack(got[0], self.epoch)
        self.epoch += 1
        return ne


class PartPlanner:
    """A local rank's planner of its part of the host's buffer (solar/schedule/nodeparts.py)
    and the draws it plans from: every local rank's, exchanged an epoch at a time in epoch
    order (each rank draws its own batches and posts them, one section per part), as far
    ahead as the planner looks before each epoch is planned (so that every local rank makes
    the same rounds in the same order). Each epoch it plans its part, posts it, takes every
    part and puts its rank's view together (solar/schedule/nodeview.py). One per start or
    restart (a restart stops the exchange's rounds first: solar/host/exchange.py)."""

    def __init__(self, stream: NodeStream) -> None:
        ex, parts = stream.exchange, stream.parts
        assert ex is not None and parts is not None
        self.stream, self.ex, self.parts = stream, ex, parts
        self._drawn: dict[tuple[int, int], EpochDraws] = {}
        self._lock = threading.Lock()
        self._through = -1  # draws exchanged through this epoch
        self._planned = -1  # the last epoch planned: its draws are never asked again
        self.node = NodePlanner(stream.spec, stream.hosts, only_host=stream.host,
                                part=stream.local, source=self.draws)  # fmt: skip
        self.horizon = max(int(getattr(p.order, "horizon", 0)) for p in self.node.planner.planners)
        self.planner = self  # (NodeStream skips epochs and asks contents through .planner)

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
        end = min(self.epoch + self.horizon, self.stream.spec.run.epochs - 1)
        with self._lock:
            self._exchange_through(end)

    def draws(self, epoch: int, r: int) -> EpochDraws:
        """Rank ``r``'s draws of ``epoch`` that this part needs (exchanged before the epoch
        the planner plans, or now, in order). Kept until the epoch is planned: the planner asks
        an epoch's as it looks ahead and again as it plans it."""
        with self._lock:  # (the planner draws two epochs at once, on two threads)
            if epoch <= self._planned:
                raise SolarError(f"node plan: draws of epoch {epoch} asked again after it was "
                                 "planned")  # fmt: skip
            self._exchange_through(epoch)
            return self._drawn[(epoch, r)]

    def _exchange_through(self, epoch: int) -> None:
        """The host's ranks' draws of every epoch through ``epoch``, one round each."""
        s = self.stream
        while self._through < epoch:
            k = self._through + 1
            mine = self.parts.split(s.drawn.own(k))  # kept: the runtime serves it
            got = self.ex.round(payload.DRAWS, k, payload.pack_draws(mine, k, s.rank, s.tag))
            for q, r in enumerate(s.group):
                if q == s.local:
                    self._drawn[(k, r)] = mine[s.local]
                    continue
                rec = got[q]
                if rec is None:
                    raise CorruptPlanError(f"node plan: rank {r} posted no draws of epoch {k}")
                self._drawn[(k, r)] = payload.unpack_draws(
                    self.ex.open(rec), epoch=k, rank=r, steps=s.spe, layout=self.parts,
                    part=s.local, num_samples=s.spec.run.num_samples, tag=s.tag,
                )  # fmt: skip
            self._through = k

    def _planned_through(self, epoch: int) -> None:
        with self._lock:
            self._planned = epoch
            for k in [k for k in self._drawn if k[0] <= epoch]:
                del self._drawn[k]

    def next(self) -> NodeEpoch:
        """Plan this part's next epoch, post it, and return this rank's view of the host's."""
        s, parts = self.stream, self.parts
        self._ahead()
        contents = self.contents(s.host)
        mine = self.node.next()
        self._planned_through(mine.epoch)
        fd = payload.pack(mine, s.host, np.asarray(contents, np.int64), s.tag, s.local)
        got = self.ex.round(payload.PART, mine.epoch, fd)
        views = [self._part(got[j], mine.epoch, j) for j in range(parts.count)]
        return assemble(views, s.rank, list(s.group), parts, s.slots, s.tier_slots)

    def _part(self, rec: np.ndarray | None, epoch: int, j: int) -> NodeEpoch:
        """Part ``j`` of the host's buffer at ``epoch``, from the payload of the local rank
        that plans it (checked: its cells, this rank's rows of that part)."""
        s, parts = self.stream, self.parts
        if rec is None:
            raise CorruptPlanError(f"node plan: local rank {j} posted no part of epoch {epoch}")
        return payload.unpack_part(self.ex.open(rec), epoch=epoch, hosts=s.hosts, host=s.host,
                           rank=s.rank, steps=s.spe, num_samples=s.spec.run.num_samples,
                           layout=parts, part=j, slots=parts.size(s.slots, j),
                           tier=parts.size(s.tier_slots, j), tag=s.tag)  # fmt: skip


def exchange_of(comm: Any, hosts: Hosts, host: int, local: int,
                 saves: bool) -> HostExchange | None:  # fmt: skip
    """The exchange of this rank's host where several ranks share it and a communicator is
    given (a collective of ``comm``), else None: the rank plans its host itself. ``saves``:
    this rank saves node planner snapshots (every local rank learns whether one does)."""
    if comm is None:
        return None
    size = len(hosts.groups[host])
    if size < 2:
        if hasattr(comm, "dup") and not hasattr(comm, "Dup"):
            comm.dup().Free()  # (torch.distributed: every rank creates every host's groups)
        return None
    return HostExchange(comm, host, local, size, int(saves), payload.KINDS)

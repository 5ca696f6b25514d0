"""A plan grouped by host streamed from its file (:class:`NodeFileStream`): the node stream
with its epochs read instead of planned. The plan itself, of any grouping, is
:class:`~solar.schedule.plan.Plan`; a plan file grouped by host is proven by
:meth:`Plan.validate <solar.schedule.plan.Plan.validate>` before any byte moves.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from solar.schedule.grouping import NodeEpoch
from solar.schedule.nodestream import NodeStream
from solar.schedule.plan import Plan
from solar.schedule.rankplan import _replay


class NodeFileStream(NodeStream):
    """:class:`~solar.schedule.nodestream.NodeStream` with its epochs read from a plan file
    grouped by host (proven safe first: :meth:`~solar.schedule.plan.Plan.validate`) instead
    of planned; the same background thread reads the next epoch while one is served."""

    def __init__(self, plan: Plan, rank: int, stage_rows: int) -> None:
        assert plan.hosts is not None
        super().__init__(plan.spec, rank, plan.hosts, stage_rows)
        self.plan = plan  # type: ignore[assignment]  # (NodeStream's is always None)

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "plan": self.plan}

    def _new_planner(self) -> Any:
        return _FileEpochs(self.plan, self.host, self.slots)  # type: ignore[arg-type]


class _FileEpochs:
    """A node plan file read as a :class:`~solar.schedule.nodeplan.NodePlanner` is used:
    ``next()`` the next epoch, ``planner.skip()`` and ``planner.contents(host)`` (the host's
    buffer as the next epoch starts, by a replay of its plan)."""

    def __init__(self, plan: Plan, host: int, slots: int) -> None:
        self.plan, self.host = plan, host
        self.epoch = 0
        self.state = np.full(slots, -1, np.int64)
        self.planner = self

    def next(self) -> NodeEpoch:
        ne = self.plan.epoch(self.epoch)
        p = ne.host.rank(self.host)
        _replay(p.sample, p.slot, p.tslot, p.flags, 0, p.sample.size, self.state.size, self.state)
        self.epoch += 1
        return ne

    def skip(self) -> None:
        self.next()

    def contents(self, host: int) -> np.ndarray:
        assert host == self.host, (host, self.host)
        return self.state.copy()

"""A plan grouped by host streamed (:class:`NodeFileStream`), the plan a Loader is given
(:func:`open_given`), and a plan's figures as ``solar plan`` reports them for one buffer per host
(:func:`node_summary`). The plan itself, of any grouping, is
:class:`~solar.schedule.plan.Plan`; a plan file grouped by host is proven by
:meth:`Plan.validate <solar.schedule.plan.Plan.validate>` before any byte moves.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from solar.errors import SolarError
from solar.schedule.grouping import NodeEpoch
from solar.schedule.nodestream import NodeStream
from solar.schedule.plan import Plan, grouping, load_plan
from solar.schedule.rankplan import _replay
from solar.schedule.summary import NodeTotals, PlanSummary, closing_lines, reads_line


def open_given(plan: Any, share: str) -> Plan | None:
    """The plan a Loader is given (None, a plan, or a file opened) of the grouping its
    ``share`` runs: per rank, or per host (``"node"``); one line refusing the other
    (``"auto"`` takes either: the plan's grouping decides)."""
    got = load_plan(plan) if isinstance(plan, (str, os.PathLike)) else plan
    where = f"plan {plan}" if isinstance(plan, (str, os.PathLike)) else "plan"
    if share == "node" and got is not None and got.hosts is None:
        raise SolarError(f'{where}: a per-rank plan (a buffer per rank); share="node" runs a '
                         "node plan file (`solar plan --share node -o FILE`)")  # fmt: skip
    if share == "rank" and got is not None and got.hosts is not None:
        raise SolarError(
            f"{where}: a node plan file (one buffer per host): pass "
            'memory=MemoryConfig(share="node"), '
            "or plan the run per rank (`solar plan` without --share node)"
        )
    return got


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


def node_summary(p: PlanSummary, path: Path | None = None) -> dict:
    """The figures ``solar plan --share node`` reports (JSON-ready) of a plan grouped by host:
    the run, the grouping, the node's totals (:func:`~solar.schedule.nodeplan.node_totals`),
    the file written."""
    spec, run = p.spec, p.spec.run
    assert p.hosts is not None and isinstance(p.stats, NodeTotals)
    s = {
        "share": "node", "policy": spec.policy, "num_samples": run.num_samples,
        "sample_bytes": spec.sample_bytes, "world_size": run.world_size,
        "batch_size": run.batch_size, "epochs": run.epochs, "buffer": spec.buffer.capacity,
        "slack": spec.buffer.slack, "steps_per_epoch": run.steps_per_epoch,
        "sampler": spec.sampler.identity() or {"kind": "shuffle"},
        **p.stats.as_dict(), "grouping": grouping(p.hosts), "plan_seconds": p.plan_seconds,
        "fingerprint": p.fingerprint,
    }  # fmt: skip
    s["bytes_read_per_epoch"] = (s["reads_per_epoch"] * spec.sample_bytes
                                 if spec.sample_bytes else None)  # fmt: skip
    if path is not None:
        s.update(out=str(path), file_bytes=path.stat().st_size)
    return s


def format_node_summary(s: dict) -> str:
    """:func:`node_summary` as ``solar plan`` prints it."""
    unit = "feature rows" if s["sampler"]["kind"] == "neighbor" else "samples"
    lines = [
        f"policy {s['policy']}, one buffer per host: N={s['num_samples']} {unit}, "
        f"P={s['world_size']}, B={s['batch_size']}, E={s['epochs']}, "
        f"{s['steps_per_epoch']} steps/epoch, {s['buffer_per_host']} {unit}/host "
        f"({s['buffer']}/rank), slack {s['slack']}",
        f"hosts {s['grouping']}",
        f"node accesses {s['accesses']} (the union of each host's ranks'), hits {s['hits']}, "
        f"reads {s['reads']}" + (f" + {s['side_reads']} page mates" if s["side_reads"] else ""),
        f"hit rate {100 * s['hit_rate']:.2f} %; rows one local rank reads for another "
        f"{s['peer_rows']}",
    ]
    lines.append(reads_line(s, unit))
    lines += closing_lines(s)
    return "\n".join(lines)

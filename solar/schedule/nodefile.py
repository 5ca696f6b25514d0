"""The node plan opened: a plan file grouped by host (solar/schedule/planfile.py, one buffer
per host: solar/schedule/nodeplan.py), written by ``solar plan --share node`` and streamed by
``Loader(planning=PlanningConfig(plan=FILE), memory=MemoryConfig(share="node"))``.

A node plan file is untrusted input like any plan file: :meth:`NodePlan.validate` proves it
(solar/schedule/nodevalidate.py, on :func:`~solar.schedule.validate.prove`'s collective) before
any byte moves; a Loader whose hosts are grouped otherwise is refused
(:meth:`NodePlan.check_hosts`).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from solar.errors import PlanMismatchError, SolarError
from solar.schedule._common import Progress
from solar.schedule.grouping import Hosts, NodeEpoch, stage_bound
from solar.schedule.hostrun import node_spec
from solar.schedule.nodeplan import node_totals
from solar.schedule.nodestream import NodeStream
from solar.schedule.nodevalidate import NodeValidator
from solar.schedule.plan import Plan, Planned, load_plan
from solar.schedule.planfile import PlanFile, PlanWriter, fingerprint
from solar.schedule.planner import epoch_order_of
from solar.schedule.rankplan import _replay
from solar.schedule.spec import PlanSpec
from solar.schedule.summary import closing_lines, reads_line
from solar.schedule.validate import Proof, prove


def grouping(hosts: Hosts) -> str:
    """``hosts`` as a user reads it: ``2x2 [[0, 1], [2, 3]]``."""
    return f"{hosts.count}x{hosts.local} {hosts.as_record()}"


def make_node_plan(spec: PlanSpec, hosts: Hosts, progress: Progress | None = None) -> NodePlan:
    """Plan ``spec``'s run with one buffer per host of ``hosts`` and keep every decision in
    memory (as :func:`~solar.schedule.plan.make_plan` does per rank). Hosts of different sizes
    are refused: each is planned alone while the loader runs, and a whole plan's epoch holds
    every host's decisions as one."""
    if not hosts.uniform:
        sizes = [len(g) for g in hosts.groups]
        raise SolarError(f"hosts {hosts.as_record()}: ranks per host differ ({sizes}); a whole "
                         "node plan (Loader.plan, solar plan --share node) needs as many ranks "
                         "on every host (the loader plans each host alone as it runs)")  # fmt: skip
    epochs: list[NodeEpoch] = []
    t0 = time.perf_counter()
    totals = node_totals(spec, hosts, sink=_counted(epochs.append, spec, progress))
    return NodePlan(spec, hosts, fingerprint(spec, hosts), totals, time.perf_counter() - t0,
                    epoch_order_of(node_spec(spec, hosts)), epochs=epochs)  # fmt: skip


def node_plan_to_file(spec: PlanSpec, hosts: Hosts, path: str | os.PathLike,
                      progress: Progress | None = None) -> NodePlan:  # fmt: skip
    """Plan ``spec``'s run with one buffer per host of ``hosts`` into a node plan file at
    ``path``, one epoch at a time (atomically: a temporary name, then a rename)."""
    t0 = time.perf_counter()
    with PlanWriter(path, spec, hosts=hosts) as writer:
        totals = node_totals(spec, hosts, sink=_counted(writer.add, spec, progress))
        writer.finish(totals, time.perf_counter() - t0)
    return load_node_plan(path)


def _counted(sink: Callable[[NodeEpoch], None], spec: PlanSpec,
             progress: Progress | None) -> Callable[[NodeEpoch], None]:  # fmt: skip
    """``sink``, telling ``progress`` each epoch's steps."""

    def add(ne: NodeEpoch) -> None:
        sink(ne)
        if progress is not None:
            progress(spec.run.steps_per_epoch)

    return add


@dataclass(frozen=True, eq=False)
class NodePlan(Planned):
    """A node plan: made in memory by :func:`make_node_plan` (``epochs``), or a node plan
    file opened by :func:`load_node_plan` (``file``), what ``Loader(planning=PlanningConfig(
    plan=FILE), memory=MemoryConfig(share="node"))`` is given. ``spec`` is the per-rank inputs
    it was made for; ``stats`` the node's totals (:func:`~solar.schedule.nodeplan.node_totals`)."""

    spec: PlanSpec
    hosts: Hosts
    fingerprint: str
    stats: dict
    plan_seconds: float
    epoch_order: np.ndarray  # (E,) int64: the node planner's
    epochs: list[NodeEpoch] | None = None  # every epoch's decisions, made in this process
    file: PlanFile | None = None  # or a plan file grouped by host, read on demand

    def check_hosts(self, hosts: Hosts) -> None:
        """Refuse a job whose ranks are grouped otherwise than the plan's, in one line."""
        if hosts != self.hosts:
            where = "plan" if self.file is None else f"plan {self.file.path}"
            raise PlanMismatchError(
                f"{where}: made for hosts {grouping(self.hosts)}, but this job's ranks are "
                f"grouped {grouping(hosts)} (by host name, or SOLAR_HOSTS)"
            )

    def epoch(self, k: int) -> NodeEpoch:
        """Epoch ``k`` of the plan (from a file: checksummed, validated only by
        :meth:`validate`)."""
        if self.epochs is not None:
            return self.epochs[k]
        assert self.file is not None
        return self.file.epoch(k)

    def validate(self, rank: int, comm: Any = None) -> None:
        """Prove a node plan file safe to execute before any byte moves (a collective with
        ``comm``: each rank proves its host's part, the ranks prove coverage together;
        without, this process proves every host's). A plan made in this process is trusted."""
        from solar import dist  # a light module: no MPI or torch import

        if self.file is None:
            return
        f, key, hosts, spec = self.file, dist.shared_key(comm), self.hosts, self.spec
        mine = hosts.host_of(rank)

        def check(alone: bool) -> Proof:
            v = NodeValidator(spec, hosts, f.epoch_order, key, stage_bound(spec, hosts),
                              None if alone else [mine])  # fmt: skip
            for k in range(spec.run.epochs):
                v.check(f.epoch(k))
            return v.mine, v.expected, None

        # One rank speaks for its host's digests.
        prove(f.path, comm, check, speaks=hosts.groups[mine][0] == rank)


def load_node_plan(path: str | os.PathLike, sampler: Any = None) -> NodePlan:
    """Open a node plan file (its header checked); a plan of a general sampler is bound to
    ``sampler`` (the one it was made with)."""
    f = PlanFile.open(path)
    if f.hosts is None:
        raise SolarError(f'plan {path}: a per-rank plan (a buffer per rank); share="node" runs '
                         "a node plan file (`solar plan --share node -o FILE`)")  # fmt: skip
    plan = _of_file(f)
    if sampler is not None:
        plan = plan.bound_to(dataclasses.replace(f.spec, sampler=sampler))
    return plan


def _of_file(f: PlanFile) -> NodePlan:
    assert f.hosts is not None
    return NodePlan(f.spec, f.hosts, f.fingerprint, f.stats, f.plan_seconds, f.epoch_order,
                    file=f)  # fmt: skip


def open_given(plan: Any, share: str) -> Plan | NodePlan | None:
    """The plan a Loader is given (None, a plan, or a file opened) of the kind its ``share``
    runs: per rank, or per node (``"node"``); one line refusing the other kind (``"auto"``
    takes either: the file's kind decides)."""
    got: Plan | NodePlan | None
    if plan is None or isinstance(plan, (Plan, NodePlan)):
        got = plan
    else:
        f = PlanFile.open(plan)
        got = load_plan(plan) if f.hosts is None else _of_file(f)
    where = f"plan {plan}" if isinstance(plan, (str, os.PathLike)) else "plan"
    if share == "node" and isinstance(got, Plan):
        raise SolarError(f'{where}: a per-rank plan (a buffer per rank); share="node" runs a '
                         "node plan file (`solar plan --share node -o FILE`)")  # fmt: skip
    if share == "rank" and isinstance(got, NodePlan):
        raise SolarError(
            f"{where}: a node plan file (one buffer per host): pass "
            'memory=MemoryConfig(share="node"), '
            "or plan the run per rank (`solar plan` without --share node)"
        )
    return got


class NodeFileStream(NodeStream):
    """:class:`~solar.schedule.nodestream.NodeStream` with its epochs read from a node plan
    file (proven safe first: :meth:`NodePlan.validate`) instead of planned; the same
    background thread reads the next epoch while one is served."""

    def __init__(self, plan: NodePlan, rank: int, stage_rows: int) -> None:
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

    def __init__(self, plan: NodePlan, host: int, slots: int) -> None:
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


def node_summary(spec: PlanSpec, hosts: Hosts, totals: dict, plan_seconds: float,
                 fingerprint: str, path: Path | None = None) -> dict:  # fmt: skip
    """The figures ``solar plan --share node`` reports (JSON-ready): the run, the grouping,
    the node's totals (:func:`~solar.schedule.nodeplan.node_totals`), the file written."""
    run = spec.run
    s = {
        "share": "node", "policy": spec.policy, "num_samples": run.num_samples,
        "sample_bytes": spec.sample_bytes, "world_size": run.world_size,
        "batch_size": run.batch_size, "epochs": run.epochs, "buffer": spec.buffer.capacity,
        "slack": spec.buffer.slack, "steps_per_epoch": run.steps_per_epoch,
        "sampler": spec.sampler.identity() or {"kind": "shuffle"},
        **totals, "grouping": grouping(hosts), "plan_seconds": plan_seconds,
        "fingerprint": fingerprint,
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

"""The node plan file: one buffer per host (solar/schedule/nodeplan.py), written by ``solar plan
--share node`` and streamed by ``Loader(plan=FILE, share="node")``.

The plan file format of solar/schedule/planfile.py (its checksums, header, layout of an epoch
section), one more kind of it: attribute ``kind="node"``, the ranks' grouping by host in the
header and in the fingerprint, and two sections per epoch::

    attrs   format="solar-plan", kind="node", format_version, spec (JSON of the per-rank
            inputs: a Loader's), hosts (JSON: the global ranks of each host, in local order),
            fingerprint (sha256 of spec, hosts and kind), stats (JSON of the node's totals),
            plan_seconds, header_checksum
    epoch_order   (E,)           int64
    checksums     (E, H + P, 16) uint8   blake2b-128 of each host's part, then each rank's
    epochs/<k>/host/...    the hosts' buffers' plan, host h as rank h of the host run (the
                           per-rank section layout: rank_offsets, step_offsets, sample, slot,
                           flags)
    epochs/<k>/ranks/...   every rank's service (:class:`~solar.schedule.nodeplan.NodeEpoch`):
                           rank_offsets, step_offsets, sample, slot, flags (with PEER), and
                           reader (int16: the global rank reading the row, -1: a hit) and at
                           (int64: the access's index into the host section's arrays)

Every rank's step offsets are in ``ranks/step_offsets``: with equal batches (in the spec) their
counts drive the exchange across hosts (solar/schedule/nodeequal.py), every rank reading them
all (each rank's checked against its checksum). The checksums are those of the sections as the
reader rebuilds them (:func:`_sections`), never of what the planner holds beside them.

A node plan file is untrusted input like any plan file: :meth:`NodePlan.validate` proves it
(solar/schedule/nodevalidate.py) before any byte moves; a Loader whose hosts are grouped
otherwise is refused (:meth:`NodePlan.check_hosts`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from solar._atomic import atomic_path
from solar.errors import CorruptPlanError, PlanMismatchError, SolarError, first_line
from solar.schedule._common import Progress, no_tier
from solar.schedule.nodeplan import Hosts, NodeEpoch, node_spec, node_totals
from solar.schedule.nodestream import NodeStream
from solar.schedule.nodevalidate import prove
from solar.schedule.order import sample_dtype
from solar.schedule.plan import Plan, load_plan
from solar.schedule.planfile import (
    FORMAT,
    Layout,
    _expect,
    _header_checksum,
    _part_checksum,
    section_layout,
)
from solar.schedule.planner import EpochPlan, epoch_order_of
from solar.schedule.rankplan import _replay
from solar.schedule.spec import FORMAT_VERSION, PlanSpec, differences, fingerprint_of
from solar.schedule.summary import closing_lines, reads_line

KIND = "node"


def kind_of(path: str | os.PathLike) -> str | None:
    """``"node"`` for a node plan file, ``"rank"`` for a per-rank one, None for anything else
    (an unreadable file too: its opener says why)."""
    try:
        with h5py.File(path, "r") as f:
            if f.attrs.get("format") != FORMAT:
                return None
            return str(f.attrs.get("kind", "rank"))
    except (OSError, ValueError, TypeError):
        return None


def node_fingerprint(spec: PlanSpec, hosts: Hosts) -> str:
    """The fingerprint of ``spec``'s node plan over ``hosts``: its inputs and the grouping."""
    return _fingerprint(spec.as_dict(), hosts.as_record())


def _fingerprint(spec: dict, hosts: list[list[int]]) -> str:
    return fingerprint_of({"spec": spec, "hosts": hosts, "kind": KIND})


def grouping(hosts: Hosts) -> str:
    """``hosts`` as a user reads it: ``2x2 [[0, 1], [2, 3]]``."""
    return f"{hosts.count}x{hosts.local} {hosts.as_record()}"


def rank_layout(spec: PlanSpec) -> Layout:
    """The ranks' section of an epoch (``epochs/<k>/ranks``): name, shape and type of each
    dataset, in the order written."""
    run = spec.run
    world, steps = run.world_size, run.steps_per_epoch
    i64 = np.dtype(np.int64)
    return {
        "rank_offsets": ((world + 1,), i64),
        "step_offsets": ((world, steps + 1), i64),
        "sample": ((-1,), sample_dtype(run.num_samples)),
        "slot": ((-1,), np.dtype(np.int32)),
        "flags": ((-1,), np.dtype(np.uint8)),
        "reader": ((-1,), np.dtype(np.int16)),
        "at": ((-1,), i64),
    }


def _service_checksum(ranks: EpochPlan, reader: np.ndarray, at: np.ndarray, r: int,
                      fingerprint: str) -> bytes:  # fmt: skip
    lo, hi = int(ranks.rank_offsets[r]), int(ranks.rank_offsets[r + 1])
    h = hashlib.blake2b(f"{fingerprint}/{ranks.epoch}/service {r}".encode(), digest_size=16)
    for arr in (ranks.step_offsets[r], ranks.sample[lo:hi], ranks.slot[lo:hi],
                ranks.flags[lo:hi], reader[lo:hi], at[lo:hi]):  # fmt: skip
        h.update(np.ascontiguousarray(arr).data)
    return h.digest()


class NodePlanWriter:
    """Streams a node plan into a temporary file beside ``path``; renamed into place on
    success (``with`` block), as :class:`~solar.schedule.planfile.PlanWriter` does."""

    def __init__(self, path: str | os.PathLike, spec: PlanSpec, hosts: Hosts) -> None:
        if spec.buffer.tier:
            raise SolarError("node plan: a node tier is not planned yet (no --tier-size)")
        self.spec, self.hosts = spec, hosts
        self.host_spec = node_spec(spec, hosts)
        self.fingerprint = node_fingerprint(spec, hosts)
        self.epoch_order = epoch_order_of(self.host_spec)  # the node planner's own
        self.host_layout, self.rank_layout = section_layout(self.host_spec), rank_layout(spec)
        run = spec.run
        self.checksums = np.zeros((run.epochs, hosts.count + run.world_size, 16), np.uint8)
        self._atomic = atomic_path(path)
        self._next = 0

    def __enter__(self) -> NodePlanWriter:
        self._tmp = self._atomic.__enter__()
        self._file = h5py.File(self._tmp, "w")
        self._file["epoch_order"] = self.epoch_order
        return self

    def add(self, ne: NodeEpoch) -> None:
        """Write the next epoch's sections."""
        assert ne.epoch == self._next, (ne.epoch, self._next)
        host = {name: getattr(ne.host, name) for name in self.host_layout}
        ranks = {name: getattr(ne.ranks, name) for name in ("rank_offsets", "step_offsets",
                                                            "slot", "flags")}  # fmt: skip
        ranks.update(sample=ne.ranks.sample.astype(self.rank_layout["sample"][1]),
                     reader=ne.reader, at=ne.at)  # fmt: skip
        where = f"node plan: epoch {ne.epoch} as planned"
        _expect(host, self.host_layout, where, SolarError)  # a section a reader refuses: a bug
        _expect(ranks, self.rank_layout, where, SolarError)
        for part, arrays in (("host", host), ("ranks", ranks)):
            g = self._file.create_group(f"epochs/{ne.epoch}/{part}")
            for name, data in arrays.items():
                g.create_dataset(name, data=data)
        # The checksums of the sections as the reader rebuilds them (not of ``ne``, whose
        # host plan may carry what the file does not hold: the planner's peer counts).
        written = _sections(ne.epoch, host, ranks, self.hosts)
        self.checksums[ne.epoch] = _checksums(written, self.fingerprint)
        self._next += 1

    def finish(self, stats: dict, plan_seconds: float) -> None:
        """Write the header; the file is renamed into place when the ``with`` block ends."""
        if self._next != self.spec.run.epochs:
            raise SolarError(f"node plan: {self._next} of {self.spec.run.epochs} epochs written")
        stats_json = json.dumps(stats, sort_keys=True)
        self._file["checksums"] = self.checksums
        self._file.attrs.update({
            "format": FORMAT, "kind": KIND, "format_version": FORMAT_VERSION,
            "fingerprint": self.fingerprint,
            "spec": json.dumps(self.spec.as_dict(), sort_keys=True),
            "hosts": json.dumps(self.hosts.as_record()), "stats": stats_json,
            "plan_seconds": plan_seconds,
            "header_checksum": _header_checksum(self.fingerprint, stats_json, self.epoch_order,
                                                self.checksums),
        })  # fmt: skip

    def __exit__(self, *exc: Any) -> None:
        self._file.close()
        self._atomic.__exit__(*exc)


def node_plan_to_file(spec: PlanSpec, hosts: Hosts, path: str | os.PathLike,
                      progress: Progress | None = None) -> NodePlan:  # fmt: skip
    """Plan ``spec``'s run with one buffer per host of ``hosts`` into a node plan file at
    ``path``, one epoch at a time (atomically: a temporary name, then a rename)."""
    import time

    t0 = time.perf_counter()
    with NodePlanWriter(path, spec, hosts) as writer:

        def add(ne: NodeEpoch) -> None:
            writer.add(ne)
            if progress is not None:
                progress(spec.run.steps_per_epoch)

        totals = node_totals(spec, hosts, sink=add)
        writer.finish(totals, time.perf_counter() - t0)
    return load_node_plan(path)


@dataclass(frozen=True, eq=False)
class NodePlanFile:
    """A node plan file whose header is proven intact (:meth:`open`); its epochs are read on
    demand, every part checked against its checksum (:meth:`read`)."""

    path: Path
    spec: PlanSpec  # the per-rank inputs (a Loader's spec)
    hosts: Hosts
    fingerprint: str
    epoch_order: np.ndarray
    stats: dict
    plan_seconds: float
    checksums: np.ndarray  # (E, H + P, 16)
    header: str

    @classmethod
    def open(cls, path: str | os.PathLike) -> NodePlanFile:
        """Read and check a node plan file's header; CorruptPlanError naming what is wrong."""
        path = Path(path)
        if not path.is_file():
            raise SolarError(f"plan {path}: no such file")
        try:
            with h5py.File(path, "r") as f:
                if f.attrs.get("format") != FORMAT or f.attrs.get("kind") != KIND:
                    raise CorruptPlanError(f"plan {path}: not a solar node plan file")
                version = int(f.attrs["format_version"])
                if version != FORMAT_VERSION:
                    raise CorruptPlanError(f"plan {path}: format version {version}, this solar "
                                           f"reads {FORMAT_VERSION}: plan again with `solar "
                                           "plan --share node`")  # fmt: skip
                fingerprint = str(f.attrs["fingerprint"])
                spec_dict = json.loads(f.attrs["spec"])
                record = json.loads(f.attrs["hosts"])
                if _fingerprint(spec_dict, record) != fingerprint:
                    raise CorruptPlanError(f"plan {path}: its fingerprint does not match its "
                                           "recorded inputs and hosts")  # fmt: skip
                spec, hosts = PlanSpec.from_dict(spec_dict), Hosts(record)
                run = spec.run
                if hosts.world != run.world_size:
                    raise CorruptPlanError(f"plan {path}: its hosts group {hosts.world} ranks, "
                                           f"its run has {run.world_size}")  # fmt: skip
                parts = hosts.count + run.world_size
                _expect(f, {"epoch_order": ((run.epochs,), np.dtype(np.int64)),
                            "checksums": ((run.epochs, parts, 16), np.dtype(np.uint8))},
                        f"plan {path}")  # fmt: skip
                stats_json = str(f.attrs["stats"])
                epoch_order = np.asarray(f["epoch_order"][()])
                checksums = np.asarray(f["checksums"][()])
                header = str(f.attrs["header_checksum"])
                if header != _header_checksum(fingerprint, stats_json, epoch_order, checksums):
                    raise CorruptPlanError(f"plan {path}: its header fails its checksum "
                                           "(corrupt file)")  # fmt: skip
                stats = json.loads(stats_json)
                seconds = float(f.attrs["plan_seconds"])
        except (OSError, KeyError, ValueError, TypeError, RuntimeError, SolarError) as exc:
            if isinstance(exc, CorruptPlanError):
                raise
            raise CorruptPlanError(f"plan {path}: unreadable or corrupt ({first_line(exc)})"
                                   ) from None  # fmt: skip
        if not np.array_equal(epoch_order, epoch_order_of(node_spec(spec, hosts))):
            raise CorruptPlanError(f"plan {path}: its epoch order is not one this run can use")
        return cls(path, spec, hosts, fingerprint, epoch_order, stats, seconds, checksums,
                   header)  # fmt: skip

    def read(self, k: int) -> NodeEpoch:
        """Epoch ``k`` whole (every host's and rank's part), each part checked against its
        checksum; offsets proven consistent, nothing else (:meth:`NodePlan.validate`)."""
        host_layout = section_layout(node_spec(self.spec, self.hosts))
        layout = rank_layout(self.spec)
        where = f"plan {self.path}: epoch {k}"
        try:
            with h5py.File(self.path, "r") as f:
                g = f[f"epochs/{k}"]
                _expect(g["host"], host_layout, where)  # shapes and types before any read
                _expect(g["ranks"], layout, where)
                h = {name: np.asarray(g["host"][name][()]) for name in host_layout}
                r = {name: np.asarray(g["ranks"][name][()]) for name in layout}
        except (OSError, KeyError, ValueError, IndexError, TypeError, RuntimeError) as exc:
            raise CorruptPlanError(f"plan {self.path}: unreadable or corrupt "
                                   f"({first_line(exc)})") from None  # fmt: skip
        _check_offsets(h, where + ", host plan")
        _check_offsets(r, where + ", ranks")
        if not (r["sample"].size == r["slot"].size == r["flags"].size == r["reader"].size
                == r["at"].size):  # fmt: skip
            raise CorruptPlanError(f"{where}: the ranks' arrays differ in length")
        ne = _sections(k, h, r, self.hosts)
        got = _checksums(ne, self.fingerprint)
        for q in range(got.shape[0]):
            if not np.array_equal(got[q], self.checksums[k, q]):
                count = self.hosts.count
                what = f"host {q}'s plan" if q < count else f"rank {q - count}'s service"
                raise CorruptPlanError(f"{where}: {what} fails its checksum (corrupt file)")
        return ne


def _sections(k: int, h: dict, r: dict, hosts: Hosts) -> NodeEpoch:
    """Epoch ``k`` from its sections' arrays (``h`` the host plan's, ``r`` the ranks'): how the
    reader rebuilds it and what the writer's checksums cover, built in one place."""
    host = EpochPlan(k, h["rank_offsets"], h["step_offsets"], h["sample"], h["slot"],
                     h["flags"], no_tier(h["sample"].size))  # fmt: skip
    ranks = EpochPlan(k, r["rank_offsets"], r["step_offsets"], r["sample"], r["slot"],
                      r["flags"], no_tier(r["sample"].size))  # fmt: skip
    return NodeEpoch(k, hosts, host, ranks, r["reader"], r["at"])


def _checksums(ne: NodeEpoch, fingerprint: str) -> np.ndarray:
    """(H + P, 16) uint8: each host's part (as a rank of the host run), then each rank's
    service."""
    count = ne.host.rank_offsets.size - 1
    world = ne.ranks.rank_offsets.size - 1
    out = np.empty((count + world, 16), np.uint8)
    for q in range(count):
        out[q] = np.frombuffer(_part_checksum(ne.host.rank(q), q, fingerprint, False), np.uint8)
    for q in range(world):
        out[count + q] = np.frombuffer(
            _service_checksum(ne.ranks, ne.reader, ne.at, q, fingerprint), np.uint8)  # fmt: skip
    return out


def _check_offsets(a: dict, where: str) -> None:
    """Offsets a part's reader slices by: rank offsets from 0 to the arrays' length, each
    part's step offsets from 0 to its length, never decreasing."""
    ro, so, n = a["rank_offsets"], a["step_offsets"], a["sample"].size
    if ro[0] != 0 or ro[-1] != n or np.any(np.diff(ro) < 0):
        raise CorruptPlanError(f"{where}: rank offsets are not monotone from 0 to {n}")
    if np.any(so[:, 0] != 0) or np.any(so[:, -1] != np.diff(ro)) or np.any(np.diff(so) < 0):
        raise CorruptPlanError(f"{where}: step offsets are not monotone within each part")


@dataclass(frozen=True, eq=False)
class NodePlan:
    """A node plan file opened (:func:`load_node_plan`): what ``Loader(plan=FILE,
    share="node")`` is given. ``spec`` is the per-rank inputs it was made for."""

    spec: PlanSpec
    file: NodePlanFile

    @property
    def hosts(self) -> Hosts:
        return self.file.hosts

    @property
    def fingerprint(self) -> str:
        return self.file.fingerprint

    @property
    def header(self) -> str:
        """The header checksum (ranks compare it)."""
        return self.file.header

    def check(self, expected: PlanSpec, source: str = "plan") -> None:
        """Refuse this plan unless it was made for ``expected`` (on its hosts); name the
        fields that differ."""
        if node_fingerprint(expected, self.hosts) == self.fingerprint:
            return
        diff = differences(self.spec, expected)
        raise PlanMismatchError(f"{source} was made for another dataset or run: {diff}")

    def bound_to(self, spec: PlanSpec) -> NodePlan:
        """This plan with ``spec`` (which holds the sampler itself) in place of the one the
        file records."""
        if node_fingerprint(spec, self.hosts) != self.fingerprint:
            raise PlanMismatchError("plan: bound to a spec it was not made for")
        return dataclasses.replace(self, spec=spec)

    def check_hosts(self, hosts: Hosts) -> None:
        """Refuse a job whose ranks are grouped otherwise than the plan's, in one line."""
        if hosts != self.hosts:
            raise PlanMismatchError(
                f"plan {self.file.path}: made for hosts {grouping(self.hosts)}, but this job's "
                f"ranks are grouped {grouping(hosts)} (by host name, or SOLAR_HOSTS)"
            )

    def epoch(self, k: int) -> NodeEpoch:
        """Epoch ``k`` of the plan, checksummed (validated only by :meth:`validate`)."""
        return self.file.read(k)

    def validate(self, rank: int, comm: Any = None) -> None:
        """Prove the plan safe to execute before any byte moves (a collective with ``comm``:
        each rank proves its host's part, the ranks prove coverage together; without, this
        process proves every host's)."""
        prove(self.spec, self.hosts, self.file, rank, comm)


def load_node_plan(path: str | os.PathLike, sampler: Any = None) -> NodePlan:
    """Open a node plan file (its header checked); a plan of a general sampler is bound to
    ``sampler`` (the one it was made with)."""
    f = NodePlanFile.open(path)
    plan = NodePlan(f.spec, f)
    if sampler is not None:
        plan = plan.bound_to(dataclasses.replace(f.spec, sampler=sampler))
    return plan


def open_given(plan: Any, share: str) -> Plan | NodePlan | None:
    """The plan a Loader is given (None, a plan, or a file opened) of the kind its ``share``
    runs: per rank, or per node (``"node"``); one line refusing the other kind (``"auto"``
    takes either: the file's kind decides)."""
    if plan is None or isinstance(plan, (Plan, NodePlan)):
        got = plan
    elif isinstance(plan, (str, os.PathLike)) and kind_of(plan) == KIND:
        got = load_node_plan(plan)
    else:
        got = load_plan(plan)
    where = f"plan {plan}" if isinstance(plan, (str, os.PathLike)) else "plan"
    if share == "node" and isinstance(got, Plan):
        raise SolarError(f'{where}: a per-rank plan (a buffer per rank); share="node" runs a '
                         "node plan file (`solar plan --share node -o FILE`)")  # fmt: skip
    if share == "rank" and isinstance(got, NodePlan):
        raise SolarError(
            f'{where}: a node plan file (one buffer per host): pass share="node", '
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

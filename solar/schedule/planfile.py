"""The plan file: its format, the writer, the reader and the checksums.

HDF5 (format version 2), readable with plain h5py, one section per epoch so that a reader takes
only the epochs it runs and a writer streams them as they are planned::

    attrs   format="solar-plan", format_version=2, fingerprint (sha256 hex of the spec),
            spec (JSON of the inputs), stats (JSON of per-rank totals), plan_seconds,
            header_checksum (blake2b of fingerprint, stats, epoch_order and checksums)
    epoch_order   (E,)        int64   permutation index used by each epoch of the run
    checksums     (E, P, 16)  uint8   blake2b-128 of each epoch's part of each rank
    epochs/<k>/rank_offsets  (P+1,)      int64  rank r's accesses are [rank_offsets[r], [r+1])
    epochs/<k>/step_offsets  (P, S+1)    int64  within rank r's part, step t of the epoch is
                                                 [step_offsets[r, t], step_offsets[r, t+1])
    epochs/<k>/sample        (N_e,)      int32 (int64 when N >= 2**31)  sample ids
    epochs/<k>/slot          (N_e,)      int32  RAM slot of the access, -1: none
    epochs/<k>/flags         (N_e,)      uint8  bit 0 HIT, 1 ADMIT, 2 RELEASE, 3 THIT, 4 TADMIT,
                                                 5 DEMOTE, 6 SIDE (with ADMIT)
    epochs/<k>/tslot         (N_e,)      int32  tier slot of the access, -1: none (only in
                                                 plans with a second tier)

With ``equal_batches`` (in the spec), rank r's checksum also covers every rank's served counts
(``step_offsets`` of all ranks), from which the exchange of rows is computed
(:mod:`solar.schedule.transfer`).

(:func:`section_layout` is the epoch section's layout in code.)

Semantics of one rank's step: its batch is its accesses of the step, in order, but for side
rows (SIDE, with page mates: ``pages`` in the spec): they follow the batch, are read from
storage with it and stored into RAM ``slot`` like an ADMIT, never served. A HIT is
gathered from RAM ``slot`` and a THIT read from tier ``tslot``, as they stand at the start of
the step; any other access is read from storage. Then, in access order: DEMOTE writes what RAM
``slot`` holds into tier ``tslot``, ADMIT stores the access's row into RAM ``slot``, TADMIT
writes it into tier ``tslot``. RELEASE marks a hit that is the sample's last use.

Grouped by host (one buffer per host, solar/schedule/nodeplan.py: ``solar plan --share node``)
the file is the plan of the host run (host h as rank h: every section above is the hosts'
buffers' plan; no tier), format version 4, and in addition::

    attrs   kind="node", hosts (JSON: the global ranks of each host, in local order); ``spec``
            holds the per-rank inputs (a Loader's), the fingerprint covers spec, hosts and
            kind, ``stats`` the node's totals (a JSON object)
    checksums     (E, H + P, 16)  each host's part (as above), then each rank's service
    epochs/<k>/ranks/...   every rank's service (:class:`~solar.schedule.grouping.NodeEpoch`):
                           rank_offsets, step_offsets (every rank's: with equal batches their
                           counts drive the exchange across hosts), sample, slot, flags (with
                           PEER), reader (int16: the global rank reading the row, -1: a hit)
                           and at (int64: the access's index into the epoch's host arrays)

The checksums of a grouped file are those of the sections as the reader rebuilds them
(:func:`_sections`), never of what the planner holds beside them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from solar._atomic import atomic_path
from solar.errors import CorruptPlanError, SolarError, first_line
from solar.schedule._common import no_tier, tier_slot_count
from solar.schedule.grouping import Hosts, NodeEpoch
from solar.schedule.hostrun import node_spec
from solar.schedule.order import sample_dtype
from solar.schedule.planner import EpochPlan, RankEpoch, epoch_order_of, peer_counts
from solar.schedule.spec import FORMAT_VERSION, PlanSpec, fingerprint_of
from solar.schedule.summary import NodeTotals, RankStats

FORMAT = "solar-plan"
GROUPED_VERSION = 4  # a plan grouped by host: version 2 and a grouping (4: stats count tier hits)
KIND = "node"  # a grouped plan's kind (one buffer per host); a per-rank plan's is "rank"

Layout = dict[str, tuple[tuple[int, ...], np.dtype]]  # dataset name -> (shape, dtype)


def section_layout(spec: PlanSpec) -> Layout:
    """The name, shape and type of every dataset of an epoch section (``epochs/<k>``), in the
    order they are written: what the writer writes and the reader demands."""
    run = spec.run
    # A sampler's trace has as many accesses per epoch as distinct ids per batch (-1: any).
    world, n = run.world_size, -1 if spec.traced else run.samples_per_epoch
    i64 = np.dtype(np.int64)
    layout = {
        "rank_offsets": ((world + 1,), i64),
        "step_offsets": ((world, run.steps_per_epoch + 1), i64),
        "sample": ((n,), sample_dtype(run.num_samples)),
        "slot": ((n,), np.dtype(np.int32)),
        "flags": ((n,), np.dtype(np.uint8)),
    }
    if tier_slot_count(run, spec.buffer):
        layout["tslot"] = ((n,), np.dtype(np.int32))
    return layout


def rank_layout(spec: PlanSpec) -> Layout:
    """A grouped plan's services of an epoch (``epochs/<k>/ranks``): name, shape and type of
    each dataset, in the order written (``spec``: the per-rank inputs)."""
    run = spec.run
    i64 = np.dtype(np.int64)
    return {
        "rank_offsets": ((run.world_size + 1,), i64),
        "step_offsets": ((run.world_size, run.steps_per_epoch + 1), i64),
        "sample": ((-1,), sample_dtype(run.num_samples)),
        "slot": ((-1,), np.dtype(np.int32)),
        "flags": ((-1,), np.dtype(np.uint8)),
        "reader": ((-1,), np.dtype(np.int16)),
        "at": ((-1,), i64),
    }


def kind_of(path: str | os.PathLike) -> str | None:
    """``"node"`` for a plan file grouped by host, ``"rank"`` for a per-rank one, None for
    anything else (an unreadable file too: its opener says why)."""
    try:
        with h5py.File(path, "r") as f:
            if f.attrs.get("format") != FORMAT:
                return None
            return KIND if "hosts" in f.attrs else "rank"
    except (OSError, ValueError, TypeError):
        return None


def fingerprint(spec: PlanSpec, hosts: Hosts | None = None) -> str:
    """The fingerprint of ``spec``'s plan, grouped by ``hosts`` if given (the grouping is then
    one of its inputs)."""
    if hosts is None:
        return spec.fingerprint
    return _fingerprint(spec.as_dict(), hosts.as_record(), KIND)


def _fingerprint(spec: dict, hosts: list[list[int]], kind: str) -> str:
    return fingerprint_of({"spec": spec, "hosts": hosts, "kind": kind})


class PlanWriter:
    """Streams a plan into a temporary file beside ``path``; renamed into place on success.
    ``epoch_order``: the planner's (default: ``spec``'s own); ``hosts``: a plan grouped by
    host (epochs added are then :class:`~solar.schedule.grouping.NodeEpoch`)."""

    def __init__(
        self,
        path: str | os.PathLike,
        spec: PlanSpec,
        epoch_order: np.ndarray | None = None,
        hosts: Hosts | None = None,
    ) -> None:
        if hosts is not None and spec.buffer.tier:
            raise SolarError("node plan: a node tier is not planned yet (no --tier-size)")
        self.spec, self.hosts = spec, hosts
        self.section_spec = spec if hosts is None else node_spec(spec, hosts)
        self.fingerprint = fingerprint(spec, hosts)
        self.epoch_order = epoch_order_of(self.section_spec) if epoch_order is None else \
            epoch_order  # fmt: skip
        self.layout = section_layout(self.section_spec)
        run = spec.run
        parts = run.world_size + (0 if hosts is None else hosts.count)
        self.checksums = np.zeros((run.epochs, parts, 16), np.uint8)
        self._atomic = atomic_path(path)
        self._next = 0

    def __enter__(self) -> PlanWriter:
        self._tmp = self._atomic.__enter__()
        self._file = h5py.File(self._tmp, "w")
        self._file["epoch_order"] = self.epoch_order
        return self

    def add(self, ep: EpochPlan | NodeEpoch) -> None:
        """Write the next epoch's section (grouped: and its services)."""
        assert ep.epoch == self._next, (ep.epoch, self._next)
        plan = ep.host if isinstance(ep, NodeEpoch) else ep
        arrays = {name: getattr(plan, name) for name in self.layout}
        # A section the reader would refuse is a bug here: fail before writing it.
        where = f"plan: epoch {ep.epoch} as planned"
        _expect(arrays, self.layout, where, SolarError)
        g = self._file.create_group(f"epochs/{ep.epoch}")
        for name, data in arrays.items():
            g.create_dataset(name, data=data)
        if isinstance(ep, NodeEpoch):
            assert self.hosts is not None
            layout = rank_layout(self.spec)
            ranks = {name: getattr(ep.ranks, name) for name in ("rank_offsets", "step_offsets",
                                                                "slot", "flags")}  # fmt: skip
            ranks.update(sample=ep.ranks.sample.astype(layout["sample"][1]), reader=ep.reader,
                         at=ep.at)  # fmt: skip
            _expect(ranks, layout, where, SolarError)
            services = g.create_group("ranks")
            for name in layout:
                services.create_dataset(name, data=ranks[name])
            written = _sections(ep.epoch, arrays, ranks, self.hosts)
            self.checksums[ep.epoch] = _checksums(written, self.fingerprint)
        else:
            fp, tier = self.spec.fingerprint, "tslot" in self.layout
            # Every rank's checksum covers every rank's counts (equal batches): taken once, not
            # once per rank (P of them, each (steps, P): most of the writing time at P=1024).
            peers = peer_counts(ep.step_offsets) if ep.equal_batches else None
            plain = dataclasses.replace(ep, equal_batches=False)
            for r in range(ep.rank_offsets.size - 1):
                part = dataclasses.replace(plain.rank(r), peers=peers)
                digest = _part_checksum(part, r, fp, tier)
                self.checksums[ep.epoch, r] = np.frombuffer(digest, np.uint8)
        self._next += 1

    def finish(self, stats: tuple[RankStats, ...] | NodeTotals, plan_seconds: float) -> None:
        """Write the header (``stats``: every rank's totals, or a grouped plan's node totals);
        the file is renamed into place when the ``with`` block ends."""
        if self._next != self.spec.run.epochs:
            raise SolarError(f"plan: {self._next} of {self.spec.run.epochs} epochs written")
        # (asdict deep-copies: slow at P=4096.) Plans without equal batches keep the records,
        # and so the header checksums, they always had.
        if isinstance(stats, NodeTotals):
            stats_json = json.dumps(stats.as_dict(), sort_keys=True)
        else:
            stats_json = json.dumps([_record(s) for s in stats])
        f = self._file
        f["checksums"] = self.checksums
        f.attrs.update(
            {
                "format": FORMAT,
                "format_version": FORMAT_VERSION if self.hosts is None else GROUPED_VERSION,
                "fingerprint": self.fingerprint,
                "spec": json.dumps(self.spec.as_dict(), sort_keys=True),
                "stats": stats_json,
                "plan_seconds": plan_seconds,
                "header_checksum": _header_checksum(
                    self.fingerprint, stats_json, self.epoch_order, self.checksums
                ),
            }
        )
        if self.hosts is not None:
            f.attrs.update({"kind": KIND, "hosts": json.dumps(self.hosts.as_record())})

    def __exit__(self, *exc: Any) -> None:
        self._file.close()
        self._atomic.__exit__(*exc)


@dataclass(frozen=True, eq=False)
class PlanFile:
    """A plan file whose header is proven intact (:meth:`open`); its epoch sections are read
    on demand, each part checked against its checksum."""

    path: Path
    spec: PlanSpec  # the per-rank inputs (grouped too: a Loader's)
    fingerprint: str
    epoch_order: np.ndarray  # (E,) int64
    stats: tuple[RankStats, ...] | NodeTotals  # grouped: the node's totals
    plan_seconds: float
    checksums: np.ndarray  # (E, P, 16) uint8; grouped (E, H + P, 16)
    header: str  # the header checksum: ranks compare it
    hosts: Hosts | None = None  # the grouping by host (None: a buffer per rank)

    @classmethod
    def open(cls, path: str | os.PathLike) -> PlanFile:
        """Read and check a plan file's header (format, fingerprint, shapes, checksum, epoch
        order); raises CorruptPlanError naming what is wrong."""
        path = Path(path)
        if not path.is_file():
            raise SolarError(f"plan {path}: no such file")
        hosts = None
        try:
            with h5py.File(path, "r") as f:
                if f.attrs.get("format") != FORMAT:
                    raise CorruptPlanError(f"plan {path}: not a solar plan file")
                grouped = "hosts" in f.attrs
                version, want = int(f.attrs["format_version"]), \
                    GROUPED_VERSION if grouped else FORMAT_VERSION  # fmt: skip
                if version != want:
                    again = "`solar plan --share node`" if grouped else "`solar plan`"
                    raise CorruptPlanError(
                        f"plan {path}: format version {version}, this solar reads {want}"
                        f"{' (grouped by host)' if grouped else ''}: plan the run again "
                        f"with {again}"
                    )
                fp = str(f.attrs["fingerprint"])
                stats_json = str(f.attrs["stats"])
                spec_dict = json.loads(f.attrs["spec"])
                if grouped:
                    record = json.loads(f.attrs["hosts"])
                    ok = _fingerprint(spec_dict, record, str(f.attrs.get("kind"))) == fp
                else:
                    ok = fingerprint_of(spec_dict) == fp
                if not ok:
                    raise CorruptPlanError(
                        f"plan {path}: its fingerprint does not match its recorded inputs"
                        + (" and hosts" if grouped else "")
                    )
                spec = PlanSpec.from_dict(spec_dict)
                run = spec.run
                parts = run.world_size
                if grouped:
                    hosts = Hosts(record)
                    if hosts.world != run.world_size:
                        raise CorruptPlanError(f"plan {path}: its hosts group {hosts.world} "
                                               f"ranks, its run has {run.world_size}")  # fmt: skip
                    parts += hosts.count
                _expect(f, {"epoch_order": ((run.epochs,), np.dtype(np.int64)),
                            "checksums": ((run.epochs, parts, 16), np.dtype(np.uint8))},
                        f"plan {path}")  # fmt: skip
                epoch_order = np.asarray(f["epoch_order"][()])
                checksums = np.asarray(f["checksums"][()])
                header = str(f.attrs["header_checksum"])
                if header != _header_checksum(fp, stats_json, epoch_order, checksums):
                    raise CorruptPlanError(
                        f"plan {path}: its header fails its checksum (corrupt file)"
                    )
                records = json.loads(stats_json)
                stats = (NodeTotals(**records) if grouped
                         else tuple(RankStats(**s) for s in records))  # fmt: skip
                seconds = float(f.attrs["plan_seconds"])
        except (OSError, KeyError, ValueError, TypeError, RuntimeError, SolarError) as exc:
            if isinstance(exc, CorruptPlanError):
                raise
            raise CorruptPlanError(
                f"plan {path}: unreadable or corrupt ({first_line(exc)})"
            ) from None
        if isinstance(stats, tuple) and len(stats) != run.world_size:
            raise CorruptPlanError(f"plan {path}: per-rank records do not match its world size")
        if not _usable_order(epoch_order, spec, hosts):
            raise CorruptPlanError(f"plan {path}: its epoch order is not one this run can use")
        return cls(path, spec, fp, epoch_order, stats, seconds, checksums, header, hosts)

    def epoch(self, k: int) -> NodeEpoch:
        """Epoch ``k`` of a plan grouped by host, whole (every host's part and every rank's
        service), each part checked against its checksum; offsets proven consistent, nothing
        else (:class:`~solar.schedule.nodevalidate.NodeValidator` proves the rest)."""
        assert self.hosts is not None
        host_layout = section_layout(node_spec(self.spec, self.hosts))
        layout = rank_layout(self.spec)
        where = f"plan {self.path}: epoch {k}"
        try:
            with h5py.File(self.path, "r") as f:
                g = f[f"epochs/{k}"]
                _expect(g, host_layout, where)  # shapes and types before any read
                _expect(g["ranks"], layout, where)
                h = {name: np.asarray(g[name][()]) for name in host_layout}
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

    def read(self, r: int, k: int) -> RankEpoch:
        """Rank ``r``'s part of run epoch ``k``, checked against its checksum."""
        with h5py.File(self.path, "r") as f:
            return self._read(f, r, k)

    def parts(self, r: int) -> Generator[RankEpoch, None, None]:
        """Rank ``r``'s part of each epoch in turn, each checked against its checksum."""
        with h5py.File(self.path, "r") as f:
            for k in range(self.spec.run.epochs):
                yield self._read(f, r, k)

    def _read(self, f: h5py.File, r: int, k: int) -> RankEpoch:
        layout = section_layout(self.spec)
        try:
            g = f[f"epochs/{k}"]
            # Shapes and types before any read: a file may claim anything.
            _expect(g, layout, f"plan {self.path}: epoch {k}")
            bounds = g["rank_offsets"][r : r + 2]
            lo, hi = int(bounds[0]), int(bounds[1])
            if not 0 <= lo <= hi <= g["sample"].shape[0]:
                raise CorruptPlanError(
                    f"plan {self.path}: epoch {k}: rank {r}'s accesses [{lo}, {hi}) "
                    "are out of range"
                )
            tslot = g["tslot"][lo:hi] if "tslot" in layout else no_tier(hi - lo)
            peers = None
            if self.spec.equal_batches:  # every rank's counts: one read, this rank's row from it
                every = g["step_offsets"][()]
                offsets, peers = every[r], peer_counts(every)
            else:
                offsets = g["step_offsets"][r]
            part = RankEpoch(k, g["sample"][lo:hi], g["slot"][lo:hi], g["flags"][lo:hi],
                             offsets, tslot, peers)  # fmt: skip
        except (OSError, KeyError, ValueError, IndexError, TypeError, RuntimeError) as exc:
            raise CorruptPlanError(
                f"plan {self.path}: unreadable or corrupt ({first_line(exc)})"
            ) from None
        digest = _part_checksum(part, r, self.fingerprint, "tslot" in layout)
        if digest != self.checksums[k, r].tobytes():
            raise CorruptPlanError(
                f"plan {self.path}: rank {r}'s data of epoch {k} fails its checksum (corrupt file)"
            )
        return part


def _usable_order(epoch_order: np.ndarray, spec: PlanSpec, hosts: Hosts | None) -> bool:
    """Whether a file's epoch order is one its run can use: a plan grouped by host, its node
    planner's; else a permutation of the epochs (the identity unless reordered)."""
    if hosts is not None:
        return np.array_equal(epoch_order, epoch_order_of(node_spec(spec, hosts)))
    identity = np.arange(spec.run.epochs)
    return epoch_order.shape == identity.shape and bool(
        np.array_equal(np.sort(epoch_order), identity)
        and (spec.reorder_epochs or np.array_equal(epoch_order, identity))
    )


def _sections(k: int, h: dict, r: dict, hosts: Hosts) -> NodeEpoch:
    """Grouped epoch ``k`` from its sections' arrays (``h`` the host plan's, ``r`` the
    services'): how the reader rebuilds it and what the writer's checksums cover, built in one
    place."""
    host = EpochPlan(k, h["rank_offsets"], h["step_offsets"], h["sample"], h["slot"],
                     h["flags"], no_tier(h["sample"].size))  # fmt: skip
    ranks = EpochPlan(k, r["rank_offsets"], r["step_offsets"], r["sample"], r["slot"],
                      r["flags"], no_tier(r["sample"].size))  # fmt: skip
    return NodeEpoch(k, hosts, host, ranks, r["reader"], r["at"])


def _checksums(ne: NodeEpoch, fp: str) -> np.ndarray:
    """(H + P, 16) uint8: each host's part (as a rank of the host run), then each rank's
    service."""
    count = ne.host.rank_offsets.size - 1
    world = ne.ranks.rank_offsets.size - 1
    out = np.empty((count + world, 16), np.uint8)
    for q in range(count):
        out[q] = np.frombuffer(_part_checksum(ne.host.rank(q), q, fp, False), np.uint8)
    for q in range(world):
        out[count + q] = np.frombuffer(_service_checksum(ne, q, fp), np.uint8)
    return out


def _service_checksum(ne: NodeEpoch, r: int, fp: str) -> bytes:
    ranks = ne.ranks
    lo, hi = int(ranks.rank_offsets[r]), int(ranks.rank_offsets[r + 1])
    h = hashlib.blake2b(f"{fp}/{ranks.epoch}/service {r}".encode(), digest_size=16)
    for arr in (ranks.step_offsets[r], ranks.sample[lo:hi], ranks.slot[lo:hi],
                ranks.flags[lo:hi], ne.reader[lo:hi], ne.at[lo:hi]):  # fmt: skip
        h.update(np.ascontiguousarray(arr).data)
    return h.digest()


def _check_offsets(a: dict, where: str) -> None:
    """Offsets a part's reader slices by: rank offsets from 0 to the arrays' length, each
    part's step offsets from 0 to its length, never decreasing."""
    ro, so, n = a["rank_offsets"], a["step_offsets"], a["sample"].size
    if ro[0] != 0 or ro[-1] != n or np.any(np.diff(ro) < 0):
        raise CorruptPlanError(f"{where}: rank offsets are not monotone from 0 to {n}")
    if np.any(so[:, 0] != 0) or np.any(so[:, -1] != np.diff(ro)) or np.any(np.diff(so) < 0):
        raise CorruptPlanError(f"{where}: step offsets are not monotone within each part")


def _record(s: RankStats) -> dict:
    """A rank's totals as recorded: rows moved only by plans that move them."""
    d = dict(vars(s))
    if not (d["sent"] or d["received"]):
        del d["sent"], d["received"]
    return d


def _expect(
    arrays: Mapping[str, Any],
    layout: Layout,
    where: str,
    error: type[SolarError] = CorruptPlanError,
) -> None:
    """Raise ``error`` unless each of ``layout``'s arrays (h5py datasets or numpy arrays) has
    its shape and type."""
    for name, (shape, dtype) in layout.items():
        d = arrays[name]
        same = len(d.shape) == len(shape) and all(
            w in (-1, h) for w, h in zip(shape, d.shape, strict=True)
        )
        if not same or d.dtype != dtype:
            raise error(
                f"{where}: {name} is {d.dtype}{list(d.shape)}, expected {dtype}{list(shape)}"
            )


def _part_checksum(part: RankEpoch, r: int, fingerprint: str, tier: bool) -> bytes:
    h = hashlib.blake2b(f"{fingerprint}/{part.epoch}/{r}".encode(), digest_size=16)
    for arr in (part.step_offsets, part.sample, part.slot, part.flags):
        h.update(np.ascontiguousarray(arr).data)
    if tier:  # (plans without one keep the checksums they always had)
        h.update(np.ascontiguousarray(part.tslot).data)
    if part.peers is not None:  # equal batches: each rank's checksum covers every rank's counts
        h.update(np.ascontiguousarray(part.peers, dtype=np.int32).data)
    return h.digest()


def _header_checksum(
    fingerprint: str, stats: str, epoch_order: np.ndarray, checksums: np.ndarray
) -> str:
    h = hashlib.blake2b(fingerprint.encode(), digest_size=16)
    h.update(stats.encode())
    h.update(np.ascontiguousarray(epoch_order, dtype=np.int64).data)
    h.update(np.ascontiguousarray(checksums, dtype=np.uint8).data)
    return h.hexdigest()

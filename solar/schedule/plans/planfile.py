"""The plan file: its format, the writer, the reader and the checksums.

HDF5 (format version 5), readable with plain h5py, one section per epoch so that a reader takes
only the epochs it runs and a writer streams them as they are planned. One format for every
grouping: a plan of Q buffers, one per rank (Q = P) or grouped by host one per host (Q = H,
host h as rank h of the host run: solar/schedule/keep/hostplan.py), the grouping a header field::

    attrs   format="solar-plan", format_version=5, fingerprint (sha256 hex of the spec; grouped,
            of spec and hosts), spec (JSON of the per-rank inputs: a Loader's), hosts (JSON: the
            global ranks of each host in local order; null: a buffer per rank), stats (JSON of
            per-rank totals; grouped, the node's totals), plan_seconds,
            header_checksum (blake2b of fingerprint, stats, epoch_order and checksums)
    epoch_order   (E,)        int64   permutation index used by each epoch of the run
    checksums     (E, Q+S, 16) uint8  blake2b-128 of each epoch's part of each buffer, then
                                      (grouped: S = P, else 0) of each rank's service
    epochs/<k>/rank_offsets  (Q+1,)      int64  buffer q's accesses are [rank_offsets[q], [q+1])
    epochs/<k>/step_offsets  (Q, S+1)    int64  within buffer q's part, step t of the epoch is
                                                 [step_offsets[q, t], step_offsets[q, t+1])
    epochs/<k>/sample        (N_e,)      int32 (int64 when N >= 2**31)  sample ids
    epochs/<k>/slot          (N_e,)      int32  RAM slot of the access, -1: none
    epochs/<k>/flags         (N_e,)      uint8  bit 0 HIT, 1 ADMIT, 2 RELEASE, 3 THIT, 4 TADMIT,
                                                 5 DEMOTE, 6 SIDE (with ADMIT)
    epochs/<k>/tslot         (N_e,)      int32  tier slot of the access, -1: none (only in
                                                 plans with a second tier)

With ``equal_batches`` (in the spec), rank r's checksum also covers every rank's served counts
(``step_offsets`` of all ranks), from which the exchange of rows is computed
(:mod:`solar.schedule.keep.transfer`).

(:func:`section_layout` is the epoch section's layout in code.) Grouped by host (no tier yet),
each epoch also holds every rank's service of its host's part
(:class:`~solar.schedule.keep.grouping.HostEpoch`)::

    epochs/<k>/ranks/...   rank_offsets, step_offsets (every rank's: with equal batches their
                           counts drive the exchange across hosts), sample, slot, flags (with
                           PEER), reader (int16: the global rank reading the row, -1: a hit)
                           and at (int64: the access's index into the epoch's host arrays)

The checksums are those of the sections as written and read back (:func:`_checksums`), never
of what the planner holds beside them.

Semantics of one rank's step: its batch is its accesses of the step, in order, but for side
rows (SIDE, with page mates: ``pages`` in the spec): they follow the batch, are read from
storage with it and stored into RAM ``slot`` like an ADMIT, never served. A HIT is
gathered from RAM ``slot`` and a THIT read from tier ``tslot``, as they stand at the start of
the step; any other access is read from storage. Then, in access order: DEMOTE writes what RAM
``slot`` holds into tier ``tslot``, ADMIT stores the access's row into RAM ``slot``, TADMIT
writes it into tier ``tslot``. RELEASE marks a hit that is the sample's last use.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Generator, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from solar._atomic import atomic_path
from solar.errors import CorruptPlanError, SolarError, first_line
from solar.schedule.draw.order import sample_dtype
from solar.schedule.keep.grouping import HostEpoch, Hosts
from solar.schedule.keep.hostrun import host_run_spec
from solar.schedule.keep.planner import EpochPlan, RankEpoch, epoch_order_of, peer_counts
from solar.schedule.keep.summary import HostTotals, RankStats
from solar.schedule.policy import no_tier, tier_slot_count
from solar.schedule.spec import FORMAT_VERSION, PlanSpec, fingerprint_of

FORMAT = "solar-plan"
SERVICES = "ranks/"  # a grouped plan's services of an epoch: epochs/<k>/ranks/<name>

Layout = dict[str, tuple[tuple[int, ...], np.dtype]]  # dataset name -> (shape, dtype)


def section_layout(spec: PlanSpec, hosts: Hosts | None = None) -> Layout:
    """The name, shape and type of every dataset of an epoch section (``epochs/<k>``), in the
    order they are written: what the writer writes and the reader demands. ``spec``: the
    per-rank inputs; grouped by ``hosts``, the buffers' part is the host run's, and every
    rank's service follows (names under :data:`SERVICES`)."""
    buffers = spec if hosts is None else host_run_spec(spec, hosts)
    run = buffers.run
    # A sampler's trace has as many accesses per epoch as distinct ids per batch (-1: any).
    n, i64 = -1 if spec.traced else run.samples_per_epoch, np.dtype(np.int64)
    accesses = {"sample": sample_dtype(run.num_samples), "slot": np.dtype(np.int32),
                "flags": np.dtype(np.uint8)}  # fmt: skip
    layout = {"rank_offsets": ((run.world_size + 1,), i64),
              "step_offsets": ((run.world_size, run.steps_per_epoch + 1), i64),
              **{name: ((n,), dtype) for name, dtype in accesses.items()}}  # fmt: skip
    if tier_slot_count(run, buffers.buffer):
        layout["tslot"] = ((n,), np.dtype(np.int32))
    if hosts is not None:
        world = spec.run.world_size
        services = {"rank_offsets": ((world + 1,), i64),
                    "step_offsets": ((world, run.steps_per_epoch + 1), i64),
                    **{name: ((-1,), dtype) for name, dtype in accesses.items()},
                    "reader": ((-1,), np.dtype(np.int16)), "at": ((-1,), i64)}  # fmt: skip
        layout.update({SERVICES + name: v for name, v in services.items()})
    return layout


def is_plan_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` claims to be a plan file, of any grouping (its opener proves it is)."""
    try:
        with h5py.File(path, "r") as f:
            return bool(f.attrs.get("format") == FORMAT)
    except (OSError, ValueError, TypeError):
        return False


def fingerprint(spec: PlanSpec, hosts: Hosts | None = None) -> str:
    """The fingerprint of ``spec``'s plan, grouped by ``hosts`` if given (the grouping is then
    one of its inputs)."""
    return _fingerprint(spec.as_dict(), None if hosts is None else hosts.as_record())


def _fingerprint(spec: dict, hosts: list[list[int]] | None) -> str:
    return fingerprint_of(spec if hosts is None else {"spec": spec, "hosts": hosts})


class PlanWriter:
    """Streams a plan into a temporary file beside ``path``; renamed into place on success.
    ``epoch_order``: the planner's (default: the buffers' own); ``hosts``: a plan grouped by
    host (epochs added are then :class:`~solar.schedule.keep.grouping.HostEpoch`)."""

    def __init__(
        self,
        path: str | os.PathLike,
        spec: PlanSpec,
        epoch_order: np.ndarray | None = None,
        hosts: Hosts | None = None,
    ) -> None:
        if hosts is not None and spec.buffer.tier:
            raise SolarError("host plan: a host tier is not planned yet (no --tier-size)")
        self.spec, self.hosts = spec, hosts
        self.fingerprint = fingerprint(spec, hosts)
        buffers = spec if hosts is None else host_run_spec(spec, hosts)
        self.epoch_order = epoch_order_of(buffers) if epoch_order is None else epoch_order
        self.layout = section_layout(spec, hosts)
        parts = buffers.run.world_size + (0 if hosts is None else spec.run.world_size)
        self.checksums = np.zeros((spec.run.epochs, parts, 16), np.uint8)
        self._atomic = atomic_path(path)
        self._next = 0

    def __enter__(self) -> PlanWriter:
        self._tmp = self._atomic.__enter__()
        self._file = h5py.File(self._tmp, "w")
        self._file["epoch_order"] = self.epoch_order
        return self

    def add(self, ep: EpochPlan | HostEpoch) -> None:
        """Write the next epoch's section (grouped: the hosts' part and every rank's service)."""
        assert ep.epoch == self._next, (ep.epoch, self._next)
        grouped = isinstance(ep, HostEpoch)
        plan = ep.host if isinstance(ep, HostEpoch) else ep
        arrays = {name: getattr(plan, name) for name in self.layout
                  if not name.startswith(SERVICES)}  # fmt: skip
        if isinstance(ep, HostEpoch):
            r = ep.ranks
            services = {"rank_offsets": r.rank_offsets, "step_offsets": r.step_offsets,
                        "sample": r.sample.astype(self.layout[SERVICES + "sample"][1]),
                        "slot": r.slot, "flags": r.flags, "reader": ep.reader,
                        "at": ep.at}  # fmt: skip
            arrays.update({SERVICES + name: a for name, a in services.items()})
        # A section the reader would refuse is a bug here: fail before writing it.
        _expect(arrays, self.layout, f"plan: epoch {ep.epoch} as planned", SolarError)
        g = self._file.create_group(f"epochs/{ep.epoch}")
        for name, data in arrays.items():
            g.create_dataset(name, data=data)
        self.checksums[ep.epoch] = _checksums(ep.epoch, arrays, self.fingerprint,
                                              self.spec.equal_batches and not grouped)  # fmt: skip
        self._next += 1

    def add_ranks(self, epoch: int, step_offsets: np.ndarray, parts: Iterable[RankEpoch]) -> None:
        """Write the next epoch's section of a plan per rank one rank's part at a time, in rank
        order (each held only while written: ranks planned by several processes, their parts
        sent to this one): ``step_offsets`` (P, steps + 1) every rank's, known first."""
        assert epoch == self._next and self.hosts is None, (epoch, self._next)
        spec = self.spec
        if spec.equal_batches:
            raise SolarError("plan: a plan of equal batches is written whole (add)")
        world, tier = spec.run.world_size, "tslot" in self.layout
        step_offsets = np.asarray(step_offsets, np.int64)
        rank_offsets = np.zeros(world + 1, np.int64)
        np.cumsum(step_offsets[:, -1], out=rank_offsets[1:])
        n = int(rank_offsets[-1])
        g = self._file.create_group(f"epochs/{epoch}")
        g.create_dataset("rank_offsets", data=rank_offsets)
        g.create_dataset("step_offsets", data=step_offsets)
        names = ["sample", "slot", "flags", *(["tslot"] if tier else [])]
        sets = {name: g.create_dataset(name, (n,), self.layout[name][1]) for name in names}
        _expect({**sets, "rank_offsets": rank_offsets, "step_offsets": step_offsets},
                self.layout, f"plan: epoch {epoch} as planned", SolarError)  # fmt: skip
        digests = []
        for r, part in enumerate(parts):
            lo, hi = int(rank_offsets[r]), int(rank_offsets[r + 1])
            if part.sample.size != hi - lo or not np.array_equal(part.step_offsets,
                                                                 step_offsets[r]):  # fmt: skip
                raise SolarError(f"plan: epoch {epoch}: rank {r}'s part is not its offsets'")
            arrays = {name: np.asarray(getattr(part, name), self.layout[name][1])
                      for name in names}  # fmt: skip
            for name, a in arrays.items():
                sets[name][lo:hi] = a
            as_read = RankEpoch(epoch, arrays["sample"], arrays["slot"], arrays["flags"],
                                step_offsets[r], arrays.get("tslot", part.tslot))  # fmt: skip
            digests.append(_part_checksum(as_read, r, self.fingerprint, tier))
        if len(digests) != world:
            raise SolarError(f"plan: epoch {epoch}: {len(digests)} of {world} ranks' parts")
        self.checksums[epoch] = np.frombuffer(b"".join(digests), np.uint8).reshape(world, 16)
        self._next += 1

    def finish(self, stats: tuple[RankStats, ...] | HostTotals, plan_seconds: float) -> None:
        """Write the header (``stats``: every rank's totals, or a grouped plan's host totals);
        the file is renamed into place when the ``with`` block ends."""
        if self._next != self.spec.run.epochs:
            raise SolarError(f"plan: {self._next} of {self.spec.run.epochs} epochs written")
        # (asdict deep-copies: slow at P=4096.)
        if isinstance(stats, HostTotals):
            stats_json = json.dumps(stats.as_dict(), sort_keys=True)
        else:
            stats_json = json.dumps([_record(s) for s in stats])
        f = self._file
        f["checksums"] = self.checksums
        f.attrs.update(
            {
                "format": FORMAT,
                "format_version": FORMAT_VERSION,
                "fingerprint": self.fingerprint,
                "spec": json.dumps(self.spec.as_dict(), sort_keys=True),
                "hosts": json.dumps(None if self.hosts is None else self.hosts.as_record()),
                "stats": stats_json,
                "plan_seconds": plan_seconds,
                "header_checksum": _header_checksum(
                    self.fingerprint, stats_json, self.epoch_order, self.checksums
                ),
            }
        )

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
    stats: tuple[RankStats, ...] | HostTotals  # grouped: the node's totals
    plan_seconds: float
    checksums: np.ndarray  # (E, Q + S, 16) uint8
    header: str  # the header checksum: ranks compare it
    hosts: Hosts | None = None  # the grouping by host (None: a buffer per rank)

    @classmethod
    def open(cls, path: str | os.PathLike) -> PlanFile:
        """Read and check a plan file's header (format, fingerprint, shapes, checksum, epoch
        order); raises CorruptPlanError naming what is wrong."""
        path = Path(path)
        if not path.is_file():
            raise SolarError(f"plan {path}: no such file")
        try:
            with h5py.File(path, "r") as f:
                if f.attrs.get("format") != FORMAT:
                    raise CorruptPlanError(f"plan {path}: not a solar plan file")
                version = int(f.attrs["format_version"])
                if version != FORMAT_VERSION:
                    grouped = f.attrs.get("hosts", "null") != "null"
                    raise CorruptPlanError(
                        f"plan {path}: format version {version}, this solar reads "
                        f"{FORMAT_VERSION}{' (grouped by host)' if grouped else ''}: plan the "
                        f"run again with `solar plan{' --share node' if grouped else ''}`"
                    )
                fp, stats_json = str(f.attrs["fingerprint"]), str(f.attrs["stats"])
                spec_dict, record = json.loads(f.attrs["spec"]), json.loads(f.attrs["hosts"])
                if _fingerprint(spec_dict, record) != fp:
                    raise CorruptPlanError(
                        f"plan {path}: its fingerprint does not match its recorded inputs"
                        + (" and hosts" if record is not None else "")
                    )
                spec = PlanSpec.from_dict(spec_dict)
                run = spec.run
                hosts = None if record is None else Hosts(record)
                parts = run.world_size
                if hosts is not None:
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
                stats = (tuple(RankStats(**s) for s in records) if hosts is None
                         else HostTotals(**records))  # fmt: skip
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

    @property
    def _equal(self) -> bool:
        """Whether each buffer's part carries every rank's counts (equal batches, per rank)."""
        return self.spec.equal_batches and self.hosts is None

    def epoch(self, k: int) -> EpochPlan | HostEpoch:
        """Epoch ``k`` whole (grouped: every host's part and every rank's service), each part
        checked against its checksum; offsets proven consistent, nothing else
        (:class:`~solar.schedule.plans.validate.PlanValidator` proves the rest)."""
        layout = section_layout(self.spec, self.hosts)
        where = f"plan {self.path}: epoch {k}"
        try:
            with h5py.File(self.path, "r") as f:
                g = f[f"epochs/{k}"]
                _expect(g, layout, where)  # shapes and types before any read
                a = {name: np.asarray(g[name][()]) for name in layout}
        except (OSError, KeyError, ValueError, IndexError, TypeError, RuntimeError) as exc:
            raise CorruptPlanError(f"plan {self.path}: unreadable or corrupt "
                                   f"({first_line(exc)})") from None  # fmt: skip
        for prefix, what in (("", "" if self.hosts is None else ", host plan"),
                             (SERVICES, ", ranks")):  # fmt: skip
            if prefix + "sample" in a:
                _check_offsets(a, prefix, where + what)
        got = _checksums(k, a, self.fingerprint, self._equal)
        for q in range(got.shape[0]):
            if not np.array_equal(got[q], self.checksums[k, q]):
                count = self.checksums.shape[1] - (0 if self.hosts is None else self.hosts.world)
                what = (f"rank {q}'s data" if self.hosts is None else f"host {q}'s plan")  \
                    if q < count else f"rank {q - count}'s service"  # fmt: skip
                raise CorruptPlanError(f"{where}: {what} fails its checksum (corrupt file)")
        return _sections(k, a, self.hosts, self._equal)

    def epochs(self) -> Generator[EpochPlan | HostEpoch, None, None]:
        """Every epoch whole, in turn (:meth:`epoch`)."""
        for k in range(self.spec.run.epochs):
            yield self.epoch(k)

    def read(self, r: int, k: int) -> RankEpoch:
        """Buffer ``r``'s part of run epoch ``k`` (a rank's; grouped a host's), checked
        against its checksum."""
        with h5py.File(self.path, "r") as f:
            return self._read(f, r, k)

    def parts(self, r: int) -> Generator[RankEpoch, None, None]:
        """Buffer ``r``'s part of each epoch in turn, each checked against its checksum."""
        with h5py.File(self.path, "r") as f:
            for k in range(self.spec.run.epochs):
                yield self._read(f, r, k)

    def _read(self, f: h5py.File, r: int, k: int) -> RankEpoch:
        layout = section_layout(self.spec, self.hosts)
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
            if self._equal:  # every rank's counts: one read, this rank's row from it
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
        return np.array_equal(epoch_order, epoch_order_of(host_run_spec(spec, hosts)))
    identity = np.arange(spec.run.epochs)
    return epoch_order.shape == identity.shape and bool(
        np.array_equal(np.sort(epoch_order), identity)
        and (spec.reorder_epochs or np.array_equal(epoch_order, identity))
    )


def _plan_of(k: int, a: Mapping[str, np.ndarray], prefix: str, equal: bool) -> EpochPlan:
    def at(name: str) -> np.ndarray:
        return a[prefix + name]

    tslot = a.get(prefix + "tslot", no_tier(at("sample").size))
    return EpochPlan(k, at("rank_offsets"), at("step_offsets"), at("sample"), at("slot"),
                     at("flags"), tslot, equal)  # fmt: skip


def _sections(k: int, a: Mapping[str, np.ndarray], hosts: Hosts | None,
              equal: bool) -> EpochPlan | HostEpoch:  # fmt: skip
    """Epoch ``k`` from its section's arrays ``a`` (as written, or read back): how the reader
    rebuilds it and what the checksums cover, built in one place."""
    buffers = _plan_of(k, a, "", equal)
    if hosts is None:
        return buffers
    ranks = _plan_of(k, a, SERVICES, False)
    return HostEpoch(k, hosts, buffers, ranks, a[SERVICES + "reader"], a[SERVICES + "at"])


def _checksums(k: int, a: Mapping[str, np.ndarray], fp: str, equal: bool) -> np.ndarray:
    """(Q + S, 16) uint8: each buffer's part of epoch ``k`` (from its section's arrays ``a``),
    then each rank's service (grouped)."""
    plain, tier = _plan_of(k, a, "", False), "tslot" in a
    # Every rank's checksum covers every rank's counts (equal batches): taken once, not
    # once per rank (P of them, each (steps, P): most of the writing time at P=1024).
    peers = peer_counts(plain.step_offsets) if equal else None
    digests = []
    for q in range(plain.rank_offsets.size - 1):
        part = plain.rank(q)
        part = RankEpoch(k, part.sample, part.slot, part.flags, part.step_offsets, part.tslot,
                         peers)  # fmt: skip
        digests.append(_part_checksum(part, q, fp, tier))
    if SERVICES + "sample" in a:
        world = a[SERVICES + "rank_offsets"].size - 1
        digests += [_service_checksum(k, a, q, fp) for q in range(world)]
    return np.frombuffer(b"".join(digests), np.uint8).reshape(len(digests), 16)


def _service_checksum(k: int, a: Mapping[str, np.ndarray], r: int, fp: str) -> bytes:
    ro = a[SERVICES + "rank_offsets"]
    lo, hi = int(ro[r]), int(ro[r + 1])
    h = hashlib.blake2b(f"{fp}/{k}/service {r}".encode(), digest_size=16)
    h.update(np.ascontiguousarray(a[SERVICES + "step_offsets"][r]).data)
    for name in ("sample", "slot", "flags", "reader", "at"):
        h.update(np.ascontiguousarray(a[SERVICES + name][lo:hi]).data)
    return h.digest()


def _check_offsets(a: Mapping[str, np.ndarray], prefix: str, where: str) -> None:
    """Offsets a part's reader slices by: rank offsets from 0 to the arrays' length (all of
    one length), each part's step offsets from 0 to its length, never decreasing."""
    ro, so, n = a[prefix + "rank_offsets"], a[prefix + "step_offsets"], a[prefix + "sample"].size
    if ro[0] != 0 or ro[-1] != n or np.any(np.diff(ro) < 0):
        raise CorruptPlanError(f"{where}: rank offsets are not monotone from 0 to {n}")
    if any(a[prefix + name].size != n for name in ("slot", "flags", "tslot", "reader", "at")
           if prefix + name in a):  # fmt: skip
        raise CorruptPlanError(f"{where}: the arrays differ in length")
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

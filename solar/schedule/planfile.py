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
from solar.schedule.order import sample_dtype
from solar.schedule.planner import EpochPlan, RankEpoch, peer_counts
from solar.schedule.spec import FORMAT_VERSION, PlanSpec, fingerprint_of
from solar.schedule.summary import RankStats

FORMAT = "solar-plan"

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


class PlanWriter:
    """Streams a plan into a temporary file beside ``path``; renamed into place on success."""

    def __init__(self, path: str | os.PathLike, spec: PlanSpec, epoch_order: np.ndarray) -> None:
        self.spec = spec
        self.epoch_order = epoch_order
        self.layout = section_layout(spec)
        self.checksums = np.zeros((spec.run.epochs, spec.run.world_size, 16), np.uint8)
        self._atomic = atomic_path(path)
        self._next = 0

    def __enter__(self) -> PlanWriter:
        self._tmp = self._atomic.__enter__()
        self._file = h5py.File(self._tmp, "w")
        self._file["epoch_order"] = self.epoch_order
        return self

    def add(self, ep: EpochPlan) -> None:
        """Write the next epoch's section."""
        assert ep.epoch == self._next, (ep.epoch, self._next)
        arrays = {name: getattr(ep, name) for name in self.layout}
        # A section the reader would refuse is a bug here: fail before writing it.
        _expect(arrays, self.layout, f"plan: epoch {ep.epoch} as planned", SolarError)
        g = self._file.create_group(f"epochs/{ep.epoch}")
        for name, data in arrays.items():
            g.create_dataset(name, data=data)
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

    def finish(self, stats: tuple[RankStats, ...], plan_seconds: float) -> None:
        """Write the header; the file is renamed into place when the ``with`` block ends."""
        if self._next != self.spec.run.epochs:
            raise SolarError(f"plan: {self._next} of {self.spec.run.epochs} epochs written")
        # (asdict deep-copies: slow at P=4096.) Plans without equal batches keep the records,
        # and so the header checksums, they always had.
        stats_json = json.dumps([_record(s) for s in stats])
        f = self._file
        f["checksums"] = self.checksums
        f.attrs.update(
            {
                "format": FORMAT,
                "format_version": FORMAT_VERSION,
                "fingerprint": self.spec.fingerprint,
                "spec": json.dumps(self.spec.as_dict(), sort_keys=True),
                "stats": stats_json,
                "plan_seconds": plan_seconds,
                "header_checksum": _header_checksum(
                    self.spec.fingerprint, stats_json, self.epoch_order, self.checksums
                ),
            }
        )

    def __exit__(self, *exc: Any) -> None:
        self._file.close()
        self._atomic.__exit__(*exc)


@dataclass(frozen=True, eq=False)
class PlanFile:
    """A plan file whose header is proven intact (:meth:`open`); its epoch sections are read
    on demand, each rank's part checked against its checksum."""

    path: Path
    spec: PlanSpec
    fingerprint: str
    epoch_order: np.ndarray  # (E,) int64
    stats: tuple[RankStats, ...]
    plan_seconds: float
    checksums: np.ndarray  # (E, P, 16) uint8
    header: str  # the header checksum: ranks compare it

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
                if f.attrs.get("kind", "rank") != "rank":  # solar/schedule/nodefile.py
                    raise SolarError(f"plan {path}: a node plan file (one buffer per host): "
                                     'open it with Loader(plan=..., share="node")')  # fmt: skip
                version = int(f.attrs["format_version"])
                if version != FORMAT_VERSION:
                    raise CorruptPlanError(
                        f"plan {path}: format version {version}, this solar reads "
                        f"{FORMAT_VERSION}: plan the run again with `solar plan`"
                    )
                fingerprint = str(f.attrs["fingerprint"])
                stats_json = str(f.attrs["stats"])
                spec_dict = json.loads(f.attrs["spec"])
                if fingerprint_of(spec_dict) != fingerprint:
                    raise CorruptPlanError(
                        f"plan {path}: its fingerprint does not match its recorded inputs"
                    )
                spec = PlanSpec.from_dict(spec_dict)
                run = spec.run
                _expect(f, {"epoch_order": ((run.epochs,), np.dtype(np.int64)),
                            "checksums": ((run.epochs, run.world_size, 16), np.dtype(np.uint8))},
                        f"plan {path}")  # fmt: skip
                epoch_order = np.asarray(f["epoch_order"][()])
                checksums = np.asarray(f["checksums"][()])
                header = str(f.attrs["header_checksum"])
                if header != _header_checksum(fingerprint, stats_json, epoch_order, checksums):
                    raise CorruptPlanError(
                        f"plan {path}: its header fails its checksum (corrupt file)"
                    )
                stats = tuple(RankStats(**s) for s in json.loads(stats_json))
                seconds = float(f.attrs["plan_seconds"])
        except (OSError, KeyError, ValueError, TypeError, RuntimeError, SolarError) as exc:
            if isinstance(exc, CorruptPlanError):
                raise
            raise CorruptPlanError(
                f"plan {path}: unreadable or corrupt ({first_line(exc)})"
            ) from None
        if len(stats) != run.world_size:
            raise CorruptPlanError(f"plan {path}: per-rank records do not match its world size")
        identity = np.arange(run.epochs)
        if epoch_order.shape != identity.shape or not (
            np.array_equal(np.sort(epoch_order), identity)
            and (spec.reorder_epochs or np.array_equal(epoch_order, identity))
        ):
            raise CorruptPlanError(f"plan {path}: its epoch order is not one this run can use")
        return cls(path, spec, fingerprint, epoch_order, stats, seconds, checksums, header)

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

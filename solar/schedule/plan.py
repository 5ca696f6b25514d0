"""The Plan: the only contract between the planner and the runtime, and its file format.

File format (HDF5, version 2), readable with plain h5py, one section per epoch so that a
reader takes only the epochs it runs and a writer streams them as they are planned::

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
                                                 5 DEMOTE
    epochs/<k>/tslot         (N_e,)      int32  tier slot of the access, -1: none (only in
                                                 plans with a second tier)

Semantics of one rank's step: its batch is its accesses of the step, in order. A HIT is
gathered from RAM ``slot`` and a THIT read from tier ``tslot``, as they stand at the start of
the step; any other access is read from storage. Then, in access order: DEMOTE writes what RAM
``slot`` holds into tier ``tslot``, ADMIT stores the access's row into RAM ``slot``, TADMIT
writes it into tier ``tslot``. RELEASE marks a hit that is the sample's last use.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from solar._atomic import atomic_path
from solar._memory import require_memory
from solar.errors import CorruptPlanError, PlanMismatchError, SolarError, first_line
from solar.schedule._common import (
    Progress,
    no_tier,
    slot_count,
    tier_slot_count,
)
from solar.schedule.order import sample_dtype
from solar.schedule.planner import EpochPlan, Planner, RankEpoch, epoch_order_of
from solar.schedule.rankplan import RankPlan
from solar.schedule.spec import FORMAT_VERSION, PlanSpec, fingerprint_of
from solar.schedule.summary import PlanSummary, RankStats, Tally, Totals
from solar.schedule.validate import RankValidator, coverage_error

FORMAT = "solar-plan"


class Plan(Totals):
    """A schedule for every rank and step: made in memory by :func:`make_plan` or
    :func:`plan_to_file`, or opened by :func:`load_plan`."""

    def __init__(
        self,
        spec: PlanSpec,
        epoch_order: np.ndarray,
        stats: tuple[RankStats, ...],
        plan_seconds: float,
        fingerprint: str,
        epochs: list[EpochPlan] | None = None,
        path: Path | None = None,
        checksums: np.ndarray | None = None,
    ) -> None:
        self.spec = spec
        self.epoch_order = epoch_order
        self.stats = stats
        self.plan_seconds = plan_seconds
        self.fingerprint = fingerprint
        self._epochs = epochs
        self._path = path
        self._checksums = checksums
        self.header: str | None = None  # a file's header checksum: ranks compare it

    # -- queries -------------------------------------------------------------------------
    @property
    def summary(self) -> PlanSummary:
        """The totals without the decisions."""
        return PlanSummary(self.spec, self.stats, self.plan_seconds, self.fingerprint)

    @property
    def slots(self) -> int:
        """Buffer slots a rank needs: the capacity, or N if that is smaller."""
        return slot_count(self.spec.run, self.spec.buffer)

    @property
    def tier_slots(self) -> int:
        """Tier slots a rank needs (0: no second tier)."""
        return tier_slot_count(self.spec.run, self.spec.buffer)

    def _check_rank(self, r: int) -> None:
        if not 0 <= r < self.world_size:
            raise SolarError(f"rank {r} is outside this plan's world size {self.world_size}")

    def rank_epoch(self, r: int, k: int) -> RankEpoch:
        """Rank ``r``'s part of run epoch ``k`` (from a file: checked against its checksum,
        not validated; :meth:`rank` validates)."""
        self._check_rank(r)
        if self._epochs is not None:
            return self._epochs[k].rank(r)
        assert self._path is not None
        with h5py.File(self._path, "r") as f:
            return self._read_part(f, r, k)

    def _read_part(self, f: h5py.File, r: int, k: int) -> RankEpoch:
        assert self._checksums is not None
        try:
            g = f[f"epochs/{k}"]
            # Shapes and types before any read: a file may claim anything.
            _expect(g, self._layout(), f"plan {self._path}: epoch {k}")
            bounds = g["rank_offsets"][r : r + 2]
            lo, hi = int(bounds[0]), int(bounds[1])
            if not 0 <= lo <= hi <= self.run.samples_per_epoch:
                raise CorruptPlanError(
                    f"plan {self._path}: epoch {k}: rank {r}'s accesses [{lo}, {hi}) "
                    "are out of range"
                )
            tslot = g["tslot"][lo:hi] if self.tier_slots else no_tier(hi - lo)
            part = RankEpoch(k, g["sample"][lo:hi], g["slot"][lo:hi], g["flags"][lo:hi],
                             g["step_offsets"][r], tslot)  # fmt: skip
        except (OSError, KeyError, ValueError, IndexError, TypeError, RuntimeError) as exc:
            raise CorruptPlanError(
                f"plan {self._path}: unreadable or corrupt ({first_line(exc)})"
            ) from None
        digest = _part_checksum(part, r, self.fingerprint, self.tier_slots > 0)
        if digest != self._checksums[k, r].tobytes():
            raise CorruptPlanError(
                f"plan {self._path}: rank {r}'s data of epoch {k} fails its checksum (corrupt file)"
            )
        return part

    def _layout(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """The shape and type of every dataset of an epoch section, as the writer makes them."""
        run = self.run
        world, n = run.world_size, run.samples_per_epoch
        i64 = np.dtype(np.int64)
        layout = {
            "rank_offsets": ((world + 1,), i64),
            "step_offsets": ((world, run.steps_per_epoch + 1), i64),
            "sample": ((n,), sample_dtype(run.num_samples)),
            "slot": ((n,), np.dtype(np.int32)),
            "flags": ((n,), np.dtype(np.uint8)),
        }
        if self.tier_slots:
            layout["tslot"] = ((n,), np.dtype(np.int32))
        return layout

    def rank(self, r: int, comm: Any = None) -> RankPlan:
        """Rank ``r``'s accesses over the whole run.

        A plan made in this process is trusted. One read from a file is untrusted: it is proven
        safe first, as :meth:`validate` does (collectively with ``comm``).
        """
        self._check_rank(r)
        if self._epochs is not None:
            parts = [ep.rank(r) for ep in self._epochs]
        else:
            proven = self._prove(r, comm, keep=True)
            assert proven is not None
            parts = proven
        return RankPlan.from_parts(r, parts, self.slots, tier_slots=self.tier_slots)

    def validate(self, r: int, comm: Any = None) -> None:
        """Prove rank ``r``'s part of a plan file safe to execute, epoch by epoch, keeping none
        of it (memory O(N + slots)): its checksums, then
        :class:`~solar.schedule.validate.RankValidator` (ranges, the seed's permutations, a
        replay proving every hit). With ``comm`` (every rank calls this collectively) the ranks
        prove together that each epoch serves every sample exactly once; without it, this
        process checks every rank's part itself. A plan made in this process is trusted."""
        self._check_rank(r)
        if self._epochs is None:
            self._prove(r, comm, keep=False)

    def _prove(self, r: int, comm: Any, keep: bool) -> list[RankEpoch] | None:
        from solar import dist  # a light module: no MPI or torch import

        key = dist.shared_key(comm)
        try:
            parts, mine, expected = self._validated(r, key, keep)
            error = None
        except CorruptPlanError as exc:
            parts, mine, expected, error = None, None, None, str(exc)
        if comm is not None and comm.Get_size() > 1:
            # Every rank learns every rank's verdict, so all raise together: none is left
            # waiting in a collective for a rank that gave up.
            verdicts = comm.allgather((mine, error))
            error = next((e for _, e in verdicts if e is not None), None)
            if error is None and expected is not None:
                error = coverage_error([m for m, _ in verdicts], expected)
        elif mine is not None and expected is not None:
            # Without a communicator, prove coverage from every rank's part in this process.
            others = [self._validated(o, key, False)[1] for o in range(self.world_size) if o != r]
            error = coverage_error([mine, *others], expected)
        if error is not None:
            where = "" if error.startswith("plan ") else f"plan {self._path}: "
            raise CorruptPlanError(where + error)
        return parts

    def _validated(
        self, r: int, key: int, keep: bool
    ) -> tuple[list[RankEpoch] | None, np.ndarray, np.ndarray]:
        """Rank ``r``'s parts from the file, checksummed and validated epoch by epoch (kept if
        ``keep``); the validator's digests."""
        assert self._path is not None
        v = RankValidator(self.run, self.epoch_order, self.slots, r, key, self.tier_slots)
        parts = []
        with h5py.File(self._path, "r") as f:
            for k in range(self.run.epochs):
                part = self._read_part(f, r, k)
                try:
                    v.check(part)
                except CorruptPlanError as exc:
                    raise CorruptPlanError(f"plan {self._path}: {exc}") from None
                if keep:
                    parts.append(part)
        return (parts if keep else None), v.mine, v.expected

    def trace(self, r: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(step, sample, hit)`` over rank ``r``'s accesses in service order (a hit from
        RAM or from the tier)."""
        rp = self.rank(r)
        return rp.steps(), rp.sample, rp.hit

    def check(self, expected: PlanSpec, source: str = "plan") -> None:
        """Refuse this plan unless it was made for ``expected``; name the fields that differ."""
        if self.fingerprint == expected.fingerprint:
            return
        mine, theirs = self.spec.as_dict(), expected.as_dict()
        diff = [f"{k} {mine[k]!r} (expected {theirs[k]!r})" for k in mine if mine[k] != theirs[k]]
        raise PlanMismatchError(f"{source} was made for another dataset or run: {', '.join(diff)}")

    # -- persistence ---------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> Path:
        """Write the plan atomically: to a temporary file beside ``path``, then rename."""
        if self._epochs is None:
            raise SolarError("plan: only a plan made in this process can be saved")
        with PlanWriter(path, self.spec, self.epoch_order) as writer:
            for ep in self._epochs:
                writer.add(ep)
            writer.finish(self.stats, self.plan_seconds)
        return Path(path)


def _run_planner(
    spec: PlanSpec, sink: Any, progress: Progress | None, epoch_order: np.ndarray | None = None
) -> tuple[np.ndarray, tuple[RankStats, ...], float]:
    """Plan every epoch in order, handing each to ``sink`` (or nothing); totals and seconds."""
    t0 = time.perf_counter()
    planner = Planner(spec, epoch_order)
    tally = Tally(spec.run.world_size)
    for _ in range(spec.run.epochs):
        seq, sched = planner.next_schedule()
        tally.add(sched)
        if sink is not None:
            sink(planner.group(seq, sched))
        if progress is not None:
            progress(spec.run.steps_per_epoch)
    return planner.epoch_order, tally.stats(), time.perf_counter() - t0


def make_plan(spec: PlanSpec, progress: Progress | None = None) -> Plan:
    """Plan a run and keep every decision in memory (about 9 bytes per access)."""
    _check_memory(spec, keep_all=True)
    epochs: list[EpochPlan] = []
    order, stats, seconds = _run_planner(spec, epochs.append, progress)
    return Plan(spec, order, stats, seconds, spec.fingerprint, epochs=epochs)


def plan_to_file(spec: PlanSpec, path: str | os.PathLike, progress: Progress | None = None) -> Plan:
    """Plan a run straight into a plan file, one epoch at a time (memory independent of E)."""
    _check_memory(spec, keep_all=False)
    order = epoch_order_of(spec)  # the header needs it first; the planner takes the same one
    with PlanWriter(path, spec, order) as writer:
        _, stats, seconds = _run_planner(spec, writer.add, progress, order)
        writer.finish(stats, seconds)
    return load_plan(path)


def simulate(spec: PlanSpec, progress: Progress | None = None) -> PlanSummary:
    """Plan a run and keep only its totals: a simulator for runs too large to store."""
    _check_memory(spec, keep_all=False)
    _, stats, seconds = _run_planner(spec, None, progress)
    return PlanSummary(spec, stats, seconds, spec.fingerprint)


class PlanWriter:
    """Streams a plan into a temporary file beside ``path``; renamed into place on success."""

    def __init__(self, path: str | os.PathLike, spec: PlanSpec, epoch_order: np.ndarray) -> None:
        self.spec = spec
        self.epoch_order = epoch_order
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
        g = self._file.create_group(f"epochs/{ep.epoch}")
        for name in ("rank_offsets", "step_offsets", "sample", "slot", "flags"):
            g.create_dataset(name, data=getattr(ep, name))
        tier = tier_slot_count(self.spec.run, self.spec.buffer) > 0
        if tier:
            g.create_dataset("tslot", data=ep.tslot)
        fp = self.spec.fingerprint
        for r in range(ep.rank_offsets.size - 1):
            digest = _part_checksum(ep.rank(r), r, fp, tier)
            self.checksums[ep.epoch, r] = np.frombuffer(digest, np.uint8)
        self._next += 1

    def finish(self, stats: tuple[RankStats, ...], plan_seconds: float) -> None:
        """Write the header; the file is renamed into place when the ``with`` block ends."""
        if self._next != self.spec.run.epochs:
            raise SolarError(f"plan: {self._next} of {self.spec.run.epochs} epochs written")
        stats_json = json.dumps([vars(s) for s in stats])  # asdict deep-copies: slow at P=4096
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


def load_plan(path: str | os.PathLike) -> Plan:
    """Open a plan file; rank data is read on demand and checked against its checksums."""
    path = Path(path)
    if not path.is_file():
        raise SolarError(f"plan {path}: no such file")
    try:
        with h5py.File(path, "r") as f:
            if f.attrs.get("format") != FORMAT:
                raise CorruptPlanError(f"plan {path}: not a solar plan file")
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
                raise CorruptPlanError(f"plan {path}: its header fails its checksum (corrupt file)")
            stats = tuple(RankStats(**s) for s in json.loads(stats_json))
            seconds = float(f.attrs["plan_seconds"])
    except (OSError, KeyError, ValueError, TypeError, RuntimeError, SolarError) as exc:
        if isinstance(exc, CorruptPlanError):
            raise
        raise CorruptPlanError(f"plan {path}: unreadable or corrupt ({first_line(exc)})") from None
    if len(stats) != run.world_size:
        raise CorruptPlanError(f"plan {path}: per-rank records do not match its world size")
    identity = np.arange(run.epochs)
    if epoch_order.shape != identity.shape or not (
        np.array_equal(np.sort(epoch_order), identity)
        and (spec.reorder_epochs or np.array_equal(epoch_order, identity))
    ):
        raise CorruptPlanError(f"plan {path}: its epoch order is not one this run can use")
    plan = Plan(spec, epoch_order, stats, seconds, fingerprint, path=path, checksums=checksums)
    plan.header = header
    return plan


# -- helpers ----------------------------------------------------------------------------------
def _expect(group: h5py.Group, layout: dict, where: str) -> None:
    for name, (shape, dtype) in layout.items():
        d = group[name]
        if d.shape != shape or d.dtype != dtype:
            raise CorruptPlanError(
                f"{where}: {name} is {d.dtype}{list(d.shape)}, expected {dtype}{list(shape)}"
            )


def _part_checksum(part: RankEpoch, r: int, fingerprint: str, tier: bool) -> bytes:
    h = hashlib.blake2b(f"{fingerprint}/{part.epoch}/{r}".encode(), digest_size=16)
    for arr in (part.step_offsets, part.sample, part.slot, part.flags):
        h.update(np.ascontiguousarray(arr).data)
    if tier:  # (plans without one keep the checksums they always had)
        h.update(np.ascontiguousarray(part.tslot).data)
    return h.digest()


def _check_memory(spec: PlanSpec, keep_all: bool) -> None:
    """Refuse a plan that cannot fit in memory, before allocating any of it."""
    run = spec.run
    # Planner state, two epochs of order and next uses, one epoch's decisions (measured peak:
    # bench/plan_bench.py); a plan kept in memory adds about 9 bytes per access.
    need = (
        48 * run.num_samples
        + 40 * run.samples_per_epoch
        + 24 * run.world_size * slot_count(run, spec.buffer)
        + 36 * run.world_size * tier_slot_count(run, spec.buffer)
    )
    if keep_all:
        need += 10 * run.num_accesses
    if spec.policy != "solar":
        need += 13 * run.world_size * run.num_samples  # per-(rank, sample) tables
    require_memory(need, f"planning {run.num_accesses} accesses")


def _header_checksum(
    fingerprint: str, stats: str, epoch_order: np.ndarray, checksums: np.ndarray
) -> str:
    h = hashlib.blake2b(fingerprint.encode(), digest_size=16)
    h.update(stats.encode())
    h.update(np.ascontiguousarray(epoch_order, dtype=np.int64).data)
    h.update(np.ascontiguousarray(checksums, dtype=np.uint8).data)
    return h.hexdigest()

"""The Plan: the only contract between the planner and the runtime, and its file format.

File format (HDF5, version 1), readable with plain h5py::

    attrs   format="solar-plan", format_version=1, fingerprint (sha256 hex of the spec),
            spec (JSON of the inputs), stats (JSON of per-rank totals), plan_seconds,
            checksums (one blake2b hex per rank), header_checksum (blake2b of
            fingerprint, stats, checksums, epoch_order and rank_offsets)
    epoch_order   (E,)      int64   permutation index used by each epoch of the run
    rank_offsets  (P+1,)    int64   rank r's accesses are [rank_offsets[r], rank_offsets[r+1])
    step_offsets  (P, S+1)  int64   within rank r, global step k is [step_offsets[r,k], ...[r,k+1])
    sample        (A,)      int32 (int64 when N >= 2**31)   sample id, in service order
    slot          (A,)      int32   buffer slot of the access, -1 for a read kept nowhere
    flags         (A,)      uint8   bit 0 HIT, bit 1 ADMIT, bit 2 RELEASE

Semantics of one rank's step k: its batch is ``sample[a:b]`` in that order. A HIT is gathered
from ``slot`` as the buffer holds it at the start of the step; any other access is read from
storage, and if ADMIT its bytes are then stored into ``slot`` (in order, after the gather).
RELEASE marks a hit that is the sample's last use. Slots freed by a step are those released
and those overwritten by its admissions.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from numba import njit

from solar._atomic import atomic_path
from solar._memory import require_memory
from solar.config import BufferConfig, RunConfig
from solar.errors import CorruptPlanError, PlanMismatchError, SolarError
from solar.schedule._common import ADMIT, HIT, Progress, slot_count
from solar.schedule.order import access_sequence
from solar.schedule.policies import get_policy
from solar.schedule.rankplan import RankPlan
from solar.schedule.reorder import reorder_epochs
from solar.schedule.validate import check_coverage, validate_rank

FORMAT = "solar-plan"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class PlanSpec:
    """Everything a plan depends on; its digest is the plan's fingerprint."""

    run: RunConfig
    buffer: BufferConfig
    policy: str = "solar"
    reorder_epochs: bool = False
    sample_bytes: int | None = None
    dataset: str | None = None  # identity of the data files and keys, see solar.io.hdf5

    def as_dict(self) -> dict:
        d = {**dataclasses.asdict(self.run), **dataclasses.asdict(self.buffer)}
        d.update(
            policy=self.policy,
            reorder_epochs=self.reorder_epochs,
            sample_bytes=self.sample_bytes,
            dataset=self.dataset,
            format_version=FORMAT_VERSION,
        )
        return d

    @classmethod
    def from_dict(cls, d: dict) -> PlanSpec:
        run = RunConfig(**{f.name: d[f.name] for f in dataclasses.fields(RunConfig)})
        buffer = BufferConfig(**{f.name: d[f.name] for f in dataclasses.fields(BufferConfig)})
        return cls(run, buffer, d["policy"], d["reorder_epochs"], d["sample_bytes"], d["dataset"])

    @property
    def fingerprint(self) -> str:
        return _digest(self.as_dict())


def _digest(d: dict) -> str:
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class RankStats:
    accesses: int
    hits: int
    reads: int
    admits: int
    min_batch: int
    max_batch: int


class Plan:
    """A schedule for every rank and step, made by :func:`make_plan` or :func:`load_plan`."""

    def __init__(
        self,
        spec: PlanSpec,
        epoch_order: np.ndarray,
        stats: list[RankStats],
        plan_seconds: float,
        fingerprint: str,
        arrays: dict[str, np.ndarray] | None = None,
        path: Path | None = None,
        checksums: list[str] | None = None,
    ) -> None:
        self.spec = spec
        self.epoch_order = epoch_order
        self.stats = stats
        self.plan_seconds = plan_seconds
        self.fingerprint = fingerprint
        self._arrays = arrays
        self._path = path
        self._checksums = checksums

    # -- queries -------------------------------------------------------------------------
    @property
    def run(self) -> RunConfig:
        return self.spec.run

    @property
    def world_size(self) -> int:
        return self.spec.run.world_size

    @property
    def from_file(self) -> bool:
        """Read from a file (untrusted, validated rank by rank) rather than made here."""
        return self._arrays is None

    @property
    def slots(self) -> int:
        """Buffer slots a rank needs: the capacity, or N if that is smaller."""
        return slot_count(self.spec.run, self.spec.buffer)

    def rank(self, r: int, comm: Any = None) -> RankPlan:
        """Rank ``r``'s accesses.

        A plan made in this process is trusted. One read from a file is untrusted: it must pass
        its checksum and :func:`~solar.schedule.validate.validate_rank` (ranges, the seed's
        permutations, a replay proving every hit) before it is returned. With ``comm`` (every
        rank of the run calls this collectively) the ranks also prove that each epoch serves
        every sample exactly once; a single process can prove that only for world size 1.
        """
        if not 0 <= r < self.world_size:
            raise SolarError(f"rank {r} is outside this plan's world size {self.world_size}")
        if self._arrays is not None:
            return _slice_rank(self._arrays, r, self.slots)
        assert self._path is not None and self._checksums is not None
        rp = _read_rank(self._path, r, self.fingerprint, self._checksums[r], self.slots)
        from solar import dist  # a light module: no MPI or torch import

        try:
            mine, expected = validate_rank(rp, self.run, self.epoch_order, dist.shared_key(comm))
            if comm is not None and comm.Get_size() > 1:
                check_coverage(dist.allsum(comm, mine), expected)
            elif self.world_size == 1:
                check_coverage(mine, expected)
        except CorruptPlanError as exc:
            raise CorruptPlanError(f"plan {self._path}: {exc}") from None
        return rp

    def trace(self, r: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(step, sample, hit)`` over rank ``r``'s accesses in service order."""
        rp = self.rank(r)
        return rp.steps(), rp.sample, rp.hit

    @property
    def accesses(self) -> int:
        return sum(s.accesses for s in self.stats)

    @property
    def hits(self) -> int:
        return sum(s.hits for s in self.stats)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.accesses

    @property
    def bound(self) -> float:
        """Largest possible hit rate: min(P·C, per-epoch samples) hits per epoch transition."""
        run, c = self.run, self.spec.buffer.capacity
        per_epoch = run.samples_per_epoch
        return min(run.world_size * c, per_epoch) * (run.epochs - 1) / (per_epoch * run.epochs)

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
        if self._arrays is None:
            raise SolarError("plan: only a plan made in this process can be saved")
        path = Path(path)
        a = self._arrays
        world = self.world_size
        checksums = [
            _rank_checksum(_slice_rank(a, r, self.slots), self.fingerprint) for r in range(world)
        ]
        stats = json.dumps([dataclasses.asdict(s) for s in self.stats])
        header = _header_checksum(
            self.fingerprint, stats, json.dumps(checksums), self.epoch_order, a["rank_offsets"]
        )
        meta = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "fingerprint": self.fingerprint,
            "spec": json.dumps(self.spec.as_dict(), sort_keys=True),
            "stats": stats,
            "plan_seconds": self.plan_seconds,
            "checksums": json.dumps(checksums),
            "header_checksum": header,
        }
        with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
            f.attrs.update(meta)
            f["epoch_order"] = self.epoch_order
            for name in ("rank_offsets", "step_offsets", "sample", "slot", "flags"):
                f.create_dataset(name, data=a[name])
        return path


def make_plan(spec: PlanSpec, progress: Progress | None = None) -> Plan:
    """Plan a run: the order, then the policy's assignment and buffer decisions."""
    t0 = time.perf_counter()
    run = spec.run
    policy = get_policy(spec.policy)
    _check_memory(spec)
    if spec.reorder_epochs:
        epoch_order = reorder_epochs(run, spec.buffer.capacity)
    else:
        epoch_order = np.arange(run.epochs, dtype=np.int64)
    seq = access_sequence(run, epoch_order)
    sched = policy(run, spec.buffer, seq, progress)

    counts = sched.counts.astype(np.int64)
    per_rank = counts.sum(axis=0)
    rank_offsets = np.concatenate([[0], np.cumsum(per_rank)])
    step_offsets = np.zeros((run.world_size, run.num_steps + 1), np.int64)
    np.cumsum(counts.T, axis=1, out=step_offsets[:, 1:])
    arrays = {"rank_offsets": rank_offsets, "step_offsets": step_offsets}
    # One field at a time, dropping each source once grouped: the planner's peak memory.
    arrays["sample"] = _group_by_rank(sched.rank, seq, rank_offsets)
    del seq
    arrays["slot"] = _group_by_rank(sched.rank, sched.slot, rank_offsets)
    sched.slot = np.empty(0, np.int32)
    arrays["flags"] = _group_by_rank(sched.rank, sched.flags, rank_offsets)
    del sched
    slots = slot_count(run, spec.buffer)
    stats = [_rank_stats(_slice_rank(arrays, r, slots)) for r in range(run.world_size)]
    seconds = time.perf_counter() - t0
    return Plan(spec, epoch_order, stats, seconds, spec.fingerprint, arrays=arrays)


def load_plan(path: str | os.PathLike) -> Plan:
    """Open a plan file; rank data is read on demand and checked against its checksum."""
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
                    f"plan {path}: format version {version}, this solar reads {FORMAT_VERSION}"
                )
            fingerprint = str(f.attrs["fingerprint"])
            stats_json, checksums_json = str(f.attrs["stats"]), str(f.attrs["checksums"])
            epoch_order = f["epoch_order"][()]
            rank_offsets = f["rank_offsets"][()]
            header = _header_checksum(
                fingerprint, stats_json, checksums_json, epoch_order, rank_offsets
            )
            if header != f.attrs["header_checksum"]:
                raise CorruptPlanError(f"plan {path}: its header fails its checksum (corrupt file)")
            spec_dict = json.loads(f.attrs["spec"])
            if _digest(spec_dict) != fingerprint:
                raise CorruptPlanError(
                    f"plan {path}: its fingerprint does not match its recorded inputs"
                )
            spec = PlanSpec.from_dict(spec_dict)
            stats = [RankStats(**s) for s in json.loads(stats_json)]
            checksums = [str(c) for c in json.loads(checksums_json)]
            seconds = float(f.attrs["plan_seconds"])
    except (OSError, KeyError, ValueError, TypeError, RuntimeError, SolarError) as exc:
        if isinstance(exc, CorruptPlanError):
            raise
        raise CorruptPlanError(f"plan {path}: unreadable or corrupt ({_first_line(exc)})") from None
    world = spec.run.world_size
    if len(checksums) != world or len(stats) != world or rank_offsets.shape != (world + 1,):
        raise CorruptPlanError(f"plan {path}: per-rank records do not match its world size")
    identity = np.arange(spec.run.epochs)
    if epoch_order.shape != identity.shape or not (
        np.array_equal(np.sort(epoch_order), identity)
        and (spec.reorder_epochs or np.array_equal(epoch_order, identity))
    ):
        raise CorruptPlanError(f"plan {path}: its epoch order is not one this run can use")
    return Plan(spec, epoch_order, stats, seconds, fingerprint, path=path, checksums=checksums)


# -- helpers ----------------------------------------------------------------------------------
def _group_by_rank(rank: np.ndarray, values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Stable counting sort of run-order ``values`` into rank-major order."""
    out = np.empty_like(values)
    _scatter_by_rank(rank, values, offsets[:-1].copy(), out)
    return out


@njit(cache=True)
def _scatter_by_rank(rank, values, fill, out):
    for i in range(rank.shape[0]):
        out[fill[rank[i]]] = values[i]
        fill[rank[i]] += 1


def _slice_rank(a: dict[str, np.ndarray], r: int, slots: int) -> RankPlan:
    lo, hi = a["rank_offsets"][r], a["rank_offsets"][r + 1]
    return RankPlan(
        r, a["sample"][lo:hi], a["slot"][lo:hi], a["flags"][lo:hi], a["step_offsets"][r], slots
    )


def _read_rank(path: Path, r: int, fingerprint: str, checksum: str, slots: int) -> RankPlan:
    try:
        with h5py.File(path, "r") as f:
            lo, hi = (int(v) for v in f["rank_offsets"][r : r + 2])
            rp = RankPlan(
                r, f["sample"][lo:hi], f["slot"][lo:hi], f["flags"][lo:hi], f["step_offsets"][r],
                slots,
            )  # fmt: skip
    except (OSError, KeyError, ValueError, IndexError, TypeError, RuntimeError) as exc:
        raise CorruptPlanError(f"plan {path}: unreadable or corrupt ({_first_line(exc)})") from None
    if _rank_checksum(rp, fingerprint) != checksum:
        raise CorruptPlanError(f"plan {path}: rank {r}'s data fails its checksum (corrupt file)")
    return rp


def _rank_checksum(rp: RankPlan, fingerprint: str) -> str:
    h = hashlib.blake2b(fingerprint.encode(), digest_size=16)
    for arr in (rp.step_offsets, rp.sample, rp.slot, rp.flags):
        h.update(np.ascontiguousarray(arr).data)
    return h.hexdigest()


def _check_memory(spec: PlanSpec) -> None:
    """Refuse a plan that cannot fit in memory, before allocating any of it."""
    run = spec.run
    need = 16 * run.num_accesses  # measured peak: bench/plan_bench.py
    if spec.policy != "solar":
        need += 13 * run.world_size * run.num_samples  # per-(rank, sample) tables
    require_memory(need, f"planning {run.num_accesses} accesses")


def _header_checksum(
    fingerprint: str, stats: str, checksums: str, epoch_order: np.ndarray, rank_offsets: np.ndarray
) -> str:
    h = hashlib.blake2b(fingerprint.encode(), digest_size=16)
    for text in (stats, checksums):
        h.update(text.encode())
    for arr in (epoch_order, rank_offsets):
        h.update(np.ascontiguousarray(arr, dtype=np.int64).data)
    return h.hexdigest()


def _rank_stats(rp: RankPlan) -> RankStats:
    sizes = rp.batch_sizes()
    hits = int(np.count_nonzero(rp.flags & HIT))
    return RankStats(
        accesses=int(rp.sample.size),
        hits=hits,
        reads=int(rp.sample.size) - hits,
        admits=int(np.count_nonzero(rp.flags & ADMIT)),
        min_batch=int(sizes.min()),
        max_batch=int(sizes.max()),
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__

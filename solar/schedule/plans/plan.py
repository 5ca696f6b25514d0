"""The Plan, the only contract between the planner and the runtime, and the ways to get one:
:func:`make_plan` keeps every decision in memory, :func:`plan_to_file` streams them to a plan
file (:mod:`solar.schedule.plans.planfile`) and :func:`load_plan` opens one; :func:`simulate` keeps
only the totals (a :class:`~solar.schedule.keep.summary.PlanSummary`). Each takes the grouping:
``hosts`` None plans a buffer per rank, a :class:`~solar.schedule.keep.grouping.Hosts` one buffer
per host (solar/schedule/keep/hostplan.py), a plan of the same class with its grouping a field.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from solar._memory import require_memory
from solar._units import format_bytes
from solar.errors import CorruptPlanError, PlanMismatchError, SolarError
from solar.schedule.draw import keyspace as ks
from solar.schedule.draw.samplers import Sampler
from solar.schedule.keep.grouping import Hosts
from solar.schedule.keep.hostplan import host_totals
from solar.schedule.keep.hostrun import host_run_spec
from solar.schedule.keep.planner import EpochPlan, Planner, RankEpoch, epoch_order_of, rank_alone
from solar.schedule.keep.summary import PlanSummary, RankStats, Tally, Totals
from solar.schedule.plans.planfile import PlanFile, PlanWriter, fingerprint
from solar.schedule.plans.rankplan import RankPlan
from solar.schedule.plans.validate import PlanValidator, Proof, peers_error, prove
from solar.schedule.policy import Progress, slot_count, tier_slot_count
from solar.schedule.spec import PlanSpec, differences

# Told each epoch's (accesses, hits) as it is planned (solar plan --plot).
EpochTotals = Callable[[tuple[int, int]], None]


def grouping(hosts: Hosts) -> str:
    """``hosts`` as a user reads it: ``2x2 [[0, 1], [2, 3]]``."""
    return f"{hosts.count}x{hosts.local} {hosts.as_record()}"


@dataclass(frozen=True, eq=False)
class Plan(Totals):
    """A schedule for every rank and step, of a buffer per rank or of one per host
    (``hosts``, the grouping: :mod:`solar.schedule.keep.hostplan`; None: a buffer per rank): made
    in memory by :func:`make_plan` (``epochs``), or opened by :func:`load_plan` (``file``).
    ``spec`` is the per-rank inputs it was made for; ``stats`` every rank's totals, or a
    grouped plan's host totals (:func:`~solar.schedule.keep.hostplan.host_totals`)."""

    spec: PlanSpec
    epoch_order: np.ndarray  # (E,) int64: the permutation index each run epoch uses
    stats: Any  # tuple[RankStats, ...]; grouped: the node's totals (a dict)
    plan_seconds: float
    fingerprint: str
    epochs: list | None = None  # every epoch's decisions, made in this process
    file: PlanFile | None = None  # or a plan file, read on demand
    hosts: Hosts | None = None  # the grouping by host (None: a buffer per rank)

    def __post_init__(self) -> None:
        if (self.epochs is None) == (self.file is None):
            raise ValueError("a plan holds either its epochs or a plan file")

    @property
    def header(self) -> str | None:
        """A plan file's header checksum (ranks compare it); None for a plan in memory."""
        return self.file.header if self.file is not None else None

    def bound_to(self, spec: PlanSpec) -> Plan:
        """This plan with ``spec``, which has its fingerprint: a plan file records its
        sampler's identity, ``spec`` holds the sampler itself, to prove the plan against."""
        if fingerprint(spec, self.hosts) != self.fingerprint:
            raise PlanMismatchError("plan: bound to a spec it was not made for")
        return dataclasses.replace(self, spec=spec)

    def check(self, expected: PlanSpec, source: str = "plan") -> None:
        """Refuse this plan unless it was made for ``expected`` (on its hosts); name the
        fields that differ."""
        if fingerprint(expected, self.hosts) == self.fingerprint:
            return
        diff = differences(self.spec, expected)
        raise PlanMismatchError(f"{source} was made for another dataset or run: {diff}")

    def check_hosts(self, hosts: Hosts) -> None:
        """Refuse a job whose ranks are grouped otherwise than the plan's, in one line."""
        if hosts != self.hosts:
            where = "plan" if self.file is None else f"plan {self.file.path}"
            made = "a buffer per rank" if self.hosts is None else f"hosts {grouping(self.hosts)}"
            raise PlanMismatchError(f"{where}: made for {made}, but this job's ranks are "
                                    f"grouped {grouping(hosts)} (by host name, or "
                                    "SOLAR_HOSTS)")  # fmt: skip

    def save(self, path: str | os.PathLike) -> Path:
        """Write the plan atomically: to a temporary file beside ``path``, then rename."""
        if self.epochs is None:
            raise SolarError("plan: only a plan made in this process can be saved")
        with PlanWriter(path, self.spec, self.epoch_order, self.hosts) as writer:
            for ep in self.epochs:
                writer.add(ep)
            writer.finish(self.stats, self.plan_seconds)
        return Path(path)

    # -- queries -------------------------------------------------------------------------
    @property
    def summary(self) -> PlanSummary:
        """The totals without the decisions."""
        return PlanSummary(self.spec, self.stats, self.plan_seconds, self.fingerprint,
                           self.hosts)  # fmt: skip

    @property
    def slots(self) -> int:
        """Slots of a buffer: a rank's (its capacity, or N if that is smaller); grouped by
        host, a host's (its ranks' capacities, at most N)."""
        return self._buffer_spec.slots

    @property
    def tier_slots(self) -> int:
        """Tier slots of a buffer, a rank's or grouped by host a host's (0: no second tier)."""
        spec = self._buffer_spec
        return tier_slot_count(spec.run, spec.buffer)

    @property
    def _buffer_spec(self) -> PlanSpec:
        """The inputs of the buffers this plan decides for: a rank's, or a host's."""
        return self.spec if self.hosts is None else host_run_spec(self.spec, self.hosts)

    def _check_rank(self, r: int) -> None:
        if not 0 <= r < self.world_size:
            raise SolarError(f"rank {r} is outside this plan's world size {self.world_size}")

    def _per_rank(self) -> None:
        """Refuse, in one line, a per-rank query of a plan grouped by host."""
        if self.hosts is not None:
            what = "plan: grouped by host" if self.file is None else \
                f"plan {self.file.path}: a host plan file"  # fmt: skip
            raise SolarError(f"{what} (one buffer per host), no per-rank plan: a rank's service "
                             "is plan.rank_epoch(rank, epoch)")  # fmt: skip

    def epoch(self, k: int) -> Any:
        """Epoch ``k`` whole (an :class:`~solar.schedule.keep.planner.EpochPlan`; grouped a
        :class:`~solar.schedule.keep.grouping.HostEpoch`; from a file: checksummed, validated only
        by :meth:`validate`)."""
        if self.epochs is not None:
            return self.epochs[k]
        assert self.file is not None
        return self.file.epoch(k)

    def rank_epoch(self, r: int, k: int) -> RankEpoch:
        """Rank ``r``'s part of run epoch ``k`` (grouped: its service; from a file: checked
        against its checksum, not validated; :meth:`rank` validates)."""
        self._check_rank(r)
        if self.file is None or self.hosts is not None:
            return self.epoch(k).rank(r)
        return self.file.read(r, k)

    def rank(self, r: int, comm: Any = None) -> RankPlan:
        """Rank ``r``'s accesses over the whole run.

        A plan made in this process is trusted. One read from a file is untrusted: it is proven
        safe first, as :meth:`validate` does (collectively with ``comm``).
        """
        self._per_rank()
        self._check_rank(r)
        if self.epochs is not None:
            parts = [ep.rank(r) for ep in self.epochs]
        else:
            proven = self._prove(r, comm, keep=True)
            assert proven is not None
            parts = proven
        return RankPlan.from_parts(r, parts, self.slots, tier_slots=self.tier_slots)

    def validate(self, rank: int, comm: Any = None) -> None:
        """Prove rank ``rank``'s part of a plan file safe to execute, epoch by epoch, keeping none
        of it (memory O(N + slots)): its checksums, then
        :class:`~solar.schedule.plans.validate.PlanValidator` (ranges, the sampler's draws, a replay
        proving every hit; grouped by host, each rank's service of its host's part). With
        ``comm`` (every rank calls this collectively) the ranks prove together that each epoch
        serves every sample exactly once, each rank its buffer's part (grouped: its host's, one
        rank speaking for its host's digests); without it, this process proves every part. A
        plan made in this process is trusted."""
        self._check_rank(rank)
        if self.epochs is None:
            self._prove(rank, comm, keep=False)

    def _prove(self, rank: int, comm: Any, keep: bool) -> list[RankEpoch] | None:
        from solar import dist  # a light module: no MPI or torch import

        assert self.file is not None
        key, hosts = dist.shared_key(comm), self.hosts
        mine = rank if hosts is None else hosts.host_of(rank)
        count = self.world_size if hosts is None else hosts.count
        kept: list[list | None] = [None]

        def check(alone: bool) -> Proof:
            parts = [mine, *(q for q in range(count) if q != mine)] if alone else [mine]
            # A rank's part is read alone, a validator each (memory O(N) a part); a host's part
            # comes with its ranks' services in its epoch, read once for every host proven.
            batches = [[q] for q in parts] if hosts is None else [parts]
            proven = [self._validated(b, key, keep and b[0] == mine) for b in batches]
            kept[0] = proven[0][0]
            vs = [v for _, v in proven]
            error = peers_error([v.peers_digest for v in vs])
            if error is not None:
                raise CorruptPlanError(error)
            total = np.asarray(np.sum([v.mine for v in vs], axis=0, dtype=np.uint64))
            return total, vs[0].expected, None if alone else vs[0].peers_digest

        prove(self.file.path, comm, check, speaks=hosts is None or hosts.groups[mine][0] == rank)
        return kept[0]

    def _validated(self, parts: list[int], key: int, keep: bool) -> tuple[list | None, Any]:
        """``parts`` of the file (a rank's, or hosts' with their services), checksummed and
        validated epoch by epoch (kept if ``keep``); the validator, holding its digests."""
        f = self.file
        assert f is not None
        v = PlanValidator(self.spec, self.hosts, f.epoch_order, key, parts)
        kept = []
        with closing(f.parts(parts[0]) if self.hosts is None else f.epochs()) as each:
            for ep in each:  # (the file is closed whatever happens)
                v.check(ep)
                if keep:
                    kept.append(ep)
        return (kept if keep else None), v

    def trace(self, rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(step, sample, hit)`` over ``rank``'s accesses in service order (a hit from RAM
        or from the tier); side rows, read only to be kept, are not accesses."""
        rp = self.rank(rank)
        served = rp.served
        return rp.steps()[served], rp.sample[served], rp.hit[served]


def make_plan(spec: PlanSpec, progress: Progress | None = None, hosts: Hosts | None = None) -> Plan:
    """Plan a run and keep every decision in memory (about 9 bytes per access); grouped by
    ``hosts``: one buffer per host (hosts of different sizes are refused: each is planned
    alone while the loader runs, and a whole plan's epoch holds every host's decisions)."""
    if hosts is not None and not hosts.uniform:
        sizes = [len(g) for g in hosts.groups]
        raise SolarError(f"hosts {hosts.as_record()}: ranks per host differ ({sizes}); a whole "
                         "host plan (Loader.plan, solar plan --share node) needs as many ranks "
                         "on every host (the loader plans each host alone as it runs)")  # fmt: skip
    epochs: list = []
    order, stats, seconds = _plan(spec, hosts, epochs.append, progress, keep_all=True)
    return Plan(spec, order, stats, seconds, fingerprint(spec, hosts), epochs=epochs, hosts=hosts)


def plan_to_file(
    spec: PlanSpec,
    path: str | os.PathLike,
    progress: Progress | None = None,
    on_epoch: EpochTotals | None = None,
    hosts: Hosts | None = None,
) -> Plan:
    """Plan a run straight into a plan file, one epoch at a time (memory independent of E;
    atomically: a temporary name, then a rename); grouped by ``hosts``: one buffer per host.
    ``on_epoch((accesses, hits))`` is told each epoch's totals of a per-rank plan."""
    # The header needs the epoch order first; the planner takes the same.
    order = epoch_order_of(spec if hosts is None else host_run_spec(spec, hosts))
    with PlanWriter(path, spec, order, hosts) as writer:
        _, stats, seconds = _plan(spec, hosts, writer.add, progress, on_epoch, order)
        writer.finish(stats, seconds)
    return load_plan(path)


def simulate(
    spec: PlanSpec,
    progress: Progress | None = None,
    on_epoch: EpochTotals | None = None,
    hosts: Hosts | None = None,
) -> PlanSummary:
    """Plan a run and keep only its totals: a simulator for runs too large to store (grouped
    by ``hosts``: one buffer per host, hosts of any sizes). ``on_epoch((accesses, hits))`` is
    told each epoch's totals of a per-rank plan as it is planned."""
    _, stats, seconds = _plan(spec, hosts, None, progress, on_epoch)
    return PlanSummary(spec, stats, seconds, fingerprint(spec, hosts), hosts)


def _plan(spec: PlanSpec, hosts: Hosts | None, sink: Callable[[Any], None] | None,
          progress: Progress | None, on_epoch: EpochTotals | None = None,
          epoch_order: np.ndarray | None = None,
          keep_all: bool = False) -> tuple[np.ndarray, Any, float]:  # fmt: skip
    """Plan every epoch in order, of either grouping, handing each to ``sink`` (or nothing):
    the epoch order, the totals (every rank's; grouped, the node's) and the seconds taken."""
    if hosts is None:
        _check_memory(spec, keep_all, tallied=sink is None)
        return _run_planner(spec, sink, progress, epoch_order, on_epoch)
    t0 = time.perf_counter()

    def add(ne: Any) -> None:  # (a sink telling ``progress`` each epoch's steps)
        assert sink is not None
        sink(ne)
        if progress is not None:
            progress(spec.run.steps_per_epoch)

    totals = host_totals(spec, hosts, sink=None if sink is None else add)
    return epoch_order_of(host_run_spec(spec, hosts)), totals, time.perf_counter() - t0


def load_plan(path: str | os.PathLike, sampler: Sampler | None = None) -> Plan:
    """Open a plan file, per rank or grouped by host (its ``hosts``); rank data is read on
    demand and checked against its checksums. A plan of a general sampler is proven against
    ``sampler`` (it must be the one it was made with)."""
    f = PlanFile.open(path)
    plan = Plan(f.spec, f.epoch_order, f.stats, f.plan_seconds, f.fingerprint, file=f,
                hosts=f.hosts)  # fmt: skip
    if sampler is not None:
        plan = plan.bound_to(dataclasses.replace(f.spec, sampler=sampler))
    return plan


def _run_planner(
    spec: PlanSpec,
    sink: Callable[[EpochPlan], None] | None,
    progress: Progress | None,
    epoch_order: np.ndarray | None = None,
    on_epoch: EpochTotals | None = None,
) -> tuple[np.ndarray, tuple[RankStats, ...], float]:
    """Plan every epoch in order, handing each to ``sink`` (or nothing); totals and seconds."""
    t0 = time.perf_counter()
    planner = Planner(spec, epoch_order)
    tally = Tally(spec.run.world_size, spec.equal_batches)
    for _ in range(spec.run.epochs):
        before = tally.a[:2].sum(axis=1).tolist()
        if sink is None:  # totals alone: an epoch planned in windows is tallied window by window
            for part in planner.next_parts():
                tally.add(part)
        else:
            seq, sched = planner.next_schedule()
            tally.add(sched)
        if on_epoch is not None:
            accesses, hits = (x - y for x, y in zip(tally.a[:2].sum(axis=1).tolist(), before,
                                                   strict=True))  # fmt: skip
            on_epoch((accesses, hits))
        if sink is not None:
            sink(planner.group(seq, sched))
        if progress is not None:
            progress(spec.run.steps_per_epoch)
    return planner.epoch_order, tally.stats(), time.perf_counter() - t0


def trace_accesses(spec: PlanSpec) -> tuple[int, bool]:
    """About this many accesses in an epoch of a sampler's trace, and whether that is an
    estimate: its draws, or every rank's batch every step where batches hold more than their
    draws (a neighbour sampler's subgraphs: ~50 nodes per seed), each counted as the sampler's
    typical batch (a few drawn) or else its bound."""
    run = spec.run
    typical = spec.sampler.typical_batch(run)
    batch = spec.sampler.batch_bound(run) if typical is None else typical
    accesses = batch * run.world_size * run.steps_per_epoch
    return int(max(run.samples_per_epoch, accesses)), typical is not None and \
        accesses > run.samples_per_epoch  # fmt: skip


@dataclass(frozen=True)
class PlanMemory:
    """What planning a run holds at its peak, estimated from its spec before planning starts
    (:func:`plan_memory`): ``need`` bytes for at most ``accesses`` accesses over the run,
    ``per_epoch`` in an epoch (a sampler's trace: its bound), ``held`` epochs of them at once
    (the trace's look-ahead and the one planned; 1 for Shuffle, whose order is two arrays of N),
    or, planned in windows of ``window`` steps, two windows of them. A plan written to a file
    or simulated is planned one epoch at a time: ``need`` does not grow with the epochs beyond
    ``held``."""

    need: int
    accesses: int
    per_epoch: int
    held: int
    estimated: bool = False  # accesses from a few batches drawn (else a bound)
    window: int | None = None

    def text(self, room: tuple[int, str] | None = None, whose: str = "") -> str:
        """One line: the figure (``whose``: e.g. " per process"), and the memory ``room``
        (:func:`memory_room`) beside it."""
        held = f", {self.held} epochs of it held at once" if self.held > 1 else ""
        if self.window is not None:
            held = f", planned in windows of {self.window} steps"
        many = "about" if self.estimated else "at most"
        line = (f"planning: {many} {self.accesses} accesses ({self.per_epoch} per epoch{held}): "
                f"about {format_bytes(self.need)} of memory{whose}")  # fmt: skip
        if room is not None:
            line += f" ({format_bytes(room[0])} {room[1]})"
        return line


# Bytes of an epoch's decisions planned in windows, joined (sample, rank, slot, flags), and
# grouped by rank for a plan file: what the epoch holds beyond its two windows of trace.
_JOINED_BYTES = 20
# Bytes per key of the tables keyed by a trace's keys numbered densely: the backward pass's
# last uses (8), page mates' later uses (24: next, seen, offered), who holds what (8). A
# trace's solar policy holds no table of N.
_TABLE_BYTES = 40


def _keyed_bytes(accesses: float, span: int) -> float:
    """Peak bytes of the keyed tables of ``accesses`` accesses whose keys span ``span``
    (solar/schedule/draw/keyspace.py: its path taken as key_space takes it; its figures
    measured by bench/keyspace_memory.py)."""
    if span < ks.OFFSET_SPAN * accesses:  # every key of the span
        return ks.OFFSET_BYTES * accesses + (ks.KEY_BYTES + _TABLE_BYTES) * span
    return (ks.SORT_BYTES + ks.KEY_BYTES + _TABLE_BYTES) * accesses  # at most one key each


def plan_memory(spec: PlanSpec, keep_all: bool = False, tallied: bool = False,
                ranks: int | None = None) -> PlanMemory:  # fmt: skip
    """What planning ``spec`` holds at its peak (:class:`PlanMemory`); ``keep_all``: every
    decision kept in memory (:func:`make_plan`), not streamed into a file or a summary;
    ``tallied``: only totals kept (:func:`simulate`: an epoch planned in windows is tallied
    window by window); ``ranks``: this process plans that many ranks alone, a planner each
    (solar/schedule/plans/together.py), not every rank."""
    run = spec.run
    planners = 1 if ranks is None else ranks
    part = 1.0 if ranks is None else ranks / run.world_size  # its share of the accesses
    # A sampler's trace without affinity, by the solar policy: tables by the window's keys.
    keyed = spec.traced and not spec.affinity and spec.policy == "solar"
    # Its heaps and cells: every rank's, or the one rank each planner plans alone (belady.py).
    rows = 1 if keyed and ranks is not None and rank_alone(spec) else run.world_size
    # Planner state, two epochs of order and next uses, one epoch's decisions (measured peak:
    # bench/plan_bench.py); a plan kept in memory adds about 9 bytes per access.
    need = (
        planners
        * (
            (0 if keyed else 48 * run.num_samples)
            + 24 * rows * slot_count(run, spec.buffer)
            + 36 * rows * tier_slot_count(run, spec.buffer)
        )
        + 40 * run.samples_per_epoch * part
    )
    per_epoch, estimated = trace_accesses(spec) if spec.traced else (run.samples_per_epoch,
                                                                        False)  # fmt: skip
    accesses = per_epoch * run.epochs if spec.traced else run.num_accesses
    if keep_all:
        need += 10 * accesses * part
    if spec.policy != "solar":
        need += planners * 16 * run.world_size * run.num_samples  # per-(rank, sample) tables
    held, window = 1, spec.steps_window if spec.traced else None
    if spec.traced:  # the trace over the horizon (solar.schedule.draw.traces)
        from solar.schedule.draw.traces import BYTES_PER_ACCESS, default_horizon

        h = default_horizon(run, spec.sampler) if spec.horizon is None else spec.horizon
        held = min(h, run.epochs - 1) + 1
        trace: float = per_epoch * held
        if window is not None:  # two windows of trace; the epoch's decisions joined
            trace = per_epoch * min(1.0, 2 * window / run.steps_per_epoch)
            need += 0 if tallied else _JOINED_BYTES * per_epoch * part
        need += BYTES_PER_ACCESS * trace * part
        if keyed:  # a planner's keys: (rank, sample) pairs of every rank, or of its own
            span = run.num_samples * (run.world_size if ranks is None else 1)
            need += planners * _keyed_bytes(trace * part / planners, span)
        if spec.pages is not None:  # page mates' side rows (their tables are keyed)
            need += 20 * (per_epoch if window is None else trace) * part
    return PlanMemory(int(need), int(accesses), int(per_epoch), held, estimated, window)


def _check_memory(spec: PlanSpec, keep_all: bool, tallied: bool = False) -> None:
    """Refuse a plan that cannot fit in memory, before allocating any of it."""
    m = plan_memory(spec, keep_all, tallied)
    # (a traced sampler's accesses may be estimated from a few batches drawn: said so)
    many = "an estimated " if m.estimated else ""
    require_memory(m.need, f"planning {many}{m.accesses} accesses")

"""A run planned by a job's processes together (``mpiexec -n Q solar plan``): each process plans
its share of the ranks, epoch by epoch, and process 0 writes the plan file one rank's part at
a time; the totals are every process's summed.

A rank's plan depends on its own accesses alone where the sampler fixes each rank's batch
(a NeighborSampler, a Trace: :func:`~solar.schedule.keep.planner.rank_alone`), so process q
plans ranks q, q + Q, ... alone (a planner each, as a Loader's rank does) and the decisions
are those of one process planning every rank. Where a rank's plan needs every rank's accesses
(Shuffle's affinity, equal batches) process 0 plans them all and the others wait, asleep
(:func:`solar._process.wait_quietly`: MPICH's ``Barrier`` polls, a core burnt per waiting process).

Memory is checked per host before any process allocates: the needs of the processes that share
a host's memory (MPI's ``COMM_TYPE_SHARED``: :func:`~solar.host.place.place`) summed.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from solar._memory import require_memory
from solar._process import poll, wait_quietly
from solar.errors import SolarError
from solar.host.place import place
from solar.schedule.draw.order import sample_dtype
from solar.schedule.keep.planner import Planner, RankEpoch, rank_alone
from solar.schedule.keep.summary import PlanSummary, Tally
from solar.schedule.plans.plan import (
    EpochTotals,
    PlanMemory,
    load_plan,
    plan_memory,
    plan_to_file,
    simulate,
)
from solar.schedule.plans.planfile import PlanWriter, fingerprint
from solar.schedule.policy import Progress, no_tier, tier_slot_count
from solar.schedule.spec import PlanSpec

_PART = 7  # the tag of a rank's part sent to process 0, one message an array, in this order
_FIELDS = ("sample", "slot", "flags", "tslot")  # (tier slots only where a tier is planned)


def share(spec: PlanSpec, procs: int, q: int) -> list[int]:
    """The ranks process ``q`` of ``procs`` plans: every ``procs``-th from ``q`` where a rank
    is planned alone, else all of them on process 0 (none elsewhere)."""
    if rank_alone(spec):
        return list(range(q, spec.run.world_size, procs))
    return list(range(spec.run.world_size)) if q == 0 else []


def plan_together(
    spec: PlanSpec,
    comm: Any,
    path: str | os.PathLike | None = None,
    progress: Progress | None = None,
    on_epoch: EpochTotals | None = None,
) -> PlanSummary | None:
    """Plan ``spec`` with the processes of ``comm`` (a collective of them: an mpi4py
    communicator), each its :func:`share` of the ranks, into the plan file ``path`` (written by
    process 0) or only its totals. Returns the run's totals on process 0 (None elsewhere);
    ``on_epoch`` and ``progress`` are told there, epoch by epoch."""
    q, procs = comm.Get_rank(), comm.Get_size()
    require_host_memory(spec, comm, tallied=path is None)
    if not rank_alone(spec):  # process 0 plans every rank, as one process would
        made: PlanSummary | None = None
        if q == 0:
            made = plan_to_file(spec, path, progress, on_epoch).summary if path is not None \
                else simulate(spec, progress, on_epoch)  # fmt: skip
        wait_quietly(comm)
        return made
    t0 = time.perf_counter()
    mine = share(spec, procs, q)
    planners = {r: Planner(spec, only_rank=r) for r in mine}
    tallies = {r: Tally(spec.run.world_size) for r in mine}  # (a rank's batch: its own)
    with contextlib.ExitStack() as stack:
        writer = None
        if q == 0 and path is not None:
            order = planners[0].epoch_order
            writer = stack.enter_context(PlanWriter(path, spec, order))
        for k in range(spec.run.epochs):
            before = _accesses_hits(tallies)
            parts = _epoch(planners, tallies, keep=path is not None)
            if path is not None:
                _gather_parts(comm, spec, k, parts, writer)
            got = comm.allreduce(_accesses_hits(tallies) - before)
            if q == 0 and on_epoch is not None:
                on_epoch((int(got[0]), int(got[1])))
            if q == 0 and progress is not None:
                progress(spec.run.steps_per_epoch)
        stats = _totals(comm, tallies, spec.run.world_size)
        seconds = time.perf_counter() - t0
        if writer is not None:
            writer.finish(stats, seconds)
    if q != 0:
        return None
    if path is not None:
        return load_plan(path).summary
    return PlanSummary(spec, stats, seconds, fingerprint(spec, None))


@dataclass(frozen=True)
class HostMemory:
    """What planning holds on this process's host: ``mine``, this process's figure (a share of
    the ranks, or every rank on process 0 where they cannot be planned apart); ``host``,
    bytes the ``processes`` of the host hold together (theirs summed)."""

    mine: PlanMemory
    host: int
    processes: int


def host_memory(spec: PlanSpec, comm: Any, tallied: bool) -> HostMemory:
    """This host's :class:`HostMemory` (a collective of ``comm``): the processes sharing the
    host's memory (MPI's ``COMM_TYPE_SHARED``) add up their needs."""
    mine = share(spec, comm.Get_size(), comm.Get_rank())
    if rank_alone(spec):
        m = plan_memory(spec, tallied=tallied, ranks=max(1, len(mine)))
    else:  # process 0 plans every rank as one process; the others hold no planner
        m = plan_memory(spec, tallied=tallied)
        m = m if mine else replace(m, need=0)
    machine = place(comm).machine_comm or comm
    needs = machine.allgather(m.need)
    return HostMemory(m, int(sum(needs)), len(needs))


def require_host_memory(spec: PlanSpec, comm: Any, tallied: bool) -> None:
    """Refuse, in one line from one process a host, a plan whose processes on a host need
    more memory together than the host has free, before any allocates (a collective)."""
    got = host_memory(spec, comm, tallied)
    machine = place(comm).machine_comm or comm
    if machine.Get_rank() == 0:  # (the others wait below; a refusal here ends the job)
        require_memory(got.host, f"planning {got.mine.accesses} accesses with this host's "
                                 f"{got.processes} processes")  # fmt: skip
    wait_quietly(machine)


def _accesses_hits(tallies: dict[int, Tally]) -> np.ndarray:
    """This process's accesses and hits so far: (2,) int64."""
    out = np.zeros(2, np.int64)
    for t in tallies.values():
        out += t.a[:2].sum(axis=1)
    return out


def _epoch(planners: dict[int, Planner], tallies: dict[int, Tally],
           keep: bool) -> dict[int, RankEpoch]:  # fmt: skip
    """The next epoch of each of this process's ranks, tallied; their parts if ``keep`` (a
    plan file written), else tallied window by window (Planner.next_parts) and let go."""
    parts = {}
    for r, p in planners.items():
        if not keep:
            for part in p.next_parts():
                tallies[r].add(part)
            continue
        seq, sched = p.next_schedule()
        tallies[r].add(sched)
        parts[r] = p.rank_part(r, seq, sched)
    return parts


def _gather_parts(comm: Any, spec: PlanSpec, k: int, parts: dict[int, RankEpoch],
                  writer: PlanWriter | None) -> None:  # fmt: skip
    """Epoch ``k``'s parts of every rank to process 0's ``writer``, in rank order, one at a
    time (each process sends its own as process 0 asks for them, one array a message)."""
    world, procs = spec.run.world_size, comm.Get_size()
    fields = _FIELDS if tier_slot_count(spec.run, spec.buffer) else _FIELDS[:3]
    offsets = np.zeros((world, spec.run.steps_per_epoch + 1), np.int64)
    for r, part in parts.items():
        offsets[r] = part.step_offsets
    offsets = comm.allreduce(offsets)  # (each rank's row from its process, zeros elsewhere)
    if writer is None:  # (sent without waiting for process 0's writes in a polling Send)
        from mpi4py import MPI  # (comm is one of its communicators)

        sends = []
        for r in sorted(parts):
            for name in fields:
                a = np.ascontiguousarray(getattr(parts[r], name))
                sends.append((comm.Isend(a, dest=0, tag=_PART), a))  # (a held until sent)
            parts[r] = None  # type: ignore[assignment]
        poll(lambda: bool(MPI.Request.Testall([req for req, _ in sends])), lambda: None)
        return

    def each() -> Iterator[RankEpoch]:
        for r in range(world):
            if r in parts:
                yield parts.pop(r)
                continue
            n = int(offsets[r, -1])
            got = {"tslot": no_tier(n)}
            for name, dtype in zip(fields, (None, np.int32, np.uint8, np.int32), strict=False):
                got[name] = np.empty(n, _sample_dtype(spec) if dtype is None else dtype)
                _receive(comm, got[name], r % procs, f"rank {r}'s {name}s of epoch {k}")
            yield RankEpoch(k, got["sample"], got["slot"], got["flags"], offsets[r], got["tslot"])

    writer.add_ranks(k, offsets, each())


def _receive(comm: Any, buf: np.ndarray, source: int, what: str) -> None:
    """``buf`` filled by a message of ``source``, refused (in one line, the job ended by the
    caller's abort) unless it is exactly ``buf``'s size: a part of the wrong length or type
    would be written, and checksummed, as the plan."""
    from mpi4py import MPI  # (comm is one of its communicators)

    status = MPI.Status()
    comm.Probe(source=source, tag=_PART, status=status)
    got = status.Get_count(MPI.BYTE)
    if got != buf.nbytes:
        raise SolarError(f"process {source} sent {what} as {got} bytes, not the {buf.nbytes} "
                         f"of {buf.size} {buf.dtype} its offsets say")  # fmt: skip
    comm.Recv(buf, source=source, tag=_PART)


def _sample_dtype(spec: PlanSpec) -> np.dtype:
    """The sample ids' type a rank's part is planned in (what its process sends)."""
    return np.dtype(sample_dtype(spec.run.num_samples))


def _totals(comm: Any, tallies: dict[int, Tally], world: int) -> Any:
    """Every rank's totals on process 0 (None elsewhere): each process tallied its own ranks,
    each in a planner whose other ranks' batches are empty."""
    a = np.zeros((6, world), np.int64)
    low = np.full(world, np.iinfo(np.int64).max, np.int64)
    high = np.zeros(world, np.int64)
    for r, t in tallies.items():
        a += t.a
        low[r], high[r] = t.min_batch[r], t.max_batch[r]
    got = comm.gather((a, low, high), root=0)
    if got is None:
        return None
    tally = Tally(world)
    tally.a = np.sum([a for a, _, _ in got], axis=0)
    tally.min_batch = np.min([lo for _, lo, _ in got], axis=0)
    tally.max_batch = np.max([hi for _, _, hi in got], axis=0)
    return tally.stats()

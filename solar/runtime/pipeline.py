"""The pipeline: one process's stages, built once, run one step at a time.

:func:`build` composes the stages a :class:`~solar.runtime.setup.Setup` calls for — which
assembly (rows as read, transformed, or held transformed), whether the first step is read
before its plan, a tier or not — so no stage tests a mode per step. :meth:`Pipeline.serve`
runs step ``k`` through them in order: holdings (refilled if the step is not the next one
they match), assembly (reads waited for, hits gathered, updates applied, transforms),
delivery (trim or exchange, the dict), then the step's figures, from the stages' own records.
"""

from __future__ import annotations

import os
import time
from typing import Any

from solar.cache.nodetier import NodeTierFile
from solar.cache.slots import SlotBuffer
from solar.cache.tier import TierFile, tier_stride
from solar.dist import abort_job_on_error, shared_key
from solar.errors import SolarError
from solar.exchange import Exchange
from solar.host.region import NodeRegion
from solar.remote.link import TrainerLink
from solar.runtime.assembly import Assembly
from solar.runtime.delivery import Delivered, Delivery
from solar.runtime.holdings import Alone, Holdings, Host, RawRefill, Refill
from solar.runtime.memory import BatchMemory, InFlight
from solar.runtime.packing import Packer
from solar.runtime.reads import ReadAhead, Reads
from solar.runtime.remote import RemoteTransforms, trainer_spec
from solar.runtime.setup import Setup
from solar.runtime.steps import Steps
from solar.runtime.transforms import HeldTransformAssembly, TransformAssembly, TransformedRefill
from solar.runtime.workers import TransformPool
from solar.schedule.keep.grouping import stage_bound
from solar.schedule.plans.stream import RankStream
from solar.stats import LoaderStats, StepStats
from solar.tune import MAX_READ_AHEAD, READ_AHEAD_BYTES, Knob, Tuner, reader_knobs


class Pipeline:
    """A Loader's stages in one process (its threads, batch memory, buffer and tier)."""

    def __init__(self, steps: Steps, holdings: Holdings, assembly: Assembly, delivery: Delivery,
                 stats: LoaderStats, tuner: Tuner | None, pool: TransformPool | None,
                 comm: Any) -> None:  # fmt: skip
        self.steps = steps
        self.holdings = holdings
        self.assembly = assembly
        self.queue = assembly.queue
        self.memory = assembly.memory
        self.delivery = delivery
        self.stats = stats
        self.tuner = tuner
        self.pool = pool
        self._comm = comm  # with equal batches the other ranks wait for this one's rows
        self._served = (-1, 0.0)  # the last step served, and when
        # Transform(remote=): its epochs' members (who owns which step) come from trainer rank 0.
        self.remote = pool if isinstance(pool, RemoteTransforms) else None

    @property
    def tier(self) -> TierFile | None:
        """This process's tier (None without one)."""
        return self.holdings.tier

    def seek(self, k: int) -> None:
        """Make step ``k`` the next one served: if it is not, drain the work under way and
        refill the buffer and tier to the plan's state at ``k``."""
        if self.assembly.next_step() == k:
            return
        self._drain(k)
        t0 = time.perf_counter()
        nbytes = self.holdings.refill(k)
        stats = self.stats.epoch(k // self.steps.spe)
        stats.rebuild_seconds += time.perf_counter() - t0
        stats.bytes_read += nbytes

    def _drain(self, k: int) -> None:
        """Wait for the reads and transforms under way, and start the tier's run of steps at
        ``k`` (no step from there on has started)."""
        self.assembly.drain()
        self.holdings.reset(k)
        self.queue.drain()

    def serve(self, k: int) -> dict:
        """Step ``k``'s batch, delivered, its figures recorded."""
        # With equal batches the other ranks wait for this one's rows: a failure here ends
        # the job rather than leave them in the exchange.
        with abort_job_on_error(self._comm):
            if k % self.steps.spe == 0:  # an epoch's start: the files are still the data's
                self.queue.reads.reader.check_files()
                self._members(k // self.steps.spe)
            self.seek(k)  # if another iterator (or a failed step) moved the buffer elsewhere
            if k == 0 and self.holdings.at == 0:  # nothing held: where the run's mode says,
                self.queue.start_first()  # the first step's reads, while its plan is made
            self.steps.enter(k)  # the step being served: planned (waited for) if it must be
            try:
                began = time.perf_counter()
                io = self.assembly.take(k)
                assert io.plan.step == k, (io.plan.step, k)  # seek made the next step k
                self.assembly.finish(k, io)
                rows = self.delivery.fit(k, io)
                self._record(k, io, rows, began)
            except BaseException:
                # A failed step leaves the buffer, the read-ahead queue and the tier's held
                # reads unknown: the next iteration seeks (drains, resets, refills) first.
                self.holdings.lose()
                raise
            del io  # the raw rows go back to their pool
            return self.delivery.batch(k, rows)

    def _members(self, e: int) -> None:
        """Epoch ``e``'s members of this trainer's plan (preprocessing workers: who owns which
        step), as trainer rank 0 decided them; where this trainer's own buffer is planned
        again, the work under way (of the old plan) is dropped and the buffer refilled."""
        stream = None if self.remote is None else self.remote.epoch(e, self.steps.member)
        if stream is None:
            return
        self.assembly.drain()
        self.queue.drain()
        self.steps.retrace(stream)
        self.holdings.lose()  # (seek refills it to the new plan)

    def _record(self, k: int, io: InFlight, rows: Delivered, began: float) -> None:
        """Step ``k``'s figures, each from the stage that wrote it."""
        # The trainer's period: since the previous step was served, if it was the step
        # before in this epoch (else the time serving this one: a gap between epochs is not
        # the pipeline's).
        now, spe = time.perf_counter(), self.steps.spe
        last, at = self._served
        wall = now - at if last == k - 1 and k % spe else now - began
        self._served = (k, now)
        step, read, shaped = io.plan, io.read, io.shaped
        executor = self.queue.reads.reader.executor
        record = StepStats(
            epoch=k // spe, step=k, batch=int(rows.ids.size),
            hits=int(step.hit_rows.size), reads=int(step.read_rows.size),
            side_reads=int(step.side_samples.size), tier_hits=int(step.tier_rows.size),
            tier_writes=int(step.tier_writes.size), **read._asdict(),
            sent=rows.sent, received=rows.received, exchange_seconds=rows.exchange_seconds,
            transform_seconds=shaped.transform_seconds, transformed=shaped.transformed,
            transform_workers=shaped.transform_workers, wall_seconds=wall,
            read_threads=executor.threads, decode_threads=executor.decode_threads,
        )  # fmt: skip
        record.stall_seconds += shaped.waited
        self.stats.record(record)
        if self.tuner is not None:
            self.tuner.observe(record)

    def wait_reads(self) -> None:
        """Wait until the reads (and transforms) under way are done; they stay queued."""
        self.queue.wait()
        self.assembly.wait()

    def close(self) -> None:
        """Wait for the work under way; remove the tier file; stop the transform workers."""
        self._drain(0)
        self.queue.reads.misses.close()
        self.holdings.close()
        if self.pool is not None:
            self.pool.close()


def stream(setup: Setup, snapshots: str | os.PathLike | None,
           link: TrainerLink | None = None) -> RankStream:  # fmt: skip
    """This rank's part of ``setup``'s plan, one epoch at a time: read from the plan given, or
    planned one epoch ahead in the background; of its own buffer (a host of one rank), or its
    share of its host's (``setup.shared``: the host's plan, planned or read); served by
    preprocessing workers (``link``), of the steps it keeps (solar/schedule/draw/members.py)."""
    given = setup.given
    # Where the misses are read from: the planner decides it with the plan (packing's model).
    packing = None if setup.pack is None else setup.pack.model
    mine = None if link is None else trainer_spec(setup, link)
    if mine is not None:  # (no snapshots: rank 0's are of the run's plan, not a member's)
        return RankStream(mine, setup.rank, packing=packing)
    if not setup.shared:
        return RankStream(setup.spec, setup.rank, given, snapshots, packing=packing)
    stage = stage_bound(setup.spec, setup.hosts)
    if given is not None:
        return RankStream(given.spec, setup.rank, given, stage_rows=stage, packing=packing)
    return RankStream(setup.spec, setup.rank, None, snapshots, hosts=setup.hosts, stage_rows=stage,
                      comm=setup.host_comm, packing=packing)  # fmt: skip


def build(setup: Setup, stream: RankStream, stats: LoaderStats, exchange: Exchange | None,
          link: TrainerLink | None = None) -> Pipeline:  # fmt: skip
    """This process's pipeline for ``setup``'s run, its buffer and tier allocated now (with
    ``share="node"``, the host's shared buffer: a collective of the host's ranks).

    A host's buffer (``setup.shared``: a stream of a rank's share of it) holds no transformed
    rows (refused by setup) and runs no step read before its plan (its peer rows are another
    rank's), no tier hit read ahead (another rank may write its slot until the step starts:
    the holdings read them at the step), and no step assembled ahead: a rank never waits at a
    host barrier for a step the others have not been asked for (a trainer's own collectives
    between steps would then wait for it)."""
    remote = setup.transform is not None and setup.transform.remote is not None
    if remote and (link is None or link.pid != os.getpid()):
        # A copy (pickled, or forked) has no pairs of its own: its workers' steps would be
        # read by no one.
        raise SolarError("transform remote=: this Loader is a copy of the one that met its "
                         "workers (pickled or in a forked process): iterate that one")  # fmt: skip
    spec, run = setup.spec, setup.run
    steps = Steps(spec, setup.rank, stream)
    shared = setup.shared
    pool: TransformPool | None = None
    if link is not None:
        pool = RemoteTransforms(setup, link, steps)  # workers share its steps
        stats.remote = pool.figures
    elif setup.transform is not None:
        pool = TransformPool(setup.transform, run.seed, setup.info.keys, setup.out_keys,
                             setup.cores)  # fmt: skip
    holdings = _host_holdings(setup, stream, steps) if shared else \
        _holdings(setup, stream, steps, pool)  # fmt: skip
    memory = BatchMemory(
        setup.info.keys, spec.batch_rows(steps.served_rows()),
        None if pool is None else setup.out_keys, steps.served_rows(),
        setup.config.pin_memory, None if pool is None else pool.allocate(),
    )  # fmt: skip
    ahead_tier = None if shared else holdings.tier  # tier hits read ahead with the reads
    # The first step read before its plan: a sampler that splits its own batches, no tier.
    first_ahead = (
        steps.own_batches and holdings.tier is None and not shared and steps.member is None
    )  # (a member's first step may be another member's)
    misses = None
    if setup.pack is not None:
        misses = Packer(steps, setup.reader, setup.pack)
        stats.packing = misses.figures
    queue = ReadAhead(Reads(steps, setup.reader, memory, ahead_tier, setup.holds_transformed,
                            misses), setup.config.read_ahead_steps(run.batch_size),
                      first_ahead)  # fmt: skip
    assembly = Assembly(steps, queue, memory, holdings)
    if pool is not None:
        kind = HeldTransformAssembly if setup.holds_transformed else TransformAssembly
        assert setup.transform is not None
        assembly = kind(steps, queue, memory, holdings, pool,
                        0 if shared else setup.transform.ahead, setup.comm)  # fmt: skip
    # Equal batches (across hosts too: a host's surplus rows move to other hosts' ranks).
    delivery = Delivery(steps, setup.out_keys, exchange, setup.batch_transform, setup.comm,
                        setup.batch_format)  # fmt: skip
    tuner = _tuner(setup, stats, queue, pool) if setup.config.auto else None
    # A failed step ends the job where other ranks wait for this one's rows (equal batches)
    # or at its host's barriers.
    comm = setup.comm if exchange is not None or shared else None
    return Pipeline(steps, holdings, assembly, delivery, stats, tuner, pool, comm)


def _holdings(setup: Setup, stream: RankStream, steps: Steps,
              pool: TransformPool | None) -> Holdings:  # fmt: skip
    """A rank's own buffer and tier (a host of one rank: nothing shared, no barrier)."""
    spec, run = setup.spec, setup.run
    tier = None
    if stream.tier_slots and setup.tier_dir is not None:
        # Named for the plan and the rank (and, by TierFile, the host and process).
        tier = TierFile(
            setup.tier_dir, slots=stream.tier_slots, keys=setup.held_keys,
            executor=setup.reader.executor, name=f"{spec.fingerprint[:12]}-r{setup.rank}",
            staging_slots=max(64, (256 << 20) // tier_stride(setup.held_keys)),  # 256 MiB
        )  # fmt: skip
    buffer = SlotBuffer(stream.slots, setup.held_keys)
    alone = Alone(buffer.arrays, tier)  # the holdings' host and their refill's: of one rank
    n = spec.buffer.cap(run.batch_size)  # rows a refill reads at a time
    refill: Refill = RawRefill(setup.reader, buffer, tier, setup.info.keys, n, alone)
    if setup.holds_transformed:
        assert pool is not None
        refill = TransformedRefill(setup.reader, pool, buffer, tier, steps, setup.info.keys,
                                   setup.out_keys, n)  # fmt: skip
    return Holdings(buffer, tier, steps, refill, alone)


def _host_holdings(setup: Setup, stream: RankStream, steps: Steps) -> Holdings:
    """``share="node"``: the host's buffer and staging rows in one shared region, its tier one
    file shared by its ranks, the steps collectives of the host's ranks."""
    hc = setup.host_comm
    if (setup.comm is None and setup.world_size > 1) or os.getpid() != stream.pid:
        raise SolarError('share="node": this process is not the one that joined its host '
                         "(a forked or unpickled copy cannot join its host's buffer: iterate "
                         "the Loader where it was made, or pass "
                         "memory=MemoryConfig(share='rank'))")  # fmt: skip
    keys = [(k.sample_shape, k.native_dtype) for k in setup.held_keys]
    parts = Host.region_parts(stream.slots, stream.stage_rows, keys)
    region = NodeRegion(NodeRegion.size_of(parts), hc, stream.host, stream.local,
                        local_size=len(stream.group))  # fmt: skip
    tier = None
    if stream.tier_slots and setup.tier_dir is not None:  # the host's: one file, all open it
        tier = NodeTierFile(
            setup.tier_dir, slots=stream.tier_slots, keys=setup.held_keys,
            executor=setup.reader.executor, comm=hc, key=shared_key(setup.comm),
            host=stream.host, local_rank=stream.local,
            staging_slots=max(64, (256 << 20) // tier_stride(setup.held_keys)),  # 256 MiB
        )  # fmt: skip
    # The steps' barriers are the region's: a host's own, whatever the communicator; a wait
    # for a plan is shown there too (a rank on another step than its host's is named).
    barrier = region.barrier(stream.group, stream.spe)
    stream.watch(barrier)
    host = Host(region, stream.slots, stream.stage_rows, keys, barrier, tier)
    buffer = SlotBuffer.over(host.slots, setup.held_keys)
    refill = RawRefill(setup.reader, buffer, tier, setup.info.keys,
                       setup.spec.buffer.cap(setup.run.batch_size), host, stream.local,
                       len(stream.group))  # fmt: skip
    return Holdings(buffer, tier, steps, refill, host)


def _tuner(setup: Setup, stats: LoaderStats, queue: ReadAhead,
           pool: TransformPool | None) -> Tuner:  # fmt: skip
    """threads="auto": the tuner of this process's reader threads, read-ahead depth and
    (threads, workers="auto") transform workers (solar/tune.py)."""
    tuner = Tuner(stats, setup.cores)
    for knob in reader_knobs(setup.reader.executor, tuner.budget):
        tuner.register(knob)
    spec = setup.transform
    if pool is not None and spec is not None and spec.workers == "auto" and not spec.processes:
        tuner.register(Knob("transform_workers", "transform", lambda: pool.workers,
                            pool.resize, 1, tuner.budget))  # fmt: skip
    step_bytes = max(1, setup.run.batch_size * setup.info.sample_bytes)
    cap = min(MAX_READ_AHEAD, READ_AHEAD_BYTES // step_bytes)
    tuner.read_ahead(lambda d: setattr(queue, "depth", d), queue.depth, cap)
    return tuner

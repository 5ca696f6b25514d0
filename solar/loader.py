"""The Loader: executes one rank's part of a Plan and yields torch batches.

Three places, one each: a sample's bytes are read by ``Executor._run`` (solar/io/executor.py),
from storage or the tier; the decision to keep or evict them was made by the planner
(solar/schedule/belady.py for the ``solar`` policy) and reaches the runtime as a
:class:`~solar.schedule.rankplan.StepPlan`; they are copied into a batch by
:func:`~solar.cache.slots.copy_rows`, through ``SlotBuffer.gather`` and ``SlotBuffer.store``
in :meth:`Loader._consume`. The Loader itself owns no policy: per step it starts the plan's
reads (several steps ahead), waits for them, gathers the hits and stores the admissions.

With a second tier (``tier=`` a directory on node-local NVMe), the same holds one level down:
tier hits are read from the rank's tier file (solar/cache/tier.py) straight into batch rows by
the same executor as storage reads, and the plan's demotions and tier admissions are written
there off the critical path, after the batch is assembled; the tier orders its own slots'
writes and reads.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import os
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from solar._cpu import cpu_share
from solar._memory import require_memory
from solar._process import ProcessLocal
from solar.cache.batches import Allocator, BatchPool, torch_dtype
from solar.cache.slots import SlotBuffer, check_budget, copy_rows
from solar.cache.tier import TierFile, tier_stride
from solar.config import DEFAULT_SLACK, BufferConfig, ReaderConfig, RunConfig, parse_size
from solar.dist import abort_job_on_error, agree, ranks_on_host
from solar.errors import SolarError
from solar.exchange import Exchange
from solar.io.executor import combine, step_io
from solar.io.hdf5 import DatasetInfo, KeyInfo
from solar.io.reader import Reader
from solar.io.sources import describe_source
from solar.readahead import InFlight, ReadAhead
from solar.schedule import Plan, PlanSpec, RankPlan, load_plan, make_plan
from solar.schedule._common import ADMIT, DEMOTE, slot_count, tier_slot_count
from solar.schedule.order import step_bounds
from solar.schedule.pagemates import PageLayout
from solar.schedule.rankplan import StepPlan
from solar.schedule.samplers import SHUFFLE, Sampler, Trace
from solar.schedule.stream import RankStream
from solar.stats import LoaderStats, StepStats
from solar.transform import (
    Rows,
    SampleFn,
    Transform,
    TransformPool,
    as_transform,
    first_outputs,
    output_keys,
    repeats,
)
from solar.tune import MAX_READ_AHEAD, READ_AHEAD_BYTES, Knob, Tuner, reader_knobs
from solar.warm import measured, rehearse_loader


def check_batch_memory(
    spec: PlanSpec,
    config: ReaderConfig,
    sample_bytes: int,
    transform: Transform | None = None,
    out_bytes: int = 0,
    held_bytes: int | None = None,
) -> None:
    """Refuse a run whose buffer and batch memory exceed the memory available now. Batches in
    memory at once: those read ahead, the one served and the one the trainer holds, each as
    long as the sampler's largest (a neighbour sampler's subgraph, not its seeds); with a
    ``transform``, also those transformed ahead, each with its transformed rows
    (``out_bytes`` a row), and the buffer holding ``held_bytes`` rows; with transform
    processes the batches live in /dev/shm, whose free space is checked too."""
    run = spec.run
    rows = spec.buffer.cap(run.batch_size)
    if spec.traced:
        rows = max(rows, spec.sampler.batch_bound(run))
    sets = config.read_ahead_steps(run.batch_size) + 2
    if transform is not None:
        sets += transform.ahead
    slots = slot_count(run, spec.buffer)
    held = sample_bytes if held_bytes is None else held_bytes
    # Raw rows with room for a step's side rows (page mates); transformed rows without.
    batches = sets * (spec.batch_rows(rows) * sample_bytes + rows * out_bytes)
    require_memory(
        slots * held + batches,
        f"buffer and batches: {slots} buffer rows + {sets} batches of up to "
        f"{spec.batch_rows(rows)} rows, {sample_bytes} B each"
        + (f", and {rows} transformed rows of {out_bytes} B" if out_bytes else "")
        + (f" (buffer rows {held} B)" if held_bytes else ""),
    )
    if transform is not None and transform.processes and os.path.isdir("/dev/shm"):
        st = os.statvfs("/dev/shm")
        if batches > st.f_bavail * st.f_frsize:
            raise SolarError(
                f"transform processes: batches in flight need {batches / 2**20:.0f} MiB of "
                f"shared memory, /dev/shm has {st.f_bavail * st.f_frsize / 2**20:.0f} MiB free "
                "(fewer read_ahead steps or Transform(ahead=), or thread workers)"
            )


def page_layout(info: DatasetInfo) -> PageLayout | None:
    """Where the rows lie, if a page read brings other rows along (solar.schedule.pagemates):
    one file and one contiguous key of rows at most half a page. Else None."""
    if len(info.all_files) != 1 or len(info.keys) != 1 or info.one_per_file:
        return None
    offset = -1 if info.stored is None else int(info.stored.offsets[0, 0])
    row_bytes = info.keys[0].row_bytes
    if offset < 0 or not PageLayout.worth_it(row_bytes):
        return None
    return PageLayout(offset, row_bytes)


class Loader:
    """Iterate one rank's batches of a planned multi-epoch run over HDF5 data.

    Call :meth:`set_epoch` before each epoch, as with ``DistributedSampler``; iterating yields
    that epoch's steps as dicts of torch tensors, one per key, plus ``"index"`` (int64 sample
    ids in batch order). Local batches may differ in size when ``slack > 0``, unless
    ``equal_batches``: then every rank's batch is exactly ``batch_size`` every step (a short
    last step split evenly), the rows a rank serves beyond it moving to ranks under it through
    ``comm`` (:mod:`solar.exchange`); a rank's batch is its own rows in service order, then
    those received, by sender rank (:mod:`solar.schedule.transfer`).

    ``paths`` is a path, glob, directory or list of HDF5 files (``keys``: their datasets,
    default all), or of ``.npy`` files (one key, ``keys[0]`` or ``"data"``), or a dict
    ``{key: .npy files}``, or a :class:`~solar.io.hdf5.DatasetInfo` already made (by
    ``describe_source``); see :mod:`solar.io.sources`. With ``one_per_file`` each file is
    one sample (its whole datasets), else files hold samples along their first axis.

    ``buffer`` (RAM) and ``tier_size`` (a second tier: one file per rank in the directory
    ``tier``, on node-local NVMe) are per-rank capacities in samples (``500``) or bytes
    (``4GiB``). The planner decides, for every access, a RAM hit, a tier hit or a storage read.

    ``snapshots``: a directory (shared by the ranks, beside the checkpoints) where rank 0 saves
    the planner's state after each epoch it plans, a few MB; a resume (:meth:`load_state_dict`)
    then replans from the newest snapshot at or before its epoch instead of from epoch 0.

    ``warm`` (default): compile every numba kernel the epochs will call now, by running a
    tiny copy of this run (:mod:`solar.warm`); ``stats.warm_seconds`` and
    ``stats.compile_seconds`` say what it cost.

    ``page_mates`` (default): where rows are at most half a page (one file, one contiguous
    key, a sampler that splits its own batches, the solar policy, a RAM buffer, no
    deterministic transform), also keep the rows that share pages with a step's reads when they
    are used sooner than what the buffer holds (:mod:`solar.schedule.pagemates`); raw batch
    memory then has room for twice a batch's rows. False plans rows alone.

    ``sampler`` draws each step's ids (:mod:`solar.schedule.samplers`): ``Shuffle()`` (the
    default), ``Weighted(...)`` or ``Trace(...)``; with the latter two the sampler splits the
    batches over the ranks, a batch may repeat an id (read once, copied) and the planner looks
    ``horizon`` epochs ahead (default: the whole run if it fits in memory).

    ``transform``: a function ``fn(sample, rng) -> sample`` run on every sample once its bytes
    are in memory, on worker threads, its outputs written into the batch
    (:mod:`solar.transform`; a :class:`~solar.transform.Transform` sets workers, processes,
    declared output shapes); ``rng`` is a pure function of (seed, epoch, sample, occurrence),
    so a resumed run replays the same augmentation. ``batch_transform(batch) -> batch`` runs on
    each delivered batch (the dict of tensors), on the trainer's thread.
    """

    def __init__(
        self,
        paths: str | os.PathLike | Sequence[str | os.PathLike] | Mapping[str, Any] | DatasetInfo,
        keys: list[str] | None = None,
        *,
        batch_size: int | None = None,
        epochs: int,
        buffer: int | str,
        seed: int = 0,
        slack: float = DEFAULT_SLACK,
        plan: Plan | str | os.PathLike | None = None,
        comm: Any = None,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        policy: str = "solar",
        reader: ReaderConfig | None = None,
        throttle: Any = None,
        one_per_file: bool = False,
        tier: str | os.PathLike | None = None,
        tier_size: int | str = 0,
        snapshots: str | os.PathLike | None = None,
        sampler: Sampler | None = None,
        horizon: int | None = None,
        equal_batches: bool = False,
        transform: SampleFn | Transform | None = None,
        batch_transform: Callable[[dict], dict] | None = None,
        warm: bool = True,
        page_mates: bool = True,
    ) -> None:
        # Other ranks may be waiting in the plan agreement: a failure here takes the job down.
        with abort_job_on_error(comm), measured() as warmth:
            import torch

            self.info = describe_source(paths, keys, one_per_file=one_per_file, comm=comm)
            self.rank, self.world_size = _rank_and_world(comm, rank, world_size)
            # This rank's share of the host's cores: its transform workers and CPU budget.
            self._cores = cpu_share(ranks_on_host(comm))
            for k in self.info.keys:
                torch_dtype(k)
            config = reader or ReaderConfig()
            if config.pin_memory and not torch.cuda.is_available():
                warnings.warn("pin_memory=True but no accelerator: not pinning", stacklevel=2)
                config = dataclasses.replace(config, pin_memory=False)
            self.config = config
            capacity = parse_size(buffer, sample_bytes=self.info.sample_bytes)
            check_budget(min(capacity, self.info.num_samples), self.info.sample_bytes)
            tier_capacity = parse_size(
                tier_size, sample_bytes=self.info.sample_bytes, name="tier_size"
            )
            if (tier is None) != (tier_capacity == 0):
                raise SolarError(
                    "a second tier needs both tier=<directory> and tier_size > 0 "
                    f"(got tier={tier!r}, tier_size={tier_size!r})"
                )
            self._tier_dir = tier
            self.sampler = SHUFFLE if sampler is None else sampler
            if batch_size is None:  # a sampler that knows its batch (NeighborSampler) gives it
                batch_size = getattr(self.sampler, "batch_size", None)
                if batch_size is None:
                    raise SolarError("Loader needs batch_size (this sampler has none)")
            n = self.info.num_samples
            self.sampler.check(n)
            draws = self.sampler.draws(n, self.world_size * batch_size)
            run = RunConfig(n, self.world_size, batch_size, epochs, seed, drop_last,
                            None if draws == n else draws)  # fmt: skip
            self.sampler.check_run(run)
            self.run = run
            if equal_batches and self.world_size > 1 and comm is None:
                raise SolarError("equal_batches: the ranks exchange rows, pass comm=")
            self.transform = as_transform(transform)
            self.spec, given = self._agree_on_plan(
                plan, run, BufferConfig(capacity, slack, tier_capacity), policy, comm, horizon,
                equal_batches, page_mates,
            )  # fmt: skip
            # The buffer with the batches in flight, counted as the sampler's largest batch.
            check_batch_memory(self.spec, config, self.info.sample_bytes)
            self._comm = comm
            self._plan: Plan | None = given
            if given is not None:
                # A file is proven safe before any byte moves, by all ranks together, here.
                given.validate(self.rank, comm)
            # This rank's part, one epoch at a time: read from the plan given, or planned one
            # epoch ahead in the background.
            if snapshots is not None and not Path(snapshots).is_dir():
                raise SolarError(f"snapshots: {snapshots} is not a directory")
            self._stream = RankStream(self.spec, self.rank, given, snapshots)
            self.reader = Reader(self.info, config, throttle)
            if batch_transform is not None and not callable(batch_transform):
                raise SolarError(f"batch_transform must be callable, got {batch_transform!r}")
            self.batch_transform = batch_transform
            if self.transform is not None and self.transform.processes and config.pin_memory:
                raise SolarError("transform processes write batches in shared memory, not "
                                 "pinned: pass pin_memory=False or use thread workers")  # fmt: skip
            # The keys batches hold: the dataset's, or the transform's outputs.
            self.out_keys = self.info.keys if self.transform is None else self._output_keys()
            # What the buffer and tier hold: raw rows, or transformed ones if deterministic.
            self._held_keys = self.out_keys if self._holds_transformed else self.info.keys
            if self.transform is not None:  # again, with its rows and steps ahead
                check_batch_memory(self.spec, config, self.info.sample_bytes, self.transform,
                                   sum(k.row_bytes for k in self.out_keys),
                                   sum(k.row_bytes for k in self._held_keys))  # fmt: skip
            agree(comm, [(k.name, k.sample_shape, k.dtype.str) for k in self.out_keys],
                  "the transform's output keys, shapes and dtypes")  # fmt: skip
            self._exchange: Exchange | None = None
            if self.spec.equal_batches and self.world_size > 1:
                # Rows move as delivered: transformed, if there is a transform.
                self._exchange = Exchange(comm, self.out_keys)  # every rank, together
            self.stats = LoaderStats()
            self._yielded: tuple[int, int] | None = None  # (epoch, step) last yielded
            self._global_sizes: tuple[int, np.ndarray] = (-1, np.diff(step_bounds(run)))
            self._epoch = 0
            self._next = 0  # global step the next iteration starts from
            self._reset_runtime()
            # Allocate (and touch) the buffer, create the tier file and warm the reader now, not
            # inside the first epoch: an impossible budget or a full disk fails here, and epoch
            # 0 measures loading, not set-up.
            self.buffer  # noqa: B018
            self.tier  # noqa: B018
            # The first epoch planned from now on, beside the warm-up and whatever the caller
            # does before iterating. (Not without the warm-up: the planning thread would then
            # compile under numba's lock, which a fork meanwhile would leave held in the child.)
            if warm:
                self._stream.start()
            t0 = time.perf_counter()
            try:
                self.reader.warm_up()
                if warm:  # every kernel the epochs call, compiled now (solar/warm.py)
                    kind = None if given is None else "file" if given.file is not None else "memory"
                    rehearse_loader(self, kind)
            except BaseException:
                self.close()  # no thread, process or tier file outlives a Loader never made
                raise
            self.stats.warm_seconds = time.perf_counter() - t0
        self.stats.compile_seconds, self.stats.compiled = (
            warmth[0].compile_seconds,
            warmth[0].compiled,
        )

    # -- plan agreement ----------------------------------------------------------------------
    def _agree_on_plan(
        self,
        plan: Plan | str | os.PathLike | None,
        run: RunConfig,
        buffer: BufferConfig,
        policy: str,
        comm: Any,
        horizon: int | None,
        equal_batches: bool,
        page_mates: bool,
    ) -> tuple[PlanSpec, Plan | None]:
        made = None
        pages = page_layout(self.info)  # None: rows share no pages worth keeping
        if plan is None:
            spec = PlanSpec(run, buffer, policy, False, self.info.sample_bytes,
                            self.info.identity, self.sampler, horizon, equal_batches)  # fmt: skip
            # Side rows are stored raw: not where the buffer holds transformed rows.
            keep = page_mates and pages is not None and not self._holds_transformed
            if keep and spec.plans_page_mates:
                spec = dataclasses.replace(spec, pages=pages)
        else:
            made = plan if isinstance(plan, Plan) else load_plan(plan)
            # Policy, epoch order and horizon are the plan's choice; everything else must match.
            spec = PlanSpec(
                run, buffer, made.spec.policy, made.spec.reorder_epochs,
                self.info.sample_bytes, self.info.identity, self.sampler, made.spec.horizon,
                equal_batches, made.spec.pages,
            )  # fmt: skip
            source = "plan" if isinstance(plan, Plan) else f"plan {plan}"
            made.check(spec, source=source)
            # Page mates too are the plan's choice, if they are this data's and stored raw.
            kept = made.spec.pages
            if kept is not None and self._holds_transformed:
                raise SolarError(f"{source}: it keeps page mates, stored raw; this loader's "
                                 "deterministic transform holds transformed rows")  # fmt: skip
            if kept is not None and kept != pages:
                where = "share no pages" if pages is None else f"lie at {pages.as_record()}"
                raise SolarError(f"{source}: it keeps page mates of rows at "
                                 f"{kept.as_record()} (offset, row bytes, page); this data's "
                                 f"rows {where}")  # fmt: skip
            made = made.bound_to(spec)  # a file's plan, proven against this loader's sampler
        # The same inputs and the same plan file (its header) on every rank, or none goes on.
        agree(comm, (spec.fingerprint, made.header if made is not None else None), "the plan")
        return spec, made

    @property
    def _holds_transformed(self) -> bool:
        return self.transform is not None and self.transform.deterministic

    def _output_keys(self) -> tuple[KeyInfo, ...]:
        """The transform's output keys: declared, or those of its call on sample 0."""
        assert self.transform is not None
        if self.transform.out is not None:
            keys = output_keys(self.transform.out, "transform out=", declared=True)
        else:
            first = np.zeros(1, np.int64)
            raw = [np.empty((1, *k.sample_shape), k.native_dtype) for k in self.info.keys]
            self.reader.read(first, raw, first)
            keys = first_outputs(self.transform.fn, self.run.seed, self.info.keys, raw)
        for k in keys:
            torch_dtype(k)
        return keys

    @property
    def plan(self) -> Plan:
        """The whole plan: the one given, or (for inspection; it costs a whole-run planning)
        the plan this loader streams, made on first use."""
        if self._plan is None:
            self._plan = make_plan(self.spec)
        return self._plan

    def _window(self, k: int, trim: bool = True) -> RankPlan:
        """A window of this rank's plan holding step ``k``."""
        return self._stream.window(k, trim)

    # -- runtime state (rebuilt in a forked or spawned process) ------------------------------
    def _reset_runtime(self) -> None:
        self._buffer: SlotBuffer | None = None
        self._buffer_at = -1  # the buffer (and tier) match the plan at the start of this step
        self._pool: BatchPool | None = None
        self._out_pool: BatchPool | None = None  # transformed batches
        self._rt: ProcessLocal[_Runtime] = ProcessLocal(self._new_runtime)

    def _new_runtime(self) -> _Runtime:
        """This process's read-ahead queue and tier. In a forked child the parent's reads did
        not come along and its tier file is the parent's, still in use: the child fills one of
        its own (its buffer's contents, inherited, stay valid)."""
        slots = tier_slot_count(self.run, self.spec.buffer)
        tier = None
        if slots and self._tier_dir is not None:
            # Named for the plan and the rank (and, by TierFile, the host and process).
            tier = TierFile(
                self._tier_dir, slots=slots, keys=self._held_keys, executor=self.reader.executor,
                name=f"{self.spec.fingerprint[:12]}-r{self.rank}",
                staging_slots=max(64, (256 << 20) // tier_stride(self._held_keys)),  # 256 MiB
            )  # fmt: skip
            self._buffer_at = -1  # a new, empty tier: refill before serving
        depth = self.config.read_ahead_steps(self.run.batch_size)
        transforms = None
        if self.transform is not None:
            transforms = TransformPool(self.transform, self.run.seed, self.info.keys,
                                       self.out_keys, self._cores)  # fmt: skip
        ahead = ReadAhead(self._start, depth, self._confirm)
        tuner = self._new_tuner(ahead, transforms) if self.config.auto else None
        return _Runtime(ahead, tier, transforms, tuner=tuner)

    def _new_tuner(self, ahead: ReadAhead, transforms: TransformPool | None) -> Tuner:
        """threads="auto": the tuner of this process's reader threads, read-ahead depth and
        (threads, workers="auto") transform workers (solar/tune.py)."""
        tuner = Tuner(self.stats, self._cores)
        for knob in reader_knobs(self.reader.executor, tuner.budget):
            tuner.register(knob)
        if transforms is not None and self.transform is not None:
            if self.transform.workers == "auto" and not self.transform.processes:
                tuner.register(Knob("transform_workers", "transform", lambda: transforms.workers,
                                    transforms.resize, 1, tuner.budget))  # fmt: skip
        step_bytes = max(1, self.run.batch_size * self.info.sample_bytes)
        cap = min(MAX_READ_AHEAD, READ_AHEAD_BYTES // step_bytes)
        tuner.read_ahead(lambda d: setattr(ahead, "depth", d), ahead.depth, cap)
        return tuner

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        # The rank's plan is read (and validated) again from its file or plan in the new process.
        # The exchange belongs to this process's communicator: a copy cannot take part.
        state.update(_buffer=None, _buffer_at=-1, _pool=None, _out_pool=None, _exchange=None,
                     _comm=None)  # fmt: skip
        return state

    @property
    def buffer(self) -> SlotBuffer:
        if self._buffer is None:
            self._buffer = SlotBuffer(slot_count(self.run, self.spec.buffer), self._held_keys)
            self._buffer_at = 0  # an empty buffer is the plan's state before step 0
        return self._buffer

    @property
    def tier(self) -> TierFile | None:
        """This rank's second tier in this process (None without one)."""
        return self._rt.get().tier

    # -- the public iteration protocol -------------------------------------------------------
    def __len__(self) -> int:
        return self.run.steps_per_epoch

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch the next iteration serves (a resumed epoch keeps its position)."""
        if not 0 <= epoch < self.run.epochs:
            raise SolarError(f"epoch {epoch} is outside this run's {self.run.epochs} epochs")
        if epoch != self._epoch:
            self._epoch = epoch
            self._next = epoch * self.run.steps_per_epoch

    def __iter__(self):
        spe = self.run.steps_per_epoch
        first, end = self._epoch * spe, (self._epoch + 1) * spe
        start = self._next if first <= self._next < end else first
        self._seek(start)
        for k in range(start, end):
            batch = self._consume(k)
            self._next = k + 1
            self._yielded = (self._epoch, k - first)
            yield batch
            del batch  # let the pool reuse its memory as soon as the trainer drops it

    @property
    def global_batch(self) -> int:
        """Samples over all ranks in the step last yielded (0 before any). Found when asked:
        with a sampler's trace it needs every rank's batches of the epoch, which a rank
        planning alone never draws otherwise."""
        if self._yielded is None:
            return 0
        epoch, t = self._yielded
        return int(self._global_sizes_of(epoch)[t])

    def _global_sizes_of(self, epoch: int) -> np.ndarray:
        """Rows of every global step of ``epoch``, over all ranks: (steps per epoch,)."""
        if not self.spec.traced:
            return self._global_sizes[1]
        if self._global_sizes[0] != epoch:
            d = self.sampler.epoch(self.run, epoch)
            rows = np.diff(d.offsets).reshape(self.run.steps_per_epoch, self.world_size)
            self._global_sizes = (epoch, rows.sum(axis=1))
        return self._global_sizes[1]

    def state_dict(self) -> dict:
        """Where the run stands: resume with :meth:`load_state_dict` on the same plan."""
        spe = self.run.steps_per_epoch
        # After an epoch's last step the next thing to run is the next epoch.
        epoch = self._epoch + 1 if self._next == (self._epoch + 1) * spe else self._epoch
        return {
            "fingerprint": self.spec.fingerprint,
            "order": self._order_fingerprint(),
            "global_batch": self.run.global_batch,
            "rank": self.rank,
            "world_size": self.world_size,
            "epoch": epoch,
            "next_step": self._next,
        }

    def _order_fingerprint(self) -> str:
        """What the global batches depend on: not the world size or local batch, only their
        product (mosaicml-streaming's elastic determinism)."""
        run = self.run
        order = self._plan.epoch_order if self._plan is not None else np.arange(run.epochs)
        key: tuple = (self.spec.dataset, run.num_samples, run.global_batch, run.epochs,
                      run.seed, run.drop_last, np.asarray(order).tolist())  # fmt: skip
        if self.spec.traced:
            # Weighted's global batches depend on P·B only; a Trace's on its ranks too.
            ranks = run.world_size if isinstance(self.sampler, Trace) else None
            key += (run.draws, repr(sorted((self.sampler.identity() or {}).items())), ranks)
        return hashlib.sha256(repr(key).encode()).hexdigest()

    def load_state_dict(self, state: dict) -> None:
        """Continue exactly where ``state`` was taken: the same global batches in the same
        order. A state from a run with another world size P' and local batch B' loads when
        P'·B' equals this run's P·B; each rank then rebuilds its buffer to its own plan."""
        run = self.run
        if state.get("global_batch") != run.global_batch and state.get("global_batch"):
            raise SolarError(
                f"loader state has global batch {state.get('global_batch')} "
                f"(P·B of its run), this run has {run.world_size}·{run.batch_size} = "
                f"{run.global_batch}"
            )
        same_plan = state.get("fingerprint") == self.spec.fingerprint
        if not same_plan and state.get("order") != self._order_fingerprint():
            raise SolarError("loader state was saved for another dataset or run (order differs)")
        try:
            epoch, step = int(state["epoch"]), int(state["next_step"])
        except (KeyError, TypeError, ValueError):
            raise SolarError("loader state lacks a whole 'epoch' and 'next_step'") from None
        spe = self.run.steps_per_epoch
        if not (0 <= step <= self.run.num_steps and epoch * spe <= step <= (epoch + 1) * spe):
            raise SolarError(f"loader state: step {step} is not within epoch {epoch} of this run")
        self._epoch = min(epoch, self.run.epochs - 1)
        self._next = step

    def wait_reads(self) -> None:
        """Wait until the reads under way (ahead of the next step, maybe into the next epoch)
        are done; they are kept for the steps that need them."""
        rt = self._rt.here()
        if rt is not None:
            rt.ahead.wait()
            wait([f for io in rt.ready for f in io.transforms])

    def close(self) -> None:
        """Stop the background work; remove the tier file."""
        rt = self._rt.drop()  # a forked child never waits for its parent's reads
        if rt is not None:
            rt.drain()
            if rt.tier is not None:
                rt.tier.close()
            if rt.transforms is not None:
                rt.transforms.close()
        self._stream.close()
        self.reader.close()
        if self._exchange is not None:
            self._exchange.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- execution ----------------------------------------------------------------------------
    def _seek(self, step: int) -> None:
        """Make the buffer (and tier) match the plan at ``step``: read what later hits need."""
        buf, rt = self.buffer, self._rt.get()
        if rt.next_step(self._buffer_at) == step:
            return
        rt.drain(step)  # no step from here on has started
        tier = rt.tier
        t0 = time.perf_counter()
        cells, samples = self._window(step).refill_at(step)
        self._buffer_at = -1  # until the refill succeeds, the buffer matches no step
        ram = cells < buf.capacity
        if self._holds_transformed:
            nbytes = self._refill_transformed(rt, step, cells, samples)
        else:
            nbytes = self.reader.read(samples[ram], buf.arrays, cells[ram])
            if tier is not None and not np.all(ram):
                nbytes += self._refill_tier(tier, cells[~ram] - buf.capacity, samples[~ram])
        stats = self.stats.epoch(step // self.run.steps_per_epoch)
        stats.rebuild_seconds += time.perf_counter() - t0
        stats.bytes_read += nbytes
        self._buffer_at = step

    def _refill_tier(self, tier: TierFile, tslots: np.ndarray, samples: np.ndarray) -> int:
        """Read ``samples`` from storage into tier ``tslots``, a batch's worth at a time."""
        n = max(1, self.spec.buffer.cap(self.run.batch_size))
        staging = [np.empty((n, *k.sample_shape), k.native_dtype) for k in self.info.keys]
        nbytes = 0
        for lo in range(0, samples.size, n):
            part = slice(lo, lo + n)
            rows = np.arange(samples[part].size)
            nbytes += self.reader.read(samples[part], staging, rows)
            tier.submit_write(tslots[part], staging, rows)  # copied before it returns
        tier.wait_writes()
        return nbytes

    def _refill_transformed(self, rt: _Runtime, step: int, cells: np.ndarray,
                            samples: np.ndarray) -> int:  # fmt: skip
        """Read ``samples`` from storage, transform them and store them in buffer (or tier)
        ``cells``, a batch's worth at a time (a deterministic transform's held rows)."""
        assert rt.transforms is not None
        n = max(1, self.spec.buffer.cap(self.run.batch_size))
        raw, out = (rt.transforms.staging(keys, n) for keys in (self.info.keys, self.out_keys))
        buf, tier, nbytes = self.buffer, rt.tier, 0
        e, t = divmod(step, self.run.steps_per_epoch)
        for lo in range(0, samples.size, n):
            ids, dst = samples[lo : lo + n], cells[lo : lo + n]
            rows = np.arange(ids.size)
            nbytes += self.reader.read(ids, raw, rows)
            futures = rt.transforms.submit(raw, out, Rows(e, t, ids, np.zeros_like(ids), rows))
            wait(futures)
            for f in futures:
                f.result()  # the first failure, if any
            ram = dst < buf.capacity
            buf.store(out, rows[ram], dst[ram])
            if not np.all(ram):
                assert tier is not None
                tier.submit_write(dst[~ram] - buf.capacity, out, rows[~ram])
                tier.wait_writes()  # before ``out`` is overwritten
        return nbytes

    def _served_rows(self) -> int:
        """Rows a served batch may have: no local batch exceeds the cap of a full nominal share
        (or a sampler's longest; the pools grow for a longer one)."""
        rows = self.spec.buffer.cap(self.run.batch_size)
        if self.spec.traced:
            rows = self.sampler.max_batch(self.run) or rows
        return rows

    @property
    def _batches(self) -> BatchPool:
        """Batch memory for raw rows, made on first use: a batch, then its side rows."""
        if self._pool is None:
            self._pool = BatchPool(self.info.keys, self.spec.batch_rows(self._served_rows()),
                                   self.config.pin_memory, self._rt.get().allocate())  # fmt: skip
        return self._pool

    def _head_start(self, rt: _Runtime, k: int) -> None:
        """Start step ``k``'s storage reads before its plan is made, where they cannot depend
        on it: the run's first step, the buffer empty, the sampler drawing each rank's batch.
        Every row is then read whatever the plan keeps; :meth:`_confirm` checks the plan."""
        if k != 0 or self._buffer_at != 0 or not self.spec.traced or self.spec.affinity:
            return
        if rt.tier is not None or rt.ready or rt.ahead.started or self._stream.planned_end > 0:
            return  # a tier's writes, reads under way, or the plan there: the usual path
        ids = np.asarray(self.sampler.batch(self.run, 0, 0, self.rank), np.int64)
        if ids.size == 0:
            return
        rows = np.arange(ids.size, dtype=np.int64)
        none = np.zeros(0, np.int64)
        plan = StepPlan(k, ids, read_rows=rows, hit_rows=none, hit_slots=none, admit_rows=none,
                        admit_slots=none)  # fmt: skip
        io = InFlight(plan, [], [], [])
        io.tensors, io.batch = self._batches.take(ids.size)  # (no side rows at this step)
        io.futures = self.reader.submit(ids, io.batch, rows)
        io.storage, io.provisional = len(io.futures), True
        rt.ahead.head(io)

    def _confirm(self, k: int, io: InFlight) -> InFlight:
        """Step ``k`` read ahead of its plan (:meth:`_head_start`), now with its plan: its side
        rows read too, or, should the plan read other rows (never, for a valid plan), read
        again as planned. (Called by the read-ahead queue before it starts later steps.)"""
        try:
            step = self._step(k)
        except BaseException:
            wait(io.futures)  # none may write into memory handed back
            raise
        if (step.hit_rows.size or step.tier_rows.size or step.rows_needed > len(io.batch[0])
                or not np.array_equal(step.samples, io.plan.samples)):  # fmt: skip
            wait(io.futures)  # none may write into memory handed back
            return self._start(k)
        if step.side_samples.size:
            sides = np.arange(step.size, step.rows_needed, dtype=np.int64)
            io.futures += self.reader.submit(step.side_samples, io.batch, sides)
            io.storage = len(io.futures)
        io.plan, io.provisional = step, False
        return io

    def _start(self, k: int) -> InFlight:
        """Start step ``k``'s storage and tier reads, straight into its batch memory."""
        step = self._step(k)
        tier = self.tier
        io = InFlight(step, [], [], [])
        rows = self._rows(k, step)
        # Only reads need their batch ahead of time; a step of hits takes memory when it is
        # assembled, so that recently freed (cache-warm) batch memory is reused.
        reads, read_rows = step.storage_reads()  # the batch's reads, then its side rows
        if reads.size or step.tier_rows.size:
            io.tensors, io.batch = self._batches.take(rows)
            if reads.size:
                io.futures = self.reader.submit(reads, io.batch, read_rows)
            io.storage = len(io.futures)
            if step.tier_rows.size:
                assert tier is not None
                into = io.batch
                if self._holds_transformed:  # the tier holds transformed rows
                    io.out = self._take_out(k, step)
                    into = io.out[1]
                try:
                    io.futures += tier.read_step(k, step.tier_slots, into, step.tier_rows)
                except BaseException:
                    wait(io.futures)  # no read may still write into memory handed back
                    raise
        if tier is not None:  # after this step's reads: they see the slots as the step starts
            tier.expect_writes(k, step.tier_writes)
        return io

    def _step(self, k: int) -> StepPlan:
        """Step ``k``'s plan, its rows in the sampler's batch order."""
        step = self._window(k, trim=False).step(k)
        if not self.spec.traced:
            return step  # Shuffle: the planner chose the batch, its order is the plan's
        e, t = divmod(k, self.run.steps_per_epoch)
        if self.spec.affinity:  # the draws of the global batch the planner gave this rank
            draws = self.sampler.global_batch(self.run, e, t)
            ids = draws[np.isin(draws, step.samples)]
        else:
            ids = self.sampler.batch(self.run, e, t, self.rank)
        try:
            return step.in_batch(ids)
        except ValueError:
            raise SolarError(
                f"step {k}, rank {self.rank}: the sampler's batch is not the one planned "
                "(a Trace function must return the same ids for the same arguments)"
            ) from None

    def _update(self, k: int, step: StepPlan, batch: list[np.ndarray]) -> None:
        """Apply step ``k``'s buffer updates, in the plan's order.

        Overwriting a slot is the eviction. It was decided by the planner (for the `solar`
        policy, Belady in solar/schedule/belady.py); the runtime only obeys the plan.
        """
        buf, tier = self.buffer, self.tier
        if not step.in_order:
            if step.demote_slots.size:  # first: the stores below overwrite these slots
                assert tier is not None
                tier.submit_write(step.demote_tslots, buf.arrays, step.demote_slots)
            buf.store(batch, step.admit_rows, step.admit_slots)
            if step.tadmit_rows.size:
                assert tier is not None
                tier.submit_write(step.tadmit_tslots, batch, step.tadmit_rows)
            return
        # A slot updated twice in this step (rare): one update at a time, in access order.
        assert tier is not None
        # (no trim: a step assembled ahead must not drop the window of the one being served)
        for flag, src, dst in self._window(k, trim=False).step_actions(k):
            if flag != DEMOTE:  # src is an access of the step: its batch row
                src = step.row(src)
            one_src, one_dst = np.array([src]), np.array([dst])
            if flag == ADMIT:
                buf.store(batch, one_src, one_dst)
            else:
                tier.submit_write(one_dst, buf.arrays if flag == DEMOTE else batch, one_src)

    def _assemble(self, rt: _Runtime, k: int) -> InFlight:
        """Step ``k``'s batch as read: its reads waited for, its hits gathered, its transform
        started, and (unless a deterministic transform's rows are held: then once they are
        transformed, in :meth:`_serve`) its updates applied, the buffer standing at ``k + 1``."""
        self._buffer_at = -1  # until the step is assembled, the buffer matches no step
        # Read ahead only into steps already planned: never wait for the planner here.
        io = rt.ahead.take(k, last=min(self.run.num_steps, self._stream.planned_end) - 1)
        io.depth, io.landed = rt.ahead.depth, rt.ahead.landed
        step = io.plan
        if io.futures:  # a step of hits has none: it costs no waiting at all
            t0 = time.perf_counter()
            wait(io.futures)  # all of them, even if one failed: none writes into the batch after
            stall = time.perf_counter() - t0
            got = step_io(io.futures[: io.storage])
            tier_bytes, tier_busy = combine(io.futures[io.storage :])
            # The tier's reads run on the reader threads too: their time is the read stage's.
            io.figures = (got.nbytes, got.busy + tier_busy, stall, tier_bytes)
            io.decode_seconds, io.latency = got.decode, got.longest
        if not io.batch:
            io.tensors, io.batch = self._batches.take(self._rows(k, step))
        if self._holds_transformed:
            # Hits are held transformed: straight into the delivered batch. Only storage
            # reads are transformed; the step is settled once they are (its admissions are).
            assert rt.transforms is not None
            if io.out is None:
                io.out = self._take_out(k, step)
            self.buffer.gather(step.hit_slots, io.out[1], step.hit_rows)
            self._start_transform(rt.transforms, k, io, step.read_rows)
            return io
        self.buffer.gather(step.hit_slots, io.batch, step.hit_rows)
        self._settle(rt, k, io, io.batch)
        if rt.transforms is not None:
            io.out = self._take_out(k, step)
            self._start_transform(rt.transforms, k, io, np.arange(step.size))
        return io

    def _settle(self, rt: _Runtime, k: int, io: InFlight, batch: list[np.ndarray]) -> None:
        """Complete step ``k``'s ``batch`` (repeats copied) and apply its buffer and tier
        updates: the buffer then stands at step ``k + 1``."""
        step = io.plan
        if step.copy_dst.size:  # a sample drawn twice in the batch: read once, copied
            for rows in batch:
                copy_rows(rows, step.copy_src, rows, step.copy_dst)
        self._update(k, step, batch)
        if rt.tier is not None:
            rt.tier.done_writing(k)
        io.settled = True
        self._buffer_at = k + 1

    def _take_out(self, k: int, step: StepPlan) -> tuple[list[Any], list[np.ndarray]]:
        """Batch memory for step ``k``'s transformed rows."""
        if self._out_pool is None:  # transformed rows: the batch only, no side rows
            allocate = self._rt.get().allocate()
            self._out_pool = BatchPool(self.out_keys, self._served_rows(),
                                       self.config.pin_memory, allocate)  # fmt: skip
        return self._out_pool.take(self._rows(k, step, sides=False))

    def _start_transform(self, pool: TransformPool, k: int, io: InFlight, rows: np.ndarray) -> None:
        """Start transforming ``rows`` of step ``k`` (``io.batch``, raw) into the same rows of
        ``io.out``."""
        assert io.out is not None
        step = io.plan
        e, t = divmod(k, self.run.steps_per_epoch)
        again = repeats(step.samples) if step.copy_dst.size else np.zeros(step.size, np.int64)
        if self.spec.traced and not self.spec.affinity:
            again += self.rank << 32  # a trace's ranks may draw one sample in the same step
        job = Rows(e, t, step.samples[rows], again[rows], rows)
        io.transforms = pool.submit(io.batch, io.out[1], job)
        io.transformed = int(rows.size)

    def _assemble_ahead(self, rt: _Runtime) -> None:
        """With a transform: assemble the next steps whose reads are done, so that their
        transforms run while the trainer computes on this one."""
        if rt.transforms is None:
            return
        last = min(self.run.num_steps, self._stream.planned_end) - 1
        while len(rt.ready) < self.transform_ahead and 0 <= self._buffer_at <= last:
            if not rt.ahead.ready(self._buffer_at):
                return  # its reads are late: it is assembled when it is asked for
            try:
                rt.ready.append(self._assemble(rt, self._buffer_at))
            except Exception:
                # Left unassembled: the buffer matches no step until refilled, and the step
                # fails (or not) in its own turn.
                self._buffer_at = -1
                return

    @property
    def transform_ahead(self) -> int:
        return 0 if self.transform is None else self.transform.ahead

    def _serve(self, rt: _Runtime, k: int) -> InFlight:
        """Step ``k``'s batch, delivered: assembled (now or ahead), transformed, exchanged,
        its figures recorded."""
        began = time.perf_counter()
        io = rt.ready.popleft() if rt.ready else self._assemble(rt, k)
        assert io.plan.step == k, (io.plan.step, k)  # _seek made the next step served k
        self._assemble_ahead(rt)
        step = io.plan
        nbytes, busy, stall, tier_bytes = io.figures
        tbusy = 0.0
        if io.out is not None:
            t0 = time.perf_counter()
            # Waiting for this step's transforms, assemble the next steps as their reads land,
            # so that their transforms queue behind these and the workers never idle.
            try:
                while running := [f for f in io.transforms if not f.done()]:
                    more = len(rt.ready) < self.transform_ahead
                    landing = rt.ahead.pending(self._buffer_at) if more else []
                    wait([*running, *landing], return_when=FIRST_COMPLETED)
                    self._assemble_ahead(rt)
            except BaseException:
                wait(io.transforms)  # (an interrupt) none may write into memory handed back
                raise
            stall += time.perf_counter() - t0
            with abort_job_on_error(self._comm):  # a user's transform failed: the job ends
                tbusy = sum(f.result() for f in io.transforms)  # the first failure, if any
            io.tensors, io.batch = io.out  # the raw rows go back to their pool
            if not io.settled:  # held transformed: admitted once transformed
                self._settle(rt, k, io, io.batch)
                self._assemble_ahead(rt)
        moved, seconds = self._deliver(k, io)
        # The trainer's period: since the previous step was served, if it was the step
        # before in this epoch (else the time serving this one: a gap between epochs is not
        # the pipeline's).
        now, ex = time.perf_counter(), self.reader.executor
        last, at = rt.served
        wall = now - at if last == k - 1 and k % self.run.steps_per_epoch else now - began
        rt.served = (k, now)
        record = StepStats(
            epoch=k // self.run.steps_per_epoch, step=k,
            batch=step.size if io.index is None else io.index.size,
            hits=int(step.hit_rows.size), reads=int(step.read_rows.size), bytes_read=nbytes,
            side_reads=int(step.side_samples.size),
            read_seconds=busy, stall_seconds=stall, tier_hits=int(step.tier_rows.size),
            tier_bytes=tier_bytes, tier_writes=int(step.tier_writes.size),
            sent=moved[0], received=moved[1], exchange_seconds=seconds,
            transform_seconds=tbusy, transformed=io.transformed,
            transform_workers=0 if rt.transforms is None else rt.transforms.workers,
            decode_seconds=io.decode_seconds, wall_seconds=wall, read_threads=ex.threads,
            decode_threads=ex.decode_threads, read_ahead=io.depth, ready_ahead=io.landed,
            read_latency=io.latency,
        )  # fmt: skip
        self.stats.record(record)
        if rt.tuner is not None:
            rt.tuner.observe(record)
        return io

    def _rows(self, k: int, step: StepPlan, sides: bool = True) -> int:
        """Rows of batch memory step ``k`` needs: what it serves (and its side rows, read to be
        stored), or its share if more."""
        tr = self._window(k, trim=False).transfer(k)
        if tr is not None:
            return max(step.size, tr.size)
        return step.rows_needed if sides else step.size

    def _deliver(self, k: int, io: InFlight) -> tuple[tuple[int, int], float]:
        """With equal batches, make step ``k``'s served batch (``io``) the one this rank
        delivers: its first rows, and rows from other ranks after them; rows sent and
        received, and the seconds it took."""
        tr = self._window(k).transfer(k)
        if tr is None:  # the batch: side rows (stored, not served) and spare rows stay behind
            io.tensors = [t[: io.plan.size] for t in io.tensors]
            return (0, 0), 0.0
        io.index = np.empty(max(io.plan.size, tr.size), np.int64)
        io.index[: io.plan.size] = io.plan.samples
        t0 = time.perf_counter()
        if tr.collective:  # some rank moves rows: every rank takes part, in step order
            if self._exchange is None:
                raise SolarError("equal_batches: this Loader was copied into another process; "
                                 "iterate it where it was made")  # fmt: skip
            self._exchange.run(tr, io.batch, io.index)
        io.index = io.index[: tr.size]
        io.tensors = [t[: tr.size] for t in io.tensors]
        return (int(tr.send.sum()), int(tr.recv.sum())), time.perf_counter() - t0

    def _consume(self, k: int) -> dict:
        """Serve step ``k``: wait for its reads, gather its hits, store its admissions."""
        import torch

        rt = self._rt.get()  # first: a forked child's new, empty tier moves the buffer's step
        # With equal batches the other ranks wait for this one's rows: a failure here ends the
        # job rather than leave them in the exchange.
        with abort_job_on_error(self._comm if self._exchange is not None else None):
            self._seek(k)  # if another iterator (or a failed step) moved the buffer elsewhere
            self._head_start(rt, k)  # the first step's reads, while its plan is made
            self._window(k)  # the step being served: planned (waited for) if it must be
            try:
                io = self._serve(rt, k)
            except BaseException:
                # A failed step leaves the buffer, the read-ahead queue and the tier's held
                # reads unknown: the next iteration seeks (drains, resets, refills) first.
                self._buffer_at = -1
                raise
            out = {key.name: t for key, t in zip(self.out_keys, io.tensors, strict=True)}
            out["index"] = torch.from_numpy(io.plan.samples if io.index is None else io.index)
            e, t = divmod(k, self.run.steps_per_epoch)
            out.update(self.sampler.extras(self.run, e, t, self.rank, out))  # e.g. a subgraph
            if self.batch_transform is not None:
                out = self._transform_batch(out, e, k)
        return out

    def _transform_batch(self, batch: dict, epoch: int, k: int) -> dict:
        assert self.batch_transform is not None
        try:
            got = self.batch_transform(batch)
        except Exception as exc:
            with abort_job_on_error(self._comm):  # a user's transform failed: the job ends
                raise SolarError(f"batch_transform of step {k} (epoch {epoch}) failed: "
                                 f"{type(exc).__name__}: {exc}") from exc  # fmt: skip
        if not isinstance(got, Mapping):
            raise SolarError(f"batch_transform of step {k} (epoch {epoch}) returned "
                             f"{type(got).__name__}, not a dict")  # fmt: skip
        return dict(got)


@dataclass
class _Runtime:
    """A Loader's threads and files in one process: its read-ahead queue and its tier."""

    ahead: ReadAhead
    tier: TierFile | None
    transforms: TransformPool | None = None
    tuner: Tuner | None = None  # threads="auto" (solar/tune.py)
    served: tuple[int, float] = (-1, 0.0)  # the last step served, and when
    # Steps assembled ahead of the one served, their transforms under way (solar.transform).
    ready: collections.deque[InFlight] = dataclasses.field(default_factory=collections.deque)

    def allocate(self) -> Allocator | None:
        """How batch memory is allocated here: in shared memory for transform processes."""
        return None if self.transforms is None else self.transforms.allocate()

    def next_step(self, buffer_at: int) -> int:
        """The step served next here, with the buffer at ``buffer_at``."""
        return self.ready[0].plan.step if self.ready else buffer_at

    def drain(self, step: int = 0) -> None:
        """Wait for the reads and transforms under way, and start the tier's run of steps at
        ``step``: its held reads are dropped first, since they would start only when steps
        that will not be served are."""
        wait([f for io in self.ready for f in io.transforms])
        self.ready.clear()
        if self.tier is not None:
            self.tier.reset(step)
        self.ahead.drain()


def _rank_and_world(comm: Any, rank: int | None, world_size: int | None) -> tuple[int, int]:
    if comm is not None:
        r, w = comm.Get_rank(), comm.Get_size()
        if (rank is not None and rank != r) or (world_size is not None and world_size != w):
            raise SolarError(f"rank/world_size {rank}/{world_size} disagree with comm's {r}/{w}")
        return r, w
    w = 1 if world_size is None else world_size
    r = 0 if rank is None else rank
    if not (isinstance(w, int) and w > 0 and isinstance(r, int) and 0 <= r < w):
        raise SolarError(f"rank {r} is not within world_size {w}")
    return r, w

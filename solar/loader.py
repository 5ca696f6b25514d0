"""The Loader: one rank's part of a planned run, as an iterable of torch batches.

The Loader keeps the public API, the iteration position, resume and close; it never touches a
row. What it runs is solar.runtime: :func:`~solar.runtime.setup.configure` decides the run at
construction, and one :class:`~solar.runtime.pipeline.Pipeline` per process runs each step
through the stages (see solar/runtime/__init__.py for who owns what). Three places, one each:
a sample's bytes are read by ``Executor._run`` (solar/io/executor.py), from storage or the
tier; the decision to keep or evict them was made by the planner (solar/schedule/keep/belady.py
for the ``solar`` policy) and reaches the runtime as a
:class:`~solar.schedule.plans.rankplan.StepPlan`; they are copied into a batch by
:meth:`~solar.runtime.holdings.Holdings.gather` (hits) and by the reads themselves, which land
in the batch's rows.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from solar._process import ProcessLocal
from solar.cache.slots import SlotBuffer
from solar.cache.tier import TierFile
from solar.config import ReaderConfig
from solar.dist import abort_job_on_error, job_comm
from solar.errors import SolarError
from solar.exchange import Exchange
from solar.options import ExpertConfig, LoaderConfig, MemoryConfig, Paths, PlanningConfig
from solar.runtime import pipeline, remote
from solar.runtime.setup import Setup, check_snapshots, configure
from solar.schedule import Plan, make_plan
from solar.schedule.draw.order import step_bounds
from solar.schedule.draw.samplers import Sampler, Trace, extras_of
from solar.stats import LoaderStats
from solar.transform import SampleFn, Transform
from solar.warm import measured, rehearse_loader

log = logging.getLogger(__name__)  # solar.loader (solar sets up no handler: the application does)


class Loader(IterableDataset[dict]):
    """Iterate one rank's batches of a planned multi-epoch run over HDF5 data.

    Call :meth:`set_epoch` before each epoch, as with ``DistributedSampler``; iterating yields
    that epoch's steps as dicts of torch tensors, one per key, plus ``"index"`` (int64 sample
    ids in batch order). Iterating a finished epoch again without :meth:`set_epoch` serves
    it again, as a ``DistributedSampler`` would, and warns once (``set_epoch`` with the same
    epoch first says it is meant; an epoch broken off continues where it stopped).

    A Loader is a torch ``IterableDataset`` of batches: ``DataLoader(loader, batch_size=None)``
    yields them (for ``pin_memory=True`` and the like); other batch sizes and
    ``num_workers > 0`` are refused (the Loader batches, reads on its own threads and keeps
    its buffer in this process).

    The keywords are what a ``DataLoader`` user knows; the rest are records, each default
    owned by its field (:mod:`solar.options`): ``reader`` (:class:`~solar.config.ReaderConfig`:
    threads, read-ahead, O_DIRECT, one sample per file), ``memory``
    (:class:`~solar.options.MemoryConfig`: a second tier, a buffer per host, page mates),
    ``planning`` (:class:`~solar.options.PlanningConfig`: a plan file, policy, slack, equal
    batches, horizon, snapshots) and ``expert`` (:class:`~solar.options.ExpertConfig`: no
    warm-up, an emulated slow file system). :meth:`from_config` takes them all as one
    :class:`~solar.options.LoaderConfig`.

    ``paths`` is a path, glob, directory or list of HDF5 files (``keys``: their datasets,
    default all), or of ``.npy`` files (one key, ``keys[0]`` or ``"data"``), or a dict
    ``{key: .npy files}``, or a :class:`~solar.io.info.DatasetInfo` already made (by
    ``describe_source``); see :mod:`solar.io.sources`.

    ``buffer``: the RAM the rank keeps rows in across steps, in samples (``500``) or bytes
    (``4GiB``) per rank, or a share of the dataset over all ranks (``10%``):
    :func:`solar.config.parse_size`. The planner decides, for every access, a hit or a read.

    The ranks: as ``DistributedSampler`` finds its group, a Loader built without ``comm``,
    ``rank`` or ``world_size`` uses the job's (:func:`solar.dist.job_comm`: ``dist.init()``'s,
    the initialised torch.distributed group, or mpiexec's MPI world) and refuses a job of
    several ranks it cannot reach. ``comm`` passes one; ``rank``/``world_size`` without it
    place this process by hand (plans made offline, ranks simulated in one process, a Loader
    that only some ranks make, e.g. a validation loader on rank 0: ``rank=0, world_size=1``);
    a place the job's group contradicts is refused. A part of the job (the data-parallel ranks
    of a model-parallel job) passes its communicator: ``comm=TorchComm(group=dp_group)`` or an
    MPI sub-communicator (``comm.Split``).
    With a communicator, construction is collective (every rank makes its Loader) and a
    failure in it ends the job, so that no rank waits for another forever. With several
    ranks, a communicator and the Shuffle sampler every rank's batch is exactly
    ``batch_size`` rows every step, as a DataLoader's (``PlanningConfig.equal_batches``).

    ``sampler`` draws each step's ids (:mod:`solar.schedule.draw.samplers`): ``Shuffle()`` (the
    default), ``Weighted(...)``, ``Trace(...)`` or a ``NeighborSampler``; with the latter the
    sampler splits the batches over the ranks, and a batch may repeat an id (read once,
    copied).

    ``transform``: a function ``fn(sample, rng) -> sample`` run on every sample once its bytes
    are in memory, on worker threads, its outputs written into the batch
    (:mod:`solar.transform`; a :class:`~solar.transform.Transform` sets workers, processes,
    declared output shapes); ``rng`` is a pure function of (seed, epoch, sample, occurrence),
    so a resumed run replays the same augmentation. ``batch_transform(batch) -> batch`` runs on
    each delivered batch (the dict of tensors), on the trainer's thread.

    ``batch_format``: ``"dict"`` (default) or ``"pyg"``: each batch a PyTorch Geometric
    ``Data`` (``torch_geometric`` needed) with the dict's entries as attributes, e.g. a
    ``NeighborSampler``'s ``x``, ``edge_index``, ``y``, ``n_id``, ``batch_size``,
    ``num_sampled_nodes``/``num_sampled_edges`` (made after ``batch_transform``).
    """

    stats: LoaderStats
    """What this rank's run cost, as it goes: ``stats.epochs[e]`` one epoch's totals (``print``
    gives one line: samples, hit rate, bytes read, seconds, stall), ``stats.stages(e)`` and
    ``stats.bottleneck(e)`` the pipeline's stages, ``stats.json_lines()`` every step,
    ``stats.warm_seconds`` and ``stats.compile_seconds`` the warm-up
    (:class:`~solar.stats.LoaderStats`)."""
    share: str
    """``"node"`` when the ranks of each host share one buffer, else ``"rank"``: decided at
    construction, alike on every rank (``MemoryConfig.share``)."""
    rank: int
    """This process's rank in the run."""
    world_size: int
    """The run's number of ranks."""

    def __init__(
        self,
        paths: Paths,
        keys: list[str] | None = None,
        *,
        batch_size: int | None = None,
        epochs: int,
        buffer: int | str,
        seed: int = 0,
        sampler: Sampler | None = None,
        transform: SampleFn | Transform | None = None,
        batch_transform: Callable[[dict], dict] | None = None,
        batch_format: str = "dict",
        drop_last: bool = False,
        comm: Any = None,
        rank: int | None = None,
        world_size: int | None = None,
        reader: ReaderConfig | None = None,
        memory: MemoryConfig | None = None,
        planning: PlanningConfig | None = None,
        expert: ExpertConfig | None = None,
        **moved: Any,  # the keywords that moved into the records: refused, saying where
    ) -> None:
        LoaderConfig.refuse_moved(moved)
        self._construct(LoaderConfig(
            paths=paths, keys=keys, batch_size=batch_size, epochs=epochs, buffer=buffer,
            seed=seed, sampler=sampler, transform=transform, batch_transform=batch_transform,
            batch_format=batch_format, drop_last=drop_last, comm=comm, rank=rank,
            world_size=world_size,  # None for a record: its defaults (LoaderConfig's own)
            reader=reader, memory=memory, planning=planning, expert=expert,  # type: ignore[arg-type]
        ))  # fmt: skip

    @classmethod
    def from_config(cls, config: LoaderConfig) -> Loader:
        """A Loader of ``config`` (the records made first, then one build)."""
        loader = cls.__new__(cls)
        loader._construct(config)
        return loader

    def _construct(self, args: LoaderConfig) -> None:
        """Decide ``args`` (the job's communicator if they give no place), then start."""
        args = dataclasses.replace(args, comm=job_comm(args.comm, args.rank, args.world_size))
        snapshots, warm = args.planning.snapshots, args.expert.warm
        # Other ranks may be waiting in the plan agreement: a failure here takes the job down.
        with abort_job_on_error(args.comm), measured() as warmth:
            setup = configure(args)
            check_snapshots(snapshots)
            self._adopt(setup, snapshots)
            if args.memory.share == "auto" and setup.shared and setup.rank == 0:
                log.info("share='auto': one buffer per host (hosts of ranks %s), planned over "
                         "the union of their accesses; MemoryConfig(share='rank') for a "
                         "buffer per rank", setup.hosts.as_record())  # fmt: skip
            self._start(args)
        w = warmth[0]
        self.stats.compile_seconds, self.stats.compiled = w.compile_seconds, w.compiled
        if warm and w.compiled:  # (a rehearsal's own tiny Loader is not warm)
            log.info("this Loader compiled %d numba kernels in %.1f s (numba's cache did not "
                     "hold them); `solar warm` (run by `make`) compiles them once per install, "
                     "then a Loader loads them in milliseconds", w.compiled,
                     w.compile_seconds)  # fmt: skip

    def _adopt(self, setup: Setup, snapshots: str | os.PathLike | None) -> None:
        """Take ``setup``'s decisions: the attributes users read, the rank's plan stream, the
        exchange (made by every rank together), the iteration position."""
        self._setup = setup
        self.info, self.rank, self.world_size = setup.info, setup.rank, setup.world_size
        self.config, self.run, self.spec = setup.config, setup.run, setup.spec
        self.sampler, self.reader, self.out_keys = setup.sampler, setup.reader, setup.out_keys
        self.transform, self.batch_transform = setup.transform, setup.batch_transform
        self._plan: Plan | None = setup.given  # or made on first use of .plan
        # This rank's part, one epoch at a time: read from the plan given, or planned one
        # epoch ahead in the background.
        # Preprocessing workers met first: who owns which step decides this rank's plan.
        self._link = remote.meet(setup)
        self._stream = pipeline.stream(setup, snapshots, self._link)
        # Equal batches: rows move as delivered (transformed, if there is a transform).
        equal = self.spec.equal_batches and self.world_size > 1
        self._exchange = Exchange(setup.comm, self.out_keys) if equal else None
        # Decided at construction, alike on every rank: "node" (one buffer per host) or "rank".
        self.share = setup.share
        self.stats = LoaderStats(share=self.share)
        self._yielded: tuple[int, int] | None = None  # (epoch, step) last yielded
        # Rows of each global step of an epoch (a sampler's trace: of the epoch named).
        self._global_rows: tuple[int, np.ndarray] = (-1, np.diff(step_bounds(self.run)))
        self._epoch, self._next = 0, 0  # the epoch chosen, the global step to start from
        # Whether set_epoch (or a resume) came since the last iteration began, and whether
        # an epoch iterated again without it has been warned of (once per Loader).
        self._epoch_chosen, self._warned_again, self._closed = True, False, False
        self._pipeline: ProcessLocal[pipeline.Pipeline] = ProcessLocal(self._build)

    def _start(self, args: LoaderConfig) -> None:
        """Allocate (and touch) the buffer, create the tier file and warm the reader now, not
        inside the first epoch: an impossible budget or a full disk fails here, and epoch 0
        measures loading, not set-up. With ``ExpertConfig.warm``, plan the first epoch from now
        on and rehearse the run of ``args`` (every kernel its epochs call, compiled now:
        solar/warm.py)."""
        try:
            self._pipeline.get()
            # (Not without the warm-up: the planning thread would then compile under numba's
            # lock, which a fork meanwhile would leave held in the child.)
            if args.expert.warm:
                self._stream.start()
            t0 = time.perf_counter()
            self.reader.warm_up()
            if args.expert.warm:
                rehearse_loader(args, self._setup, Loader.from_config)
            self.stats.warm_seconds = time.perf_counter() - t0
        except BaseException:
            # No thread, process or tier file outlives a Loader never made; closed alone (the
            # other ranks, alive, may never close: a host's collective close would hang).
            self.close(abandon=True)
            raise

    def _build(self) -> pipeline.Pipeline:
        """This process's pipeline. A forked child builds its own, with a new buffer and tier
        refilled before it serves (its parent's reads and files are not its own)."""
        if self._closed and self._setup.shared:
            # Building again would make its host's buffer and exchange: a collective of the
            # host's ranks, which a rank serving alone after close would wait in forever.
            raise SolarError('share="node": this Loader is closed (its host\'s buffer and '
                             "plan are released); make a new Loader")  # fmt: skip
        return pipeline.build(self._setup, self._stream, self.stats, self._exchange, self._link)

    @property
    def plan(self) -> Plan:
        """The whole plan: the one given, or (for inspection; it costs a whole-run planning)
        the plan this loader streams, made on first use, of its grouping (with
        ``share="node"`` every host's buffer and every rank's service)."""
        if self._plan is None:
            self._plan = make_plan(self.spec, hosts=self._setup.plan_hosts)
        return self._plan

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        # The exchange and the communicators belong to this process: a copy cannot take part.
        state["_exchange"] = state["_link"] = None
        state["_setup"] = dataclasses.replace(self._setup, comm=None, host_comm=None)
        return state

    @property
    def buffer(self) -> SlotBuffer:
        """This rank's RAM buffer in this process."""
        return self._pipeline.get().holdings.buffer

    @property
    def tier(self) -> TierFile | None:
        """This rank's second tier in this process (None without one)."""
        return self._pipeline.get().tier

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
        self._epoch_chosen = True

    def __iter__(self) -> Iterator[dict]:
        _check_torch_caller(sys._getframe(1))
        end = (self._epoch + 1) * self.run.steps_per_epoch
        if self._next == end and not self._epoch_chosen and not self._warned_again:
            self._warned_again = True
            warnings.warn(
                f"solar: epoch {self._epoch} was iterated to its end and is iterated again "
                "without set_epoch: serving the same batches again (call "
                "loader.set_epoch(epoch) before each epoch, as with DistributedSampler; "
                "set_epoch with the same epoch to repeat it on purpose)",
                stacklevel=2,
            )
        self._epoch_chosen = False
        return self._serve()

    def _serve(self) -> Iterator[dict]:
        """The epoch chosen when the first batch is asked for, from where it stands (the
        pipeline moves its buffer there, under the job's abort guard)."""
        spe = self.run.steps_per_epoch
        first, end = self._epoch * spe, (self._epoch + 1) * spe
        start = self._next if first <= self._next < end else first
        for k in range(start, end):
            batch = self._pipeline.get().serve(k)
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
        if self.spec.traced and self._global_rows[0] != epoch:
            self._global_rows = (epoch, self._pipeline.get().steps.global_rows(epoch))
        return int(self._global_rows[1][t])

    @property
    def loss_count(self) -> int:
        """What a loss averages over in the step last yielded, over all ranks (0 before any):
        its rows (:attr:`global_batch`), or a GNN batch's seeds. ``solar.dist.scale_loss(
        loss_sum, loader)`` divides by it, for a gradient that is the global mean's."""
        if self._yielded is None:
            return 0
        count = extras_of(self.sampler).loss_count(self.run, self._yielded[1])
        return self.global_batch if count is None else count

    def state_dict(self) -> dict:
        """Where the run stands: resume with :meth:`load_state_dict` on the same plan."""
        spe = self.run.steps_per_epoch
        # After an epoch's last step the next thing to run is the next epoch.
        epoch = self._epoch + 1 if self._next == (self._epoch + 1) * spe else self._epoch
        state = {
            "fingerprint": self.spec.fingerprint,
            "order": self._order_fingerprint(),
            "global_batch": self.run.global_batch,
            "rank": self.rank,
            "world_size": self.world_size,
            "epoch": epoch,
            "next_step": self._next,
        }
        if self._setup.shared:  # the grouping it came from (any other loads it)
            state["hosts"] = self._setup.hosts.as_record()
        return state

    def _order_fingerprint(self) -> str:
        """What the global batches depend on: not the world size or local batch, only their
        product (mosaicml-streaming's elastic determinism)."""
        run = self.run
        plan = self._plan  # (a plan grouped by host: the run's order, as states always had)
        order = plan.epoch_order if plan is not None and plan.hosts is None else \
            np.arange(run.epochs)  # fmt: skip
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
        spe = run.steps_per_epoch
        if not (0 <= step <= run.num_steps and epoch * spe <= step <= (epoch + 1) * spe):
            raise SolarError(f"loader state: step {step} is not within epoch {epoch} of this run")
        self._epoch, self._next, self._epoch_chosen = min(epoch, run.epochs - 1), step, True

    def wait_reads(self) -> None:
        """Wait until the reads under way (ahead of the next step, maybe into the next epoch)
        are done; they are kept for the steps that need them."""
        runner = self._pipeline.here()
        if runner is not None:
            runner.wait_reads()

    def close(self, abandon: bool = False) -> None:
        """Stop the background work; remove the tier file. (With ``share="node"`` the Loader
        serves no more: its host's buffer and plan are released, together with the host's
        ranks.) ``abandon``: on an error path, this rank alone (no collective: the others
        may never close)."""
        self._closed = True
        runner = self._pipeline.drop()  # a forked child never waits for its parent's reads
        if runner is not None:
            runner.close()
        self._stream.close(abandon)
        if self._link is not None:  # (the pipeline's pool closed it, unless never built)
            self._link.close()
        self.reader.close()
        if self._exchange is not None:
            self._exchange.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(abandon=exc[0] is not None)  # (an exception: this rank alone, see close)


def _check_torch_caller(caller: Any) -> None:
    """Refuse, in one line, the ways torch's DataLoader would serve a Loader wrongly: in
    worker processes (each would serve the whole epoch: samples repeated) or collated again
    into batches of batches (``batch_size`` other than None). ``caller``: the frame that
    asked for an iterator (torch's fetcher, when a DataLoader asks)."""
    worker = get_worker_info()
    if worker is not None:
        raise SolarError(
            f"a solar Loader in a DataLoader with num_workers={worker.num_workers}: every "
            "worker would serve the whole epoch; use DataLoader(loader, batch_size=None) "
            "(num_workers=0: the Loader reads on its own threads, ReaderConfig(threads=...), "
            "and transforms on its workers, Transform(...))"
        )
    # Only torch's fetcher's frame is looked into: reading another frame's f_locals would
    # keep a snapshot of its locals (this Loader among them) alive with that frame.
    code = caller.f_code
    if (
        code.co_name == "__init__"
        and code.co_filename.endswith(os.path.join("data", "_utils", "fetch.py"))
        and caller.f_locals.get("auto_collation")
    ):
        raise SolarError(
            "a solar Loader yields whole batches: wrap it as DataLoader(loader, "
            "batch_size=None), not with a batch_size (it would batch the batches)"
        )

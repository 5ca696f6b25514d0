"""The Loader: one rank's part of a planned run, as an iterable of torch batches.

The Loader keeps the public API, the iteration position, resume and close; it never touches a
row. What it runs is solar.runtime: :func:`~solar.runtime.setup.configure` decides the run at
construction, and one :class:`~solar.runtime.pipeline.Pipeline` per process runs each step
through the stages (see solar/runtime/__init__.py for who owns what). Three places, one each:
a sample's bytes are read by ``Executor._run`` (solar/io/executor.py), from storage or the
tier; the decision to keep or evict them was made by the planner (solar/schedule/belady.py
for the ``solar`` policy) and reaches the runtime as a
:class:`~solar.schedule.rankplan.StepPlan`; they are copied into a batch by
:meth:`~solar.runtime.holdings.Holdings.gather` (hits) and by the reads themselves, which land
in the batch's rows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from solar._process import ProcessLocal
from solar.cache.slots import SlotBuffer
from solar.cache.tier import TierFile
from solar.config import DEFAULT_SLACK, ReaderConfig
from solar.dist import abort_job_on_error, job_comm
from solar.errors import SolarError
from solar.exchange import Exchange
from solar.io.info import DatasetInfo
from solar.runtime import pipeline
from solar.runtime.setup import Setup, check_snapshots, configure
from solar.schedule import Plan, make_plan
from solar.schedule.nodefile import NodeFileStream, NodePlan, make_node_plan
from solar.schedule.nodeplan import stage_bound
from solar.schedule.nodestream import NodeStream
from solar.schedule.order import step_bounds
from solar.schedule.plan import plan_to_file
from solar.schedule.samplers import Sampler, Trace
from solar.schedule.stream import RankStream
from solar.stats import LoaderStats
from solar.transform import SampleFn, Transform
from solar.warm import (
    READ_BUDGET,
    Warmth,
    head,
    measured,
    rehearse_node,
    settle_compiler_garbage,
    tiny_spec,
)

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

    The ranks: as ``DistributedSampler`` finds its group, a Loader built without ``comm``,
    ``rank`` or ``world_size`` uses the job's (:func:`solar.dist.job_comm`: ``dist.init()``'s,
    the initialised torch.distributed group, or mpiexec's MPI world) and refuses a job of
    several ranks it cannot reach. ``comm`` passes one; ``rank``/``world_size`` without it
    place this process by hand (plans made offline, ranks simulated in one process, a Loader
    that only some ranks make, e.g. a validation loader on rank 0: ``rank=0, world_size=1``).
    With a communicator, construction is collective (every rank makes its Loader) and a
    failure in it ends the job, so that no rank waits for another forever.

    Equal batches by default: with several ranks, a communicator and the Shuffle sampler
    (another sampler decides each rank's batch itself), every rank's batch is
    exactly ``batch_size`` every step (a short last step split evenly), as a DataLoader's; the
    rows a rank serves beyond it move to ranks under it through ``comm``
    (:mod:`solar.exchange`); a rank's batch is its own rows in service order, then those
    received, by sender rank (:mod:`solar.schedule.transfer`). ``equal_batches=False`` opts
    into local batches that vary within ``slack`` (fewer rows moved; weigh the loss with
    ``solar.dist.scale_loss(loss_sum, loader)``, :attr:`loss_count`). With a plan given, the
    plan's choice holds.

    ``paths`` is a path, glob, directory or list of HDF5 files (``keys``: their datasets,
    default all), or of ``.npy`` files (one key, ``keys[0]`` or ``"data"``), or a dict
    ``{key: .npy files}``, or a :class:`~solar.io.info.DatasetInfo` already made (by
    ``describe_source``); see :mod:`solar.io.sources`. With ``one_per_file`` each file is
    one sample (its whole datasets), else files hold samples along their first axis.

    ``buffer`` (RAM) and ``tier_size`` (a second tier: one file per rank, or per host with a
    node buffer, in the directory ``tier``, on node-local NVMe) are capacities in samples
    (``500``) or bytes (``4GiB``) per rank, or a share of the dataset over all ranks (``10%``):
    :func:`solar.config.parse_size`. The planner decides, for every access, a RAM hit, a tier
    hit or a storage read. A forked child process builds its own buffer (and tier), refilled
    before it serves; with a node buffer it is refused in one line (only the process that joined
    its host serves it).

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

    ``batch_format``: ``"dict"`` (default) or ``"pyg"``: each batch a PyTorch Geometric
    ``Data`` (``torch_geometric`` needed) with the dict's entries as attributes, e.g. a
    ``NeighborSampler``'s ``x``, ``edge_index``, ``y``, ``n_id``, ``batch_size``,
    ``num_sampled_nodes``/``num_sampled_edges`` (made after ``batch_transform``).

    ``share``: ``"auto"`` (default) gives the ranks of a host one RAM buffer wherever that
    pays and runs: more than one rank of the job on a host, a sampler whose ranks' accesses
    overlap (one that fixes each rank's batch: ``NeighborSampler``, ``Trace``,
    ``Weighted(affinity=False)``), the solar policy and a configuration the node buffer runs
    (below); else a
    buffer per rank, as ``"rank"`` always does (one rank per host: today's behaviour, bit for
    bit). The choice is made once, alike on every rank: :attr:`share` and ``stats.share`` say
    it. ``"node"`` asks for it: the ranks of a host share one RAM buffer of their buffers' sum,
    in shared memory, planned by Belady over the union of their accesses
    (solar/schedule/nodeplan.py); a row several local ranks need at a step is read once, by
    one of them, and copied to the others. Ranks are grouped by host name (``SOLAR_HOSTS=HxL``
    forces H hosts of L consecutive ranks). With a sampler with affinity (``Shuffle``,
    ``Weighted``) the host's share of each global batch is dealt over its ranks, no row moving
    between them; with equal batches every rank still serves ``batch_size`` rows, only a
    host's surplus moving to ranks of other hosts (solar/schedule/nodeequal.py). The host's tier
    (``tier``/``tier_size``: its ranks' sizes summed) is one file in the directory shared by
    its ranks; ``snapshots`` are the node planner's (rank 0 saves every host's; a resume
    replans from the newest of this grouping), a state saved with another grouping or world
    size loads where the global batches allow (as above). ``plan=`` takes a node
    plan file (``solar plan --share node``) made for this job's grouping (``"auto"`` follows
    the file's kind). For now: no deterministic transform (``"node"`` refuses it in one line,
    ``"auto"`` then keeps a buffer per rank). Every step is then a collective of the host's
    ranks (two barriers, more on a step whose host updates a tier or RAM cell twice): every
    local rank iterates the same steps.
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
        equal_batches: bool | None = None,
        transform: SampleFn | Transform | None = None,
        batch_transform: Callable[[dict], dict] | None = None,
        warm: bool = True,
        page_mates: bool = True,
        batch_format: str = "dict",
        share: str = "auto",
    ) -> None:
        comm = job_comm(comm, rank, world_size)  # the job's, if the caller gave no place
        # Other ranks may be waiting in the plan agreement: a failure here takes the job down.
        with abort_job_on_error(comm), measured() as warmth:
            setup = configure(
                paths, keys, batch_size=batch_size, epochs=epochs, buffer=buffer, seed=seed,
                slack=slack, plan=plan, comm=comm, rank=rank, world_size=world_size,
                drop_last=drop_last, policy=policy, reader=reader, throttle=throttle,
                one_per_file=one_per_file, tier=tier, tier_size=tier_size, sampler=sampler,
                horizon=horizon, equal_batches=equal_batches, transform=transform,
                batch_transform=batch_transform, page_mates=page_mates,
                batch_format=batch_format, share=share, snapshots=snapshots,
            )  # fmt: skip
            check_snapshots(snapshots)
            self._adopt(setup, snapshots)
            if share == "auto" and setup.hosts is not None and setup.rank == 0:
                h = setup.hosts
                log.info("share='auto': one buffer per host (hosts of ranks %s), planned over "
                         "the union of their accesses; share='rank' for a buffer per rank",
                         h.as_record())  # fmt: skip
            self._start(warm)
        self.stats.compile_seconds = warmth[0].compile_seconds
        self.stats.compiled = warmth[0].compiled
        if warm and warmth[0].compiled:  # (a rehearsal's own tiny Loader is not warm)
            log.info(
                "this Loader compiled %d numba kernels in %.1f s (numba's cache did not hold "
                "them); `solar warm` (run by `make`) compiles them once per install, then a "
                "Loader loads them in milliseconds",
                warmth[0].compiled, warmth[0].compile_seconds,
            )  # fmt: skip

    def _adopt(self, setup: Setup, snapshots: str | os.PathLike | None) -> None:
        """Take ``setup``'s decisions: the attributes users read, the rank's plan stream, the
        exchange (made by every rank together), the iteration position."""
        self._setup = setup
        self.info, self.rank, self.world_size = setup.info, setup.rank, setup.world_size
        self.config, self.run, self.spec = setup.config, setup.run, setup.spec
        self.sampler, self.reader, self.out_keys = setup.sampler, setup.reader, setup.out_keys
        self.transform, self.batch_transform = setup.transform, setup.batch_transform
        given = setup.given
        self._plan: Plan | None = given if isinstance(given, Plan) else None
        self._node_plan: NodePlan | None = None  # share="node": made on first use of .plan
        # This rank's part, one epoch at a time: read from the plan given, or planned one
        # epoch ahead in the background.
        self._stream: RankStream | NodeStream
        if setup.hosts is None:
            self._stream = RankStream(self.spec, self.rank, self._plan, snapshots)
        elif isinstance(given, NodePlan):  # share="node": this rank's share of its host's plan
            self._stream = NodeFileStream(given, self.rank, stage_bound(self.spec, setup.hosts))
        else:
            self._stream = NodeStream(self.spec, self.rank, setup.hosts,
                                      stage_bound(self.spec, setup.hosts), snapshots,
                                      setup.host_comm)  # fmt: skip
        self._exchange: Exchange | None = None
        if self.spec.equal_batches and self.world_size > 1:
            # Rows move as delivered: transformed, if there is a transform.
            self._exchange = Exchange(setup.comm, self.out_keys)
        # Decided at construction, alike on every rank: "node" (one buffer per host) or "rank".
        self.share = "rank" if setup.hosts is None else "node"
        self.stats = LoaderStats(share=self.share)
        self._yielded: tuple[int, int] | None = None  # (epoch, step) last yielded
        # Rows of each global step of an epoch (a sampler's trace: of the epoch named).
        self._global_rows: tuple[int, np.ndarray] = (-1, np.diff(step_bounds(self.run)))
        self._epoch = 0
        self._next = 0  # global step the next iteration starts from
        # Whether set_epoch (or a resume) came since the last iteration began, and whether
        # an epoch iterated again without it has been warned of (once per Loader).
        self._epoch_chosen = True
        self._warned_again = False
        self._closed = False
        self._pipeline: ProcessLocal[pipeline.Pipeline] = ProcessLocal(self._build)

    def _start(self, warm: bool) -> None:
        """Allocate (and touch) the buffer, create the tier file and warm the reader now, not
        inside the first epoch: an impossible budget or a full disk fails here, and epoch 0
        measures loading, not set-up. With ``warm``, plan the first epoch from now on and
        rehearse the run (every kernel its epochs call, compiled now: solar/warm.py)."""
        try:
            self._pipeline.get()
            # (Not without the warm-up: the planning thread would then compile under numba's
            # lock, which a fork meanwhile would leave held in the child.)
            if warm:
                self._stream.start()
            t0 = time.perf_counter()
            self.reader.warm_up()
            if warm:
                given = self._plan
                _rehearse(
                    self, None if given is None else "memory" if given.file is None else "file"
                )
            self.stats.warm_seconds = time.perf_counter() - t0
        except BaseException:
            self.close()  # no thread, process or tier file outlives a Loader never made
            raise

    def _build(self) -> pipeline.Pipeline:
        """This process's pipeline. A forked child builds its own, with a new buffer and tier
        refilled before it serves (its parent's reads and files are not its own)."""
        if self._closed and self._setup.hosts is not None:
            # Building again would make its host's buffer and board: a collective of the
            # host's ranks, which a rank serving alone after close would wait in forever.
            raise SolarError('share="node": this Loader is closed (its host\'s buffer and '
                             "plan are released); make a new Loader")  # fmt: skip
        return pipeline.build(self._setup, self._stream, self.stats, self._exchange)

    @property
    def plan(self) -> Plan | NodePlan:
        """The whole plan: the one given, or (for inspection; it costs a whole-run planning)
        the plan this loader streams, made on first use; with ``share="node"`` the node plan
        (every host's buffer and every rank's service)."""
        hosts, given = self._setup.hosts, self._setup.given
        if hosts is None:
            if self._plan is None:
                self._plan = make_plan(self.spec)
            return self._plan
        if isinstance(given, NodePlan):
            return given
        if self._node_plan is None:
            self._node_plan = make_node_plan(self.spec, hosts)
        return self._node_plan

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        # The exchange belongs to this process's communicator: a copy cannot take part.
        state["_exchange"] = None
        state["_setup"] = _portable(self._setup)
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
        count = self.sampler.loss_count(self.run, self._yielded[1])
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
        if self._setup.hosts is not None:  # the grouping it came from (any other loads it)
            state["hosts"] = self._setup.hosts.as_record()
        return state

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
        self._epoch_chosen = True

    def wait_reads(self) -> None:
        """Wait until the reads under way (ahead of the next step, maybe into the next epoch)
        are done; they are kept for the steps that need them."""
        runner = self._pipeline.here()
        if runner is not None:
            runner.wait_reads()

    def close(self) -> None:
        """Stop the background work; remove the tier file. (With ``share="node"`` the Loader
        serves no more: its host's buffer and plan are released.)"""
        self._closed = True
        runner = self._pipeline.drop()  # a forked child never waits for its parent's reads
        if runner is not None:
            runner.close()
        self._stream.close()
        self.reader.close()
        if self._exchange is not None:
            self._exchange.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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


def _portable(setup: Setup) -> Setup:
    """``setup`` for another process: its communicators stay here."""
    return dataclasses.replace(setup, comm=None, host_comm=None)


def _rehearse(loader: Loader, plan: str | None) -> Warmth:
    """Run a tiny copy of ``loader``'s run over its own files to its end, then drop it: every
    kernel ``loader``'s epochs call is compiled (or loaded from the cache) by then (a node
    buffer's own kernels by :func:`~solar.warm.rehearse_node`). ``plan``: how the real run's
    plan came, ``"file"`` or ``"memory"`` (None: streamed)."""
    info: DatasetInfo = loader.info
    with measured() as w:
        fit = max(1, READ_BUDGET // max(1, info.sample_bytes)) * loader.world_size
        first = head(info, tiny_spec(loader.spec, min(info.num_samples, fit)).run.num_samples)
        spec = tiny_spec(loader.spec, first.num_samples, first.identity)
        run = spec.run
        with contextlib.ExitStack() as stack:
            made: Any = None
            # (The tiny Loader has no communicator: its ranks exchange no rows.)
            alone = dataclasses.replace(spec, equal_batches=False)
            if plan == "file":  # the same path as the real run's: read from a file, proven
                tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="solar-warm-"))
                made = plan_to_file(alone, Path(tmp) / "plan.h5")
            elif plan == "memory":
                made = make_plan(alone)
            with warnings.catch_warnings():  # the real run said what its tiny copy would
                warnings.simplefilter("ignore", UserWarning)
                tiny = Loader(
                    first, [k.name for k in info.keys],
                    batch_size=run.batch_size, epochs=run.epochs, buffer=spec.buffer.capacity,
                    seed=run.seed, slack=spec.buffer.slack, plan=made, rank=loader.rank,
                    world_size=run.world_size, drop_last=run.drop_last, policy=spec.policy,
                    reader=loader.config, one_per_file=info.one_per_file,
                    tier=loader._setup.tier_dir if spec.buffer.tier else None,
                    tier_size=spec.buffer.tier, sampler=spec.sampler, horizon=spec.horizon,
                    warm=False, page_mates=spec.pages is not None,
                )  # fmt: skip
            with tiny:
                for epoch in range(run.epochs):
                    tiny.set_epoch(epoch)
                    for _ in tiny:
                        pass
                # A resume's path too: a jump back replays the buffer (and refills it).
                tiny.set_epoch(run.epochs - 1)
                for _ in zip(tiny, range(1), strict=False):
                    pass
            loader.sampler.rehearse(loader.run, loader.rank)  # its own kernels, if any
        hosts = loader._setup.hosts
        if hosts is not None:  # share="node": the tiny Loader ran per rank; the node's own
            given = isinstance(loader._setup.given, NodePlan)
            rehearse_node(spec, hosts, loader.rank, plan_file=given)
    if w[0].compiled:
        settle_compiler_garbage()
    return w[0]

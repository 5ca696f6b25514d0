"""A Loader's arguments as records: what a DataLoader user knows stays flat, the rest is grouped.

:class:`~solar.loader.Loader` takes the arguments a PyTorch ``DataLoader`` (or PyG
``NeighborLoader``) user already knows as keywords: the data (``paths``, ``keys``), the run
(``batch_size``, ``epochs``, ``seed``, ``drop_last``), the memory it may use (``buffer``),
what is drawn and how it is shaped (``sampler``, ``transform``, ``batch_transform``,
``batch_format``) and the process's place (``comm``, or ``rank``/``world_size`` as
``DistributedSampler`` takes them). Everything else is a frozen record, each default owned by
its field (zarr-python's configuration, SPDL's pipeline definitions):

* :class:`~solar.config.ReaderConfig`: how files are read (threads, read-ahead, O_DIRECT,
  whole files as samples);
* :class:`MemoryConfig`: where the kept rows live (a second tier, a buffer per host, page
  mates);
* :class:`PlanningConfig`: how the plan is made or where it comes from (policy, slack,
  horizon, equal batches, a plan file, snapshots);
* :class:`ExpertConfig`: knobs for benchmarks and tests (an emulated slow file system, no
  warm-up).

All of them together are one :class:`LoaderConfig`, which
:func:`~solar.runtime.setup.configure` decides in one place (records first, then one build);
the Loader's rehearsal derives its tiny run's record from the real one
(:func:`dataclasses.replace`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from solar.config import DEFAULT_SLACK, ReaderConfig
from solar.io.info import DatasetInfo
from solar.io.throttle import Throttle
from solar.schedule import Plan
from solar.schedule.samplers import Sampler
from solar.transform import SampleFn, Transform

Paths = str | os.PathLike | Sequence[str | os.PathLike] | Mapping[str, Any] | DatasetInfo


@dataclass(frozen=True, kw_only=True)
class MemoryConfig:
    """Where a Loader keeps the rows it holds between steps, beyond its RAM ``buffer``.

    ``tier`` and ``tier_size``: a second tier, one file per rank (per host with a node buffer)
    in the directory ``tier`` on node-local NVMe, of ``tier_size`` samples (``500``) or bytes
    (``4GiB``) per rank or a share of the dataset over all ranks (``10%``), read by
    :func:`solar.config.parse_size` as ``buffer`` is. Both or neither. The planner decides,
    for every access, a RAM hit, a tier hit or a storage read.

    ``share``: ``"auto"`` gives the ranks of a host one RAM buffer wherever that pays and
    runs: more than one rank of the job on a host, a sampler whose ranks' accesses overlap
    (one that fixes each rank's batch: ``NeighborSampler``, ``Trace``,
    ``Weighted(affinity=False)``), the solar policy and a configuration the node buffer runs;
    else a buffer per rank, as ``"rank"`` always does. The choice is made once, alike on every
    rank: ``loader.share`` and ``stats.share`` say it. ``"node"`` asks for it: the ranks of a
    host share one RAM buffer of their buffers' sum, in shared memory, planned by Belady over
    the union of their accesses (solar/schedule/nodeplan.py); a row several local ranks need
    at a step is read once, by one of them, and copied to the others. Ranks are grouped by
    host name (``SOLAR_HOSTS=HxL`` forces H hosts of L consecutive ranks). With a sampler
    with affinity (``Shuffle``, ``Weighted``) the host's share of each global batch is dealt
    over its ranks; with equal batches only a host's surplus moves to ranks of other hosts
    (solar/schedule/nodeequal.py). The host's tier (its ranks' sizes summed) is one file in
    the directory shared by its ranks; snapshots are the node planner's. For now no
    deterministic transform (``"node"`` refuses it in one line, ``"auto"`` then keeps a buffer
    per rank). Every step is a collective of the host's ranks: every local rank iterates the
    same steps. A forked child process builds its own buffer (and tier), refilled before it
    serves; with a node buffer it is refused in one line.

    ``page_mates``: where rows are at most half a page (one file, one contiguous key, a
    sampler that splits its own batches, the solar policy, a RAM buffer, no deterministic
    transform), also keep the rows that share pages with a step's reads when they are used
    sooner than what the buffer holds (:mod:`solar.schedule.pagemates`); raw batch memory then
    has room for twice a batch's rows. False plans rows alone.
    """

    tier: str | os.PathLike | None = None
    tier_size: int | str = 0
    share: str = "auto"
    page_mates: bool = True


@dataclass(frozen=True, kw_only=True)
class PlanningConfig:
    """How a Loader's plan is made, or where it comes from.

    ``plan``: a :class:`~solar.schedule.plan.Plan` or a plan file (``solar plan -o``, or
    ``solar plan --share node`` for a node buffer: ``share="auto"`` then follows the file's
    kind), proven safe by every rank before any byte moves; its choices (policy, horizon,
    equal batches, page mates) hold. None: planned one epoch ahead in the background.

    ``policy``: ``"solar"`` (Belady over the known future) or a baseline
    (:data:`solar.schedule.POLICIES`). ``slack``: a rank may serve up to
    ``ceil(batch_size * (1 + slack))`` rows of a global batch, keeping more of its hits
    (:class:`~solar.config.BufferConfig`).

    ``equal_batches``: None (default) gives every rank exactly ``batch_size`` rows every step
    (a short last step split evenly), as a DataLoader's, wherever ranks can exchange rows:
    several ranks, a communicator and the Shuffle sampler (another sampler decides each rank's
    batch itself). The rows a rank serves beyond it move to ranks under it through ``comm``
    (:mod:`solar.exchange`); a rank's batch is its own rows in service order, then those
    received, by sender rank. ``False`` opts into local batches that vary within ``slack``
    (fewer rows moved; weigh the loss with ``solar.dist.scale_loss(loss_sum, loader)``).

    ``horizon``: epochs the planner looks ahead for a sampler's trace (``Weighted``,
    ``Trace``, ``NeighborSampler``); None: the whole run if it fits in memory.

    ``snapshots``: a directory (shared by the ranks, beside the checkpoints) where rank 0
    saves the planner's state after each epoch it plans, a few MB; a resume
    (``load_state_dict``) then replans from the newest snapshot at or before its epoch
    instead of from epoch 0 (with a node buffer: the node planner's, of this grouping).
    """

    plan: Plan | str | os.PathLike | None = None
    policy: str = "solar"
    slack: float = DEFAULT_SLACK
    equal_batches: bool | None = None
    horizon: int | None = None
    snapshots: str | os.PathLike | None = None


@dataclass(frozen=True, kw_only=True)
class ExpertConfig:
    """Knobs for benchmarks and tests; a training run keeps the defaults.

    ``warm`` (default): compile every numba kernel the epochs will call at construction, by
    running a tiny copy of this run (:mod:`solar.warm`); ``stats.warm_seconds`` and
    ``stats.compile_seconds`` say what it cost. False: kernels compile when first called.

    ``throttle``: a :class:`~solar.io.throttle.Throttle` emulating a remote file system
    (latency per request, a bandwidth cap per rank), as ``solar bench --throttle`` does.
    """

    warm: bool = True
    throttle: Throttle | None = None


@dataclass(frozen=True, kw_only=True)
class LoaderConfig:
    """Everything a :class:`~solar.loader.Loader` is built from: its keywords and records.

    ``Loader(...)`` makes one of its arguments; ``Loader.from_config`` takes one made
    elsewhere. :func:`~solar.runtime.setup.configure` decides it.
    """

    paths: Paths
    keys: list[str] | None = None
    batch_size: int | None = None
    epochs: int
    buffer: int | str
    seed: int = 0
    sampler: Sampler | None = None
    transform: SampleFn | Transform | None = None
    batch_transform: Callable[[dict], dict] | None = None
    batch_format: str = "dict"
    drop_last: bool = False
    comm: Any = None
    rank: int | None = None
    world_size: int | None = None
    reader: ReaderConfig = field(default_factory=ReaderConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    planning: PlanningConfig = field(default_factory=PlanningConfig)
    expert: ExpertConfig = field(default_factory=ExpertConfig)

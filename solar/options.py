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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from solar.config import DEFAULT_SLACK, ReaderConfig, check_slack
from solar.errors import SolarError
from solar.io.info import DatasetInfo
from solar.io.throttle import Throttle
from solar.schedule import Plan
from solar.schedule.draw.samplers import Sampler
from solar.schedule.policy import POLICIES, TRACE_POLICIES
from solar.transform import SampleFn, Transform

Paths = str | os.PathLike | Sequence[str | os.PathLike] | Mapping[str, Any] | DatasetInfo
SHARES = ("auto", "rank", "node")


def _check(name: str, value: Any, ok: bool, what: str) -> None:
    """Refuse, in one line naming the parameter, a record's field that is not ``what``."""
    if not ok:
        raise SolarError(f"{name} must be {what}, got {value!r}")


def _is_path(value: Any) -> bool:
    return isinstance(value, (str, os.PathLike))


def _is_bool(value: Any, optional: bool = False) -> bool:
    return isinstance(value, bool) or (optional and value is None)


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
    the union of their accesses (solar/schedule/keep/hostplan.py); a row several local ranks need
    at a step is read once, by one of them, and copied to the others. Ranks are grouped by
    host name (``SOLAR_HOSTS=HxL`` forces H hosts of L consecutive ranks). With a sampler
    with affinity (``Shuffle``, ``Weighted``) the host's share of each global batch is dealt
    over its ranks; with equal batches only a host's surplus moves to ranks of other hosts
    (solar/schedule/keep/hostequal.py). The host's tier (its ranks' sizes summed) is one file in
    the directory shared by its ranks; snapshots are the node planner's. For now no
    deterministic transform (``"node"`` refuses it in one line, ``"auto"`` then keeps a buffer
    per rank). Every step is a collective of the host's ranks: every local rank iterates the
    same steps. A forked child process builds its own buffer (and tier), refilled before it
    serves; with a node buffer it is refused in one line.

    ``page_mates``: where rows are at most half a page (one file, one contiguous key, a
    sampler that splits its own batches, the solar policy, a RAM buffer, no deterministic
    transform), also keep the rows that share pages with a step's reads when they are used
    sooner than what the buffer holds (:mod:`solar.schedule.draw.pagemates`); raw batch memory then
    has room for twice a batch's rows. False plans rows alone, and so does packing where it
    can pay on the device (:class:`PackingConfig`). (A plan given decides it:
    :class:`PlanningConfig`'s ``plan``.)

    ``pack``: a :class:`PackingConfig`: where a window of steps reads its misses faster from a
    layout packed in plan order on node-local disk than as random pages, it is packed there
    (none by default: it needs a disk budget).
    """

    tier: str | os.PathLike | None = None
    tier_size: int | str = 0
    share: str = "auto"
    page_mates: bool = True
    pack: PackingConfig = field(default_factory=lambda: PackingConfig())

    def __post_init__(self) -> None:
        t, size = self.tier, self.tier_size
        _check("tier", t, t is None or _is_path(t), "a directory or None")
        _check("tier_size", size, isinstance(size, int | str) and not isinstance(size, bool),
               'a size (500, "4GiB", "10%")')  # fmt: skip
        _check("share", self.share, self.share in SHARES, f"one of {SHARES}")
        _check("page_mates", self.page_mates, _is_bool(self.page_mates), "True or False")
        _check("pack", self.pack, isinstance(self.pack, PackingConfig), "a PackingConfig")


@dataclass(frozen=True, kw_only=True)
class PackingConfig:
    """Misses read in the order the device likes (``MemoryConfig(pack=...)``).

    The plan knows every step's misses ahead. Where a window of steps would read them
    faster from a layout packed in plan order on node-local disk (each step's misses one
    contiguous region, built ahead by a sequential scan of the source and a sequential write,
    while earlier steps are served) than as random pages, that window is packed
    (solar/schedule/plans/packing.py decides, from the device's rates); else read as today.
    Batches are the same bytes either way; where packing can pay, the plan reads rows alone
    (no page mates: fewer hits, fewer bytes), and a packed step's misses come from its layout.

    ``disk``: the most disk the packed layouts may take at once, per rank, as bytes
    (``"8GiB"``) or rows; 0 (default): no packing. Two windows live at once (one read, the
    next built), so a window holds at most half of it; refused unless ``directory`` has it
    free. ``directory``: where (node-local storage; default: the system's temporary
    directory, refused where that is tmpfs: memory, not disk).
    ``random_pages_per_second`` and ``sequential_bytes_per_second``: the device's rates
    (solar/io/probe.py); None: probed on the source at construction for ``probe_seconds``.
    ``margin``: a window is packed where its packed cost times this is below its random
    cost. ``chunk_bytes``: the source is scanned in reads of this size (a few in flight).
    The planner decides the windows with the plan; each rank packs the misses it reads: its
    own buffer's, or (``share="node"``) those its host's plan gives it to read. Where packing
    can pay on the device (on any rank), the plan reads rows alone, without page mates; where it
    cannot, the Loader does not pack (docs/concepts/buffer.md). For now: one
    file, one contiguous key (a GNN's features, a contiguous HDF5 dataset), a buffer without
    a tier or a deterministic transform; else refused in one line.
    """

    disk: int | str = 0
    directory: str | os.PathLike | None = None
    random_pages_per_second: float | None = None
    sequential_bytes_per_second: float | None = None
    margin: float = 1.25
    chunk_bytes: int = 16 * 2**20
    probe_seconds: float = 0.5

    def __post_init__(self) -> None:
        d = self.disk
        _check("pack disk", d, isinstance(d, int | str) and not isinstance(d, bool),
               'a size ("8GiB", rows) or 0')  # fmt: skip
        _check("pack directory", self.directory, self.directory is None
               or _is_path(self.directory), "a directory or None")  # fmt: skip
        for name in ("random_pages_per_second", "sequential_bytes_per_second"):
            v = getattr(self, name)
            _check(name, v, v is None or (isinstance(v, int | float) and v > 0),
                   "a positive rate or None")  # fmt: skip
        _check("margin", self.margin, isinstance(self.margin, int | float) and self.margin > 0,
               "a positive number")  # fmt: skip
        _check("chunk_bytes", self.chunk_bytes, isinstance(self.chunk_bytes, int)
               and self.chunk_bytes >= 2**16, "at least 64 KiB")  # fmt: skip
        _check("probe_seconds", self.probe_seconds, isinstance(self.probe_seconds, int | float)
               and self.probe_seconds > 0, "positive")  # fmt: skip

    @property
    def on(self) -> bool:
        """Whether packing may happen at all (a disk budget given)."""
        return self.disk not in (0, "0")


@dataclass(frozen=True, kw_only=True)
class PlanningConfig:
    """How a Loader's plan is made, or where it comes from.

    ``plan``: a :class:`~solar.schedule.plans.plan.Plan` or a plan file (``solar plan -o``, or
    ``solar plan --share node`` for a node buffer: ``share="auto"`` then follows the file's
    kind), proven safe by every rank before any byte moves; its choices hold over this
    record's ``policy``, ``horizon`` and ``equal_batches`` and :class:`MemoryConfig`'s
    ``page_mates``. None: planned one epoch ahead in the background.

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

    ``window``: a sampler's trace without affinity (``NeighborSampler``, ``Trace``) planned in
    windows of this many steps, each window's next uses known one window ahead: the planner's
    memory grows with the window, not the epoch, for a few hits (bench/window_hits.py). None:
    whole epochs wherever an epoch's trace fits (``solar.schedule.draw.traces.default_window``).

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
    window: int | None = None
    snapshots: str | os.PathLike | None = None

    def __post_init__(self) -> None:
        plan, h, names = self.plan, self.horizon, sorted({*POLICIES, *TRACE_POLICIES})
        _check("plan", plan, plan is None or _is_path(plan) or isinstance(plan, Plan),
               "a Plan, a plan file or None")  # fmt: skip
        _check("policy", self.policy, self.policy in names, f"one of {', '.join(names)}")
        check_slack(self.slack)
        _check("equal_batches", self.equal_batches, _is_bool(self.equal_batches, optional=True),
               "True, False or None")  # fmt: skip
        _check("horizon", h, h is None or (isinstance(h, int) and not isinstance(h, bool)
               and h >= 0), "a whole number of epochs >= 0 or None")  # fmt: skip
        w = self.window
        _check("window", w, w is None or (isinstance(w, int) and not isinstance(w, bool)
               and w >= 1), "a whole number of steps >= 1 or None")  # fmt: skip
        s = self.snapshots
        _check("snapshots", s, s is None or _is_path(s), "a directory or None")


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

    def __post_init__(self) -> None:
        _check("warm", self.warm, _is_bool(self.warm), "True or False")
        t = self.throttle
        _check("throttle", t, t is None or isinstance(t, Throttle), "a Throttle or None")


@dataclass(frozen=True, kw_only=True)
class LoaderConfig:
    """Everything a :class:`~solar.loader.Loader` is built from: its keywords and records.

    ``Loader(...)`` makes one of its arguments; ``Loader.from_config`` takes one made
    elsewhere. :func:`~solar.runtime.setup.configure` decides it. A record left out or None
    is its class's defaults; anything but the record is refused in one line.
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

    def __post_init__(self) -> None:
        for name, record in RECORDS.items():
            value = getattr(self, name)
            if value is None:  # the record's defaults, each owned by its field
                object.__setattr__(self, name, record())
            elif not isinstance(value, record):
                raise SolarError(f"{name} must be a {record.__name__}, e.g. {name}="
                                 f"{record.__name__}(...), got {value!r}")  # fmt: skip

    @staticmethod
    def refuse_moved(keywords: Iterable[str]) -> None:
        """Refuse a Loader keyword that moved into a record (:data:`MOVED`) in one line saying
        where it went; any other unknown keyword as Python does (a typo is not hidden)."""
        for name in keywords:
            if name not in MOVED:
                raise TypeError(f"Loader.__init__() got an unexpected keyword argument {name!r}")
            where = MOVED[name]
            raise SolarError(f"Loader({name}=...): moved to {where}="
                             f"{RECORDS[where].__name__}({name}=...)")  # fmt: skip


# LoaderConfig's records by keyword.
RECORDS: dict[str, type] = {"reader": ReaderConfig, "memory": MemoryConfig,
                            "planning": PlanningConfig, "expert": ExpertConfig}  # fmt: skip
# The keywords a Loader took before the records (issue 44), and the record each moved to.
MOVED = {"one_per_file": "reader"} | {
    f.name: name for name in ("memory", "planning", "expert") for f in fields(RECORDS[name])
}

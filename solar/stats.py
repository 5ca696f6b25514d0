"""What loading cost: one record per step, totals per epoch, and the pipeline's stages.

Records: :class:`StepStats` (one step of one rank, written by the pipeline from the stages'
own figures), :class:`EpochStats` (an epoch's totals), :class:`LoaderStats` (both, per Loader).
From the totals, the figures of each stage of the pipeline and which one limits it.

A Loader's pipeline has four stages, each with workers that are busy or idle:

* ``read``: storage (and tier) reads on the reader threads, decoding excluded; throttled
  storage's waits count as busy (a thread waiting for a remote file system is taken);
* ``decode``: decoding chunks, inside the read tasks, on at most one thread per core;
* ``transform``: per-sample transforms on their workers (solar/runtime/workers.py);
* ``trainer``: the consumer, one worker; it is busy when it is not waiting for a step.

As SPDL reports its stages (``TaskPerfStats``: busy time and items per task;
``QueuePerfStats``: occupancy and the time a consumer was blocked), each stage gets busy
seconds, items, the wall time, the worker-seconds it was offered (workers × wall, summed step
by step, since the tuner moves workers), its utilisation (busy / worker-seconds) and, where
meaningful, the queue occupancy after it and the time its consumer was blocked.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, NamedTuple


@dataclass(slots=True)  # not frozen: one is made per step, and frozen ones cost 3x more
class StepStats:
    """One step of one rank."""

    epoch: int
    step: int
    batch: int
    hits: int
    reads: int
    bytes_read: int
    read_seconds: float  # busy time of the reader threads
    stall_seconds: float  # time the trainer waited for late reads (and transforms)
    tier_hits: int = 0  # served from the second tier (not in ``hits`` or ``reads``)
    side_reads: int = 0  # page mates read to be stored, not served (in ``bytes_read``)
    tier_bytes: int = 0  # read from the tier
    tier_writes: int = 0  # samples written to the tier
    sent: int = 0  # equal batches: rows served here, delivered by another rank
    received: int = 0  # equal batches: rows another rank served, delivered here
    exchange_seconds: float = 0.0  # equal batches: moving them
    # Stage figures (below). ``read_seconds`` includes ``decode_seconds``: chunk
    # decoding runs inside the read tasks, timed apart there (solar/io/executor.py).
    decode_seconds: float = 0.0  # busy time of the threads decoding chunks
    wall_seconds: float = 0.0  # since the previous step was served: the trainer's period
    read_threads: int = 0  # reader threads when the step's reads were started
    decode_threads: int = 0  # of which may decode at once (one per core at most)
    read_ahead: int = 0  # read-ahead depth (steps) when the step was taken
    ready_ahead: int = 0  # of the steps queued then, those whose reads had all ended
    read_latency: float = 0.0  # the step's longest read job (its latency, had none queued)
    # Transforms (solar/runtime/transforms.py): the workers' busy time on this step's rows, rows
    # transformed, workers. (The trainer's wait for them is in ``stall_seconds``.)
    transform_seconds: float = 0.0
    transformed: int = 0
    transform_workers: int = 0


@dataclass(repr=False)
class EpochStats:
    """What one epoch cost this rank; ``print``-ed as one line (:meth:`__str__`)."""

    steps: int = 0
    samples: int = 0
    hits: int = 0  # from RAM
    reads: int = 0  # from storage
    side_reads: int = 0  # from storage, stored not served (page mates)
    bytes_read: int = 0  # from storage
    read_seconds: float = 0.0
    stall_seconds: float = 0.0
    rebuild_seconds: float = 0.0  # refilling the buffer after a resume or a jump
    tier_hits: int = 0
    tier_bytes: int = 0
    tier_writes: int = 0
    sent: int = 0
    received: int = 0
    exchange_seconds: float = 0.0
    decode_seconds: float = 0.0
    wall_seconds: float = 0.0
    # Worker-seconds offered (workers × wall, step by step: the tuner changes workers).
    read_thread_seconds: float = 0.0
    decode_thread_seconds: float = 0.0
    transform_worker_seconds: float = 0.0
    read_ahead: int = 0  # summed over steps (÷ steps: the mean depth)
    ready_ahead: int = 0  # summed over steps
    read_latency: float = 0.0
    transform_seconds: float = 0.0
    transformed: int = 0

    def add(self, s: StepStats) -> None:
        """Add step ``s``: its figures of the same name summed, and the worker-seconds it
        offered (workers × its wall time). (This signature only: the body is made below
        from the two tables, by ``_adder``.)"""

    @property
    def hit_rate(self) -> float:
        """Samples served from RAM or the tier, of those served (0 before any)."""
        return (self.hits + self.tier_hits) / self.samples if self.samples else 0.0

    def __str__(self) -> str:
        """One line: ``1024 samples in 32 steps, hit rate 48.2 %, read 0.152 GB (528 samples),
        4.20 s, stall 0.82 s`` (and the tier, a rebuild, rows exchanged when there are)."""
        rate = f"hit rate {100 * self.hit_rate:.1f} %"
        line = f"{self.samples} samples in {self.steps} steps, {rate}"
        if self.tier_hits:
            line += f" ({self.tier_hits} from the tier)"
        line += (
            f", read {self.bytes_read / 1e9:.3g} GB ({self.reads + self.side_reads} samples), "
            f"{self.wall_seconds:.2f} s, stall {self.stall_seconds:.2f} s"
        )
        if self.rebuild_seconds:
            line += f", rebuild {self.rebuild_seconds:.2f} s"
        if self.sent or self.received:
            line += f", rows sent {self.sent} received {self.received}"
        return line

    def __repr__(self) -> str:
        return f"<EpochStats: {self}>"

    def merge(self, other: EpochStats) -> EpochStats:
        """The sum of two epochs' totals (a new record)."""
        return EpochStats(
            **{f.name: getattr(self, f.name) + getattr(other, f.name)
               for f in dataclasses.fields(self)}
        )  # fmt: skip


# What an epoch sums of each step: the figures both records name alike, and worker-seconds
# offered (``EpochStats`` field, ``StepStats`` workers field). A new figure is one field in each.
_SUMMED = tuple(
    f.name for f in dataclasses.fields(EpochStats) if f.name in StepStats.__dataclass_fields__
)
_OFFERED = (
    ("read_thread_seconds", "read_threads"),
    ("decode_thread_seconds", "decode_threads"),
    ("transform_worker_seconds", "transform_workers"),
)


def _adder() -> Any:
    """``EpochStats.add`` as straight-line code made from the tables, as dataclasses makes
    ``__init__``: it runs once per step, and a loop of getattr/setattr costs 5x more (3.1
    against 0.6 µs here)."""
    lines = ["def add(self, s):", "    self.steps += 1", "    self.samples += s.batch"]
    lines += [f"    self.{n} += s.{n}" for n in _SUMMED]
    lines += [f"    self.{t} += s.{w} * s.wall_seconds" for t, w in _OFFERED]
    scope: dict[str, Any] = {}
    exec("\n".join(lines), scope)
    scope["add"].__doc__ = EpochStats.add.__doc__
    return scope["add"]


EpochStats.add = _adder()  # type: ignore[method-assign]


# The trainer limits the pipeline when it waits for less than this share of its time.
TRAINER_WAIT = 0.10


@dataclass(frozen=True)
class StageFigures:
    """One stage's figures over an epoch (or a run, or a tuner's window)."""

    name: str
    busy_seconds: float  # summed over the stage's workers
    items: int  # samples through the stage
    wall_seconds: float  # the time the figures cover
    worker_seconds: float  # workers × wall, summed step by step
    blocked_seconds: float | None = None  # trainer: waiting for its steps
    occupancy: float | None = None  # read: mean steps ready in the read-ahead queue / depth

    @property
    def workers(self) -> float:
        """Mean workers over the wall time."""
        return self.worker_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def items_per_second(self) -> float:
        """Items over the wall time (the stage's throughput, not its capacity)."""
        return self.items / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def utilisation(self) -> float:
        """busy / (workers × wall): 1 when every worker was busy all the time. (Capped at 1:
        reads started ahead, before the figures' first step, are busy time of that step.)"""
        if self.worker_seconds <= 0:
            return 0.0
        return min(1.0, self.busy_seconds / self.worker_seconds)

    @property
    def active(self) -> bool:
        """Whether the stage did anything (a run without transforms has no transform stage)."""
        return self.busy_seconds > 0 and self.worker_seconds > 0

    def as_dict(self) -> dict:
        """JSON-ready: the fields and the derived figures."""
        return {
            "workers": self.workers,
            "busy_seconds": self.busy_seconds,
            "items": self.items,
            "items_per_second": self.items_per_second,
            "wall_seconds": self.wall_seconds,
            "utilisation": self.utilisation,
            "occupancy": self.occupancy,
            "blocked_seconds": self.blocked_seconds,
        }


def stage_figures(t: EpochStats) -> dict[str, StageFigures]:
    """The four stages' figures from an epoch's (or a window's) totals."""
    wall = t.wall_seconds
    waited = t.stall_seconds  # for reads and transforms
    occupancy = t.ready_ahead / t.read_ahead if t.read_ahead else None
    return {
        "read": StageFigures(
            "read", max(0.0, t.read_seconds - t.decode_seconds),
            t.reads + t.side_reads + t.tier_hits, wall,
            t.read_thread_seconds, occupancy=occupancy,
        ),
        "decode": StageFigures(
            "decode", t.decode_seconds, t.reads if t.decode_seconds > 0 else 0, wall,
            t.decode_thread_seconds,
        ),
        "transform": StageFigures(
            "transform", t.transform_seconds, t.transformed, wall, t.transform_worker_seconds
        ),
        "trainer": StageFigures(
            "trainer", max(0.0, wall - waited), t.samples, wall, wall, blocked_seconds=waited
        ),
    }  # fmt: skip


class Bottleneck(NamedTuple):
    """The stage that limits the pipeline and the line that says so: ``str()`` is the line,
    and it unpacks as before, ``stage, line = stats.bottleneck()``."""

    stage: str  # "read", "decode", "transform", "trainer" or "none"
    line: str

    def __str__(self) -> str:
        return self.line


def bottleneck(stages: dict[str, StageFigures]) -> Bottleneck:
    """The stage that limits the pipeline, and a line saying by how much.

    Rule: the trainer limits when it rarely waits (less than ``TRAINER_WAIT``, 10 %, of its
    wall time: the loader keeps up, so only a faster training step would go faster).
    Otherwise the limit is the stage whose workers are busiest: the highest utilisation
    (busy / (workers × wall)) among read, decode and transform; a stage near 100 % is
    saturated, more of its workers (or faster ones) would raise throughput. E.g.
    ``bottleneck: read (97 % busy on 8 threads); decode 12 % on 2; trainer waited 61 % of
    4.2 s``. ``("none", ...)`` when no step was recorded. A :class:`Bottleneck`: a (stage,
    line) tuple whose ``str()`` is the line.
    """
    trainer = stages.get("trainer")
    if trainer is None or trainer.wall_seconds <= 0:
        return Bottleneck("none", "bottleneck: none (no steps recorded)")
    waited = (trainer.blocked_seconds or 0.0) / trainer.wall_seconds
    busy = [s for n, s in stages.items() if n != "trainer" and s.active]
    wall = trainer.wall_seconds
    wait_text = f"trainer waited {100 * waited:.0f} % of {wall:.{1 if wall >= 1 else 2}f} s"
    if waited < TRAINER_WAIT or not busy:
        name = "trainer"
        head = f"bottleneck: trainer ({wait_text.removeprefix('trainer ')})"
        rest = [_figure(s) for s in busy]
    else:
        top = max(busy, key=lambda s: s.utilisation)
        name = top.name
        head = f"bottleneck: {_figure(top, long=True)}"
        if name == "transform":  # other hosts' cores can take it (solar/remote)
            head += " (preprocessing workers would help: Transform(remote=Remote(...)))"
        rest = [_figure(s) for s in busy if s is not top] + [wait_text]
    return Bottleneck(name, "; ".join([head, *rest]))


def _figure(s: StageFigures, long: bool = False) -> str:
    unit = "thread" if s.name in ("read", "decode") else "worker"
    unit += "" if round(s.workers, 2) == 1 else "s"
    if long:
        return f"{s.name} ({100 * s.utilisation:.0f} % busy on {s.workers:.3g} {unit})"
    return f"{s.name} {100 * s.utilisation:.0f} % on {s.workers:.3g}"


@dataclass
class LoaderStats:
    """Per-epoch totals and per-step records (``steps``, also as JSON lines)."""

    epochs: dict[int, EpochStats] = field(default_factory=dict)
    steps: list[StepStats] = field(default_factory=list)
    # Set up before epoch 0 (solar/warm.py): compiling (or loading) kernels, in all; of which
    # numba compiling ``compiled`` kernels (0 once numba's cache holds them).
    warm_seconds: float = 0.0
    compile_seconds: float = 0.0
    compiled: int = 0
    # threads="auto": where the tuner left each knob (name -> value), and its moves.
    tuned: dict[str, int] = field(default_factory=dict)
    tuning: list[dict] = field(default_factory=list)
    share: str = "rank"  # "node": the host's ranks share one buffer (Loader.share)
    # MemoryConfig(pack=...): the packer's figures (solar.runtime.packing.PackFigures: the
    # windows decided, bytes scanned and written, the most disk held), else None. Packed
    # reads are in the epochs' bytes_read; the passes' scans and writes are here.
    packing: Any = None
    # Transform(remote=...): each preprocessing worker's figures by its number
    # (solar.runtime.remote.WorkerFigures: steps and rows delivered and used, bytes, steps
    # transformed here because late, refused deliveries, whether it was lost), else None.
    remote: Any = None

    def epoch(self, e: int) -> EpochStats:
        """Epoch ``e``'s totals (made empty if it has none yet)."""
        got = self.epochs.get(e)
        if got is None:
            got = self.epochs[e] = EpochStats()
        return got

    def record(self, s: StepStats) -> None:
        """Add step ``s`` to its epoch's totals and to ``steps``."""
        self.epoch(s.epoch).add(s)
        self.steps.append(s)

    def totals(self, epoch: int | None = None) -> EpochStats:
        """One epoch's totals, or (None) all epochs' together."""
        if epoch is not None:
            return self.epochs.get(epoch, EpochStats())
        out = EpochStats()
        for e in self.epochs.values():
            out = out.merge(e)
        return out

    def stages(self, epoch: int | None = None) -> dict[str, StageFigures]:
        """Figures of each pipeline stage (read, decode, transform, trainer) over one epoch
        or (None) all of them: :func:`stage_figures`."""
        return stage_figures(self.totals(epoch))

    def bottleneck(self, epoch: int | None = None) -> Bottleneck:
        """The stage that limits and a line saying by how much, as a :class:`Bottleneck`:
        ``print(stats.bottleneck(epoch))`` prints the line, ``.stage`` names the stage (and
        ``stage, line = ...`` unpacks it): :func:`bottleneck`."""
        return bottleneck(self.stages(epoch))

    def json_lines(self) -> str:
        """Every step's figures (:class:`StepStats`), one JSON object a line."""
        return "".join(json.dumps(dataclasses.asdict(s)) + "\n" for s in self.steps)

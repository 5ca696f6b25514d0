"""What loading cost: one record per step, totals per epoch."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from solar.stages import StageFigures, bottleneck, stage_figures


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
    # Stage figures (solar/stages.py). ``read_seconds`` includes ``decode_seconds``: chunk
    # decoding runs inside the read tasks, timed apart there (solar/io/executor.py).
    decode_seconds: float = 0.0  # busy time of the threads decoding chunks
    wall_seconds: float = 0.0  # since the previous step was served: the trainer's period
    read_threads: int = 0  # reader threads when the step's reads were started
    decode_threads: int = 0  # of which may decode at once (one per core at most)
    read_ahead: int = 0  # read-ahead depth (steps) when the step was taken
    ready_ahead: int = 0  # of the steps queued then, those whose reads had all ended
    read_latency: float = 0.0  # the step's longest read job (its latency, had none queued)
    # Transforms (solar/transform.py): the workers' busy time on this step's rows, rows
    # transformed, workers. (The trainer's wait for them is in ``stall_seconds``.)
    transform_seconds: float = 0.0
    transformed: int = 0
    transform_workers: int = 0


@dataclass
class EpochStats:
    """What one epoch cost this rank."""

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
        self.steps += 1
        self.samples += s.batch
        self.hits += s.hits
        self.reads += s.reads
        self.side_reads += s.side_reads
        self.bytes_read += s.bytes_read
        self.read_seconds += s.read_seconds
        self.stall_seconds += s.stall_seconds
        self.tier_hits += s.tier_hits
        self.tier_bytes += s.tier_bytes
        self.tier_writes += s.tier_writes
        self.sent += s.sent
        self.received += s.received
        self.exchange_seconds += s.exchange_seconds
        self.decode_seconds += s.decode_seconds
        self.wall_seconds += s.wall_seconds
        self.read_thread_seconds += s.read_threads * s.wall_seconds
        self.decode_thread_seconds += s.decode_threads * s.wall_seconds
        self.transform_worker_seconds += s.transform_workers * s.wall_seconds
        self.read_ahead += s.read_ahead
        self.ready_ahead += s.ready_ahead
        self.read_latency += s.read_latency
        self.transform_seconds += s.transform_seconds
        self.transformed += s.transformed

    def merge(self, other: EpochStats) -> EpochStats:
        """The sum of two epochs' totals (a new record)."""
        return EpochStats(
            **{f.name: getattr(self, f.name) + getattr(other, f.name)
               for f in dataclasses.fields(self)}
        )  # fmt: skip


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

    def epoch(self, e: int) -> EpochStats:
        got = self.epochs.get(e)
        if got is None:
            got = self.epochs[e] = EpochStats()
        return got

    def record(self, s: StepStats) -> None:
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
        or (None) all of them: :func:`solar.stages.stage_figures`."""
        return stage_figures(self.totals(epoch))

    def bottleneck(self, epoch: int | None = None) -> tuple[str, str]:
        """The stage that limits (its name) and a line saying by how much:
        :func:`solar.stages.bottleneck`."""
        return bottleneck(self.stages(epoch))

    def json_lines(self) -> str:
        return "".join(json.dumps(dataclasses.asdict(s)) + "\n" for s in self.steps)

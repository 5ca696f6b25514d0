"""What loading cost: one record per step, totals per epoch."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field


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
    stall_seconds: float  # time the trainer waited for late reads
    tier_hits: int = 0  # served from the second tier (not in ``hits`` or ``reads``)
    tier_bytes: int = 0  # read from the tier
    tier_writes: int = 0  # samples written to the tier
    sent: int = 0  # equal batches: rows served here, delivered by another rank
    received: int = 0  # equal batches: rows another rank served, delivered here
    exchange_seconds: float = 0.0  # equal batches: moving them
    transform_seconds: float = 0.0  # busy time of the transform workers on this step's rows
    transformed: int = 0  # rows transformed
    transform_workers: int = 0


@dataclass
class EpochStats:
    """What one epoch cost this rank."""

    steps: int = 0
    samples: int = 0
    hits: int = 0  # from RAM
    reads: int = 0  # from storage
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
    transform_seconds: float = 0.0
    transformed: int = 0

    def add(self, s: StepStats) -> None:
        self.steps += 1
        self.samples += s.batch
        self.hits += s.hits
        self.reads += s.reads
        self.bytes_read += s.bytes_read
        self.read_seconds += s.read_seconds
        self.stall_seconds += s.stall_seconds
        self.tier_hits += s.tier_hits
        self.tier_bytes += s.tier_bytes
        self.tier_writes += s.tier_writes
        self.sent += s.sent
        self.received += s.received
        self.exchange_seconds += s.exchange_seconds
        self.transform_seconds += s.transform_seconds
        self.transformed += s.transformed


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

    def epoch(self, e: int) -> EpochStats:
        got = self.epochs.get(e)
        if got is None:
            got = self.epochs[e] = EpochStats()
        return got

    def record(self, s: StepStats) -> None:
        self.epoch(s.epoch).add(s)
        self.steps.append(s)

    def json_lines(self) -> str:
        return "".join(json.dumps(dataclasses.asdict(s)) + "\n" for s in self.steps)

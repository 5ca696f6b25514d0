"""Per-stage figures of the loading pipeline, and which stage limits it.

A Loader's pipeline has four stages, each with workers that are busy or idle:

* ``read``: storage (and tier) reads on the reader threads, decoding excluded; throttled
  storage's waits count as busy (a thread waiting for a remote file system is taken);
* ``decode``: decoding chunks, inside the read tasks, on at most one thread per core;
* ``transform``: per-sample transforms on their workers (solar/transform.py);
* ``trainer``: the consumer, one worker; it is busy when it is not waiting for a step.

As SPDL reports its stages (``TaskPerfStats``: busy time and items per task;
``QueuePerfStats``: occupancy and the time a consumer was blocked), each stage gets busy
seconds, items, the wall time, the worker-seconds it was offered (workers × wall, summed step
by step, since the tuner moves workers), its utilisation (busy / worker-seconds) and, where
meaningful, the queue occupancy after it and the time its consumer was blocked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from solar.stats import EpochStats

STAGES = ("read", "decode", "transform", "trainer")
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


def bottleneck(stages: dict[str, StageFigures]) -> tuple[str, str]:
    """The stage that limits the pipeline, and a line saying by how much.

    Rule: the trainer limits when it rarely waits (less than ``TRAINER_WAIT``, 10 %, of its
    wall time: the loader keeps up, so only a faster training step would go faster).
    Otherwise the limit is the stage whose workers are busiest: the highest utilisation
    (busy / (workers × wall)) among read, decode and transform; a stage near 100 % is
    saturated, more of its workers (or faster ones) would raise throughput. E.g.
    ``bottleneck: read (97 % busy on 8 threads); decode 12 % on 2; trainer waited 61 % of
    4.2 s``. ``("none", ...)`` when no step was recorded.
    """
    trainer = stages.get("trainer")
    if trainer is None or trainer.wall_seconds <= 0:
        return "none", "bottleneck: none (no steps recorded)"
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
        rest = [_figure(s) for s in busy if s is not top] + [wait_text]
    return name, "; ".join([head, *rest])


def _figure(s: StageFigures, long: bool = False) -> str:
    unit = "thread" if s.name in ("read", "decode") else "worker"
    unit += "" if round(s.workers, 2) == 1 else "s"
    if long:
        return f"{s.name} ({100 * s.utilisation:.0f} % busy on {s.workers:.3g} {unit})"
    return f"{s.name} {100 * s.utilisation:.0f} % on {s.workers:.3g}"

"""Parallelism that tunes itself: ``ReaderConfig(threads="auto")``.

The Loader hands its :class:`Tuner` every step's :class:`~solar.stats.StepStats`; the tuner
sums them into windows and, at the end of each, asks the pure :func:`rule` what to change,
then turns *knobs*: named integer settings of a stage (the reader threads, the decoding
threads; the transform workers, registered by the transform stage) with a getter, a setter
and bounds. The read-ahead depth is not searched but computed from the measured rates
(:func:`little_depth`).

The rule is tf.data's ``STAGE_BASED`` autotuning, as a hill climb with take-backs:

1. Every window (at least :data:`WINDOW_STEPS` steps and :data:`WINDOW_SECONDS` seconds,
   the steps just after a change left out, :data:`SETTLE_STEPS`) the stage figures of the
   window are computed (solar/stats.py).
2. A change made at the end of the previous window is a *trial*: kept if the window's
   throughput (samples/s) rose by at least :data:`MARGIN` over the window before it, else
   taken back, and that stage is not raised again for :data:`HOLD_WINDOWS` windows (twice
   as long after each take-back in a row, up to :data:`MAX_DOUBLINGS` doublings).
3. Otherwise, unless the trainer is the limit (it waited less than
   :data:`~solar.stats.TRAINER_WAIT` of the window: more workers cannot help), the stage
   that limits (the highest utilisation, as :func:`~solar.stats.bottleneck` names it) gets
   more workers through its knob: +1 for a CPU-bound knob, twice as many for I/O
   concurrency (reader threads spend their time waiting on storage and their useful range
   spans 1 to 64: one more at a time would take dozens of windows; an overshoot that does
   not pay is taken back like any trial), within the knob's bounds and, for CPU-bound
   knobs, within the CPU budget (the sum of the CPU-bound knobs' values at most
   ``budget``, by default the cores this process may use). A CPU-bound stage at the
   budget may take a worker from another CPU-bound stage busy less than
   :data:`DONOR_BUSY` of its time (InTune's division of a trainer's cores among stages, by
   the same trial and take-back).
4. If nothing was raised, an I/O stage busy less than :data:`IDLE` of its threads' time has
   them halved (not below its bound): a trial kept unless throughput fell by more than
   :data:`MARGIN` from the best since the cuts began (so cuts cannot creep down), else
   taken back and that stage's cuts held for :data:`HOLD_WINDOWS` windows. Idle reader
   threads are not free: a step's reads are split into one task per thread, and on a
   decode-bound pipeline fewer, larger tasks decode faster (bench/tune_bench.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from solar._cpu import cores
from solar.io.executor import Executor
from solar.stats import TRAINER_WAIT, EpochStats, LoaderStats, StepStats, stage_figures

WINDOW_STEPS = 8  # steps in a window, at least
# And seconds: shorter windows measure scheduling noise; longer ones make the search slow
# (bench/tune_bench.py: 4 windows from 8 threads to 32 and back from 64).
WINDOW_SECONDS = 0.1
SETTLE_STEPS = 2  # steps after a change not measured (their reads began under the old setting)
MARGIN = 0.05  # a trial is kept if throughput rose by at least 5 %
HOLD_WINDOWS = 10  # a stage whose trial was taken back is not raised for 10 windows
MAX_DOUBLINGS = 5  # ... twice as long after each take-back in a row, up to 320 windows
DONOR_BUSY = 0.5  # a CPU-bound stage busy less than this may give a worker to the limit
IDLE = 0.25  # an I/O stage busy less than this has its threads halved, if that costs nothing
MAX_READ_THREADS = 64  # reader threads are I/O concurrency: beyond the cores, but bounded
READ_AHEAD_BYTES = 512 << 20  # batch memory the read-ahead queue may hold (Little's law cap)
MAX_READ_AHEAD = 64  # steps


@dataclass(frozen=True)
class Knob:
    """A stage's setting the tuner may turn: ``get()`` its value, ``set(n)`` a new one in
    ``[lo, hi]``; ``cpu``: its workers compute (count against the CPU budget), rather than
    wait on storage."""

    name: str
    stage: str  # "read", "decode", "transform": the stage its workers serve
    get: Callable[[], int]
    set: Callable[[int], None]
    lo: int = 1
    hi: int = 64
    cpu: bool = True


def reader_knobs(executor: Executor, budget: int) -> list[Knob]:
    """The reader's knobs: its threads (I/O concurrency, up to :data:`MAX_READ_THREADS`) and
    its decoding threads (CPU-bound, up to ``budget``), resized with reads in flight."""
    ex = executor
    # Decoding threads follow the reader threads (one per core at most) until set: set them
    # now, so that each knob moves one stage only.
    ex.resize(decode_threads=ex.decode_threads)
    return [
        Knob("read_threads", "read", lambda: ex.threads, lambda n: ex.resize(threads=n),
             1, MAX_READ_THREADS, cpu=False),
        Knob("decode_threads", "decode", lambda: ex.decode_threads,
             lambda n: ex.resize(decode_threads=n), 1, budget),
    ]  # fmt: skip


@dataclass(frozen=True)
class Window:
    """What the rule sees of one window: throughput, each stage's utilisation (stages with
    no activity left out), and the share of its time the trainer waited."""

    rate: float  # samples per second
    utilisation: dict[str, float]
    waited: float

    @classmethod
    def of(cls, totals: EpochStats) -> Window:
        stages = stage_figures(totals)
        trainer = stages.pop("trainer")
        wall = trainer.wall_seconds
        return cls(
            totals.samples / wall if wall > 0 else 0.0,
            {n: s.utilisation for n, s in stages.items() if s.active},
            (trainer.blocked_seconds or 0.0) / wall if wall > 0 else 0.0,
        )


@dataclass(frozen=True)
class TuneState:
    """The rule's memory between windows."""

    window: int = 0  # windows seen
    trial: tuple[tuple[str, int], ...] = ()  # a change under trial: (knob, value before)
    baseline: float = 0.0  # throughput before the trial (the best since cuts began)
    down: bool = False  # the trial cuts workers
    held: tuple[tuple[str, int], ...] = ()  # (stage, first window it may be raised again)
    strikes: tuple[tuple[str, int], ...] = ()  # (stage, trials taken back in a row)

    def held_until(self, stage: str) -> int:
        return max((w for s, w in self.held if s == stage), default=0)


def rule(
    state: TuneState,
    window: Window,
    knobs: Sequence[Knob],
    values: dict[str, int],
    budget: int,
) -> tuple[TuneState, dict[str, int]]:
    """One window's decision (see the module's docstring): the new state, and the knobs to
    change (name -> new value; empty: none). Pure: ``knobs`` are read for their names,
    stages, bounds and kinds only; ``values`` are their current values."""
    w = state.window + 1
    state = replace(state, window=w, held=tuple((s, u) for s, u in state.held if u > w))
    if state.trial:
        # A raise must pay by the margin; a cut must not cost more than it.
        need = state.baseline * (1 - MARGIN if state.down else 1 + MARGIN)
        by_name = {k.name: k for k in knobs}
        first = by_name.get(state.trial[0][0])
        way = None if first is None else _way(first.stage, state.down)
        strikes = dict(state.strikes)
        if window.rate >= need:  # kept: the next move is tried below
            best = max(state.baseline, window.rate) if state.down else window.rate
            if way is not None:
                strikes.pop(way, None)
            state = replace(state, trial=(), baseline=best, strikes=tuple(strikes.items()))
        else:  # taken back; the stage moved (the trial's first knob) is held that way
            held = state.held
            if way is not None:
                # Held twice as long after each take-back in a row: a stage settled at its
                # best is probed ever more rarely, so probing costs ever less throughput.
                strikes[way] = strikes.get(way, 0) + 1
                hold = HOLD_WINDOWS << min(strikes[way] - 1, MAX_DOUBLINGS)
                held = (*held, (way, w + hold))
            undo = dict(state.trial)
            return replace(state, trial=(), held=held, strikes=tuple(strikes.items())), undo
    else:
        state = replace(state, baseline=window.rate)
    changes = {} if window.waited < TRAINER_WAIT else _raise(state, window, knobs, values, budget)
    down = False
    if not changes:
        changes, down = _cut(state, window, knobs, values), True
    if not changes:
        return state, {}
    trial = tuple((n, values[n]) for n in changes)
    return replace(state, trial=trial, down=down), changes


def _way(stage: str, down: bool) -> str:
    """The key a stage is held by: raising it, or cutting it."""
    return f"{stage}:down" if down else stage


def _raise(
    state: TuneState, window: Window, knobs: Sequence[Knob], values: dict[str, int], budget: int
) -> dict[str, int]:
    """More workers for the limiting stage (step 3), if it may have them."""
    if not window.utilisation:
        return {}
    limit = max(window.utilisation, key=lambda s: window.utilisation[s])
    if state.held_until(limit) > state.window:
        return {}
    cpu_used = sum(values[k.name] for k in knobs if k.cpu)
    for k in knobs:
        if k.stage != limit or values[k.name] >= k.hi:
            continue
        v = values[k.name]
        up = min(k.hi, v + 1 if k.cpu else 2 * v)
        if not k.cpu or cpu_used + (up - v) <= budget:
            return {k.name: up}
        donor = _donor(k, knobs, values, window)
        if donor is not None:
            return {k.name: v + 1, donor.name: values[donor.name] - 1}
    return {}


def _cut(
    state: TuneState, window: Window, knobs: Sequence[Knob], values: dict[str, int]
) -> dict[str, int]:
    """Half the threads of an I/O stage that is mostly idle (step 4)."""
    for k in knobs:
        v = values[k.name]
        busy = window.utilisation.get(k.stage, 0.0)
        held = state.held_until(_way(k.stage, True)) > state.window
        if not k.cpu and v > k.lo and busy < IDLE and not held:
            return {k.name: max(k.lo, v // 2)}
    return {}


def _donor(k: Knob, knobs: Sequence[Knob], values: dict[str, int], window: Window) -> Knob | None:
    """A CPU-bound knob of another stage, idle enough to give ``k`` one of its workers."""
    for d in knobs:
        busy = window.utilisation.get(d.stage, 0.0)
        if d.cpu and d.stage != k.stage and values[d.name] > d.lo and busy < DONOR_BUSY:
            return d
    return None


def little_depth(latency: float, period: float, lo: int, hi: int) -> int:
    """Steps to read ahead by Little's law: steps in flight = arrival rate × time in the
    system = (one step per ``period``, the time between steps consumed) × ``latency`` (a
    step's read latency), + 1 so that a step is ready as the consumer arrives; within
    ``[lo, hi]`` (``lo`` is the configured depth: the law only deepens the queue, for slow
    storage and fast consumers; ``hi`` caps its memory)."""
    if period <= 0 or not math.isfinite(latency):
        return lo
    # (rounded first: 0.1 / 0.01 is 10.000000000000002, not a reason for an 11th step)
    return max(lo, min(hi, math.ceil(round(latency / period, 6)) + 1))


@dataclass
class Tuner:
    """Consulted once per step (:meth:`observe`) by the Loader; turns its knobs by
    :func:`rule` and sets the read-ahead depth by :func:`little_depth`.

    Register a stage's knob with :meth:`register` (the transform stage registers its
    workers: ``Knob("transform_workers", "transform", get, set, 1, budget, cpu=True)``);
    where the knobs stand is in ``stats.tuned``, every change in ``stats.tuning``.
    """

    stats: LoaderStats | None = None
    budget: int = field(default_factory=cores)
    knobs: list[Knob] = field(default_factory=list)
    state: TuneState = field(default_factory=TuneState)
    depth: tuple[Callable[[int], None], int, int] | None = None  # (set, lo, hi)
    _totals: EpochStats = field(default_factory=EpochStats)
    _latency: tuple[float, int] = (0.0, 0)  # read latency summed, over steps with reads
    _skip: int = 0
    _depth_now: int = 0

    def register(self, knob: Knob) -> None:
        """Let the rule turn ``knob`` (replaces a knob of the same name)."""
        self.knobs = [k for k in self.knobs if k.name != knob.name] + [knob]
        self._report()

    def read_ahead(self, set_depth: Callable[[int], None], lo: int, hi: int) -> None:
        """Set the read-ahead depth through ``set_depth`` within ``[lo, hi]``, each window."""
        self.depth = (set_depth, lo, max(lo, hi))
        self._depth_now = lo
        self._report()

    @property
    def tuned(self) -> dict[str, int]:
        """Every knob's value now (and the read-ahead depth)."""
        out = {k.name: k.get() for k in self.knobs}
        if self.depth is not None:
            out["read_ahead"] = self._depth_now
        return out

    def observe(self, s: StepStats) -> dict[str, int]:
        """Take one step's figures; at a window's end, decide and apply: the changes made."""
        if self._skip:
            self._skip -= 1
            return {}
        self._totals.add(s)
        if s.reads:
            lat, n = self._latency
            self._latency = (lat + s.read_latency, n + 1)
        t = self._totals
        if t.steps < WINDOW_STEPS or t.wall_seconds < WINDOW_SECONDS:
            return {}
        window = Window.of(t)
        values = {k.name: k.get() for k in self.knobs}
        self.state, changes = rule(self.state, window, self.knobs, values, self.budget)
        by_name = {k.name: k for k in self.knobs}
        for name, value in changes.items():
            by_name[name].set(value)
        if self.depth is not None:
            set_depth, lo, hi = self.depth
            lat, n = self._latency
            depth = little_depth(lat / n if n else 0.0, t.wall_seconds / t.steps, lo, hi)
            if depth != self._depth_now:
                set_depth(depth)
                self._depth_now = depth
                changes = {**changes, "read_ahead": depth}
        if changes:
            self._skip = SETTLE_STEPS
            if self.stats is not None:
                self.stats.tuning.append(
                    {"step": s.step, "rate": window.rate, "utilisation": window.utilisation,
                     "waited": window.waited, "set": changes}
                )  # fmt: skip
        self._report()
        self._totals, self._latency = EpochStats(), (0.0, 0)
        return changes

    def _report(self) -> None:
        if self.stats is not None:
            self.stats.tuned = self.tuned

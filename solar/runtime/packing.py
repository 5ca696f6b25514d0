"""The misses stage: where a step's storage reads come from, as the planner decided.

:class:`RandomMisses` reads them from the source (random pages: the reader's tasks). A
:class:`Packer` obeys the windows the planning thread decided for each epoch as it planned it
(:meth:`solar.schedule.plans.stream.RankStream.windows`, by
:func:`solar.schedule.plans.packing.plan_windows`; of this rank's own storage reads, whichever
buffer it plans: a host's ranks each pack the misses the host plan gives them): it builds each
packed window ahead (a sequential scan of the source in chunks, each chunk's rows written to
every step's region: solar/cache/packed.py) while earlier steps are served, and reads a packed
step's region in one contiguous run; windows the planner kept random are read as
:class:`RandomMisses` reads them. Every byte moves through the rank's one executor. Its disk
never exceeds ``disk_bytes``: a window is built once the windows before it that are done with
have freed theirs.

Which to build is decided once, at construction (``setup.configure``): a Loader without a
disk budget for packing, or where packing can pay on no rank's device, has a
:class:`RandomMisses`, and nothing here runs.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from solar._memory import aligned
from solar._units import format_bytes
from solar.cache.packed import PackedFile
from solar.errors import SolarError
from solar.io.executor import JobResult, when_all
from solar.io.reader import Reader
from solar.schedule.plans.packing import EpochWindows, PackModel, RowsAt, Window

IN_FLIGHT = 2  # source chunks read or written at once while packing (staging memory)


class Misses(Protocol):
    """Starts step ``k``'s storage reads ``samples`` into ``out[key][rows]``."""

    def submit(self, k: int, samples: np.ndarray, out: list[np.ndarray],
               rows: np.ndarray) -> list[Future]: ...  # fmt: skip

    def close(self) -> None: ...


class RandomMisses:
    """Today's path: the reader's tasks read the rows from the source."""

    def __init__(self, reader: Reader) -> None:
        self.reader = reader

    def submit(self, k: int, samples: np.ndarray, out: list[np.ndarray],
               rows: np.ndarray) -> list[Future]:  # fmt: skip
        return self.reader.submit(samples, out, rows)

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class PackSetup:
    """Packing as decided at construction: where, how much disk, and the model the planner
    decides the windows by (a window's most: half the disk, two live at once: one read, the
    next built)."""

    directory: str | os.PathLike
    disk_bytes: int
    model: PackModel
    name: str

    @property
    def at(self) -> RowsAt:
        """Where the source's rows are."""
        return self.model.at


@dataclass
class PackFigures:
    """What packing did: the windows decided (in step order), bytes scanned from the source
    and written to the packed layouts, the most disk held at once, seconds building."""

    windows: list[Window] = field(default_factory=list)
    scan_bytes: int = 0
    written_bytes: int = 0
    disk_peak: int = 0
    build_seconds: float = 0.0
    built: int = 0

    def as_dict(self) -> dict:
        return {"windows": [w.as_dict() for w in self.windows], "scan_bytes": self.scan_bytes,
                "written_bytes": self.written_bytes, "disk_peak_bytes": self.disk_peak,
                "build_seconds": self.build_seconds, "windows_built": self.built}  # fmt: skip

    def describe(self) -> str:
        packed = sum(w.packed for w in self.windows)
        return (f"{packed} of {len(self.windows)} windows packed, "
                f"{format_bytes(self.scan_bytes)} scanned, {format_bytes(self.written_bytes)} "
                f"written, disk at most {format_bytes(self.disk_peak)}")  # fmt: skip


class StepMisses(Protocol):
    """What the packer asks of the steps (solar/runtime/steps.py's :class:`Steps`)."""

    spe: int

    @property
    def last_planned(self) -> int: ...

    def windows(self, epoch: int) -> EpochWindows | None: ...


class _Built:
    """One packed window: its file, its build under way, the reads of it started."""

    def __init__(self, window: Window, file: PackedFile, build: Future) -> None:
        self.window, self.file, self.build = window, file, build
        self.reads: list[Future] = []


class Packer:
    """The misses of the steps, from packed windows where the model chose them (see module)."""

    def __init__(self, steps: StepMisses, reader: Reader, setup: PackSetup) -> None:
        self.steps = steps
        self.reader = reader
        self.setup = setup
        self.figures = PackFigures()
        self._random = RandomMisses(reader)
        self._windows: collections.deque[Window] = collections.deque()  # taken, not done
        self._taken = -1  # epochs before this are taken from the planner (-1: none yet)
        self._built: dict[int, _Built] = {}  # by window's first step
        self._reads: dict[int, list[np.ndarray]] = {}  # packed windows' sorted reads, unbuilt
        self._disk = 0
        self._last = -1
        self._lock = threading.Lock()
        self._stop = threading.Event()  # closing: a pass ends at its next chunk
        self._warned = False
        # One thread drives the passes (their reads and writes are the executor's tasks).
        self._builder = ThreadPoolExecutor(1, thread_name_prefix="solar-pack")

    def submit(self, k: int, samples: np.ndarray, out: list[np.ndarray],
               rows: np.ndarray) -> list[Future]:  # fmt: skip
        """Step ``k``'s reads, from its packed window if it is in one, else the source's."""
        self._advance(k)
        w = self._window_of(k)
        if w is None or not w.packed or samples.size == 0:
            return self._random.submit(k, samples, out, rows)
        b = self._built.get(w.first) or self._build_now(w)
        if b is None:  # its packed file could not be made: read at random
            return self._random.submit(k, samples, out, rows)
        dest = out[0].reshape(out[0].shape[0], -1).view(np.uint8)
        tasks = b.file.read_tasks(k, samples, dest, rows, self.reader.executor.threads)
        ex, file = self.reader.executor, b.file
        if b.build.done():
            b.build.result()  # a failed pass fails the steps it packed
            futures = ex.start(file, tasks)
        else:  # started once it is built (no reader thread waits for a pass)
            futures = [_then(b.build, lambda: ex.start(file, tasks))]
        b.reads += futures
        return futures

    def close(self) -> None:
        """Stop the passes under way (at their next chunk); free every packed file."""
        self._stop.set()
        self._reset()
        self._builder.shutdown(wait=True)

    # -- windows -------------------------------------------------------------------------------
    def _advance(self, k: int) -> None:
        """Take the planner's windows of the epochs planned since (from ``k`` on), free those
        done with, start the builds the disk allows."""
        if k < self._last:  # served again from an earlier step: start over from k
            self._reset()
        self._last = k
        spe = self.steps.spe
        # The first step's epoch, or one past every epoch taken (a resume further on).
        self._taken = max(self._taken, k // spe)
        while self._taken * spe <= self.steps.last_planned:
            got = self.steps.windows(self._taken)
            self._taken += 1
            if got is None:  # (no epoch served or read ahead is dropped: never)
                continue
            new = [w for w in got.windows if w.end > k]
            self.figures.windows += new
            self._windows.extend(new)
            for w in new:  # a packed window's reads, kept until it is built
                if w.packed:
                    self._reads[w.first] = got.reads[w.first]
        while self._windows and self._windows[0].end <= k:
            self._windows.popleft()  # its steps all started: its file goes once they are read
        self._release_done(k)
        for w in list(self._windows):  # (a window whose file cannot be made turns random)
            if not w.packed or w.first in self._built:
                continue
            if self._disk + w.nbytes > self.setup.disk_bytes:
                break  # in order: a later window waits for this one
            self._start_build(w)

    def _build_now(self, w: Window) -> _Built | None:
        """Window ``w``, due now and not built: the disk of windows whose reads are still in
        flight (a short window before it, read ahead) is freed once they end."""
        while self._disk + w.nbytes > self.setup.disk_bytes:
            b = next((b for b in self._built.values() if b.window.first < w.first), None)
            if b is None:  # (windows are built in order, each at most half the disk)
                raise SolarError(f"pack: steps {w.first}..{w.end - 1}: "
                                 f"{format_bytes(w.nbytes)} do not fit the disk left")  # fmt: skip
            wait([b.build, *b.reads])
            self._free(b)
        return self._start_build(w)

    def _window_of(self, k: int) -> Window | None:
        for w in self._windows:
            if w.first <= k < w.end:
                return w
        return None

    def _release_done(self, k: int) -> None:
        """Free the packed windows wholly before ``k`` whose reads have all ended."""
        for b in list(self._built.values()):
            if b.window.end <= k and b.build.done() and all(f.done() for f in b.reads):
                self._free(b)

    def _free(self, b: _Built) -> None:
        if self._built.pop(b.window.first, None) is not None:
            b.file.close()
            self._disk -= b.window.nbytes

    def _reset(self) -> None:
        for b in list(self._built.values()):
            wait([b.build])
            wait(b.reads)
            self._free(b)
        self._windows.clear()
        self._reads.clear()
        self._taken = -1

    # -- building ------------------------------------------------------------------------------
    def _start_build(self, w: Window) -> _Built | None:
        """Window ``w``'s packed file made and its pass started; None, the window read at
        random instead (warned once), where the file cannot be made (no space, no
        descriptor left): training goes on."""
        steps = np.arange(w.first, w.end, dtype=np.int64)
        at = self.setup.at
        try:
            file = PackedFile(self.setup.directory, steps, self._reads[w.first], at.row_bytes,
                              at.chunk_rows, self.setup.name)  # fmt: skip
        except SolarError as exc:
            self._unpack(w, exc)
            return None
        del self._reads[w.first]  # (kept until made: a later try finds them)
        self._disk += w.nbytes
        self.figures.disk_peak = max(self.figures.disk_peak, self._disk)
        b = self._built[w.first] = _Built(w, file, self._builder.submit(self._build, file))
        return b

    def _unpack(self, w: Window, exc: SolarError) -> None:
        """Window ``w`` read at random from now on (its packed file could not be made)."""
        if not self._warned:
            self._warned = True
            warnings.warn(f"{exc}: steps {w.first}..{w.end - 1} (and any other window whose "
                          "packed file cannot be made) read at random", stacklevel=4)  # fmt: skip
        random = dataclasses.replace(w, packed=False)
        self._windows = collections.deque(random if x is w else x for x in self._windows)
        self.figures.windows = [random if x is w else x for x in self.figures.windows]
        self._reads.pop(w.first, None)

    def _build(self, file: PackedFile) -> None:
        """One sequential pass: the source chunks holding the window's rows read in order
        (``IN_FLIGHT`` at a time), each chunk's pieces of every step's region assembled and
        written; then the file sealed (synced, its identity pinned)."""
        t0 = time.perf_counter()
        at, ex = self.setup.at, self.reader.executor
        key = self.reader.info.keys[0]
        chunks = file.chunks
        most = max(file.chunk_bytes(int(c)) for c in chunks)
        staging = [np.empty((at.chunk_rows, *key.sample_shape), key.native_dtype)
                   for _ in range(IN_FLIGHT)]  # fmt: skip
        outs = [aligned(most) for _ in range(IN_FLIGHT)]
        n = len(chunks)
        reading: list[Future] = []
        writing: collections.deque[list[Future]] = collections.deque()
        scanned = written = 0

        def scan(i: int) -> list[Future]:  # chunk i read into its staging rows
            first = int(chunks[i]) * at.chunk_rows
            ids = np.arange(first, min(at.rows, first + at.chunk_rows), dtype=np.int64)
            return self.reader.submit(ids, [staging[i % IN_FLIGHT]],
                                      np.arange(ids.size, dtype=np.int64))  # fmt: skip

        try:
            reading = scan(0)
            for i in range(n):
                if self._stop.is_set():  # closing: no pass outlives its loader for long
                    raise SolarError(f"packed layout {file.path}: closed while built")
                now = reading
                # The next chunk is read while this one is assembled (its staging rows were
                # assembled from, synchronously, at chunk i - 1).
                reading = scan(i + 1) if i + 1 < n else []
                scanned += sum(f.result()[0] for f in now)
                if len(writing) == IN_FLIGHT:  # chunk i - 2's write, from outs[i % 2]
                    written += sum(f.result()[0] for f in writing.popleft())
                buf = staging[i % IN_FLIGHT]
                rows = buf.reshape(buf.shape[0], -1).view(np.uint8)
                tasks = file.chunk_write(rows, int(chunks[i]), outs[i % IN_FLIGHT], ex.threads)
                writing.append(ex.start(file, tasks))
            while writing:
                written += sum(f.result()[0] for f in writing.popleft())
            file.seal()
        finally:
            wait(reading + [f for w in writing for f in w])  # none may still use staging
        with self._lock:
            f = self.figures
            f.scan_bytes += scanned
            f.written_bytes += written
            f.build_seconds += time.perf_counter() - t0
            f.built += 1


def _then(first: Future, start: Callable[[], list[Future]]) -> Future:
    """A future of the reads ``start()`` starts once ``first`` has ended well (on the thread
    that ends it), done when they all are: their summed :class:`JobResult`, or the first
    error of ``first`` or of them."""
    outer: Future = Future()
    outer.set_running_or_notify_cancel()

    def ended(inner: list[Future]) -> None:
        try:
            got = [f.result() for f in inner]
        except BaseException as exc:
            outer.set_exception(exc)
        else:
            outer.set_result(JobResult(sum(r[0] for r in got), sum(r[1] for r in got),
                                       sum(r[2] for r in got)))  # fmt: skip

    def built(f: Future) -> None:
        try:
            f.result()
            inner = start()
        except BaseException as exc:
            outer.set_exception(exc)
            return
        when_all(inner, lambda: ended(inner))

    first.add_done_callback(built)
    return outer

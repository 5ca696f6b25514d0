"""Transforms in worker processes, for functions that hold the GIL.

Batch memory is allocated in shared memory (:class:`SharedArena`, one segment per batch set of
a :class:`~solar.cache.batches.BatchPool`), so a task carries only where its rows live —
segment, offset, shape, dtype — never the arrays: a worker maps the segment once and
transforms the rows in place. The function is pickled once per worker, when it starts
(``spawn``: no thread or lock of the parent is inherited).

Nothing outlives the job (issue 33): a segment is a ``memfd`` (no name in /dev/shm: a worker
opens it through ``/proc/<parent>/fd``, and its memory goes with the last process mapping it);
the pool's semaphores lose their names once every worker has opened them; a worker dies with
its parent (``PR_SET_PDEATHSIG``, and a watcher of its parent's pid where the signal cannot be
tied to the parent's lifetime); a worker that dies is one line naming the step.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import importlib
import mmap
import multiprocessing
import os
import signal
import sys
import threading
import time
import weakref
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import numpy as np

from solar._process import at_abort, nofile_error
from solar.errors import SolarError
from solar.transform import Rows, SampleFn, transform_rows

Where = tuple[str, int, tuple[int, ...], str]  # segment, offset, shape, dtype
_START_S = 120.0  # the longest the workers may take to start (a cold import of torch)


class SharedArena:
    """Allocates arrays in shared memory segments (memfds) and says where an array lives."""

    def __init__(self) -> None:
        # (mapping, descriptor, name, address)
        self._segments: list[tuple[mmap.mmap, int, str, int]] = []
        self._lock = threading.Lock()

    def allocate(self, shapes: list[tuple[int, ...]], dtypes: list[np.dtype]) -> list[np.ndarray]:
        """One segment holding an array of each shape and dtype (64-byte aligned)."""
        offsets, size = [], 0
        for shape, dt in zip(shapes, dtypes, strict=True):
            offsets.append(size)
            size += -(-int(np.prod(shape, dtype=np.int64)) * dt.itemsize // 64) * 64
        size = max(size, 1)
        try:
            fd = os.memfd_create("solar-batches", os.MFD_CLOEXEC)
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                raise nofile_error("transform processes: batch memory") from None
            raise SolarError(f"transform processes: no shared memory for batches ({exc})") from None
        try:
            os.ftruncate(fd, size)
            seg = mmap.mmap(fd, size)  # (which holds a descriptor of its own)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                raise nofile_error("transform processes: batch memory") from None
            raise SolarError(f"transform processes: {size} B of shared memory for batches: "
                             f"{exc.strerror}") from None  # fmt: skip
        # The name a worker opens, with the inode that proves it is still this segment.
        name = f"/proc/{os.getpid()}/fd/{fd}#{os.fstat(fd).st_ino}"
        with self._lock:
            self._segments.append((seg, fd, name, np.frombuffer(seg, np.uint8).ctypes.data))
        return [np.ndarray(shape, dt, buffer=seg, offset=o)
                for shape, dt, o in zip(shapes, dtypes, offsets, strict=True)]  # fmt: skip

    def where(self, a: np.ndarray) -> Where:
        """The segment, offset, shape and dtype of ``a`` (a C-contiguous array allocated here,
        or a leading slice of one)."""
        at = a.ctypes.data
        with self._lock:
            for seg, _, name, base in self._segments:
                if base <= at < base + len(seg):
                    return name, at - base, a.shape, a.dtype.str
        raise SolarError("transform processes: batch memory outside the shared arena")

    def close(self) -> None:
        """Close the segments' descriptors (their memory lives on while an array maps it)."""
        with self._lock:
            for _, fd, _, _ in self._segments:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._segments = []


# -- in the worker -------------------------------------------------------------------------
_STATE: dict[str, Any] = {}
_PR_SET_PDEATHSIG = 1


def _init(fn: Any, seed: int, keys: Any, out_keys: Any, parent: int, pdeathsig: bool) -> None:
    _die_with(parent, pdeathsig)
    _STATE.update(fn=fn, seed=seed, keys=keys, out_keys=out_keys, segments={})


def _die_with(parent: int, pdeathsig: bool) -> None:
    """End this worker when ``parent`` ends, however it ends (SIGKILL, MPI_Abort, os._exit)."""
    if pdeathsig and sys.platform.startswith("linux"):
        # Tied to the thread that started this process: set only when that was the parent's
        # main thread, which lives as long as the parent.
        with contextlib.suppress(Exception):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:  # it ended before the signal was set
        os._exit(1)

    def watch() -> None:  # the signal's backstop (and all of it elsewhere)
        while os.getppid() == parent:
            time.sleep(0.25)
        os._exit(1)

    threading.Thread(target=watch, name="solar-parent-watch", daemon=True).start()


def _view(w: Where) -> np.ndarray:
    name, offset, shape, dtype = w
    segs = _STATE["segments"]
    seg = segs.get(name)
    if seg is None:
        path, ino = name.rsplit("#", 1)
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as exc:
            raise SolarError(f"transform processes: the batch memory {path} cannot be opened "
                             f"here ({exc.strerror})") from None  # fmt: skip
        try:
            st = os.fstat(fd)
            if st.st_ino != int(ino):  # (the parent closed it: never another file's bytes)
                raise SolarError(f"transform processes: batch memory {path} is gone")
            seg = segs[name] = mmap.mmap(fd, st.st_size)
        finally:
            os.close(fd)
    return np.ndarray(shape, np.dtype(dtype), buffer=seg, offset=offset)


def _run(src: list[Where], dst: list[Where], job: Rows) -> float:
    return transform_rows(_STATE["fn"], _STATE["seed"], _STATE["keys"],
                          [_view(w) for w in src], _STATE["out_keys"],
                          [_view(w) for w in dst], job)  # fmt: skip


def _ready(hold: float) -> int:
    time.sleep(hold)  # (so that the others take the other tasks)
    return os.getpid()


# -- in the Loader's process ----------------------------------------------------------------
class ProcessTransforms:
    """``workers`` processes running ``fn`` (solar.transform.transform_rows); batch memory
    they reach is allocated from :attr:`arena`."""

    def __init__(self, workers: int, fn: SampleFn, seed: int, keys: tuple, out_keys: tuple) -> None:
        self.arena = SharedArena()
        ctx = multiprocessing.get_context("spawn")
        main = threading.current_thread() is threading.main_thread()
        try:
            self._procs = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init,
                                              initargs=(fn, seed, keys, out_keys, os.getpid(),
                                                        main))  # fmt: skip
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                raise nofile_error(f"transform processes ({workers})") from None
            raise
        self._workers: list[Any] = []
        self._death: str | None = None  # how the worker that broke the pool ended
        # Stopped and closed at close, or when dropped, or at exit, or when the job aborts.
        # (Neither holds this object: dropped, it is stopped as if closed.)
        forget = at_abort(functools.partial(_kill, self._procs))
        self._finalizer = weakref.finalize(self, _stop, self._procs, self.arena, forget)
        try:
            self._start(workers)
        except BaseException as exc:
            self._procs.shutdown(wait=False, cancel_futures=True)
            _kill(self._procs)
            if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
                raise nofile_error(f"transform processes ({workers})") from None
            if not isinstance(exc, Exception):
                raise
            raise SolarError(f"transform processes did not start (does the transform pickle? "
                             f"{type(exc).__name__}: {exc})") from exc  # fmt: skip

    def _start(self, workers: int) -> None:
        """Start every worker now (not inside the first epoch), then take the names off the
        pool's semaphores: each worker has opened them."""
        seen: set[int] = set()
        deadline = time.monotonic() + _START_S
        while len(seen) < workers:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(seen)} of {workers} workers started")
            seen |= {f.result() for f in [self._procs.submit(_ready, 0.02 if seen else 0.05)
                                          for _ in range(workers)]}  # fmt: skip
        self._workers = list((getattr(self._procs, "_processes", None) or {}).values())
        _unname_semaphores(self._procs)

    def submit(
        self, src: list[np.ndarray], dst: list[np.ndarray], jobs: list[Rows]
    ) -> list[Future]:
        """Start ``jobs`` on the workers; rows of ``src`` and ``dst`` must be in the arena.
        A worker's death fails the futures with one line naming the step."""
        s = [self.arena.where(a) for a in src]
        d = [self.arena.where(a) for a in dst]
        out = []
        for job in jobs:
            try:
                f = self._procs.submit(_run, s, d, job)
            except BrokenProcessPool:
                raise SolarError(self._died(job)) from None
            mine: Future = Future()
            f.add_done_callback(functools.partial(self._relay, mine=mine, job=job))
            out.append(mine)
        return out

    def _relay(self, f: Future, mine: Future, job: Rows) -> None:
        if f.cancelled():
            mine.cancel()
            return
        exc = f.exception()
        if exc is None:
            mine.set_result(f.result())
        elif isinstance(exc, BrokenProcessPool):
            mine.set_exception(SolarError(self._died(job)))
        else:
            mine.set_exception(exc)

    def _died(self, job: Rows) -> str:
        """One line: which worker died how, and the step whose rows it was transforming."""
        how, deadline = self._death or "died", time.monotonic() + 1.0
        while how == "died" and time.monotonic() < deadline:
            # (The pool ends the others with SIGTERM once one is gone: that is not the cause.)
            codes = [p.exitcode for p in self._workers]
            code = next((c for c in codes if c not in (None, 0, -signal.SIGTERM)), None)
            if code is None:
                time.sleep(0.02)
            elif code < 0:
                sig = signal.Signals(-code).name if -code in signal.valid_signals() else -code
                how = f"was killed by {sig}" + (" (out of memory?)" if code == -9 else "")
            else:
                how = f"exited with status {code}"
        self._death = how
        first = int(job.samples[0]) if job.samples.size else -1
        return (f"transform processes: a worker {how} at step {job.step} of epoch {job.epoch} "
                f"(samples {first}, ...): a crash in native code, os._exit or the kernel's "
                "OOM killer")  # fmt: skip

    def close(self) -> None:
        self._finalizer()


def _stop(procs: ProcessPoolExecutor, arena: SharedArena, forget: Any) -> None:
    forget()
    procs.shutdown(wait=True, cancel_futures=True)
    arena.close()


def _kill(procs: ProcessPoolExecutor) -> None:
    """End the workers now (the job is aborting: nothing of theirs is waited for)."""
    for p in list((getattr(procs, "_processes", None) or {}).values()):
        with contextlib.suppress(Exception):
            p.kill()


def _unname_semaphores(procs: ProcessPoolExecutor) -> None:
    """Unlink the names of the pool's semaphores (its queues' locks): every worker has them
    open, no process opens them again, and a name left in /dev/shm would outlive a job whose
    processes are all killed (mpiexec ends a failed job so). Best effort: where the pool's
    insides differ (another Python), the names stay, removed as before at exit."""
    from multiprocessing import resource_tracker, util

    sem_unlink = getattr(importlib.import_module("_multiprocessing"), "sem_unlink", None)
    if sem_unlink is None:  # pragma: no cover - not Unix
        return
    names = set()
    for queue in (getattr(procs, "_call_queue", None), getattr(procs, "_result_queue", None)):
        for attr in ("_rlock", "_wlock", "_sem"):
            name = getattr(getattr(getattr(queue, attr, None), "_semlock", None), "name", None)
            if name:
                names.add(name)
    if not names:
        return
    registry = getattr(util, "_finalizer_registry", {})
    for fin in list(registry.values()):  # their unlink at exit would fail: cancelled
        args = getattr(fin, "_args", None)
        if args and isinstance(args[0], str) and args[0] in names:
            fin.cancel()
    for name in names:
        with contextlib.suppress(OSError):
            sem_unlink(name)
        with contextlib.suppress(Exception):
            resource_tracker.unregister(name, "semaphore")

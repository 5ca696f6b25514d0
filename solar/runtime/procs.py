"""Transforms in worker processes, for functions that hold the GIL.

Batch memory is allocated in shared memory (:class:`SharedArena`, one segment per batch set of
a :class:`~solar.cache.batches.BatchPool`), so a task carries only where its rows live —
segment name, offset, shape, dtype — never the arrays: a worker maps the segment once and
transforms the rows in place. The function is pickled once per worker, when it starts
(``spawn``: no thread or lock of the parent is inherited).
"""

from __future__ import annotations

import multiprocessing
import threading
import weakref
from concurrent.futures import Future, ProcessPoolExecutor
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from solar.errors import SolarError
from solar.transform import Rows, SampleFn, transform_rows

Where = tuple[str, int, tuple[int, ...], str]  # segment, offset, shape, dtype


class SharedArena:
    """Allocates arrays in shared memory segments and says where an array lives."""

    def __init__(self) -> None:
        self._segments: list[tuple[shared_memory.SharedMemory, int]] = []  # (segment, address)
        self._lock = threading.Lock()

    def allocate(self, shapes: list[tuple[int, ...]], dtypes: list[np.dtype]) -> list[np.ndarray]:
        """One segment holding an array of each shape and dtype (64-byte aligned)."""
        offsets, size = [], 0
        for shape, dt in zip(shapes, dtypes, strict=True):
            offsets.append(size)
            size += -(-int(np.prod(shape, dtype=np.int64)) * dt.itemsize // 64) * 64
        seg = shared_memory.SharedMemory(create=True, size=max(size, 1))
        with self._lock:
            buf = seg.buf
            assert buf is not None
            self._segments.append((seg, np.frombuffer(buf, np.uint8).ctypes.data))
        return [np.ndarray(shape, dt, buffer=seg.buf, offset=o)
                for shape, dt, o in zip(shapes, dtypes, offsets, strict=True)]  # fmt: skip

    def where(self, a: np.ndarray) -> Where:
        """The segment, offset, shape and dtype of ``a`` (a C-contiguous array allocated here,
        or a leading slice of one)."""
        at = a.ctypes.data
        with self._lock:
            for seg, base in self._segments:
                if base <= at < base + seg.size:
                    return seg.name, at - base, a.shape, a.dtype.str
        raise SolarError("transform processes: batch memory outside the shared arena")

    def close(self) -> None:
        """Unlink the segments (their memory lives on while a tensor maps it)."""
        with self._lock:
            for seg, _ in self._segments:
                try:
                    seg.unlink()
                except FileNotFoundError:
                    pass
            self._segments = []


# -- in the worker -------------------------------------------------------------------------
_STATE: dict[str, Any] = {}


def _init(fn: Any, seed: int, keys: Any, out_keys: Any) -> None:
    _STATE.update(fn=fn, seed=seed, keys=keys, out_keys=out_keys, segments={})


def _view(w: Where) -> np.ndarray:
    name, offset, shape, dtype = w
    segs = _STATE["segments"]
    if name not in segs:
        # Registered again with the parent's resource tracker (a spawned child shares it): the
        # same entry, removed when the parent unlinks the segment. (Unregistering here would
        # remove the parent's.)
        segs[name] = shared_memory.SharedMemory(name=name)
    return np.ndarray(shape, np.dtype(dtype), buffer=segs[name].buf, offset=offset)


def _run(src: list[Where], dst: list[Where], job: Rows) -> float:
    return transform_rows(_STATE["fn"], _STATE["seed"], _STATE["keys"],
                          [_view(w) for w in src], _STATE["out_keys"],
                          [_view(w) for w in dst], job)  # fmt: skip


def _ready() -> None:
    return None


# -- in the Loader's process ----------------------------------------------------------------
class ProcessTransforms:
    """``workers`` processes running ``fn`` (solar.transform.transform_rows); batch memory
    they reach is allocated from :attr:`arena`."""

    def __init__(self, workers: int, fn: SampleFn, seed: int, keys: tuple, out_keys: tuple) -> None:
        self.arena = SharedArena()
        ctx = multiprocessing.get_context("spawn")
        self._procs = ProcessPoolExecutor(
            workers, mp_context=ctx, initializer=_init, initargs=(fn, seed, keys, out_keys)
        )
        # Stopped and unlinked at close, or when dropped, or at exit: never left behind.
        self._finalizer = weakref.finalize(self, _stop, self._procs, self.arena)
        try:  # start them all now, not inside the first epoch
            for f in [self._procs.submit(_ready) for _ in range(workers)]:
                f.result()
        except Exception as exc:
            self._procs.shutdown(wait=False, cancel_futures=True)
            raise SolarError(f"transform processes did not start (does the transform pickle? "
                             f"{type(exc).__name__}: {exc})") from exc  # fmt: skip

    def submit(
        self, src: list[np.ndarray], dst: list[np.ndarray], jobs: list[Rows]
    ) -> list[Future]:
        """Start ``jobs`` on the workers; rows of ``src`` and ``dst`` must be in the arena."""
        s = [self.arena.where(a) for a in src]
        d = [self.arena.where(a) for a in dst]
        return [self._procs.submit(_run, s, d, job) for job in jobs]

    def close(self) -> None:
        self._finalizer()


def _stop(procs: ProcessPoolExecutor, arena: SharedArena) -> None:
    procs.shutdown(wait=True, cancel_futures=True)
    arena.close()

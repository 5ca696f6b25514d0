"""The second cache tier: one preallocated file per rank on node-local storage (NVMe).

A :class:`TierFile` holds ``slots`` tier slots, each one whole sample: every key's row packed in
key order, padded so that a slot starts at a multiple of 4096 bytes (what ``O_DIRECT`` needs).
It owns the file and its I/O only; which sample lives in which tier slot is the planner's
business. Reads and writes run on a private thread pool (``preadv``/``pwritev`` release the GIL).

The file is named ``solar-tier-{name}.{n}-{host}-{pid}.bin`` (n counts the process's tiers) and
removed at :meth:`TierFile.close`, at garbage collection and at interpreter exit, by the process
that created it only. Files left by crashed runs on this host (their pid no longer alive) are
removed when a tier is created.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import functools
import itertools
import multiprocessing.util
import os
import re
import socket
import tempfile
import threading
import time
import warnings
import weakref
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path

import numpy as np

from solar._memory import PAGE, aligned, thread_buffer
from solar._units import format_bytes
from solar.cache.slots import copy_rows
from solar.errors import SolarError
from solar.io.hdf5 import KeyInfo
from solar.io.pagecache import drop
from solar.io.tasks import IOV_MAX, coalesce_runs

_RUN_BYTES = 4 * 2**20  # per call: enough for full NVMe bandwidth, small enough to share out


_INSTANCES = itertools.count()


def tier_stride(keys: tuple[KeyInfo, ...]) -> int:
    """Bytes per tier slot: the keys' rows back to back, rounded up to a multiple of 4096."""
    total = sum(k.row_bytes for k in keys)
    return max(PAGE, -(-total // PAGE) * PAGE)


class TierFile:
    """``slots`` whole-sample slots in a new preallocated file in ``directory``.

    ``slots`` must be at least 1 (a caller with no tier creates none). ``staging_slots`` bounds
    the page-aligned memory (``staging_slots * stride`` bytes, touched as used) holding rows
    copied by :meth:`submit_write` until they are on disk.

    Ordering contract: a read of a tier slot starts after every write of that slot submitted
    before it has completed, and writes of one slot complete in submission order. A write does
    NOT wait for earlier reads: the caller must wait for a read of a slot's old content before
    submitting a write of that slot. A slot never written reads as zeros (or the caller's bug).

    A failed write leaves its slots unknown: every later call raises its error (one line).
    """

    def __init__(
        self, directory: str | os.PathLike, *, slots: int, keys: tuple[KeyInfo, ...], name: str,
        threads: int = 2, direct: bool = True, staging_slots: int = 256,
    ) -> None:  # fmt: skip
        if slots < 1 or threads < 1 or staging_slots < 1:
            raise SolarError(f"tier: slots ({slots}), threads, staging_slots must be >= 1")
        self.keys, self.slots, self.threads = tuple(keys), slots, threads
        self.stride = tier_stride(self.keys)
        self.nbytes = slots * self.stride
        self.staging_slots = staging_slots
        self._sizes = [k.row_bytes for k in self.keys]
        self._offsets = [sum(self._sizes[:i]) for i in range(len(self._sizes))]
        self._sample_bytes = sum(self._sizes)
        self._run_cap = max(1, min(_RUN_BYTES // self.stride, IOV_MAX // (len(keys) + 1)))
        directory = Path(directory)
        _check_directory(directory)
        host = _sanitise(socket.gethostname())
        remove_stale(directory, host)  # first: a crashed run's file may hold the space we need
        vfs = os.statvfs(directory)
        free = vfs.f_bavail * vfs.f_frsize
        if self.nbytes > free:
            raise SolarError(
                f"tier {directory}: needs {format_bytes(self.nbytes)} for {slots} slots of "
                f"{format_bytes(self.stride)}, {format_bytes(free)} free"
            )
        # A process may hold several tiers of one plan and rank (loaders live side by side).
        seq = next(_INSTANCES)
        self.path = directory / f"solar-tier-{_sanitise(name)}.{seq}-{host}-{os.getpid()}.bin"
        self._fd, self.direct_io = _create(self.path, self.nbytes, direct)
        self._finalizer = weakref.finalize(self, _remove, self._fd, str(self.path), os.getpid())
        # Also at the exit of a multiprocessing child, which skips atexit (and so weakref's).
        multiprocessing.util.Finalize(self, self._finalizer, exitpriority=0)
        self.bytes_written = self.bytes_read = 0
        self.write_wait_seconds = 0.0
        self._error: BaseException | None = None  # a failed write: the tier is unusable
        self._closed = False
        self._pid = -1

    def _state(self) -> None:
        """Pool, locks, staging and in-flight writes of this process: never inherited by fork."""
        if self._pid == os.getpid():
            return
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)  # staging slots freed
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="solar-tier")
        self._local = threading.local()
        self._staging = aligned(self.staging_slots * self.stride).reshape(-1, self.stride)
        self._free = collections.deque(range(self.staging_slots))
        self._scratch = aligned(PAGE)  # padding between slots read into rows (discarded)
        self._pending: dict[int, Future] = {}  # tier slot -> its latest write in flight
        self._writes: dict[Future, None] = {}  # writes in flight, oldest first

    def _direct_into_rows(self, out: list[np.ndarray]) -> bool:
        """Read straight into the destination rows: always when buffered; with O_DIRECT only
        if every row starts page-aligned in the slot and in memory."""
        if not self.direct_io:
            return True
        return all(s % PAGE == 0 for s in self._sizes) and all(
            a.ctypes.data % PAGE == 0 for a in out
        )

    # -- writes ----------------------------------------------------------------------------
    def submit_write(
        self, tslots: np.ndarray, sources: list[np.ndarray], rows: np.ndarray
    ) -> list[Future]:
        """Start writing ``sources[i][rows[j]]`` (every key i) to tier slot ``tslots[j]``.

        The rows are copied before returning (the caller may overwrite ``sources`` at once);
        this waits while staging memory is full (counted in ``write_wait_seconds``). If a tier
        slot appears twice, the last one wins. Each future's result is (bytes written, seconds),
        as the reader's are (``solar.io.reader.wait_all`` waits for either).
        """
        t, r = self._check(tslots, rows, sources)
        last = t.size - 1 - np.unique(t[::-1], return_index=True)[1]  # sorted by tier slot
        t, r = t[last], r[last]
        src = [
            _rows_u8(np.ascontiguousarray(a), s) for a, s in zip(sources, self._sizes, strict=True)
        ]
        cap = min(self._run_cap, self.staging_slots)
        job_cap = min(self.staging_slots, max(cap, -(-t.size // self.threads)))
        futures = []
        for job in _pack(_runs(t, cap)[1], job_cap):
            idx = np.concatenate([np.arange(a, b) for a, b in job])
            stage = self._take(idx.size)
            for s, off, size in zip(src, self._offsets, self._sizes, strict=True):
                copy_rows(s, r[idx], self._staging[:, off : off + size], stage)
            at = np.cumsum([0] + [b - a for a, b in job])
            runs = [(int(t[a]), stage[at[i] : at[i + 1]]) for i, (a, b) in enumerate(job)]
            slots = t[idx].tolist()
            with self._lock:
                deps = self._writes_to(slots)
                fut = self._pool.submit(self._write_job, runs, deps, stage)
                self._pending.update(dict.fromkeys(slots, fut))
                self._writes[fut] = None
            fut.add_done_callback(functools.partial(self._written, slots))
            futures.append(fut)
        return futures

    def _writes_to(self, slots: list[int]) -> set[Future]:
        """The writes in flight to any of ``slots`` (the lock held)."""
        return {f for x in slots if (f := self._pending.get(x)) is not None}

    def _take(self, n: int) -> np.ndarray:
        """``n`` free staging slots, waiting for writes to finish if there are too few."""
        t0 = time.perf_counter()
        with self._room:
            waited = len(self._free) < n
            while len(self._free) < n:
                self._room.wait()
            stage = np.array([self._free.popleft() for _ in range(n)], np.int64)
        if waited:
            self.write_wait_seconds += time.perf_counter() - t0
        return stage

    def _write_job(
        self, runs: list[tuple[int, np.ndarray]], deps: set[Future], stage
    ) -> tuple[int, float]:
        t_start = time.perf_counter()
        try:
            wait(deps)  # an earlier write of the same slot must not land after this one
            total = 0
            for t0, sidx in runs:
                off, want = t0 * self.stride, sidx.size * self.stride
                try:
                    got = os.pwritev(self._fd, [self._staging[s] for s in sidx.tolist()], off)
                except OSError as exc:
                    raise SolarError(f"tier {self.path}: slot {t0}: {exc.strerror}") from None
                if got != want:
                    raise SolarError(f"tier {self.path}: slot {t0}: wrote {got} of {want} B")
                if not self.direct_io:
                    # Buffered fallback: the page cache must not silently become the store.
                    drop(self._fd, off, want)
                total += got
            with self._lock:
                self.bytes_written += total
            return total, time.perf_counter() - t_start
        finally:
            with self._room:
                self._free.extend(stage.tolist())
                self._room.notify_all()

    def _written(self, slots: list[int], fut: Future) -> None:
        with self._lock:
            for x in slots:
                if self._pending.get(x) is fut:
                    del self._pending[x]
            self._writes.pop(fut, None)
            if self._error is None and not fut.cancelled():
                self._error = fut.exception()

    def wait_writes(self) -> None:
        """Wait for every write in flight; raise the first error of any write so far."""
        if self._pid == os.getpid():
            with self._lock:
                futures = list(self._writes)
            wait(futures)
            for f in futures:
                if not f.cancelled() and f.exception() is not None:
                    raise SolarError(str(f.exception()))
        if self._error is not None:
            raise SolarError(str(self._error))

    # -- reads -----------------------------------------------------------------------------
    def submit_read(
        self, tslots: np.ndarray, out: list[np.ndarray], rows: np.ndarray
    ) -> list[Future]:
        """Start reading tier slot ``tslots[j]`` into ``out[i][rows[j]]`` for every key i.

        ``out`` arrays must be C-contiguous. Each future's result is (bytes read, seconds).
        """
        t, r = self._check(tslots, rows, out)
        order, runs = _runs(t, self._run_cap)  # adjacent tier slots: one call
        t, r = t[order], r[order]
        dst = [_rows_u8(a, s) for a, s in zip(out, self._sizes, strict=True)]
        direct = self._direct_into_rows(out)
        cap = self._run_cap
        futures = []
        with self._lock:
            for job in _pack(runs, max(cap, -(-t.size // self.threads))):
                deps = (
                    self._writes_to([x for a, b in job for x in t[a:b].tolist()])
                    if self._pending
                    else set()
                )  # with no write in flight, no per-slot lookups
                parts = [(int(t[a]), r[a:b]) for a, b in job]
                futures.append(self._pool.submit(self._read_job, parts, dst, direct, deps))
        return futures

    def _read_job(
        self, runs: list, dst: list[np.ndarray], direct: bool, deps: set
    ) -> tuple[int, float]:
        t_start = time.perf_counter()
        for f in deps:
            f.result()  # the slot's write must be on disk; its error is this read's too
        total = sum(self._pread(t0, rows, dst, direct) for t0, rows in runs)
        with self._lock:
            self.bytes_read += total
        return total, time.perf_counter() - t_start

    def _pread(self, t0: int, rows: np.ndarray, dst: list[np.ndarray], direct: bool) -> int:
        n, pad = rows.size, self.stride - self._sample_bytes
        if direct:
            iov: list = []
            for j, row in enumerate(rows.tolist()):
                iov.extend(d[row] for d in dst)
                if pad and j < n - 1:
                    iov.append(self._scratch[:pad])
            want = n * self._sample_bytes + (n - 1) * pad
        else:
            want = n * self.stride
            bounce = thread_buffer(self._local, want)
            iov = [bounce[:want]]
        try:
            got = os.preadv(self._fd, iov, t0 * self.stride)
        except OSError as exc:
            raise SolarError(f"tier {self.path}: slot {t0}: {exc.strerror}") from None
        if got != want:
            raise SolarError(f"tier {self.path}: slot {t0}: read {got} of {want} B")
        if not direct:
            slots = bounce[:want].reshape(n, self.stride)
            for d, off, size in zip(dst, self._offsets, self._sizes, strict=True):
                d[rows] = slots[:, off : off + size]
        return got

    def _check(self, tslots, rows, arrays: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Arguments as int64 arrays, every slot and row in range: before any I/O."""
        if self._closed:
            raise SolarError(f"tier {self.path}: used after close()")
        self._state()
        if self._error is not None:
            raise SolarError(str(self._error))
        t, r = np.asarray(tslots, np.int64).ravel(), np.asarray(rows, np.int64).ravel()
        if t.shape != r.shape or len(arrays) != len(self.keys):
            raise SolarError(f"tier: {t.size} slots, {r.size} rows, {len(arrays)} arrays")
        bad = np.flatnonzero((t < 0) | (t >= self.slots))
        if bad.size:
            raise SolarError(f"tier {self.path}: slot {t[bad[0]]} outside 0..{self.slots - 1}")
        n = min(a.shape[0] for a in arrays) if arrays else 0
        bad = np.flatnonzero((r < 0) | (r >= n))
        if bad.size:
            raise SolarError(f"tier {self.path}: row {r[bad[0]]} outside 0..{n - 1}")
        return t, r

    def close(self) -> None:
        """Wait for I/O in flight, stop the pool, close and remove the file (idempotent).

        Errors of writes nobody waited for are dropped with the file: :meth:`wait_writes`
        first to see them. In a forked child this closes the child's descriptor only.
        """
        if self._closed:
            return
        self._closed = True
        if self._pid == os.getpid():  # a forked child never touches its parent's pool
            self._pool.shutdown(wait=True)
        self._finalizer()

    def __enter__(self) -> TierFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _remove(fd: int, path: str, pid: int) -> None:
    """Close the descriptor; remove the file only in the process that created it."""
    os.close(fd)
    if os.getpid() == pid:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _create(path: Path, nbytes: int, direct: bool) -> tuple[int, bool]:
    """A new file of ``nbytes`` allocated bytes; its descriptor and whether O_DIRECT is on."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise SolarError(f"tier {path}: cannot create ({exc.strerror})") from None
    try:
        os.posix_fallocate(fd, 0, nbytes)  # before O_DIRECT: glibc may emulate it by writes
        if direct:
            try:
                dfd = os.open(path, os.O_RDWR | os.O_DIRECT)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                warnings.warn(f"tier {path}: no O_DIRECT here, using buffered I/O", stacklevel=3)
            else:
                os.close(fd)
                return dfd, True
        return fd, False
    except OSError as exc:
        os.close(fd)
        os.unlink(path)
        raise SolarError(
            f"tier {path}: cannot allocate {format_bytes(nbytes)} ({exc.strerror})"
        ) from None


def _check_directory(directory: Path) -> None:
    if not directory.exists():
        raise SolarError(f"tier {directory}: directory does not exist")
    if not directory.is_dir():
        raise SolarError(f"tier {directory}: not a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise SolarError(f"tier {directory}: directory is not writable")


def remove_stale(directory: Path, host: str) -> list[Path]:
    """Remove this host's tier files whose creating process is dead; returns them."""
    pattern = re.compile(rf"solar-tier-.+-{re.escape(host)}-(\d+)\.bin")
    removed = []
    for entry in sorted(os.listdir(directory)):
        m = pattern.fullmatch(entry)
        if m is None or _alive(int(m.group(1))):
            continue
        try:
            os.unlink(directory / entry)
        except OSError:
            continue  # another rank of this node removed it first, or it is not ours to remove
        warnings.warn(
            f"removed a tier file left by a crashed run: {directory / entry}", stacklevel=3
        )
        removed.append(directory / entry)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's process, or not a pid: leave its file alone
    return True


def measure_bandwidth(
    directory: str | os.PathLike, nbytes: int = 256 * 2**20, block: int = 4 * 2**20
) -> tuple[float, float]:
    """O_DIRECT (write, read) bandwidth in bytes/s of a scratch file in ``directory``, which is
    always removed: ``nbytes`` written in ``block``-sized calls, fsync'ed, then read back."""
    _check_directory(Path(directory))
    block = max(PAGE, block // PAGE * PAGE)
    count = max(1, nbytes // block)
    buf = aligned(block)
    buf[:] = np.random.default_rng(0).integers(0, 256, block, np.uint8)  # incompressible
    fd, tmp = tempfile.mkstemp(prefix=".solar-tier-bench-", dir=directory)
    os.close(fd)
    try:
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_DIRECT)
            os.posix_fallocate(fd, 0, count * block)
        except OSError as exc:
            raise SolarError(
                f"tier {directory}: cannot measure with O_DIRECT ({exc.strerror})"
            ) from None
        try:
            t0 = time.perf_counter()
            for i in range(count):
                os.pwrite(fd, buf.data, i * block)
            os.fsync(fd)
            t1 = time.perf_counter()
            for i in range(count):
                os.preadv(fd, [buf.data], i * block)
            t2 = time.perf_counter()
        finally:
            os.close(fd)
    finally:
        os.unlink(tmp)
    return count * block / (t1 - t0), count * block / (t2 - t1)


def _rows_u8(a: np.ndarray, row_bytes: int) -> np.ndarray:
    """``a`` as (rows, row_bytes) uint8, sharing its memory."""
    if not a.flags.c_contiguous or (a.shape[0] and a[0].nbytes != row_bytes):
        raise SolarError(
            f"tier: an array of shape {a.shape} is not C-contiguous {row_bytes} B rows"
        )
    return a.view(np.uint8).reshape(a.shape[0], row_bytes)


def _runs(t: np.ndarray, cap: int) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """The order sorting tier slots ``t``, and [a, b) ranges of the sorted slots that are
    consecutive, at most ``cap`` long (``solar.io.tasks.coalesce_runs``)."""
    runs = coalesce_runs(t, cap)
    ends = runs.starts + runs.counts
    return runs.order, list(zip(runs.starts.tolist(), ends.tolist(), strict=True))


def _pack(runs: list[tuple[int, int]], cap: int) -> list[list[tuple[int, int]]]:
    """Consecutive runs grouped into jobs of at most ``cap`` slots (one pool task each)."""
    jobs: list[list[tuple[int, int]]] = []
    size = cap
    for a, b in runs:
        if size + b - a > cap:
            jobs.append([])
            size = 0
        jobs[-1].append((a, b))
        size += b - a
    return jobs


def _sanitise(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", s)

"""The I/O executor: where every byte that lands in a batch row is read (and the tier's
records are written).

:meth:`Executor.start` runs a step's typed tasks (solar/io/tasks.py) on a thread pool, dealt
into a few jobs; :meth:`Executor._run` executes one task, one ``case`` per task type. Tasks
read from a *byte source*: the dataset's files (:class:`solar.io.handles.Files`) or the second
tier's file (:class:`solar.cache.tier.TierFile`), which lend descriptors and name themselves in
errors, as ffcv's memory managers make the page cache and its own cache interchangeable
sources behind one read. ``preadv`` and the compiled kernels release the GIL, so the pool
gives real concurrency (h5py would serialise).

A job may wait for futures (``after``, ``settled``: the tier's writes and reads in flight of
its slots).
They must be futures of this executor's read pool returned by an earlier :meth:`Executor.start`
(never a future completed by a caller): the pool is first in, first out, so they were dequeued
before the job and are running or done, and waiting cannot deadlock. (Tier tasks never decode,
so they always run on the read pool.)
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import threading
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, NamedTuple, Protocol, assert_never

import h5py
import numpy as np
from numba import njit

from solar._cpu import cores
from solar._memory import PAGE, thread_buffer
from solar._process import ProcessLocal
from solar.errors import SolarError, truncated
from solar.io import aio, libc
from solar.io.advice import Advice
from solar.io.chunks import decode_chunk, fill_absent
from solar.io.fused import read_fused, windows
from solar.io.handles import Files
from solar.io.pagecache import drop
from solar.io.tasks import (
    GATHER_WINDOW,
    SPAN_MAX,
    BounceRun,
    ChunkReads,
    FileRuns,
    H5Rows,
    PageGather,
    PreadvRuns,
    Task,
)


class ByteSource(Protocol):
    """What the executor reads from: descriptors by index, and errors that name the source."""

    direct_io: bool  # descriptors are opened with O_DIRECT
    throttle: Any  # solar.io.throttle.Throttle (an emulated remote file system) or None
    cache_first: bool  # buffered runs are tried from the page cache first (_iov_runs)

    def fd(self, i: int) -> contextlib.AbstractContextManager[int]: ...

    def io_error(self, i: int, offset: int, exc: OSError) -> SolarError: ...

    def short_transfer(self, i: int, offset: int, want: int, got: int, write: bool) -> SolarError:
        """A read (a write if ``write``) of ``got`` of ``want`` bytes at ``offset``."""


@njit(cache=True, nogil=True)
def _iov_runs(fd, iov, starts, counts, offsets, write, got, cached):
    """One preadv (pwritev) per run of one descriptor, without the GIL.

    Reads given ``cached`` (each run's bytes; empty: none; a source's ``cache_first``) take
    the page cache first: every run is tried from it alone (``RWF_NOWAIT``: a miss fails at
    once, its fetch started), a run not wholly there is advised too (WILLNEED), and only then
    are those read, waiting. A task's misses are thus all in flight however few threads read
    them (:func:`tries_cache`), and its hits cost no wait."""
    tried = not write and cached.shape[0] > 0
    if tried:
        for j in range(starts.shape[0]):
            at = iov.ctypes.data + 16 * starts[j]
            got[j] = libc.syscall(libc.PREADV2, fd, at, counts[j], offsets[j], 0, libc.NOWAIT)
            if got[j] != cached[j] and cached[j] > 0:  # (length 0 would advise to the end)
                libc.fadvise(fd, offsets[j], cached[j], libc.WILLNEED)  # (only advice)
    for j in range(starts.shape[0]):
        if tried and got[j] == cached[j]:
            continue
        at = iov.ctypes.data + 16 * starts[j]
        if write:
            got[j] = libc.pwritev(fd, at, counts[j], offsets[j])
        else:
            got[j] = libc.preadv(fd, at, counts[j], offsets[j])


@njit(cache=True, nogil=True)
def _advise_preadv_each(fds, iov, offsets, got):
    """Read j: ``iov[j, 1]`` bytes at ``offsets[j]`` of ``fds[j]``, without the GIL (``got``
    -1 where ``fds[j]`` < 0: a file that did not open). Every read is advised first
    (WILLNEED), so all are in flight at once rather than one at a time: small files are
    bound by latency, not bandwidth."""
    n = fds.shape[0]
    if n > 1:
        for j in range(n):
            if fds[j] >= 0:
                libc.fadvise(fds[j], offsets[j], iov[j, 1], libc.WILLNEED)  # errors are moot
    for j in range(n):
        got[j] = -1 if fds[j] < 0 else libc.preadv(fds[j], iov.ctypes.data + 16 * j, 1, offsets[j])


@njit(cache=True, nogil=True)
def _same_file(fd, ident, f, stx, empty):  # pragma: no cover - compiled
    """Whether descriptor ``fd`` is path f's file: ``ident[f]`` (size, mtime ns, ctime ns,
    device, inode; -1 not known yet, then pinned; -2 ignored, solar/io/identity.py's
    ``IGNORED``) against its statx (solar/io/identity.py's ``stamp``)."""
    if libc.statx(fd, empty.ctypes.data, libc.AT_EMPTY_PATH, libc.STATX_BASIC_STATS,
                  stx.ctypes.data) != 0:  # fmt: skip
        return False
    # struct statx (little-endian): ino at byte 32, size 40, ctime (s, ns) 96 and 104, mtime
    # 112 and 120, device (major, minor) 136 and 140; the device as glibc's makedev encodes it.
    major, minor = stx[17] & 0xFFFFFFFF, stx[17] >> 32
    dev = ((major & 0xFFFFF000) << 32) | ((major & 0xFFF) << 8)
    dev |= ((minor & 0xFFFFFF00) << 12) | (minor & 0xFF)
    ns = 1_000_000_000
    mtime, ctime = stx[14] * ns + (stx[15] & 0xFFFFFFFF), stx[12] * ns + (stx[13] & 0xFFFFFFFF)
    now = (stx[5], mtime, ctime, dev, stx[4])
    for c in range(5):
        if ident[f, c] >= 0 and ident[f, c] != now[c]:
            return False
    for c in range(5):
        if ident[f, c] == -1:  # (identity.UNKNOWN; IGNORED, -2, stays)
            ident[f, c] = now[c]
    return True


@njit(cache=True, nogil=True)
def _same_files(fds, files, ident):  # pragma: no cover - compiled
    """The first j whose descriptor ``fds[j]`` is not path ``files[j]``'s file, else -1: a
    window's checks in one call without the GIL (an fstat each from Python cost 14 % of a
    warm step of 64 one-sample files)."""
    stx = np.empty(32, np.int64)
    empty = np.zeros(1, np.uint8)
    for j in range(fds.shape[0]):
        if not _same_file(fds[j], ident, files[j], stx, empty):
            return j
    return -1


@njit(cache=True, nogil=True)
def _open_read_close(names, name_at, files, iov, offsets, got, hold, ident):
    """FileRuns without the descriptor cache: open ``hold`` files at a time (a file's
    neighbouring reads share one open), advise every read (WILLNEED), read, close; all
    without the GIL. ``names[name_at[f]:]`` is path f, NUL-terminated. A read whose file
    did not open, or is not the file described (``ident``: :func:`_same_file`), gets ``got``
    -1 (the caller retries it through the cache, which raises)."""
    n = files.shape[0]
    fds = np.empty(n, np.int64)
    stx = np.empty(32, np.int64)  # struct statx: 256 bytes
    empty = np.zeros(1, np.uint8)  # "": statx of the descriptor itself
    a = 0
    while a < n:
        b = a
        opened = 0
        while b < n and (opened < hold or files[b] == files[b - 1]):
            if b > a and files[b] == files[b - 1]:
                fds[b] = fds[b - 1]
            else:
                fds[b] = libc.open_file(names.ctypes.data + name_at[files[b]], libc.O_READ)
                if fds[b] >= 0 and not _same_file(fds[b], ident, files[b], stx, empty):
                    libc.close(fds[b])
                    fds[b] = -1  # another file under its name: never read
                opened += 1
            b += 1
        _advise_preadv_each(fds[a:b], iov[a:b], offsets[a:b], got[a:b])
        for j in range(a, b):
            if fds[j] >= 0 and (j == b - 1 or files[j + 1] != files[j]):
                libc.close(fds[j])
        a = b


@njit(cache=True, nogil=True)
def _scatter_rows(buf, at, lo, got, first, src, rows, dest):  # pragma: no cover - compiled
    """Rows of spans read into ``buf`` (span s at ``at[s]``, ``got[s]`` bytes) copied to
    their batch rows; returns the first span that failed or ended before a row, else -1."""
    width = dest.shape[1]
    for s in range(lo.shape[0]):
        if got[s] < 0:
            return s
        for j in range(first[s], first[s + 1]):
            off = src[j] - lo[s]
            if off + width > got[s]:
                return s
            dest[rows[j], :] = buf[at[s] + off : at[s] + off + width]
    return -1


_HOLD = 16  # descriptors one thread holds at a time (one sample per file)
# Page reads one thread keeps in flight under O_DIRECT (PageGather through solar.io.aio): the
# disk here gives 52k 4 KiB reads/s at queue depth 8, 79k at 32 (solar/io/probe.py).
QUEUE_DEPTH = 32
CORES = cores()
_NONE = np.zeros(0, np.int64)  # _iov_runs' ``cached``: not a buffered read
_JOB_BYTES = 512 * 2**10  # stored chunk bytes worth a pool job of their own (see job_count)


class JobResult(NamedTuple):
    """What one pool job reports: bytes moved, seconds busy (from its start to its end, waits
    for ``after``/``settled`` included), of which seconds decoding chunks."""

    nbytes: int
    busy: float
    decode: float = 0.0


class StepIO(NamedTuple):
    """A step's storage reads, summed over its jobs (:func:`step_io`)."""

    nbytes: int
    busy: float  # reader threads' busy seconds, decoding included
    decode: float  # of which decoding chunks
    longest: float  # the longest job: the step's read latency had its jobs not queued


class Executor:
    """Runs read (and tier write) tasks on ``threads`` threads; its pools are per process.

    :meth:`resize` changes the thread counts while reads are in flight (the tuner's knob,
    solar/tune.py): later jobs go to a pool of the new size; the old pool finishes the jobs
    it was given, then its threads end.
    """

    def __init__(self, threads: int, decode_threads: int | None = None) -> None:
        if threads < 1:
            raise SolarError(f"executor: threads must be >= 1, got {threads}")
        self.threads = threads
        self._decode_threads = decode_threads
        # Pools are swapped (resize) while other threads submit. (Per process: pickles.)
        self._lock: ProcessLocal[threading.Lock] = ProcessLocal(threading.Lock)
        self._pools: ProcessLocal[dict[int, ThreadPoolExecutor]] = ProcessLocal(dict)
        # Bounce buffers per thread. A ProcessLocal although threads never survive a fork: it
        # is what lets an Executor (inside a Reader) pickle for spawn.
        self._local: ProcessLocal[threading.local] = ProcessLocal(threading.local)

    @property
    def decode_threads(self) -> int:
        """Threads for jobs that decode advised chunk reads (:func:`decodes`): as set by
        :meth:`resize`, else one per core at most."""
        given = self._decode_threads
        return min(self.threads, CORES) if given is None else given

    def _size(self, decoding: bool) -> int:
        return self.decode_threads if decoding else self.threads

    def pool(self, decoding: bool = False) -> ThreadPoolExecutor:
        """The pool of ``threads`` threads; ``decoding``: the pool for jobs that decode
        advised chunk reads (see :func:`decodes`), ``decode_threads`` (one per core at most)."""
        pools = self._pools.get()
        size = self._size(decoding)
        if size not in pools:
            name = "solar-decode" if decoding else "solar-read"
            pools[size] = ThreadPoolExecutor(size, thread_name_prefix=name)
        return pools[size]

    def resize(self, threads: int | None = None, decode_threads: int | None = None) -> None:
        """Use ``threads`` reader threads (and ``decode_threads`` decoding ones) for the jobs
        started from now on. Safe with jobs in flight: a pool no longer used is shut down
        without waiting, so it still runs every job queued on it (a later job waiting for
        one of them, ``after``, cannot deadlock) and its threads end when it is empty."""
        with self._lock.get():
            if threads is not None:
                if threads < 1:
                    raise SolarError(f"executor: threads must be >= 1, got {threads}")
                self.threads = threads
            if decode_threads is not None:
                if decode_threads < 1:
                    raise SolarError(f"executor: decode threads must be >= 1, got {decode_threads}")
                self._decode_threads = decode_threads
            pools = self._pools.here()
            if not pools:
                return
            for size in [s for s in pools if s not in (self.threads, self.decode_threads)]:
                pools.pop(size).shutdown(wait=False)

    def start(
        self,
        source: ByteSource,
        tasks: Sequence[Task],
        after: Collection[Future] = (),
        settled: Collection[Future] = (),
    ) -> list[Future]:
        """Hand tasks to the pool as jobs, each job's advice built first (so that nothing can
        raise once a job runs); every job first waits for the futures ``after`` (their error
        is its own) and for ``settled`` to end (their outcome is not its business). Each
        future's result is ``(bytes moved, seconds busy)``."""
        if not tasks:
            return []
        decoding, cached = decodes(tasks, source.direct_io), tries_cache(tasks, source)
        jobs = deal(tasks, job_count(tasks, self._size(decoding), decoding, cached))
        if cached:
            jobs = [joined(job) for job in jobs]
        advice = [self._advice(source, job) for job in jobs]
        for a in advice:
            if a is not None:
                a.advise(0)  # the first window now: its fetch starts while the job queues
        with self._lock.get():  # not a pool that resize shuts down meanwhile
            pool = self.pool(decoding)
            return [
                pool.submit(self._job, source, job, a, after, settled)
                for job, a in zip(jobs, advice, strict=True)
            ]

    def run_here(self, source: ByteSource, tasks: Sequence[Task]) -> int | None:
        """Run ``tasks`` on this thread when they are one job's worth (a few small chunks:
        decoding them here beats a pool handoff, ~0.5 ms, more than a zstd decode); returns
        the bytes read, or None when they are worth several jobs."""
        if not tasks:
            return None
        decoding = decodes(tasks, source.direct_io)
        if job_count(tasks, self._size(decoding), decoding, tries_cache(tasks, source)) != 1:
            return None
        return self._job(source, tasks, self._advice(source, tasks, more_than=1))[0]

    def _advice(
        self, source: ByteSource, tasks: Sequence[Task], more_than: int = 0
    ) -> Advice | None:
        # None with O_DIRECT: it bypasses the page cache that advice fills.
        return None if source.direct_io else Advice.for_job(source.fd, tasks, more_than)

    def _job(
        self,
        source: ByteSource,
        tasks: Sequence[Task],
        advice: Advice | None,
        after: Collection[Future] = (),
        settled: Collection[Future] = (),
    ) -> JobResult:
        t0 = time.perf_counter()
        for f in after:
            f.result()  # e.g. the tier slot's write must be on disk; its error is ours too
        wait(settled)  # e.g. the old content of the slot this job writes has been read
        local = self._local.get()
        local.decode = 0.0  # _read_chunks adds its decoding time
        total = sum(self._run(source, t, advice) for t in tasks)
        return JobResult(total, time.perf_counter() - t0, local.decode)

    def warm_up(self) -> None:
        """Compile (or load from numba's cache) the preadv/pwritev kernel and its runs' byte
        count now, not at the first read that needs them, maybe inside an epoch."""
        # Runs come as contiguous slices (numba's layout 'C', tasks.deal_runs): each kernel
        # once, a bad descriptor's failed call (nothing read).
        iov = np.zeros((2, 2), np.uint64)
        got = np.zeros(2, np.int64)
        starts, counts, offsets = np.zeros((3, 2), np.int64)
        _iov_runs(-1, iov, starts, counts, offsets, False, got, _NONE)
        PreadvRuns(-1, iov, starts, counts, offsets).want()
        aio.warm_up()

    def close(self) -> None:
        """Stop this process's pools (after the jobs queued)."""
        for pool in (self._pools.drop() or {}).values():
            pool.shutdown(wait=True)

    # -- the one place a task's bytes move -----------------------------------------------------
    def _run(self, source: ByteSource, task: Task, advice: Advice | None) -> int:
        """Execute one task: the one place a sample's bytes are read, whatever the source."""
        match task:
            case PreadvRuns():
                nbytes = self._iov_runs(source, task)
            case BounceRun():
                nbytes = self._bounce(source, task)
            case PageGather():
                nbytes = self._gather(source, task)
            case FileRuns():
                assert isinstance(source, Files)
                nbytes = self._file_runs(source, task)
            case H5Rows():
                assert isinstance(source, Files)
                nbytes = _read_h5(source, task)
            case ChunkReads():
                assert isinstance(source, Files)
                nbytes = self._read_chunks(source, task, advice)
            case _:
                assert_never(task)
        if source.throttle is not None:
            source.throttle.wait(nbytes, task.requests)
        return nbytes

    def _iov_runs(self, source: ByteSource, t: PreadvRuns) -> int:
        got = np.empty(t.starts.size, np.int64)
        want = t.want()
        cached = want if source.cache_first and not t.write else _NONE
        with source.fd(t.file) as fd:
            _iov_runs(fd, t.iov, t.starts, t.counts, t.offsets, t.write, got, cached)
            for j in np.flatnonzero(got != want).tolist():
                # Once more in Python: finishes an interrupted call, or names the problem.
                a, n = int(t.starts[j]), int(t.counts[j])
                _retry(source, t.file, fd, t.iov[a : a + n], int(t.offsets[j]), t.write)
            if t.drop:
                for off, n in zip(t.offsets.tolist(), want.tolist(), strict=True):
                    drop(fd, off, n)
        return int(want.sum())

    def _bounce(self, source: ByteSource, t: BounceRun) -> int:
        want = t.stride * t.rows.size
        lo = t.offset - t.offset % PAGE
        hi = -(-(t.offset + want) // PAGE) * PAGE
        bounce = thread_buffer(self._local.get(), hi - lo)
        with source.fd(t.file) as fd:
            try:
                got = os.preadv(fd, [bounce[: hi - lo].data], lo)
                if got < t.offset + want - lo:  # once more: an interrupted read is no error
                    got = os.preadv(fd, [bounce[: hi - lo].data], lo)
            except OSError as exc:
                raise source.io_error(t.file, t.offset, exc) from None
        if got < t.offset + want - lo:
            raise source.short_transfer(
                t.file, t.offset, want, max(0, got - (t.offset - lo)), False
            )
        records = bounce[t.offset - lo : t.offset - lo + want].reshape(t.rows.size, t.stride)
        for d, at in zip(t.dests, t.fields, strict=True):
            d[t.rows] = records[:, at : at + d.shape[1]]
        return want

    def _gather(self, source: ByteSource, t: PageGather) -> int:
        """A PageGather: its spans read by native AIO, QUEUE_DEPTH in flight (else the preadv
        kernel, one call per span), windows of spans ending within each GATHER_WINDOW bytes
        at a time into this thread's bounce buffer, its rows copied out by one compiled call
        per window (cached: a new process compiles nothing for it)."""
        ends = np.cumsum(t.size)
        cuts = np.arange(1, -(-int(ends[-1]) // GATHER_WINDOW) + 1) * GATHER_WINDOW
        # A window: the spans ending in ((k - 1)·W, k·W], at most W + SPAN_MAX bytes.
        local = self._local.get()
        bounce = thread_buffer(local, GATHER_WINDOW + SPAN_MAX)
        # Under O_DIRECT, QUEUE_DEPTH spans in flight from this thread (solar.io.aio): the
        # device's random-read rate needs a deeper queue than one read per thread.
        ctx = aio.thread_context(local, QUEUE_DEPTH) if source.direct_io else None
        a = 0
        with source.fd(t.file) as fd:
            for b in np.searchsorted(ends, cuts, side="right").tolist():
                if b <= a:
                    continue
                size = t.size[a:b]
                at = np.concatenate([[0], np.cumsum(size)])
                iov = np.empty((b - a, 2), np.uint64)
                iov[:, 0] = bounce.ctypes.data + at[:-1].astype(np.uint64)
                iov[:, 1] = size
                got = np.empty(b - a, np.int64)
                if ctx is None or aio.read_spans(ctx.handle, fd, bounce, at[:-1], t.lo[a:b],
                                                 size, got, QUEUE_DEPTH) < 0:  # fmt: skip
                    if ctx is not None:  # the kernel stopped midway: preadv from now on
                        ctx = local.aio = None
                    spans = np.arange(b - a)
                    _iov_runs(fd, iov, spans, np.ones(b - a, np.int64), t.lo[a:b], False, got,
                              _NONE)  # fmt: skip
                s, again = 0, -1  # spans before s are scattered; the span read again
                while True:
                    bad = _scatter_rows(bounce, at[s:], t.lo[a + s : b], got[s:],
                                        t.first[a + s : b + 1], t.src, t.rows, t.dest)  # fmt: skip
                    if bad < 0:
                        break
                    s += bad
                    lo, want = int(t.lo[a + s]), int(size[s])
                    if again == s:  # read again, and still short of a row: the file is
                        raise source.short_transfer(t.file, lo, want, int(got[s]), False)
                    # Once more in Python, into its place: finishes an interrupted read (a
                    # transient error is no error), or names the error.
                    again = s
                    try:
                        got[s] = os.preadv(fd, [bounce[at[s] : at[s] + want].data], lo)
                    except OSError as exc:
                        raise source.io_error(t.file, lo, exc) from None
                a = b
        return int(t.size.sum())

    def _file_runs(self, source: Files, t: FileRuns) -> int:
        """One read per (file, key); a file's keys, neighbours in the task, share one open.

        More files than the descriptor cache holds (``source.streams``): a compiled loop
        opens, reads and closes them, ``_HOLD`` at a time per thread. Fewer: the cache keeps
        them all open, and later epochs open nothing.
        """
        got = np.empty(t.files.size, np.int64)
        if source.streams:
            names, name_at = source.names
            # Open at most the cache's share per thread: the same bound on descriptors.
            hold = max(1, min(_HOLD, source.fds.capacity // max(1, self.threads)))
            table = source.identities.table
            _open_read_close(names, name_at, t.files, t.iov, t.offsets, got, hold, table)
        else:
            _cached_file_runs(source, t, got)
        want = t.iov[:, 1].astype(np.int64)
        for j in np.flatnonzero(got != want).tolist():
            # Once more in Python: finishes an interrupted read, or names the short file.
            f = int(t.files[j])
            with source.fd(f) as fd:
                _retry(source, f, fd, t.iov[j : j + 1], int(t.offsets[j]), False)
        return int(want.sum())

    def _read_chunks(self, source: Files, t: ChunkReads, advice: Advice | None) -> int:
        """pread a task's chunks (one call per run stored back to back), decode each without
        the GIL and scatter it into its rows; returns the stored bytes read."""
        index, decoder, plan = t.source.index, t.source.decoder, t.plan
        if t.fill:
            fill_absent(index, plan, t.out, t.rows)
        if t.chunks.size == 0:
            return 0
        sp = t.spans
        local = self._local.get()
        buf = thread_buffer(local, int(sp.at[-1]))
        if t.into_rows and t.source.fused is not None and not sp.masked:
            need = sp.hi - sp.lo
            with source.fd(t.file) as fd:
                for first, end in windows(need, Advice.WINDOW):
                    if advice is not None:
                        advice.advise(int(need[first:end].sum()))
                    # The fused kernel reads (pages advised ahead) and decodes run by run:
                    # its time is counted as decoding.
                    t0 = time.perf_counter()
                    failed = read_fused(t.source.fused, fd, buf, t, first, end)
                    _add_decode(local, time.perf_counter() - t0)
                    if failed:
                        break  # a short read or a corrupt chunk: the general path says which
                else:
                    return int(sp.sizes.sum())
        lo, hi, at = sp.lo.tolist(), sp.hi.tolist(), sp.at.tolist()
        with source.fd(t.file) as fd:
            for r in range(len(lo)):
                if advice is not None:
                    advice.advise(hi[r] - lo[r])
                view = buf[at[r] : at[r + 1]].data
                try:
                    got = os.preadv(fd, [view], lo[r])
                    if got < hi[r] - lo[r]:  # once more: an interrupted read is no error
                        got = os.preadv(fd, [view], lo[r])
                except OSError as exc:
                    raise source.io_error(t.file, lo[r], exc) from None
                if got < hi[r] - lo[r]:
                    path = source.h5_paths[t.file]
                    size = os.path.getsize(path)
                    raise truncated(path, f"a chunk of {index.name!r}", hi[r], size)
        view = buf.data
        starts, sizes = sp.starts.tolist(), sp.sizes.tolist()
        t0 = time.perf_counter()
        for j, k in enumerate(t.chunks.tolist()):  # one decode call per chunk: the work itself
            raw = view[starts[j] : starts[j] + sizes[j]]
            decode_chunk(index, decoder, plan, k, raw, t.out, t.rows, into_rows=t.into_rows)
        _add_decode(local, time.perf_counter() - t0)
        return int(sp.sizes.sum())


def _add_decode(local: threading.local, seconds: float) -> None:
    """Add decoding time to this thread's job (none outside a pool job: run_here)."""
    local.decode = getattr(local, "decode", 0.0) + seconds


def _retry(source: ByteSource, i: int, fd: int, iov: np.ndarray, offset: int, write: bool) -> None:
    """One run again through ``os.preadv``/``os.pwritev`` over the same memory: an error or a
    short transfer now is the source's to name."""
    buffers = [(ctypes.c_char * int(n)).from_address(int(a)) for a, n in iov.tolist()]
    want = int(iov[:, 1].sum())
    try:
        got = os.pwritev(fd, buffers, offset) if write else os.preadv(fd, buffers, offset)
    except OSError as exc:
        raise source.io_error(i, offset, exc) from None
    if got != want:
        raise source.short_transfer(i, offset, want, got, write)


def _cached_file_runs(source: Files, t: FileRuns, got: np.ndarray) -> None:
    """FileRuns through the descriptor cache, ``_HOLD`` files held at a time."""
    files = t.files.tolist()
    a = 0
    while a < len(files):
        held = list(dict.fromkeys(files[a : a + _HOLD]))  # unique, in order
        b = a + _HOLD
        while b < len(files) and files[b] == files[b - 1]:
            b += 1  # never split a file's keys over two windows
        fds = dict(zip(held, source.fds.acquire(held), strict=True))
        try:
            window = np.array([fds[f] for f in files[a:b]], np.int64)
            _advise_preadv_each(window, t.iov[a:b], t.offsets[a:b], got[a:b])
            # Read from the files opened, not others since: a mismatch is named (or, if the
            # compiled check was too strict, passed) by the Python one.
            ids = source.identities
            bad = _same_files(np.array([fds[f] for f in held], np.int64),
                              np.array(held, np.int64), ids.table)  # fmt: skip
            if bad >= 0:
                ids.check_fd(held[bad], fds[held[bad]])
        finally:
            source.fds.release(held)
        a = b


def _read_h5(source: Files, task: H5Rows) -> int:
    """Through h5py: each chunk (along the first dimension) once, or just the wanted rows."""
    f, k, local, rows, out = task.file, task.key, task.local, task.rows, task.out
    info = source.info
    row_bytes = info.keys[k].row_bytes
    path = info.files[f]
    try:
        with source.h5_lock:  # h5py serialises anyway; keep one reader in it at a time
            dset = source.h5file(f)[info.keys[k].name]
            if task.whole:  # one sample per file: the whole dataset
                out[rows] = dset[()]
                source.check_h5(f, source.h5file(f))
                return int(local.size) * row_bytes
            if task.chunk_rows == 0:
                wanted, where = np.unique(local, return_inverse=True)
                out[rows] = dset[wanted][where]
                source.check_h5(f, source.h5file(f))
                return int(local.size) * row_bytes
            size = os.path.getsize(path)
            chunk = local // task.chunk_rows
            for c in np.unique(chunk):
                sel = chunk == c
                lo = int(c) * task.chunk_rows
                _check_chunk(dset, lo, size, path)
                block = dset[lo : min(lo + task.chunk_rows, info.lengths[f])]
                out[rows[sel]] = block[local[sel] - lo]
            source.check_h5(f, source.h5file(f))
    except OSError as exc:
        raise SolarError(f"{path}: read error, truncated or corrupt ({exc})") from None
    return int(local.size) * row_bytes


def _check_chunk(dset: h5py.Dataset, lo: int, file_size: int, path) -> None:
    """HDF5 returns fill values for a chunk past the end of a truncated file: refuse instead."""
    axes = [range(0, n, c) for n, c in zip(dset.shape[1:], dset.chunks[1:], strict=True)]
    for rest in itertools.product(*axes):
        info = dset.id.get_chunk_info_by_coord((lo, *rest))
        if info.byte_offset is not None and info.byte_offset + info.size > file_size:
            end = info.byte_offset + info.size
            raise truncated(path, f"a chunk of {dset.name!r}", end, file_size)


def wait_all(futures: Sequence[Future]) -> tuple[int, float]:
    """(bytes, busy seconds) of task futures; raise the first error once *all* have ended,
    so that no thread is still writing into memory the caller reuses."""
    wait(futures)
    return combine(futures)


def step_io(futures: Sequence[Future]) -> StepIO:
    """A step's storage read futures (all ended) summed: bytes, busy and decoding seconds,
    and its longest job; the first error (or cancellation) of any is raised."""
    results = [f.result() for f in futures]
    return StepIO(
        sum(r[0] for r in results), sum(r[1] for r in results),
        sum(r[2] for r in results), max((r[1] for r in results), default=0.0),
    )  # fmt: skip


def combine(futures: Sequence[Future]) -> tuple[int, float]:
    """(bytes, busy seconds) summed over futures that have all ended; the first error (or
    cancellation) of any is raised."""
    results = [f.result() for f in futures]  # the first error (or cancellation) raises
    return sum(r[0] for r in results), sum(r[1] for r in results)


def when_all(futures: Sequence[Future], fn: Callable[[], object]) -> None:
    """Call ``fn()`` once every future has ended (now, if there are none), on the thread
    that ends the last one: no thread waits for it."""
    left = [len(futures)]
    lock = threading.Lock()

    def one_done(_: Future) -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            fn()

    if not futures:
        fn()
    for f in futures:
        f.add_done_callback(one_done)


def job_count(tasks: Sequence[Task], threads: int, decoding: bool, cached: bool = False) -> int:
    """Pool jobs for a step's tasks on a pool of ``threads``: one per thread, except for
    chunk reads too small to share (a job's handoff costs about as much as decoding a few
    hundred KiB of zstd), and at most one per core for decoding jobs (:func:`decodes`) and
    for reads that try the page cache first (``cached``: :func:`tries_cache`)."""
    if cached:
        return min(threads, CORES)
    if not all(isinstance(t, ChunkReads) for t in tasks):
        return threads
    work = sum(t.stored_bytes for t in tasks if isinstance(t, ChunkReads))
    return max(1, min(min(threads, CORES) if decoding else threads, -(-work // _JOB_BYTES)))


def decodes(tasks: Sequence[Task], direct_io: bool) -> bool:
    """Whether a step's tasks all decode chunk reads advised to the kernel.

    Their fetches are in flight however few threads wait, so such jobs run on one thread per
    core: more decoding threads than cores only fight over the CPU and the GIL, and delay the
    consuming thread. Measured, 2 cores: a step's jobs, zstd batches cold, 1.36x faster; the
    jobs of steps read ahead, gzip single samples warm, ~15 % faster on 2 threads than on 8.
    """
    return not direct_io and all(isinstance(t, ChunkReads) for t in tasks)


def tries_cache(tasks: Sequence[Task], source: ByteSource) -> bool:
    """Whether a step's tasks all read runs that :func:`_iov_runs` tries from the page cache
    first (``source.cache_first``, not written): a miss's fetch starts as it is tried, so a
    job's fetches are in flight however few threads wait, and hits are copies, CPU-bound:
    such jobs run one per core (more only fight over the cores and the GIL: measured, a GNN
    loader's epochs from the page cache, 2 cores, 8 jobs a step cost up to ~12 % more CPU
    than 2; docs/performance.md)."""
    return source.cache_first and bool(tasks) and \
        all(isinstance(t, PreadvRuns) and not t.write for t in tasks)  # fmt: skip


def joined(job: Sequence[Task]) -> list[Task]:
    """A job's runs (:func:`tries_cache`'s PreadvRuns) as one task per file and iovec table:
    one compiled call and one GIL round trip each, not one per task dealt (a step's runs are
    dealt over a task per thread, its jobs are one per core)."""
    tables: dict[tuple[int, int], list[PreadvRuns]] = {}
    for t in job:
        assert isinstance(t, PreadvRuns) and not (t.write or t.drop)  # (reads only: kept as is)
        tables.setdefault((t.file, id(t.iov)), []).append(t)
    out: list[Task] = []
    for ts in tables.values():
        if len(ts) == 1:
            out.append(ts[0])
            continue
        starts, counts, offsets = (np.concatenate([getattr(t, f) for t in ts])
                                   for f in ("starts", "counts", "offsets"))  # fmt: skip
        out.append(PreadvRuns(ts[0].file, ts[0].iov, starts, counts, offsets))
    return out


def deal(tasks: Sequence[Task], groups: int) -> list[list[Task]]:
    """Deal tasks round-robin into at most ``groups`` lists (one pool job each)."""
    groups = min(groups, len(tasks))
    return [list(tasks[g::groups]) for g in range(groups)] if groups else []

"""The HDF5 sample reader: where a sample's bytes are read from storage.

Contiguous, uncompressed, native-endian datasets are read with ``os.preadv`` at computed byte
offsets straight into the destination rows (no intermediate copy); runs of adjacent samples are
one call, and calls run on a thread pool (``preadv`` releases the GIL; h5py would serialise).
With ``direct_io`` the reads use ``O_DIRECT`` through page-aligned bounce buffers, so the page
cache is bypassed. Chunked datasets whose filters solar decodes (``solar.io.codecs``) are read
chunk by chunk: ``pread`` of the stored bytes (chunks stored back to back are one call), decoding
without the GIL on the reader's threads, and a scatter into the destination rows (or decoding
straight into them). Other chunked, compressed or non-native datasets are read through h5py,
each chunk once per request. Files, and chunk indexes, are opened lazily in the process that
reads, so a reader survives fork and spawn. Descriptors are cached per process, least recently
used closed beyond half the RLIMIT_NOFILE soft limit (:class:`FdCache`). One-sample files (HDF5
or ``.npy``, served by offset like any contiguous dataset) are read one open per file for all
its keys; when there are more of them than the cache holds (a million files), a compiled loop
opens, announces, reads and closes a few at a time per thread instead, within the same bound.

What to read is decided by :func:`solar.io.tasks.plan_reads` (pure); this module executes the
tasks it returns, one ``case`` per task type in :meth:`Reader._run`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import itertools
import os
import resource
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import h5py
import numpy as np
from numba import njit

from solar._memory import PAGE, thread_buffer
from solar.config import ReaderConfig
from solar.errors import SolarError
from solar.io import libc
from solar.io.chunks import ChunkIndex, chunk_index, fill_absent, scatter_chunk
from solar.io.codecs import Decoder, decoder_for
from solar.io.fused import fused_codec, read_fused, windows
from solar.io.hdf5 import DatasetInfo, open_h5
from solar.io.tasks import (
    ChunkReads,
    ChunkSource,
    DirectRun,
    FileLayouts,
    FileRuns,
    H5Rows,
    PreadvRuns,
    ReadTask,
    plan_reads,
)


@njit(nogil=True)  # not cached: it embeds the address of libc's preadv
def _preadv_runs(fd, iov, starts, counts, offsets, got):
    """One preadv per run of one file, without the GIL."""
    for j in range(starts.shape[0]):
        got[j] = libc.preadv(fd, iov.ctypes.data + 16 * starts[j], counts[j], offsets[j])


@njit(nogil=True)  # not cached: it embeds the addresses of libc's functions
def _advise_preadv_each(fds, iov, offsets, got):
    """Read j: ``iov[j, 1]`` bytes at ``offsets[j]`` of ``fds[j]``, without the GIL (``got``
    -1 where ``fds[j]`` < 0: a file that did not open). Every read is announced first
    (WILLNEED), so all are in flight at once rather than one at a time: small files are
    bound by latency, not bandwidth."""
    n = fds.shape[0]
    if n > 1:
        for j in range(n):
            if fds[j] >= 0:
                libc.fadvise(
                    fds[j], offsets[j], iov[j, 1], libc.WILLNEED
                )  # a hint: errors are moot
    for j in range(n):
        got[j] = -1 if fds[j] < 0 else libc.preadv(fds[j], iov.ctypes.data + 16 * j, 1, offsets[j])


@njit(nogil=True)  # not cached: it embeds the addresses of libc's functions
def _open_read_close(names, name_at, files, iov, offsets, got, hold):
    """FileRuns without the descriptor cache: open ``hold`` files at a time (a file's
    neighbouring reads share one open), announce every read (WILLNEED), read, close; all
    without the GIL. ``names[name_at[f]:]`` is path f, NUL-terminated. A read whose file
    did not open gets ``got`` -1 (the caller retries it through the cache, which raises)."""
    n = files.shape[0]
    fds = np.empty(n, np.int64)
    a = 0
    while a < n:
        b = a
        opened = 0
        while b < n and (opened < hold or files[b] == files[b - 1]):
            if b > a and files[b] == files[b - 1]:
                fds[b] = fds[b - 1]
            else:
                fds[b] = libc.open_file(names.ctypes.data + name_at[files[b]], libc.O_READ)
                opened += 1
            b += 1
        _advise_preadv_each(fds[a:b], iov[a:b], offsets[a:b], got[a:b])
        for j in range(a, b):
            if fds[j] >= 0 and (j == b - 1 or files[j + 1] != files[j]):
                libc.close(fds[j])
        a = b


_HOLD = 16  # descriptors one thread holds at a time (one sample per file)


class Reader:
    """Reads samples (global ids over the concatenated files) into rows of numpy arrays."""

    def __init__(
        self, info: DatasetInfo, config: ReaderConfig | None = None, throttle: Any = None
    ) -> None:
        config = config or ReaderConfig()
        self.info = info
        self.threads = config.threads
        self.direct_io = config.direct_io
        self.decode_chunks = config.decode_chunks
        self.throttle = throttle  # solar.io.throttle.Throttle: an emulated remote file system
        self._starts = np.concatenate([[0], np.cumsum(info.lengths)]).astype(np.int64)
        # Descriptors are opened per path: a .npy key's files follow the previous key's.
        self._paths = info.all_files
        self._layouts = self._stored_layouts(info)
        self._decoded = self._layouts.decoded_count  # once: a sum over every (file, key)
        self._pid = -1
        self._local = threading.local()

    def _stored_layouts(self, info: DatasetInfo) -> FileLayouts:
        """Layouts from what ``describe`` recorded: no file is opened again."""
        if info.stored is None:
            raise SolarError("reader: the dataset description lacks its storage layout")
        st = info.stored
        paths = None
        if info.key_files:
            n = len(info.files)
            paths = np.arange(len(info.keys), dtype=np.int64)[None, :] * n + np.arange(n)[:, None]
        return FileLayouts(
            st.offsets, tuple(k.row_bytes for k in info.keys), st.chunk_rows,
            st.decodable & self.decode_chunks, paths, info.one_per_file,
        )  # fmt: skip

    # -- per-process state: descriptors, h5py handles and the pool are never inherited --------
    def _state(self) -> None:
        if self._pid != os.getpid():
            self._pid = os.getpid()
            # The opener must not hold self: the finalizer below keeps it alive.
            opener = functools.partial(_open_fd, self._paths, self.direct_io)
            self._fds = FdCache(fd_capacity(), opener)
            self._h5 = _H5Cache(max(4, min(64, self._fds.capacity // 4)))
            self._sources: dict[tuple[int, int], ChunkSource] = {}
            self._h5_lock = threading.Lock()
            self._pools: dict[int, ThreadPoolExecutor] = {}
            self._local = threading.local()
            # A reader dropped without close() must not keep its descriptors open.
            weakref.finalize(self, _close_all, self._fds, self._h5)

    def _fd(self, path_index: int) -> contextlib.AbstractContextManager[int]:
        """The descriptor of ``self._paths[path_index]``, held open while the block runs."""
        return self._fds.use(path_index)

    def _h5file(self, file_index: int) -> h5py.File:
        """An h5py handle of file ``file_index`` (call with ``_h5_lock`` held)."""
        f = self._h5.get(file_index)
        if f is None:
            f = open_h5(self.info.files[file_index])
            self._h5.put(file_index, f)
        return f

    def pool(self, decoding: bool = False) -> ThreadPoolExecutor:
        """The pool of ``threads`` threads; ``decoding``: the pool for jobs that decode
        announced chunk reads (see ``_decodes``), one thread per core at most."""
        self._state()
        size = min(self.threads, _CORES) if decoding else self.threads
        if size not in self._pools:
            name = "solar-decode" if decoding else "solar-read"
            self._pools[size] = ThreadPoolExecutor(size, thread_name_prefix=name)
        return self._pools[size]

    def warm_up(self) -> None:
        """Compile the read kernel and open the files: one read of sample 0, discarded."""
        if self._starts[-1] == 0:
            return
        out = [np.empty((1, *k.sample_shape), k.native_dtype) for k in self.info.keys]
        self.read(np.zeros(1, np.int64), out)

    def close(self) -> None:
        """Close descriptors, h5py handles and the pool of this process."""
        if self._pid != os.getpid():
            return
        for pool in self._pools.values():
            pool.shutdown(wait=True)
        self._pools = {}
        _close_all(self._fds, self._h5)

    def __getstate__(self) -> dict:
        keep = ("info", "threads", "direct_io", "decode_chunks", "throttle")
        state = {k: v for k, v in self.__dict__.items() if k in keep}
        state.update(
            _starts=self._starts, _layouts=self._layouts, _decoded=self._decoded, _pid=-1,
            _paths=self._paths,
        )  # fmt: skip
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    # -- reading ---------------------------------------------------------------------------
    def submit(self, samples: np.ndarray, out: list[np.ndarray], rows: np.ndarray) -> list[Future]:
        """Start reading ``samples[j]`` into ``out[key][rows[j]]`` for every key; returns futures.

        Each future's result is ``(bytes read, seconds busy)``.
        """
        return self._start(self._tasks(samples, out, rows))

    def _start(self, tasks: list[ReadTask]) -> list[Future]:
        """Hand a step's tasks to the pool as jobs, every job's hints announced first (so
        that nothing can raise once a job runs)."""
        if not tasks:
            return []
        pool = self.pool(_decodes(tasks, self))
        jobs = _balance(tasks, _jobs(tasks, self))
        hints = [self._announce(job) for job in jobs]
        return [pool.submit(_timed, self, j, a) for j, a in zip(jobs, hints, strict=True)]

    def _tasks(self, samples: np.ndarray, out: list[np.ndarray], rows: np.ndarray) -> list:
        self._state()
        return plan_reads(
            self._layouts, self._starts, samples, out, rows,
            direct_io=self.direct_io, groups=self.threads, chunks=self._chunk_sources(samples),
        )  # fmt: skip

    def _chunk_sources(self, samples: np.ndarray) -> dict[tuple[int, int], ChunkSource]:
        """The chunk indexes and decoders of the decoded keys of the files ``samples`` touch,
        built once per (file, key) in this process (an index costs a walk of the file's
        chunk B-tree, so only files actually read pay it)."""
        if len(self._sources) == self._decoded:
            return self._sources  # every one built already (or none to build)
        decoded = self._layouts.decoded  # (files, keys) bool
        ids = np.asarray(samples, np.int64)
        files = np.unique(np.searchsorted(self._starts, ids, side="right") - 1)
        files = files[(files >= 0) & (files < decoded.shape[0])]
        for f, k in zip(*np.nonzero(decoded[files]), strict=True):
            key = (int(files[f]), int(k))
            if key not in self._sources:
                self._sources[key] = self._chunk_source(*key)
        return self._sources

    def _chunk_source(self, f: int, k: int) -> ChunkSource:
        path = self.info.files[f]
        try:
            with self._h5_lock:
                dset = self._h5file(f)[self.info.keys[k].name]
                index, decoder = chunk_index(dset), decoder_for(dset)
        except OSError as exc:
            raise SolarError(f"{path}: cannot read the chunk index ({exc})") from None
        if not isinstance(decoder, Decoder):  # decided when the reader was built
            raise SolarError(f"{path}: key {self.info.keys[k].name!r}: {decoder.reason}")
        if self.info.one_per_file:
            index, decoder = lift_one_sample(index, decoder)
        return ChunkSource(index, decoder, fused_codec(decoder))

    def read(
        self, samples: np.ndarray, out: list[np.ndarray], rows: np.ndarray | None = None
    ) -> int:
        """Blocking :meth:`submit`; returns the bytes read."""
        rows = np.arange(len(samples)) if rows is None else rows
        tasks = self._tasks(samples, out, rows)
        if tasks and _jobs(tasks, self) == 1:
            # A few small chunks: decoding them here beats handing them to a pool thread
            # (measured: ~0.5 ms of handoff per single-sample read, more than a zstd decode).
            return _timed(self, tasks, self._hints(tasks, more_than=1))[0]
        return wait_all(self._start(tasks))[0]

    def _run(self, task: ReadTask) -> int:
        """Execute one task: the one place a sample's bytes are read from storage."""
        match task:
            case PreadvRuns():
                nbytes = self._preadv_task(task)
            case FileRuns():
                nbytes = self._file_runs(task)
            case DirectRun():
                nbytes = self._pread_direct(task.file, task.offset, task.dest, task.rows.tolist())
            case H5Rows():
                nbytes = self._read_h5(task)
            case ChunkReads():
                nbytes = self._read_chunks(task)
        if self.throttle is not None:
            self.throttle.wait(nbytes, task.requests)
        return nbytes

    def _preadv_task(self, t: PreadvRuns) -> int:
        got = np.empty(t.starts.size, np.int64)
        with self._fd(t.file) as fd:
            _preadv_runs(fd, t.iov, t.starts, t.counts, t.offsets, got)
        want = t.counts * t.dest.shape[1]
        for j in np.flatnonzero(got != want):
            # Retry in Python: finishes an interrupted read, or names the short file.
            a = t.starts[j]
            self._pread(t.file, int(t.offsets[j]), t.dest, t.rows[a : a + t.counts[j]].tolist())
        return int(want.sum())

    def _file_runs(self, t: FileRuns) -> int:
        """One read per (file, key); a file's keys, neighbours in the task, share one open.

        More files than the descriptor cache holds (``streams_files``): an LRU cache over an
        epoch's random order would miss almost always and only add Python and a lock per
        file, so a compiled loop opens, reads and closes them, ``_HOLD`` at a time per thread.
        Fewer: the cache keeps them all open, and later epochs open nothing.
        """
        got = np.empty(t.files.size, np.int64)
        if self.streams_files:
            names, name_at = self._names()
            # Open at most the cache's share per thread: the same bound on descriptors.
            hold = max(1, min(_HOLD, self._fds.capacity // max(1, self.threads)))
            _open_read_close(names, name_at, t.files, t.iov, t.offsets, got, hold)
        else:
            self._cached_file_runs(t, got)
        want = t.iov[:, 1].astype(np.int64)
        for j in np.flatnonzero(got != want):
            # Retry in Python: finishes an interrupted read, or names the short file.
            dest = t.dests[int(t.keys[j])]
            self._pread(int(t.files[j]), int(t.offsets[j]), dest, [int(t.rows[j])])
        return int(want.sum())

    @property
    def streams_files(self) -> bool:
        """Whether one-sample files are opened per read rather than kept in the cache."""
        self._state()
        return len(self._paths) > self._fds.capacity

    def _names(self) -> tuple[np.ndarray, np.ndarray]:
        """Every path NUL-terminated in one byte array, and where each starts (built once
        per process, on first use)."""
        names = getattr(self, "_name_bytes", None)
        if names is None:
            encoded = [os.fsencode(p) + b"\0" for p in self._paths]
            at = np.zeros(len(encoded), np.int64)
            at[1:] = np.cumsum([len(e) for e in encoded[:-1]])
            names = self._name_bytes = (np.frombuffer(b"".join(encoded), np.uint8), at)
        return names

    def _cached_file_runs(self, t: FileRuns, got: np.ndarray) -> None:
        """FileRuns through the descriptor cache, ``_HOLD`` files held at a time."""
        files = t.files.tolist()
        a = 0
        while a < len(files):
            held = list(dict.fromkeys(files[a : a + _HOLD]))  # unique, in order
            b = a + _HOLD
            while b < len(files) and files[b] == files[b - 1]:
                b += 1  # never split a file's keys over two windows
            fds = dict(zip(held, self._fds.acquire(held), strict=True))
            try:
                window = np.array([fds[f] for f in files[a:b]], np.int64)
                _advise_preadv_each(window, t.iov[a:b], t.offsets[a:b], got[a:b])
            finally:
                self._fds.release(held)
            a = b

    def _pread(self, f: int, start: int, dest: np.ndarray, rows: list[int]) -> int:
        want = dest.shape[1] * len(rows)
        try:
            with self._fd(f) as fd:
                got = os.preadv(fd, [dest[r] for r in rows], start)
        except OSError as exc:
            raise SolarError(f"{self._paths[f]}: read error ({exc.strerror})") from None
        if got != want:
            # A short read at end of file: the file is shorter than its metadata says.
            self._short_read(f, start, want, got)
        return got

    def _pread_direct(self, f: int, start: int, dest: np.ndarray, rows: list[int]) -> int:
        row_bytes = dest.shape[1]
        want = row_bytes * len(rows)
        lo = start - start % PAGE
        hi = -(-(start + want) // PAGE) * PAGE
        bounce = thread_buffer(self._local, hi - lo)
        with self._fd(f) as fd:
            got = os.preadv(fd, [bounce[: hi - lo].data], lo)
        if got < start + want - lo:
            self._short_read(f, start, want, max(0, got - (start - lo)))
        data = bounce[start - lo : start - lo + want].reshape(len(rows), row_bytes)
        dest[rows] = data
        return want

    def _short_read(self, f: int, start: int, want: int, got: int) -> None:
        raise SolarError(
            f"{self._paths[f]}: short read ({got} of {want} bytes at offset {start}): "
            "the file is truncated or changed since it was opened"
        )

    def _read_chunks(self, t: ChunkReads) -> int:
        """pread a task's chunks (one call per run stored back to back), decode each without
        the GIL and scatter it into its rows; returns the stored bytes read."""
        index, decoder, plan = t.source.index, t.source.decoder, t.plan
        if t.fill:
            fill_absent(index, plan, t.out, t.rows)
        if t.chunks.size == 0:
            return 0
        sp = t.spans
        buf = thread_buffer(self._local, int(sp.at[-1]))
        if t.direct and t.source.fused is not None and not sp.masked:
            need = sp.hi - sp.lo
            with self._fd(t.file) as fd:
                for first, end in windows(need, _ChunkHints.WINDOW):
                    self._read_ahead(int(need[first:end].sum()))
                    if read_fused(t.source.fused, fd, buf, t, first, end):
                        break  # a short read or a corrupt chunk: the general path says which
                else:
                    return int(sp.sizes.sum())
        lo, hi, at = sp.lo.tolist(), sp.hi.tolist(), sp.at.tolist()
        with self._fd(t.file) as fd:
            for r in range(len(lo)):
                self._read_ahead(hi[r] - lo[r])
                try:
                    got = os.preadv(fd, [buf[at[r] : at[r + 1]].data], lo[r])
                except OSError as exc:
                    raise SolarError(
                        f"{self.info.files[t.file]}: read error ({exc.strerror})"
                    ) from None
                if got < hi[r] - lo[r]:
                    self._truncated(t, hi[r])
        view = buf.data
        out, rows = t.out, t.rows
        starts, sizes = sp.starts.tolist(), sp.sizes.tolist()
        for j, k in enumerate(t.chunks.tolist()):  # one decode call per chunk: the work itself
            p = int(sp.positions[j])
            raw = view[starts[j] : starts[j] + sizes[j]]
            if t.direct:
                a, b = int(plan.bounds[k]), int(plan.bounds[k + 1])
                dst = rows[plan.row[a:b]]
                first = int(dst[0])
                decoder.decode(
                    raw, int(index.masks[p]), index.starts[p], out=out[first : first + 1]
                )
                if dst.size > 1:  # the same sample requested again in this step
                    out[dst[1:]] = out[first]
            else:
                chunk = decoder.decode(raw, int(index.masks[p]), index.starts[p])
                scatter_chunk(index, plan, k, chunk, out, rows)
        return int(sp.sizes.sum())

    def _hints(self, tasks: list[ReadTask], more_than: int = 0) -> _ChunkHints | None:
        """Read-ahead hints over a job's chunk runs (see :class:`_ChunkHints`) if it has more
        than ``more_than`` runs; none with O_DIRECT, which bypasses the page cache they fill."""
        runs = [] if self.direct_io else [t for t in tasks if isinstance(t, ChunkReads)]
        return _ChunkHints(self, runs) if sum(t.spans.lo.size for t in runs) > more_than else None

    def _announce(self, tasks: list[ReadTask]) -> _ChunkHints | None:
        """A pool job's hints, the first window announced now: its fetches start while it
        waits for a thread (steps read ahead queue behind the one being decoded)."""
        ahead = self._hints(tasks)
        if ahead is not None:
            ahead.announce(0)
        return ahead

    def _read_ahead(self, upto: int) -> None:
        """Announce this thread's job's runs up to ``upto`` bytes read plus the window."""
        ahead = getattr(self._local, "ahead", None)
        if ahead is not None:
            ahead.announce(upto)

    def _truncated(self, t: ChunkReads, end: int) -> None:
        path = self.info.files[t.file]
        size = os.path.getsize(path)
        raise SolarError(
            f"{path}: truncated file: a chunk of {t.source.index.name!r} ends at byte {end}, "
            f"the file has {size}"
        )

    def _read_h5(self, task: H5Rows) -> int:
        """Through h5py: each chunk (along the first dimension) once, or just the wanted rows."""
        f, k, local, rows, out = task.file, task.key, task.local, task.rows, task.out
        row_bytes = self.info.keys[k].row_bytes
        path = self.info.files[f]
        name = self.info.keys[k].name
        try:
            with self._h5_lock:  # h5py serialises anyway; keep one reader in it at a time
                dset = self._h5file(f)[name]
                if task.whole:  # one sample per file: the whole dataset
                    out[rows] = dset[()]
                    return int(local.size) * row_bytes
                if task.chunk_rows == 0:
                    wanted, where = np.unique(local, return_inverse=True)
                    out[rows] = dset[wanted][where]
                    return int(local.size) * row_bytes
                size = os.path.getsize(path)
                chunk = local // task.chunk_rows
                for c in np.unique(chunk):
                    sel = chunk == c
                    lo = int(c) * task.chunk_rows
                    _check_chunk(dset, lo, size, path)
                    block = dset[lo : min(lo + task.chunk_rows, self.info.lengths[f])]
                    out[rows[sel]] = block[local[sel] - lo]
        except OSError as exc:
            raise SolarError(f"{path}: read error, truncated or corrupt ({exc})") from None
        return int(local.size) * row_bytes


def _check_chunk(dset: h5py.Dataset, lo: int, file_size: int, path) -> None:
    """HDF5 returns fill values for a chunk past the end of a truncated file: refuse instead."""
    for coord in _chunk_coords(dset, lo):
        info = dset.id.get_chunk_info_by_coord(coord)
        if info.byte_offset is not None and info.byte_offset + info.size > file_size:
            raise SolarError(
                f"{path}: truncated file: a chunk of {dset.name!r} ends at byte "
                f"{info.byte_offset + info.size}, the file has {file_size}"
            )


def _chunk_coords(dset: h5py.Dataset, lo: int):
    """Coordinates of every chunk holding rows [lo, lo + chunk rows)."""

    axes = [range(0, n, c) for n, c in zip(dset.shape[1:], dset.chunks[1:], strict=True)]
    for rest in itertools.product(*axes):
        yield (lo, *rest)


def wait_all(futures: list[Future]) -> tuple[int, float]:
    """(bytes, busy seconds) of read futures; raise the first error once *all* have ended,
    so that no reader thread is still writing into memory the caller reuses."""
    errors = [e for e in (f.exception() for f in futures) if e is not None]  # waits for all
    if errors:
        raise errors[0]
    results = [f.result() for f in futures]
    return sum(r[0] for r in results), sum(r[1] for r in results)


def _open_fd(paths: tuple, direct_io: bool, path_index: int) -> int:
    path = paths[path_index]
    flags = os.O_RDONLY | (os.O_DIRECT if direct_io else 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if direct_io and exc.errno == 22:
            raise SolarError(f"{path}: the file system does not support O_DIRECT") from None
        error = _TooManyOpen if exc.errno == errno.EMFILE else SolarError
        raise error(f"{path}: cannot open ({exc.strerror})") from None
    # No POSIX_FADV_RANDOM: without readahead the kernel splits a large coalesced read
    # into small synchronous ones (measured: 19 % of sequential bandwidth instead of 100 %).
    return fd


_CACHES: weakref.WeakSet[FdCache] = weakref.WeakSet()  # every reader's, to shrink on EMFILE


class _TooManyOpen(SolarError):
    """The process ran out of descriptors (EMFILE): other readers or the program hold them."""


def _close_all(fds: FdCache, files: _H5Cache) -> None:
    fds.close()
    files.close()


def fd_capacity() -> int:
    """Descriptors a reader keeps open: half the soft RLIMIT_NOFILE, at least 16."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft <= 0:
        soft = 65536
    return max(16, min(soft // 2, 65536))


class FdCache:
    """Open descriptors by path index: least recently used closed beyond ``capacity``.

    ``use(i)`` holds a reference while its block runs: a descriptor in use is never closed
    (evicted when released, if it is still beyond capacity), so threads may share one.
    """

    def __init__(self, capacity: int, opener: Callable[[int], int]) -> None:
        self.capacity = capacity
        self._open = opener
        self._lock = threading.Lock()
        self._fds: OrderedDict[int, int] = OrderedDict()
        self._refs: dict[int, int] = {}
        _CACHES.add(self)

    def __len__(self) -> int:
        return len(self._fds)

    @contextlib.contextmanager
    def use(self, key: int) -> Iterator[int]:
        """The descriptor of ``key``, never closed while the block runs."""
        fd = self.acquire([key])[0]
        try:
            yield fd
        finally:
            self.release([key])

    def acquire(self, keys: list[int]) -> list[int]:
        """Descriptors of ``keys``, each held until :meth:`release` of the same keys."""
        fds: list[int] = []
        try:
            for key in keys:
                fds.append(self._acquire(key))
        except BaseException:
            self.release(keys[: len(fds)])
            raise
        return fds

    def _acquire(self, key: int) -> int:
        with self._lock:
            fd = self._fds.get(key)
            if fd is not None:
                self._fds.move_to_end(key)
                self._refs[key] = self._refs.get(key, 0) + 1
                return fd
        try:
            new = self._open(key)  # outside the lock: opening may be slow
        except _TooManyOpen:
            # Other readers (or the program) hold descriptors too: every reader of this
            # process keeps fewer from now on and closes its idle ones; then retry once.
            for cache in list(_CACHES):
                cache.shrink()
            new = self._open(key)
        with self._lock:
            fd = self._fds.get(key)
            if fd is None:
                fd = self._fds[key] = new
            else:
                os.close(new)  # another thread opened it meanwhile
                self._fds.move_to_end(key)
            self._refs[key] = self._refs.get(key, 0) + 1
            self._evict()
        return fd

    def release(self, keys: list[int]) -> None:
        """Drop one hold of each of ``keys``; idle descriptors beyond capacity are closed."""
        with self._lock:
            for key in keys:
                left = self._refs[key] - 1
                if left:
                    self._refs[key] = left
                else:
                    del self._refs[key]
            self._evict()

    def shrink(self) -> None:
        """Halve the capacity (at least 16) and close every idle descriptor."""
        with self._lock:
            self.capacity = max(16, self.capacity // 2)
            self._evict(idle=True)

    def _evict(self, idle: bool = False) -> None:
        """Close the least recently used idle descriptors beyond capacity, or every idle one
        (lock held)."""
        excess = len(self._fds) - (0 if idle else self.capacity)
        if excess <= 0:
            return
        victims = []
        for key in self._fds:  # oldest first; only the few in use are skipped
            if key not in self._refs:
                victims.append(key)
                if len(victims) == excess:
                    break
        for key in victims:
            os.close(self._fds.pop(key))

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()


class _H5Cache:
    """h5py handles, least recently used closed beyond ``capacity`` (used under a lock)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._files: OrderedDict[int, h5py.File] = OrderedDict()

    def get(self, key: int) -> h5py.File | None:
        f = self._files.get(key)
        if f is not None:
            self._files.move_to_end(key)
        return f

    def put(self, key: int, f: h5py.File) -> None:
        self._files[key] = f
        while len(self._files) > self.capacity:
            self._files.popitem(last=False)[1].close()

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()


def lift_one_sample(index: ChunkIndex, decoder: Decoder) -> tuple[ChunkIndex, Decoder]:
    """A one-sample file's chunk index and decoder with a leading sample axis of length 1,
    so that the whole dataset is row 0 of the chunk path."""
    starts = np.concatenate([np.zeros((index.starts.shape[0], 1), np.int64), index.starts], 1)
    shape, chunk = (1, *index.shape), (1, *index.chunk_shape)
    lifted = dataclasses.replace(index, shape=shape, chunk_shape=chunk, starts=starts)
    return lifted, dataclasses.replace(decoder, shape=shape, chunk_shape=chunk)


class _ChunkHints:
    """WILLNEED hints for a job's chunk runs, kept ``WINDOW`` bytes ahead of its reads, in
    the order it reads them.

    A hint starts a fetch without waiting, so the next runs arrive while this one decodes
    (a job otherwise waits for each pread in turn). Not every run of a huge job at once: the
    kernel's elevator serves queued reads in disk order, not in the order they are needed,
    so the first pread can wait for most of what is queued (traced once: 34 ms of a 50 ms
    step). Measured on 32-sample steps (~4.5 MiB per job), 2 cores: windows of 4 MiB and
    more, and no window, perform alike; 2 MiB was slower (deeper queues read faster).
    """

    WINDOW = 8 * 2**20

    def __init__(self, reader: Reader, tasks: list[ChunkReads]) -> None:
        self._reader = reader
        self._runs = [
            (t.file, lo, hi)
            for t in tasks
            for lo, hi in zip(t.spans.lo.tolist(), t.spans.hi.tolist(), strict=True)
        ]
        self._next = 0  # first run not announced yet
        self._announced = 0  # bytes announced
        self._read = 0  # bytes asked for by announce()

    def announce(self, nbytes: int) -> None:
        """The caller reads its next ``nbytes``: announce runs up to them plus the window."""
        self._read += nbytes
        while self._next < len(self._runs) and self._announced < self._read + self.WINDOW:
            file, lo, hi = self._runs[self._next]
            try:
                with self._reader._fd(file) as fd:
                    os.posix_fadvise(fd, lo, hi - lo, os.POSIX_FADV_WILLNEED)
            except (OSError, SolarError):  # only a hint: the reads themselves name a problem
                pass
            self._announced += hi - lo
            self._next += 1


def _timed(reader: Reader, tasks: list[ReadTask], ahead: _ChunkHints | None) -> tuple[int, float]:
    t0 = time.perf_counter()
    reader._local.ahead = ahead  # this thread's job's hints, for _read_ahead
    total = sum(reader._run(t) for t in tasks)
    return total, time.perf_counter() - t0


_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
_JOB_BYTES = 512 * 2**10  # stored chunk bytes worth a pool job of their own (see _jobs)


def _jobs(tasks: list[ReadTask], reader: Reader) -> int:
    """Pool jobs for a step's tasks: one per thread, except for chunk reads too small to
    share (a job's handoff costs about as much as decoding a few hundred KiB of zstd), and
    at most one per core for decoding jobs (``_decodes``)."""
    if not all(isinstance(t, ChunkReads) for t in tasks):
        return reader.threads
    work = sum(t.stored_bytes for t in tasks if isinstance(t, ChunkReads))
    threads = min(reader.threads, _CORES) if _decodes(tasks, reader) else reader.threads
    return max(1, min(threads, -(-work // _JOB_BYTES)))


def _decodes(tasks: list[ReadTask], reader: Reader) -> bool:
    """Whether a step's tasks all decode chunk reads announced to the kernel (``_announce``).

    Their fetches are in flight however few threads wait, so such jobs run on one thread per
    core: more decoding threads than cores only fight over the CPU and the GIL, and delay the
    consuming thread. Measured, 2 cores: a step's jobs, zstd batches cold, 1.36x faster; the
    jobs of steps read ahead, gzip single samples warm, ~15 % faster on 2 threads than on 8.
    """
    return not reader.direct_io and all(isinstance(t, ChunkReads) for t in tasks)


def _balance(tasks: list[ReadTask], groups: int) -> list[list[ReadTask]]:
    """Deal tasks round-robin into at most ``groups`` lists (one pool job each)."""
    groups = min(groups, len(tasks))
    return [tasks[g::groups] for g in range(groups)] if groups else []

"""Open files: descriptors and h5py handles, cached per process, and the storage byte source.

A byte source is what the executor (solar/io/executor.py) reads from: it lends descriptors
(``fd(i)``) and names itself in errors. :class:`Files` is the dataset's files; the second tier
(solar/cache/tier.py) is another. Descriptors are cached, least recently used closed beyond
half the RLIMIT_NOFILE soft limit (:class:`FdCache`); h5py handles likewise (:class:`H5Cache`).
Every descriptor is checked against its file's identity (solar/io/identity.py) when it is
opened and after each use, so that a file changed under the run is refused, never served.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import resource
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from solar._memory import memory_room
from solar._units import format_bytes
from solar.errors import SolarError, truncated
from solar.io.hdf5 import open_h5
from solar.io.identity import Identities
from solar.io.info import DatasetInfo
from solar.io.pagecache import takes_tries


def open_descriptor(path: str | os.PathLike, flags: int, o_direct: bool) -> int:
    """``os.open(path, flags)``, with ``O_DIRECT`` if asked; one-line errors naming ``path``.

    A file system without O_DIRECT raises :class:`NoDirectIO`, running out of descriptors
    :class:`TooManyOpen` (both SolarErrors)."""
    try:
        return os.open(path, flags | (os.O_DIRECT if o_direct else 0))
    except OSError as exc:
        if o_direct and exc.errno == errno.EINVAL:
            raise NoDirectIO(f"{path}: the file system does not support O_DIRECT") from None
        error = TooManyOpen if exc.errno == errno.EMFILE else SolarError
        raise error(f"{path}: cannot open ({exc.strerror})") from None


def memory_fault(what: str, why: str = "Bad address") -> SolarError:
    """The error for bytes read from ``what`` that the destination memory could not take
    (EFAULT, or a short read of bytes the file holds): shared memory (transform batches in
    memfds, a node buffer's memfd) whose pages cannot be backed, not the data file's
    fault. Both figures are given: which one ran out depends on the memory."""
    room = memory_room()
    mem = "memory unknown" if room is None else f"{format_bytes(room[0])} {room[1]}"
    try:
        vfs = os.statvfs("/dev/shm")
        shm = f"/dev/shm {format_bytes(vfs.f_bavail * vfs.f_frsize)} free"
    except OSError:
        shm = "/dev/shm not mounted"
    return SolarError(
        f"{what}: the bytes read could not be stored in batch memory ({why}): "
        f"is shared memory exhausted? ({mem}, {shm})"
    )


class NoDirectIO(SolarError):
    """The file system refuses O_DIRECT."""


class TooManyOpen(SolarError):
    """The process ran out of descriptors (EMFILE): other readers or the program hold them."""


def fd_capacity() -> int:
    """Descriptors a reader keeps open: half the soft RLIMIT_NOFILE, at least 16."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft <= 0:
        soft = 65536
    return max(16, min(soft // 2, 65536))


_CACHES: weakref.WeakSet[FdCache] = weakref.WeakSet()  # every reader's, to shrink on EMFILE


class FdCache:
    """Open descriptors by path index: least recently used closed beyond ``capacity``.

    ``use(i)`` holds a reference while its block runs: a descriptor in use is never closed
    (evicted when released, if it is still beyond capacity), so threads may share one.
    ``verify(key, fd)``, if given, runs when a block using a descriptor ends without error:
    it raises if the file is no longer the one opened (its bytes just read are not the data's).
    """

    def __init__(
        self,
        capacity: int,
        opener: Callable[[int], int],
        verify: Callable[[int, int], None] | None = None,
    ) -> None:
        self.capacity = capacity
        self._open = opener
        self.verify = verify
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
            if self.verify is not None:
                self.verify(key, fd)  # what the block read came from the file opened
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
        except TooManyOpen:
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


class H5Cache:
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


class Files:
    """The dataset's files as a byte source, in one process: descriptors by path index
    (``paths``: a .npy key's files follow the previous key's), h5py handles by file index
    (``h5_paths``), opened lazily and closed when dropped or at :meth:`close`.
    ``direct_io``: descriptors opened with O_DIRECT.
    """

    def __init__(self, info: DatasetInfo, direct_io: bool, throttle: Any,
                 identity: str = "ctime") -> None:  # fmt: skip
        self.info = info
        self.paths = info.all_files
        self.h5_paths = info.files
        self.direct_io = direct_io
        self.throttle = throttle  # solar.io.throttle.Throttle: an emulated remote file system
        # Buffered reads tried from the page cache first where the files' system takes it
        # (the first file's, as a dataset's lie on one); not for the emulated remote file
        # system, whose requests overlap only across threads.
        self.cache_first = (not direct_io and throttle is None and bool(self.paths)
                            and takes_tries(self.paths[0]))  # fmt: skip
        # Each file's identity: size and times as described, device and inode at first open.
        st = info.stored
        sizes, times = (None, None) if st is None else (_flat(st.sizes), _flat(st.times))
        self.identities = Identities(self.paths, sizes, times, functools.partial(_cut, info),
                                     identity)  # fmt: skip
        # The opener must not hold self: the finalizer below keeps it alive.
        opener = functools.partial(_open_read, self.paths, direct_io, self.identities)
        self.fds = FdCache(fd_capacity(), opener, self.identities.check_fd)
        self._h5 = H5Cache(max(4, min(64, self.fds.capacity // 4)))
        self.h5_lock = threading.Lock()  # h5py serialises anyway: one thread in it at a time
        # Files dropped without close() must not keep their descriptors open.
        self._finalizer = weakref.finalize(self, _close_all, self.fds, self._h5)

    def fd(self, i: int) -> contextlib.AbstractContextManager[int]:
        """The descriptor of ``paths[i]``, held open while the block runs."""
        return self.fds.use(i)

    def h5file(self, f: int) -> h5py.File:
        """An h5py handle of file ``f`` (call with ``h5_lock`` held), its identity checked."""
        handle = self._h5.get(f)
        if handle is None:
            handle = open_h5(self.h5_paths[f])
            self._h5.put(f, handle)
            self.check_h5(f, handle)
        return handle

    def check_h5(self, f: int, handle: h5py.File) -> None:
        """File ``f``, open as ``handle``, is still the file described (after reads through
        it: what they returned is the data's). HDF5 files are paths ``0..len(files)-1``."""
        try:
            fd = handle.id.get_vfd_handle()
        except (OSError, ValueError, TypeError):  # a driver without a descriptor: by its path
            self.identities.check_paths([f])
        else:
            self.identities.check_fd(f, fd)

    def check_files(self) -> None:
        """At an epoch's start: every path still names the file described. (Files opened per
        read, more than the cache holds, are checked at each open instead.)"""
        if not self.streams:
            self.identities.check_paths()

    @property
    def streams(self) -> bool:
        """Whether one-sample files are opened per read rather than kept in the cache: more
        of them than it holds (an LRU cache over an epoch's random order would miss almost
        always, adding only Python and a lock per file)."""
        return len(self.paths) > self.fds.capacity

    @functools.cached_property
    def names(self) -> tuple[np.ndarray, np.ndarray]:
        """Every path NUL-terminated in one byte array, and where each starts."""
        encoded = [os.fsencode(p) + b"\0" for p in self.paths]
        at = np.zeros(len(encoded), np.int64)
        at[1:] = np.cumsum([len(e) for e in encoded[:-1]])
        return np.frombuffer(b"".join(encoded), np.uint8), at

    def io_error(self, i: int, offset: int, exc: OSError) -> SolarError:
        if exc.errno == errno.EFAULT:
            return memory_fault(f"{self.paths[i]} (byte {offset})")
        return SolarError(f"{self.paths[i]}: read error ({exc.strerror})")

    def short_transfer(self, i: int, offset: int, want: int, got: int, write: bool) -> SolarError:
        """A read that stopped short: a truncated file names its key and sample, as its
        metadata does; a file that holds the bytes asked for was not the fault."""
        path = self.paths[i]
        try:
            size = os.stat(path).st_size
        except OSError:
            size = -1
        if size >= offset + want:  # the file has them: the destination memory did not
            why = f"{got} of {want} bytes at byte {offset}, which the file holds"
            return memory_fault(str(path), why)
        where = sample_at(self.info, i, offset + max(0, got))
        if where is None:
            what = f"a read of {want} bytes at byte {offset}"
            return truncated(path, what, offset + want, size)
        key, sample, end = where
        return truncated(path, f"key {key!r} of sample {sample}", end, size)

    def close(self) -> None:
        self._finalizer()


def sample_at(info: DatasetInfo, i: int, byte: int) -> tuple[str, int, int] | None:
    """(key, global sample id, its row's end byte) of the row of path i (of
    ``info.all_files``) holding ``byte``, None if no key stored at an offset holds it."""
    st = info.stored
    if st is None:
        return None
    nfiles = len(info.files)
    f, ks = (i % nfiles, [i // nfiles]) if info.key_files else (i, range(len(info.keys)))
    first = sum(info.lengths[:f])
    for k in ks:
        off, row, n = int(st.offsets[f, k]), info.keys[k].row_bytes, info.lengths[f]
        if off >= 0 and row > 0 and off <= byte < off + n * row:
            local = (byte - off) // row
            return info.keys[k].name, first + local, off + (local + 1) * row
    return None


def _cut(info: DatasetInfo, i: int, size: int) -> str | None:
    """What a truncation of path i to ``size`` bytes cut: the first sample it lost."""
    where = sample_at(info, i, size)
    if where is None:
        return None
    key, sample, end = where
    return f"key {key!r} of sample {sample} ends at byte {end}"


def _open_read(paths: tuple[Path, ...], o_direct: bool, identities: Identities, i: int) -> int:
    # No POSIX_FADV_RANDOM: without readahead the kernel splits a large coalesced read
    # into small synchronous ones (measured: 19 % of sequential bandwidth instead of 100 %).
    fd = open_descriptor(paths[i], os.O_RDONLY, o_direct)
    try:
        identities.check_fd(i, fd)  # a new descriptor: the file described, not another
    except BaseException:
        os.close(fd)
        raise
    return fd


def _flat(table: np.ndarray | None) -> np.ndarray | None:
    """A (files, 1 or keys, ...) table from the scan as one row per path of ``all_files`` (a
    .npy key's files after the previous key's)."""
    if table is None:
        return None
    return np.ascontiguousarray(table.swapaxes(0, 1)).reshape(-1, *table.shape[2:])


def _close_all(fds: FdCache, files: H5Cache) -> None:
    fds.close()
    files.close()

"""A window's missed rows packed in plan order: one unlinked file on node-local storage.

Region ``j`` of a :class:`PackedFile` holds step ``steps[j]``'s storage reads (its misses and
side rows), sorted by sample id, back to back: a step reads one contiguous region, and a
sequential scan of the source writes, for each source chunk, one contiguous piece of every
step's region (:func:`chunk_write`). Which window is packed is the planner's decision
(solar/schedule/packing.py); building and reading it, the runtime's (solar/runtime/packing.py).
Its reads and writes are :class:`~solar.io.tasks.PreadvRuns` on this byte source, run by the
rank's one executor as the tier's records are: rows at known offsets of a local file, the
same task whatever the file.

Untrusted like every file: created unlinked (nothing can open or replace it by name; it is
freed with its descriptor however the process dies), its size known; once built it is synced,
its pages dropped (its reads come from the disk, as the source's would) and its identity
(solar/io/identity.py: size, mtime, ctime, device, inode) pinned, then checked around every
read task: a write through ``/proc/PID/fd`` after the build moves its mtime and ctime and
refuses the window in one line. Offsets come from the layout in memory, never from the file,
and a short read is an error: no other bytes are ever served.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
from pathlib import Path

import numpy as np

from solar._units import format_bytes
from solar.cache.tier import _check_directory, sanitise, unlinked_file
from solar.errors import SolarError
from solar.io.handles import memory_fault
from solar.io.identity import Identities, changed
from solar.io.pagecache import drop
from solar.io.tasks import IOV_MAX, PreadvRuns, coalesce_runs

_INSTANCES = itertools.count()


class PackedFile:
    """The packed layout of steps ``steps`` (region j: ``counts[j]`` rows of ``row_bytes``),
    an executor byte source (solar/io/executor.py)."""

    direct_io = False  # rows land at any address; its written pages are dropped instead
    throttle = None  # node-local: never the emulated remote file system

    def __init__(self, directory: str | os.PathLike, steps: np.ndarray, samples: list[np.ndarray],
                 row_bytes: int, name: str) -> None:  # fmt: skip
        """``samples[j]``: step ``steps[j]``'s reads, sorted."""
        directory = Path(directory)
        _check_directory(directory)
        self.steps = np.asarray(steps, np.int64)
        self.samples = samples
        counts = np.array([s.size for s in samples], np.int64)
        self.starts = np.concatenate([[0], np.cumsum(counts)])  # region j: rows [starts[j], j+1)
        self.row_bytes = row_bytes
        self.nbytes = int(self.starts[-1]) * row_bytes
        host = sanitise(socket.gethostname())
        seq = next(_INSTANCES)
        self.path = directory / f"solar-pack-{sanitise(name)}.{seq}-{host}-{os.getpid()}.bin"
        self._fd = unlinked_file(self.path)
        try:
            os.posix_fallocate(self._fd, 0, max(1, self.nbytes))
        except OSError as exc:
            os.close(self._fd)
            raise SolarError(f"packed layout {self.path}: cannot allocate "
                             f"{format_bytes(self.nbytes)} ({exc.strerror})") from None  # fmt: skip
        self._ids: Identities | None = None  # pinned once built
        self.closed = False

    # -- a byte source of the executor ---------------------------------------------------------
    def fd(self, i: int) -> contextlib.AbstractContextManager[int]:
        """Its descriptor; once sealed, its identity checked before and after the task."""
        return _Checked(self)

    def check(self) -> None:
        """Raise (one line) if the file changed since it was built (or is being built and is
        not its size)."""
        if self.closed:
            raise SolarError(f"packed layout {self.path}: closed")
        st = os.fstat(self._fd)
        if self._ids is not None:
            self._ids.check(0, st)
        elif st.st_size < self.nbytes:
            raise changed(self.path, f"truncated: {self.nbytes} -> {st.st_size} bytes")

    def io_error(self, i: int, offset: int, exc: OSError) -> SolarError:
        if exc.errno == 14:  # EFAULT: the memory read into or written from, not the file
            return memory_fault(f"packed layout {self.path}: row {offset // self.row_bytes}")
        return SolarError(f"packed layout {self.path}: row {offset // self.row_bytes}: "
                          f"{exc.strerror}")  # fmt: skip

    def short_transfer(self, i: int, offset: int, want: int, got: int, write: bool) -> SolarError:
        verb = "wrote" if write else "read"
        return SolarError(f"packed layout {self.path}: row {offset // self.row_bytes}: {verb} "
                          f"{got} of {want} B")  # fmt: skip

    # -- its life ------------------------------------------------------------------------------
    def seal(self) -> None:
        """Built: synced, its pages dropped, its identity pinned (checked on every read)."""
        drop(self._fd)
        ids = Identities([self.path], sizes=np.array([self.nbytes]))
        ids.check(0, os.fstat(self._fd))  # pins mtime, ctime, device and inode
        self._ids = ids

    def drop_written(self) -> None:
        """Write back and drop what was written so far (a pass's pages are not a cache)."""
        drop(self._fd)

    def close(self) -> None:
        """Free the file (its space returns with the descriptor)."""
        if not self.closed:
            self.closed = True
            os.close(self._fd)

    # -- tasks ---------------------------------------------------------------------------------
    def region(self, k: int) -> int:
        """The region of step ``k`` (raises unless the layout holds it)."""
        j = int(np.searchsorted(self.steps, k))
        if j >= self.steps.size or self.steps[j] != k:
            raise SolarError(f"packed layout {self.path}: step {k} is not packed here")
        return j

    def read_tasks(self, k: int, samples: np.ndarray, dest: np.ndarray, rows: np.ndarray,
                   groups: int) -> list[PreadvRuns]:  # fmt: skip
        """The tasks reading step ``k``'s reads ``samples`` into rows ``rows`` of ``dest``
        ((batch rows, row bytes) uint8): its region, one ``preadv`` per ``IOV_MAX`` rows,
        in at most ``groups`` tasks. Raises unless ``samples`` are the ones packed."""
        j = self.region(k)
        order = np.argsort(samples, kind="stable")
        if not np.array_equal(samples[order], self.samples[j]):
            raise SolarError(f"packed layout {self.path}: step {k} reads other samples than "
                             "the ones packed")  # fmt: skip
        n = int(order.size)
        if n == 0:
            return []
        if rows.size and (int(rows.min()) < 0 or int(rows.max()) >= dest.shape[0]):
            raise SolarError(f"destination row out of range 0..{dest.shape[0] - 1}")
        rb = self.row_bytes
        iov = np.empty((n, 2), np.uint64)
        iov[:, 0] = dest.ctypes.data + rows[order].astype(np.uint64) * np.uint64(rb)
        iov[:, 1] = rb
        starts = np.arange(0, n, IOV_MAX, dtype=np.int64)
        counts = np.minimum(IOV_MAX, n - starts)
        offsets = (int(self.starts[j]) + starts) * rb
        g = max(1, min(groups, starts.size))
        return [PreadvRuns(0, iov, starts[i::g], counts[i::g], offsets[i::g]) for i in range(g)]


def chunk_write(packed: PackedFile, staging: np.ndarray, first: int, end: int) -> PreadvRuns | None:
    """The task writing, from ``staging`` (rows ``first..end - 1`` of the source, (rows, row
    bytes) uint8), every packed row whose sample is among them: one contiguous piece of each
    step's region (its samples are sorted). None if no step reads any."""
    pos, src = [], []
    for j, s in enumerate(packed.samples):
        a, b = np.searchsorted(s, [first, end])
        if b > a:
            pos.append(np.arange(packed.starts[j] + a, packed.starts[j] + b, dtype=np.int64))
            src.append(s[a:b] - first)
    if not pos:
        return None
    where, rows = np.concatenate(pos), np.concatenate(src)
    runs = coalesce_runs(where, IOV_MAX)  # in file order: runs of consecutive packed rows
    rb = packed.row_bytes
    iov = np.empty((rows.size, 2), np.uint64)
    iov[:, 0] = staging.ctypes.data + rows[runs.order].astype(np.uint64) * np.uint64(rb)
    iov[:, 1] = rb
    offsets = where[runs.order][runs.starts] * rb
    return PreadvRuns(0, iov, runs.starts, runs.counts, offsets, write=True)


class _Checked:
    """A task's use of the packed file's descriptor, its identity checked around it."""

    __slots__ = ("packed",)

    def __init__(self, packed: PackedFile) -> None:
        self.packed = packed

    def __enter__(self) -> int:
        self.packed.check()
        return self.packed._fd

    def __exit__(self, kind: object, *rest: object) -> None:
        if kind is None:
            self.packed.check()

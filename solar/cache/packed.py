"""A window's missed rows packed in plan order: one unlinked file on node-local storage.

Region ``j`` of a :class:`PackedFile` holds step ``steps[j]``'s storage reads (its misses, and side
rows where a given plan keeps page mates), sorted by sample id, back to back: a step reads one
contiguous region, and a sequential scan of the source writes, for each source chunk, one
page-aligned piece of every step's region (:meth:`PackedFile.chunk_write`). Which window is packed
is the planner's decision (schedule/plans/packing.py); building and reading it, the runtime's
(solar/runtime/packing.py).
Its writes are :class:`~solar.io.tasks.PreadvRuns` and its reads
:class:`~solar.io.tasks.PageGather` on this byte source, run by the rank's one executor as
the tier's records and the source's rows are: rows at known offsets of a local file are the
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
import errno
import itertools
import os
import socket
from pathlib import Path

import numpy as np
from numba import njit

from solar._memory import PAGE
from solar.cache.tier import Checked, check_directory, create_file, sanitise
from solar.errors import SolarError
from solar.io.handles import memory_fault
from solar.io.identity import Identities, changed
from solar.io.pagecache import drop
from solar.io.tasks import Task, deal_runs, gather_tasks

_INSTANCES = itertools.count()


class PackedFile:
    """The packed layout of steps ``steps`` (region j: step ``steps[j]``'s reads
    ``samples[j]``, sorted), an executor byte source (solar/io/executor.py).

    Region j is a run of pieces, one per source chunk of ``chunk_rows`` rows holding any of
    its samples, each padded to whole pages, so that every write of a pass is page-aligned
    (``O_DIRECT``: written pages never sit in the page cache, whose write-back here ran at
    a tenth of direct writes) and a step reads its region as page spans (:class:`PageGather`).
    """

    throttle = None  # node-local: never the emulated remote file system
    cache_first = False  # read in page spans (PageGather), never as buffered runs

    def __init__(self, directory: str | os.PathLike, steps: np.ndarray, samples: list[np.ndarray],
                 row_bytes: int, chunk_rows: int, name: str) -> None:  # fmt: skip
        directory = Path(directory)
        check_directory(directory, "packed layout")
        self.steps = np.asarray(steps, np.int64)
        self.samples = samples
        self.row_bytes, self.chunk_rows = row_bytes, chunk_rows
        self._lay_out()
        host = sanitise(socket.gethostname())
        seq = next(_INSTANCES)
        self.path = directory / f"solar-pack-{sanitise(name)}.{seq}-{host}-{os.getpid()}.bin"
        self._fd, self.direct_io = create_file(self.path, max(PAGE, self.nbytes), True,
                                               "packed layout")  # fmt: skip
        self._ids: Identities | None = None  # pinned once built
        self.closed = False

    def _lay_out(self) -> None:
        """Rows step-major, by sample within a step; pieces (step, chunk) padded to pages."""
        rb = self.row_bytes
        counts = np.array([s.size for s in self.samples], np.int64)
        self.row_start = np.concatenate([[0], np.cumsum(counts)])  # step j: rows [j, j + 1)
        ids = np.concatenate(self.samples) if self.samples else np.zeros(0, np.int64)
        self.ids = ids.astype(np.int64)
        step = np.repeat(np.arange(counts.size), counts)
        chunk = self.ids // self.chunk_rows
        new = np.ones(ids.size, np.bool_)
        new[1:] = (step[1:] != step[:-1]) | (chunk[1:] != chunk[:-1])
        first = np.flatnonzero(new)  # each piece's first row
        rows = np.diff(np.append(first, ids.size))
        padded = -(-rows * rb // PAGE) * PAGE
        self.piece_first, self.piece_rows, self.piece_bytes = first, rows, padded
        self.piece_chunk = chunk[first]
        # Pieces by chunk (in file order within one): a chunk's pieces are a slice of it.
        self._by_chunk = np.argsort(self.piece_chunk, kind="stable")
        self._chunk_of = self.piece_chunk[self._by_chunk]
        self.piece_at = np.concatenate([[0], np.cumsum(padded)])  # file offset of each piece
        piece = np.cumsum(new) - 1
        # Each row's byte offset in the file (sorted within a step: its region's order).
        self.at = self.piece_at[piece] + (np.arange(ids.size) - first[piece]) * rb
        self.nbytes = int(self.piece_at[-1])

    # -- a byte source of the executor ---------------------------------------------------------
    def fd(self, i: int) -> contextlib.AbstractContextManager[int]:
        """Its descriptor; once sealed, its identity checked before and after the task."""
        return Checked(self.check, self._fd)

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
        if exc.errno == errno.EFAULT:  # the memory read into or written from, not the file
            return memory_fault(f"packed layout {self.path}: byte {offset}")
        return SolarError(f"packed layout {self.path}: byte {offset}: {exc.strerror}")

    def short_transfer(self, i: int, offset: int, want: int, got: int, write: bool) -> SolarError:
        verb = "wrote" if write else "read"
        return SolarError(f"packed layout {self.path}: byte {offset}: {verb} {got} of {want} B")

    # -- its life ------------------------------------------------------------------------------
    def seal(self) -> None:
        """Built: synced, its pages dropped, its identity pinned (checked on every read)."""
        drop(self._fd)
        ids = Identities([self.path], sizes=np.array([max(PAGE, self.nbytes)]))
        ids.check(0, os.fstat(self._fd))  # pins mtime, ctime, device and inode
        self._ids = ids

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
                   groups: int) -> list[Task]:  # fmt: skip
        """The tasks reading step ``k``'s reads ``samples`` into rows ``rows`` of ``dest``
        ((batch rows, row bytes) uint8): its region's page spans, in at most ``groups``
        tasks. Raises unless ``samples`` are the ones packed."""
        j = self.region(k)
        order = np.argsort(samples, kind="stable")
        if not np.array_equal(samples[order], self.samples[j]):
            raise SolarError(f"packed layout {self.path}: step {k} reads other samples than "
                             "the ones packed")  # fmt: skip
        if order.size == 0:
            return []
        if int(rows.min()) < 0 or int(rows.max()) >= dest.shape[0]:
            raise SolarError(f"destination row out of range 0..{dest.shape[0] - 1}")
        src = self.at[self.row_start[j] : self.row_start[j + 1]]
        return gather_tasks(0, src, self.row_bytes, rows[order], dest, groups, 0)

    def chunk_write(self, staging: np.ndarray, c: int, out: np.ndarray,
                    groups: int = 1) -> list[Task]:  # fmt: skip
        """The tasks writing, from ``staging`` (source chunk ``c``'s rows, (rows, row bytes)
        uint8), its piece of every step's region, assembled in ``out`` (page-aligned, at least
        :meth:`chunk_bytes` of ``c``): one write per piece, cut into at most ``groups`` tasks
        of consecutive pieces as any runs are (:func:`~solar.io.tasks.deal_runs`: synchronous
        direct writes, one in flight per thread); none if no step reads from chunk ``c``."""
        pieces = self._pieces(c)
        if pieces.size == 0:
            return []
        sizes = self.piece_bytes[pieces]
        base = np.concatenate([[0], np.cumsum(sizes)])
        w = _word(self.row_bytes)
        _assemble(staging.view(f"u{w}"), self.ids, self.piece_first[pieces],
                  self.piece_rows[pieces], base[:-1] // w, c * self.chunk_rows,
                  out.view(f"u{w}"))  # fmt: skip
        iov = np.empty((pieces.size, 2), np.uint64)
        iov[:, 0] = out.ctypes.data + base[:-1].astype(np.uint64)
        iov[:, 1] = sizes
        one = np.arange(pieces.size, dtype=np.int64)  # a piece: one entry of its own
        return deal_runs(0, iov, one, np.ones_like(one), self.piece_at[pieces], max(1, groups),
                         write=True)  # fmt: skip

    def chunk_bytes(self, c: int) -> int:
        """Bytes of chunk ``c``'s pieces (what :meth:`chunk_write` assembles)."""
        return int(self.piece_bytes[self._pieces(c)].sum())

    def _pieces(self, c: int) -> np.ndarray:
        """The pieces of chunk ``c``, in file order."""
        lo, hi = np.searchsorted(self._chunk_of, [c, c + 1])
        return self._by_chunk[lo:hi]

    @property
    def chunks(self) -> np.ndarray:
        """The source chunks holding any packed row, in file order."""
        return np.unique(self.piece_chunk)


def _word(row_bytes: int) -> int:
    """Bytes of the words rows are copied in: 8 where rows allow (a row copied by bytes ran
    at a tenth of the speed)."""
    return 8 if row_bytes % 8 == 0 else 1


def rehearse(row_bytes: int) -> None:
    """Compile (or load from the cache) the kernel :meth:`PackedFile.chunk_write` runs for
    rows of ``row_bytes`` bytes, with its argument types (solar/warm.py's rehearsal: the
    first packed window would compile it on the builder thread)."""
    w, one = _word(row_bytes), np.zeros(1, np.int64)
    rows = np.zeros((1, row_bytes), np.uint8)
    _assemble(rows.view(f"u{w}"), one, one, np.ones(1, np.int64), one, 0,
              np.zeros(row_bytes, np.uint8).view(f"u{w}"))  # fmt: skip


@njit(cache=True, nogil=True)
def _assemble(staging, ids, first, rows, base, lo, out):  # pragma: no cover - compiled
    """Piece p's rows (packed rows ``first[p]..first[p] + rows[p] - 1``, samples ``ids``) from
    ``staging`` (source rows from ``lo``) to ``out[base[p]:]``, back to back (in words of
    ``out``'s and ``staging``'s one type)."""
    width = staging.shape[1]
    for p in range(first.shape[0]):
        at = base[p]
        for i in range(first[p], first[p] + rows[p]):
            out[at : at + width] = staging[ids[i] - lo]
            at += width

"""``mmap``: PyTorch Geometric's way of gathering features that outgrow memory (Ginex's
"PyG+"), as a baseline under a memory budget. EMULATED, not a real memory map.

PyG+ memory-maps the feature matrix and indexes it (``x[n_id]``): every row's pages come from
the OS page cache, faulted in from storage when absent, and the budget is whatever memory the
page cache may use (Ginex runs it under a cgroup). No cgroup can be made here, so the page
cache is emulated: an LRU of 4 KiB pages holding ``budget`` bytes, kept by this process; the
pages a step needs and the LRU lacks are read with ``O_DIRECT`` (no OS cache underneath) on
``threads`` threads, one ``pread`` per page, then the rows are copied out of the cached pages.

The emulation is generous to mmap: a real fault reads one page at a time on the faulting
thread (plus whatever readahead the kernel adds, mostly wasted on random rows), while here a
step's missing pages are read in parallel and only once each. A step whose pages exceed the
budget is gathered in chunks whose pages fit, as a fault brings back a page evicted under
pressure.
"""

from __future__ import annotations

import itertools
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from numba import njit

from solar._memory import PAGE, aligned
from solar.errors import SolarError
from solar.io import libc


@njit(cache=True)
def _lru_pages(pages, prev, nxt, slot, free, head):  # pragma: no cover - compiled
    """An LRU of page slots over ``pages`` (distinct): each page's slot, a hit's or one freed
    for it (a miss). ``prev``/``nxt``: a doubly linked list of resident pages by recency,
    ``head[0]`` the most recent, ``head[1]`` the least; ``free[0]``: slots never used yet, of
    ``free[1]``. Returns (slots, miss mask)."""
    m = pages.shape[0]
    slots = np.empty(m, np.int64)
    miss = np.zeros(m, np.bool_)
    for j in range(m):
        p = pages[j]
        if slot[p] < 0:
            miss[j] = True
            if free[0] < free[1]:
                s = free[0]
                free[0] += 1
            else:  # evict the least recent
                v = head[1]
                s = slot[v]
                slot[v] = -1
                head[1] = prev[v]
                if head[1] >= 0:
                    nxt[head[1]] = -1
                else:
                    head[0] = -1
            slot[p] = s
        else:  # unlink p
            a, b = prev[p], nxt[p]
            if a >= 0:
                nxt[a] = b
            else:
                head[0] = b
            if b >= 0:
                prev[b] = a
            else:
                head[1] = a
        prev[p] = -1  # to the front
        nxt[p] = head[0]
        if head[0] >= 0:
            prev[head[0]] = p
        head[0] = p
        if head[1] < 0:
            head[1] = p
        slots[j] = slot[p]
    return slots, miss


@njit(cache=True, nogil=True)
def _read_pages(fd, pool, slots, offsets, got):  # pragma: no cover - compiled
    """One ``pread`` of a page per slot (a fault's read, without readahead)."""
    for j in range(slots.shape[0]):
        got[j] = libc.pread(fd, pool[slots[j]].ctypes.data, PAGE, offsets[j])


@njit(cache=True, nogil=True)
def _copy_rows(pool, slot_of, ids, base, row_bytes, out):  # pragma: no cover - compiled
    """Row i of ``out`` from the cached pages holding node ``ids[i]``'s bytes."""
    for i in range(ids.shape[0]):
        a = base + ids[i] * row_bytes
        done = 0
        while done < row_bytes:
            p = (a + done) // PAGE
            at = (a + done) - p * PAGE
            take = min(row_bytes - done, PAGE - at)
            out[i, done : done + take] = pool[slot_of[p], at : at + take]
            done += take


class MmapGather:
    """Rows of a contiguous array in a file gathered as from a memory map whose page cache
    holds ``budget`` bytes (emulated: see the module's docstring).

    ``offset``: the array's first byte in ``path``; ``row_bytes``: bytes per row. Counters:
    ``rows`` gathered, ``hits`` (rows whose every page was cached), ``bytes_read`` (whole
    pages from storage). ``throttle`` (a :class:`~solar.io.throttle.Throttle`) delays reads
    as the emulated storage would.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        offset: int,
        row_bytes: int,
        budget: int,
        threads: int = 8,
        throttle: Any = None,
    ) -> None:
        if row_bytes <= 0 or offset < 0:
            raise SolarError(f"mmap baseline: {path}: bad row size {row_bytes} or offset {offset}")
        if threads < 1:
            raise SolarError(f"mmap baseline: threads must be >= 1, got {threads}")
        self.path, self.offset, self.row_bytes = os.fspath(path), int(offset), int(row_bytes)
        self.threads, self.throttle = threads, throttle
        self.size = os.path.getsize(path)
        npages = self.size // PAGE + 1
        # Pages one row may span: a chunk's rows are copied while all their pages are cached.
        self._span = 1 + -(-self.row_bytes // PAGE)
        cap = max(self._span, budget // PAGE)
        self.pool = aligned(cap * PAGE).reshape(cap, PAGE)
        self._prev = np.full(npages, -1, np.int64)
        self._nxt = np.full(npages, -1, np.int64)
        self._slot = np.full(npages, -1, np.int64)
        self._free = np.array([0, cap], np.int64)
        self._head = np.array([-1, -1], np.int64)
        self.rows = self.hits = self.bytes_read = 0
        self._fd = os.open(self.path, os.O_RDONLY | os.O_DIRECT)
        self._threads = ThreadPoolExecutor(threads, thread_name_prefix="solar-mmap")
        # The kernels now (loaded from numba's cache), not inside the first timed epoch.
        none = np.zeros(0, np.int64)
        _read_pages(self._fd, self.pool, none, none, none)
        _lru_pages(none, self._prev, self._nxt, self._slot, self._free, self._head)
        _copy_rows(self.pool, self._slot, none, 0, self.row_bytes,
                   np.zeros((0, self.row_bytes), np.uint8))  # fmt: skip

    @classmethod
    def of_key(
        cls, path: str | os.PathLike, key: str, budget: int, threads: int = 8, throttle: Any = None
    ) -> MmapGather:
        """The baseline over dataset ``key`` of one HDF5 file (or one ``.npy`` file): it must
        be stored contiguously, as a memory map needs."""
        from solar.io.sources import describe_source

        info = describe_source(str(path), [key])
        offset = -1 if info.stored is None else int(info.stored.offsets[0, 0])
        if len(info.all_files) != 1 or offset < 0:
            raise SolarError(f"mmap baseline: {path} {key!r} is not one contiguous array "
                             "(a memory map needs one)")  # fmt: skip
        return cls(info.all_files[0], offset, info.keys[0].row_bytes, budget, threads, throttle)

    def gather(self, ids: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``ids`` (distinct) as ``(len(ids), row_bytes)`` uint8, in order."""
        ids = np.asarray(ids, np.int64)
        # The kernels index page tables by these rows: none may fall outside the file.
        end = self.offset + (int(ids.max()) + 1) * self.row_bytes if ids.size else 0
        if ids.size and (ids.min() < 0 or end > self.size):
            raise SolarError(f"mmap baseline: {self.path}: short read (row {ids.max()} or "
                             f"{ids.min()} outside the file's {self.size} bytes)")  # fmt: skip
        if out is None:
            out = np.empty((ids.size, self.row_bytes), np.uint8)
        chunk = max(1, self.pool.shape[0] // self._span)
        for lo in range(0, ids.size, chunk):
            self._gather(ids[lo : lo + chunk], out[lo : lo + chunk])
        self.rows += ids.size
        return out

    def _gather(self, ids: np.ndarray, out: np.ndarray) -> None:
        a = self.offset + ids * self.row_bytes
        first = a // PAGE
        count = (a + self.row_bytes - 1) // PAGE - first + 1  # pages of each row
        starts = np.repeat(np.cumsum(count) - count, count)
        pages = np.unique(np.repeat(first, count) + np.arange(int(count.sum())) - starts)
        slots, miss = _lru_pages(pages, self._prev, self._nxt, self._slot, self._free,
                                 self._head)  # fmt: skip
        # A row hits when all its pages were cached (a row's pages are adjacent in ``pages``).
        missed = np.concatenate([[0], np.cumsum(miss)])
        at = np.searchsorted(pages, first)
        self.hits += int(np.count_nonzero(missed[at + count] == missed[at]))
        ms, mo = slots[miss], pages[miss] * PAGE
        got = np.empty(ms.size, np.int64)
        cuts = np.linspace(0, ms.size, self.threads + 1).astype(np.int64)
        parts = [slice(int(x), int(y)) for x, y in itertools.pairwise(cuts) if y > x]

        def read(part: slice) -> None:
            _read_pages(self._fd, self.pool, ms[part], mo[part], got[part])
            if self.throttle is not None:
                n = part.stop - part.start
                self.throttle.wait(n * PAGE, n)

        for f in [self._threads.submit(read, p) for p in parts]:
            f.result()
        short = np.flatnonzero(got != np.minimum(PAGE, self.size - mo))
        if short.size:
            raise SolarError(f"mmap baseline: {self.path}: short read at byte {mo[short[0]]}")
        _copy_rows(self.pool, self._slot, ids, self.offset, self.row_bytes, out)
        self.bytes_read += ms.size * PAGE

    def close(self) -> None:
        """Stop the threads and close the file (idempotent)."""
        if self._fd >= 0:
            self._threads.shutdown()
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> MmapGather:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""The I/O plan: typed tasks, built by pure functions and executed by one executor
(:class:`solar.io.executor.Executor`).

:func:`plan_reads` turns "read these samples into these rows" into tasks that name files, byte
offsets and destination rows; :func:`plan_slot_reads` and :func:`plan_slot_writes` do the same
for the second tier's records. They open nothing, so they are tested without files. A new way
of reading is a new task type here and one case in the executor: the tier's reads are
:class:`PreadvRuns` (and :class:`BounceRun`) on its descriptor, like the dataset's.

Chunked datasets whose filters solar decodes (:func:`solar.io.codecs.decoder_for`) become
:class:`ChunkReads`: the chunks a step needs, from :func:`solar.io.chunks.chunks_for_rows`,
split over the reader's threads; everything else without a byte offset stays :class:`H5Rows`.
"""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

from solar._memory import PAGE
from solar.errors import SolarError
from solar.io.chunks import ChunkIndex, RowPlan, chunks_for_rows, decodes_into_rows
from solar.io.codecs import Decoder, Fused

IOV_MAX = min(os.sysconf("SC_IOV_MAX"), 1024) if hasattr(os, "sysconf") else 1024
RUN_MAX_BYTES = 8 * 2**20  # largest single read; longer runs are cut so threads share them
# Buffered reads: two rows at most this many bytes apart are one call, the bytes between copied
# into GAP and dropped (ROMIO's data sieving in small): a call and its page-cache lookup cost
# about as much as copying a page (CPU per served row: bench/cpu_row_bench.py).
JOIN_GAP = PAGE
GAP = np.empty(JOIN_GAP, np.uint8)  # written by every joined read, never read


@dataclass(frozen=True)
class Layout:
    """Where one key of one file lives: a byte offset, or None for chunks or h5py."""

    offset: int | None
    row_bytes: int
    chunk_rows: int  # samples per chunk along the first dimension; 0: not chunked
    decoded: bool = False  # chunked, and solar decodes its chunks (else h5py reads it)
    path: int = -1  # descriptor to read from (index into the reader's paths); -1: the file's
    whole: bool = False  # the whole dataset is one sample (one sample per file)


@dataclass(frozen=True, eq=False)
class FileLayouts:
    """Every file's layouts as compact arrays (a million files keep no million objects).

    ``offsets[f, k]`` is the byte offset of key ``k`` in file ``f`` (-1: none), ``chunk_rows``
    samples per chunk (0: not chunked), ``decoded`` whether solar decodes its chunks, ``paths``
    which descriptor holds it (-1: file ``f`` itself). ``layouts[f]`` gives file f's Layouts.
    """

    offsets: np.ndarray  # (files, keys) int64
    row_bytes: tuple[int, ...]  # (keys,)
    chunk_rows: np.ndarray  # (files, keys) int64
    decoded: np.ndarray  # (files, keys) bool
    paths: np.ndarray | None = None  # (files, keys) int64
    whole: bool = False

    def __len__(self) -> int:
        return int(self.offsets.shape[0])

    def __getitem__(self, f: int) -> list[Layout]:
        off, rows, dec = self.offsets[f].tolist(), self.chunk_rows[f].tolist(), self.decoded[f]
        paths = self.paths[f].tolist() if self.paths is not None else [-1] * len(off)
        return [
            Layout(None if o < 0 else o, b, c, bool(d), p, self.whole)
            for o, b, c, d, p in zip(off, self.row_bytes, rows, dec.tolist(), paths, strict=True)
        ]

    @property
    def decoded_count(self) -> int:
        """(file, key) pairs read through the chunk path."""
        return int(self.decoded.sum())


@dataclass(frozen=True)
class Runs:
    """Runs of adjacent samples in a request, cut at ``max_rows``.

    ``order`` sorts the request by sample; run j covers sorted entries
    ``[starts[j], starts[j] + counts[j])``, whose samples are consecutive.
    """

    order: np.ndarray  # (n,)
    starts: np.ndarray  # (runs,)
    counts: np.ndarray  # (runs,)


def coalesce_runs(local: np.ndarray, max_rows: int) -> Runs:
    """Group sample indices (within one file) into runs of adjacent samples, each at most
    ``max_rows`` long; a repeated index starts a new run."""
    # Not a stable sort: a repeated index reads the same bytes into each of its rows in any
    # order, and the default sort is ~6x faster (0.4 against 2.5 ms for a GNN step's 43k rows).
    order = np.argsort(local)
    srt = local[order]
    new_run = np.ones(srt.size, np.bool_)
    new_run[1:] = np.diff(srt) != 1
    run_start = np.flatnonzero(new_run)
    in_run = np.arange(srt.size) - run_start[np.cumsum(new_run) - 1]
    starts = np.flatnonzero(new_run | (in_run % max(1, max_rows) == 0))
    counts = np.diff(np.append(starts, srt.size))
    return Runs(order, starts, counts)


@dataclass(frozen=True, eq=False)
class PreadvRuns:
    """One ``preadv`` (or, with ``write``, ``pwritev``) per run of one descriptor.

    Run j moves ``counts[j]`` iovec entries from ``iov[starts[j]]`` on, back to back in the
    file from byte ``offsets[j]``. ``file`` names the descriptor in the task's byte source
    (the dataset's files: the reader's paths; the tier: its one file). ``drop``: drop the
    written pages from the page cache (a buffered tier must not become a hidden third tier).
    """

    file: int
    iov: np.ndarray  # (entries, 2) uint64: (address, length)
    starts: np.ndarray  # (runs,) first iovec entry of each run
    counts: np.ndarray  # (runs,) iovec entries in each run
    offsets: np.ndarray  # (runs,) file byte offset of each run
    write: bool = False
    drop: bool = False

    @property
    def requests(self) -> int:
        return int(self.starts.size)

    def want(self) -> np.ndarray:
        """(runs,) bytes each run moves: what each call must return."""
        return run_bytes(self.iov, self.starts, self.counts)


@njit(cache=True)
def run_bytes(iov, starts, counts):  # pragma: no cover - compiled
    """The bytes each run moves, from its own entries only (a task's runs are a share of a
    step's iov: summing all of it would cost every task the whole step). The GIL is kept: a
    few microseconds a task, where giving it up and taking it back cost a reader thread
    more (kernel time, measured: ~0.2 CPU-s a GNN run of 3 epochs)."""
    want = np.empty(starts.shape[0], np.int64)
    for j in range(starts.shape[0]):
        n = np.int64(0)
        for e in range(starts[j], starts[j] + counts[j]):
            n += np.int64(iov[e, 1])
        want[j] = n
    return want


@dataclass(frozen=True, eq=False)
class FileRuns:
    """One sample per file: one read per (file, key) stored at an offset, file-major, so
    that a file's keys are read under one open of it (one open per file, not per key).

    Read j puts ``iov[j, 1]`` bytes from offset ``offsets[j]`` of descriptor ``files[j]``
    at address ``iov[j, 0]``: row ``rows[j]`` of ``dests[keys[j]]``.
    """

    files: np.ndarray  # (n,) descriptor (index into the reader's paths) of each read
    offsets: np.ndarray  # (n,) file byte offset of each read
    iov: np.ndarray  # (n, 2) uint64: (address, length) of each read's destination row
    keys: np.ndarray  # (n,) key of each read
    rows: np.ndarray  # (n,) destination row of each read
    dests: tuple[np.ndarray, ...]  # (keys,) (batch rows, row bytes) uint8 views of ``out``

    @property
    def requests(self) -> int:
        return int(self.files.size)


@dataclass(frozen=True, eq=False)
class BounceRun:
    """One ``O_DIRECT`` read through this thread's page-aligned bounce buffer, for rows whose
    memory or size O_DIRECT cannot take: ``rows.size`` records of ``stride`` bytes from byte
    ``offset``; field k of record j (``dests[k].shape[1]`` bytes at ``fields[k]``) goes to
    row ``rows[j]`` of ``dests[k]``. A dataset key is one field; a tier slot, every key.
    """

    file: int
    offset: int
    stride: int
    fields: tuple[int, ...]  # (keys,) byte offset of each field in a record
    dests: tuple[np.ndarray, ...]  # (keys,) (batch rows, field bytes) uint8
    rows: np.ndarray  # (records,) destination row of each record, in file order

    requests = 1


@dataclass(frozen=True, eq=False)
class PageGather:
    """``O_DIRECT`` reads of small rows (a GNN's feature rows: 512 B-16 KiB), many per task:
    one ``pread`` per span of whole pages into this thread's bounce buffer, each row then
    copied to its batch row, all in one compiled call without the GIL (a Python call per row,
    as :class:`BounceRun` makes, costs more than the read itself at this size).

    Span s is the file's bytes ``[lo[s], lo[s] + size[s])`` (pages) holding rows
    ``first[s]..first[s + 1] - 1`` of ``src`` (each row's byte offset in the file, sorted)
    and ``rows`` (its destination row in ``dest``). What it returns is the bytes read from
    storage, whole pages: ``bytes read / bytes used`` is the read amplification.
    """

    file: int
    lo: np.ndarray  # (spans,) int64, page-aligned
    size: np.ndarray  # (spans,) int64, page multiples
    first: np.ndarray  # (spans + 1,) int64
    src: np.ndarray  # (rows,) int64
    rows: np.ndarray  # (rows,) int64
    dest: np.ndarray  # (batch rows, row bytes) uint8

    @property
    def requests(self) -> int:
        return int(self.lo.size)


SMALL_ROW = 4 * PAGE  # rows up to this size are read by PageGather under O_DIRECT
SPAN_MAX = 2**20  # longest span of PageGather (its rows are small: 1 MiB amortises a read)
GATHER_WINDOW = 4 * 2**20  # spans read per preadv call batch; a thread's buffer holds one


@njit(cache=True)
def page_spans(src, row_bytes, gap_pages, max_bytes, page):  # pragma: no cover - compiled
    """Spans of whole pages covering rows at sorted byte offsets ``src`` (``row_bytes`` each):
    a row joins the current span when its first page is within ``gap_pages`` pages of the
    span's end and the span stays within ``max_bytes``. Returns (lo, size, first)."""
    n = src.shape[0]
    lo = np.empty(n, np.int64)
    size = np.empty(n, np.int64)
    first = np.empty(n + 1, np.int64)
    s = -1
    end = np.int64(0)
    for j in range(n):
        a = src[j] // page * page
        b = (src[j] + row_bytes + page - 1) // page * page
        if s >= 0 and a <= end + gap_pages * page and b - lo[s] <= max_bytes:
            if b > end:
                end = b
        else:
            if s >= 0:
                size[s] = end - lo[s]
            s += 1
            lo[s] = a
            first[s] = j
            end = b
    if s >= 0:
        size[s] = end - lo[s]
    first[s + 1] = n
    return lo[: s + 1].copy(), size[: s + 1].copy(), first[: s + 2].copy()


@dataclass(frozen=True)
class H5Rows:
    """Rows of a chunked, compressed or non-native dataset, read through h5py."""

    file: int
    key: int
    local: np.ndarray  # (n,) sample index within the file
    rows: np.ndarray  # (n,) destination rows
    out: np.ndarray  # (batch rows, *sample shape) the destination array
    chunk_rows: int
    whole: bool = False  # the whole dataset is the one sample of its file

    @property
    def requests(self) -> int:
        """Chunks touched (one request each), or one per sample when not chunked."""
        if self.chunk_rows == 0 or self.whole:
            return int(self.local.size)
        return int(np.unique(self.local // self.chunk_rows).size)


@dataclass(frozen=True, eq=False)
class ChunkSource:
    """What reading one chunked key of one file needs: its chunk index and its decoder.

    Built lazily in the process that reads (it opens the file); plain data, so it pickles.
    """

    index: ChunkIndex
    decoder: Decoder
    fused: Fused | None = None  # its fast path (solar/io/fused.py), if it qualifies


@dataclass(frozen=True, eq=False)
class ChunkReads:
    """Some of the chunks one step needs from one chunked key: pread, decode, scatter.

    ``chunks`` are positions in ``plan.reads`` (in file order); ``pieces`` of them go to
    ``out[rows[plan.row]]``. ``run_starts`` cut ``chunks`` into runs stored back to back (one
    ``pread`` each). The task with ``fill`` also writes the fill value where no chunk was
    written. ``into_rows``: each chunk is one row of ``out``, so it decodes straight into it.
    """

    file: int
    key: int
    source: ChunkSource
    plan: RowPlan
    chunks: np.ndarray  # (m,) positions in plan.reads
    run_starts: np.ndarray  # (runs,) first entry of ``chunks`` in each run
    out: np.ndarray  # (batch rows, *sample shape) the destination array
    rows: np.ndarray  # (n,) destination row of each requested sample
    fill: bool
    into_rows: bool

    @property
    def requests(self) -> int:
        """One per chunk, as a remote file system would see the reads."""
        return int(self.chunks.size)

    @property
    def stored_bytes(self) -> int:
        """The compressed bytes this task reads."""
        return int(self.spans.sizes.sum())

    @functools.cached_property
    def spans(self) -> ChunkSpans:
        """Where its chunks are, in the file and in the reading thread's buffer; computed
        once (the job sizing, the advice and the reads all need it)."""
        index = self.source.index
        return ChunkSpans(
            *_spans(self.plan.reads, self.chunks, self.run_starts, index.offsets, index.sizes,
                    index.masks, PAGE)
        )  # fmt: skip


@dataclass(frozen=True, eq=False)
class ChunkSpans:
    """A ChunkReads task's chunks in the file, and where its reading thread puts them.

    Run r (chunks stored back to back) is the file's bytes ``[lo[r], hi[r])``, ``lo`` rounded
    down to a page as O_DIRECT needs; it is read into ``buffer[at[r]:at[r + 1]]``, page-aligned
    and page-rounded, so chunk j's stored bytes are ``buffer[starts[j]:starts[j] + sizes[j]]``.
    """

    positions: np.ndarray  # (m,) positions in the chunk index
    sizes: np.ndarray  # (m,) stored sizes
    lo: np.ndarray  # (runs,)
    hi: np.ndarray  # (runs,)
    at: np.ndarray  # (runs + 1,) at[-1]: the buffer's size
    starts: np.ndarray  # (m,)
    masked: bool  # some chunk skipped a filter (its filter mask is not 0)


@njit(cache=True)  # with the GIL: a few µs on the consuming thread, no handoff to a reader
def _spans(reads, chunks, run_starts, offsets, sizes, masks, page):  # pragma: no cover - compiled
    """ChunkSpans' fields in one compiled call (numpy took ~15 µs per task for them)."""
    m, runs = chunks.size, run_starts.size
    positions = reads[chunks]
    off, size = offsets[positions], sizes[positions]
    lo = np.empty(runs, np.int64)
    hi = np.empty(runs, np.int64)
    at = np.zeros(runs + 1, np.int64)
    starts = np.empty(m, np.int64)
    for r in range(runs):
        a = run_starts[r]
        b = run_starts[r + 1] if r + 1 < runs else m  # the run is chunks a..b-1
        lo[r] = off[a] // page * page
        hi[r] = off[b - 1] + size[b - 1]
        at[r + 1] = at[r] + (hi[r] - lo[r] + page - 1) // page * page
        for j in range(a, b):
            starts[j] = at[r] + off[j] - lo[r]
    masked = False
    for j in range(m):
        masked = masked or masks[positions[j]] != 0
    return positions, size, lo, hi, at, starts, masked


Task = PreadvRuns | FileRuns | BounceRun | PageGather | H5Rows | ChunkReads  # executor's


def plan_reads(
    layouts: Sequence[Sequence[Layout]] | FileLayouts,
    file_starts: np.ndarray,
    samples: np.ndarray,
    out: list[np.ndarray],
    rows: np.ndarray,
    *,
    direct_io: bool,
    groups: int,
    chunks: Mapping[tuple[int, int], ChunkSource] | None = None,
    page_gap: int = 0,
) -> list[Task]:
    """The tasks that read ``samples[j]`` into ``out[key][rows[j]]`` for every key.

    ``layouts[f][k]`` says where key ``k`` of file ``f`` lives; an offset layout is read from
    descriptor ``layout.path`` (another file per key, as .npy keys are) or else ``f``.
    ``file_starts`` (files + 1,) holds the first global sample id of each file. Buffered runs
    of one file and key are dealt over ``groups`` tasks, so that threads share them; so are
    the chunks of a ``decoded`` layout, whose source ``chunks[file, key]`` must be given.
    Small rows under ``direct_io`` are read in page spans bridging ``page_gap`` pages.
    """
    samples = np.asarray(samples, np.int64)
    rows = np.asarray(rows, np.int64)
    if samples.size == 0:
        return []
    if samples.min() < 0 or samples.max() >= file_starts[-1]:
        raise SolarError(f"sample id out of range 0..{file_starts[-1] - 1}")
    low, high = int(rows.min()), int(rows.max())
    for a in out:
        if low < 0 or high >= a.shape[0]:
            raise SolarError(f"destination row out of range 0..{a.shape[0] - 1}")
    tasks: list[Task] = []
    if isinstance(layouts, FileLayouts) and layouts.whole and not direct_io:
        # One sample per file: each file's offset keys in a few tasks, not one task per file.
        tasks, samples, rows = _one_per_file_tasks(layouts, samples, rows, out, groups)
        if samples.size == 0:
            return tasks
    for f, sel, local in _by_file(file_starts, samples):
        for k, layout in enumerate(layouts[f]):
            if layout.offset is None and layout.decoded:
                source = (chunks or {}).get((f, k))
                if source is None:
                    raise SolarError(f"no chunk index for key {k} of file {f}")
                tasks.extend(_chunk_tasks(f, k, source, local, rows[sel], out[k], groups))
                continue
            if layout.offset is None:
                tasks.append(
                    H5Rows(f, k, local, rows[sel], out[k], layout.chunk_rows, layout.whole)
                )
                continue
            if not out[k].flags.c_contiguous or out[k][:1].nbytes not in (0, layout.row_bytes):
                raise SolarError(
                    f"destination for key {k} must be C-contiguous rows of {layout.row_bytes} B"
                )
            dest = out[k].reshape(out[k].shape[0], -1).view(np.uint8)
            fd = f if layout.path < 0 else layout.path
            tasks.extend(
                _offset_tasks(fd, layout, local, rows[sel], dest, direct_io, groups, page_gap)
            )
    return tasks


def _by_file(file_starts: np.ndarray, samples: np.ndarray) -> list[tuple[int, Any, np.ndarray]]:
    """(file, selection of ``samples``, their indices within the file) for each file touched,
    in file order; one file needs no grouping (a slice: no sort, no copies)."""
    if file_starts.size == 2:
        return [(0, slice(None), samples - file_starts[0])]
    file_index = np.searchsorted(file_starts, samples, side="right") - 1
    local = samples - file_starts[file_index]
    by_file = np.argsort(file_index, kind="stable")
    files, first = np.unique(file_index[by_file], return_index=True)
    return [
        (f, sel, local[sel])
        for f, sel in zip(files.tolist(), np.split(by_file, first[1:]), strict=True)
    ]


def _one_per_file_tasks(
    layouts: FileLayouts, samples: np.ndarray, rows: np.ndarray, out: list[np.ndarray], groups: int
) -> tuple[list[Task], np.ndarray, np.ndarray]:
    """Buffered reads of every sample whose keys are all stored at an offset: one read per
    (file, key), file-major, dealt in contiguous slices over ``groups`` tasks; returns them
    with the samples left (some key not at an offset)."""
    by_file = np.argsort(samples, kind="stable")  # file order: neighbours on disk
    samples, rows = samples[by_file], rows[by_file]
    offsets = layouts.offsets[samples]  # (n, keys); one sample per file: file == sample
    complete = (offsets >= 0).all(axis=1)
    sel = np.flatnonzero(complete)
    if sel.size == 0:
        return [], samples, rows
    nkeys = len(layouts.row_bytes)
    dests = []
    for k, nbytes in enumerate(layouts.row_bytes):
        if not out[k].flags.c_contiguous or out[k][:1].nbytes not in (0, nbytes):
            raise SolarError(f"destination for key {k} must be C-contiguous rows of {nbytes} B")
        dests.append(out[k].reshape(out[k].shape[0], -1).view(np.uint8))
    # (samples, keys) grids, flattened file-major: a file's keys are neighbours.
    r = np.repeat(rows[sel], nkeys)
    keys = np.tile(np.arange(nkeys, dtype=np.int64), sel.size)
    row_bytes = np.array(layouts.row_bytes, np.uint64)
    base = np.array([d.ctypes.data for d in dests], np.uint64)
    iov = np.empty((r.size, 2), np.uint64)
    iov[:, 0] = base[keys] + r.astype(np.uint64) * row_bytes[keys]
    iov[:, 1] = row_bytes[keys]
    paths = layouts.paths[samples[sel]] if layouts.paths is not None else None
    files = paths.reshape(-1) if paths is not None else np.repeat(samples[sel], nkeys)
    offs = offsets[sel].reshape(-1)
    # Whole samples per task (a file's keys stay together), contiguous: few opens each.
    tasks: list[Task] = []
    for part in np.array_split(np.arange(sel.size), min(groups, sel.size)):
        j = slice(int(part[0]) * nkeys, (int(part[-1]) + 1) * nkeys)
        tasks.append(FileRuns(files[j], offs[j], iov[j], keys[j], r[j], tuple(dests)))
    return tasks, samples[~complete], rows[~complete]


def _offset_tasks(
    f: int,
    layout: Layout,
    local: np.ndarray,
    rows: np.ndarray,
    dest: np.ndarray,
    direct_io: bool,
    groups: int,
    page_gap: int = 0,
) -> list[Task]:
    assert layout.offset is not None
    row_bytes = layout.row_bytes
    if not direct_io:
        order = np.argsort(local)  # (a repeated sample's rows in any order: coalesce_runs)
        iov, starts, counts, offsets = joined_runs(
            local[order], rows[order], np.uint64(dest.ctypes.data), row_bytes, layout.offset,
            np.uint64(GAP.ctypes.data), JOIN_GAP // max(1, row_bytes), IOV_MAX, RUN_MAX_BYTES,
        )  # fmt: skip
        return deal_runs(f, iov, starts, counts, offsets, groups)
    runs = coalesce_runs(local, min(IOV_MAX, RUN_MAX_BYTES // max(1, row_bytes)))
    srt, rows = local[runs.order], rows[runs.order]
    if row_bytes <= SMALL_ROW:
        src = layout.offset + srt * row_bytes
        return gather_tasks(f, src, row_bytes, rows, dest, groups, page_gap)
    offsets = layout.offset + srt[runs.starts] * row_bytes
    return [
        BounceRun(f, int(off), row_bytes, (0,), (dest,), rows[a : a + n])
        for off, a, n in zip(offsets.tolist(), runs.starts, runs.counts, strict=True)
    ]


@njit(cache=True)
def joined_runs(srt, rows, dest_at, row_bytes, offset, gap_at, gap_rows, max_entries, max_bytes):
    """Buffered reads of sorted samples ``srt`` into rows ``rows`` of the destination at
    ``dest_at``: one run (one ``preadv``) per stretch of samples at most ``gap_rows`` apart,
    the rows between read into ``gap_at``; a repeated sample starts a run, and a run stays
    within ``max_entries`` iovec entries and ``max_bytes``. Returns PreadvRuns' iov, starts,
    counts and offsets."""
    n = srt.shape[0]
    iov = np.empty((2 * n, 2), np.uint64)
    starts = np.empty(n, np.int64)
    counts = np.empty(n, np.int64)
    offsets = np.empty(n, np.int64)
    size = np.uint64(row_bytes)
    e, m, run = 0, -1, 0
    for j in range(n):
        gap = srt[j] - srt[j - 1] - 1 if j > 0 else -1
        extra = 2 if gap > 0 else 1
        if 0 <= gap <= gap_rows and counts[m] + extra <= max_entries and \
                run + (gap + 1) * row_bytes <= max_bytes:  # fmt: skip
            if gap > 0:
                iov[e, 0], iov[e, 1] = gap_at, np.uint64(gap) * size
                e += 1
            counts[m] += extra
            run += (gap + 1) * row_bytes
        else:
            m += 1
            starts[m], counts[m], offsets[m] = e, 1, offset + srt[j] * row_bytes
            run = row_bytes
        iov[e, 0], iov[e, 1] = dest_at + np.uint64(rows[j]) * size, size
        e += 1
    return iov[:e], starts[: m + 1], counts[: m + 1], offsets[: m + 1]


def gather_tasks(
    f: int, src: np.ndarray, row_bytes: int, rows: np.ndarray, dest: np.ndarray, groups: int,
    page_gap: int,
) -> list[Task]:  # fmt: skip
    """Small rows at sorted byte offsets ``src``: their page spans (bridging ``page_gap``
    pages), in at most ``groups`` tasks of contiguous spans (neighbours on disk stay in one
    thread's order)."""
    lo, size, first = page_spans(src, row_bytes, page_gap, SPAN_MAX, PAGE)
    tasks: list[Task] = []
    for part in np.array_split(np.arange(lo.size), min(groups, lo.size)):
        a, b = int(part[0]), int(part[-1]) + 1
        r = slice(int(first[a]), int(first[b]))
        tasks.append(PageGather(f, lo[a:b], size[a:b], first[a : b + 1] - first[a], src[r],
                                rows[r], dest))  # fmt: skip
    return tasks


def deal_runs(
    f: int,
    iov: np.ndarray,
    starts: np.ndarray,
    counts: np.ndarray,
    offsets: np.ndarray,
    groups: int,
    **kind: bool,
) -> list[Task]:
    """Runs cut into at most ``groups`` tasks of consecutive runs, about equal in iovec entries
    (rows: a tier's adjacent slots make long runs), so that threads share them and each reads
    its share in file order (the runs are sorted): dealt round-robin, a job of several tasks
    reads the file in interleaved sweeps, and page-cache reads cost ~8 % more CPU a GNN run
    (bench/cpu_row_bench.py, 3 pairs alternated)."""
    g = min(groups, starts.size)
    if g <= 0:
        return []
    ends = np.cumsum(counts)
    shares = ends[-1] * np.arange(1, g) / g
    cuts = np.unique(np.concatenate([[0], np.searchsorted(ends, shares) + 1, [starts.size]]))
    return [PreadvRuns(f, iov, starts[a:b], counts[a:b], offsets[a:b], **kind)
            for a, b in itertools.pairwise(cuts.tolist()) if a < b]  # fmt: skip


def _chunk_tasks(
    f: int,
    k: int,
    source: ChunkSource,
    local: np.ndarray,
    rows: np.ndarray,
    out: np.ndarray,
    groups: int,
) -> list[Task]:
    """The chunks ``local`` need, in file order, cut into at most ``groups`` tasks.

    Contiguous slices (not round-robin) keep each task's chunks adjacent in the file, so a
    task reads them in few ``pread`` calls; several chunks per task, because a task costs
    about as much Python as decoding a fast codec's chunk.
    """
    index = source.index
    if out.shape[1:] != index.shape[1:]:
        raise SolarError(f"destination for key {k} must have sample shape {index.shape[1:]}")
    plan = chunks_for_rows(index, local)
    m = int(plan.reads.size)
    into_rows = decodes_into_rows(index, out)
    if m <= 1:  # a single sample's chunk: one task, no split (its numpy calls cost ~20 µs)
        everything = np.arange(m)
        return [ChunkReads(f, k, source, plan, everything, everything, out, rows, True, into_rows)]
    parts = np.array_split(np.arange(m), max(1, min(groups, m)))
    tasks: list[Task] = []
    for i, part in enumerate(parts):
        runs = chunk_runs(index, plan.reads[part])
        tasks.append(ChunkReads(f, k, source, plan, part, runs, out, rows, i == 0, into_rows))
    return tasks


def chunk_runs(index: ChunkIndex, positions: np.ndarray, max_bytes: int = RUN_MAX_BYTES):
    """Where runs of chunks stored back to back start (indices into ``positions``, which are
    in file order); a run is cut before it exceeds ``max_bytes`` unless it is one chunk."""
    offsets, sizes = index.offsets[positions], index.sizes[positions]
    if positions.size == 0:
        return np.zeros(0, np.int64)
    new = np.ones(positions.size, np.bool_)
    new[1:] = offsets[1:] != offsets[:-1] + sizes[:-1]
    starts = np.flatnonzero(new)
    if int(sizes.sum()) <= max_bytes:
        return starts
    # Cut long runs: a short Python pass over runs, not chunks' bytes.
    cut: list[int] = []
    ends = np.append(starts[1:], positions.size)
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        run = 0
        for j in range(a, b):
            if j == a or run + int(sizes[j]) > max_bytes:
                cut.append(j)
                run = 0
            run += int(sizes[j])
    return np.array(cut, np.int64)


@dataclass(frozen=True)
class SlotLayout:
    """Records of whole samples in a file (the second tier): every key's row back to back,
    in key order, each record padded to ``stride`` bytes, a multiple of ``PAGE``."""

    sizes: tuple[int, ...]  # (keys,) row bytes of each key

    @functools.cached_property
    def fields(self) -> tuple[int, ...]:
        """(keys,) byte offset of each key's row in a record."""
        return tuple(int(x) for x in np.cumsum((0, *self.sizes[:-1])))

    @functools.cached_property
    def stride(self) -> int:
        return max(PAGE, -(-sum(self.sizes) // PAGE) * PAGE)

    @functools.cached_property
    def run_cap(self) -> int:
        """Records per call: at most RUN_MAX_BYTES, and iovec entries (keys + padding each)
        within IOV_MAX."""
        return max(1, min(RUN_MAX_BYTES // self.stride, IOV_MAX // (len(self.sizes) + 1)))


def plan_slot_reads(
    layout: SlotLayout,
    slots: np.ndarray,
    dests: Sequence[np.ndarray],
    rows: np.ndarray,
    *,
    into_rows: bool,
    scratch: int,
    groups: int,
) -> list[Task]:
    """The tasks that read record ``slots[j]`` into row ``rows[j]`` of every ``dests[k]``
    ((batch rows, row bytes) uint8 each). ``into_rows``: straight into the rows, the padding
    between records into ``scratch`` (an address of at least a page, its bytes discarded);
    else one bounce read per run (O_DIRECT with rows it cannot take). Adjacent records are
    one call."""
    runs = coalesce_runs(slots, layout.run_cap)
    t, r = slots[runs.order], rows[runs.order]
    offsets = t[runs.starts] * layout.stride
    if not into_rows:
        return [
            BounceRun(0, int(off), layout.stride, layout.fields, tuple(dests), r[a : a + n])
            for off, a, n in zip(offsets.tolist(), runs.starts, runs.counts, strict=True)
        ]
    pad = layout.stride - sum(layout.sizes)
    per = len(layout.sizes) + (pad > 0)  # iovec entries per record
    iov = np.empty((r.size, per, 2), np.uint64)  # (records, entries, (address, length))
    for k, (d, size) in enumerate(zip(dests, layout.sizes, strict=True)):
        iov[:, k, 0] = d.ctypes.data + r.astype(np.uint64) * np.uint64(size)
        iov[:, k, 1] = size
    if pad:
        iov[:, -1] = (scratch, pad)
    iov = iov.reshape(-1, 2)  # (records * entries, 2)
    # At most ``groups`` tasks, each worth a full run or more: the tier is fast local storage,
    # where a task's handoff costs more than splitting its reads gains.
    groups = max(1, min(groups, -(-slots.size // layout.run_cap)))
    return deal_runs(0, iov, runs.starts * per, runs.counts * per, offsets, groups)


def plan_slot_writes(
    layout: SlotLayout, slots: np.ndarray, staging: np.ndarray, stage: np.ndarray, *, drop: bool
) -> PreadvRuns:
    """The task that writes row ``stage[j]`` of ``staging`` ((rows, stride) uint8,
    page-aligned) to record ``slots[j]``; ``slots`` sorted and distinct."""
    runs = coalesce_runs(slots, layout.run_cap)  # sorted already: runs.order is the identity
    iov = np.empty((slots.size, 2), np.uint64)
    iov[:, 0] = staging.ctypes.data + stage.astype(np.uint64) * np.uint64(layout.stride)
    iov[:, 1] = layout.stride
    offsets = slots[runs.starts] * layout.stride
    return PreadvRuns(0, iov, runs.starts, runs.counts, offsets, write=True, drop=drop)

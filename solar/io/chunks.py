"""Where a chunked dataset's rows live: its chunk index, and the I/O plan for a set of rows.

``chunk_index`` lists every stored chunk of a dataset (start coordinates, file offset, stored
size, filter mask) from h5py's chunk index; chunks never written are absent and read as the
dataset's fill value. ``chunks_for_rows`` is a pure function from the index and the sample rows
a step needs (indices along axis 0) to a ``RowPlan``: which chunks to read, each once and in file
order, and for each needed row the piece of which chunk holds it. ``scatter_chunk`` and
``fill_absent`` copy decoded chunks into destination rows, one numpy copy per chunk, converting
to the destination's byte order. ``decode_chunk`` decodes one read into its rows (straight into
a row when a chunk is exactly one); the executor (solar/io/executor.py) reads the chunks.

A chunk whose sample dimensions are cut (e.g. chunks (7, 2, 4) over shape (N, 5, 6)) covers one
*cell* of the chunk grid along the sample axes; a row is then assembled from one piece per cell.
HDF5 stores edge chunks full-size, so a decoded chunk always has the full chunk shape and only
the part inside the dataset is copied.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import h5py
import numpy as np
from numba import njit

from solar.errors import SolarError, truncated
from solar.io.codecs import Buffer, Decoder


@dataclass(frozen=True, eq=False)
class ChunkIndex:
    """The stored chunks of one chunked dataset, sorted by their position in the chunk grid."""

    file: str
    name: str
    shape: tuple[int, ...]
    chunk_shape: tuple[int, ...]
    dtype: np.dtype  # the file's dtype (byte order included)
    fill_value: np.ndarray  # 0-d, the file's dtype: what never-written chunks read as
    starts: np.ndarray  # (n, ndim) int64: logical start coordinates of each stored chunk
    offsets: np.ndarray  # (n,) int64: byte offset in the file
    sizes: np.ndarray  # (n,) int64: stored (filtered) size in bytes
    masks: np.ndarray  # (n,) uint32: filter mask (bit i set: filter i skipped for this chunk)
    slot: np.ndarray  # (cells,) int64: grid cell (row-major) -> position above; -1: not stored

    @property
    def grid(self) -> tuple[int, ...]:
        """Chunks along each axis (edge chunks included)."""
        return tuple(-(-n // c) for n, c in zip(self.shape, self.chunk_shape, strict=True))

    @property
    def cells(self) -> int:
        """Chunk-grid cells along the sample axes: the chunks one row is spread over."""
        return int(np.prod(self.grid[1:], dtype=np.int64))

    @property
    def num_chunks(self) -> int:
        return int(self.offsets.shape[0])

    def region(self, cell: int) -> tuple[tuple[slice, ...], tuple[slice, ...]]:
        """For a cell along the sample axes: (its slices in a row, the same part in a chunk)."""
        coords = np.unravel_index(int(cell), self.grid[1:]) if self.shape[1:] else ()
        dst, src = [], []
        for c, size, n in zip(coords, self.chunk_shape[1:], self.shape[1:], strict=True):
            lo = int(c) * size
            hi = min(lo + size, n)
            dst.append(slice(lo, hi))
            src.append(slice(0, hi - lo))
        return tuple(dst), tuple(src)


def chunk_index(dset: h5py.Dataset, *, iterate: bool = True) -> ChunkIndex:
    """The chunk index of a chunked dataset (``chunk_iter`` where h5py and HDF5 have it).

    ``iterate=False`` forces the slower lookup used where ``chunk_iter`` is missing.
    Raises ``SolarError`` if the dataset is not chunked, a chunk sits off the chunk grid or
    twice, or a chunk runs past the end of the file (a truncated file).
    """
    file, name = str(dset.file.filename), dset.name
    if dset.chunks is None:
        raise SolarError(f"{file}: key {name!r} is not chunked")
    shape, chunk_shape = tuple(dset.shape), tuple(dset.chunks)
    grid = tuple(-(-n // c) for n, c in zip(shape, chunk_shape, strict=True))
    records = _stored_chunks(dset.id, grid, iterate)
    ndim = len(shape)
    starts = np.array([r.chunk_offset for r in records], np.int64).reshape(-1, ndim)
    offsets = np.array([r.byte_offset for r in records], np.int64)
    sizes = np.array([r.size for r in records], np.int64)
    masks = np.array([r.filter_mask for r in records], np.uint32)
    chunk = np.array(chunk_shape, np.int64)
    coords = starts // chunk
    if np.any(starts % chunk) or np.any(coords >= np.array(grid, np.int64)) or np.any(starts < 0):
        raise SolarError(f"{file}: key {name!r}: corrupt chunk index (a chunk off the grid)")
    cell = np.ravel_multi_index(tuple(coords.T), grid) if len(records) else np.zeros(0, np.int64)
    order = np.argsort(cell, kind="stable")
    cell = cell[order]
    if np.any(cell[1:] == cell[:-1]):
        raise SolarError(f"{file}: key {name!r}: corrupt chunk index (a chunk stored twice)")
    slot = np.full(int(np.prod(grid, dtype=np.int64)), -1, np.int64)
    slot[cell] = np.arange(cell.shape[0])
    starts, offsets, sizes, masks = starts[order], offsets[order], sizes[order], masks[order]
    _check_chunks_in_file(file, name, starts, offsets, sizes)
    fill = np.array(_fill_value(dset), dset.dtype).reshape(())
    return ChunkIndex(
        file, name, shape, chunk_shape, dset.dtype, fill, starts, offsets, sizes, masks, slot
    )


def _fill_value(dset: h5py.Dataset):
    """What h5py reads where no chunk was written.

    With fill time "never" HDF5 leaves the caller's memory as it was; h5py reads into fresh
    (zeroed) arrays, so zero is what it returns in practice.
    """
    if dset.id.get_create_plist().get_fill_time() == h5py.h5d.FILL_TIME_NEVER:
        return 0
    return dset.fillvalue


def _stored_chunks(dsid: h5py.h5d.DatasetID, grid: tuple[int, ...], iterate: bool = True) -> list:
    """h5py's StoreInfo records of the allocated chunks.

    ``chunk_iter`` walks the index once (≈2 µs a chunk; h5py >= 3.8 on HDF5 >= 1.12.3/1.14,
    which h5py's wheels bundle). Without it, every grid cell is looked up by its coordinates
    (≈0.2 ms a cell here); ``get_chunk_info(i)`` would cost O(n) per call, O(n²) in all.
    """
    if iterate and hasattr(dsid, "chunk_iter"):
        records: list = []
        try:
            dsid.chunk_iter(records.append)
            return records
        except (AttributeError, NotImplementedError, RuntimeError):
            pass
    records = []
    chunk = dsid.get_create_plist().get_chunk()
    for cell in np.ndindex(*grid):
        coords = tuple(int(c) * s for c, s in zip(cell, chunk, strict=True))
        info = dsid.get_chunk_info_by_coord(coords)
        if info.byte_offset is not None:
            records.append(info)
    return records


def _check_chunks_in_file(file: str, name: str, starts, offsets, sizes) -> None:
    """Every stored chunk ends within the file, else the file is truncated."""
    if offsets.shape[0] == 0:
        return
    ends = offsets + sizes
    worst = int(np.argmax(ends))
    file_size = os.path.getsize(file)
    if ends[worst] > file_size:
        where = f"key {name!r}, chunk at {tuple(starts[worst].tolist())}"
        raise truncated(file, where, int(ends[worst]), file_size)


@dataclass(frozen=True, eq=False)
class RowPlan:
    """The I/O plan for a list of rows: the chunks to read and where each row's pieces are.

    A piece is the part of one destination row held by one chunk (one per cell along the
    sample axes). Pieces are sorted by the chunk they come from: those of ``reads[k]`` are
    ``bounds[k]:bounds[k + 1]``; those before ``bounds[0]`` lie in chunks never written and
    take the fill value.
    """

    reads: np.ndarray  # (m,) positions in the index of the chunks to read, each once, by offset
    bounds: np.ndarray  # (m + 1,) start of each read's pieces
    row: np.ndarray  # (p,) destination: position in the requested rows
    within: np.ndarray  # (p,) the row inside the chunk (axis 0); sample axes start at 0
    cell: np.ndarray  # (p,) cell along the sample axes (ChunkIndex.region gives its slices)

    @property
    def num_fill(self) -> int:
        return int(self.bounds[0])


def chunks_for_rows(index: ChunkIndex, rows: Sequence[int] | np.ndarray) -> RowPlan:
    """Which chunks hold ``rows`` (axis-0 indices; repeats allowed) and where each piece is.

    Pure and vectorised: no per-row Python. Chunks are listed once each, in file-offset order
    (the order a reader coalesces adjacent reads in).
    """
    rows = np.asarray(rows, np.int64).reshape(-1)
    n = index.shape[0] if index.shape else 0
    if rows.size and (rows.min() < 0 or rows.max() >= n):
        bad = int(rows[(rows < 0) | (rows >= n)][0])
        raise ValueError(f"row {bad} is outside {index.name!r} (0..{n - 1})")
    if one_row_chunks(index):
        return _one_row_plan(index, rows)
    return _general_plan(index, rows)


def one_row_chunks(index: ChunkIndex) -> bool:
    """Whether every chunk is exactly one whole row (one sample per chunk, sample axes uncut):
    a row's chunk is then a slot lookup, with no pieces to cut."""
    return bool(index.shape) and index.chunk_shape == (1, *index.shape[1:])


def _one_row_plan(index: ChunkIndex, rows: np.ndarray) -> RowPlan:
    """``_general_plan`` for one-row chunks: the same arrays from one compiled call (a
    single-sample read paid ~60 µs of numpy calls per key for its plan)."""
    reads, bounds, order = _one_row_kernel(index.slot, index.offsets, rows)
    zeros = np.zeros(rows.size, np.int64)  # one piece per row: row 0 of its chunk, cell 0
    return RowPlan(reads, bounds, order, zeros, zeros)


@njit(cache=True)  # with the GIL: a few µs on the consuming thread, no handoff to a reader
def _one_row_kernel(slot, offsets, rows):  # pragma: no cover - compiled
    """(reads, bounds, order) of a one-row-chunk plan: rows sorted by their chunk's offset,
    never-written ones first, stably (rows ascend within a chunk, as ``_general_plan``'s
    lexsort leaves them); each stored chunk read once."""
    n = rows.size
    chunk = np.empty(n, np.int64)
    key = np.empty(n, np.int64)
    for j in range(n):
        chunk[j] = slot[rows[j]]
        key[j] = offsets[chunk[j]] if chunk[j] >= 0 else -1
    order = np.argsort(key, kind="mergesort")  # stable
    reads = np.empty(n, np.int64)
    bounds = np.empty(n + 1, np.int64)
    m = 0
    previous = -2
    for i in range(n):
        c = chunk[order[i]]
        if c >= 0 and c != previous:
            reads[m] = c
            bounds[m] = i
            m += 1
        previous = c
    bounds[m] = n
    return reads[:m].copy(), bounds[: m + 1].copy(), order.astype(np.int64)


def _general_plan(index: ChunkIndex, rows: np.ndarray) -> RowPlan:
    """Any chunk shape: one piece per (row, cell along the sample axes)."""
    cells = index.cells
    c0 = index.chunk_shape[0]
    row = np.repeat(np.arange(rows.size, dtype=np.int64), cells)
    cell = np.tile(np.arange(cells, dtype=np.int64), rows.size)
    within = np.repeat(rows % c0, cells)
    slot = index.slot[np.repeat(rows // c0, cells) * cells + cell]
    stored = slot >= 0
    uniq = np.unique(slot[stored])
    by_offset = np.argsort(index.offsets[uniq], kind="stable")
    reads = uniq[by_offset]
    rank = np.empty_like(by_offset)
    rank[by_offset] = np.arange(by_offset.size)
    read = np.full(slot.shape, -1, np.int64)
    read[stored] = rank[np.searchsorted(uniq, slot[stored])]
    order = np.lexsort((row, read))
    read = read[order]
    bounds = np.searchsorted(read, np.arange(reads.size + 1), side="left").astype(np.int64)
    bounds[-1] = read.size
    return RowPlan(reads, bounds, row[order], within[order], cell[order])


def scatter_chunk(
    index: ChunkIndex,
    plan: RowPlan,
    k: int,
    chunk: np.ndarray,
    out: np.ndarray,
    targets: np.ndarray | None = None,
) -> None:
    """Copy the pieces of the plan's ``k``-th read from its decoded ``chunk`` into ``out``.

    ``out[targets[j]]`` (or ``out[j]``) is the j-th requested row. Different reads write
    disjoint parts of ``out``, so reads can be scattered from several threads at once.
    """
    lo, hi = int(plan.bounds[k]), int(plan.bounds[k + 1])
    if lo == hi:
        return
    dst_rows = plan.row[lo:hi] if targets is None else targets[plan.row[lo:hi]]
    dst, src = index.region(int(plan.cell[lo]))  # a chunk covers exactly one cell
    # numpy's stubs cannot type a tuple mixing an index array with slices: build it as Any
    first: Any = int(dst_rows[0]) if hi - lo == 1 else dst_rows
    within: Any = int(plan.within[lo]) if hi - lo == 1 else plan.within[lo:hi]
    out[(first, *dst)] = chunk[(within, *src)]


def fill_absent(
    index: ChunkIndex, plan: RowPlan, out: np.ndarray, targets: np.ndarray | None = None
) -> None:
    """Write the fill value into the pieces that lie in chunks never written."""
    if plan.num_fill == 0:
        return
    rows, cells = plan.row[: plan.num_fill], plan.cell[: plan.num_fill]
    if targets is not None:
        rows = targets[rows]
    for cell in np.unique(cells):
        dst, _ = index.region(int(cell))
        out[(rows[cells == cell], *dst)] = index.fill_value


def decodes_into_rows(index: ChunkIndex, out: np.ndarray) -> bool:
    """Whether a chunk of ``index`` is exactly one row of ``out``, byte for byte."""
    return (
        one_row_chunks(index)
        and out.dtype == index.dtype
        and out.flags.c_contiguous
        and out.shape[1:] == index.shape[1:]
    )


def read_chunk(fd: int, index: ChunkIndex, position: int) -> bytes:
    """The stored bytes of chunk ``position`` of the index, with one ``os.pread``."""
    size, offset = int(index.sizes[position]), int(index.offsets[position])
    raw = os.pread(fd, size, offset)
    if len(raw) != size:
        where = tuple(index.starts[position].tolist())
        what = f"key {index.name!r}, chunk at {where}: read {len(raw)} of {size} bytes; it"
        raise truncated(index.file, what, offset + size, os.fstat(fd).st_size)
    return raw


def decode_chunk(
    index: ChunkIndex,
    decoder: Decoder,
    plan: RowPlan,
    k: int,
    raw: Buffer,
    out: np.ndarray,
    targets: np.ndarray | None = None,
    *,
    into_rows: bool,
) -> None:
    """Decode the plan's ``k``-th read from its stored bytes ``raw`` into its rows of ``out``.

    ``into_rows`` (:func:`decodes_into_rows`): the chunk is decoded straight into the first row
    that asked for it and copied to the others (the same sample requested twice in a step);
    else decoded into a new array and scattered. The fast path (solar/io/fused.py) does the
    same in its compiled loop.
    """
    position = int(plan.reads[k])
    mask, where = int(index.masks[position]), index.starts[position]
    if not into_rows:
        scatter_chunk(index, plan, k, decoder.decode(raw, mask, where), out, targets)
        return
    lo, hi = int(plan.bounds[k]), int(plan.bounds[k + 1])
    rows = plan.row[lo:hi] if targets is None else targets[plan.row[lo:hi]]
    first = int(rows[0])
    decoder.decode(raw, mask, where, out=out[first : first + 1])
    if rows.size > 1:
        out[rows[1:]] = out[first]

"""solar's graph file written in bounded memory: a CSR from a stream of edges, rows in blocks.

The file is HDF5, every dataset contiguous, native-endian and 4 KiB-aligned (the features are
gathered with offsets, the topology memory-mapped): ``indptr`` (N + 1,) int64, ``indices``
(E,) int32 (int64 from 2^31 nodes), ``features`` (N, ...) as the source has them, ``labels``
(N,) int64 (-1: unlabelled), and ``train_idx`` / ``valid_idx`` / ``test_idx`` int64.

The CSR is by target: node v's row lists the sources of the edges into v (PyG's direction of
messages, what :class:`~solar.graph.neighbor.NeighborSampler` samples). It is built by passes
over the edge stream, never from all edges in memory: a counting pass (in-degrees, node ids
checked, an order-free checksum of the (source, target) pairs; skipped when the source knows
its degrees), then, per range of targets whose rows fit the budget, a pass that places that
range's sources (in stream order within a row) and writes the range. Memory: 8·(N + 1) bytes
of row pointers (the degrees are counted into them) plus ``memory``: half for the stream's
blocks of edges (~40 B an edge, 48 with a node order: :func:`edge_bytes`), half for the range
being placed (12 B an edge: its entry and its row's cursor; a range holds at most as many
nodes), so about 24·max(E, N) / memory placing passes.

Before the atomic rename the file is read back: every row source's hash must equal what was
written, the CSR must be one of N nodes, and its pairs' checksum must equal the stream's. A
node order (``order``: new id i is old node ``order[i]``) relabels everything on the way, the
hook for a locality-improving permutation.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import h5py
import numpy as np
from numba import njit

from solar._atomic import atomic_path
from solar.config import Size
from solar.errors import SolarError
from solar.schedule.draw.rng import GOLDEN, mix64

ALIGN = 4096
DEFAULT_MEMORY = 2**30
SPLITS = ("train_idx", "valid_idx", "test_idx")
_MIN_MEMORY = 16 * 2**20

Progress = Callable[[int, int], None]


class EdgeSource(Protocol):
    """A re-readable stream of edges (source → target) over ``num_nodes`` nodes."""

    num_nodes: int
    where: str  # names the source in errors

    def chunks(self, size: int, lo: int = 0, hi: int | None = None) -> Iterator[tuple[Any, Any]]:
        """(src, dst) int64 arrays of at most ``size`` edges each, every edge once; a source may
        skip edges whose target is outside ``[lo, hi)``."""
        ...

    def degrees(self) -> np.ndarray | None:
        """In-degree of every node when known without a pass over the edges, else None."""
        ...


class RowSource(Protocol):
    """Rows of an (N, ...) array read in blocks: an array, a memory map, an .npy file."""

    shape: tuple[int, ...]
    dtype: np.dtype

    def read(self, lo: int, hi: int) -> np.ndarray: ...

    def take(self, ids: np.ndarray) -> np.ndarray: ...


@dataclass
class GraphParts:
    """What :func:`write_csr_graph` writes: edges, and rows by node (features, labels), and
    the node splits (``train_idx``, ``valid_idx``, ``test_idx``)."""

    edges: EdgeSource
    features: RowSource | None = None
    labels: RowSource | None = None
    splits: dict[str, np.ndarray] = field(default_factory=dict)
    undirected: bool = False  # store each edge in both directions


def memory_bytes(memory: int | str, name: str = "memory") -> int:
    """A memory budget in bytes from an int (bytes) or a size text ("512MiB")."""
    if isinstance(memory, int) and not isinstance(memory, bool):
        amount = memory
    else:
        size = Size.parse(memory, name)
        if size.kind != "bytes" and not (size.kind == "samples" and isinstance(memory, str)):
            raise SolarError(f"{name}: give bytes (512MiB), got {memory!r}")
        amount = int(size.amount)
    if amount < _MIN_MEMORY:
        raise SolarError(f"{name}: {amount} bytes is below the {_MIN_MEMORY >> 20} MiB a "
                         "conversion needs")  # fmt: skip
    return amount


def write_csr_graph(
    dst: str | os.PathLike,
    parts: GraphParts,
    *,
    memory: int | str = DEFAULT_MEMORY,
    order: np.ndarray | None = None,
    progress: Progress | None = None,
) -> dict:
    """Write ``parts`` to ``dst`` as solar's graph file (module docstring), atomically, in
    about ``memory`` bytes beyond the row pointers; returns what was written."""
    budget = memory_bytes(memory)
    n = int(parts.edges.num_nodes)
    if n < 1:
        raise SolarError(f"{parts.edges.where}: a graph needs at least one node")
    inv = None
    if order is not None:
        order = np.asarray(order, np.int64)
        inv = _inverse(order, n)
    itype = np.dtype(np.int32 if n < 2**31 else np.int64)
    chunk = edge_block(budget, relabel=inv is not None)
    stream = _Stream(parts.edges, parts.undirected, inv)
    stream_edges = int(getattr(parts.edges, "num_edges", None) or 0) * (1 + parts.undirected)
    ticks = _Ticks(progress, stream_edges)
    known = parts.edges.degrees() if inv is None and not parts.undirected else None
    # The in-degrees are counted into indptr[1:] and summed there: 8 B per node, not 16.
    indptr = np.zeros(n + 1, np.int64)
    if known is not None:
        indptr[1:] = known
        checksum = None
    else:
        checksum = stream.count(chunk, ticks, indptr[1:])
    np.cumsum(indptr, out=indptr)  # in place: no second 8 B per node
    e = int(indptr[-1])
    rows = {
        k: v for k, v in (("features", parts.features), ("labels", parts.labels)) if v is not None
    }
    for name, src in rows.items():
        if src.shape[0] != n:
            raise SolarError(f"{name}: {src.shape[0]} rows, but the graph has {n} nodes")
    splits = {k: _split(v, n, k, inv) for k, v in parts.splits.items() if v is not None}
    digests: dict[str, Any] = {}
    with atomic_path(dst) as tmp:
        with h5py.File(tmp, "w", alignment_threshold=1, alignment_interval=ALIGN) as f:
            f.create_dataset("indptr", data=indptr)
            digests["indptr"] = _Digest().update(indptr)
            ind = _dataset(f, "indices", (e,), itype)
            place_budget = budget - chunk * edge_bytes(inv is not None)  # what blocks leave
            h = _Digest()
            ranges = list(row_ranges(indptr, max(1, place_budget // (itype.itemsize + 8))))
            ticks.total = ticks.done + len(ranges) * max(e, stream_edges)
            ticks.total += sum(n for _ in rows)
            for lo, hi in ranges:
                a, b = int(indptr[lo]), int(indptr[hi])
                out = np.empty(b - a, itype)
                cursor = indptr[lo:hi].copy()
                cursor -= a
                stream.place(chunk, lo, hi, cursor, out, indptr, ticks)
                ind[a:b] = out
                h.update(out)
                del out, cursor
            digests["indices"] = h
            for name, src in rows.items():
                digests[name] = _copy_rows(f, name, src, budget, inv, order, ticks)
            for name, ids in splits.items():
                f.create_dataset(name, data=ids)
                digests[name] = _Digest().update(ids)
        _verify(tmp, indptr, digests, checksum, budget)
    return {"nodes": n, "edges": e, "features": _describe(parts.features),
            "labels": parts.labels is not None, "splits": sorted(splits)}  # fmt: skip


# -- edges -------------------------------------------------------------------------------------
class _Stream:
    """The edge source as the writer sees it: both directions if undirected, relabelled by
    ``inv`` (old id → new id), ids checked against N."""

    def __init__(self, edges: EdgeSource, undirected: bool, inv: np.ndarray | None) -> None:
        self.edges, self.undirected, self.inv = edges, undirected, inv
        self.n = int(edges.num_nodes)

    def _chunks(self, size: int, lo: int = 0, hi: int | None = None):
        src_lo, src_hi = (0, None) if (self.undirected or self.inv is not None) else (lo, hi)
        for s, d in self.edges.chunks(size, src_lo, src_hi):
            s, d = _int64(s, self.edges.where), _int64(d, self.edges.where)
            if s.shape != d.shape:
                raise SolarError(f"{self.edges.where}: sources and targets differ in length")
            bad = _bad_ids(s, d, self.n)
            if bad >= 0:
                raise SolarError(f"{self.edges.where}: an edge names a node outside "
                                 f"0..{self.n - 1} ({int(s[bad])} → {int(d[bad])})")  # fmt: skip
            if self.inv is not None:
                s, d = self.inv[s], self.inv[d]
            yield s, d
            if self.undirected:
                yield d, s

    def count(self, size: int, ticks: _Ticks, counts: np.ndarray) -> int:
        """In-degrees added into ``counts``; the pairs' checksum."""
        total = np.zeros(1, np.uint64)
        for s, d in self._chunks(size):
            _count(s, d, self.n, counts, total)
            ticks.add(s.size)
        return int(total[0])

    def place(self, size, lo, hi, cursor, out, indptr, ticks) -> None:
        for s, d in self._chunks(size, lo, hi):
            if _place(s, d, lo, hi, cursor, indptr[lo + 1 : hi + 1] - indptr[lo], out) != 0:
                raise SolarError(f"{self.edges.where}: the edges changed between two passes "
                                 "(a row overflowed)")  # fmt: skip
            ticks.add(s.size)
        if not np.array_equal(cursor, indptr[lo + 1 : hi + 1] - indptr[lo]):
            raise SolarError(f"{self.edges.where}: the edges changed between two passes "
                             "(a row came short)")  # fmt: skip


def _int64(a: Any, where: str) -> np.ndarray:
    a = a.numpy() if hasattr(a, "numpy") and not isinstance(a, np.ndarray) else np.asarray(a)
    if not np.issubdtype(a.dtype, np.integer):
        raise SolarError(f"{where}: node ids must be integers, got {a.dtype}")
    return np.ascontiguousarray(a, np.int64).reshape(-1)


def edge_block(budget: int, relabel: bool = False) -> int:
    """Edges per block of a pass over the edges: half of ``budget`` at :func:`edge_bytes`
    each."""
    return int(min(1 << 24, max(1 << 12, budget // (2 * edge_bytes(relabel)))))


def edge_bytes(relabel: bool = False) -> int:
    """Bytes an edge of a block costs: ~40 (the block's two int64 ids, and a text reader's
    16 bytes or an ``.npy`` block's converted copy), 48 with a node order (its relabelled
    copy: 16 more, e.g. a text list's 16 + 16 + 16)."""
    return 48 if relabel else 40


@njit(cache=True, nogil=True)
def _ascending(a):  # pragma: no cover - compiled
    for j in range(1, a.shape[0]):
        if a[j] < a[j - 1]:
            return False
    return True


@njit(cache=True, nogil=True)
def _bad_ids(s, d, n):  # pragma: no cover - compiled
    for j in range(s.shape[0]):
        if s[j] < 0 or s[j] >= n or d[j] < 0 or d[j] >= n:
            return j
    return -1


@njit(cache=True, nogil=True)
def _count(s, d, n, counts, total):  # pragma: no cover - compiled
    """In-degrees into ``counts`` and the pairs' order-free checksum into ``total[0]`` (ids
    already checked against ``n``)."""
    acc = total[0]
    for j in range(s.shape[0]):
        counts[d[j]] += 1
        acc += mix64(np.uint64(s[j]) * np.uint64(n) + np.uint64(d[j]))
    total[0] = acc


@njit(cache=True, nogil=True)
def _rows_sum(indptr, indices, lo, n, total):  # pragma: no cover - compiled
    """:func:`_count`'s checksum over rows ``lo..`` of a CSR (``indptr`` their pointers,
    ``indices`` their entries); True if an entry names no node."""
    acc = total[0]
    base = indptr[0]
    for r in range(indptr.shape[0] - 1):
        for j in range(indptr[r] - base, min(indptr[r + 1] - base, indices.shape[0])):
            s = indices[j]
            if s < 0 or s >= n:
                return True
            acc += mix64(np.uint64(s) * np.uint64(n) + np.uint64(lo + r))
    total[0] = acc
    return False


@njit(cache=True, nogil=True)
def _place(s, d, lo, hi, cursor, ends, out):  # pragma: no cover - compiled
    """Put each edge's source whose target is in ``[lo, hi)`` at its row's cursor; 1 if a row
    would overflow its end (the stream is not the one counted)."""
    for j in range(s.shape[0]):
        v = d[j]
        if v < lo or v >= hi:
            continue
        p = cursor[v - lo]
        if p >= ends[v - lo] or p >= out.shape[0]:
            return 1
        out[p] = s[j]
        cursor[v - lo] = p + 1
    return 0


def row_ranges(indptr: np.ndarray, edges: int) -> Iterator[tuple[int, int]]:
    """Consecutive target ranges whose rows hold at most ``edges`` entries, and at most
    ``edges`` nodes (a longer row alone)."""
    n = indptr.shape[0] - 1
    lo = 0
    while lo < n:
        hi = int(np.searchsorted(indptr, indptr[lo] + edges, side="right")) - 1
        hi = min(n, lo + edges, max(hi, lo + 1))
        yield lo, hi
        lo = hi


# -- rows --------------------------------------------------------------------------------------
def _dataset(f: h5py.File, name: str, shape: tuple[int, ...], dtype: np.dtype) -> h5py.Dataset:
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)  # contiguous, its offset known at once
    return f.create_dataset(name, shape, dtype, dcpl=dcpl)


def _copy_rows(f, name, src: RowSource, budget, inv, order, ticks) -> Any:
    shape, dtype = tuple(src.shape), np.dtype(src.dtype).newbyteorder("=")
    if name == "labels":  # one class per node, (N, 1) as OGB keeps them or (N,)
        dtype, shape = np.dtype(np.int64), shape[:1]
    if dtype.kind not in "biuf" or dtype.fields is not None:
        raise SolarError(f"{name}: dtype {src.dtype} is not an array of numbers")
    d = _dataset(f, name, shape, dtype)
    row = max(1, dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64)))
    block = max(1, budget // 4 // row)  # the read, a converted copy and h5py's
    h = _Digest()
    for lo in range(0, shape[0], block):
        hi = min(lo + block, shape[0])
        values = src.read(lo, hi) if order is None else src.take(order[lo:hi])
        if name == "labels":
            values = class_labels(values)
        values = np.ascontiguousarray(values, dtype)
        d[lo:hi] = values
        h.update(values)
        ticks.add(hi - lo)
    return h


def class_labels(values: np.ndarray) -> np.ndarray:
    """Integer class labels; a float label must be whole, NaN (unlabelled, as OGB's) is -1."""
    v = np.asarray(values).reshape(values.shape[0], -1)
    if v.shape[1] != 1:
        raise SolarError(f"labels: one class per node expected, got {v.shape[1]} columns")
    v = v[:, 0]
    if v.dtype.kind == "f":
        nan = np.isnan(v)
        if np.any(v[~nan] != np.round(v[~nan])):
            raise SolarError("labels: class labels must be whole numbers")
        v = np.where(nan, -1, v)
    elif v.dtype.kind not in "iub":
        raise SolarError(f"labels: dtype {v.dtype} is not a class label")
    return v.astype(np.int64)


def _split(ids: Any, n: int, name: str, inv: np.ndarray | None) -> np.ndarray:
    a = _int64(ids, name)
    if a.size and (a.min() < 0 or a.max() >= n):
        raise SolarError(f"{name}: node ids outside 0..{n - 1}")
    if inv is not None:
        a = np.sort(inv[a])
    return a


def _inverse(order: np.ndarray, n: int) -> np.ndarray:
    if order.shape != (n,):
        raise SolarError(f"order: expected a permutation of {n} nodes, got shape {order.shape}")
    inv = np.full(n, -1, np.int64)
    if order.min(initial=0) < 0 or order.max(initial=0) >= n:
        raise SolarError("order: not a permutation of the nodes")
    inv[order] = np.arange(n)
    if (inv < 0).any():
        raise SolarError("order: not a permutation of the nodes (a node twice)")
    return inv


class _Digest:
    """An order-aware checksum of an array's elements (a pass of 1-2 ns per element, where a
    cryptographic hash of features would cost as much as writing them): what was written
    against what reads back, whatever the blocks."""

    def __init__(self) -> None:
        self.total = np.zeros(1, np.uint64)
        self.pos = 0

    def update(self, a: np.ndarray) -> _Digest:
        a = np.ascontiguousarray(a).reshape(-1)
        if a.itemsize in (1, 2, 4, 8) and a.size:
            _fold(a.view(f"u{a.itemsize}"), self.pos, self.total)
        elif a.size:
            _fold(a.view(np.uint8), self.pos * a.itemsize, self.total)
        self.pos += a.size
        return self

    def digest(self) -> int:
        return int(self.total[0]) ^ self.pos


@njit(cache=True, nogil=True)
def _fold(vals, pos, total):  # pragma: no cover - compiled
    acc = total[0]
    for i in range(vals.shape[0]):
        acc += mix64(np.uint64(vals[i]) + np.uint64(pos + i) * GOLDEN)
    total[0] = acc


def _describe(src: RowSource | None) -> list | None:
    return None if src is None else [list(src.shape), str(np.dtype(src.dtype))]


# -- verification ------------------------------------------------------------------------------
def _verify(
    path: Path, indptr: np.ndarray, digests: Mapping[str, Any], checksum: int | None, budget: int
) -> None:
    """Read ``path`` back in blocks: every hash as written (``indptr``'s too, so the one in
    memory is the file's), a CSR of N nodes, the pairs' checksum."""
    n = indptr.shape[0] - 1
    with h5py.File(path, "r") as f:
        for name, want in digests.items():
            d = f[name]
            if d.chunks is not None or (d.id.get_offset() is None and d.size):
                raise SolarError(f"{path}: {name} is not contiguous")
            h = _Digest()
            row = max(1, d.dtype.itemsize * int(np.prod(d.shape[1:], dtype=np.int64)))
            step = max(1, budget // 4 // row)
            for lo in range(0, d.shape[0], step):
                h.update(d[lo : lo + step])
            if h.digest() != want.digest():
                raise SolarError(f"{path}: {name} does not read back as written")
        if indptr[0] != 0 or not _ascending(indptr) or indptr[-1] != f["indices"].shape[0]:
            raise SolarError(f"{path}: indptr is not a row pointer")
        total = np.zeros(1, np.uint64)
        ind = f["indices"]
        for lo, hi in row_ranges(indptr, max(1, budget // 32)):
            if _rows_sum(indptr[lo : hi + 1], ind[int(indptr[lo]) : int(indptr[hi])], lo, n,
                         total):  # fmt: skip
                raise SolarError(f"{path}: indices name nodes outside 0..{n - 1}")
        if checksum is not None and int(total[0]) != checksum:
            raise SolarError(f"{path}: the edges written are not the source's")


class _Ticks:
    """Progress over the passes: edges streamed and rows copied (``total`` grows once the
    number of passes is known)."""

    def __init__(self, progress: Progress | None, total: int) -> None:
        self.progress, self.done, self.total = progress, 0, total

    def add(self, k: int) -> None:
        self.done += k
        if self.progress is not None:
            self.progress(self.done, max(self.total, self.done))

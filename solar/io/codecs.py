"""Decoding HDF5 chunks outside h5py: a dataset's filter pipeline as a frozen ``Decoder``.

A chunked dataset's filters are listed in its creation property list in the order HDF5 applies
them when writing; a chunk is decoded by undoing them in reverse order, skipping each filter
whose bit is set in the chunk's filter mask (HDF5 skips an optional filter that fails, e.g. LZF
on incompressible data). What each filter is and how it is undone is its record in
solar/io/filters.py; every decoder there releases the GIL, so chunks decode in parallel on the
reader's threads. Sizes are checked at every stage that knows its output size, so a corrupt
length field cannot make a stage allocate more than the chunk.

A dataset whose pipeline has a filter without a decoder here gets an ``Unsupported`` with the
reason, and the caller reads it through h5py. Bad data (a codec error, a wrong decoded size, a
fletcher32 mismatch) raises ``SolarError`` naming the file, dataset and chunk: never wrong bytes.
"""

from __future__ import annotations

import ctypes
import functools
import math
from dataclasses import dataclass
from typing import cast

import h5py
import numpy as np

from solar.errors import SolarError, first_line
from solar.io.filters import FILTERS, Buffer, Filter, Settings, filter_problem

_DONT_FILTER_PARTIAL_CHUNKS = 0x0002  # H5Pset_chunk_opts: edge chunks stored unfiltered


@dataclass(frozen=True)
class Stage:
    """One filter of the pipeline, in HDF5's (writing) order: plain data, so it pickles."""

    filter: Filter
    cd_values: Settings
    itemsize: int  # the dataset's element size (shuffle and bitshuffle default to it)

    @property
    def name(self) -> str:
        return self.filter.name

    @property
    def label(self) -> str:
        """What describe_decoding shows, e.g. "bitshuffle(lz4)"."""
        return self.filter.label(self.cd_values)

    def decode(self, buf: memoryview, size: int | None, dst: memoryview | None) -> Buffer:
        """Turn the bytes this filter wrote back into its input.

        ``size`` is that input's length when known (None after a compressor earlier in the
        pipeline); ``dst``, when given, is a writable buffer of ``size`` bytes for the result
        (the last stage decodes straight into the caller's array). The result may be shorter
        or longer than ``size``: the Decoder checks.
        """
        decode = self.filter.decode
        assert decode is not None  # decoder_for builds stages of filters it decodes only
        return decode(self.cd_values, self.itemsize, buf, size, dst)


@dataclass(frozen=True)
class Unsupported:
    """A dataset whose chunks this module does not decode; ``reason`` says why (one line)."""

    reason: str


@dataclass(frozen=True)
class Decoder:
    """Turns one stored chunk (raw bytes + filter mask) into the chunk's array.

    ``stages`` are in writing order; decoding runs them backwards. The decoded array has the
    chunk's full shape (HDF5 stores edge chunks full-size) and the file's dtype, byte order
    included: converting to native order happens when rows are assembled.
    """

    file: str
    name: str
    shape: tuple[int, ...]
    chunk_shape: tuple[int, ...]
    dtype: np.dtype
    stages: tuple[Stage, ...]
    unfiltered_edges: bool = False  # H5D_CHUNK_DONT_FILTER_PARTIAL_CHUNKS is set

    @functools.cached_property
    def chunk_nbytes(self) -> int:
        return math.prod(self.chunk_shape) * self.dtype.itemsize

    @property
    def label(self) -> str:
        return "+".join(s.label for s in self.stages) or "no filters"

    def decode(
        self, raw: Buffer, mask: int = 0, where=None, out: np.ndarray | None = None
    ) -> np.ndarray:
        """Decode one chunk: an array of the chunk's shape and the file's dtype.

        ``mask`` is the chunk's filter mask, ``where`` its start coordinates (they name it in
        errors, and are required when edge chunks are stored unfiltered). With ``out`` (a
        writable C-contiguous array of the chunk's byte size, e.g. a batch row), the last
        stage decodes straight into it and the result is a view of it.
        """
        if self.unfiltered_edges:
            if where is None:
                raise ValueError(f"{self.name}: edge chunks are stored unfiltered: pass where")
            if self._is_edge(where):
                mask = ~0
        dst = None
        if out is not None:
            dst = _bytes(out)
            if dst.readonly or dst.nbytes != self.chunk_nbytes:
                raise ValueError(f"out must be writable and hold {self.chunk_nbytes} bytes")
        sizes, applied = self._plan(mask)
        data: Buffer = _bytes(raw)
        for i in reversed(applied):
            stage = self.stages[i]
            target = dst if i == applied[0] else None
            try:
                data = stage.decode(_bytes(data), sizes[i], target)
            except SolarError as exc:
                raise self._error(where, f"{stage.name}: {exc}") from None
            except Exception as exc:  # the codec libraries raise their own error types
                raise self._error(
                    where, f"{stage.name} decode failed ({first_line(exc)})"
                ) from None
        nbytes = _bytes(data).nbytes
        if nbytes != self.chunk_nbytes:
            raise self._error(where, f"decoded to {nbytes} bytes, expected {self.chunk_nbytes}")
        if dst is None:
            return np.frombuffer(data, self.dtype).reshape(self.chunk_shape)
        if _address(data) != _address(dst):  # no filter, or the last one returned a view
            dst[:] = _bytes(data)
        return np.frombuffer(dst, self.dtype).reshape(self.chunk_shape)

    def _plan(self, mask: int) -> tuple[tuple[int | None, ...], tuple[int, ...]]:
        """Each stage's input length when writing (its decoded output), the stages applied."""
        return _stage_plan(self._added, self.chunk_nbytes, mask & ((1 << len(self.stages)) - 1))

    @functools.cached_property
    def _added(self) -> tuple[int | None, ...]:
        return tuple(s.filter.added for s in self.stages)

    def _is_edge(self, where) -> bool:
        return any(
            int(w) + c > n for w, c, n in zip(where, self.chunk_shape, self.shape, strict=True)
        )

    def _error(self, where, what: str) -> SolarError:
        at = "" if where is None else f", chunk at {tuple(int(w) for w in where)}"
        return SolarError(f"{self.file}: key {self.name!r}{at}: {what}")


@functools.cache
def _stage_plan(
    added: tuple[int | None, ...], nbytes: int, mask: int
) -> tuple[tuple[int | None, ...], tuple[int, ...]]:
    """For stages adding ``added`` bytes each (None: a compressor) to a chunk of ``nbytes``, and
    a filter mask: each stage's input length when writing (None: unknown), the stages applied.
    A few (pipeline, mask) pairs per process: computed once each."""
    sizes: list[int | None] = []
    size: int | None = nbytes
    for i, more in enumerate(added):
        sizes.append(size)
        if not mask >> i & 1 and size is not None:
            size = None if more is None else size + more
    applied = tuple(i for i in range(len(added)) if not mask >> i & 1)
    return tuple(sizes), applied


@dataclass(frozen=True)
class Fused:
    """How a pipeline decodes on the fast path (solar/io/fused.py, which finds it): its one
    compressor, and the byte shuffle undone after it."""

    codec: str  # the compressor's filter name: "deflate" or "zstd"
    shuffle: int  # item size of the byte shuffle to undo; 0: none


# -- building a decoder from a dataset -------------------------------------------------------


def pipeline(dset: h5py.Dataset) -> list[tuple[int, int, tuple[int, ...], str]]:
    """The dataset's filters in writing order: (id, flags, cd_values, name)."""
    plist = dset.id.get_create_plist()
    out = []
    for i in range(plist.get_nfilters()):
        filter_id, flags, cd, name = plist.get_filter(i)
        out.append((int(filter_id), int(flags), tuple(int(v) for v in cd), _text(name)))
    return out


def decoder_for(dset: h5py.Dataset) -> Decoder | Unsupported:
    """A ``Decoder`` for a chunked dataset's chunks, or ``Unsupported`` saying why not."""
    if dset.chunks is None:
        return Unsupported("not chunked")
    dtype = dset.dtype
    if dtype.kind not in "biufc" or dtype.fields is not None or dtype.subdtype is not None:
        return Unsupported(f"dtype {dtype} is not a plain number type")
    stages = []
    for filter_id, _flags, cd, name in pipeline(dset):
        problem = filter_problem(filter_id, cd, name)
        if problem:
            return Unsupported(problem)
        stages.append(Stage(FILTERS[filter_id], cd, dtype.itemsize))
    unknown = _size_unknown(stages)
    if unknown is not None:
        what = "follows another compressor: its decoded size is unknown"
        return Unsupported(f"{unknown.name} {what}")
    unfiltered_edges = _partial_chunks_unfiltered(dset)
    if unfiltered_edges is None and stages:
        return Unsupported("cannot tell whether edge chunks are filtered (H5Pget_chunk_opts)")
    return Decoder(
        file=str(dset.file.filename),
        name=dset.name,
        shape=tuple(dset.shape),
        chunk_shape=tuple(dset.chunks),
        dtype=dtype,
        stages=tuple(stages),
        unfiltered_edges=bool(unfiltered_edges),
    )


def describe_decoding(dset: h5py.Dataset, found: Decoder | Unsupported | None = None) -> str:
    """One line for ``solar inspect``: how this dataset's chunks are decoded (``found``: its
    :func:`decoder_for`, if already known)."""
    if dset.chunks is None:
        return "not chunked: no decoding"
    found = decoder_for(dset) if found is None else found
    if isinstance(found, Unsupported):
        return f"h5py fallback: {found.reason}"
    if not found.stages:
        return "parallel decode: no filters (raw chunks)"
    return f"parallel decode: {found.label}"


def _size_unknown(stages: list[Stage]) -> Stage | None:
    """The first stage that needs its decoded size (see ``Filter.needs_size``) after a
    compressor, whose output size is known only once decoded; None if there is none."""
    seen_compressor = False
    for stage in stages:
        if stage.filter.needs_size and seen_compressor:
            return stage
        seen_compressor = seen_compressor or stage.filter.compresses
    return None


def _partial_chunks_unfiltered(dset: h5py.Dataset) -> bool | None:
    """Whether H5D_CHUNK_DONT_FILTER_PARTIAL_CHUNKS is set (h5py does not expose it).

    Asked of the HDF5 library h5py loaded, under h5py's lock; None if the call is unavailable.
    """
    fn = _get_chunk_opts()
    if fn is None:
        return None
    opts = ctypes.c_uint(0)
    plist = dset.id.get_create_plist()
    with h5py._objects.phil:
        if fn(plist.id, ctypes.byref(opts)) < 0:
            return None
    return bool(opts.value & _DONT_FILTER_PARTIAL_CHUNKS)


@functools.cache
def _get_chunk_opts():
    """HDF5's H5Pget_chunk_opts from the library h5py loaded (looked up once), or None."""
    try:
        fn = ctypes.CDLL(h5py.h5p.__file__).H5Pget_chunk_opts
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int64, ctypes.POINTER(ctypes.c_uint)]
    fn.restype = ctypes.c_int
    return fn


def _text(name) -> str:
    return name.decode(errors="replace") if isinstance(name, bytes) else str(name)


def _bytes(buf: Buffer) -> memoryview:
    """A flat byte view of any buffer (numpy's stubs do not declare ndarray a Buffer)."""
    return memoryview(cast(bytes, buf)).cast("B")


def _address(buf: Buffer) -> int:
    return np.frombuffer(buf, np.uint8).ctypes.data

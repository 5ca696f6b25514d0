"""The chunk path's fast path: read and decode a task's chunks in one compiled call.

A chunk task (:class:`~solar.io.tasks.ChunkReads`) qualifies when :func:`fused_codec` finds
its pipeline is deflate or zstd, optionally after HDF5's byte shuffle, and the task decodes
each chunk straight into one batch row (one sample per chunk, ``ChunkReads.into_rows``) with no
filter skipped. :func:`read_fused` then ``pread``\\ s each run of chunks stored back to back
and inflates each chunk into its row, calling libdeflate's and zstd's C functions (the
libraries imagecodecs ships) from numba without the GIL.

Why: on the general path (``Reader._read_chunks``) a gzip sample of 288 KiB spent ~250 µs of
Python per sample around a ~650 µs decode, on two cores, holding the GIL the consuming
thread needs. Anything unusual — a short read, a codec error, a wrong decoded size — returns
a non-zero status, and the caller takes the general path, which names the problem: this
path never reports an error of its own.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

import numpy as np
from numba import njit, types

from solar._memory import thread_buffer
from solar.io import libc
from solar.io.codeclibs import external, link_codec_libraries
from solar.io.codecs import Decoder, Fused
from solar.io.filters import SHUFFLE, shuffle_width, unshuffle_into
from solar.io.tasks import ChunkReads


def fused_codec(decoder: Decoder) -> Fused | None:
    """The fast path's predicate: a ``Fused`` for datasets of one sample per chunk in native
    byte order (a chunk is then one batch row, byte for byte) whose pipeline is [shuffle,]
    deflate or zstd with C functions found, else None (the general path)."""
    one_row = decoder.chunk_shape == (1, *decoder.shape[1:])
    if not (one_row and decoder.dtype.isnative):
        return None
    stages = decoder.stages
    shuffle = 0
    if stages and stages[0].filter.id == SHUFFLE:
        shuffle = shuffle_width(stages[0].cd_values, stages[0].itemsize)
        stages = stages[1:]
    if len(stages) != 1 or kernel(stages[0].name) is None:
        return None
    return Fused(stages[0].name, shuffle if shuffle > 1 else 0)


def read_fused(
    fused: Fused, fd: int, buf: np.ndarray, task: ChunkReads, first: int, end: int
) -> int:
    """Read a task's runs ``first..end-1`` into ``buf`` (``task.spans.at[-1]`` bytes or more)
    and decode each of their chunks into its rows of ``task.out``, run by run; 0, or a
    non-zero status (the caller then takes the general path)."""
    sp, plan, out = task.spans, task.plan, task.out
    # The kernel trusts these sizes and layouts: check them here, once per task.
    if not (task.into_rows and out.flags.c_contiguous and buf.dtype == np.uint8):
        raise ValueError("read_fused needs a task decoding into C-contiguous rows, a byte buffer")
    if buf.size < sp.at[-1] or not buf.flags.c_contiguous:
        raise ValueError(f"read_fused needs a contiguous buffer of {sp.at[-1]} bytes")
    n = out[0].nbytes if fused.shuffle else 0
    scratch = thread_buffer(_scratch, n)[:n]
    rows = out.reshape(out.shape[0], -1).view(np.uint8)  # (rows, row bytes)
    run = kernel(fused.codec)
    assert run is not None  # fused_codec found it
    return int(
        run(
            fd, buf, first, end, task.run_starts, sp.lo, sp.hi, sp.at, sp.starts, sp.sizes,
            plan.bounds, plan.row, task.chunks, task.rows, rows, scratch, fused.shuffle,
        )
    )  # fmt: skip


def windows(nbytes: np.ndarray, limit: int) -> list[tuple[int, int]]:
    """Consecutive runs in groups of at most ``limit`` bytes (or one run): ``(first, end)``
    each, so that the caller advises the kernel of each group before reading it."""
    if int(nbytes.sum()) <= limit:
        return [(0, int(nbytes.size))]
    groups, first, total = [], 0, 0
    for r, n in enumerate(nbytes.tolist()):
        if r > first and total + n > limit:
            groups.append((first, r))
            first, total = r, 0
        total += n
    groups.append((first, int(nbytes.size)))
    return groups


_scratch = threading.local()  # per thread: a shuffled chunk before it is unshuffled into its row


@functools.cache
def kernel(codec: str) -> Callable | None:
    """The compiled read-and-decode loop for a compressor, by its filter name (see
    solar/io/filters.py; called as ``run(fd, buf, ...)``, see :func:`read_fused`), None for a
    compressor without one, or where this imagecodecs build does not export the C functions
    the loop calls (libdeflate's and zstd's, both: one cached kernel calls them)."""
    if codec not in _CODECS or not link_codec_libraries(_SYMBOLS):
        return None
    return functools.partial(_run, codec=_CODECS[codec])


_CODECS = {"deflate": 0, "zstd": 1}
# The C functions, declared by name (as libc's, solar/io/libc.py): the kernel links them when it
# is compiled or loaded, so it is cached like any other, not compiled in every process.
_SYMBOLS = {
    "_deflate": ["libdeflate_alloc_decompressor", "libdeflate_free_decompressor",
                 "libdeflate_zlib_decompress"],
    "_zstd": ["ZSTD_createDCtx", "ZSTD_freeDCtx", "ZSTD_decompressDCtx"],
}  # fmt: skip
_ptr, _size, _i32 = types.intp, types.uintp, types.int32
# libdeflate: a decompressor per call (a few KiB); zlib framing, as HDF5 writes it.
# enum result libdeflate_zlib_decompress(d, in, in_nbytes, out, out_nbytes_avail,
#                                        size_t *actual_out): NULL actual = exact size
_deflate_alloc = external("libdeflate_alloc_decompressor", _size)
_deflate_free = external("libdeflate_free_decompressor", types.void, _size)
_inflate = external("libdeflate_zlib_decompress", _i32, _size, _ptr, _size, _ptr, _size, _ptr)
# zstd: one decompression context per call, not one per chunk (ZSTD_decompress makes one).
# size_t ZSTD_decompressDCtx(ctx, void *dst, size_t cap, const void *src, size_t n): the size,
# or an error code (a huge value), never equal to a row's length.
_zstd_create = external("ZSTD_createDCtx", _size)
_zstd_free = external("ZSTD_freeDCtx", _size, _size)
_zstd = external("ZSTD_decompressDCtx", _size, _size, _ptr, _size, _ptr, _size)


@njit(nogil=True, cache=True)
def _begin(codec):  # pragma: no cover - compiled
    return _deflate_alloc() if codec == 0 else _zstd_create()


@njit(nogil=True, cache=True)
def _decode(codec, state, src, stored, dst, length):  # pragma: no cover - compiled
    if codec == 0:
        return _inflate(state, src, stored, dst, length, 0) == 0
    return _zstd(state, dst, length, src, stored) == length


@njit(nogil=True, cache=True)
def _end(codec, state):  # pragma: no cover - compiled
    if state != 0:
        if codec == 0:
            _deflate_free(state)
        else:
            _zstd_free(state)


@njit(nogil=True, cache=True)
def _run(fd, buf, first, end, run_starts, lo, hi, at, starts, sizes, bounds, prow, chunks,
         targets, rows, scratch, shuffle, codec):  # pragma: no cover - compiled  # fmt: skip
    """0, or: 1 + r for run r read short (or failed), -1 - j for chunk j not decoded,
    -1 - chunks.size if the codec's state could not be allocated.

    Run r holds chunks ``run_starts[r]`` up to the next run's first. Chunk j is
    ``plan.reads[chunks[j]]``; its pieces ``bounds[c]:bounds[c + 1]`` go to rows
    ``targets[prow[i]]`` (one piece, but a sample may be asked for twice in a step).
    """
    base = buf.ctypes.data
    length = rows.shape[1]
    unshuffled = shuffle > 1 and length >= 2 * shuffle  # HDF5 leaves shorter ones as they are
    state = _begin(codec)
    if state == 0:
        return -1 - chunks.size
    for r in range(first, end):
        span, got = at[r + 1] - at[r], 0
        while got < span:
            n = libc.pread(fd, base + at[r] + got, span - got, lo[r] + got)
            if n <= 0:  # end of file, or an error: the general path tells which
                break
            got += n
        if got < hi[r] - lo[r]:
            _end(codec, state)
            return 1 + r
        last = run_starts[r + 1] if r + 1 < run_starts.size else chunks.size
        for j in range(run_starts[r], last):  # decoded while later runs arrive
            c = chunks[j]
            dst = rows[targets[prow[bounds[c]]]]
            target = scratch.ctypes.data if unshuffled else dst.ctypes.data
            if not _decode(codec, state, base + starts[j], sizes[j], target, length):
                _end(codec, state)
                return -1 - j
            if unshuffled:
                unshuffle_into(scratch, dst, shuffle)
            # The same sample again: decode_chunk's copy (solar/io/chunks.py), compiled
            # here so that no Python runs between chunks.
            for i in range(bounds[c] + 1, bounds[c + 1]):
                rows[targets[prow[i]], :] = dst
    _end(codec, state)
    return 0

"""Bitshuffle chunks (HDF5 filter 32008): unshuffled whole, or block by block when compressed.

Its settings (``cd_values``): [2] the item size, [3] the block size in items, [4] the compression
of each block (none, LZ4 or Zstd). A chunk without compression is one imagecodecs call. With it,
the framing is: big-endian uint64 decoded size, uint32 block size in bytes; then each block as a
big-endian uint32 compressed size and the compressed bytes. The last block holds what is left
rounded down to 8 elements; the last (elements mod 8) elements follow as they are.

Blocks are small (8 KiB by default): an imagecodecs call per block costs more in call overhead,
with the GIL held, than the work. So one numba call without the GIL decodes a whole chunk: per
block, LZ4_decompress_safe or ZSTD_decompress (the libraries imagecodecs links) into a small
scratch buffer, then bitshuffle's bshuf_bitunshuffle into the output, as bitshuffle's own HDF5
filter does. Where this imagecodecs build does not export those functions, :func:`kernel` is
None and the filter's record refuses the pipeline (h5py reads it).
"""

from __future__ import annotations

import ctypes
import functools
import struct
from collections.abc import Callable

import numpy as np
from numba import njit

from solar.errors import SolarError
from solar.io.codeclibs import c_function, imagecodecs

NONE, LZ4, ZSTD = 0, 2, 3  # cd_values[4]: the compression applied to each block
COMPRESSIONS = {NONE: "none", LZ4: "lz4", ZSTD: "zstd"}

_BLOCK_ERRORS = {
    1: "bitshuffle block header runs past the end of the chunk",
    2: "bitshuffle block runs past the end of the chunk",
    3: "a bitshuffle block does not decompress to its size",
    4: "bitshuffle chunk length does not match its blocks",
    5: "bitshuffle could not unshuffle a block",
}


def decode(
    cd: tuple[int, ...], itemsize: int, buf: memoryview, size: int | None, dst: memoryview | None
):
    """The filter's decoder (see solar/io/filters.py): undo bitshuffle with settings ``cd``."""
    if len(cd) > 2:
        itemsize = cd[2]
    compression = _compression(cd)
    if compression == NONE:
        block = cd[3] if len(cd) > 3 else 0
        return imagecodecs.bitshuffle_decode(buf, itemsize=itemsize, blocksize=block, out=dst)
    return decode_bitshuffle(buf, size, itemsize, compression, dst)


def settings(cd: tuple[int, ...]) -> str:
    """What its label shows: the blocks' compression, e.g. "lz4"."""
    compression = _compression(cd)
    return COMPRESSIONS.get(compression, str(compression))


def check(cd: tuple[int, ...]) -> str | None:
    """Why chunks with these settings do not decode here, or None."""
    compression = _compression(cd)
    if compression not in COMPRESSIONS:
        return f"with compression {compression} has no decoder"
    if compression != NONE and kernel(compression) is None:
        what = COMPRESSIONS[compression]
        return f"with {what}: this imagecodecs build does not export the C functions needed"
    return None


def _compression(cd: tuple[int, ...]) -> int:
    return cd[4] if len(cd) > 4 else NONE


def decode_bitshuffle(
    buf: memoryview, size: int | None, itemsize: int, compression: int, dst: memoryview | None
) -> np.ndarray:
    """Decode a chunk whose blocks are compressed (``compression`` LZ4 or ZSTD) into ``dst``
    (or a new array); ``size``: its decoded length, when known. The caller has checked that
    :func:`kernel` exists for ``compression``."""
    if buf.nbytes < 12:
        raise SolarError(f"{buf.nbytes} bytes, too short for a bitshuffle header")
    total, block_bytes = struct.unpack_from(">QI", buf)
    if (size is not None and total != size) or total % itemsize or block_bytes % (8 * itemsize):
        raise SolarError(f"bad bitshuffle header (size {total}, block {block_bytes} bytes)")
    if not block_bytes:
        raise SolarError("bad bitshuffle header (block size 0)")
    out = np.empty(total, np.uint8) if dst is None else np.frombuffer(dst, np.uint8)
    if out.size != total:
        raise SolarError(f"decoded to {total} bytes, expected {out.size}")
    run = kernel(compression)
    assert run is not None  # the filter's check refused pipelines without it
    status = run(np.frombuffer(buf, np.uint8), out, block_bytes, itemsize)
    if status:
        raise SolarError(_BLOCK_ERRORS.get(status, f"bitshuffle block error {status}"))
    return out


@functools.cache
def kernel(compression: int) -> Callable | None:
    """The nogil block loop for LZ4 or Zstd blocks, built once per process (None: this
    imagecodecs build does not export the C functions it calls)."""
    vp, i32, i64, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_size_t
    if compression == LZ4:
        # int LZ4_decompress_safe(const char *src, char *dst, int srcSize, int dstCapacity)
        lz4 = c_function("_lz4", "LZ4_decompress_safe", i32, [vp, vp, i32, i32])
        if lz4 is None:
            return None

        @njit(nogil=True)  # not cached: these kernels embed the functions' addresses
        def inflate(src, dst, stored, length):  # pragma: no cover - compiled
            return lz4(src, dst, stored, length)

    elif compression == ZSTD:
        # size_t ZSTD_decompress(void *dst, size_t dstCapacity, const void *src, size_t srcSize)
        zstd = c_function("_zstd", "ZSTD_decompress", sz, [vp, sz, vp, sz])
        if zstd is None:
            return None

        @njit(nogil=True)
        def inflate(src, dst, stored, length):  # pragma: no cover - compiled
            return zstd(dst, length, src, stored)

    else:
        return None
    # int64_t bshuf_bitunshuffle(const void *in, void *out, size_t size, size_t elem_size,
    #                            size_t block_size): sizes in elements
    unshuffle = c_function("_bitshuffle", "bshuf_bitunshuffle", i64, [vp, vp, sz, sz, sz])
    if unshuffle is None:
        return None

    @njit(nogil=True)
    def run(src, dst, block_bytes, itemsize):  # pragma: no cover - compiled
        """0, or the _BLOCK_ERRORS code of the first problem."""
        total = dst.size
        elems = total // itemsize
        block_elems = block_bytes // itemsize
        full = elems // block_elems
        tail = elems % block_elems
        nblocks = full + (1 if tail - tail % 8 else 0)
        scratch = np.empty(block_bytes, np.uint8)
        pos = np.int64(12)  # int64 throughout: block sizes read from the chunk are int64
        at = 0
        for k in range(nblocks):
            length = block_bytes if k < full else (tail - tail % 8) * itemsize
            if pos + 4 > src.size:
                return 1
            stored = (
                (np.int64(src[pos]) << 24)
                | (np.int64(src[pos + 1]) << 16)
                | (np.int64(src[pos + 2]) << 8)
                | np.int64(src[pos + 3])
            )
            pos += 4
            if pos + stored > src.size:
                return 2
            if inflate(src.ctypes.data + pos, scratch.ctypes.data, stored, length) != length:
                return 3
            n = length // itemsize
            if unshuffle(scratch.ctypes.data, dst.ctypes.data + at, n, itemsize, n) != length:
                return 5
            pos += stored
            at += length
        if pos + total - at != src.size:
            return 4
        dst[at:] = src[pos:]
        return 0

    return run

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

import functools
import struct
from collections.abc import Callable

import numpy as np
from numba import njit, types

from solar.errors import SolarError
from solar.io.codeclibs import external, imagecodecs, link_codec_libraries

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
    """The nogil block loop for LZ4 or Zstd blocks (called ``run(src, dst, block_bytes,
    itemsize)``), None where this imagecodecs build does not export the C functions it calls
    (LZ4's, Zstd's and bitshuffle's, all three: one cached kernel calls them)."""
    if compression not in (LZ4, ZSTD) or not link_codec_libraries(_SYMBOLS):
        return None
    return functools.partial(_run, compression=compression)


# The C functions, declared by name (as libc's, solar/io/libc.py): the kernel links them when it
# is compiled or loaded, so it is cached like any other, not compiled in every process.
_SYMBOLS = {"_lz4": ["LZ4_decompress_safe"], "_zstd": ["ZSTD_decompress"],
            "_bitshuffle": ["bshuf_bitunshuffle"]}  # fmt: skip
_ptr, _size = types.intp, types.uintp
# int LZ4_decompress_safe(const char *src, char *dst, int srcSize, int dstCapacity)
_lz4 = external("LZ4_decompress_safe", types.int32, _ptr, _ptr, types.int32, types.int32)
# size_t ZSTD_decompress(void *dst, size_t dstCapacity, const void *src, size_t srcSize)
_zstd = external("ZSTD_decompress", _size, _ptr, _size, _ptr, _size)
# int64_t bshuf_bitunshuffle(const void *in, void *out, size_t size, size_t elem_size,
#                            size_t block_size): sizes in elements
_unshuffle = external("bshuf_bitunshuffle", types.int64, _ptr, _ptr, _size, _size, _size)


@njit(nogil=True, cache=True)
def _run(src, dst, block_bytes, itemsize, compression):  # pragma: no cover - compiled
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
        if compression == LZ4:
            got = np.int64(_lz4(src.ctypes.data + pos, scratch.ctypes.data, stored, length))
        else:
            got = np.int64(_zstd(scratch.ctypes.data, length, src.ctypes.data + pos, stored))
        if got != length:
            return 3
        n = length // itemsize
        if _unshuffle(scratch.ctypes.data, dst.ctypes.data + at, n, itemsize, n) != length:
            return 5
        pos += stored
        at += length
    if pos + total - at != src.size:
        return 4
    dst[at:] = src[pos:]
    return 0

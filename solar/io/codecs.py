"""Decoding HDF5 chunks outside h5py: the filter pipeline as a frozen ``Decoder``.

A chunked dataset's filters are listed in its creation property list in the order HDF5 applies
them when writing; a chunk is decoded by undoing them in reverse order, skipping each filter
whose bit is set in the chunk's filter mask (HDF5 skips an optional filter that fails, e.g. LZF
on incompressible data). Every codec call goes to a library that releases the GIL while it
works (imagecodecs: libdeflate, zstd, lz4, liblzf, c-blosc, bitshuffle and HDF5's own
fletcher32), and HDF5's byte shuffle is a numba kernel compiled with ``nogil``, so chunks decode
in parallel on the reader's threads. Sizes are checked at every stage that knows its output
size, so a corrupt length field cannot make a stage allocate more than the chunk.

A dataset whose pipeline has a filter without a decoder here gets an ``Unsupported`` with the
reason, and the caller reads it through h5py. Bad data (a codec error, a wrong decoded size, a
fletcher32 mismatch) raises ``SolarError`` naming the file, dataset and chunk: never wrong bytes.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import h5py
import numpy as np
from numba import njit

from solar.errors import SolarError, first_line

try:  # a default dependency; without it only shuffle-only pipelines decode here
    import imagecodecs as _imagecodecs
except ImportError:  # pragma: no cover - exercised only on a partial install
    _imagecodecs = None  # type: ignore[assignment]

# imagecodecs' stubs accept only bytes, bytearray and mmap, but its functions take any buffer
# (memoryview, ndarray), which is what lets chunks decode without copies: call it untyped.
imagecodecs: Any = _imagecodecs

# HDF5's registered filter ids (the HDF Group's list of registered filter plugins).
DEFLATE, SHUFFLE, FLETCHER32, SZIP, NBIT, SCALEOFFSET = 1, 2, 3, 4, 5, 6
LZF, BLOSC, LZ4, BITSHUFFLE, ZSTD = 32000, 32001, 32004, 32008, 32015
BLOSC2, BZIP2 = 32026, 307

FILTER_NAMES = {
    DEFLATE: "deflate",
    SHUFFLE: "shuffle",
    FLETCHER32: "fletcher32",
    SZIP: "szip",
    NBIT: "nbit",
    SCALEOFFSET: "scaleoffset",
    LZF: "lzf",
    BLOSC: "blosc",
    LZ4: "lz4",
    BITSHUFFLE: "bitshuffle",
    ZSTD: "zstd",
    BLOSC2: "blosc2",
    BZIP2: "bzip2",
}

_BSHUF_LZ4, _BSHUF_ZSTD = 2, 3  # bitshuffle's cd_values[4]: compression applied to each block
_DONT_FILTER_PARTIAL_CHUNKS = 0x0002  # H5Pset_chunk_opts: edge chunks stored unfiltered

Buffer = bytes | bytearray | memoryview | np.ndarray


@dataclass(frozen=True)
class Stage:
    """One filter of the pipeline, in HDF5's (writing) order: plain data, so it pickles."""

    filter_id: int
    name: str
    cd_values: tuple[int, ...]
    itemsize: int  # the dataset's element size (shuffle and bitshuffle default to it)
    label: str  # what describe_decoding shows, e.g. "bitshuffle(lz4)"

    @property
    def compresses(self) -> bool:
        """Its encoded size is unknown before decoding."""
        return self.filter_id not in (SHUFFLE, FLETCHER32)

    def decode(self, buf: memoryview, size: int | None, dst: memoryview | None) -> Buffer:
        """Turn the bytes this filter wrote back into its input.

        ``size`` is that input's length when known (None after a compressor earlier in the
        pipeline); ``dst``, when given, is a writable buffer of ``size`` bytes for the result
        (the last stage decodes straight into the caller's array). The result may be shorter
        or longer than ``size``: the Decoder checks.
        """
        return _DECODE[self.filter_id](self, buf, size, dst)


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

    def _plan(self, mask: int) -> tuple[list[int | None], list[int]]:
        """Each stage's input length when writing (its decoded output), the stages applied."""
        key = mask & ((1 << len(self.stages)) - 1)
        cache = self.__dict__.setdefault("_plans", {})  # per mask; a race only recomputes
        if key not in cache:
            applied = [i for i in range(len(self.stages)) if not key >> i & 1]
            cache[key] = (self._input_sizes(key), applied)
        return cache[key]

    def _input_sizes(self, mask: int) -> list[int | None]:
        sizes: list[int | None] = []
        size: int | None = self.chunk_nbytes
        for i, stage in enumerate(self.stages):
            sizes.append(size)
            if mask >> i & 1 or size is None:
                continue
            if stage.filter_id == FLETCHER32:
                size += 4
            elif stage.compresses:
                size = None
        return sizes

    def _is_edge(self, where) -> bool:
        return any(
            int(w) + c > n for w, c, n in zip(where, self.chunk_shape, self.shape, strict=True)
        )

    def _error(self, where, what: str) -> SolarError:
        at = "" if where is None else f", chunk at {tuple(int(w) for w in where)}"
        return SolarError(f"{self.file}: key {self.name!r}{at}: {what}")


@dataclass(frozen=True)
class Fused:
    """How a pipeline decodes on the fast path (solar/io/fused.py, which finds it): its one
    compressor, and the byte shuffle undone after it."""

    codec: str  # "deflate" or "zstd"
    shuffle: int  # item size of the byte shuffle to undo; 0: none


# -- the stages ------------------------------------------------------------------------------


@njit(nogil=True, cache=True)
def _unshuffle(src, dst, itemsize):  # pragma: no cover - compiled
    """HDF5's byte shuffle undone: byte j of element i is at src[j * n + i].

    Bytes past the last whole element are stored as they are. Sizes 2, 4 and 8 get loops with a
    constant width so that the compiler vectorises them (≈40× the generic loop).
    """
    n = src.size // itemsize
    if itemsize == 2:
        for i in range(n):
            for j in range(2):
                dst[2 * i + j] = src[j * n + i]
    elif itemsize == 4:
        for i in range(n):
            for j in range(4):
                dst[4 * i + j] = src[j * n + i]
    elif itemsize == 8:
        for i in range(n):
            for j in range(8):
                dst[8 * i + j] = src[j * n + i]
    else:
        for j in range(itemsize):
            for i in range(n):
                dst[itemsize * i + j] = src[j * n + i]
    for k in range(n * itemsize, src.size):
        dst[k] = src[k]


def unshuffle(buf: memoryview, itemsize: int, dst: memoryview | None = None) -> np.ndarray:
    """Undo HDF5's shuffle filter (bytes grouped by significance) for ``itemsize``-byte items."""
    src = np.frombuffer(buf, np.uint8)
    out = np.empty_like(src) if dst is None else np.frombuffer(dst, np.uint8)
    if out.size != src.size:
        raise SolarError(f"{src.size} bytes where {out.size} were expected")
    if itemsize <= 1 or src.size < 2 * itemsize:  # HDF5 leaves such buffers as they are
        out[:] = src
    else:
        _unshuffle(src, out, itemsize)
    return out


def _shuffle(stage: Stage, buf: memoryview, size: int | None, dst: memoryview | None):
    return unshuffle(buf, stage.cd_values[0] if stage.cd_values else stage.itemsize, dst)


def _fletcher32(stage: Stage, buf: memoryview, size: int | None, dst: memoryview | None):
    return verify_fletcher32(buf)


def verify_fletcher32(buf: memoryview) -> memoryview:
    """Check and strip the 4-byte checksum HDF5's fletcher32 filter appends to a chunk.

    The checksum is HDF5's Fletcher-32 over big-endian 16-bit words, stored little-endian;
    files from HDF5 before 1.6.3 stored it byte-swapped on little-endian machines, which HDF5
    still accepts, and so does this.
    """
    if buf.nbytes < 4:
        raise SolarError(f"{buf.nbytes} bytes, too short for a fletcher32 checksum")
    data = buf[:-4]
    stored = struct.unpack("<I", buf[-4:])[0]
    computed = imagecodecs.h5checksum_fletcher32(data)
    if stored != computed and stored != _byteswap32(computed):
        raise SolarError(
            f"fletcher32 checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
        )
    return data


def _byteswap32(value: int) -> int:
    return int.from_bytes(value.to_bytes(4, "little"), "big")


def _out(size: int | None, dst: memoryview | None):
    """imagecodecs' ``out``: the caller's buffer, else the expected size (None: unknown)."""
    return dst if dst is not None else size


def _deflate(stage: Stage, buf: memoryview, size: int | None, dst: memoryview | None):
    if size is None:
        return imagecodecs.zlib_decode(buf)
    return imagecodecs.deflate_decode(buf, out=_out(size, dst))  # libdeflate: needs the size


def _zstd(stage: Stage, buf: memoryview, size: int | None, dst: memoryview | None):
    return imagecodecs.zstd_decode(buf, out=_out(size, dst))


def _lz4(stage: Stage, buf: memoryview, size: int | None, dst: memoryview | None):
    return imagecodecs.lz4h5_decode(buf, out=_out(size, dst))


def _lzf(stage: Stage, buf: memoryview, size: int | None, dst: memoryview | None):
    # HDF5's LZF frames carry no length; decoder_for refuses pipelines where it is unknown.
    return imagecodecs.lzf_decode(buf, header=False, out=_out(size, dst))


def _blosc(stage: Stage, buf: memoryview, size: int | None, dst: memoryview | None):
    return imagecodecs.blosc_decode(buf, numthreads=1, out=_out(size, dst))


def _bitshuffle(stage: Stage, buf: memoryview, size: int | None, dst: memoryview | None):
    cd = stage.cd_values
    itemsize = cd[2] if len(cd) > 2 else stage.itemsize
    compression = cd[4] if len(cd) > 4 else 0
    if compression == 0:
        block = cd[3] if len(cd) > 3 else 0
        return imagecodecs.bitshuffle_decode(buf, itemsize=itemsize, blocksize=block, out=dst)
    return decode_bitshuffle(buf, size, itemsize, compression, dst)


BSHUF_MODES = ("fused", "blocks", "python")


def decode_bitshuffle(
    buf: memoryview,
    size: int | None,
    itemsize: int,
    compression: int,
    dst: memoryview | None = None,
    mode: str | None = None,
) -> np.ndarray:
    """Decode a bitshuffle chunk whose blocks are LZ4- or Zstd-compressed (HDF5 filter 32008).

    Framing: big-endian uint64 decoded size, uint32 block size in bytes; then each block as a
    big-endian uint32 compressed size and the compressed bytes. The last block holds what is
    left rounded down to 8 elements; the last (elements mod 8) elements follow as they are.

    Blocks are small (8 KiB by default): an imagecodecs call per block costs more in call
    overhead, with the GIL held, than the work. So ``mode`` "fused" (the default where the
    symbols are found) is one numba call without the GIL that, per block, calls the C functions
    of the libraries imagecodecs links: LZ4_decompress_safe or ZSTD_decompress into a small
    scratch buffer, then bitshuffle's bshuf_bitunshuffle into the output, as bitshuffle's own
    HDF5 filter does. "blocks" decompresses every block in numba, then unshuffles with one
    imagecodecs call; "python" loops over imagecodecs calls (the fallback).
    """
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
    if mode is None:
        mode = next(m for m in BSHUF_MODES if m == "python" or _kernel(compression, m))
    src = np.frombuffer(buf, np.uint8)
    if mode == "fused":
        _check_blocks(_kernel_for(compression, mode)(src, out, block_bytes, itemsize))
        return out
    shuffled = np.empty(total, np.uint8)  # every byte is written, or an error is raised
    if mode == "blocks":
        _check_blocks(_kernel_for(compression, mode)(src, shuffled, block_bytes, itemsize))
    else:
        _blocks_in_python(buf, shuffled, block_bytes, itemsize, compression)
    # a memoryview: given an ndarray, imagecodecs takes the item size from its dtype
    imagecodecs.bitshuffle_decode(
        _bytes(shuffled), itemsize=itemsize, blocksize=block_bytes // itemsize, out=out
    )
    return out


_BLOCK_ERRORS = {
    1: "bitshuffle block header runs past the end of the chunk",
    2: "bitshuffle block runs past the end of the chunk",
    3: "a bitshuffle block does not decompress to its size",
    4: "bitshuffle chunk length does not match its blocks",
    5: "bitshuffle could not unshuffle a block",
}


def _check_blocks(status: int) -> None:
    if status:
        raise SolarError(_BLOCK_ERRORS.get(status, f"bitshuffle block error {status}"))


def _block_lengths(total: int, block_bytes: int, itemsize: int) -> list[int]:
    elems, block_elems = total // itemsize, block_bytes // itemsize
    tail = elems % block_elems
    lengths = [block_bytes] * (elems // block_elems)
    if tail - tail % 8:
        lengths.append((tail - tail % 8) * itemsize)
    return lengths


def _blocks_in_python(
    buf: memoryview, out: np.ndarray, block_bytes: int, itemsize: int, compression: int
) -> None:
    view = _bytes(out)
    pos, at = 12, 0
    for length in _block_lengths(out.size, block_bytes, itemsize):
        if pos + 4 > buf.nbytes:
            raise SolarError(_BLOCK_ERRORS[1])
        (stored,) = struct.unpack_from(">I", buf, pos)
        pos += 4
        if pos + stored > buf.nbytes:
            raise SolarError(_BLOCK_ERRORS[2])
        block = buf[pos : pos + stored]
        if compression == _BSHUF_LZ4:
            got = imagecodecs.lz4_decode(block, header=False, out=view[at : at + length])
        else:
            got = imagecodecs.zstd_decode(block, out=view[at : at + length])
        if _bytes(got).nbytes != length:
            raise SolarError(_BLOCK_ERRORS[3])
        pos += stored
        at += length
    if pos + out.size - at != buf.nbytes:
        raise SolarError(_BLOCK_ERRORS[4])
    view[at:] = buf[pos:]


_kernels: dict[tuple[int, str], Callable | None] = {}


def _kernel_for(compression: int, mode: str) -> Callable:
    """The kernel of a mode that ``_kernel`` found (the caller checked)."""
    kernel = _kernel(compression, mode)
    assert kernel is not None
    return kernel


def _kernel(compression: int, mode: str) -> Callable | None:
    """The nogil block loop for (LZ4 or Zstd, fused or blocks), built once per process."""
    if mode not in ("fused", "blocks"):
        return None
    if (compression, mode) not in _kernels:
        _kernels[compression, mode] = _make_kernel(compression, mode == "fused")
    return _kernels[compression, mode]


def c_function(module: str, symbol: str, restype, argtypes):
    """A C function of the library an imagecodecs extension links, or None if not exported."""
    try:
        lib = ctypes.CDLL(importlib.import_module(f"imagecodecs.{module}").__file__)
        fn = getattr(lib, symbol)
    except (ImportError, OSError, AttributeError):
        return None
    fn.restype, fn.argtypes = restype, argtypes
    return fn


def _make_kernel(compression: int, fused: bool) -> Callable | None:
    vp, i32, i64, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_size_t
    if compression == _BSHUF_LZ4:
        # int LZ4_decompress_safe(const char *src, char *dst, int srcSize, int dstCapacity)
        lz4 = c_function("_lz4", "LZ4_decompress_safe", i32, [vp, vp, i32, i32])
        if lz4 is None:
            return None

        @njit(nogil=True)  # not cached: these kernels embed the functions' addresses
        def inflate(src, dst, stored, length):  # pragma: no cover - compiled
            return lz4(src, dst, stored, length)

    else:
        # size_t ZSTD_decompress(void *dst, size_t dstCapacity, const void *src, size_t srcSize)
        zstd = c_function("_zstd", "ZSTD_decompress", sz, [vp, sz, vp, sz])
        if zstd is None:
            return None

        @njit(nogil=True)
        def inflate(src, dst, stored, length):  # pragma: no cover - compiled
            return zstd(dst, length, src, stored)

    # int64_t bshuf_bitunshuffle(const void *in, void *out, size_t size, size_t elem_size,
    #                            size_t block_size): sizes in elements
    unshuffle_fn = c_function("_bitshuffle", "bshuf_bitunshuffle", i64, [vp, vp, sz, sz, sz])
    if fused and unshuffle_fn is None:
        return None
    if not fused:
        unshuffle_fn = lz4 if compression == _BSHUF_LZ4 else zstd  # typed, never called

    @njit(nogil=True)
    def kernel(src, dst, block_bytes, itemsize):  # pragma: no cover - compiled
        """0, or the _BLOCK_ERRORS code of the first problem."""
        total = dst.size
        elems = total // itemsize
        block_elems = block_bytes // itemsize
        full = elems // block_elems
        tail = elems % block_elems
        nblocks = full + (1 if tail - tail % 8 else 0)
        scratch = np.empty(block_bytes if fused else 0, np.uint8)
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
            target = scratch.ctypes.data if fused else dst.ctypes.data + at
            if inflate(src.ctypes.data + pos, target, stored, length) != length:
                return 3
            if fused:
                n = length // itemsize
                if unshuffle_fn(target, dst.ctypes.data + at, n, itemsize, n) != length:
                    return 5
            pos += stored
            at += length
        if pos + total - at != src.size:
            return 4
        dst[at:] = src[pos:]
        return 0

    return kernel


_DECODE: dict[int, Callable[[Stage, memoryview, int | None, memoryview | None], Buffer]] = {
    SHUFFLE: _shuffle,
    FLETCHER32: _fletcher32,
    DEFLATE: _deflate,
    ZSTD: _zstd,
    LZ4: _lz4,
    LZF: _lzf,
    BLOSC: _blosc,
    BITSHUFFLE: _bitshuffle,
}
_NEEDS_IMAGECODECS = {FLETCHER32, DEFLATE, ZSTD, LZ4, LZF, BLOSC, BITSHUFFLE}
_BSHUF_NAMES = {0: "none", _BSHUF_LZ4: "lz4", _BSHUF_ZSTD: "zstd"}
_BLOSC_COMPRESSORS = {0: "blosclz", 1: "lz4", 2: "lz4hc", 3: "snappy", 4: "zlib", 5: "zstd"}


def _label(filter_id: int, cd: tuple[int, ...]) -> str:
    name = FILTER_NAMES.get(filter_id, str(filter_id))
    if filter_id == BITSHUFFLE:
        comp = cd[4] if len(cd) > 4 else 0
        return f"bitshuffle({_BSHUF_NAMES.get(comp, comp)})"
    if filter_id == BLOSC and len(cd) > 6:
        return f"blosc({_BLOSC_COMPRESSORS.get(cd[6], cd[6])})"
    return name


def _stage_problem(filter_id: int, cd: tuple[int, ...], name: str) -> str | None:
    """Why this filter cannot be decoded here, or None."""
    if filter_id not in _DECODE:
        known = FILTER_NAMES.get(filter_id) or name or "unknown"
        return f"filter {filter_id} ({known}) has no decoder"
    if filter_id in _NEEDS_IMAGECODECS and imagecodecs is None:
        return f"filter {filter_id} ({FILTER_NAMES[filter_id]}) needs imagecodecs (not installed)"
    if filter_id == BITSHUFFLE and len(cd) > 4 and cd[4] not in (0, _BSHUF_LZ4, _BSHUF_ZSTD):
        return f"filter {filter_id} (bitshuffle) with compression {cd[4]} has no decoder"
    if filter_id == BLOSC and len(cd) > 6 and not _blosc_has(cd[6]):
        what = _BLOSC_COMPRESSORS.get(cd[6], str(cd[6]))
        return f"filter {filter_id} (blosc) with compressor {what}: not in this c-blosc build"
    return None


_blosc_probe: dict[int, bool] = {}


def _blosc_has(code: int) -> bool:
    """Whether imagecodecs' c-blosc decodes frames made by this compressor (probed once)."""
    if code not in _blosc_probe:
        name = _BLOSC_COMPRESSORS.get(code)
        try:
            data = bytes(range(256)) * 4
            frame = imagecodecs.blosc_encode(data, compressor=name, typesize=1, numthreads=1)
            _blosc_probe[code] = imagecodecs.blosc_decode(frame, numthreads=1) == data
        except Exception:
            _blosc_probe[code] = False
    return _blosc_probe[code]


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
    filters = pipeline(dset)
    stages = []
    for filter_id, _flags, cd, name in filters:
        problem = _stage_problem(filter_id, cd, name)
        if problem:
            return Unsupported(problem)
        label = _label(filter_id, cd)
        stages.append(Stage(filter_id, FILTER_NAMES[filter_id], cd, dtype.itemsize, label))
    if _size_unknown_for_lzf(stages):
        return Unsupported("lzf follows another compressor: its decoded size is unknown")
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


def _size_unknown_for_lzf(stages: list[Stage]) -> bool:
    seen_compressor = False
    for stage in stages:
        if stage.filter_id == LZF and seen_compressor:
            return True
        seen_compressor = seen_compressor or stage.compresses
    return False


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


_chunk_opts_fn: list = []


def _get_chunk_opts():
    if not _chunk_opts_fn:
        try:
            fn = ctypes.CDLL(h5py.h5p.__file__).H5Pget_chunk_opts
            fn.argtypes = [ctypes.c_int64, ctypes.POINTER(ctypes.c_uint)]
            fn.restype = ctypes.c_int
        except (OSError, AttributeError):
            fn = None
        _chunk_opts_fn.append(fn)
    return _chunk_opts_fn[0]


def _text(name) -> str:
    return name.decode(errors="replace") if isinstance(name, bytes) else str(name)


def _bytes(buf: Buffer) -> memoryview:
    """A flat byte view of any buffer (numpy's stubs do not declare ndarray a Buffer)."""
    return memoryview(cast(bytes, buf)).cast("B")


def _address(buf: Buffer) -> int:
    return np.frombuffer(buf, np.uint8).ctypes.data

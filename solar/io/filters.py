"""HDF5's filters as solar knows them: one record per filter, in one table keyed by filter id.

A record is everything solar says or does about one filter: its one name (the decoder's labels
and errors, and ``solar inspect``, all use it), how it changes a chunk's size when writing, how
to undo it (``decode``; None: h5py must), and which of its settings cannot be decoded here. A
codec is one record in :data:`FILTERS`; nothing else lists filters.

Every decoder calls a library that releases the GIL while it works (imagecodecs, see
solar/io/codeclibs.py), or a numba kernel compiled with ``nogil`` (HDF5's byte shuffle, the
bitshuffle block loop), so chunks decode in parallel on the reader's threads.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numba import njit

from solar.errors import SolarError
from solar.io import bitshuffle
from solar.io.codeclibs import imagecodecs

# HDF5's registered filter ids (the HDF Group's list of registered filter plugins).
DEFLATE, SHUFFLE, FLETCHER32, SZIP, NBIT, SCALEOFFSET = 1, 2, 3, 4, 5, 6
LZF, BLOSC, LZ4, BITSHUFFLE, ZSTD = 32000, 32001, 32004, 32008, 32015
BLOSC2, BZIP2 = 32026, 307

Buffer = bytes | bytearray | memoryview | np.ndarray
Settings = tuple[int, ...]  # a filter's cd_values, as the dataset's creation properties hold them
# decode(cd_values, dataset item size, filtered bytes, input size if known, destination or None)
Decode = Callable[[Settings, int, memoryview, int | None, memoryview | None], Buffer]


@dataclass(frozen=True)
class Filter:
    """One HDF5 filter: plain data (module functions), so the stages holding it pickle."""

    id: int
    name: str
    decode: Decode | None = None  # undoes the filter (see Stage.decode); None: no decoder here
    # Bytes the filter adds when writing (0: shuffle; fletcher32 appends its checksum); None:
    # a compressor, whose output size is known only once decoded.
    added: int | None = None
    needs_size: bool = False  # decodes only with its output size known (LZF frames hold none)
    needs_imagecodecs: bool = True
    level: int | None = None  # the cd_values entry holding the compression level, if any
    settings: Callable[[Settings], str | None] | None = None  # the label's detail, e.g. "lz4"
    check: Callable[[Settings], str | None] | None = None  # why these settings do not decode

    @property
    def compresses(self) -> bool:
        """Its encoded size is unknown before decoding."""
        return self.added is None

    def label(self, cd: Settings) -> str:
        """Its name with what the settings change in decoding, e.g. "bitshuffle(lz4)"."""
        detail = self.settings(cd) if self.settings is not None else None
        return f"{self.name}({detail})" if detail else self.name

    def describe(self, cd: Settings) -> str:
        """Its label with the compression level, where the settings hold one (inspect)."""
        if self.level is not None and len(cd) > self.level:
            return f"{self.label(cd)} level {cd[self.level]}"
        return self.label(cd)

    def problem(self, cd: Settings) -> str | None:
        """Why chunks with these settings cannot be decoded here (one line), or None."""
        why = None
        if self.decode is None:
            why = "has no decoder"
        elif self.needs_imagecodecs and imagecodecs is None:
            why = "needs imagecodecs (not installed)"
        elif self.check is not None:
            why = self.check(cd)
        return None if why is None else f"filter {self.id} ({self.name}) {why}"


def describe_filter(filter_id: int, cd: Settings) -> str:
    """How ``solar inspect`` shows a filter of a dataset's pipeline."""
    record = FILTERS.get(filter_id)
    return f"filter {filter_id}" if record is None else record.describe(cd)


def filter_problem(filter_id: int, cd: Settings, name: str) -> str | None:
    """Why a filter of a dataset's pipeline cannot be decoded here (``name``: what the file
    calls it, for filters not in the table), or None."""
    record = FILTERS.get(filter_id)
    if record is None:
        return f"filter {filter_id} ({name or 'unknown'}) has no decoder"
    return record.problem(cd)


# -- the decoders: each a Decode, the filter undone (sizes are checked by the Decoder) --------


@njit(nogil=True, cache=True)
def unshuffle_into(src, dst, itemsize):  # pragma: no cover - compiled
    """HDF5's byte shuffle undone from ``src`` into ``dst`` (uint8 arrays of one size): byte j
    of element i is at src[j * n + i]; bytes past the last whole element are stored as they
    are. Sizes 2, 4 and 8 get loops with a constant width, which the compiler vectorises
    (≈40× the generic loop). The fast path (solar/io/fused.py) calls it from its kernel."""
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


def shuffle_width(cd: Settings, itemsize: int) -> int:
    """The item size HDF5's shuffle grouped bytes by: its setting, else the dataset's."""
    return cd[0] if cd else itemsize


def _shuffle(
    cd: Settings, itemsize: int, buf: memoryview, size: int | None, dst: memoryview | None
) -> np.ndarray:
    width = shuffle_width(cd, itemsize)
    src = np.frombuffer(buf, np.uint8)
    out = np.empty_like(src) if dst is None else np.frombuffer(dst, np.uint8)
    if out.size != src.size:
        raise SolarError(f"{src.size} bytes where {out.size} were expected")
    if width <= 1 or src.size < 2 * width:  # HDF5 leaves such buffers as they are
        out[:] = src
    else:
        unshuffle_into(src, out, width)
    return out


_CHECKSUM = 4  # bytes fletcher32 appends to a chunk


def verify_fletcher32(buf: memoryview) -> memoryview:
    """Check and strip the 4-byte checksum HDF5's fletcher32 filter appends to a chunk.

    The checksum is HDF5's Fletcher-32 over big-endian 16-bit words, stored little-endian;
    files from HDF5 before 1.6.3 stored it byte-swapped on little-endian machines, which HDF5
    still accepts, and so does this.
    """
    if buf.nbytes < _CHECKSUM:
        raise SolarError(f"{buf.nbytes} bytes, too short for a fletcher32 checksum")
    data = buf[:-_CHECKSUM]
    stored = struct.unpack("<I", buf[-_CHECKSUM:])[0]
    computed = imagecodecs.h5checksum_fletcher32(data)
    swapped = int.from_bytes(computed.to_bytes(4, "little"), "big")
    if stored != computed and stored != swapped:
        raise SolarError(
            f"fletcher32 checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
        )
    return data


def _fletcher32(
    cd: Settings, itemsize: int, buf: memoryview, size: int | None, dst: memoryview | None
) -> memoryview:
    return verify_fletcher32(buf)


def _out(size: int | None, dst: memoryview | None):
    """imagecodecs' ``out``: the caller's buffer, else the expected size (None: unknown)."""
    return dst if dst is not None else size


def _deflate(
    cd: Settings, itemsize: int, buf: memoryview, size: int | None, dst: memoryview | None
):
    if size is None:
        return imagecodecs.zlib_decode(buf)
    return imagecodecs.deflate_decode(buf, out=_out(size, dst))  # libdeflate: needs the size


def _zstd(cd: Settings, itemsize: int, buf: memoryview, size: int | None, dst: memoryview | None):
    return imagecodecs.zstd_decode(buf, out=_out(size, dst))


def _lz4(cd: Settings, itemsize: int, buf: memoryview, size: int | None, dst: memoryview | None):
    return imagecodecs.lz4h5_decode(buf, out=_out(size, dst))


def _lzf(cd: Settings, itemsize: int, buf: memoryview, size: int | None, dst: memoryview | None):
    # HDF5's LZF frames carry no length: needs_size keeps it where the size is known.
    return imagecodecs.lzf_decode(buf, header=False, out=_out(size, dst))


def _blosc(cd: Settings, itemsize: int, buf: memoryview, size: int | None, dst: memoryview | None):
    return imagecodecs.blosc_decode(buf, numthreads=1, out=_out(size, dst))


_BLOSC_COMPRESSORS = {0: "blosclz", 1: "lz4", 2: "lz4hc", 3: "snappy", 4: "zlib", 5: "zstd"}


def _blosc_settings(cd: Settings) -> str | None:
    """cd_values[6]: the compressor inside the blosc frames (absent in old files)."""
    return _BLOSC_COMPRESSORS.get(cd[6], str(cd[6])) if len(cd) > 6 else None


def _blosc_check(cd: Settings) -> str | None:
    if len(cd) > 6 and not _blosc_has(cd[6]):
        return f"with compressor {_blosc_settings(cd)}: not in this c-blosc build"
    return None


@functools.cache
def _blosc_has(code: int) -> bool:
    """Whether imagecodecs' c-blosc decodes frames made by this compressor (probed once)."""
    try:
        data = bytes(range(256)) * 4
        name = _BLOSC_COMPRESSORS.get(code)
        frame = imagecodecs.blosc_encode(data, compressor=name, typesize=1, numthreads=1)
        return bool(imagecodecs.blosc_decode(frame, numthreads=1) == data)
    except Exception:
        return False


FILTERS: dict[int, Filter] = {
    f.id: f
    for f in (
        Filter(DEFLATE, "deflate", _deflate, level=0),
        Filter(SHUFFLE, "shuffle", _shuffle, added=0, needs_imagecodecs=False),
        Filter(FLETCHER32, "fletcher32", _fletcher32, added=_CHECKSUM),
        Filter(SZIP, "szip"),
        Filter(NBIT, "nbit"),
        Filter(SCALEOFFSET, "scaleoffset"),
        Filter(LZF, "lzf", _lzf, needs_size=True),
        Filter(BLOSC, "blosc", _blosc, settings=_blosc_settings, check=_blosc_check),
        Filter(LZ4, "lz4", _lz4),
        Filter(
            BITSHUFFLE,
            "bitshuffle",
            bitshuffle.decode,
            settings=bitshuffle.settings,
            check=bitshuffle.check,
        ),
        Filter(ZSTD, "zstd", _zstd, level=0),
        Filter(BLOSC2, "blosc2"),
        Filter(BZIP2, "bzip2"),
    )
}

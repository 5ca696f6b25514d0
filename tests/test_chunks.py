"""Compressed chunks decoded outside h5py (solar.io.chunks, solar.io.codecs).

Every decoding test writes a file with h5py (hdf5plugin for the plugin filters), reads each
chunk's stored bytes with plain ``os.pread`` at the index's offsets, decodes and assembles rows,
and compares the bytes with what h5py reads.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import h5py
import numpy as np
import pytest

from solar import SolarError
from solar.io.bitshuffle import decode_bitshuffle
from solar.io.chunks import (
    ChunkIndex,
    _general_plan,
    _one_row_plan,
    chunk_index,
    chunks_for_rows,
    decode_chunk,
    decodes_into_rows,
    fill_absent,
    one_row_chunks,
    read_chunk,
    scatter_chunk,
)
from solar.io.codecs import Decoder, Unsupported, decoder_for, describe_decoding, pipeline
from solar.io.filters import verify_fletcher32

hdf5plugin = pytest.importorskip("hdf5plugin")  # the `plugins` extra: h5py's reference reads
pytest.importorskip("imagecodecs")


def _data(shape, dtype, seed=0) -> np.ndarray:
    """Half smooth (compresses), half noise (does not: exercises stored-raw blocks and masks)."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    n = int(np.prod(shape))
    smooth = np.arange(n) % 17
    if dtype.kind == "b":
        return (smooth % 3 == 0).reshape(shape)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        native = dtype.newbyteorder("=")
        noise = rng.integers(info.min, info.max, n, dtype=native, endpoint=True)
    elif dtype.kind == "c":
        noise = rng.standard_normal(n) + 1j * rng.standard_normal(n)
    else:
        noise = rng.standard_normal(n) * 1e3
    values = np.where(np.arange(n) < n // 2, smooth, noise)
    return values.astype(dtype).reshape(shape)


def _write(path, data, chunks, *, name="x", fillvalue=None, rows=None, **filters) -> str:
    """A chunked dataset of ``data``; ``rows`` (a slice) limits what is written (fill elsewhere)."""
    with h5py.File(path, "w") as f:
        d = f.create_dataset(
            name, data.shape, data.dtype, chunks=chunks, fillvalue=fillvalue, **filters
        )
        if rows is None:
            d[...] = data
        else:
            d[rows] = data[rows]
    return name


def _read_rows(index, decoder, rows, fd, out, *, targets=None, pool=None):
    """Every chunk ``rows`` need read (``os.pread``), decoded and scattered into ``out``
    (``out[targets[j]]`` for row j if given), chunk by chunk on ``pool`` if given: the steps
    of the executor's chunk task (solar/io/executor.py), without its files and jobs."""
    plan = chunks_for_rows(index, rows)
    fill_absent(index, plan, out, targets)
    into_rows = decodes_into_rows(index, out)

    def one(k: int) -> None:
        raw = read_chunk(fd, index, int(plan.reads[k]))
        decode_chunk(index, decoder, plan, k, raw, out, targets, into_rows=into_rows)

    list((pool.map if pool else map)(one, range(plan.reads.size)))


def _assemble(index, plan, chunks, out, targets=None):
    """Decoded chunks (``chunks[k]`` for ``plan.reads[k]``) and fill values copied into rows."""
    fill_absent(index, plan, out, targets)
    for k, chunk in enumerate(chunks):
        scatter_chunk(index, plan, k, chunk, out, targets)


def _check(path, name="x", *, rows=None, threads=0) -> tuple[ChunkIndex, Decoder]:
    """Decode ``rows`` (default: all, reversed, with repeats) and compare with h5py's bytes."""
    with h5py.File(path, "r") as f:
        d = f[name]
        index = chunk_index(d)
        decoder = decoder_for(d)
        assert isinstance(decoder, Decoder), decoder
        expected = d[()]
        for k in range(index.num_chunks):  # the index agrees with h5py's raw chunk reads
            mask, raw = d.id.read_direct_chunk(tuple(int(v) for v in index.starts[k]))
            assert mask == index.masks[k] and len(raw) == index.sizes[k]
    n = index.shape[0]
    if rows is None:
        rows = np.concatenate([np.arange(n)[::-1], np.arange(0, n, 3)])
    rows = np.asarray(rows, np.int64)
    out = np.full((rows.size, *index.shape[1:]), 99, index.dtype.newbyteorder("="))
    fd = os.open(path, os.O_RDONLY)
    try:
        if threads:
            with ThreadPoolExecutor(threads) as pool:
                _read_rows(index, decoder, rows, fd, out, pool=pool)
        else:
            _read_rows(index, decoder, rows, fd, out)
        for k in range(index.num_chunks):
            assert len(read_chunk(fd, index, k)) == index.sizes[k]
    finally:
        os.close(fd)
    want = expected[rows].astype(out.dtype)
    assert out.tobytes() == want.tobytes()
    # decoding into a caller's array (a batch row) gives the same bytes
    fd = os.open(path, os.O_RDONLY)
    try:
        for k in range(index.num_chunks):
            raw, mask, where = read_chunk(fd, index, k), int(index.masks[k]), index.starts[k]
            into = np.full(index.chunk_shape, 77, index.dtype)
            got = decoder.decode(raw, mask, where, out=into)
            assert np.shares_memory(got, into)
            assert into.tobytes() == decoder.decode(raw, mask, where).tobytes()
    finally:
        os.close(fd)
    return index, decoder


# -- every filter, alone and in combinations ---------------------------------------------------

FILTERS = {
    "gzip": dict(compression="gzip"),
    "gzip9": dict(compression="gzip", compression_opts=9),
    "shuffle": dict(shuffle=True),
    "fletcher32": dict(fletcher32=True),
    "shuffle+gzip": dict(compression="gzip", shuffle=True),
    "shuffle+gzip+fletcher32": dict(compression="gzip", shuffle=True, fletcher32=True),
    "lzf": dict(compression="lzf"),
    "shuffle+lzf+fletcher32": dict(compression="lzf", shuffle=True, fletcher32=True),
    "zstd": dict(hdf5plugin.Zstd(clevel=3)),
    "shuffle+zstd": dict(hdf5plugin.Zstd(), shuffle=True),
    "zstd+fletcher32": dict(hdf5plugin.Zstd(), fletcher32=True),
    "lz4": dict(hdf5plugin.LZ4()),
    "lz4-small-blocks": dict(hdf5plugin.LZ4(nbytes=64)),
    "shuffle+lz4": dict(hdf5plugin.LZ4(nbytes=96), shuffle=True),
    "blosc-lz4-shuffle": dict(hdf5plugin.Blosc(cname="lz4", shuffle=hdf5plugin.Blosc.SHUFFLE)),
    "blosc-zstd-bitshuffle": dict(
        hdf5plugin.Blosc(cname="zstd", shuffle=hdf5plugin.Blosc.BITSHUFFLE)
    ),
    "blosc-blosclz-noshuffle": dict(
        hdf5plugin.Blosc(cname="blosclz", shuffle=hdf5plugin.Blosc.NOSHUFFLE)
    ),
    "blosc-zlib+fletcher32": dict(hdf5plugin.Blosc(cname="zlib"), fletcher32=True),
    "bitshuffle": dict(hdf5plugin.Bitshuffle(cname="none")),
    "bitshuffle-lz4": dict(hdf5plugin.Bitshuffle(cname="lz4")),
    "bitshuffle-lz4-blocks": dict(hdf5plugin.Bitshuffle(nelems=16, cname="lz4")),
    "bitshuffle-zstd": dict(hdf5plugin.Bitshuffle(nelems=24, cname="zstd", clevel=5)),
    "bitshuffle-lz4+fletcher32": dict(hdf5plugin.Bitshuffle(cname="lz4"), fletcher32=True),
}
LAYOUTS = {
    # N prime, chunks cut both sample axes, partial last chunk, some chunks never written
    "cut-sample-dims": ((13, 5, 6), (7, 2, 4), np.s_[:9, :3]),
    "one-per-chunk": ((11, 8, 8), (1, 8, 8), np.s_[:10]),
    "spanning-samples": ((23, 3, 5), (5, 3, 5), None),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("flt", list(FILTERS))
def test_every_filter_decodes_to_h5py_bytes(tmp_path, flt, layout):
    shape, chunks, written = LAYOUTS[layout]
    path = str(tmp_path / "f.h5")
    _write(path, _data(shape, "<f4"), chunks, fillvalue=-1.5, rows=written, **FILTERS[flt])
    index, decoder = _check(path)
    assert len(decoder.stages) == len(pipeline(h5py.File(path)["x"]))
    if written is not None:
        assert index.num_chunks < int(np.prod(index.grid))  # the fill path ran


@pytest.mark.parametrize(
    "dtype", [">f4", ">i2", "<u8", "<f2", ">f8", "<c8", "|i1", "|u1", "|b1", ">u4", ">c16"]
)
@pytest.mark.parametrize(
    "flt", ["shuffle+gzip+fletcher32", "bitshuffle-lz4", "blosc-lz4-shuffle", "shuffle"]
)
def test_dtypes_and_byte_orders(tmp_path, dtype, flt):
    path = str(tmp_path / "d.h5")
    _write(path, _data((13, 5, 6), dtype), (7, 2, 4), **FILTERS[flt])
    index, _ = _check(path, threads=2)
    assert index.dtype == np.dtype(dtype)


@pytest.mark.parametrize("flt", ["gzip", "shuffle+gzip+fletcher32", "bitshuffle-lz4", "lzf"])
def test_one_sample_per_chunk_decodes_into_rows(tmp_path, flt):
    path = str(tmp_path / "o.h5")
    _write(path, _data((9, 6, 4), ">f4"), (1, 6, 4), **FILTERS[flt])
    with h5py.File(path, "r") as f:
        index = chunk_index(f["x"])
    assert decodes_into_rows(index, np.empty((3, 6, 4), ">f4"))
    assert not decodes_into_rows(index, np.empty((3, 6, 4), "<f4"))  # converts: scatter
    rows, slots = [8, 0, 8, 3], np.array([6, 1, 3, 0])  # repeats; into buffer slots
    fd = os.open(path, os.O_RDONLY)
    try:
        with h5py.File(path, "r") as f:
            decoder, want = decoder_for(f["x"]), f["x"][()][rows]
        for dtype in (">f4", "<f4"):
            got = np.empty((4, 6, 4), dtype)
            _read_rows(index, decoder, rows, fd, got)
            assert np.array_equal(got, want)
            buf = np.zeros((7, 6, 4), dtype)
            _read_rows(index, decoder, rows, fd, buf, targets=slots)
            assert np.array_equal(buf[slots], want) and not buf[[2, 4, 5]].any()
    finally:
        os.close(fd)


def test_decode_into_a_wrong_buffer_is_refused(tmp_path):
    path = str(tmp_path / "w.h5")
    _write(path, _data((4, 8), "<f4"), (2, 8), **FILTERS["zstd"])
    _, decoder, raw = _first_chunk(path)
    with pytest.raises(ValueError, match="hold 64 bytes"):
        decoder.decode(raw, out=np.empty(15, "<f4"))
    with pytest.raises(ValueError, match="writable"):
        decoder.decode(raw, out=np.frombuffer(bytes(64), "<f4"))
    import imagecodecs

    short = imagecodecs.zstd_encode(bytes(60))
    with pytest.raises(SolarError, match="chunk at \\(0, 0\\)"):
        decoder.decode(short, 0, (0, 0), out=np.empty(16, "<f4"))


@pytest.mark.parametrize("flt", ["bitshuffle-lz4", "bitshuffle-lz4-blocks", "bitshuffle-zstd"])
@pytest.mark.parametrize("shape", [(3, 75), (2, 1000), (1, 3)])  # 75, 1000, 3 elements a chunk
def test_bitshuffle_block_loop(tmp_path, flt, shape):
    # The compiled block loop decodes h5py's bytes, incompressible blocks and a tail of fewer
    # than 8 elements included, and names a chunk cut short.
    path = str(tmp_path / "b.h5")
    data = _data((shape[0] * 3, shape[1]), "<i4")
    _write(path, data, shape, **FILTERS[flt])
    _, decoder, raw = _first_chunk(path)
    cd = decoder.stages[0].cd_values
    want = data[: shape[0]].tobytes()
    assert decoder.decode(raw).tobytes() == want
    got = decode_bitshuffle(memoryview(raw), len(want), 4, cd[4], None)
    assert got.tobytes() == want
    with pytest.raises(SolarError, match="bitshuffle"):
        decode_bitshuffle(memoryview(raw)[:-1], len(want), 4, cd[4], None)


def test_decoder_and_index_pickle(tmp_path):
    # A reader survives spawn: what it holds per dataset must pickle.
    path = str(tmp_path / "k.h5")
    _write(path, _data((6, 16), ">f4"), (2, 16), **FILTERS["shuffle+gzip+fletcher32"])
    index, decoder, raw = _first_chunk(path)
    decoder.decode(raw)  # fills its per-mask cache
    again = pickle.loads(pickle.dumps(decoder))
    assert again == decoder and again.decode(raw).tobytes() == decoder.decode(raw).tobytes()
    copy = pickle.loads(pickle.dumps(index))
    assert np.array_equal(copy.offsets, index.offsets) and copy.fill_value == index.fill_value


def test_one_dimensional_and_raw_chunks(tmp_path):
    path = str(tmp_path / "v.h5")
    _write(path, _data((29,), ">i4"), (4,), compression="gzip", shuffle=True)
    _check(path)
    _write(path, _data((29, 3), "<f8"), (4, 3))  # chunked, no filters: raw chunk bytes
    _, decoder = _check(path)
    assert decoder.stages == () and describe_decoding(h5py.File(path)["x"]).endswith("(raw chunks)")


def test_filter_mask_skips_filters_per_chunk(tmp_path):
    # LZF is optional in h5py: on incompressible data it fails and HDF5 stores the chunk raw.
    path = str(tmp_path / "m.h5")
    rng = np.random.default_rng(1)
    data = np.concatenate([np.zeros((4, 64), "<f4"), rng.standard_normal((4, 64), np.float32)])
    _write(path, data, (2, 64), compression="lzf")
    index, _ = _check(path)
    assert list(index.masks) == [0, 0, 1, 1]
    # A chunk written with the deflate stage skipped (bit 1) in a shuffle+deflate pipeline.
    with h5py.File(path, "w") as f:
        d = f.create_dataset("x", (6, 10), "<i4", chunks=(2, 10), compression="gzip", shuffle=True)
        d[...] = np.arange(60, dtype="<i4").reshape(6, 10)
        block = np.arange(100, 120, dtype="<i4")
        shuffled = block.view(np.uint8).reshape(-1, 4).T.copy()
        d.id.write_direct_chunk((2, 0), shuffled.tobytes(), filter_mask=0b10)
    index, _ = _check(path)
    assert list(index.masks) == [0, 0b10, 0]
    assert np.array_equal(h5py.File(path)["x"][2:4].ravel(), block)


def test_unfiltered_partial_edge_chunks(tmp_path):
    # H5D_CHUNK_DONT_FILTER_PARTIAL_CHUNKS (not settable from h5py): edge chunks stored raw.
    path = str(tmp_path / "e.h5")
    set_opts = ctypes.CDLL(h5py.h5p.__file__).H5Pset_chunk_opts
    set_opts.argtypes = [ctypes.c_int64, ctypes.c_uint]
    with h5py.File(path, "w") as f:
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_chunk((4, 10))
        dcpl.set_shuffle()
        dcpl.set_deflate(4)
        assert set_opts(dcpl.id, 0x0002) >= 0
        space = h5py.h5s.create_simple((7, 10))
        dsid = h5py.h5d.create(f.id, b"x", h5py.h5t.STD_I32BE, space, dcpl=dcpl)
        h5py.Dataset(dsid)[...] = np.arange(70).reshape(7, 10)
    index, decoder = _check(path)
    assert decoder.unfiltered_edges and index.sizes[1] == 4 * 10 * 4
    with pytest.raises(ValueError, match="pass where"):
        decoder.decode(b"")


def test_fill_value_and_unwritten_dataset(tmp_path):
    path = str(tmp_path / "u.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("x", (9, 4), "<f8", chunks=(2, 4), compression="gzip", fillvalue=7.25)
        f.create_dataset("empty", (0, 4), "<f8", chunks=(2, 4), maxshape=(None, 4))
    index, _ = _check(path)
    assert index.num_chunks == 0
    with h5py.File(path, "r") as f:
        empty = chunk_index(f["empty"])
    plan = chunks_for_rows(empty, [])
    assert plan.reads.size == 0 and plan.row.size == 0


def test_index_without_chunk_iter_is_the_same(tmp_path):
    path = str(tmp_path / "i.h5")
    shape, chunks, written = LAYOUTS["cut-sample-dims"]
    _write(path, _data(shape, "<f4"), chunks, rows=written, compression="gzip")
    with h5py.File(path, "r") as f:
        a, b = chunk_index(f["x"]), chunk_index(f["x"], iterate=False)
    assert 0 < a.num_chunks < int(np.prod(a.grid))
    for field in ("starts", "offsets", "sizes", "masks", "slot"):
        assert np.array_equal(getattr(a, field), getattr(b, field))


# -- bad data ----------------------------------------------------------------------------------


def _first_chunk(path, name="x"):
    with h5py.File(path, "r") as f:
        index = chunk_index(f[name])
        decoder = decoder_for(f[name])
    fd = os.open(path, os.O_RDONLY)
    try:
        raw = read_chunk(fd, index, 0)
    finally:
        os.close(fd)
    return index, decoder, raw


def _flip(raw: bytes, at: int) -> bytes:
    b = bytearray(raw)
    b[at] ^= 0xFF
    return bytes(b)


@pytest.mark.parametrize(
    "flt", ["gzip", "zstd", "lz4", "lzf", "blosc-lz4-shuffle", "bitshuffle-lz4", "bitshuffle-zstd"]
)
def test_corrupt_chunk_raises_a_one_line_solar_error(tmp_path, flt):
    path = str(tmp_path / "c.h5")
    data = np.tile(np.arange(64, dtype="<f4"), (4, 1)).reshape(4, 8, 8)
    _write(path, data, (2, 8, 8), **FILTERS[flt])
    index, decoder, raw = _first_chunk(path)
    assert decoder.decode(raw, 0, index.starts[0]).tobytes() == data[:2].tobytes()
    for bad in (raw[: len(raw) // 2], b"\xff" * len(raw), raw[:3], b""):
        with pytest.raises(SolarError) as err:
            decoder.decode(bad, 0, index.starts[0])
        msg = str(err.value)
        assert "\n" not in msg and path in msg and "'/x'" in msg and "(0, 0, 0)" in msg
    # Bytes after a complete stream: ignored (as HDF5 does) or refused, never wrong data.
    try:
        assert decoder.decode(raw + b"\0" * 7).tobytes() == data[:2].tobytes()
    except SolarError:
        pass


def test_fletcher32_mismatch_is_caught(tmp_path):
    path = str(tmp_path / "c.h5")
    data = _data((4, 7), "|u1")  # odd byte count: HDF5's fletcher32 pads the last word
    _write(path, data, (3, 7), shuffle=True, fletcher32=True)
    _, decoder, raw = _first_chunk(path)
    assert decoder.decode(raw).tobytes() == data[:3].tobytes()
    for at in (0, len(raw) - 5, len(raw) - 1):  # data, its last byte, the checksum
        with pytest.raises(SolarError, match=r"c.h5: key '/x', chunk at \(0, 0\): fletcher32"):
            decoder.decode(_flip(raw, at), 0, (0, 0))
    # Files from HDF5 before 1.6.3 stored the checksum byte-swapped; HDF5 accepts both.
    swapped = raw[:-4] + raw[-4:][::-1]
    assert decoder.decode(swapped).tobytes() == data[:3].tobytes()


def _fletcher32_reference(data: bytes) -> int:
    """HDF5's Fletcher-32, written from its definition: big-endian 16-bit words (an odd last
    byte is the high byte of a last word), both sums folded to 16 bits (end-around carry)
    every 360 words and twice at the end; (sum2 << 16) | sum1."""
    words = [data[i] << 8 | data[i + 1] for i in range(0, len(data) - 1, 2)]
    if len(data) % 2:
        words.append(data[-1] << 8)
    sum1 = sum2 = 0
    for k, w in enumerate(words, 1):
        sum1 += w
        sum2 += sum1
        if k % 360 == 0 or k == len(words):
            sum1 = (sum1 & 0xFFFF) + (sum1 >> 16)
            sum2 = (sum2 & 0xFFFF) + (sum2 >> 16)
    sum1 = (sum1 & 0xFFFF) + (sum1 >> 16)
    sum2 = (sum2 & 0xFFFF) + (sum2 >> 16)
    return sum2 << 16 | sum1


@pytest.mark.parametrize("dtype", ["|u1", "<i2", ">f8"])
def test_fletcher32_is_hdf5s_definition(tmp_path, dtype):
    # The checksum h5py's HDF5 stores after each chunk (little-endian) is the definition above.
    path = str(tmp_path / "f.h5")
    rng = np.random.default_rng(3)
    data = rng.integers(0, 256, (25, 777), np.uint8)
    data = data[:, : 777 - 777 % np.dtype(dtype).itemsize].copy().view(dtype)
    data[:3] = np.array(-1).astype(dtype)  # 0xff.. words: sums that fold to 0xffff
    _write(path, data, (3, data.shape[1]), fletcher32=True)
    with h5py.File(path, "r") as f:
        index = chunk_index(f["x"])
    fd = os.open(path, os.O_RDONLY)
    try:
        for k in range(index.num_chunks):
            raw = read_chunk(fd, index, k)
            stored = int.from_bytes(raw[-4:], "little")
            assert stored == _fletcher32_reference(raw[:-4])
    finally:
        os.close(fd)
    for n in (1, 2, 3, 719, 720, 721, 1441):  # odd lengths, around the 360-word folds
        blob = rng.integers(0, 256, n, np.uint8).tobytes()
        sealed = blob + _fletcher32_reference(blob).to_bytes(4, "little")
        assert verify_fletcher32(memoryview(sealed)) == memoryview(blob)


def test_wrong_decoded_size_is_caught(tmp_path):
    import imagecodecs

    path = str(tmp_path / "s.h5")
    _write(path, np.zeros((4, 10), "<i4"), (2, 10), **FILTERS["zstd"])
    _, decoder, _ = _first_chunk(path)
    short = imagecodecs.zstd_encode(bytes(60))  # a valid frame, 20 bytes short
    with pytest.raises(SolarError, match=r"chunk at \(0, 0\): .*(decoded to|zstd)"):
        decoder.decode(short, 0, (0, 0))
    _write(path, np.zeros((4, 10), "<i4"), (2, 10))  # no filters: size alone is checked
    _, decoder, raw = _first_chunk(path)
    with pytest.raises(SolarError, match="decoded to 76 bytes, expected 80"):
        decoder.decode(raw[:-4])


def test_truncated_file_is_named(tmp_path):
    # HDF5 refuses to open a truncated file; a file cut while open (or after its index was
    # taken) must not yield short chunks.
    path = tmp_path / "t.h5"
    _write(str(path), _data((8, 64), "<f4"), (2, 64), compression="gzip")
    cut = tmp_path / "cut.h5"
    shutil.copy(path, cut)
    with h5py.File(cut, "r") as f:
        index = chunk_index(f["x"])
        last = int(np.argmax(index.offsets))
        os.truncate(cut, int(index.offsets[last]) + 3)
        with pytest.raises(SolarError, match=r"cut\.h5: truncated file: key '/x', chunk at"):
            chunk_index(f["x"])
    fd = os.open(cut, os.O_RDONLY)
    try:
        with pytest.raises(SolarError, match=r"cut\.h5: truncated file: .* read 3 of"):
            read_chunk(fd, index, last)
    finally:
        os.close(fd)


# -- unsupported pipelines and describe_decoding -----------------------------------------------


def test_unsupported_filters_fall_back_to_h5py(tmp_path):
    path = str(tmp_path / "n.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("so", data=np.arange(40).reshape(10, 4), chunks=(2, 4), scaleoffset=0)
        f.create_dataset(
            "bz", data=np.arange(40.0).reshape(10, 4), chunks=(2, 4), **hdf5plugin.BZip2()
        )
        f.create_dataset("contig", data=np.arange(40.0).reshape(10, 4))
        f.create_dataset("rec", data=np.zeros(10, [("a", "<i4"), ("b", "<f4")]), chunks=(2,))
        f.create_dataset(
            "gz",
            data=np.arange(40.0).reshape(10, 4),
            chunks=(2, 4),
            compression="gzip",
            shuffle=True,
        )
    with h5py.File(path, "r") as f:
        assert decoder_for(f["so"]) == Unsupported("filter 6 (scaleoffset) has no decoder")
        assert describe_decoding(f["bz"]) == "h5py fallback: filter 307 (bzip2) has no decoder"
        assert describe_decoding(f["contig"]) == "not chunked: no decoding"
        assert describe_decoding(f["rec"]).startswith("h5py fallback: dtype")
        assert describe_decoding(f["gz"]) == "parallel decode: shuffle+deflate"


def test_labels_name_the_codec_settings(tmp_path):
    path = str(tmp_path / "l.h5")
    with h5py.File(path, "w") as f:
        for name, flt in [
            ("a", "bitshuffle-zstd"),
            ("b", "blosc-zstd-bitshuffle"),
            ("c", "shuffle+gzip+fletcher32"),
        ]:
            f.create_dataset(name, data=np.zeros((4, 4), "f4"), chunks=(2, 4), **FILTERS[flt])
    with h5py.File(path, "r") as f:
        assert describe_decoding(f["a"]) == "parallel decode: bitshuffle(zstd)"
        assert describe_decoding(f["b"]) == "parallel decode: blosc(zstd)"
        assert describe_decoding(f["c"]) == "parallel decode: shuffle+deflate+fletcher32"


def test_plugin_files_decode_without_hdf5plugin(tmp_path):
    # Reading the pipeline needs no plugin: solar decodes files h5py alone cannot read.
    path = str(tmp_path / "p.h5")
    data = _data((6, 16), "<f4")
    _write(path, data, (2, 16), **FILTERS["shuffle+zstd"])
    code = (
        "import numpy as np, sys\n"
        "from solar.io.reader import Reader\n"
        "from solar.io.sources import describe_source\n"
        "reader = Reader(describe_source(sys.argv[1], ['x']))\n"
        "out = np.empty((6, 16), '<f4')\n"
        "reader.read(np.arange(6), [out])\n"
        "reader.close()\n"
        "assert 'hdf5plugin' not in sys.modules\n"
        "sys.stdout.buffer.write(out.tobytes())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "HDF5_PLUGIN_PATH"}
    got = subprocess.run(
        [sys.executable, "-c", code, path], capture_output=True, env=env, check=True
    )
    assert got.stdout == data.tobytes()


# -- the I/O plan, without files ---------------------------------------------------------------


def _fake_index(shape, chunks, stored, seed=0) -> ChunkIndex:
    """An index whose stored chunks are the grid cells in ``stored``, at shuffled offsets."""
    grid = tuple(-(-n // c) for n, c in zip(shape, chunks, strict=True))
    cells = np.sort(np.asarray(stored, np.int64))
    rng = np.random.default_rng(seed)
    coords = np.array(np.unravel_index(cells, grid), np.int64).T.reshape(-1, len(shape))
    slot = np.full(int(np.prod(grid)), -1, np.int64)
    slot[cells] = np.arange(cells.size)
    return ChunkIndex(
        file="fake.h5",
        name="/x",
        shape=tuple(shape),
        chunk_shape=tuple(chunks),
        dtype=np.dtype("<i8"),
        fill_value=np.array(-1, "<i8"),
        starts=coords * np.array(chunks, np.int64),
        offsets=rng.permutation(cells.size).astype(np.int64) * 1000,
        sizes=np.full(cells.size, 10, np.int64),
        masks=np.zeros(cells.size, np.uint32),
        slot=slot,
    )


def _fake_chunk(index: ChunkIndex, position: int) -> np.ndarray:
    """A chunk whose every element holds its global linear position (edges: anything)."""
    start = index.starts[position]
    axes = [np.arange(s, s + c) for s, c in zip(start, index.chunk_shape, strict=True)]
    grids = np.meshgrid(*axes, indexing="ij")
    return np.ravel_multi_index(grids, index.shape, mode="clip").astype("<i8")


@pytest.mark.parametrize("seed", range(12))
def test_plan_reads_each_chunk_once_and_covers_every_row(seed):
    rng = np.random.default_rng(seed)
    ndim = int(rng.integers(1, 4))
    shape = tuple(int(v) for v in rng.integers(1, 12, ndim))
    chunks = tuple(int(rng.integers(1, n + 2)) for n in shape)
    grid = tuple(-(-n // c) for n, c in zip(shape, chunks, strict=True))
    total = int(np.prod(grid))
    stored = rng.choice(total, int(rng.integers(0, total + 1)), replace=False)
    index = _fake_index(shape, chunks, stored, seed)
    rows = rng.integers(0, shape[0], int(rng.integers(0, 3 * shape[0])))
    plan = chunks_for_rows(index, rows)

    # each needed stored chunk once, in file order; nothing else
    needed = {
        int(index.slot[(r // chunks[0]) * index.cells + c])
        for r in rows
        for c in range(index.cells)
    } - {-1}
    assert sorted(plan.reads.tolist()) == sorted(needed)
    assert np.all(np.diff(index.offsets[plan.reads]) > 0)
    # one piece per (row, cell); pieces of read k really come from that chunk
    assert plan.row.size == rows.size * index.cells
    assert sorted(zip(plan.row.tolist(), plan.cell.tolist(), strict=True)) == [
        (j, c) for j in range(rows.size) for c in range(index.cells)
    ]
    for k in range(plan.reads.size):
        lo, hi = plan.bounds[k], plan.bounds[k + 1]
        start = index.starts[plan.reads[k]]
        assert np.all(rows[plan.row[lo:hi]] == start[0] + plan.within[lo:hi])
    # assembling fake chunks gives every element its own global position, or the fill value
    chunks_data = [_fake_chunk(index, int(p)) for p in plan.reads]
    out = np.full((rows.size, *shape[1:]), 12345, "<i8")
    _assemble(index, plan, chunks_data, out)
    truth = np.arange(int(np.prod(shape))).reshape(shape)[rows]
    element_chunk = np.stack(
        np.meshgrid(
            *[np.arange(n) // c for n, c in zip(shape, chunks, strict=True)], indexing="ij"
        ),
        -1,
    ).reshape(-1, ndim)
    stored_elem = (index.slot[np.ravel_multi_index(tuple(element_chunk.T), grid)] >= 0).reshape(
        shape
    )
    want = np.where(stored_elem[rows], truth, -1)
    assert np.array_equal(out, want)


def test_plan_targets_scatter_into_buffer_slots():
    index = _fake_index((10, 4), (3, 2), range(8))
    rows = np.array([9, 0, 4])
    plan = chunks_for_rows(index, rows)
    slots = np.array([5, 1, 3])
    buf = np.zeros((6, 4), "<i8")
    _assemble(index, plan, [_fake_chunk(index, int(p)) for p in plan.reads], buf, targets=slots)
    assert np.array_equal(buf[slots], np.arange(40).reshape(10, 4)[rows])
    assert not buf[[0, 2, 4]].any()
    with pytest.raises(ValueError, match="row 10 is outside"):
        chunks_for_rows(index, [10])


@pytest.mark.parametrize("seed", range(10))
def test_one_row_plan_is_the_general_plan(seed):
    """The one-sample-per-chunk fast path plans exactly what the general path plans:
    repeated rows, never-written chunks, a one-dimensional dataset, an empty request."""
    rng = np.random.default_rng(seed)
    shape = (int(rng.integers(1, 40)), *([] if seed % 3 == 0 else [3, 2][: 1 + seed % 2]))
    chunks = (1, *shape[1:])
    stored = rng.choice(shape[0], int(rng.integers(0, shape[0] + 1)), replace=False)
    index = _fake_index(shape, chunks, stored, seed)
    assert one_row_chunks(index)
    rows = rng.integers(0, shape[0], int(rng.integers(0, 2 * shape[0])))
    fast, general = _one_row_plan(index, rows), _general_plan(index, rows)
    for name in ("reads", "bounds", "row", "within", "cell"):
        a, b = getattr(fast, name), getattr(general, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    assert np.array_equal(chunks_for_rows(index, rows).row, general.row)


def test_one_row_chunks_needs_whole_rows():
    assert one_row_chunks(_fake_index((5, 4), (1, 4), range(5)))
    assert one_row_chunks(_fake_index((5,), (1,), range(5)))
    assert not one_row_chunks(_fake_index((5, 4), (1, 2), range(10)))  # cuts the row
    assert not one_row_chunks(_fake_index((5, 4), (2, 4), range(3)))  # two rows a chunk

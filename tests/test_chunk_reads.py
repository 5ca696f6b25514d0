"""Chunked datasets decoded by solar: the task plan without files, and whole runs against h5py."""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import reference, skip_without_o_direct
from test_loader import N, run_all

from solar import Loader, ReaderConfig, SolarError
from solar.io.chunks import ChunkIndex, chunk_index
from solar.io.codecs import Decoder
from solar.io.hdf5 import describe
from solar.io.reader import Reader
from solar.io.tasks import ChunkReads, ChunkSource, H5Rows, Layout, chunk_runs, plan_reads

pytest.importorskip("imagecodecs")

# -- the plan, without files ---------------------------------------------------------------


def _memory_source(data: np.ndarray, chunk_rows: int, gaps: int = 0, absent=()) -> tuple:
    """An unfiltered chunked "file" in memory: its ChunkSource and its bytes.

    Chunk c is stored at ``c * (chunk bytes + gaps)`` (gaps break runs); ``absent`` chunks were
    never written and read as the fill value 0.
    """
    n = data.shape[0]
    chunk_shape = (chunk_rows, *data.shape[1:])
    grid = -(-n // chunk_rows)
    nbytes = int(np.prod(chunk_shape)) * data.itemsize
    stored = [c for c in range(grid) if c not in absent]
    blob = bytearray((nbytes + gaps) * grid)
    for c in stored:
        block = np.zeros(chunk_shape, data.dtype)
        part = data[c * chunk_rows : (c + 1) * chunk_rows]
        block[: part.shape[0]] = part
        blob[c * (nbytes + gaps) : c * (nbytes + gaps) + nbytes] = block.tobytes()
    slot = np.full(grid, -1, np.int64)
    slot[stored] = np.arange(len(stored))
    starts = np.zeros((len(stored), data.ndim), np.int64)
    starts[:, 0] = np.array(stored, np.int64) * chunk_rows
    index = ChunkIndex(
        "mem", "x", data.shape, chunk_shape, data.dtype, np.zeros((), data.dtype), starts,
        np.array(stored, np.int64) * (nbytes + gaps), np.full(len(stored), nbytes, np.int64),
        np.zeros(len(stored), np.uint32), slot,
    )  # fmt: skip
    decoder = Decoder("mem", "x", data.shape, chunk_shape, data.dtype, ())
    return ChunkSource(index, decoder), bytes(blob)


def _execute(task: ChunkReads, blob: bytes) -> list[tuple[int, int]]:
    """What Executor._run does with a chunk task, from memory: returns the (offset, bytes) of
    each run read."""
    from solar.io.chunks import decode_chunk, fill_absent

    index, plan = task.source.index, task.plan
    if task.fill:
        fill_absent(index, plan, task.out, task.rows)
    positions = plan.reads[task.chunks]
    ends = np.append(task.run_starts[1:], positions.size)
    runs = [
        (int(index.offsets[positions[a]]),
         int(index.offsets[positions[b - 1]] + index.sizes[positions[b - 1]]
             - index.offsets[positions[a]]))
        for a, b in zip(task.run_starts.tolist(), ends.tolist(), strict=True)
    ]  # fmt: skip
    for k, p in zip(task.chunks.tolist(), positions.tolist(), strict=True):
        off, size = int(index.offsets[p]), int(index.sizes[p])
        raw = blob[off : off + size]
        decode_chunk(index, task.source.decoder, plan, k, raw, task.out, task.rows,
                     into_rows=task.into_rows)  # fmt: skip
    return runs


@pytest.mark.parametrize("groups", [1, 2, 5])
@pytest.mark.parametrize(("chunk_rows", "gaps", "absent"), [(1, 0, ()), (4, 0, (2,)), (3, 8, ())])
def test_chunk_tasks_put_each_sample_in_its_row(groups, chunk_rows, gaps, absent):
    rng = np.random.default_rng(3)
    data = rng.integers(0, 1000, (23, 3), np.int32)
    source, blob = _memory_source(data, chunk_rows, gaps, absent)
    layouts = [[Layout(None, 12, chunk_rows, decoded=True)]]
    samples = np.array([22, 0, 5, 6, 7, 9, 9, 13, 1], np.int64)
    rows = np.arange(samples.size)[::-1].copy()
    out = [np.full((samples.size, 3), -1, np.int32)]
    tasks = plan_reads(layouts, np.array([0, 23]), samples, out, rows, direct_io=False,
                       groups=groups, chunks={(0, 0): source})  # fmt: skip
    assert all(isinstance(t, ChunkReads) for t in tasks)
    assert sum(t.fill for t in tasks) == 1
    chunks = np.unique(samples // chunk_rows)
    stored = np.setdiff1d(chunks, absent)
    # Every needed stored chunk exactly once over the tasks, one request each.
    assert sum(t.requests for t in tasks) == stored.size
    assert len(tasks) == max(1, min(groups, stored.size))
    runs = [r for t in tasks for r in _execute(t, blob)]
    want = data[samples].copy()
    want[np.isin(samples // chunk_rows, absent)] = 0  # never written: the fill value
    np.testing.assert_array_equal(out[0][rows], want)
    if gaps:  # chunks apart in the file: one read each
        assert len(runs) == stored.size
    else:  # chunks back to back in the file are one read within a task
        size = int(source.index.sizes[0])
        offs = [source.index.offsets[t.plan.reads[t.chunks]] for t in tasks if t.chunks.size]
        assert len(runs) == sum(1 + np.count_nonzero(np.diff(o) != size) for o in offs)


def test_long_runs_of_chunks_are_cut_and_gaps_split_them():
    data = np.zeros((10, 4), np.uint8)  # 4-byte chunks of one row, back to back
    source, _ = _memory_source(data, 1)
    positions = np.arange(10)
    assert chunk_runs(source.index, positions).tolist() == [0]
    assert chunk_runs(source.index, positions, max_bytes=12).tolist() == [0, 3, 6, 9]
    assert chunk_runs(source.index, np.array([0, 1, 3, 4])).tolist() == [0, 2]


def test_advice_covers_runs_in_read_order_within_its_window(tmp_path, monkeypatch):
    """The advice covers a job's runs in the order it reads them, at most WINDOW bytes past
    what it has read; a single-sample task is one run (its spans: one range)."""
    import contextlib

    from solar.io import advice as advice_module

    data = np.zeros((12, 4), np.uint8)  # 4-byte chunks, each on its own page: 12 runs
    source, _ = _memory_source(data, 1, gaps=4092)
    out = [np.zeros((12, 4), np.uint8)]
    layouts = [[Layout(None, 4, 1, decoded=True)]]
    tasks = plan_reads(layouts, np.array([0, 12]), np.arange(12)[::-1], out, np.arange(12),
                       direct_io=False, groups=2, chunks={(0, 0): source})  # fmt: skip
    seen: list[tuple[int, int]] = []
    monkeypatch.setattr(
        advice_module.os, "posix_fadvise", lambda fd, a, n, how: seen.append((a, n))
    )
    monkeypatch.setattr(advice_module.Advice, "WINDOW", 10)
    ahead = advice_module.Advice(lambda file: contextlib.nullcontext(-1), tasks)
    ranges = [(lo, hi - lo) for t in tasks for lo, hi in zip(t.spans.lo, t.spans.hi, strict=True)]
    assert len(ranges) == 12 and [t.spans.lo.size for t in tasks] == [6, 6]
    assert all(n == 4 for _, n in ranges) and np.all(np.diff([a for a, _ in ranges]) > 0)
    ahead.advise(0)
    assert seen == ranges[:3]  # 10 bytes past nothing read: three 4-byte runs
    ahead.advise(12)
    assert seen == ranges[:6]
    ahead.advise(100)
    assert seen == ranges
    single = plan_reads(layouts, np.array([0, 12]), np.array([3]), out, np.arange(1),
                        direct_io=False, groups=8, chunks={(0, 0): source})  # fmt: skip
    assert len(single) == 1 and single[0].spans.lo.size == 1


def test_undecodable_or_unchunked_layouts_still_go_through_h5py_and_need_no_index():
    layouts = [[Layout(None, 8, 4), Layout(None, 8, 0)]]
    out = [np.zeros((2, 2), np.float32), np.zeros((2, 2), np.float32)]
    tasks = plan_reads(layouts, np.array([0, 9]), np.array([1, 8]), out, np.arange(2),
                       direct_io=False, groups=2)  # fmt: skip
    assert [type(t) for t in tasks] == [H5Rows, H5Rows]
    with pytest.raises(SolarError, match="no chunk index"):
        plan_reads([[Layout(None, 8, 4, decoded=True)]], np.array([0, 9]), np.array([1]),
                   out, np.arange(1), direct_io=False, groups=1)  # fmt: skip


# -- whole runs, byte for byte against h5py ------------------------------------------------

_PLUGIN = {"zstd", "zstd+shuffle", "lz4", "bitshuffle-lz4"}


def _filters(kind: str) -> dict:
    if kind in _PLUGIN:
        hdf5plugin = pytest.importorskip("hdf5plugin")
        return {
            "zstd": lambda: dict(hdf5plugin.Zstd(clevel=3)),
            "zstd+shuffle": lambda: dict(hdf5plugin.Zstd(), shuffle=True),
            "lz4": lambda: dict(hdf5plugin.LZ4()),
            "bitshuffle-lz4": lambda: dict(hdf5plugin.Bitshuffle(cname="lz4")),
        }[kind]()
    return {
        "gzip": {"compression": "gzip"},
        "gzip+shuffle": {"compression": "gzip", "shuffle": True},
        "lzf": {"compression": "lzf"},
        "fletcher32": {"compression": "gzip", "fletcher32": True},
        "none": {},
    }[kind]


CASES = {  # name: (filters, img chunks, img dtype)
    "gzip, one sample a chunk": ("gzip", (1, 5, 6), "<f4"),
    "gzip+shuffle, partial last chunk": ("gzip+shuffle", (6, 5, 6), "<f4"),
    "gzip+shuffle, one sample a chunk": ("gzip+shuffle", (1, 5, 6), "<f8"),
    "lzf, chunks of 16 samples": ("lzf", (16, 5, 6), "<f4"),
    "fletcher32, chunks cut the sample": ("fletcher32", (7, 2, 4), "<f4"),
    "big-endian gzip": ("gzip", (5, 5, 6), ">f4"),
    "unfiltered chunks": ("none", (4, 5, 3), "<f8"),
    "zstd": ("zstd", (1, 5, 6), "<f4"),
    "zstd+shuffle": ("zstd+shuffle", (1, 5, 6), "<i2"),
    "lz4": ("lz4", (3, 5, 6), "<f4"),
    "bitshuffle-lz4": ("bitshuffle-lz4", (1, 5, 6), "<f4"),
}


def _write_chunked(path: Path, kind: str, chunks: tuple, dtype: str) -> Path:
    rng = np.random.default_rng(7)
    img = np.round(rng.standard_normal((N, 5, 6)), 2).astype(dtype)  # compressible
    with h5py.File(path, "w") as f:
        f.create_dataset("img", data=img, chunks=chunks, **_filters(kind))
        lab = np.arange(N, dtype=np.int64)[:, None] * [1, -1]
        f.create_dataset("lab", data=lab.astype(">i8" if dtype[0] == ">" else "<i8"),
                         chunks=(chunks[0], 2), **_filters(kind))  # fmt: skip
    return path


@pytest.mark.parametrize("case", list(CASES))
def test_whole_runs_are_byte_identical_to_h5py(tmp_path, case):
    kind, chunks, dtype = CASES[case]
    paths = [_write_chunked(tmp_path / "d.h5", kind, chunks, dtype)]
    ref = reference(paths)
    for world in (1, 3):
        loaders = [
            Loader(paths, batch_size=4, epochs=2, buffer=12, rank=r, world_size=world,
                   reader=ReaderConfig(threads=2))
            for r in range(world)
        ]  # fmt: skip
        assert all(lay.decoded for f in loaders[0].reader._layouts for lay in f)
        run_all(loaders, range(2), ref)
        for ld in loaders:
            ld.close()


def test_unwritten_chunks_read_as_the_fill_value(tmp_path):
    path = tmp_path / "d.h5"
    with h5py.File(path, "w") as f:
        d = f.create_dataset("img", (N, 5, 6), "<f4", chunks=(10, 5, 6), compression="gzip",
                             fillvalue=7.5)  # fmt: skip
        d[20:40] = 1.0
        d[95:] = 2.0
        f.create_dataset("lab", data=np.arange(N), chunks=(8,), compression="gzip")
    run_all([Loader([path], batch_size=5, epochs=1, buffer=10)], range(1), reference([path]))


def test_unsupported_filters_fall_back_to_h5py(tmp_path):
    path = tmp_path / "d.h5"
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:  # scale-offset has no decoder here
        f.create_dataset("lab", data=rng.integers(0, 500, (N, 4)), chunks=(9, 4), scaleoffset=0)
    ld = Loader([path], batch_size=4, epochs=1, buffer=8)
    assert ld.reader._layouts[0][0].decoded is False
    run_all([ld], range(1), reference([path]))


def _last_chunk(path: Path) -> tuple[int, int, int]:
    """(first row, byte offset, stored size) of the chunk stored last in the file."""
    with h5py.File(path) as f:
        index = chunk_index(f["img"])
    p = int(np.argmax(index.offsets + index.sizes))
    return int(index.starts[p, 0]), int(index.offsets[p]), int(index.sizes[p])


@pytest.mark.parametrize("when", ["before the index is built", "after"])
def test_a_truncated_compressed_file_is_one_line_error_never_fill_values(tmp_path, when):
    path = _write_chunked(tmp_path / "d.h5", "gzip", (1, 5, 6), "<f4")
    row, offset, size = _last_chunk(path)
    reader = Reader(describe([path], ["img"]), ReaderConfig(threads=2))
    out = [np.zeros((1, 5, 6), np.float32)]
    if when == "after":
        reader.read(np.array([0]), out)  # the chunk index is built, with the file whole
    os.truncate(path, offset + size // 2)
    with pytest.raises(SolarError, match="truncated") as err:
        reader.read(np.array([row]), out)
    assert "\n" not in str(err.value)
    reader.close()


def test_direct_io_reads_chunks_through_aligned_buffers(tmp_path):
    paths = [_write_chunked(tmp_path / "d.h5", "gzip+shuffle", (3, 5, 6), "<f4")]
    with skip_without_o_direct():
        ld = Loader(paths, batch_size=4, epochs=1, buffer=8, reader=ReaderConfig(direct_io=True))
        run_all([ld], range(1), reference(paths))

"""The chunk path's fast path (solar/io/fused.py): which pipelines take it, byte-identical
reads that never touch the general decoder, and every anomaly handed to the general path."""

from __future__ import annotations

import zlib

import h5py
import numpy as np
import pytest
from helpers import skip_without_o_direct

from solar import ReaderConfig, SolarError
from solar.io.codecs import Decoder, decoder_for
from solar.io.fused import Fused, fused_codec, kernel, read_fused, windows
from solar.io.hdf5 import describe
from solar.io.reader import Reader

hdf5plugin = pytest.importorskip("hdf5plugin")
pytest.importorskip("imagecodecs")

N = 37  # prime

FILTERS = {  # name: (h5py filters, the Fused expected; None: the general path)
    "gzip": (dict(compression="gzip"), Fused("deflate", 0)),
    "shuffle+gzip": (dict(compression="gzip", shuffle=True), Fused("deflate", 4)),
    "zstd": (dict(hdf5plugin.Zstd(clevel=3)), Fused("zstd", 0)),
    "shuffle+zstd": (dict(hdf5plugin.Zstd(), shuffle=True), Fused("zstd", 4)),
    "gzip+fletcher32": (dict(compression="gzip", fletcher32=True), None),
    "lzf": (dict(compression="lzf"), None),
    "lz4": (dict(hdf5plugin.LZ4()), None),
    "bitshuffle-lz4": (dict(hdf5plugin.Bitshuffle(cname="lz4")), None),
    "shuffle only": (dict(shuffle=True), None),
}


def _data(shape, dtype) -> np.ndarray:
    """Half smooth (compresses), half noise (stored-raw deflate blocks)."""
    rng = np.random.default_rng(3)
    n = int(np.prod(shape))
    smooth = np.arange(n) % 13
    noise = rng.integers(-1000, 1000, n) if np.dtype(dtype).kind in "iu" else rng.normal(0, 1e3, n)
    return np.where(np.arange(n) < n // 2, smooth, noise).astype(dtype).reshape(shape)


def _file(path, filters: dict, dtype="<f4", shape=(N, 6, 7)) -> np.ndarray:
    data = _data(shape, dtype)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, chunks=(1, *shape[1:]), **filters)
    return data


@pytest.mark.parametrize("name", list(FILTERS))
def test_which_pipelines_take_the_fast_path(tmp_path, name):
    filters, expected = FILTERS[name]
    _file(tmp_path / "d.h5", filters)
    with h5py.File(tmp_path / "d.h5") as f:
        decoder = decoder_for(f["x"])
    assert isinstance(decoder, Decoder)
    assert fused_codec(decoder) == expected


def test_one_byte_items_have_no_shuffle_to_undo(tmp_path):
    _file(tmp_path / "d.h5", dict(compression="gzip", shuffle=True), dtype="u1")
    with h5py.File(tmp_path / "d.h5") as f:
        assert fused_codec(decoder_for(f["x"])) == Fused("deflate", 0)


def _never_general(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("the general decoder was called")

    monkeypatch.setattr(Decoder, "decode", refuse)


@pytest.mark.parametrize("dtype", ["<f4", "<i2", "<f8", "u1", ">i4"])
@pytest.mark.parametrize("name", ["gzip", "shuffle+gzip", "zstd", "shuffle+zstd"])
def test_fast_path_reads_what_h5py_reads(tmp_path, monkeypatch, name, dtype):
    path = tmp_path / "d.h5"
    data = _file(path, FILTERS[name][0], dtype)
    reader = Reader(describe([path]), ReaderConfig(threads=2))
    if dtype[0] == ">":  # a byte-swapping scatter is not a row decode: the general path
        out = [np.empty((N, 6, 7), np.dtype(dtype).newbyteorder("="))]
        reader.read(np.arange(N), out)
        assert np.array_equal(out[0], data)
        return
    _never_general(monkeypatch)
    rng = np.random.default_rng(0)
    # Random requests with repeats (a sample twice in a step) and runs of adjacent chunks.
    for request in [rng.integers(0, N, 9), np.arange(N), np.array([5, 5, 6, 7, 5]), [N - 1]]:
        request = np.asarray(request)
        out = [np.full((request.size, 6, 7), 99, np.dtype(dtype))]
        rows = rng.permutation(request.size)
        reader.read(request, out, rows)
        assert out[0][rows].tobytes() == data[request].tobytes()
    reader.close()


def test_direct_io_takes_the_fast_path(tmp_path, monkeypatch):
    path = tmp_path / "d.h5"
    data = _file(path, FILTERS["shuffle+gzip"][0])
    with skip_without_o_direct():
        reader = Reader(describe([path]), ReaderConfig(threads=2, direct_io=True))
        _never_general(monkeypatch)
        out = [np.empty((N, 6, 7), np.float32)]
        reader.read(np.arange(N)[::-1].copy(), out)
        assert np.array_equal(out[0], data[::-1])
        reader.close()


def test_a_chunk_with_a_filter_skipped_takes_the_general_path(tmp_path, monkeypatch):
    path = tmp_path / "d.h5"
    data = _file(path, FILTERS["shuffle+gzip"][0])
    raw = np.ascontiguousarray(data[4]).view(np.uint8).reshape(-1, 4).T.copy()  # shuffled
    with h5py.File(path, "a") as f:  # deflate (bit 1) skipped for this chunk
        f["x"].id.write_direct_chunk((4, 0, 0), raw.tobytes(), filter_mask=0b10)
        assert np.array_equal(f["x"][4], data[4])
    calls = []
    general = Decoder.decode
    monkeypatch.setattr(Decoder, "decode", lambda *a, **k: calls.append(1) or general(*a, **k))
    reader = Reader(describe([path]), ReaderConfig(threads=2))
    out = [np.empty((N, 6, 7), np.float32)]
    reader.read(np.arange(N), out)
    assert np.array_equal(out[0], data)
    assert calls  # the masked chunk's task went the general way
    reader.close()


def test_a_corrupt_chunk_is_named_by_the_general_path(tmp_path):
    path = tmp_path / "d.h5"
    data = _file(path, FILTERS["gzip"][0])
    good = zlib.compress(data[9].tobytes())
    with h5py.File(path, "a") as f:  # same size, one byte flipped inside the stream
        bad = bytearray(good)
        bad[len(bad) // 2] ^= 0xFF
        f["x"].id.write_direct_chunk((9, 0, 0), bytes(bad))
    reader = Reader(describe([path]), ReaderConfig(threads=2))
    out = [np.zeros((3, 6, 7), np.float32)]
    reader.read(np.array([8, 10, 11]), out)  # the neighbours read fine
    assert np.array_equal(out[0], data[[8, 10, 11]])
    with pytest.raises(SolarError) as err:
        reader.read(np.array([8, 9, 10]), out)
    msg = str(err.value)
    assert "\n" not in msg and "'/x'" in msg and "(9, 0, 0)" in msg and str(path) in msg
    reader.close()


def test_the_kernel_reports_short_reads_and_bad_streams(tmp_path):
    """Directly: non-zero statuses, never an exception (the caller's general path names it)."""
    path = tmp_path / "d.h5"
    _file(path, FILTERS["gzip"][0])
    reader = Reader(describe([path]), ReaderConfig(threads=1))
    out = [np.empty((2, 6, 7), np.float32)]
    (task,) = reader._tasks(np.array([3]), out, np.array([1]))
    fused = task.source.fused
    assert fused == Fused("deflate", 0) and kernel("deflate") is not None
    buf = np.zeros(int(task.spans.at[-1]), np.uint8)
    with open(path, "rb") as f:
        assert read_fused(fused, f.fileno(), buf, task, 0, 1) == 0
        assert np.array_equal(out[0][1], h5py.File(path)["x"][3])
    with open(tmp_path / "empty", "wb+") as f:  # every pread at the end of the file
        assert read_fused(fused, f.fileno(), buf, task, 0, 1) == 1
    with open(tmp_path / "zeros", "wb+") as f:  # the bytes are there, but no zlib stream
        f.truncate(int(task.spans.hi[-1]) + 4096)
        assert read_fused(fused, f.fileno(), buf, task, 0, 1) == -1
    reader.close()


def test_inspect_says_which_datasets_take_the_fast_path(tmp_path):
    from solar.io.inspect import inspect_files

    path = tmp_path / "d.h5"
    with h5py.File(path, "w") as f:
        for name, chunks, filters in [
            ("one", (1, 6, 7), FILTERS["shuffle+zstd"][0]),
            ("four", (4, 6, 7), FILTERS["gzip"][0]),
            ("lz4", (1, 6, 7), FILTERS["lz4"][0]),
        ]:
            f.create_dataset(name, data=_data((N, 6, 7), "<f4"), chunks=chunks, **filters)
    why = {r.name: r.read_path_why for r in inspect_files([path])}
    assert "one compiled call" in why["one"]
    assert "one compiled call" not in why["four"] and "one compiled call" not in why["lz4"]


def test_windows_group_runs_within_a_byte_limit():
    assert windows(np.array([5, 5, 5]), 100) == [(0, 3)]
    assert windows(np.array([5, 5, 5, 200, 1]), 10) == [(0, 2), (2, 3), (3, 4), (4, 5)]
    assert windows(np.array([30]), 10) == [(0, 1)]


def test_a_task_is_read_window_by_window_each_advised_first(tmp_path, monkeypatch):
    from solar.io import advice as advice_module
    from solar.io import executor as executor_module

    path = tmp_path / "d.h5"
    data = _file(path, FILTERS["gzip"][0])
    _never_general(monkeypatch)
    monkeypatch.setattr(advice_module.Advice, "WINDOW", 1)  # one run per window
    advised: list[int] = []
    monkeypatch.setattr(advice_module.os, "posix_fadvise", lambda fd, a, n, h: advised.append(a))
    calls = []
    real = executor_module.read_fused

    def read_fused(fused, fd, buf, task, first, end):
        # Every run of the window was advised before the kernel reads it.
        assert set(task.spans.lo[first:end].tolist()) <= set(advised)
        calls.append((first, end))
        return real(fused, fd, buf, task, first, end)

    monkeypatch.setattr(executor_module, "read_fused", read_fused)
    reader = Reader(describe([path]), ReaderConfig(threads=1))
    request = np.array([30, 2, 9, 10, 11, 20])  # runs: 2, 9-11, 20, 30
    out = [np.empty((6, 6, 7), np.float32)]
    reader.read(request, out)
    assert np.array_equal(out[0], data[request])
    assert calls == [(0, 1), (1, 2), (2, 3), (3, 4)]
    reader.close()


def test_decoding_jobs_run_on_one_thread_per_core(tmp_path, monkeypatch):
    """Steps read ahead decode on at most one thread per core; O_DIRECT reads (not advised
    to the kernel) and other reads keep the whole pool."""
    import threading

    from solar.io import executor as executor_module

    path = tmp_path / "d.h5"
    data = _file(path, FILTERS["gzip"][0])
    monkeypatch.setattr(executor_module, "CORES", 2)
    names: set[str] = set()
    real = executor_module.Executor._job

    def job(self, *args):
        names.add(threading.current_thread().name)
        return real(self, *args)

    monkeypatch.setattr(executor_module.Executor, "_job", job)
    reader = Reader(describe([path]), ReaderConfig(threads=8))
    outs = [np.empty((1, 6, 7), np.float32) for _ in range(N)]
    futures = [reader.submit(np.array([i]), [outs[i]], np.arange(1)) for i in range(N)]
    for f in futures:
        executor_module.wait_all(f)
    assert np.array_equal(np.concatenate(outs), data)
    assert 1 <= len(names) <= 2
    pool = reader.executor.pool
    assert pool(decoding=True)._max_workers == 2 and pool()._max_workers == 8
    reader.close()


def test_refused_advice_is_only_advice(tmp_path, monkeypatch):
    """WILLNEED refused when a job is submitted: its reads still run, nothing is raised."""
    from solar.io import advice as advice_module
    from solar.io import executor as executor_module

    path = tmp_path / "d.h5"
    data = _file(path, FILTERS["shuffle+zstd"][0])

    def refuse(*args):
        raise OSError(5, "advice refused")

    monkeypatch.setattr(advice_module.os, "posix_fadvise", refuse)
    reader = Reader(describe([path]), ReaderConfig(threads=2))
    outs = [np.empty((2, 6, 7), np.float32) for _ in range(N)]
    futures = [reader.submit(np.array([i, N - 1 - i]), [outs[i]], np.arange(2)) for i in range(N)]
    for i, f in enumerate(futures):
        executor_module.wait_all(f)
        assert np.array_equal(outs[i], data[[i, N - 1 - i]])
    reader.close()

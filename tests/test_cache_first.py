"""Buffered reads take the page cache first (solar/io/executor.py ``_iov_runs``): the same
bytes whether their pages are cached or not, one call per run where they are, and one job
per core for such a step (``tries_cache``)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest

from solar.io import executor as executor_mod
from solar.io.executor import CORES, _iov_runs, job_count, tries_cache
from solar.io.tasks import ChunkReads, PreadvRuns

ROW = 1000  # rows straddle pages: a run's pages may be partly cached


def _runs(n_rows: int, rows: np.ndarray, out: np.ndarray) -> PreadvRuns:
    """One run per row ``rows[j]`` of the file, read into ``out[j]``."""
    iov = np.empty((rows.size, 2), np.uint64)
    iov[:, 0] = out.ctypes.data + np.arange(rows.size, dtype=np.uint64) * np.uint64(ROW)
    iov[:, 1] = ROW
    one = np.arange(rows.size, dtype=np.int64)
    return PreadvRuns(0, iov, one, np.ones(rows.size, np.int64), rows * ROW)


def _syscr() -> int:
    """Read calls this process has made (/proc/self/io: every preadv/preadv2, failed too),
    counting the one read of it that tells."""
    fd = os.open("/proc/self/io", os.O_RDONLY)
    try:
        text = os.read(fd, 4096).decode()
    finally:
        os.close(fd)
    return next(int(line.split()[1]) for line in text.splitlines() if line.startswith("syscr:"))


def _evicted(fd: int, size: int) -> bool:
    """Drop the file's pages; whether its first page is then not cached (tmpfs keeps them)."""
    os.fsync(fd)
    os.posix_fadvise(fd, 0, size, os.POSIX_FADV_DONTNEED)
    try:
        os.preadv(fd, [bytearray(1)], 0, os.RWF_NOWAIT)
    except BlockingIOError:
        return True
    return False


@pytest.mark.parametrize("cached", [True, False])
def test_buffered_runs_are_the_files_bytes_from_the_cache_or_the_disk(tmp_path, cached):
    n_rows = 3000
    data = np.random.default_rng(0).integers(0, 256, n_rows * ROW, np.uint8)
    path = tmp_path / "rows.bin"
    path.write_bytes(data.tobytes())
    rows = np.random.default_rng(1).choice(n_rows, 500, replace=False).astype(np.int64)
    out = np.zeros((rows.size, ROW), np.uint8)
    t = _runs(n_rows, rows, out)
    want = t.want()
    fd = os.open(path, os.O_RDONLY)
    try:
        if cached:
            os.pread(fd, data.size, 0)  # every page in the cache
        elif not _evicted(fd, data.size):
            pytest.skip("the file system keeps its pages (tmpfs)")
        got = np.empty(rows.size, np.int64)
        none = t.starts[:0]  # (the kernel loaded first: loading reads numba's cache files)
        _iov_runs(fd, t.iov, none, none, none, False, got, want)
        before = _syscr()
        _iov_runs(fd, t.iov, t.starts, t.counts, t.offsets, False, got, want)
        calls = _syscr() - before - 1
    finally:
        os.close(fd)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(out, data.reshape(n_rows, ROW)[rows])
    if cached:
        assert calls == rows.size  # each run one try, served from the cache: no wait
    else:
        assert rows.size < calls <= 2 * rows.size  # misses tried, then read


def test_a_run_past_the_end_is_short_either_way(tmp_path):
    """A run the file does not hold wholly reports what it got (the executor's retry names
    it), tried first or not."""
    path = tmp_path / "short.bin"
    path.write_bytes(bytes(range(256)) * 10)  # 2,560 bytes: row 2 ends past it
    rows = np.array([0, 2], np.int64)
    for first in (True, False):
        out = np.zeros((2, ROW), np.uint8)
        t = _runs(3, rows, out)
        got = np.empty(2, np.int64)
        fd = os.open(path, os.O_RDONLY)
        try:
            cached = t.want() if first else np.zeros(0, np.int64)
            _iov_runs(fd, t.iov, t.starts, t.counts, t.offsets, False, got, cached)
        finally:
            os.close(fd)
        assert got.tolist() == [ROW, 2560 - 2 * ROW]


def _source(direct_io=False, throttle=None):
    return SimpleNamespace(direct_io=direct_io, throttle=throttle)


def test_a_step_read_through_the_page_cache_is_one_job_per_core():
    rows = np.arange(4, dtype=np.int64)
    reads = [_runs(4, rows, np.zeros((4, ROW), np.uint8)) for _ in range(8)]
    writes = [PreadvRuns(0, r.iov, r.starts, r.counts, r.offsets, write=True) for r in reads]
    chunk = object.__new__(ChunkReads)
    assert tries_cache(reads, _source())
    assert job_count(reads, 8, False, _source()) == min(8, CORES)
    assert job_count(reads, 1, False, _source()) == 1
    # O_DIRECT, writes, an emulated remote file system, or other tasks in the step: a job
    # per thread, as before (their depth is the threads').
    others = ((reads, _source(direct_io=True)), (writes, _source()),
              (reads, _source(throttle=object())), ([*reads, chunk], _source()))  # fmt: skip
    for tasks, source in others:
        assert not tries_cache(tasks, source)
    assert job_count(reads, 8, False, _source(direct_io=True)) == 8
    assert not tries_cache([], _source())


def test_more_cores_than_threads_keeps_the_threads(monkeypatch):
    monkeypatch.setattr(executor_mod, "CORES", 64)
    rows = np.arange(4, dtype=np.int64)
    reads = [_runs(4, rows, np.zeros((4, ROW), np.uint8))]
    assert job_count(reads, 8, False, _source()) == 8

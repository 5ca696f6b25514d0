"""Buffered reads take the page cache first (solar/io/executor.py ``_iov_runs``): the same
bytes whether their pages are cached or not, one call per run where they are, and one job
per core for such a step (``tries_cache``)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import h5py
import numpy as np
import pytest

from solar.io import executor as executor_mod
from solar.io.executor import _iov_runs, deal, job_count, joined, tries_cache
from solar.io.handles import Files
from solar.io.hdf5 import describe
from solar.io.pagecache import takes_tries
from solar.io.tasks import ChunkReads, Layout, PreadvRuns, plan_reads
from solar.io.throttle import Throttle

ROW = 1000  # rows straddle pages: a run's pages may be partly cached


def _runs(rows: np.ndarray, out: np.ndarray) -> PreadvRuns:
    """One run per row ``rows[j]`` of the file, read into ``out[j]``."""
    iov = np.empty((rows.size, 2), np.uint64)
    iov[:, 0] = out.ctypes.data + np.arange(rows.size, dtype=np.uint64) * np.uint64(ROW)
    iov[:, 1] = ROW
    one = np.arange(rows.size, dtype=np.int64)
    return PreadvRuns(0, iov, one, np.ones(rows.size, np.int64), rows * ROW)


def _syscr() -> int:
    """Read calls this thread has made (/proc/thread-self/io: every preadv/preadv2, failed
    too; other threads' not), counting the one read of it that tells."""
    fd = os.open("/proc/thread-self/io", os.O_RDONLY)
    try:
        text = os.read(fd, 4096).decode()
    finally:
        os.close(fd)
    return next(int(line.split()[1]) for line in text.splitlines() if line.startswith("syscr:"))


def _evicted(fd: int, size: int) -> bool:
    """Drop the file's pages; whether its first page is then not cached."""
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
    t = _runs(rows, out)
    want = t.want()
    if not takes_tries(path):
        pytest.skip("the file system takes no reads tried from the page cache (tmpfs)")
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # (no page under write-back: a try would fail on it)
        if cached:
            os.pread(fd, data.size, 0)  # every page in the cache
        elif not _evicted(fd, data.size):
            pytest.skip("the file system keeps its pages")
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
        t = _runs(rows, out)
        got = np.empty(2, np.int64)
        fd = os.open(path, os.O_RDONLY)
        try:
            cached = t.want() if first else np.zeros(0, np.int64)
            _iov_runs(fd, t.iov, t.starts, t.counts, t.offsets, False, got, cached)
        finally:
            os.close(fd)
        assert got.tolist() == [ROW, 2560 - 2 * ROW]


def test_a_step_read_through_the_page_cache_is_one_job_per_core(monkeypatch):
    monkeypatch.setattr(executor_mod, "CORES", 2)
    rows = np.arange(4, dtype=np.int64)
    reads = [_runs(rows, np.zeros((4, ROW), np.uint8)) for _ in range(8)]
    writes = [PreadvRuns(0, r.iov, r.starts, r.counts, r.offsets, write=True) for r in reads]
    chunk = object.__new__(ChunkReads)
    first, plain = SimpleNamespace(cache_first=True), SimpleNamespace(cache_first=False)
    assert tries_cache(reads, first)
    assert job_count(reads, 8, False, tries_cache(reads, first)) == 2
    assert job_count(reads, 1, False, True) == 1
    # A source not tried first (O_DIRECT, an emulated remote file system, one that refuses
    # tries), writes, or other tasks in the step: a job per thread (their depth).
    for tasks, source in ((reads, plain), (writes, first), ([*reads, chunk], first)):
        assert not tries_cache(tasks, source)
        assert job_count(tasks, 8, False, tries_cache(tasks, source)) == 8
    assert not tries_cache([], first)


@pytest.mark.parametrize(("direct_io", "throttle"), [(False, None), (True, None),
                                                     (False, "200,1")])  # fmt: skip
def test_a_dataset_is_tried_first_only_buffered_local_and_where_its_file_system_takes_it(
        tmp_path, direct_io, throttle):  # fmt: skip
    path = tmp_path / "d.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(100, dtype=np.float32).reshape(10, 10)
    files = Files(describe([path], ["x"]), direct_io,
                  None if throttle is None else Throttle.parse(throttle))  # fmt: skip
    assert files.cache_first == (not direct_io and throttle is None and takes_tries(path))
    assert not takes_tries(tmp_path / "absent.h5")  # (its reads name it)


def test_more_cores_than_threads_keeps_the_threads(monkeypatch):
    monkeypatch.setattr(executor_mod, "CORES", 64)
    rows = np.arange(4, dtype=np.int64)
    reads = [_runs(rows, np.zeros((4, ROW), np.uint8))]
    assert job_count(reads, 8, False, True) == 8


def test_a_jobs_runs_are_one_task_per_file_and_table_reading_the_same_bytes(tmp_path):
    """joined: a job's runs dealt over several tasks become one per (file, iovec table), and
    executed they put the same bytes in the same rows."""
    rng = np.random.default_rng(2)
    row, lengths = 5000, [300, 200]  # rows over a page: each sample a run of its own
    contents = [rng.integers(0, 256, 16 + n * row, np.uint8) for n in lengths]
    paths = []
    for i, c in enumerate(contents):
        paths.append(tmp_path / f"f{i}.bin")
        paths[-1].write_bytes(c.tobytes())
    starts = np.array([0, 300, 500])
    samples = rng.choice(500, 150, replace=False).astype(np.int64)
    out = [np.zeros((samples.size, row), np.uint8)]
    tasks = plan_reads([[Layout(16, row, 0)] for _ in lengths], starts, samples, out,
                       np.arange(samples.size), direct_io=False, groups=8)  # fmt: skip
    assert len({t.file for t in tasks}) == 2 and len(tasks) == 16
    for job in deal(tasks, 2):
        merged = joined(job)
        assert len(merged) == 2  # one per file (one table each)
        assert sum(t.starts.size for t in merged) == sum(t.starts.size for t in job)
        for t in merged:
            assert isinstance(t, PreadvRuns)
            got = np.empty(t.starts.size, np.int64)
            fd = os.open(paths[t.file], os.O_RDONLY)
            try:
                _iov_runs(fd, t.iov, t.starts, t.counts, t.offsets, False, got, t.want())
            finally:
                os.close(fd)
            np.testing.assert_array_equal(got, t.want())
    for j, x in enumerate(samples.tolist()):
        f = int(x >= 300)
        local = x - starts[f]
        np.testing.assert_array_equal(out[0][j], contents[f][16 + local * row :][:row])

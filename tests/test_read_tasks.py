"""The I/O plan as pure functions: run coalescing and read tasks, checked without files."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solar import ReaderConfig, SolarError
from solar._memory import PAGE
from solar.io.tasks import (
    GAP,
    IOV_MAX,
    JOIN_GAP,
    RUN_MAX_BYTES,
    BounceRun,
    H5Rows,
    Layout,
    PageGather,
    PreadvRuns,
    SlotLayout,
    coalesce_runs,
    joined_runs,
    page_spans,
    plan_reads,
    plan_slot_reads,
    plan_slot_writes,
)


def test_coalesce_joins_adjacent_samples_and_cuts_long_runs():
    runs = coalesce_runs(np.array([7, 3, 4, 5, 9, 10, 11, 12, 13]), max_rows=3)
    srt = np.array([7, 3, 4, 5, 9, 10, 11, 12, 13])[runs.order]
    assert srt.tolist() == [3, 4, 5, 7, 9, 10, 11, 12, 13]
    assert list(zip(runs.starts.tolist(), runs.counts.tolist(), strict=True)) == [
        (0, 3), (3, 1), (4, 3), (7, 2),
    ]  # fmt: skip


def test_a_repeated_sample_starts_a_new_run():
    runs = coalesce_runs(np.array([2, 2, 3]), max_rows=10)
    assert runs.counts.tolist() == [1, 2]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 40), max_size=60), st.integers(1, 8))
def test_runs_cover_the_request_with_consecutive_samples(local, max_rows):
    local = np.array(local, np.int64)
    runs = coalesce_runs(local, max_rows)
    srt = local[runs.order]
    assert sorted(runs.order.tolist()) == list(range(local.size))
    assert runs.counts.sum() == local.size
    assert np.all((runs.counts >= 1) & (runs.counts <= max_rows))
    for a, n in zip(runs.starts, runs.counts, strict=True):
        np.testing.assert_array_equal(np.diff(srt[a : a + n]), np.ones(n - 1))


class FakeStore:
    """Executes read tasks against in-memory files and records every request: each iovec
    entry gets the bytes preadv would put at its address."""

    def __init__(self, files: list[bytes]) -> None:
        self.files = [bytearray(f) for f in files]
        self.requests: list[tuple[int, int, int]] = []  # (file, offset, bytes)

    def run(self, task) -> None:
        if isinstance(task, PreadvRuns):
            want = task.want()
            for a, n, off, size in zip(task.starts, task.counts, task.offsets, want, strict=True):
                self.requests.append((task.file, int(off), int(size)))
                at = int(off)
                for address, length in task.iov[a : a + n].tolist():
                    if task.write:  # pwritev: from memory into the file
                        self.files[task.file][at : at + length] = ctypes.string_at(address, length)
                    else:
                        data = bytes(self.files[task.file][at : at + length])
                        assert len(data) == length
                        ctypes.memmove(address, data, length)
                    at += length
        elif isinstance(task, BounceRun):
            size = task.stride * task.rows.size
            self.requests.append((task.file, task.offset, size))
            data = bytes(self.files[task.file][task.offset : task.offset + size])
            records = np.frombuffer(data, np.uint8).reshape(task.rows.size, task.stride)
            for d, at in zip(task.dests, task.fields, strict=True):
                d[task.rows] = records[:, at : at + d.shape[1]]
        elif isinstance(task, PageGather):
            for s, (lo, size) in enumerate(zip(task.lo.tolist(), task.size.tolist(), strict=True)):
                assert lo % PAGE == 0 and size % PAGE == 0
                self.requests.append((task.file, lo, size))
                span = bytes(self.files[task.file][lo : lo + size])  # short at the file's end
                width = task.dest.shape[1]
                for j in range(task.first[s], task.first[s + 1]):
                    at = int(task.src[j]) - lo
                    assert 0 <= at and at + width <= len(span)
                    task.dest[task.rows[j]] = np.frombuffer(span[at : at + width], np.uint8)
        else:
            raise AssertionError(f"unexpected task {task}")


@pytest.mark.parametrize("direct_io", [False, True])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_executing_the_plan_puts_each_sample_in_its_row(direct_io, data):
    lengths = data.draw(st.lists(st.integers(1, 12), min_size=1, max_size=4))
    row_bytes = data.draw(st.sampled_from([1, 8, 24]))
    header = data.draw(st.integers(0, 100))
    rng = np.random.default_rng(0)
    contents = [rng.integers(0, 255, header + n * row_bytes, np.uint8) for n in lengths]
    starts = np.concatenate([[0], np.cumsum(lengths)])
    layouts = [[Layout(header, row_bytes, 0)] for _ in lengths]
    samples = np.array(data.draw(st.lists(st.integers(0, starts[-1] - 1), min_size=1)), np.int64)
    rows = np.random.default_rng(1).permutation(samples.size + 2)[: samples.size]
    out = [np.zeros((samples.size + 2, row_bytes), np.uint8)]
    tasks = plan_reads(layouts, starts, samples, out, rows, direct_io=direct_io, groups=3)
    store = FakeStore([c.tobytes() for c in contents])
    for t in tasks:
        store.run(t)
    for x, r in zip(samples.tolist(), rows.tolist(), strict=True):
        f = int(np.searchsorted(starts, x, side="right") - 1)
        local = x - starts[f]
        want = contents[f][header + local * row_bytes : header + (local + 1) * row_bytes]
        np.testing.assert_array_equal(out[0][r], want)
    assert not np.delete(out[0], rows, axis=0).any()  # no byte reaches a row not asked for
    # Each run of samples within a file at most JOIN_GAP bytes apart is one request (a
    # repeated sample starts one), not one per sample; with O_DIRECT, each run of samples
    # whose pages touch or overlap.
    files = np.searchsorted(starts, samples, side="right") - 1
    runs = 0
    for f in np.unique(files):
        srt = np.unique(samples[files == f]) - starts[f]
        if direct_io:
            first, last = (
                (header + srt * row_bytes) // PAGE,
                (header + (srt + 1) * row_bytes - 1) // PAGE,
            )
            runs += 1 + int(np.count_nonzero(first[1:] > last[:-1] + 1))
        else:
            gap = np.diff(np.sort(samples[files == f])) - 1
            runs += 1 + int(np.count_nonzero((gap < 0) | (gap > JOIN_GAP // row_bytes)))
    assert len(store.requests) == runs


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 3000), min_size=1, max_size=40), st.sampled_from([1, 100, 4096, 5000]),
    st.integers(0, 2), st.sampled_from([PAGE, 4 * PAGE, 2**20]),
)  # fmt: skip
def test_page_spans_cover_every_row_in_whole_pages(offsets, row_bytes, gap, max_bytes):
    src = np.sort(np.array(offsets, np.int64) * 7)
    lo, size, first = page_spans(src, row_bytes, gap, max_bytes, PAGE)
    assert np.all(lo % PAGE == 0) and np.all(size % PAGE == 0) and np.all(size > 0)
    assert first[0] == 0 and first[-1] == src.size and np.all(np.diff(first) > 0)
    assert np.all(lo[1:] >= lo[:-1])
    for s in range(lo.size):
        rows = src[first[s] : first[s + 1]]
        assert np.all(rows >= lo[s]) and np.all(rows + row_bytes <= lo[s] + size[s])
        # A span is exactly the pages its rows need, bridging gaps of at most ``gap`` pages.
        assert lo[s] == rows[0] // PAGE * PAGE
        assert lo[s] + size[s] == -(-(rows + row_bytes).max() // PAGE) * PAGE
        assert size[s] <= max(max_bytes, -(-row_bytes // PAGE) * PAGE + PAGE)
        if s + 1 < lo.size and lo[s + 1] <= lo[s] + size[s] + gap * PAGE:
            end = -(-(src[first[s + 1]] + row_bytes) // PAGE) * PAGE  # the next row's pages
            assert end - lo[s] > max_bytes  # merging it would have made the span too long


def test_adjacent_samples_are_one_request_and_threads_share_runs():
    layouts = [[Layout(0, 1024, 0)]]  # rows more than JOIN_GAP apart are separate requests
    out = [np.zeros((12, 1024), np.uint8)]
    samples = np.array([0, 1, 2, 3, 10, 11, 20, 30], np.int64)
    tasks = plan_reads(layouts, np.array([0, 40]), samples, out, np.arange(8),
                       direct_io=False, groups=2)  # fmt: skip
    store = FakeStore([bytes(40 * 1024)])
    for t in tasks:
        store.run(t)
    assert sorted(store.requests) == [(0, 0, 4096), (0, 10240, 2048), (0, 20480, 1024),
                                      (0, 30720, 1024)]  # fmt: skip
    # (two tasks of 4 rows each: the first run, then the other three)
    assert [int(t.counts.sum()) for t in tasks] == [4, 4] and sum(t.requests for t in tasks) == 4


def test_buffered_runs_are_cut_into_tasks_each_a_sweep_in_file_order():
    """Each task's runs are consecutive runs of the step's, in file order (a job reading its
    tasks reads the file in one sweep, not interleaved ones)."""
    layouts = [[Layout(0, 1024, 0)]]
    samples = np.random.default_rng(3).choice(1000, 50, replace=False).astype(np.int64) * 10
    out = [np.zeros((50, 1024), np.uint8)]
    tasks = plan_reads(layouts, np.array([0, 10000]), samples, out, np.arange(50),
                       direct_io=False, groups=4)  # fmt: skip
    offsets = np.concatenate([t.offsets for t in tasks])
    assert len(tasks) == 4 and offsets.size == 50  # (rows 10 KiB apart: a run each)
    np.testing.assert_array_equal(offsets, np.sort(samples) * 1024)
    assert sorted(t.offsets.size for t in tasks) == [12, 12, 13, 13]


def test_tier_runs_are_cut_into_tasks_of_about_equal_rows():
    """Long runs (adjacent slots) and short ones: no task is empty or more than one run over
    an equal share of the iovec entries, and every run is read once, in file order."""
    layout = SlotLayout((100,))
    slots = np.concatenate([np.arange(1536), 2000 + 3 * np.arange(512)]).astype(np.int64)
    scratch = np.zeros(layout.stride, np.uint8)
    dest = [np.zeros((slots.size, 100), np.uint8)]
    for groups in (1, 4, 7, 5000):
        tasks = plan_slot_reads(layout, slots, dest, np.arange(slots.size), into_rows=True,
                                scratch=scratch.ctypes.data, groups=groups)  # fmt: skip
        entries = [int(t.counts.sum()) for t in tasks]
        runs = np.concatenate([t.counts for t in tasks])
        assert 0 < len(tasks) <= groups and min(entries) > 0
        assert max(entries) <= sum(entries) / min(groups, runs.size) + runs.max()
        offsets = np.concatenate([t.offsets for t in tasks])
        assert np.all(np.diff(offsets) > 0)  # every run once, in file order


def test_samples_within_a_page_of_each_other_are_one_buffered_request():
    """The bytes between them are read into GAP, never into the batch: rows not asked for
    stay as they were."""
    assert JOIN_GAP == PAGE
    layouts = [[Layout(512, 1024, 0)]]
    contents = np.random.default_rng(2).integers(0, 255, 512 + 20 * 1024, np.uint8)
    out = [np.zeros((6, 1024), np.uint8)]
    samples = np.array([7, 0, 13, 2], np.int64)  # 0-2-7: gaps of 1 and 4 rows; 13: 5 rows
    tasks = plan_reads(layouts, np.array([0, 20]), samples, out, np.arange(4),
                       direct_io=False, groups=1)  # fmt: skip
    store = FakeStore([contents.tobytes()])
    for t in tasks:
        store.run(t)
    assert sorted(store.requests) == [(0, 512, 8 * 1024), (0, 512 + 13 * 1024, 1024)]
    for row, x in enumerate(samples.tolist()):
        np.testing.assert_array_equal(out[0][row], contents[512 + x * 1024 : 512 + (x + 1) * 1024])
    assert not out[0][4:].any()


def _check_joined(srt, row_bytes, gap_rows, max_entries, max_bytes):
    """joined_runs on sorted samples ``srt`` into rows 0.. of a destination: every property
    its runs promise, and each cut forced by a repeat, a wide gap or a limit."""
    dest = np.zeros((srt.size, row_bytes), np.uint8)
    at, gap_at = dest.ctypes.data, GAP.ctypes.data
    rows = np.arange(srt.size)
    iov, starts, counts, offsets = joined_runs(
        srt, rows, np.uint64(at), row_bytes, 100, np.uint64(gap_at), gap_rows, max_entries,
        max_bytes,
    )  # fmt: skip
    want = PreadvRuns(0, iov, starts, counts, offsets).want()
    assert np.all(counts <= max_entries) and np.all(want <= max_bytes)
    assert starts[0] == 0 and np.all(starts[1:] == starts[:-1] + counts[:-1])
    assert starts[-1] + counts[-1] == len(iov)
    k = 0  # the next sample (and row): rows come in file order, each once
    for j, (a, n) in enumerate(zip(starts.tolist(), counts.tolist(), strict=True)):
        pos, prev_gap = int(offsets[j]), True
        for e, (address, length) in enumerate(iov[a : a + n].tolist()):
            if address == gap_at:  # a gap: between two rows, at most JOIN_GAP bytes
                assert not prev_gap and 0 < e < n - 1 and length <= gap_rows * row_bytes
                assert length <= JOIN_GAP and length % row_bytes == 0
            else:  # a row: sample srt[k] at its file offset into row k
                assert (address, length) == (at + k * row_bytes, row_bytes)
                assert pos == 100 + srt[k] * row_bytes
                if e == 0 and k > 0:  # a cut: the next sample could not join the run
                    gap = int(srt[k] - srt[k - 1]) - 1
                    full = counts[j - 1] + 1 + (gap > 0) > max_entries
                    assert gap < 0 or gap > gap_rows or full or \
                        want[j - 1] + (gap + 1) * row_bytes > max_bytes  # fmt: skip
                elif e > 0:  # joined: not a repeat
                    assert srt[k] > srt[k - 1]
                k += 1
            prev_gap = address == gap_at
            pos += length
    assert k == srt.size
    assert np.all(iov[:, 1] > 0) and int(want.sum()) >= srt.size * row_bytes
    return counts, want


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 60), min_size=1, max_size=50), st.sampled_from([512, 1024, 4096]),
       st.integers(1, 9), st.integers(1, 12))  # fmt: skip
def test_joined_runs_alternate_rows_and_gaps_within_their_limits(local, row_bytes, entries, rows):
    srt = np.sort(np.array(local, np.int64))
    _check_joined(srt, row_bytes, JOIN_GAP // row_bytes, entries, rows * row_bytes)


def test_joined_runs_are_cut_at_iov_max_and_run_max_bytes():
    """The reader's own limits, and a byte limit reached with gaps in every run (with JOIN_GAP
    of a page, a run with gaps moves at most a page an entry: IOV_MAX binds before
    RUN_MAX_BYTES, which binds on rows wider than a gap can join)."""
    every_other = np.arange(0, 2 * IOV_MAX + 10, 2, dtype=np.int64)  # 2 entries a row
    counts, _ = _check_joined(every_other, 1024, JOIN_GAP // 1024, IOV_MAX, RUN_MAX_BYTES)
    assert counts.size > 2 and np.all(counts[:-1] == IOV_MAX - (IOV_MAX + 1) % 2)  # odd: row last
    wide = 4 * PAGE
    _, want = _check_joined(np.arange(RUN_MAX_BYTES // wide + 9), wide, 0, IOV_MAX, RUN_MAX_BYTES)
    assert want.tolist() == [RUN_MAX_BYTES, 9 * wide]
    _, want = _check_joined(np.arange(0, 40, 2, dtype=np.int64), 1024, 4, IOV_MAX, 10 * 1024)
    assert want.size > 2 and np.all(want[:-1] == 9 * 1024)  # 5 rows, 4 gaps: the next is 2 KiB
    # A repeated sample starts a new run, even within the limits and next to its twin.
    counts, _ = _check_joined(np.array([3, 3, 4, 6, 6], np.int64), 1024, 4, 64, 2**20)
    assert counts.tolist() == [1, 4, 1]


def test_datasets_without_an_offset_go_through_h5py():
    layouts = [[Layout(0, 4, 0), Layout(None, 8, 5)]]
    out = [np.zeros((3, 4), np.uint8), np.zeros((3, 2), np.float32)]
    tasks = plan_reads(layouts, np.array([0, 20]), np.array([3, 4, 11]), out, np.arange(3),
                       direct_io=False, groups=1)  # fmt: skip
    h5 = [t for t in tasks if isinstance(t, H5Rows)]
    assert len(h5) == 1 and h5[0].key == 1 and h5[0].requests == 2  # chunks 0 and 2


@pytest.mark.parametrize(
    ("samples", "rows", "message"),
    [([20], [0], "sample id out of range"), ([-1], [0], "sample id"), ([1], [3], "row out of")],
)
def test_out_of_range_requests_are_refused(samples, rows, message):
    out = [np.zeros((3, 4), np.uint8)]
    with pytest.raises(SolarError, match=message):
        plan_reads([[Layout(0, 4, 0)]], np.array([0, 20]), np.array(samples), out,
                   np.array(rows), direct_io=False, groups=1)  # fmt: skip


@pytest.mark.parametrize(
    ("field", "value"),
    [("threads", 0), ("threads", 1.5), ("read_ahead", -1), ("direct_io", "yes"), ("threads", True),
     ("read_ahead_samples", -2)],
)  # fmt: skip
def test_reader_config_refuses_bad_values_by_name(field, value):
    with pytest.raises(SolarError, match=f"^{field} must be"):
        ReaderConfig(**{field: value})


def test_small_batches_read_ahead_more_steps():
    config = ReaderConfig(read_ahead=4, read_ahead_samples=16)
    assert [config.read_ahead_steps(b) for b in (1, 3, 4, 5, 64)] == [16, 6, 4, 4, 4]
    assert ReaderConfig(read_ahead=0).read_ahead_steps(1) == 0  # none asked: none
    assert ReaderConfig(read_ahead_samples=0).read_ahead_steps(1) == 4


@pytest.mark.parametrize("into_rows", [True, False], ids=["into-rows", "bounce"])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_tier_records_written_then_read_land_in_their_rows(into_rows, data):
    """Slot writes from staging and slot reads into batch rows, executed by the recording
    fake: every key's row comes back from its record; adjacent slots are one request."""
    sizes = tuple(data.draw(st.lists(st.sampled_from([0, 3, 8, 4096, 5000]), min_size=1,
                                     max_size=3)))  # fmt: skip
    layout = SlotLayout(sizes)
    slots = 12
    written = np.array(sorted(data.draw(st.sets(st.integers(0, slots - 1), min_size=1))))
    rng = np.random.default_rng(0)
    staging = rng.integers(0, 256, (written.size, layout.stride), np.uint8)
    stage = rng.permutation(written.size)  # staging row of each written slot
    store = FakeStore([bytes(slots * layout.stride)])
    store.run(plan_slot_writes(layout, written, staging, stage, drop=False))
    assert len(store.requests) == 1 + int(np.count_nonzero(np.diff(written) != 1))
    wanted = np.array(data.draw(st.lists(st.sampled_from(written.tolist()), min_size=1)))
    rows = rng.permutation(wanted.size + 1)[: wanted.size]
    dests = [np.zeros((wanted.size + 1, n), np.uint8) for n in sizes]
    scratch = np.zeros(PAGE, np.uint8)
    tasks = plan_slot_reads(layout, wanted, dests, rows, into_rows=into_rows,
                            scratch=scratch.ctypes.data, groups=2)  # fmt: skip
    assert all(isinstance(t, PreadvRuns if into_rows else BounceRun) for t in tasks)
    for t in tasks:
        store.run(t)
    at = {int(s): int(g) for s, g in zip(written, stage, strict=True)}
    for s, r in zip(wanted.tolist(), rows.tolist(), strict=True):
        for d, field, n in zip(dests, layout.fields, sizes, strict=True):
            assert d[r].tobytes() == staging[at[s], field : field + n].tobytes()


def test_o_direct_small_rows_bridge_gaps_of_page_gap_pages():
    """Rows 100 B wide on pages 0, 2 and 9: with page_gap 1 the first two are one read."""
    layouts = [[Layout(0, 100, 0)]]
    samples = np.array([0, 2 * PAGE // 100 + 1, 9 * PAGE // 100 + 1], np.int64)
    out = [np.zeros((3, 100), np.uint8)]
    store = FakeStore([np.arange(10 * PAGE, dtype=np.uint8).tobytes()])
    for gap, want in ((0, [(0, 0, PAGE), (0, 2 * PAGE, PAGE), (0, 9 * PAGE, PAGE)]),
                      (1, [(0, 0, 3 * PAGE), (0, 9 * PAGE, PAGE)])):  # fmt: skip
        store.requests.clear()
        tasks = plan_reads(layouts, np.array([0, 10 * PAGE // 100]), samples, out, np.arange(3),
                           direct_io=True, groups=1, page_gap=gap)  # fmt: skip
        for t in tasks:
            store.run(t)
        assert sorted(store.requests) == want
        for r, x in enumerate(samples.tolist()):
            assert out[0][r].tobytes() == store.files[0][x * 100 : x * 100 + 100]
    with pytest.raises(SolarError, match="page_gap"):
        ReaderConfig(page_gap=-1)

"""A trace's planning tables are sized by the keys a window touches, never by N (issue 48:
solar/schedule/draw/keyspace.py): the dense numbering itself, and a run over 10^12 samples
planned in the memory of its few accesses, with the decisions of the same trace over N small."""

from __future__ import annotations

import itertools
import tracemalloc

import numpy as np
import pytest
from helpers import EveryRanksTrace, proc_status, reset_peak_rss

from solar import BufferConfig, PlanSpec, RunConfig
from solar.errors import SolarError
from solar.schedule import HIT
from solar.schedule.draw import keyspace
from solar.schedule.draw.draws import EpochDraws
from solar.schedule.draw.keyspace import distinct_batches, key_space
from solar.schedule.draw.pagemates import PageLayout
from solar.schedule.draw.samplers import Trace
from solar.schedule.draw.traces import TraceOrder
from solar.schedule.keep.planner import Planner
from solar.warm import _DistinctTrace  # (a Trace of distinct batches that says so)


def test_key_space_numbers_the_distinct_keys_in_their_order():
    a, b = np.array([70, 5, 70, 12**12], np.int64), np.array([5, 3], np.int64)
    keys, (la, lb) = key_space([a, b])
    assert keys.tolist() == [3, 5, 70, 12**12]
    assert np.array_equal(keys[la], a) and np.array_equal(keys[lb], b)
    empty, none = key_space([])
    assert empty.size == 0 and none == []
    # A span less than OFFSET_SPAN (6) times the accesses: every key of it, numbered by
    # offset (no sort).
    span, (lc,) = key_space([np.array([9, 6, 9, 9], np.int64)])
    assert span.tolist() == [6, 7, 8, 9] and lc.tolist() == [3, 0, 3, 3]
    wide, (lw,) = key_space([np.array([28, 5, 28, 28], np.int64)])  # (23 wide, 4 accesses)
    assert wide.tolist() == list(range(5, 29)) and lw.tolist() == [23, 0, 23, 23]
    sparse, (ls,) = key_space([np.array([29, 5, 29, 29], np.int64)])  # (24 wide: sorted)
    assert sparse.tolist() == [5, 29] and ls.tolist() == [1, 0, 1, 1]


def test_distinct_batches_keep_first_occurrences_per_batch():
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 40, 300).astype(np.int64)
    offsets = np.array([0, 0, 7, 100, 101, 250, 300], np.int64)  # 3 steps x 2 ranks
    sample, rank = np.empty(300, np.int64), np.empty(300, np.int16)
    counts = np.zeros((3, 2), np.int32)
    n = distinct_batches(ids, offsets, 2, sample, rank, counts, False)
    want = [list(dict.fromkeys(ids[a:b].tolist())) for a, b in itertools.pairwise(offsets)]
    assert sample[:n].tolist() == [x for w in want for x in w]
    assert counts.ravel().tolist() == [len(w) for w in want]
    assert rank[:n].tolist() == [g % 2 for g, w in enumerate(want) for _ in w]


def _plans(n: int, ids: np.ndarray, window: int | None, only_rank: int | None):
    epochs, steps, world, batch = ids.shape
    run = RunConfig(n, world, batch, epochs, 0, False, steps * world * batch)
    spec = PlanSpec(run, BufferConfig(40), sampler=Trace(ids), pages=PageLayout(0, 32, 4096),
                    window=window)  # fmt: skip
    planner = Planner(spec, only_rank=only_rank)
    return [planner.next_schedule() for _ in range(epochs)]


# A huge N whose (rank, sample) ids over 2 ranks stay int32 (the signatures `solar warm` and the
# small run compile serve it: none compiled for this test alone); a table of N would be GBs.
HUGE = 2**30 - 1


@pytest.mark.parametrize("window", [None, 1])
@pytest.mark.parametrize("only_rank", [None, 1])
def test_a_trace_over_huge_n_is_planned_in_the_memory_of_its_accesses(window, only_rank):
    """The same trace over N = 5000 and N = 2^30 - 1: the same decisions (page mates
    included: rows past the last one drawn are never used), and the huge run's memory a few
    megabytes (a table of N, or P·N, keys would be gigabytes). tracemalloc sees numpy's
    allocations, not those inside numba kernels: the peak RSS over the plan covers those."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 5000, (2, 4, 2, 64)).astype(np.int64)
    ids[:, 2:] = ids[:, :2]  # reuse: hits and page mates to keep
    small = _plans(5000, ids, window, only_rank)
    _plans(HUGE, ids, window, only_rank)  # (first calls' costs, numba's included: not counted)
    rss = reset_peak_rss() and proc_status("VmRSS")
    tracemalloc.start()
    try:
        huge = _plans(HUGE, ids, window, only_rank)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20
    if rss:
        assert proc_status("VmHWM") - rss < 64 << 20
    kept = 0
    for (s0, a), (s1, b) in zip(small, huge, strict=True):
        assert np.array_equal(s0, s1)
        for f in ("rank", "slot", "flags", "counts", "sides"):
            assert np.array_equal(getattr(a, f), getattr(b, f)), f
        kept += int(np.count_nonzero(a.flags))
    assert kept > 0  # (something was held or read alongside: the comparison has teeth)


@pytest.mark.parametrize("window", [None, 1])
def test_page_mates_are_kept_alike_whether_the_keys_are_every_key_of_their_span_or_sorted(
    window, monkeypatch
):
    """Keys numbered by offset (every key of their span, many unused) let the page-mate scan
    find a row's key by arithmetic; sorted (only those used), by a walk: the same decisions,
    side rows included."""
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 400, (2, 4, 2, 64)).astype(np.int64)  # keys span 800 < 6 x accesses
    ids[:, 2:] = ids[:, :2]
    by_offset = _plans(400, ids, window, None)
    monkeypatch.setattr(keyspace, "OFFSET_SPAN", 0)  # every window's keys sorted
    by_sort = _plans(400, ids, window, None)
    sides = 0
    for (s0, a), (s1, b) in zip(by_offset, by_sort, strict=True):
        assert np.array_equal(s0, s1)
        for f in ("sample", "rank", "slot", "flags", "counts", "sides"):
            assert np.array_equal(getattr(a, f), getattr(b, f)), f
        sides += int(a.sides.sum())
    assert sides > 0  # (page mates were kept: the comparison has teeth)


def test_a_sampler_of_distinct_batches_is_traced_as_one_whose_repeats_are_dropped():
    """Batches of distinct ids (3 ranks) traced as drawn: the trace the pass that keeps first
    occurrences makes of them, dtypes included."""
    rng = np.random.default_rng(4)
    ids = np.stack([rng.permutation(500)[:24] for _ in range(2 * 3 * 3)]).reshape(2, 3, 3, 24)
    run = RunConfig(500, 3, 24, 2, 0, False, 3 * 3 * 24)
    for k in range(2):
        a, b = (TraceOrder(run, s(ids)).epoch(k) for s in (Trace, _DistinctTrace))
        for f in ("sample", "pair", "rank", "counts", "bounds"):
            assert np.array_equal(getattr(a, f), getattr(b, f)), f
            assert getattr(a, f).dtype == getattr(b, f).dtype, f


def test_rows_larger_than_a_page_are_planned_with_their_page_mates_offered():
    """Rows of 100 KB on 4 KiB pages span ~25 pages each, none wholly inside one: no page
    mate to offer (a set of the pages a (step, rank) read, sized for two a row, once spun
    forever here); the plan ends, with hits."""
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 300, (2, 4, 2, 16)).astype(np.int64)
    ids[:, 2:] = ids[:, :2]
    epochs, steps, world, batch = ids.shape
    run = RunConfig(300, world, batch, epochs, 0, False, steps * world * batch)
    spec = PlanSpec(run, BufferConfig(40), sampler=Trace(ids), pages=PageLayout(0, 100_000, 4096))
    planner = Planner(spec)
    hits = sum(int(np.count_nonzero(planner.next_schedule()[1].flags & HIT)) for _ in range(epochs))
    assert hits > 0


class _Beyond(Trace):
    """A sampler subclass whose draws are shifted out of 0..N-1 (Trace checks its own)."""

    shift = 0

    def epoch(self, run, epoch):
        got = super().epoch(run, epoch)
        return EpochDraws(got.ids + self.shift, got.offsets, got.outputs)


@pytest.mark.parametrize("shift", [64, -1])
def test_a_sampler_drawing_ids_outside_the_dataset_is_refused_in_one_line(shift):
    ids = np.arange(64, dtype=np.int64).reshape(1, 4, 2, 8)
    run = RunConfig(64, 2, 8, 1, 0, False, 64)
    sampler = _Beyond(ids)
    sampler.shift = shift
    with pytest.raises(SolarError, match=r"^sampler _Beyond: epoch 0 draws a sample id outside "
                                         r"0\.\.63$"):  # fmt: skip
        Planner(PlanSpec(run, BufferConfig(8), sampler=sampler)).next_schedule()


@pytest.mark.parametrize("window", [None, 2])
@pytest.mark.parametrize("rank", [0, 1, 2])
def test_a_rank_planned_alone_refuses_other_ranks_batches_in_one_line(rank, window):
    """A rank planned alone keeps one row of tables (row rank - only_rank): another rank's
    accesses, above or below it, would be written outside them or into its own row. Refused
    in one line naming the sampler and epoch, on the whole-epoch path and in windows."""
    ids = np.arange(96, dtype=np.int64).reshape(1, 4, 3, 8)
    run = RunConfig(96, 3, 8, 1, 0, False, 96)
    spec = PlanSpec(run, BufferConfig(8), sampler=EveryRanksTrace(ids), window=window)
    planner = Planner(spec, only_rank=rank)
    refused = rf"^sampler EveryRanksTrace: epoch 0 gives batches of ranks other than {rank}, "
    with pytest.raises(SolarError, match=refused + r"planned alone [^\n]*$"):
        planner.next_rank(rank)
    # (the same draws, each rank's kept to its own: planned)
    assert Planner(PlanSpec(run, BufferConfig(8), sampler=Trace(ids), window=window),
                   only_rank=rank).next_rank(rank).sample.size == 32  # fmt: skip

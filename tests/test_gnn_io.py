"""Issue 34's I/O half: page mates at every P, reads with many requests in flight (native
AIO, solar/io/aio.py), the storage probe (solar/io/probe.py), node reordering
(solar/graph/reorder.py)."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solar import BufferConfig, PlanSpec, RunConfig, Trace, make_plan
from solar._memory import PAGE, aligned
from solar.errors import SolarError
from solar.graph import Graph, write_graph
from solar.graph.reorder import reorder_nodes, rows_per_page
from solar.io import aio
from solar.io.probe import probe
from solar.schedule import HIT
from solar.schedule.draw.pagemates import PageLayout
from solar.schedule.keep.planner import Planner


def _spec(ids: np.ndarray, capacity: int, row_bytes: int, pages: bool) -> PlanSpec:
    e, s, world, b = ids.shape
    n = int(ids.max()) + 1
    run = RunConfig(n, world, b, e, 0, False, s * world * b)
    layout = PageLayout(0, row_bytes, 64) if pages else None
    return PlanSpec(run, BufferConfig(capacity), sampler=Trace(ids), pages=layout)


def _hits(ids: np.ndarray, capacity: int, row_bytes: int, pages: bool) -> list[int]:
    return [st.hits for st in make_plan(_spec(ids, capacity, row_bytes, pages)).stats]


def _hits_alone(ids: np.ndarray, capacity: int, row_bytes: int, pages: bool) -> list[int]:
    """Each rank planning alone, as the Loader plans (Planner(only_rank=r))."""
    spec = _spec(ids, capacity, row_bytes, pages)
    out = []
    for r in range(ids.shape[2]):
        planner = Planner(spec, only_rank=r)
        parts = [planner.next_rank(r) for _ in range(spec.run.epochs)]
        out.append(sum(int(np.count_nonzero(p.flags & HIT)) for p in parts))
    return out


@settings(max_examples=100, deadline=None)
@given(world=st.integers(1, 4), n=st.integers(8, 120), steps=st.integers(2, 6),
       batch=st.integers(1, 12), capacity=st.integers(1, 30), per_page=st.sampled_from([2, 4, 8]),
       seed=st.integers(0, 2**16))  # fmt: skip
def test_page_mates_never_plan_fewer_hits_than_rows_alone(world, n, steps, batch, capacity,
                                                          per_page, seed):  # fmt: skip
    """Over P = 1..4, graph-sized traces of a few dozen rows, 2..8 rows a page: every rank's
    hits with page mates are at least those of rows alone (Belady over rows alone, then free
    rows kept only when used sooner than the farthest held)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, n, (2, steps, world, batch))
    ids[0, 0, 0, 0] = n - 1  # every row id exists
    with_pages = _hits(ids, capacity, 64 // per_page, True)
    rows_alone = _hits(ids, capacity, 64 // per_page, False)
    assert all(a >= b for a, b in zip(with_pages, rows_alone, strict=True))
    assert _hits_alone(ids, capacity, 64 // per_page, True) == with_pages  # as the Loader plans


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_page_mates_add_hits_where_a_ranks_misses_share_pages(world):
    """Each rank reads row 8k at a step and row 8k + 1 (the same 64 B page: 8 rows of 8 B) at
    the next: rows alone cannot hit it, page mates keep it from the page read. At every P."""
    steps = 6
    ids = np.zeros((2, steps, world, 1), np.int64)
    for r in range(world):
        for t in range(steps):
            ids[:, t, r, 0] = 8 * (r * steps + t // 2 * 2) + t % 2
    ids[0, 0, 0, 0] = 8 * world * steps - 1
    ids[1, 0, 0, 0] = 8 * world * steps - 1
    with_pages, rows_alone = _hits(ids, 4, 8, True), _hits(ids, 4, 8, False)
    assert all(a > b for a, b in zip(with_pages, rows_alone, strict=True)), (with_pages, rows_alone)
    # The same hits when each rank plans alone (the Loader's way: its page layout, its keys).
    assert _hits_alone(ids, 4, 8, True) == with_pages
    assert _hits_alone(ids, 4, 8, False) == rows_alone


def test_the_buffer_full_of_next_step_hits_is_why_page_mates_add_none():
    """The P=2 case of issue 34 in small: when a rank's next step reuses more rows than its
    buffer holds, rows alone hit C rows every step (the bound: hits are held rows); page mates
    change which rows are held, never how many hit."""
    rng = np.random.default_rng(1)
    world, steps, b, cap = 2, 8, 40, 10
    ids = rng.integers(0, 64, (2, steps, world, b))  # 40 draws of 64 rows: ~30 reused
    rows_alone, with_pages = _hits(ids, cap, 8, False), _hits(ids, cap, 8, True)
    bound = cap * (2 * steps - 1)
    assert rows_alone == [bound] * world and with_pages == rows_alone


@pytest.mark.skipif(not aio.available(), reason="the kernel refuses native AIO here")
def test_aio_reads_spans_exactly_with_many_in_flight(tmp_path):
    """Spans of whole pages read with O_DIRECT, up to 64 in flight, land where asked and
    equal the file's bytes; past the end a span reads short (0 bytes), not wrong bytes."""
    data = np.random.default_rng(0).integers(0, 256, 256 * PAGE, np.uint8)
    path = tmp_path / "f.bin"
    path.write_bytes(data.tobytes())
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        pytest.skip("no O_DIRECT on this file system")
    ctx = aio.context()
    assert ctx is not None
    try:
        rng = np.random.default_rng(1)
        pages = rng.integers(0, 256, 500)
        size = rng.integers(1, 4, 500) * PAGE
        at = np.concatenate([[0], np.cumsum(size)[:-1]])
        buf = aligned(int(size.sum()))
        got = np.empty(500, np.int64)
        assert aio.read_spans(ctx.handle, fd, buf, at, pages * PAGE, size, got, 64) == 0
        want = np.minimum(size, (256 - pages) * PAGE)
        np.testing.assert_array_equal(got, want)
        for j in range(500):
            lo = pages[j] * PAGE
            assert buf[at[j] : at[j] + want[j]].tobytes() == data[lo : lo + want[j]].tobytes()
        past = np.array([300 * PAGE])
        one = np.zeros(1, np.int64)
        assert aio.read_spans(ctx.handle, fd, buf, np.zeros(1, np.int64), past,
                              np.array([PAGE]), one, 8) == 0  # fmt: skip
        assert one[0] == 0
    finally:
        ctx.close()
        os.close(fd)


def test_gather_reads_the_same_rows_with_and_without_aio(tmp_path, monkeypatch):
    """A PageGather under O_DIRECT serves the same rows through native AIO as through preadv
    (the fallback where the kernel refuses AIO: SOLAR_NO_AIO stands in for it)."""
    import h5py

    from solar.config import ReaderConfig
    from solar.io.hdf5 import describe
    from solar.io.reader import Reader

    rows = np.random.default_rng(2).standard_normal((3000, 24)).astype(np.float32)  # 96 B
    path = tmp_path / "g.h5"
    with h5py.File(path, "w") as f:
        f["x"] = rows
    info = describe([str(path)], ["x"])
    want = np.random.default_rng(3).choice(3000, 700, replace=False)
    got, calls, can = {}, {False: 0, True: 0}, aio.available()
    spans = aio.read_spans

    def counted(*args):
        calls["SOLAR_NO_AIO" in os.environ] += 1
        return spans(*args)

    monkeypatch.setattr(aio, "read_spans", counted)
    for off in (False, True):
        if off:
            monkeypatch.setenv("SOLAR_NO_AIO", "1")
        out = np.zeros((700, 24), np.float32)
        reader = Reader(info, ReaderConfig(threads=3, direct_io=True))  # new threads and contexts
        try:
            assert reader.read(want, [out]) > 0
        finally:
            reader.close()
        got[off] = out
    np.testing.assert_array_equal(got[False], rows[want])
    np.testing.assert_array_equal(got[True], rows[want])
    # The first read went through AIO where the kernel takes it, the second never did.
    assert calls[True] == 0 and (calls[False] > 0) == can, calls


def test_probe_measures_every_depth_and_refuses_what_it_cannot_read(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(64 * PAGE))
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
    except OSError:
        pytest.skip("no O_DIRECT on this file system")
    r = probe(path, depths=(1, 8), seconds=0.02)
    assert set(r.random) == {1, 8} and all(v > 0 for v in r.random.values())
    assert r.sequential > 0 and r.rate(32) == r.random[8] and r.span_bytes == 64 * PAGE
    assert "queue depth 1/8" in r.describe()
    with pytest.raises(SolarError, match="cannot probe"):
        probe(tmp_path / "missing")
    (tmp_path / "tiny").write_bytes(b"x")
    with pytest.raises(SolarError, match="nothing to probe"):
        probe(tmp_path / "tiny")


def _community_graph(n=4000, comms=80, deg=12, seed=0):
    rng = np.random.default_rng(seed)
    comm = rng.integers(0, comms, n)
    members = np.argsort(comm, kind="stable")
    start = np.searchsorted(comm[members], np.arange(comms + 1))
    src = rng.integers(0, n, n * deg // 2)
    c = comm[src]
    dst = members[start[c] + (rng.random(src.size) * (start[c + 1] - start[c])).astype(np.int64)]
    a, b = np.concatenate([src, dst]), np.concatenate([dst, src])
    o = np.lexsort((b, a))
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(a, minlength=n), out=indptr[1:])
    return indptr, b[o]


def _relabel(tmp_path, indptr, indices, order):
    """The CSR graph renumbered by ``order`` as the converter writes it (``write_graph``'s
    ``order``: new id i is old node ``order[i]``)."""
    path = tmp_path / "relabelled.h5"
    with warnings.catch_warnings():  # (no labels, no training split: warned, and beside the point)
        warnings.simplefilter("ignore")
        write_graph({"indptr": indptr, "indices": indices}, path, order=order, force=True)
    g = Graph(path)
    return np.asarray(g.indptr), np.asarray(g.indices)


def test_reorder_gives_a_permutation_and_relabel_keeps_every_edge(tmp_path):
    indptr, indices = _community_graph()
    n = indptr.size - 1
    deg = np.diff(indptr)
    for method in ("hybrid", "bfs", "degree", "none"):
        order = reorder_nodes(indptr, indices, method=method)
        assert np.array_equal(np.sort(order), np.arange(n))
        ptr, ind = _relabel(tmp_path, indptr, indices, order)
        new = np.empty(n, np.int64)
        new[order] = np.arange(n)
        for v in (0, 17, n - 1):  # old node v is new node new[v], same neighbours renamed
            np.testing.assert_array_equal(ind[ptr[new[v]] : ptr[new[v] + 1]],
                                          new[indices[indptr[v] : indptr[v + 1]]])  # fmt: skip
    assert np.all(np.diff(deg[reorder_nodes(indptr, indices, method="degree")]) <= 0)
    with pytest.raises(SolarError, match="method must be one of"):
        reorder_nodes(indptr, indices, method="metis")
    with pytest.raises(SolarError, match="indices must be node ids"):
        reorder_nodes(indptr, indices + n)
    with pytest.raises(SolarError, match="permutation"):
        _relabel(tmp_path, indptr, indices, np.zeros(n, np.int64))


def test_breadth_first_order_packs_a_communitys_rows_into_pages(tmp_path):
    """On a graph of communities numbered at random, 2-hop neighbourhoods read more rows per
    page after the breadth-first renumbering."""
    indptr, indices = _community_graph()
    n = indptr.size - 1
    rng = np.random.default_rng(4)

    def hoods(ptr, ind, seeds):
        out = []
        for s in seeds:
            one = ind[ptr[s] : ptr[s + 1]]
            two = np.concatenate([ind[ptr[u] : ptr[u + 1]] for u in one] + [one, [s]])
            out.append(two)
        return out

    seeds = rng.integers(0, n, 200)
    before = rows_per_page(hoods(indptr, indices, seeds), 256)
    order = reorder_nodes(indptr, indices, method="bfs")
    ptr, ind = _relabel(tmp_path, indptr, indices, order)
    new = np.empty(n, np.int64)
    new[order] = np.arange(n)
    after = rows_per_page(hoods(ptr, ind, new[seeds]), 256)
    assert after > 1.5 * before, (before, after)

"""Page mates (solar.schedule.draw.pagemates): rows sharing a page with a step's reads, kept
free."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from helpers import EveryRanksTrace, every_batch, paged_graph, resumed_batches
from hypothesis import given, settings
from hypothesis import strategies as st

from solar import BufferConfig, Loader, NeighborSampler, PlanSpec, RunConfig, make_plan
from solar.errors import CorruptPlanError, SolarError
from solar.options import ExpertConfig, MemoryConfig, PlanningConfig
from solar.schedule import HIT
from solar.schedule.draw.keyspace import Numbering
from solar.schedule.draw.pagemates import (
    NEXT,
    OFFERED,
    SEEN,
    LaterUses,
    PageLayout,
    mates_of,
)
from solar.schedule.draw.traces import TraceOrder
from solar.schedule.keep.planner import Planner, RankEpoch
from solar.schedule.plans.validate import TraceValidator
from solar.schedule.policy import ADMIT, NEVER, SIDE


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    return paged_graph(tmp_path_factory.mktemp("pagemates"))


def _spec(path, layout, world=2, epochs=3, capacity=120, pages=True) -> PlanSpec:
    sampler = NeighborSampler(path, (4, 2), batch_size=24)
    n = sampler.graph.num_nodes
    run = RunConfig(n, world, 24, epochs, 1, False, sampler.draws(n, world * 24))
    return PlanSpec(run, BufferConfig(capacity, 0.25), sampler=sampler,
                    pages=layout if pages else None)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(offset=st.integers(0, 9000), row=st.integers(1, 3000), page=st.sampled_from([512, 4096]),
       n=st.integers(1, 50), p=st.integers(0, 40))  # fmt: skip
def test_mates_of_a_page_are_the_rows_wholly_inside_it(offset, row, page, n, p):
    lo, hi = mates_of(p, offset, row, page, n)
    starts = offset + np.arange(n) * row
    inside = np.flatnonzero((starts >= p * page) & (starts + row <= (p + 1) * page))
    assert list(range(lo, hi)) == inside.tolist()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(0, 6), max_size=12), min_size=1, max_size=3),
       st.integers(0, 6), st.integers(0, 40))  # fmt: skip
def test_later_uses_give_a_keys_first_use_at_or_after_a_position(epochs, v, w):
    """The table starts at each key's first use in the window; moved forward past the
    positions before ``w`` as the planner moves it (an access's key gets its next use), it
    gives key v's first use at or after ``w``, as a global position, or none."""
    keys = np.arange(10, 17, dtype=np.int64)  # keys 10..16: local keys 0..6
    local = [np.array(e, np.int64) for e in epochs]
    starts = [(5 + e) << 40 for e in range(len(local))]
    uses = LaterUses.at(5, Numbering(keys, local, 0, False), local[0], starts,
                        (5 + len(local)) << 40)  # fmt: skip
    window = np.concatenate(local)
    firsts = np.concatenate([[0], np.cumsum([p.size for p in local])])

    def position(i):  # window index -> global position
        e = int(np.searchsorted(firsts, i, side="right") - 1)
        return ((5 + e) << 40) + i - int(firsts[e])

    assert uses.end == 5 + len(local) and uses.limit == (5 + len(local)) << 40
    assert uses.local is local[0] and uses.keys is keys and uses.table.shape == (7, 3)
    for i in range(min(w, window.size)):  # passed: its next use in the window, or beyond it
        later = [j for j in range(i + 1, window.size) if window[j] == window[i]]
        uses.table[window[i], NEXT] = position(later[0]) if later else NEVER
    at = [i for i in range(window.size) if window[i] == v and i >= w]
    assert np.all(uses.table[:, [SEEN, OFFERED]] == -1)
    got = int(uses.table[v, NEXT])
    if not at:
        assert got == -1 or got >= uses.limit
    else:
        assert got == position(at[0])


def test_a_rank_planning_alone_refuses_another_ranks_keys():
    """Its window's keys are numbered once (keyspace.py), every table indexed by them: a key
    outside the rank's own (rank·N .. rank·N + N - 1), here rank 0's given to rank 1, is
    refused before the page mates' next uses are built over it."""
    run = RunConfig(64, 2, 8, 1, 0, False, 64)
    order = TraceOrder(run, EveryRanksTrace(np.arange(64).reshape(1, 4, 2, 8)), only_rank=1)
    with pytest.raises(SolarError, match=r"epoch 0 gives batches of ranks other than 1"):
        order.later_uses(0)


def _parts(spec: PlanSpec, rank: int) -> list[RankEpoch]:
    planner = Planner(spec, only_rank=rank)
    return [planner.next_rank(rank) for _ in range(spec.run.epochs)]


@pytest.mark.parametrize("world", [1, 2, 3])
def test_side_rows_share_a_page_read_by_their_rank_in_their_step(graph, world):
    """Every side row lies wholly inside a page holding a row the rank reads (not hits) in the
    same step, is not one of the step's accesses, and follows them; the accesses served are
    exactly the plan without pages; hits only grow."""
    path, layout, _ = graph
    with_pages, without = _spec(path, layout, world), _spec(path, layout, world, pages=False)
    sides = 0
    for r in range(world):
        for part, plain in zip(_parts(with_pages, r), _parts(without, r), strict=True):
            off = part.step_offsets
            for t in range(off.size - 1):
                f, x = part.flags[off[t] : off[t + 1]], part.sample[off[t] : off[t + 1]]
                side = (f & SIDE) != 0
                served = int(np.argmax(side)) if side.any() else side.size
                assert not side[:served].any() and side[served:].all()  # sides follow the batch
                assert np.all(f[side] == SIDE | ADMIT)
                batch = x[:served]
                p0, p1 = plain.step_offsets[t], plain.step_offsets[t + 1]
                assert np.array_equal(np.sort(batch), np.sort(plain.sample[p0:p1]))
                read = batch[(f[:served] & HIT) == 0].astype(np.int64)
                read = layout.offset + read * layout.row_bytes
                pages = set((read // layout.page).tolist())  # a row's first and last pages
                pages |= set(((read + layout.row_bytes - 1) // layout.page).tolist())
                for y in x[side].tolist():
                    start = layout.offset + y * layout.row_bytes
                    assert start // layout.page in pages
                    assert (start + layout.row_bytes - 1) // layout.page == start // layout.page
                    assert y not in set(batch.tolist())
                sides += int(side.sum())
    assert sides > 0
    a, b = make_plan(with_pages), make_plan(without)
    assert a.accesses == b.accesses and a.hits > b.hits
    assert make_plan(with_pages).hits == a.hits  # identical inputs, identical plans


def test_a_plan_with_side_rows_is_proven_by_replay_from_its_file(graph, tmp_path):
    path, layout, _ = graph
    spec = _spec(path, layout, world=2)
    plan = make_plan(spec)
    plan.save(tmp_path / "p.h5")
    from solar.schedule import load_plan

    loaded = load_plan(tmp_path / "p.h5", sampler=spec.sampler)
    assert loaded.spec.pages == layout
    for r in range(2):
        loaded.validate(r)
        mine = plan.rank(r)
        got = loaded.rank(r)
        np.testing.assert_array_equal(got.flags, mine.flags)
        _, samples, _ = loaded.trace(r)
        assert samples.size == int(np.count_nonzero((mine.flags & SIDE) == 0))


def _checked(spec: PlanSpec, part: RankEpoch, tier: int = 0) -> None:
    TraceValidator(spec, spec.buffer.capacity, 0, key=7, tier_slots=tier).check(part)


def test_the_validator_refuses_side_rows_out_of_place(graph):
    path, layout, _ = graph
    spec = _spec(path, layout, world=1, epochs=2)
    part = _parts(spec, 0)[0]
    _checked(spec, part)  # as planned: fine
    side = np.flatnonzero(part.flags & SIDE)
    assert side.size
    t = int(np.searchsorted(part.step_offsets, side[0], side="right") - 1)
    a = int(part.step_offsets[t])
    swapped = part.flags.copy()
    swapped[a], swapped[side[0]] = swapped[side[0]], swapped[a]  # a side row before the batch
    moved = RankEpoch(0, part.sample, part.slot, swapped, part.step_offsets, part.tslot)
    with pytest.raises(CorruptPlanError, match="rank 0, step"):
        _checked(spec, moved)
    served = part.flags.copy()
    served[side[0]] = ADMIT  # a side row turned into a served access: not the sampler's batch
    with pytest.raises(CorruptPlanError, match="not the sampler's batch"):
        _checked(spec, RankEpoch(0, part.sample, part.slot, served, part.step_offsets,
                                 part.tslot))  # fmt: skip
    lone = part.flags.copy()
    lone[side[0]] = SIDE  # stored nowhere
    with pytest.raises(CorruptPlanError, match="invalid flags"):
        _checked(spec, RankEpoch(0, part.sample, part.slot, lone, part.step_offsets, part.tslot))


def test_page_mates_are_refused_where_they_cannot_be_planned(graph):
    path, layout, _ = graph
    spec = _spec(path, layout)
    with pytest.raises(SolarError, match="pages"):
        PlanSpec(spec.run, BufferConfig(10, 0.25, 5), sampler=spec.sampler, pages=layout)
    with pytest.raises(SolarError, match="pages"):
        PlanSpec(spec.run, spec.buffer, "lru", sampler=spec.sampler, pages=layout)
    with pytest.raises(SolarError, match="pages"):
        PageLayout(-1, 8)
    assert not PageLayout.worth_it(2049) and PageLayout.worth_it(2048)


@pytest.mark.parametrize("world", [1, 2])
def test_the_loader_reads_side_rows_serves_exact_rows_and_resumes(graph, world):
    """With page mates the Loader's batches are h5py's rows and nothing else; its hits are the
    plan's; a resume mid-epoch serves the same rows."""
    path, _, feats = graph
    for rank in range(world):

        def make(rank: int = rank) -> Loader:
            sampler = NeighborSampler(path, (4, 2), batch_size=24)
            return Loader(path, ["features"], sampler=sampler, epochs=3, buffer=120, rank=rank,
                          world_size=world)  # fmt: skip

        with make() as ld:
            assert ld.spec.pages is not None
            whole = every_batch(ld, range(3))
            sides = int(np.count_nonzero(ld.plan.rank(rank).flags & SIDE))
            assert sides > 0 and sum(s.side_reads for s in ld.stats.epochs.values()) == sides
            planned = ld.plan.stats[rank]
            assert sum(s.hits for s in ld.stats.epochs.values()) == planned.hits > 0
        for b in whole:
            n_id = b["n_id"].numpy()
            assert b["x"].shape[0] == n_id.size
            assert b["x"].numpy().tobytes() == feats[n_id].tobytes()
        spe = len(whole) // 3
        rest = resumed_batches(make, 1, spe // 2, [1, 2])
        for got, want in zip(rest, whole[spe + spe // 2 :], strict=True):
            assert got["x"].numpy().tobytes() == want["x"].numpy().tobytes()


def test_the_first_steps_reads_start_before_its_plan_is_made(graph, monkeypatch):
    """The run's first step reads every row whatever the plan keeps (the buffer is empty): its
    reads start while the first epoch is still being planned, and its batch is still exact."""
    import threading
    import time

    from solar.schedule.plans.stream import RankStream

    path, _, feats = graph
    gate = threading.Event()
    plan_next = RankStream._next_epoch

    def held(self, planner):
        gate.wait(120)  # the planner waits until the test has seen the reads start
        return plan_next(self, planner)

    monkeypatch.setattr(RankStream, "_next_epoch", held)
    sampler = NeighborSampler(path, (4, 2), batch_size=24)
    with Loader(
        path, ["features"], sampler=sampler, epochs=2, buffer=120, expert=ExpertConfig(warm=False)
    ) as ld:
        submitted: list[int] = []
        submit = ld.reader.submit

        def recorded(samples, *args, **kw):
            submitted.append(len(samples))
            return submit(samples, *args, **kw)

        ld.reader.submit = recorded  # type: ignore[method-assign]
        got: list[dict] = []
        first = threading.Thread(target=lambda: got.append(next(iter(ld))))
        first.start()
        # Hang guards only: the reads start at once, whatever the speed (the planner is held
        # until they do, and longer than this loop waits for them).
        deadline = time.monotonic() + 60
        while not submitted and time.monotonic() < deadline:
            time.sleep(0.01)
        planned = ld._stream.planned_end
        gate.set()
        first.join(120)
        assert submitted and planned == 0  # read before the plan existed
        assert submitted[0] == sampler.batch(ld.run, 0, 0, 0).size
        n_id = got[0]["n_id"].numpy()
        assert got[0]["x"].numpy().tobytes() == feats[n_id].tobytes()


def test_the_validator_refuses_side_rows_a_spec_does_not_plan_or_too_many(graph):
    path, layout, _ = graph
    spec = _spec(path, layout, world=1, epochs=2)
    part = _parts(spec, 0)[0]
    rows_only = _spec(path, layout, world=1, epochs=2, pages=False)
    with pytest.raises(CorruptPlanError, match="invalid flags"):
        _checked(rows_only, part)  # side rows in a plan of rows alone
    off = part.step_offsets
    t = int(np.argmax(np.diff(off)))
    flags = part.flags.copy()
    a, b = int(off[t]), int(off[t + 1])
    batch = np.flatnonzero((flags[a:b] & SIDE) == 0) + a
    flags[batch[: batch.size // 2 + 1]] = SIDE | ADMIT  # more side rows than served ones
    with pytest.raises(CorruptPlanError, match="more side rows than the batch"):
        _checked(spec, RankEpoch(0, part.sample, part.slot, flags, off, part.tslot))


def test_a_plan_with_page_mates_is_refused_where_they_do_not_apply(graph, tmp_path):
    """A plan's page mates must be those of this loader's rows, and rows it keeps raw."""
    from solar import Transform

    path, layout, _ = graph
    sampler = NeighborSampler(path, (4, 2), batch_size=24)
    kw = dict(sampler=sampler, epochs=3, buffer=120, rank=0, world_size=2,
              expert=ExpertConfig(warm=False))  # fmt: skip
    with Loader(path, ["features"], **kw) as ld:
        made = ld.plan
    assert made.spec.pages == layout
    with pytest.raises(SolarError, match="page mates"):
        Loader(path, ["features"], transform=Transform(lambda x, rng: x, deterministic=True), **kw,
               planning=PlanningConfig(plan=made))  # fmt: skip
    with Loader(path, ["features"], **kw, planning=PlanningConfig(plan=made),
                memory=MemoryConfig(page_mates=False)) as ld:  # fmt: skip
        assert ld.spec.pages == layout  # the plan's choice, for this data
    with Loader(path, ["features"], **kw, memory=MemoryConfig(page_mates=False)) as ld:
        assert ld.spec.pages is None
    moved = PlanSpec(made.spec.run, made.spec.buffer, sampler=sampler, dataset=made.spec.dataset,
                     sample_bytes=made.spec.sample_bytes,
                     pages=PageLayout(layout.offset + 8, layout.row_bytes))  # fmt: skip
    with pytest.raises(SolarError, match="page mates of rows at"):
        Loader(path, ["features"], **kw, planning=PlanningConfig(plan=make_plan(moved)))


def test_side_rows_follow_a_trace_batch_with_repeats_byte_for_byte(tmp_path):
    """A Trace's batch may repeat an id (read once, copied): side rows still land after the
    whole batch, and every row served is h5py's."""
    from solar import Trace

    rng = np.random.default_rng(3)
    x = rng.standard_normal((600, 24)).astype(np.float32)  # 96 B rows
    path = tmp_path / "d.h5"
    with h5py.File(path, "w") as f:
        f["x"] = x
    ids = rng.integers(0, 600, (3, 10, 2, 16))  # (epochs, steps, ranks, B)
    ids[..., 1] = ids[..., 0]  # a repeat in every batch
    for rank in range(2):
        with Loader(path, ["x"], sampler=Trace(ids), batch_size=16, epochs=3, buffer=60, rank=rank,
                    world_size=2) as ld:  # fmt: skip
            assert ld.spec.pages is not None
            got = every_batch(ld, range(3))
            assert np.any(ld.plan.rank(rank).flags & SIDE)
        assert len(got) == 30
        for k, b in enumerate(got):
            want = ids[k // 10, k % 10, rank]
            np.testing.assert_array_equal(b["index"].numpy(), want)
            assert b["x"].numpy().tobytes() == x[want].tobytes()


def test_page_mates_under_a_transform_serve_transformed_rows_and_keep_raw_ones(graph):
    """Side rows are stored raw, as the buffer holds rows; the transform sees batch rows only,
    whose memory has no room for side rows."""
    from solar import Transform

    path, _, feats = graph
    sampler = NeighborSampler(path, (4, 2), batch_size=24)
    twice = Transform(lambda s, rng: {"features": s["features"] * 2}, workers=2)
    with Loader(path, ["features"], sampler=sampler, epochs=2, buffer=120,
                transform=twice) as ld:  # fmt: skip
        assert ld.spec.pages is not None
        got = every_batch(ld, range(2))
        assert sum(s.side_reads for s in ld.stats.epochs.values()) > 0
        out = ld._pipeline.get().memory.out
        out_rows = out.rows if out is not None else 0
    assert out_rows == max(b["n_id"].numel() for b in got)  # the largest batch: no side rows
    for b in got:
        n_id = b["n_id"].numpy()
        np.testing.assert_array_equal(b["x"].numpy(), feats[n_id] * 2)  # x: the key's rows


def test_a_loader_failing_in_its_warm_up_leaves_no_planning_thread(graph, monkeypatch):
    import threading

    import solar.loader

    def broken(*args, **kw):
        raise RuntimeError("rehearsal failed")

    monkeypatch.setattr(solar.loader, "rehearse_loader", broken)
    path, _, _ = graph
    sampler = NeighborSampler(path, (4, 2), batch_size=24)
    with pytest.raises(RuntimeError, match="rehearsal failed"):
        Loader(path, ["features"], sampler=sampler, epochs=2, buffer=120)
    assert not [t for t in threading.enumerate() if t.name.startswith("solar-plan")]

"""Samplers (solar.schedule.draw.samplers) and the planner and runtime of their traces."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import write_h5
from hypothesis import given, settings
from hypothesis import strategies as st

from solar import (
    BufferConfig,
    CorruptPlanError,
    Loader,
    MemoryConfig,
    PlanSpec,
    RunConfig,
    SolarError,
    Trace,
    Weighted,
    load_plan,
    make_plan,
)
from solar.schedule import HIT
from solar.schedule.draw.rng import uniform
from solar.schedule.draw.samplers import SHUFFLE, _alias_table, sampler_run
from solar.schedule.draw.traces import EPOCH_SHIFT, NEVER, TraceOrder
from solar.schedule.plans.plan import plan_to_file
from solar.schedule.policy import THIT

# -- the samplers -----------------------------------------------------------------------------


def test_uniform_stream_is_a_pure_function_of_position():
    u = uniform(np.uint64(7), np.arange(100_000))
    assert 0 <= u.min() and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.005
    np.testing.assert_array_equal(uniform(np.uint64(7), np.arange(500, 600)), u[500:600])
    assert not np.array_equal(uniform(np.uint64(8), np.arange(100)), u[:100])


def test_weighted_draws_follow_the_weights():
    # Chi-square of 400k draws over 12 ids against their probabilities: far below the 1e-6
    # quantile (~ 45 for 11 degrees of freedom) for a correct sampler, far above for a wrong one.
    w = np.array([0, 1, 2, 3, 0.5, 9, 0, 4, 4, 1e-3, 7, 1.5])
    s = Weighted(w, num_samples=400_000)
    run = RunConfig(12, 1, 1000, 1, seed=3, draws=400_000)
    ids = s.epoch(run, 0).ids
    counts = np.bincount(ids, minlength=w.size)
    expected = w / w.sum() * ids.size
    assert np.all(counts[w == 0] == 0)
    nz = w > 0
    chi2 = float(np.sum((counts[nz] - expected[nz]) ** 2 / expected[nz]))
    assert chi2 < 45, (chi2, counts, expected)


def test_alias_table_reproduces_the_weights_exactly():
    w = np.random.default_rng(1).random(50) ** 3
    prob, alias = _alias_table(w / w.sum() * w.size)
    mass = prob.copy()
    np.add.at(mass, alias, 1 - prob)
    np.testing.assert_allclose(mass / w.size, w / w.sum(), atol=1e-12)


def test_weighted_steps_are_recomputable_alone():
    w = np.arange(1, 101, dtype=float)
    run = RunConfig(100, 3, 7, 2, seed=5)  # 15 steps, the last one short
    for s in (Weighted(w), Weighted(w, replacement=False)):
        d = s.epoch(run, 1)
        for t in range(run.steps_per_epoch):
            for r in range(3):
                got = s.batch(run, 1, t, r)
                np.testing.assert_array_equal(
                    got, d.ids[d.offsets[t * 3 + r] : d.offsets[t * 3 + r + 1]]
                )
        assert not np.array_equal(s.epoch(run, 0).ids, d.ids)
    d = Weighted(w, replacement=False).epoch(run, 0)
    assert np.unique(d.ids).size == d.ids.size == 100  # without replacement: each id once


@pytest.mark.parametrize(
    "weights, match",
    [
        (np.array([1.0, np.nan]), "not finite"),
        (np.array([1.0, -1.0]), "negative"),
        (np.zeros(3), "all zero"),
        (np.ones((2, 2)), "1-D"),
    ],
)
def test_bad_weights_are_refused(weights, match):
    with pytest.raises(SolarError, match=match):
        Weighted(weights)


def test_weights_must_match_the_dataset(tmp_path):
    path = write_h5(tmp_path / "a.h5", x=np.zeros((10, 2), np.float32))
    with pytest.raises(SolarError, match="3 weights for a dataset of 10"):
        Loader(path, batch_size=2, epochs=1, buffer=2, sampler=Weighted(np.ones(3)))
    np.save(tmp_path / "w.npy", np.array([1.0, np.inf]))
    with pytest.raises(SolarError, match=r"weights .*w\.npy.*not finite"):
        Weighted(tmp_path / "w.npy")


def test_trace_array_rows_and_padding():
    a = np.full((1, 2, 1, 3), -1)
    a[0, 0, 0] = [4, 4, 1]
    a[0, 1, 0, :1] = [2]
    s = Trace(a)
    run = RunConfig(5, 1, 3, 1, draws=6)
    np.testing.assert_array_equal(s.batch(run, 0, 0, 0), [4, 4, 1])
    np.testing.assert_array_equal(s.batch(run, 0, 1, 0), [2])
    a[0, 1, 0] = [2, -1, 3]
    with pytest.raises(SolarError, match="pads only the end"):
        Trace(a).batch(run, 0, 1, 0)
    with pytest.raises(SolarError, match=r"outside 0\.\.4"):
        Trace(lambda e, t, r: [9]).batch(run, 0, 0, 0)


def test_sampler_run_is_the_run_a_loader_makes():
    """One path from a sampler to its run: draws other than the samples are recorded, the
    dataset and the run refused first (but for a rehearsal's unchecked run)."""
    assert sampler_run(SHUFFLE, 10, 2, 3, 1).draws is None
    assert sampler_run(Weighted(np.ones(10), 4), 10, 2, 3, 1) == RunConfig(10, 2, 3, 1, draws=4)
    with pytest.raises(SolarError, match="3 weights for a dataset of 10"):
        sampler_run(Weighted(np.ones(3)), 10, 1, 2, 1)
    trace = Trace(np.zeros((1, 2, 1, 3), np.int64))
    assert sampler_run(trace, 5, 1, 3, 1, 7) == RunConfig(5, 1, 3, 1, 7, draws=6)
    with pytest.raises(SolarError, match=r"is not \(epochs 2, steps 2, ranks 1, B\)"):
        sampler_run(trace, 5, 1, 3, 2)
    assert sampler_run(trace, 5, 1, 3, 2, check=False) == RunConfig(5, 1, 3, 2, draws=6)


# -- the planner ------------------------------------------------------------------------------


def _weighted_spec(
    n, world, batch, epochs, capacity, seed, tier=0, policy="solar", horizon=None, affinity=True
):
    w = (1.0 + np.arange(n)) ** -1.0
    return PlanSpec(
        RunConfig(n, world, batch, epochs, seed), BufferConfig(capacity, 0.25, tier), policy,
        sampler=Weighted(w, affinity=affinity), horizon=horizon,
    )  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(3, 30), world=st.integers(1, 3), epochs=st.integers(1, 6),
    horizon=st.integers(0, 3), seed=st.integers(0, 100),
)  # fmt: skip
def test_next_uses_are_the_first_later_use_within_the_horizon(n, world, epochs, horizon, seed):
    """Every epoch's next uses, asked in order as a planner does (windows that reach the run's
    end and windows that do not), against a brute force over the whole run's trace."""
    run = RunConfig(n, world, 2, epochs, seed)
    order = TraceOrder(run, Weighted((1.0 + np.arange(n)) ** -1.0), horizon)
    ref = TraceOrder(run, order.sampler, horizon)  # (the trace alone: asked no next use)
    pairs = [ref.epoch(e).pair for e in range(epochs)]
    for k in range(epochs):
        pair, nu = order.with_next_use(k)
        np.testing.assert_array_equal(pair, pairs[k])
        want = np.full(pair.size, NEVER, np.int64)
        for i, x in enumerate(pair.tolist()):
            for e in range(k, min(epochs, k + order.horizon + 1)):
                start = i + 1 if e == k else 0  # (after the access itself, in its own epoch)
                at = np.flatnonzero(pairs[e][start:] == x)
                if at.size:
                    want[i] = (e << EPOCH_SHIFT) + start + int(at[0])
                    break
        np.testing.assert_array_equal(nu, want, err_msg=f"epoch {k}")


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(3, 40), world=st.integers(1, 3), batch=st.integers(1, 4),
    epochs=st.integers(1, 4), capacity=st.integers(0, 6), tier=st.integers(0, 4),
    seed=st.integers(0, 100), affinity=st.booleans(),
)  # fmt: skip
def test_trace_plans_serve_the_samplers_batches_and_hit_only_what_is_held(
    n, world, batch, epochs, capacity, tier, seed, affinity
):
    if world * batch > n:
        return
    spec = _weighted_spec(n, world, batch, epochs, capacity, seed, tier, affinity=affinity)
    plan = make_plan(spec)
    run, spe = spec.run, spec.run.steps_per_epoch
    served: list[list[np.ndarray]] = [[] for _ in range(run.num_steps)]
    for r in range(world):
        rp = plan.rank(r)
        held = np.full(rp.cells, -1)
        for k in range(run.num_steps):
            step = rp.step(k)
            served[k].append(step.samples)
            if not affinity:  # each rank's batch is the sampler's share
                want = spec.sampler.batch(run, k // spe, k % spe, r)
                np.testing.assert_array_equal(np.sort(step.samples), np.unique(want))
            np.testing.assert_array_equal(held[step.hit_slots], step.samples[step.hit_rows])
            np.testing.assert_array_equal(
                held[rp.slots + step.tier_slots], step.samples[step.tier_rows]
            )
            held = rp.contents_at(k + 1)
    for k in range(run.num_steps if affinity else 0):  # each distinct draw served once
        drawn = spec.sampler.global_batch(run, k // spe, k % spe)
        np.testing.assert_array_equal(np.sort(np.concatenate(served[k])), np.unique(drawn))
    # Identical inputs, identical plans.
    again = make_plan(
        _weighted_spec(n, world, batch, epochs, capacity, seed, tier, affinity=affinity)
    )
    for r in range(world):
        assert again.rank(r).flags.tobytes() == plan.rank(r).flags.tobytes()


def brute_force_steps(steps: list[list[int]], capacity: int) -> int:
    """Most hits any buffer of ``capacity`` gets when each step's distinct ids hit if held as
    the step starts (exhaustive over what is kept after each step)."""
    states = {frozenset(): 0}
    for ids in steps:
        nxt: dict[frozenset, int] = {}
        for state, hits in states.items():
            got = hits + sum(x in state for x in ids)
            pool = sorted(state | set(ids))
            from itertools import combinations

            for keep in combinations(pool, min(capacity, len(pool))):
                # Fewer than the capacity is never better: keeping more cannot lose hits.
                key = frozenset(keep)
                nxt[key] = max(nxt.get(key, -1), got)
        states = nxt
    return max(states.values())


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(2, 7), batch=st.integers(1, 3), epochs=st.integers(1, 4),
    capacity=st.integers(1, 3), seed=st.integers(0, 1000),
)  # fmt: skip
def test_one_rank_hits_equal_beladys_optimum(n, batch, epochs, capacity, seed):
    if batch > n:
        return
    spec = _weighted_spec(n, 1, batch, epochs, capacity, seed)
    plan = make_plan(spec)
    rp = plan.rank(0)
    steps = [rp.step(k).samples.tolist() for k in range(spec.run.num_steps)]
    assert plan.hits == brute_force_steps(steps, capacity)


def test_baselines_on_a_skewed_trace():
    spec = _weighted_spec(400, 2, 8, 4, 40, seed=1)
    hits = {p: make_plan(PlanSpec(spec.run, spec.buffer, p, sampler=spec.sampler)).hits
            for p in ("solar", "lru", "static")}  # fmt: skip
    assert hits["solar"] > hits["static"] > 0 and hits["solar"] > hits["lru"] > 0
    # static: never evicts, so every sample it admits is admitted once per rank.
    plan = make_plan(PlanSpec(spec.run, spec.buffer, "static", sampler=spec.sampler))
    for r in range(2):
        rp = plan.rank(r)
        admitted = rp.sample[(rp.flags & 2) != 0]
        assert np.unique(admitted).size == admitted.size


def test_a_short_horizon_loses_hits_a_long_one_keeps():
    full = make_plan(_weighted_spec(300, 1, 10, 6, 30, seed=2)).hits
    short = make_plan(_weighted_spec(300, 1, 10, 6, 30, seed=2, horizon=0)).hits
    assert 0 < short <= full


def test_a_plan_file_of_a_sampler_is_proven_against_it(tmp_path):
    spec = _weighted_spec(60, 2, 4, 3, 8, seed=4, tier=4)
    plan_to_file(spec, tmp_path / "p.h5")
    with pytest.raises(SolarError, match=r"weighted.*sampler"):
        load_plan(tmp_path / "p.h5").rank(0)
    plan = load_plan(tmp_path / "p.h5", sampler=spec.sampler)
    for r in range(2):
        np.testing.assert_array_equal(plan.rank(r).flags, make_plan(spec).rank(r).flags)
    other = Weighted(np.ones(60))
    with pytest.raises(SolarError, match=r"another dataset or run|not made for"):
        load_plan(tmp_path / "p.h5", sampler=other)


def test_an_edited_trace_plan_is_refused(tmp_path):
    import h5py

    spec = _weighted_spec(60, 1, 4, 2, 8, seed=4)
    plan_to_file(spec, tmp_path / "p.h5")
    with h5py.File(tmp_path / "p.h5", "r+") as f:
        flags = f["epochs/1/flags"][()]
        i = int(np.flatnonzero(flags == 0)[0])
        flags[i] = HIT  # a read turned into a hit of whatever slot 0 holds
        f["epochs/1/flags"][...] = flags
        f["epochs/1/slot"][i] = 0
    # The checksum catches the edit; with the checksum forged the replay would.
    with pytest.raises(CorruptPlanError):
        load_plan(tmp_path / "p.h5", sampler=spec.sampler).rank(0)


def test_shuffle_specs_keep_their_fingerprints():
    run, buf = RunConfig(100, 2, 8, 3), BufferConfig(10)
    assert PlanSpec(run, buf).fingerprint == PlanSpec(run, buf, sampler=SHUFFLE).fingerprint
    assert "sampler" not in PlanSpec(run, buf).as_dict()
    assert "draws" not in PlanSpec(run, buf).as_dict()


# -- the runtime ------------------------------------------------------------------------------


@pytest.fixture
def data(tmp_path):
    x = np.random.default_rng(0).random((53, 3, 4)).astype(np.float32)
    return write_h5(tmp_path / "a.h5", x=x, y=np.arange(53) * 10), x


def _epochs(loader, epochs):
    for e in range(epochs):
        loader.set_epoch(e)
        yield from loader


@pytest.mark.parametrize("world, tier, affinity", [(1, 0, True), (2, 0, True), (3, 6, True),
                                                    (2, 0, False), (3, 6, False)])  # fmt: skip
def test_weighted_batches_are_byte_exact(data, tmp_path, world, tier, affinity):
    path, x = data
    w = (1.0 + np.arange(53)) ** -1.2
    sampler = Weighted(w, affinity=affinity)
    batches: dict[int, list[np.ndarray]] = {}
    for r in range(world):
        memory = MemoryConfig(tier=tmp_path, tier_size=tier) if tier else None
        with Loader(path, batch_size=5, epochs=3, buffer=6, sampler=sampler, rank=r,
                    world_size=world, memory=memory) as loader:  # fmt: skip
            run = loader.run
            for k, b in enumerate(_epochs(loader, 3)):
                idx = b["index"].numpy()
                np.testing.assert_array_equal(b["x"].numpy(), x[idx])
                np.testing.assert_array_equal(b["y"].numpy(), idx * 10)
                batches.setdefault(k, []).append(idx)
                e, t = divmod(k, run.steps_per_epoch)
                if not affinity:
                    np.testing.assert_array_equal(idx, sampler.batch(run, e, t, r))
                assert loader.global_batch == sampler.global_batch(run, e, t).size
            assert loader.plan.hits > 0
    assert len(batches) == 3 * run.steps_per_epoch
    for k, parts in batches.items():  # every draw of every global batch delivered once
        drawn = sampler.global_batch(run, *divmod(k, run.steps_per_epoch))
        np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.sort(drawn))


def test_a_trace_with_repeats_and_varying_lengths(data):
    path, x = data

    def fn(epoch, step, rank):
        return np.array([(epoch * 7 + step) % 53, 5, 5, step % 53, 5][: 2 + step % 4])

    sampler = Trace(fn, steps=5)
    with Loader(path, batch_size=4, epochs=2, buffer=4, sampler=sampler) as loader:
        assert len(loader) == 5
        for k, b in enumerate(_epochs(loader, 2)):
            idx = b["index"].numpy()
            np.testing.assert_array_equal(idx, fn(*divmod(k, 5), 0))
            np.testing.assert_array_equal(b["x"].numpy(), x[idx])
            assert loader.global_batch == idx.size
        trace_steps, _, hit = loader.plan.trace(rank=0)
        assert np.all(np.diff(trace_steps) >= 0) and hit.any()


def test_a_trace_that_changes_its_mind_is_refused_when_served(data):
    path, _ = data
    calls = {"n": 0}

    def fickle(epoch, step, rank):
        calls["n"] += 1
        return np.array([calls["n"] % 53])

    with Loader(path, batch_size=1, epochs=1, buffer=2, sampler=Trace(fickle, steps=3)) as loader:
        with pytest.raises(SolarError, match="not the one planned"):
            list(loader)


def test_a_weighted_resume_replays_the_same_batches(data):
    path, _ = data
    w = np.linspace(1, 3, 53)
    with Loader(path, batch_size=4, epochs=2, buffer=5, sampler=Weighted(w)) as a:
        first = [b["index"].numpy().copy() for b in _epochs(a, 2)]
    with Loader(path, batch_size=4, epochs=2, buffer=5, sampler=Weighted(w)) as b:
        b.set_epoch(1)
        it = iter(b)
        next(it)
        state = b.state_dict()
    with Loader(path, batch_size=4, epochs=2, buffer=5, sampler=Weighted(w)) as c:
        c.load_state_dict(state)
        c.set_epoch(state["epoch"])
        rest = [x["index"].numpy().copy() for x in c]
    spe = len(first) // 2
    for got, want in zip(rest, first[spe + 1 :], strict=True):
        np.testing.assert_array_equal(got, want)


def test_thit_flag_is_used_with_a_tier():
    spec = _weighted_spec(200, 1, 8, 4, 5, seed=0, tier=20)
    rp = make_plan(spec).rank(0)
    assert np.any(rp.flags & THIT)


@settings(max_examples=30, deadline=None)
@given(
    world=st.integers(1, 3), tier=st.sampled_from([0, 5]), affinity=st.booleans(),
    horizon=st.sampled_from([None, 0, 1]), epoch=st.integers(1, 3), seed=st.integers(0, 50),
)  # fmt: skip
def test_a_restored_trace_planner_decides_as_the_run_that_saved_it(
    tmp_path_factory, world, tier, affinity, horizon, epoch, seed
):
    from solar.schedule.keep.planner import Planner
    from solar.schedule.plans import snapshot

    spec = _weighted_spec(90, world, 4, 4, 6, seed, tier, horizon=horizon, affinity=affinity)
    directory = tmp_path_factory.mktemp("snap")
    ref = Planner(spec)
    for _ in range(epoch):
        ref.next_all()
    assert snapshot.save(directory, ref) is not None
    restored = snapshot.load(directory, spec, epoch)
    assert restored is not None and restored.epoch == epoch
    for _ in range(epoch, spec.run.epochs):
        a, b = restored.next_all(), ref.next_all()
        for name in ("sample", "slot", "flags", "tslot", "rank_offsets", "step_offsets"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


def test_a_weighted_state_resumes_on_another_world_size(data):
    """Elastic resume: Weighted's global batches depend on P·B only."""
    path, _ = data
    w = np.linspace(1, 4, 53)
    with Loader(path, batch_size=4, epochs=2, buffer=5, sampler=Weighted(w), rank=0,
                world_size=2) as a:  # fmt: skip
        a.set_epoch(0)
        it = iter(a)
        next(it), next(it)
        state = a.state_dict()
    with Loader(path, batch_size=8, epochs=2, buffer=10, sampler=Weighted(w)) as b:
        b.load_state_dict(state)
        b.set_epoch(0)
        got = [x["index"].numpy() for x in b]
        for k, idx in enumerate(got, start=2):
            np.testing.assert_array_equal(
                np.sort(idx), np.sort(b.sampler.global_batch(b.run, 0, k))
            )
    fixed = Trace(np.zeros((2, 3, 2, 4), np.int64))
    with Loader(path, batch_size=4, epochs=2, buffer=5, sampler=fixed, rank=0, world_size=2) as c:
        state = c.state_dict()
    with Loader(path, batch_size=8, epochs=2, buffer=5,
                sampler=Trace(np.zeros((2, 3, 1, 8), np.int64))) as d:  # fmt: skip
        with pytest.raises(SolarError, match="another dataset or run"):
            d.load_state_dict(state)


def test_a_draw_moved_to_another_step_and_rank_is_refused():
    """With affinity the ranks' digests bind each draw to its step: moving a sample from one
    step (on one rank) to another step (on the other rank) keeps each epoch's multiset but not
    the global batches, and coverage fails."""
    from solar.schedule.keep.planner import RankEpoch
    from solar.schedule.plans.validate import TraceValidator, coverage_error

    spec = PlanSpec(RunConfig(40, 2, 4, 1, 3), BufferConfig(0), "solar",
                    sampler=Weighted((1.0 + np.arange(40)) ** -1.0))  # fmt: skip
    ep, spe = make_plan(spec).epochs[0], spec.run.steps_per_epoch
    steps = [[ep.rank(r).sample[ep.rank(r).step_offsets[t] : ep.rank(r).step_offsets[t + 1]]
              .tolist() for t in range(spe)] for r in range(2)]  # fmt: skip
    moved = next((x, t1, a, t2) for t1 in range(spe) for a in range(2) for x in steps[a][t1]
                 for t2 in range(spe) if t2 != t1 and x in steps[1 - a][t2]
                 and x not in steps[1 - a][t1])  # fmt: skip
    x, t1, a, t2 = moved
    steps[1 - a][t2].remove(x)
    steps[1 - a][t1].append(x)

    def verdict(parts):
        mine = []
        for r in range(2):
            sample = np.array([x for s in parts[r] for x in s], np.int32)
            offsets = np.zeros(spe + 1, np.int64)
            np.cumsum([len(s) for s in parts[r]], out=offsets[1:])
            m = sample.size
            v = TraceValidator(spec, 0, r, 12345)
            assert v.seen.size == v.pos.size == 0  # (a trace's checks keep no table of N)
            v.check(RankEpoch(0, sample, np.full(m, -1, np.int32), np.zeros(m, np.uint8),
                              offsets, np.full(m, -1, np.int32)))  # fmt: skip
            mine.append(v.mine)
        return coverage_error(mine, v.expected)

    assert verdict(steps) is not None


def test_huge_weights_keep_their_proportions():
    s = Weighted(np.array([1e308, 1e308, 1e300]), num_samples=30_000)
    ids = s.epoch(RunConfig(3, 1, 100, 1, draws=30_000), 0).ids
    counts = np.bincount(ids, minlength=3)
    assert counts[2] == 0 and abs(counts[0] - counts[1]) < 1000


@pytest.mark.parametrize("name", ["loss_count", "check_keys", "extras", "supersedes"])
def test_a_sampler_with_delivery_names_but_no_batch_extras_is_refused(data, name):
    path, _ = data

    class Counted(Weighted):  # delivery would never call it: refused, not ignored
        pass

    setattr(Counted, name, ("x",) if name == "supersedes" else lambda self, *a: None)
    with pytest.raises(SolarError, match=rf"Counted defines {name}, .*: subclass "
                       r"BatchExtras: extras\(output, batch\)$") as err:  # fmt: skip
        Loader(path, batch_size=4, epochs=1, buffer=4, sampler=Counted(np.ones(53)))
    assert "\n" not in str(err.value)

"""Planning one epoch at a time: the same decisions as the whole run, in the Loader too, and
resume on another world size with the same global batch."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from helpers import reference, write_h5
from hypothesis import HealthCheck, given, settings
from plan_checks import specs

from solar import Loader, SolarError, make_plan
from solar.options import PlanningConfig
from solar.schedule.keep.planner import Planner
from solar.schedule.plans.stream import RankStream
from solar.schedule.spec import PlanSpec

N = 97


@pytest.fixture
def data(tmp_path: Path) -> Path:
    rng = np.random.default_rng(3)
    return write_h5(tmp_path / "d.h5", x=rng.standard_normal((N, 3, 4)).astype(np.float32),
                    y=np.arange(N, dtype=np.int64))  # fmt: skip


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs())
def test_a_rank_streamed_epoch_by_epoch_equals_its_whole_run_part(spec):
    whole = make_plan(spec)
    r = spec.run.world_size - 1
    planner = Planner(spec)
    for k in range(spec.run.epochs):
        part = planner.next_rank(r)
        want = whole.rank_epoch(r, k)
        for name in ("sample", "slot", "flags", "step_offsets"):
            np.testing.assert_array_equal(getattr(part, name), getattr(want, name))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs())
def test_windows_serve_exactly_the_whole_plans_steps(spec):
    """From any epoch, a stream's windows give the whole plan's steps and buffer needs."""
    whole = make_plan(spec).rank(0)
    stream = RankStream(spec, 0)
    spe = spec.run.steps_per_epoch
    for e in [*range(spec.run.epochs), 0]:  # forwards, then a jump back (a replay)
        k = e * spe
        win = stream.window(k)
        slots, samples = win.refill_at(k)
        needed_slots, needed = whole.refill_at(k)
        # The window refills at least what the whole plan needs, with the same samples.
        assert set(needed_slots.tolist()) <= set(slots.tolist())
        np.testing.assert_array_equal(samples[np.isin(slots, needed_slots)], needed)
        for t in range(k, k + spe):
            a, b = win.step(t), whole.step(t)
            for name in ("samples", "hit_rows", "hit_slots", "admit_rows", "admit_slots"):
                np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    stream.close()


def test_a_stream_plans_one_epoch_ahead_of_the_one_served_no_further():
    """However long the consumer lingers, the stream holds the epoch served and the next: a
    plan of many epochs is never held whole (nor planned ahead of need)."""
    from solar.config import BufferConfig, RunConfig

    spec = PlanSpec(RunConfig(num_samples=64, batch_size=8, epochs=6, world_size=1, seed=1),
                    BufferConfig(capacity=16))  # fmt: skip
    stream = RankStream(spec, 0)
    spe = spec.run.steps_per_epoch
    try:
        for e in range(spec.run.epochs):
            stream.window(e * spe)
            want = min(e + 2, spec.run.epochs) * spe
            deadline = time.monotonic() + 60  # (a loaded machine plans slowly)
            while stream.planned_end < want and time.monotonic() < deadline:
                time.sleep(0.01)
            for _ in range(20):  # time for the planning thread to run further, if it would
                time.sleep(0.01)
                assert stream.planned_end == want
    finally:
        stream.close()


def _served(loaders: list[Loader], epochs: range, ref: dict) -> list[list[np.ndarray]]:
    """Per global step, the sorted union of the ranks' batches; bytes checked on the way."""
    steps: list[list[np.ndarray]] = []
    for e in epochs:
        per_rank = []
        for ld in loaders:
            ld.set_epoch(e)
            mine = []
            for b in ld:
                idx = b["index"].numpy()
                assert b["x"].numpy().tobytes() == ref["x"][idx].tobytes()
                mine.append(idx.copy())
            per_rank.append(mine)
        steps += [np.sort(np.concatenate(parts)) for parts in zip(*per_rank, strict=True)]
    return steps


def test_streamed_loader_serves_the_planned_run(data):
    ref = reference([data])
    kw = {"batch_size": 4, "epochs": 4, "buffer": 20, "world_size": 2}
    streamed = [Loader(data, rank=r, **kw) for r in range(2)]
    planned = [
        Loader(data, rank=r, **kw, planning=PlanningConfig(plan=streamed[0].plan)) for r in range(2)
    ]
    a, b = _served(streamed, range(4), ref), _served(planned, range(4), ref)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    for s, p in zip(streamed, planned, strict=True):
        assert [e.hits for e in s.stats.epochs.values()] == [
            e.hits for e in p.stats.epochs.values()
        ]
        assert sum(e.hits for e in s.stats.epochs.values()) > 0
        s.close()


@pytest.mark.parametrize(("world", "batch"), [(3, 4), (1, 12), (4, 3)])
def test_elastic_resume_serves_the_same_global_batches(data, world, batch):
    ref = reference([data])
    kw = {"epochs": 3, "buffer": 15}
    first = [Loader(data, batch_size=6, rank=r, world_size=2, **kw) for r in range(2)]
    expected = _served(first, range(3), ref)
    # Stop mid-epoch 1 on the original run.
    stopped = [Loader(data, batch_size=6, rank=r, world_size=2, **kw) for r in range(2)]
    _served(stopped, range(1), ref)
    states = []
    for ld in stopped:
        ld.set_epoch(1)
        it = iter(ld)
        for _ in range(5):
            next(it)
        states.append(ld.state_dict())
    resumed = [Loader(data, batch_size=batch, rank=r, world_size=world, **kw) for r in range(world)]
    for r, ld in enumerate(resumed):
        ld.load_state_dict(states[r % 2])  # any rank's state will do
    got = _served(resumed, range(1, 3), ref)
    spe = len(resumed[0])
    assert len(got) == 2 * spe - 5
    assert all(np.array_equal(x, y) for x, y in zip(got, expected[spe + 5 :], strict=True))


def test_a_different_global_batch_is_refused_naming_both(data):
    ld = Loader(data, batch_size=6, world_size=2, rank=0, epochs=2, buffer=10)
    other = Loader(data, batch_size=4, world_size=2, rank=0, epochs=2, buffer=10)
    with pytest.raises(SolarError, match=r"global batch 12 .* this run has 2·4 = 8"):
        other.load_state_dict(ld.state_dict())

"""Independent checks of a plan against the run it claims to serve (used by several tests)."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from solar import BufferConfig, PlanSpec, RunConfig
from solar.schedule import POLICIES, Plan
from solar.schedule.draw.order import access_sequence, nominal_batches, step_bounds
from solar.schedule.policy import ADMIT, DEMOTE, HIT, RELEASE, TADMIT, THIT, TIERED


def check_plan(plan: Plan) -> None:
    """Assert every promise a plan makes; replay each rank's buffer to check its hits."""
    run, buffer = plan.run, plan.spec.buffer
    seq = access_sequence(run, plan.epoch_order)
    bounds = step_bounds(run)
    ranks = [plan.rank(r) for r in range(run.world_size)]
    total_hits = 0
    hits_per_epoch = np.zeros(run.epochs, np.int64)
    for rp in ranks:
        assert rp.step_offsets.shape == (run.num_steps + 1,)
        assert rp.step_offsets[0] == 0 and rp.step_offsets[-1] == rp.sample.size
    for k in range(run.num_steps):
        epoch, t = divmod(k, run.steps_per_epoch)
        a = epoch * run.samples_per_epoch + bounds[t]
        b = epoch * run.samples_per_epoch + bounds[t + 1]
        parts = [rp.sample[rp.step_offsets[k] : rp.step_offsets[k + 1]] for rp in ranks]
        # The ranks' local batches together are exactly the step's global batch.
        np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.sort(seq[a:b]))
        nominal = nominal_batches(b - a, run.world_size)
        for r, part in enumerate(parts):
            assert part.size <= buffer.cap(int(nominal[r])), (k, r, part.size)
            if buffer.slack == 0 and plan.spec.policy == "solar":
                assert part.size == nominal[r]
            if plan.spec.policy in ("lru", "fifo", "nopfs"):
                assert part.size == nominal[r]
    for rp in ranks:
        _replay(rp, buffer.capacity, buffer.tier)
        steps = rp.steps()
        hits = rp.hit
        total_hits += int(hits.sum())
        np.add.at(hits_per_epoch, steps[hits] // run.steps_per_epoch, 1)
        assert rp.sample.size == plan.stats[rp.rank].accesses
        assert int(hits.sum()) == plan.stats[rp.rank].hits
    # Every served sample exactly once per epoch.
    for e in range(run.epochs):
        served = np.concatenate([rp.sample[rp.steps() // run.steps_per_epoch == e] for rp in ranks])
        assert served.size == run.samples_per_epoch
        assert np.unique(served).size == served.size
    # A hit needs the sample held across an epoch boundary, and at most P·(C+D) are.
    assert hits_per_epoch[0] == 0
    held = run.world_size * (buffer.capacity + buffer.tier)
    assert np.all(hits_per_epoch <= min(held, run.samples_per_epoch))
    assert total_hits == plan.hits
    assert plan.tier_hits == sum(int(np.sum(rp.flags & THIT != 0)) for rp in ranks)


def _replay(rp, capacity: int, tier: int) -> None:
    """Hits must find their sample in their slot (RAM or tier) as the buffers stand at the
    step's start; updates apply in access order (a plain re-implementation of the format)."""
    ram = np.full(capacity, -1, np.int64)
    disk = np.full(tier, -1, np.int64)
    for k in range(rp.step_offsets.size - 1):
        a, b = rp.step_offsets[k], rp.step_offsets[k + 1]
        flags, slots, tslots, samples = rp.flags[a:b], rp.slot[a:b], rp.tslot[a:b], rp.sample[a:b]
        hit, thit = (flags & HIT) != 0, (flags & THIT) != 0
        assert not np.any(hit & thit)
        assert np.all((slots[hit] >= 0) & (slots[hit] < capacity))
        assert np.all((tslots[thit] >= 0) & (tslots[thit] < tier))
        np.testing.assert_array_equal(ram[slots[hit]], samples[hit])
        np.testing.assert_array_equal(disk[tslots[thit]], samples[thit])
        assert not np.any((hit | thit) & ((flags & TADMIT) != 0))
        assert not np.any(hit & ((flags & ADMIT) != 0))
        assert not np.any(~(hit | thit) & ((flags & RELEASE) != 0))
        assert np.all(slots[(flags & (HIT | ADMIT)) == 0] == -1)
        assert np.all(tslots[(flags & (THIT | TADMIT | DEMOTE)) == 0] == -1)
        for f, s, t, x in zip(flags, slots, tslots, samples, strict=True):
            if f & DEMOTE:
                assert f & ADMIT and ram[s] >= 0
                disk[t] = ram[s]
            elif f & THIT and f & (ADMIT | RELEASE):
                disk[t] = -1
            if f & ADMIT:
                ram[s] = x
            elif f & TADMIT:
                disk[t] = x
            elif f & RELEASE and f & HIT:
                ram[s] = -1


@st.composite
def specs(draw, policies=tuple(POLICIES), max_world=4, tier=False):
    """Random plan specs; with ``tier``, a second tier of random size (tiered policies)."""
    world = draw(st.integers(1, max_world))
    batch = draw(st.integers(1, 6))
    n = draw(st.integers(world * batch, world * batch * 5 + 7))
    run = RunConfig(
        num_samples=n,
        world_size=world,
        batch_size=batch,
        epochs=draw(st.integers(1, 4)),
        seed=draw(st.integers(0, 2**32 - 1)),
        drop_last=draw(st.booleans()),
    )
    buffer = BufferConfig(
        draw(st.integers(0, n)),
        draw(st.sampled_from([0, 0.25, 0.5, 1.0])),
        draw(st.integers(1, n)) if tier else 0,
    )
    if tier:
        policies = tuple(p for p in policies if p in TIERED)
    return PlanSpec(run, buffer, draw(st.sampled_from(policies)), draw(st.booleans()))

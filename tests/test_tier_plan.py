"""Planning a second tier: what is held is exactly a RAM-only plan of C + D, RAM keeps what
MIN on RAM alone would, and the plan's tier decisions survive files, validation and windows."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from plan_checks import check_plan, specs
from test_planner_properties import brute_force_optimum

from solar import BufferConfig, CorruptPlanError, PlanSpec, RunConfig, SolarError, make_plan
from solar.schedule import load_plan
from solar.schedule.draw.order import access_sequence
from solar.schedule.keep.hostplan import host_phases
from solar.schedule.keep.planner import Planner
from solar.schedule.plans.stream import RankStream
from solar.schedule.plans.validate import validate_rank
from solar.schedule.policy import ADMIT, DEMOTE, HIT, TADMIT, THIT

SLOW = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}


def _ram_only(spec: PlanSpec, capacity: int) -> PlanSpec:
    buffer = BufferConfig(capacity, spec.buffer.slack)
    return PlanSpec(spec.run, buffer, spec.policy, spec.reorder_epochs)


@settings(max_examples=120, **SLOW)
@given(specs(tier=True))
def test_tiered_plans_keep_every_promise(spec):
    plan = make_plan(spec)
    check_plan(plan)
    for r in range(spec.run.world_size):
        validate_rank(plan.rank(r), spec.run, plan.epoch_order, key=7)


@settings(max_examples=80, **SLOW)
@given(specs(policies=("solar",), tier=True))
def test_what_is_held_is_a_ram_only_plan_of_both_capacities(spec):
    """Who serves what, and which accesses are hits, are those of one buffer of C + D."""
    tiered = make_plan(spec)
    flat = make_plan(_ram_only(spec, spec.buffer.capacity + spec.buffer.tier))
    for r in range(spec.run.world_size):
        a, b = tiered.rank(r), flat.rank(r)
        np.testing.assert_array_equal(a.sample, b.sample)
        np.testing.assert_array_equal(a.step_offsets, b.step_offsets)
        np.testing.assert_array_equal(a.hit, b.hit)
    assert tiered.hits == flat.hits


@settings(max_examples=80, **SLOW)
@given(specs(policies=("solar",), max_world=1, tier=True))
def test_one_rank_ram_hits_are_those_of_a_ram_only_plan(spec):
    # (Epoch reordering chooses its order for everything held, C + D: compare on one order.)
    spec = dataclasses.replace(spec, reorder_epochs=False)
    tiered = make_plan(spec).rank(0)
    ram_only = make_plan(_ram_only(spec, spec.buffer.capacity)).rank(0)
    np.testing.assert_array_equal((tiered.flags & HIT) != 0, (ram_only.flags & HIT) != 0)


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(2, 7),
    batch=st.integers(1, 3),
    epochs=st.integers(2, 4),
    ram=st.integers(0, 3),
    tier=st.integers(1, 3),
    seed=st.integers(0, 1000),
)
def test_one_rank_hits_from_both_tiers_are_belady_optimal(n, batch, epochs, ram, tier, seed):
    run = RunConfig(n, 1, min(batch, n), epochs, seed)
    plan = make_plan(PlanSpec(run, BufferConfig(ram, 0, tier)))
    _, sample, hit = plan.trace(0)
    np.testing.assert_array_equal(sample, access_sequence(run))
    assert plan.hits == int(hit.sum()) == brute_force_optimum(sample, min(ram + tier, n))
    assert plan.ram_hits == make_plan(PlanSpec(run, BufferConfig(ram, 0))).hits


def test_demotions_and_promotions_happen_and_the_bound_counts_both_tiers():
    run = RunConfig(400, 2, 8, 4, seed=1)
    plan = make_plan(PlanSpec(run, BufferConfig(20, 0.25, 80)))
    flags = np.concatenate([plan.rank(r).flags for r in range(2)])
    assert np.any(flags & DEMOTE) and np.any(flags & THIT)
    assert plan.tier_hits > plan.ram_hits > 0
    assert plan.bound == pytest.approx(2 * 100 * 3 / (400 * 4))
    assert plan.hit_rate > 0.95 * plan.bound


def test_nopfs_fills_ram_then_the_tier_with_the_most_frequent():
    run = RunConfig(300, 2, 5, 3, seed=4)
    plan = make_plan(PlanSpec(run, BufferConfig(10, 0, 30), "nopfs"))
    check_plan(plan)
    ram_only = make_plan(PlanSpec(run, BufferConfig(10, 0), "nopfs"))
    both = make_plan(PlanSpec(run, BufferConfig(40, 0), "nopfs"))
    assert plan.ram_hits == ram_only.hits  # the C most frequent stay in RAM
    assert plan.hits == both.hits  # and the next D sit in the tier


@pytest.mark.parametrize("policy", ["lru", "fifo", "solar-artifact"])
def test_policies_without_a_tier_refuse_one(policy):
    with pytest.raises(SolarError, match=f"policy '{policy}' has no second tier"):
        PlanSpec(RunConfig(50, 1, 5, 2), BufferConfig(5, 0, 5), policy)


def test_fingerprints_without_a_tier_are_unchanged():
    spec = PlanSpec(RunConfig(50, 1, 5, 2), BufferConfig(5, 0))
    assert "tier" not in spec.as_dict()
    assert PlanSpec(spec.run, BufferConfig(5, 0, 3)).fingerprint != spec.fingerprint


@settings(max_examples=25, **SLOW)
@given(specs(tier=True))
def test_windows_and_streams_give_the_whole_plans_tier_steps(spec):
    whole = make_plan(spec)
    r = spec.run.world_size - 1
    planner = Planner(spec)
    for k in range(spec.run.epochs):
        part, want = planner.next_rank(r), whole.rank_epoch(r, k)
        for name in ("sample", "slot", "tslot", "flags", "step_offsets"):
            np.testing.assert_array_equal(getattr(part, name), getattr(want, name))
    rp = whole.rank(r)
    stream = RankStream(spec, r)
    spe = spec.run.steps_per_epoch
    for e in [*range(spec.run.epochs), 0]:
        k = e * spe
        cells, samples = stream.window(k).refill_at(k)
        need, want = rp.refill_at(k)
        assert set(need.tolist()) <= set(cells.tolist())
        np.testing.assert_array_equal(samples[np.isin(cells, need)], want)
        for t in range(k, k + spe):
            a, b = stream.window(t).step(t), rp.step(t)
            for name in a._fields:
                np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    stream.close()


def test_starting_from_refill_alone_every_later_tier_hit_matches():
    """Garbage in every cell refill_at(k) does not name: replaying the plan from there, each
    later hit (RAM or tier) still finds its sample."""
    run = RunConfig(120, 1, 6, 4, seed=2)
    rp = make_plan(PlanSpec(run, BufferConfig(8, 0, 20))).rank(0)
    from solar.schedule.plans.rankplan import _replay

    for k in range(0, run.num_steps, 7):
        cells, samples = rp.refill_at(k)
        state = np.full(rp.cells, -999, np.int64)
        state[cells] = samples
        for t in range(k, run.num_steps):
            a, b = rp.step_offsets[t], rp.step_offsets[t + 1]
            f, x = rp.flags[a:b], rp.sample[a:b]
            hit, thit = (f & HIT) != 0, (f & THIT) != 0
            np.testing.assert_array_equal(state[rp.slot[a:b][hit]], x[hit])
            np.testing.assert_array_equal(state[rp.slots + rp.tslot[a:b][thit]], x[thit])
            _replay(rp.sample, rp.slot, rp.tslot, rp.flags, a, b, rp.slots, state)


@pytest.fixture
def tier_plan(tmp_path: Path) -> tuple[Path, PlanSpec]:
    spec = PlanSpec(RunConfig(90, 2, 4, 3, seed=5), BufferConfig(6, 0.25, 20))
    path = tmp_path / "t.plan.h5"
    make_plan(spec).save(path)
    return path, spec


def test_a_tier_plan_file_round_trips_and_validates(tier_plan):
    path, spec = tier_plan
    loaded, made = load_plan(path), make_plan(spec)
    assert (loaded.ram_hits, loaded.tier_hits) == (made.ram_hits, made.tier_hits)
    for r in range(2):
        loaded.validate(r)
        a, b = loaded.rank(r), made.rank(r)
        for name in ("sample", "slot", "tslot", "flags", "step_offsets"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t, f, i: t.__setitem__(i, 10**6), r"tier slot 1000000, outside 0\.\.19"),
        (lambda t, f, i: t.__setitem__(i, (t[i] + 1) % 20), r"from tier slot \d+, which holds"),
    ],
    ids=["tier slot out of range", "tier hit from another slot"],
)
def test_an_edited_tier_slot_is_refused(tier_plan, edit, message):
    path, spec = tier_plan
    made = make_plan(spec)
    # Edit rank 0's first tier hit of epoch 1 and recompute every checksum, as a tool would.
    ep = made.epochs[1]
    lo, hi = ep.rank_offsets[0], ep.rank_offsets[1]
    i = int(lo + np.flatnonzero(ep.flags[lo:hi] & THIT)[0])
    tslot = ep.tslot.copy()
    edit(tslot, ep.flags, i)
    made.epochs[1] = type(ep)(**{**vars(ep), "tslot": tslot})
    edited = path.with_name("edited.plan.h5")
    made.save(edited)
    with pytest.raises(CorruptPlanError) as info:
        load_plan(edited).validate(0)
    assert "\n" not in str(info.value)
    assert re.search(message, str(info.value)), str(info.value)
    with h5py.File(edited) as f:  # tier slots live in the epoch's section
        assert f["epochs/1/tslot"].dtype == np.int32


@pytest.mark.parametrize("seed", range(3))
def test_a_step_updating_a_cell_twice_applies_its_phases_in_turn(seed):
    """A rank's own buffer (a host of one rank): where a step stores a RAM slot or writes a
    tier slot twice, its updates come in phases; applied as the holdings apply them (each
    phase in bulk: demotions, stores, tier admissions) they give the plan's next state."""
    run = RunConfig(60, 1, 8, 4, seed=seed)
    rp = make_plan(PlanSpec(run, BufferConfig(3, 0, 10))).rank(0)
    phased = 0
    for k in range(run.num_steps):
        step, state = rp.step(k), rp.contents_at(k)
        x = step.samples
        waits = [False] if step.phase_waits is None else step.phase_waits.tolist()
        assert not any(waits), "a rank alone never waits for another"
        phased += len(waits) > 1
        for n in range(len(waits)):
            phases = (step.demote_phase, step.admit_phase, step.tadmit_phase)
            d, a, t = (slice(None) if p is None else p == n for p in phases)
            state[rp.slots + step.demote_tslots[d]] = state[step.demote_slots[d]]
            state[step.admit_slots[a]] = x[step.admit_rows[a]]
            state[rp.slots + step.tadmit_tslots[t]] = x[step.tadmit_rows[t]]
        want = rp.contents_at(k + 1)
        held = want >= 0  # (a released cell keeps its stale row: the plan never reads it)
        np.testing.assert_array_equal(state[held], want[held], err_msg=f"step {k}")
    assert phased > 0


@pytest.mark.parametrize("seed", range(3))
def test_a_rank_alone_has_phases_exactly_where_host_phases_cuts_its_updates(seed):
    """A rank's own buffer asks keep/hostplan.host_phases only of a step naming a cell twice
    (most steps name each once): every step's phases are still the kernel's over all its
    updates, one phase (none given) where it finds no cell named twice."""
    run = RunConfig(60, 2, 8, 4, seed=seed)
    plan = make_plan(PlanSpec(run, BufferConfig(3, 0, 10)))
    phased = single = 0
    for r in range(run.world_size):
        rp = plan.rank(r)
        for k in range(run.num_steps):
            step = rp.step(k)
            t = k - rp.first_step
            a, b = int(rp.step_offsets[t]), int(rp.step_offsets[t + 1])
            f, slot, tslot = rp.flags[a:b], rp.slot[a:b], rp.tslot[a:b]
            j = np.flatnonzero(f & (ADMIT | TADMIT | DEMOTE))
            phase, waits = host_phases(np.zeros(j.size, np.int64), f[j], slot[j], tslot[j])
            if waits.size == 1:
                single += 1
                assert step.phase_waits is None, f"rank {r}, step {k}"
                continue
            phased += 1
            assert step.phase_waits is not None, f"rank {r}, step {k}"
            np.testing.assert_array_equal(step.phase_waits, waits)
            of = np.full(f.size, -1, np.int64)
            of[j] = phase
            np.testing.assert_array_equal(step.admit_phase, of[step.admit_rows])
            np.testing.assert_array_equal(step.tadmit_phase, of[step.tadmit_rows])
            np.testing.assert_array_equal(step.demote_phase, of[np.flatnonzero(f & DEMOTE)])
    assert phased > 0 and single > 0

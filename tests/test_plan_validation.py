"""A plan file is untrusted: edited plans (checksums recomputed) are refused before any byte
moves, and the runtime's views of a plan (steps, buffer states) agree with a replay."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from helpers import write_h5
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from plan_checks import specs

from solar import BufferConfig, CorruptPlanError, Loader, Plan, PlanSpec, RunConfig, make_plan
from solar.options import PlanningConfig
from solar.schedule import ADMIT, HIT, RELEASE, load_plan
from solar.schedule.keep.planner import EpochPlan
from solar.schedule.plans.validate import check_coverage, prove, validate_rank

N = 61
RUN = RunConfig(N, 2, 4, 3, seed=3)


def _spec(dataset: Path, run: RunConfig = RUN) -> PlanSpec:
    from solar.io.hdf5 import describe

    info = describe([dataset])
    return PlanSpec(run, BufferConfig(12, 0.25), "solar", False, info.sample_bytes, info.identity)


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    x = np.arange(N * 3, dtype=np.float32).reshape(N, 3)
    return write_h5(tmp_path / "d.h5", x=x)


def _edited(
    plan: Plan,
    path: Path,
    edit: Callable[[dict], None],
    spec: PlanSpec | None = None,
    epoch: int = 0,
) -> Path:
    """Save ``plan`` with one epoch's arrays edited and every checksum recomputed (as a tool
    would)."""
    epochs = list(plan.epochs)
    fields = {
        k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in vars(epochs[epoch]).items()
    }
    edit(fields)
    epochs[epoch] = EpochPlan(**fields)
    spec = spec or plan.spec
    Plan(spec, plan.epoch_order, plan.stats, 0.0, spec.fingerprint, epochs=epochs).save(path)
    return path


def _first(a: dict, rank: int, flag: int) -> int:
    """Index (in the epoch's arrays) of rank ``rank``'s first access with ``flag``."""
    lo, hi = a["rank_offsets"][rank], a["rank_offsets"][rank + 1]
    return int(lo + np.flatnonzero(a["flags"][lo:hi] & flag)[0])


def _hit_other_slot(a):
    i = _first(a, 0, HIT)
    a["slot"][i] = (a["slot"][i] + 1) % 12


def _hit_out_of_range(a):
    a["slot"][_first(a, 0, HIT)] = 10**6


def _sample_out_of_range(a):
    a["sample"][0] = N + 5


def _duplicate_in_epoch(a):
    lo = a["rank_offsets"][0]
    a["sample"][lo + 1] = a["sample"][lo]  # step 0: both reads, both admitted


def _non_monotone_offsets(a):
    a["step_offsets"][0][3] = a["step_offsets"][0][5] + 1


def _hit_never_written(a):
    lo = a["rank_offsets"][1]
    a["flags"][lo] = HIT  # step 0 of epoch 0: nothing has been written yet
    a["slot"][lo] = 0


def _release_without_hit(a):
    a["flags"][a["rank_offsets"][0]] = RELEASE


HITS_FROM = 1  # the first epoch with hits: edits of hits go there
EDITS = {
    "slot out of range": (_hit_out_of_range, r"slot 1000000, outside 0\.\.11"),
    "hit to the wrong slot": (_hit_other_slot, r"hit for sample \d+ from slot \d+, which holds"),
    "sample out of range": (_sample_out_of_range, r"sample id 66 is out of range"),
    "duplicated sample": (_duplicate_in_epoch, r"served twice in one epoch"),
    "non-monotone offsets": (_non_monotone_offsets, r"step offsets are not monotone"),
    "hit never written": (_hit_never_written, r"which holds nothing written"),
    "bad flags": (_release_without_hit, r"invalid flags"),
}


@pytest.mark.parametrize("name", EDITS)
def test_an_edited_plan_is_refused_naming_file_rank_and_step(tmp_path, dataset, name):
    edit, message = EDITS[name]
    plan = make_plan(_spec(dataset))
    epoch = HITS_FROM if name in ("slot out of range", "hit to the wrong slot") else 0
    path = _edited(plan, tmp_path / "edited.plan.h5", edit, epoch=epoch)
    loaded = load_plan(path)  # the header is intact: the edit is found rank by rank
    bad_rank = 1 if name == "hit never written" else 0
    with pytest.raises(CorruptPlanError) as info:
        loaded.rank(bad_rank)
    text = str(info.value)
    assert "\n" not in text
    assert re.search(message, text), text
    assert text.startswith(f"plan {path}: rank {bad_rank}, step ")
    # The Loader refuses it before reading a byte: no crash, no wrong bytes.
    with pytest.raises(CorruptPlanError, match=message):
        Loader([dataset], batch_size=4, epochs=3, buffer=12, seed=3, rank=bad_rank, world_size=2,
               planning=PlanningConfig(plan=path))  # fmt: skip
    loaded._validated([1 - bad_rank], key=1, keep=False)  # the untouched rank alone is valid


def test_another_seeds_permutation_is_refused(tmp_path, dataset):
    spec = _spec(dataset)
    other = make_plan(_spec(dataset, RunConfig(N, 2, 4, 3, seed=4)))
    path = _edited(other, tmp_path / "other-seed.plan.h5", lambda a: None, spec=spec)
    with pytest.raises(CorruptPlanError, match=r"rank 0, step 0: .* permutation for the seed"):
        load_plan(path).rank(0)


def test_a_sample_served_by_two_ranks_is_caught_across_ranks(tmp_path, dataset):
    plan = make_plan(_spec(dataset))

    def swap(a):
        # Rank 1 serves, as a read, a sample rank 0 reads in the same step; its own is lost.
        lo0, lo1 = a["rank_offsets"][0], a["rank_offsets"][1]
        a["sample"][lo1] = a["sample"][lo0]
        a["flags"][lo1], a["slot"][lo1] = 0, -1

    loaded = load_plan(_edited(plan, tmp_path / "dup.plan.h5", swap))  # epoch 0
    key = 12345
    parts = [loaded._validated([r], key, keep=False)[1] for r in (0, 1)]
    total = parts[0].mine + parts[1].mine  # each rank alone is consistent
    with pytest.raises(CorruptPlanError, match="epoch 0 does not serve each of its samples"):
        check_coverage(total, parts[0].expected)
    # A single process without a communicator checks every rank's part itself.
    with pytest.raises(CorruptPlanError, match="epoch 0 does not serve each of its samples"):
        loaded.rank(0)
    honest = [validate_rank(plan.rank(r), RUN, plan.epoch_order, key) for r in (0, 1)]
    check_coverage(honest[0][0] + honest[1][0], honest[0][1])


def test_a_rank_whose_check_fails_otherwise_fails_every_rank_alike():
    # Two ranks on two threads: rank 1's checker fails with no CorruptPlanError (what an
    # untrusted file holds may fail anything); rank 0 must not wait for it in a collective.
    gate, slots = threading.Barrier(2, timeout=60), [None, None]  # (a deadlock raises)

    class Comm:
        def __init__(self, rank):
            self.rank = rank

        def Get_size(self):
            return 2

        def Get_rank(self):
            return self.rank

        def allgather(self, obj):
            slots[self.rank] = obj
            gate.wait()
            got = list(slots)
            gate.wait()
            return got

    def check(rank):
        def run(alone):
            assert not alone
            if rank == 1:
                raise ValueError("cannot reshape array of size 3\ninto shape (2,)")
            return np.zeros(4, np.uint64), np.zeros(4, np.uint64), None

        return run

    def one(rank):
        with pytest.raises(CorruptPlanError) as info:
            prove("p.h5", Comm(rank), check(rank))
        return str(info.value)

    with ThreadPoolExecutor(2) as pool:
        got = [f.result(timeout=60) for f in [pool.submit(one, r) for r in (0, 1)]]
    assert got == ["plan p.h5: rank 1: ValueError: cannot reshape array of size 3"] * 2


def test_an_epoch_order_this_run_cannot_use_is_refused(tmp_path, dataset):
    import h5py

    from solar.schedule.plans import planfile

    path = make_plan(_spec(dataset)).save(tmp_path / "p.h5")
    with h5py.File(path, "r+") as f:
        del f["epoch_order"]
        f["epoch_order"] = np.array([0, 0, 1])
        # The header checksum covers epoch_order: recompute it as an editor would.
        f.attrs["header_checksum"] = planfile._header_checksum(
            str(f.attrs["fingerprint"]), str(f.attrs["stats"]), f["epoch_order"][()],
            f["checksums"][()],
        )  # fmt: skip
    with pytest.raises(CorruptPlanError, match="epoch order"):
        load_plan(path)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs(), st.integers(0, 2**64 - 1))
def test_every_honest_plan_validates_and_covers_each_epoch(spec, key):
    plan = make_plan(spec)
    mine = [
        validate_rank(plan.rank(r), spec.run, plan.epoch_order, key) for r in range(plan.world_size)
    ]
    total = np.sum([m for m, _ in mine], axis=0, dtype=np.uint64)
    check_coverage(total, mine[0][1])


def _replay(rp, k: int) -> np.ndarray:
    state = np.full(rp.slots, -1, np.int64)
    for i in range(int(rp.step_offsets[k])):
        if rp.flags[i] & ADMIT:
            state[rp.slot[i]] = rp.sample[i]
        elif rp.flags[i] & RELEASE:
            state[rp.slot[i]] = -1
    return state


def test_a_replay_names_the_bad_access_by_its_place_in_the_window():
    """A slot out of range in the window's second epoch: the replay (epoch by epoch) names
    the access by its index over the whole window, as the joined arrays number it."""
    plan = make_plan(PlanSpec(RunConfig(40, 1, 4, 3, 5), BufferConfig(6, 0.0), "solar"))
    rp = plan.rank(0)
    second = rp.parts[1]
    j = int(np.flatnonzero(second.flags & ADMIT)[0])
    second.slot[j] = rp.slots  # one past the last slot
    at = int(rp.parts[0].step_offsets[-1]) + j
    with pytest.raises(CorruptPlanError, match=f"rank 0: access {at} names slot {rp.slots} "):
        rp.contents_at(rp.end_step)
    rp.contents_at(rp.first_step + rp.share.spe)  # (the first epoch alone is sound)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs(), st.data())
def test_step_plans_and_buffer_states_agree_with_a_replay(spec, data):
    plan = make_plan(spec)
    rp = plan.rank(data.draw(st.integers(0, plan.world_size - 1)))
    k = data.draw(st.integers(0, rp.num_steps))
    np.testing.assert_array_equal(rp.contents_at(k), _replay(rp, k))
    # Starting from refill_at(k) alone (every other slot garbage), each later step's hits find
    # their samples: the refill holds everything the rest of the plan reads from the buffer.
    state = np.full(rp.slots, -7, np.int64)
    slots, samples = rp.refill_at(k)
    state[slots] = samples
    pending = set(slots.tolist())  # each refilled slot must be hit before it is overwritten
    for t in range(k, rp.num_steps):
        step = rp.step(t)
        assert step.step == t
        rows = np.sort(np.concatenate([step.hit_rows, step.read_rows]))
        np.testing.assert_array_equal(rows, np.arange(step.size))
        assert set(step.admit_rows.tolist()) <= set(step.read_rows.tolist())
        np.testing.assert_array_equal(state[step.hit_slots], step.samples[step.hit_rows])
        pending -= set(step.hit_slots.tolist())
        assert not pending & set(step.admit_slots.tolist()), "a refilled slot was dead"
        state[step.admit_slots] = step.samples[step.admit_rows]
    assert not pending

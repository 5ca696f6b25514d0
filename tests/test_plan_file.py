from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import h5py
import numpy as np
import pytest

from solar import (
    BufferConfig,
    CorruptPlanError,
    PlanMismatchError,
    PlanSpec,
    RunConfig,
    load_plan,
    make_plan,
)
from solar.errors import SolarError
from solar.schedule.keep.summary import PlanSummary
from solar.schedule.plans.plan import plan_to_file, simulate
from solar.schedule.plans.planfile import PlanFile, section_layout

SPEC = PlanSpec(RunConfig(97, 3, 4, 3, seed=5), BufferConfig(9, 0.25), sample_bytes=80)


@pytest.fixture
def saved(tmp_path: Path) -> tuple:
    plan = make_plan(SPEC)
    return plan, plan.save(tmp_path / "run.plan.h5")


def test_round_trip_keeps_everything(saved):
    plan, path = saved
    loaded = load_plan(path)
    assert loaded.fingerprint == plan.fingerprint == SPEC.fingerprint
    assert loaded.spec == SPEC
    assert loaded.stats == plan.stats
    np.testing.assert_array_equal(loaded.epoch_order, plan.epoch_order)
    for r in range(3):
        for a, b in zip(loaded.trace(r), plan.trace(r), strict=True):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(loaded.rank(r).slot, plan.rank(r).slot)


def test_file_is_plain_hdf5_with_documented_fields(saved):
    _, path = saved
    with h5py.File(path, "r") as f:
        assert f.attrs["format"] == "solar-plan"
        assert f.attrs["format_version"] == 5 and f.attrs["hosts"] == "null"  # a buffer per rank
        assert set(f) == {"epoch_order", "checksums", "epochs"}
        assert set(f["epochs"]) == {str(k) for k in range(SPEC.run.epochs)}
        for k in range(SPEC.run.epochs):
            g = f[f"epochs/{k}"]
            assert set(g) == {"rank_offsets", "step_offsets", "sample", "slot", "flags"}
            assert g["step_offsets"].shape == (3, SPEC.run.steps_per_epoch + 1)
            assert g["sample"].shape == (SPEC.run.samples_per_epoch,)
        assert f["checksums"].shape == (SPEC.run.epochs, 3, 16)


def test_check_accepts_its_own_run_and_names_what_differs(saved):
    _, path = saved
    plan = load_plan(path)
    plan.check(SPEC)
    other = PlanSpec(RunConfig(97, 4, 4, 3, seed=5), BufferConfig(9, 0.25), sample_bytes=80)
    with pytest.raises(PlanMismatchError, match=r"world_size 3 \(expected 4\)"):
        plan.check(other)
    moved = PlanSpec(SPEC.run, SPEC.buffer, sample_bytes=80, dataset="another")
    with pytest.raises(PlanMismatchError, match="dataset"):
        plan.check(moved)


def test_corrupt_data_is_refused(saved):
    _, path = saved
    with h5py.File(path, "r+") as f:
        lo = f["epochs/2/rank_offsets"][1]
        f["epochs/2/slot"][lo] = f["epochs/2/slot"][lo] + 1
    plan = load_plan(path)
    plan.rank_epoch(0, 2)  # the untouched rank still loads
    plan.rank_epoch(1, 1)  # and so does an untouched epoch
    with pytest.raises(CorruptPlanError, match=r"rank 1's data of epoch 2 fails its checksum"):
        plan.rank(1)
    with pytest.raises(CorruptPlanError, match=r"epoch 2: rank 1's data fails its checksum"):
        plan.epoch(2)  # read whole, as a plan of any grouping is


def test_an_epoch_is_read_back_whole_as_planned(saved):
    """One reader for every grouping: a per-rank plan's epoch read whole is the planner's."""
    plan, path = saved
    for k in range(SPEC.run.epochs):
        got, want = load_plan(path).epoch(k), plan.epoch(k)
        for name in ("rank_offsets", "step_offsets", "sample", "slot", "flags", "tslot"):
            np.testing.assert_array_equal(getattr(got, name), getattr(want, name))


def test_edited_inputs_are_refused(saved):
    _, path = saved
    with h5py.File(path, "r+") as f:
        f.attrs["spec"] = f.attrs["spec"].replace('"seed": 5', '"seed": 6')
    with pytest.raises(CorruptPlanError, match="fingerprint"):
        load_plan(path)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "other_hdf5"])
def test_unreadable_files_are_refused(saved, damage, tmp_path):
    _, path = saved
    if damage == "truncate":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        path.write_bytes(b"not a plan at all" * 100)
    else:
        with h5py.File(path, "w") as f:
            f["data"] = np.zeros(3)
    with pytest.raises(CorruptPlanError, match=re.escape(path.name)):
        plan = load_plan(path)
        plan.rank(0)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(SolarError, match=r"nope\.h5: no such file"):
        load_plan(tmp_path / "nope.h5")


def test_failed_save_leaves_nothing(tmp_path, monkeypatch):
    plan = make_plan(SPEC)

    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(h5py.Group, "create_dataset", boom)
    with pytest.raises(RuntimeError):
        plan.save(tmp_path / "run.plan.h5")
    assert list(tmp_path.iterdir()) == []


def test_saving_a_loaded_plan_over_itself_is_refused(saved):
    _, path = saved
    with pytest.raises(SolarError):
        load_plan(path).save(path)
    assert load_plan(path).fingerprint == SPEC.fingerprint


@pytest.mark.parametrize(
    "edit",
    [
        lambda f: f["epoch_order"].__setitem__(Ellipsis, f["epoch_order"][()][::-1]),
        lambda f: f.attrs.__setitem__("stats", f.attrs["stats"].replace('"hits": ', '"hits": 1')),
        lambda f: f["checksums"].__setitem__((0, 0, 0), f["checksums"][0, 0, 0] ^ 1),
    ],
    ids=["epoch_order", "stats", "checksums"],
)
def test_edited_header_is_refused(saved, edit):
    _, path = saved
    with h5py.File(path, "r+") as f:
        edit(f)
    with pytest.raises(CorruptPlanError, match=re.escape(path.name)):
        load_plan(path)


def test_equal_inputs_fingerprint_alike():
    a = PlanSpec(SPEC.run, BufferConfig(9, 0), sample_bytes=80)
    b = PlanSpec(SPEC.run, BufferConfig(9, 0.0), sample_bytes=80)
    assert a.fingerprint == b.fingerprint


def test_saved_plan_has_the_usual_file_mode(saved):
    _, path = saved
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_version_1_file_is_refused_with_a_clear_message(saved):
    _, path = saved
    with h5py.File(path, "r+") as f:
        f.attrs["format_version"] = 1
    with pytest.raises(
        CorruptPlanError, match="format version 1, this solar reads 5: plan the run"
    ):
        load_plan(path)


def test_streamed_file_and_simulation_match_the_plan_in_memory(tmp_path):
    plan = make_plan(SPEC)
    streamed = plan_to_file(SPEC, tmp_path / "s.plan.h5")
    summary = simulate(SPEC)
    assert streamed.stats == plan.stats == summary.stats
    for r in range(3):
        for a, b in zip(streamed.trace(r), plan.trace(r), strict=True):
            np.testing.assert_array_equal(a, b)
    # A simulation keeps only its totals: there is no rank to ask it for.
    assert isinstance(summary, PlanSummary) and not hasattr(summary, "rank")


@pytest.mark.parametrize("tier", [0, 40])
def test_simulate_returns_the_figures_of_the_plan(tier):
    spec = PlanSpec(SPEC.run, BufferConfig(9, 0.25, tier))
    plan, summary = make_plan(spec), simulate(spec)
    assert summary == dataclasses.replace(plan.summary, plan_seconds=summary.plan_seconds)
    assert summary.fingerprint == spec.fingerprint and summary.spec == spec
    figures = "run world_size accesses hits tier_hits ram_hits hit_rate bound".split()
    assert [getattr(summary, f) for f in figures] == [getattr(plan, f) for f in figures]
    assert summary.accesses == SPEC.run.num_accesses and (summary.tier_hits > 0) == (tier > 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        summary.stats = ()


@pytest.mark.parametrize("tier", [0, 40], ids=["ram", "tier"])
def test_writer_and_reader_share_the_epoch_section_layout(tmp_path, tier):
    spec = PlanSpec(RunConfig(101, 3, 4, 2, seed=1, drop_last=True), BufferConfig(9, 0.25, tier))
    plan = make_plan(spec)
    assert plan.epochs is not None
    layout = section_layout(spec)
    assert ("tslot" in layout) == (tier > 0)
    path = plan.save(tmp_path / "p.h5")
    with h5py.File(path, "r") as f:
        for k in range(spec.run.epochs):
            g = f[f"epochs/{k}"]
            assert list(g) == sorted(layout)  # nothing else is written
            assert {n: (g[n].shape, g[n].dtype) for n in g} == layout
    file = PlanFile.open(path)
    for ep in plan.epochs:
        for r in range(spec.run.world_size):
            want, got = ep.rank(r), file.read(r, ep.epoch)
            for name in ("sample", "slot", "flags", "step_offsets", "tslot"):
                np.testing.assert_array_equal(getattr(got, name), getattr(want, name))
                assert getattr(got, name).dtype == getattr(want, name).dtype


def test_writer_refuses_a_section_the_reader_would_refuse(tmp_path):
    plan = make_plan(SPEC)
    assert plan.epochs is not None
    ep = plan.epochs[0]
    plan.epochs[0] = dataclasses.replace(ep, slot=ep.slot.astype(np.int64))
    with pytest.raises(SolarError, match=r"epoch 0 as planned: slot is int64.*expected int32"):
        plan.save(tmp_path / "p.h5")
    assert list(tmp_path.iterdir()) == []

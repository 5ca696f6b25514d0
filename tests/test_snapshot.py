"""Planner snapshots: a planner restored at an epoch boundary decides exactly as the run that
saved it; a damaged or foreign snapshot is refused, never used; a Loader resumes from one."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest
from helpers import write_h5
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from plan_checks import specs

from solar import Loader, SolarError
from solar.config import BufferConfig, RunConfig
from solar.options import PlanningConfig
from solar.schedule.keep.planner import Planner
from solar.schedule.plans import snapshot
from solar.schedule.spec import PlanSpec

FIELDS = ("sample", "slot", "flags", "tslot", "rank_offsets", "step_offsets")


def _assert_same(a, b) -> None:
    for name in FIELDS:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs(policies=("solar",), tier=False) | specs(policies=("solar",), tier=True), st.data())
def test_a_restored_planner_decides_as_the_run_that_saved_it(tmp_path_factory, spec, data):
    if spec.run.epochs < 2:
        spec = dataclasses.replace(spec, run=dataclasses.replace(spec.run, epochs=3))
    e = data.draw(st.integers(1, spec.run.epochs - 1))
    directory = tmp_path_factory.mktemp("snap")
    ref = Planner(spec)
    for _ in range(e):
        ref.next_all()
    assert snapshot.save(directory, ref) is not None
    restored = snapshot.load(directory, spec, e)
    assert restored is not None and restored.epoch == e
    for _ in range(e, spec.run.epochs):
        _assert_same(restored.next_all(), ref.next_all())


def _spec(**buffer) -> PlanSpec:
    run = RunConfig(503, 3, 7, 5, 11, True)
    return PlanSpec(run, BufferConfig(**{"capacity": 40, **buffer}), "solar", False)


def _saved(tmp_path: Path, spec: PlanSpec, epoch: int = 2) -> Path:
    planner = Planner(spec)
    for _ in range(epoch):
        planner.next_all()
    path = snapshot.save(tmp_path, planner)
    assert path is not None
    return path


def _rewrite(path: Path, **changes) -> None:
    """Edit a snapshot's arrays and recompute its checksum, as a forger would."""
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    meta = str(arrays.pop("meta"))
    arrays.pop("digest")
    for name, value in changes.items():
        if name == "meta":
            meta = json.dumps({**json.loads(meta), **value}, sort_keys=True)
        else:
            arrays[name] = value(arrays[name])
    with open(path, "wb") as f:
        np.savez(f, meta=np.array(meta), digest=np.array(snapshot._digest(meta, arrays)), **arrays)


def _duplicate(occ: np.ndarray) -> np.ndarray:
    occ = occ.copy()
    held = np.argwhere(occ >= 0)
    occ[tuple(held[1])] = occ[tuple(held[0])]
    return occ


def _out_of_range(occ: np.ndarray) -> np.ndarray:
    occ = occ.copy()
    occ[0, 0] = 10**6
    return occ


def _swap_root(heap: np.ndarray) -> np.ndarray:
    heap = heap.copy()
    heap[0, [0, -1]] = heap[0, [-1, 0]]
    return heap


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"occupant": _duplicate}, "held in two cells"),
        ({"occupant": _out_of_range}, "out of range"),
        ({"heap": _swap_root}, "not a heap"),
        ({"heap": lambda h: np.zeros_like(h)}, "not a permutation"),
        ({"heap": lambda h: h[:, :-1]}, "heap: expected int32"),
        ({"occupant": lambda o: o.astype(np.float64)}, "occupant: expected"),
        ({"meta": {"epoch": 1}}, "header"),
    ],
)
def test_a_forged_snapshot_is_refused_by_name(tmp_path, change, message):
    spec = _spec()
    path = _saved(tmp_path, spec)
    _rewrite(path, **change)
    with pytest.warns(UserWarning, match=message):
        assert snapshot.load(tmp_path, spec, 4) is None


def test_a_damaged_or_foreign_snapshot_is_refused(tmp_path):
    spec = _spec()
    path = _saved(tmp_path, spec)
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.warns(UserWarning, match="refused"):
        assert snapshot.load(tmp_path, spec, 4) is None
    path.write_bytes(b"not a zip file")
    with pytest.warns(UserWarning, match="refused"):
        assert snapshot.load(tmp_path, spec, 4) is None
    # Another plan's snapshot renamed to this plan's name: the header says whose it is.
    other = _saved(tmp_path / "o", _spec(slack=0.5)) if (tmp_path / "o").mkdir() is None else None
    assert other is not None
    os.replace(other, path)
    with pytest.warns(UserWarning, match="header"):
        assert snapshot.load(tmp_path, spec, 4) is None


def test_a_snapshot_that_inflates_beyond_its_size_is_refused_before_inflating(tmp_path):
    spec = _spec()
    path = _saved(tmp_path, spec)
    with open(path, "wb") as f:  # 8 MB of zeros in a few KB: a zip bomb in miniature
        np.savez_compressed(f, occupant=np.zeros(2**20, np.int64))
    with pytest.warns(UserWarning, match="more than a snapshot's"):
        assert snapshot.load(tmp_path, spec, 4) is None


def test_the_newest_snapshot_not_after_the_epoch_is_used(tmp_path):
    spec = _spec()
    planner = Planner(spec)
    for _ in range(4):
        planner.next_all()
        snapshot.save(tmp_path, planner)
    assert snapshot.load(tmp_path, spec, 3).epoch == 3
    assert snapshot.load(tmp_path, spec, 9).epoch == 4
    assert snapshot.load(tmp_path, spec, 1) is None  # epoch 1's was dropped (KEEP)
    assert snapshot.load(tmp_path, _spec(slack=0.5), 4) is None  # another plan: none


def test_kept_snapshots_are_the_newest_and_every_tenth(tmp_path):
    spec = PlanSpec(RunConfig(60, 2, 3, 25, 0, False), BufferConfig(9), "solar", False)
    planner = Planner(spec)
    for _ in range(24):
        planner.next_all()
        snapshot.save(tmp_path, planner)
    assert snapshot._epochs(tmp_path, spec.fingerprint) == [24, 23, 22, 20, 10]
    planner.next_all()  # the last epoch: no snapshot after it
    assert snapshot.save(tmp_path, planner) is None


def test_policies_without_state_to_restore_save_nothing(tmp_path):
    spec = dataclasses.replace(_spec(), policy="lru")
    planner = Planner(spec)
    planner.next_all()
    assert snapshot.save(tmp_path, planner) is None
    assert list(tmp_path.iterdir()) == []


def test_a_planner_of_one_rank_alone_saves_no_snapshot(tmp_path):
    """A rank planned alone (a sampler's trace without affinity) keeps that rank's cells
    alone: a snapshot holds every rank's state, so it is refused, nothing written."""
    from solar import Trace

    run = RunConfig(64, 2, 8, 3, 0, False, 64)
    ids = np.random.default_rng(1).integers(0, 64, (3, 4, 2, 8))
    spec = PlanSpec(run, BufferConfig(10), "solar", sampler=Trace(ids))
    planner = Planner(spec, only_rank=1)
    planner.next_rank(1)
    assert planner.policy.occupant.shape[0] == 1
    with pytest.raises(ValueError, match="every rank's state"):
        snapshot.save(tmp_path, planner)
    assert list(tmp_path.iterdir()) == []
    everyone = Planner(spec)
    everyone.next_all()
    assert snapshot.save(tmp_path, everyone) is not None


N = 131


@pytest.fixture
def data(tmp_path: Path) -> Path:
    rng = np.random.default_rng(5)
    return write_h5(tmp_path / "d.h5", x=rng.standard_normal((N, 3, 2)).astype(np.float32))


def test_a_loader_resumes_from_a_snapshot_without_replanning_from_epoch_0(
    data, tmp_path, monkeypatch
):
    snaps = tmp_path / "snaps"
    snaps.mkdir()
    kw = {"batch_size": 4, "epochs": 4, "buffer": 20, "world_size": 2,
          "planning": PlanningConfig(snapshots=snaps)}  # fmt: skip
    expected = {}
    for rank in (0, 1):
        whole = Loader(data, rank=rank, **kw)
        for e in range(4):
            whole.set_epoch(e)
            expected[rank, e] = [b["x"].numpy().copy() for b in whole]
            if e == 1 and rank == 0:
                state = whole.state_dict()  # taken after epoch 1: resume at epoch 2
        whole.close()
    assert state["epoch"] == 2
    assert 2 in snapshot._epochs(snaps, whole.spec.fingerprint)
    monkeypatch.setattr(Planner, "skip", lambda self: pytest.fail("replayed an epoch"))
    for rank in (0, 1):
        resumed = Loader(data, rank=rank, **kw)
        resumed.load_state_dict(state)
        for e in (2, 3):
            resumed.set_epoch(e)
            got = [b["x"].numpy() for b in resumed]
            assert len(got) == len(expected[rank, e])
            for a, b in zip(got, expected[rank, e], strict=True):
                np.testing.assert_array_equal(a, b)
        resumed.close()


def test_only_rank_0_writes_snapshots_and_the_directory_must_exist(data, tmp_path):
    kw = {"batch_size": 4, "epochs": 3, "buffer": 20, "world_size": 2}
    with Loader(data, rank=1, **kw, planning=PlanningConfig(snapshots=tmp_path)) as loader:
        for e in range(3):
            loader.set_epoch(e)
            list(loader)
    assert not list(tmp_path.glob("solar-planner-*"))
    with pytest.raises(SolarError, match=r"snapshots: .*missing is not a directory"):
        Loader(data, rank=0, **kw, planning=PlanningConfig(snapshots=tmp_path / "missing"))

"""Equal local batches: the exchange schedule (a pure function of every rank's served counts),
the plan that carries those counts, its validation, and the command line. The rows moving
between ranks under mpiexec and torchrun: tests/test_mpi.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import write_h5

from solar import BufferConfig, CorruptPlanError, Loader, PlanSpec, RunConfig, SolarError
from solar.cli import main
from solar.options import PlanningConfig
from solar.schedule import load_plan, make_plan
from solar.schedule.draw.order import nominal_batches, step_bounds
from solar.schedule.draw.samplers import Weighted
from solar.schedule.keep.planner import RankEpoch
from solar.schedule.keep.transfer import (
    check_counts,
    delivered,
    moved_rows,
    rank_transfer,
    transfer_matrix,
)
from solar.schedule.plans.plan import simulate
from solar.schedule.plans.validate import RankValidator, peers_error, validate_rank


def _spec(n=103, world=3, batch=4, epochs=3, slack=0.5, equal=True, **run) -> PlanSpec:
    return PlanSpec(RunConfig(n, world, batch, epochs, seed=2, **run),
                    BufferConfig(12, slack), equal_batches=equal)  # fmt: skip


def test_every_surplus_row_fills_exactly_one_missing_row():
    rng = np.random.default_rng(0)
    for _ in range(500):
        world = int(rng.integers(1, 9))
        g = int(rng.integers(world, 40 * world))
        # Any split of g (as the planner's caps allow or not): the schedule is a bijection.
        counts = np.bincount(rng.integers(0, world, g), minlength=world)
        n = nominal_batches(g, world)
        m = transfer_matrix(counts)
        assert np.array_equal(m.sum(axis=1), np.maximum(counts - n, 0))
        assert np.array_equal(m.sum(axis=0), np.maximum(n - counts, 0))
        for r in range(world):
            tr = rank_transfer(counts, r)
            assert np.array_equal(tr.recv, m[:, r]) and tr.size == n[r]
            assert tr.keep == min(counts[r], n[r])
            assert tr.collective == bool(m.any())
            # A sender's rows go to consecutive ranks of those missing rows.
            short = np.flatnonzero(counts < n)
            to = np.searchsorted(short, np.flatnonzero(tr.send))
            assert to.size == 0 or np.array_equal(to, np.arange(to[0], to[-1] + 1))
            assert not (tr.send.any() and tr.recv.any())  # a rank sends or receives, not both
        sent, received = moved_rows(counts[None, :])
        assert np.array_equal(sent, m.sum(axis=1)) and np.array_equal(received, m.sum(axis=0))


def test_a_receivers_batch_is_its_own_rows_then_each_senders_in_rank_order():
    # Step of 12 over 3 ranks (shares 4): rank 0 serves 6, rank 1 serves 1, rank 2 serves 5.
    samples = [np.array([10, 11, 12, 13, 14, 15]), np.array([20]), np.array([30, 31, 32, 33, 34])]
    offsets = [np.array([0, s.size]) for s in samples]
    got = [d[0].tolist() for d in delivered(samples, offsets)]
    assert got == [[10, 11, 12, 13], [20, 14, 15, 34], [30, 31, 32, 33]]


@pytest.mark.parametrize("run", [{}, {"drop_last": True}])
def test_the_plan_serves_as_the_variable_plan_and_delivers_equal_batches(run):
    spec = _spec(**run)
    plan, variable = make_plan(spec), make_plan(_spec(equal=False, **run))
    world = spec.run.world_size
    parts = [plan.rank(r) for r in range(world)]
    for r, rp in enumerate(parts):  # who reads and holds what: the variable plan's decisions
        other = variable.rank(r)
        for name in ("sample", "slot", "flags", "step_offsets"):
            assert np.array_equal(getattr(rp, name), getattr(other, name))
        assert np.array_equal(rp.peers[:, r], rp.batch_sizes())
    assert plan.hits == variable.hits and plan.fingerprint != variable.fingerprint
    out = delivered([p.sample for p in parts], [p.step_offsets for p in parts])
    sizes = np.diff(step_bounds(spec.run))
    for k in range(spec.run.num_steps):
        g = int(sizes[k % spec.run.steps_per_epoch])
        assert [out[r][k].size for r in range(world)] == nominal_batches(g, world).tolist()
        served = np.concatenate([p.sample[p.step_offsets[k] : p.step_offsets[k + 1]]
                                 for p in parts])  # fmt: skip
        assert np.array_equal(np.sort(np.concatenate([o[k] for o in out])), np.sort(served))
    moved = sum(s.sent for s in plan.stats)
    assert moved == sum(s.received for s in plan.stats) > 0
    last = nominal_batches(int(np.diff(step_bounds(spec.run))[-1]), world)
    for r, s in enumerate(plan.stats):  # delivered sizes: B, and the even split of the last step
        assert (s.min_batch, s.max_batch) == (min(spec.run.batch_size, last[r]), 4)
    assert simulate(spec).stats == plan.stats


def test_a_plan_file_carries_every_ranks_counts_under_each_ranks_checksum(tmp_path):
    spec = _spec()
    path = make_plan(spec).save(tmp_path / "p.h5")
    loaded = load_plan(path)
    assert loaded.stats == make_plan(spec).stats
    rp = loaded.rank(0)
    assert np.array_equal(rp.peers, make_plan(spec).rank(0).peers)
    with h5py.File(path, "r+") as f:  # rank 2's counts of step 0 edited, checksums untouched
        so = f["epochs/1/step_offsets"]
        row = so[2]
        row[1] += 1
        so[2] = row
    with pytest.raises(CorruptPlanError, match="rank 0's data of epoch 1 fails its checksum"):
        load_plan(path).rank(0)


def _part(spec: PlanSpec, r: int, epoch: int = 0) -> RankEpoch:
    return make_plan(spec).epochs[epoch].rank(r)


def _more_to_rank_0(p):
    p[3, 0] += 1  # the step still adds up, rank 0's column no longer is its own
    p[3, 1] -= 1


@pytest.mark.parametrize(("edit", "message"), [
    (lambda p: p.__setitem__((0, 1), p[0, 1] + 1), "step 0: peer counts do not add up"),
    (_more_to_rank_0, "step 3: peer counts differ from this rank's own"),
    (lambda p: p.__setitem__((5, 1), -1), "step 5: peer counts do not add up"),
])  # fmt: skip
def test_counts_that_cannot_drive_the_exchange_are_refused(edit, message):
    spec = _spec()
    part = _part(spec, 0)
    peers = part.peers.copy()
    edit(peers)
    v = RankValidator(spec.run, np.arange(3), 12, 0, key=1, equal_batches=True)
    bad = RankEpoch(0, part.sample, part.slot, part.flags, part.step_offsets, part.tslot, peers)
    with pytest.raises(CorruptPlanError, match=f"rank 0, epoch 0: {message}"):
        v.check(bad)
    no_peers = RankEpoch(0, part.sample, part.slot, part.flags, part.step_offsets, part.tslot)
    with pytest.raises(CorruptPlanError, match="no peer counts"):
        RankValidator(spec.run, np.arange(3), 12, 0, key=1, equal_batches=True).check(no_peers)


def test_ranks_holding_different_counts_are_refused():
    spec = _spec()
    plan = make_plan(spec)
    digests = []
    for r in range(3):
        validate_rank(plan.rank(r), spec.run, plan.epoch_order, key=5)
        v = RankValidator(spec.run, plan.epoch_order, 12, r, 5, equal_batches=True)
        for e in range(3):
            v.check(plan.epochs[e].rank(r))
        digests.append(v.peers_digest)
    assert peers_error(digests) is None
    assert "different counts" in peers_error([digests[0], digests[1], "0" * 32])
    assert check_counts(np.zeros((2, 3), np.int32), np.array([3, 3]), 0, np.zeros(2)) is not None


def test_equal_batches_are_for_shuffle_and_part_of_the_fingerprint(tmp_path):
    assert "equal_batches" not in _spec(equal=False).as_dict()  # old fingerprints unchanged
    assert PlanSpec.from_dict(_spec().as_dict()) == _spec()
    with pytest.raises(SolarError, match="equal_batches applies to the default Shuffle"):
        PlanSpec(RunConfig(50, 2, 4, 2), BufferConfig(5), sampler=Weighted(np.ones(50)),
                 equal_batches=True)  # fmt: skip
    x = np.arange(103 * 2, dtype=np.float32).reshape(103, 2)
    data = write_h5(tmp_path / "d.h5", x=x)
    with pytest.raises(SolarError, match="equal_batches: the ranks exchange rows, pass comm="):
        Loader(data, batch_size=4, epochs=2, buffer=12, rank=0, world_size=3,
               planning=PlanningConfig(equal_batches=True))  # fmt: skip
    from solar.io.hdf5 import describe

    info = describe([data])
    spec = PlanSpec(RunConfig(103, 3, 4, 2), BufferConfig(12, 0.25), "solar", False,
                    info.sample_bytes, info.identity, equal_batches=True)  # fmt: skip
    path = make_plan(spec).save(tmp_path / "p.h5")
    with pytest.raises(SolarError, match="equal_batches True \\(expected None\\)"):
        Loader(data, batch_size=4, epochs=2, buffer=12, rank=0, world_size=3,
               planning=PlanningConfig(plan=path, equal_batches=False))  # fmt: skip
    # By default the plan's choice holds: equal batches, which need the ranks' communicator.
    with pytest.raises(SolarError, match="equal_batches: the ranks exchange rows, pass comm="):
        Loader(data, batch_size=4, epochs=2, buffer=12, rank=0, world_size=3,
               planning=PlanningConfig(plan=path))  # fmt: skip


def test_one_rank_with_equal_batches_serves_h5py_bytes(tmp_path):
    x = np.random.default_rng(1).standard_normal((37, 3))
    data = write_h5(tmp_path / "d.h5", x=x)
    with Loader(
        data, batch_size=5, epochs=2, buffer=9, planning=PlanningConfig(equal_batches=True)
    ) as ld:
        for e in range(2):
            ld.set_epoch(e)
            seen = []
            for b in ld:
                idx = b["index"].numpy()
                assert b["x"].numpy().tobytes() == x[idx].tobytes()
                seen.append(idx)
            assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(37))
            assert [s.size for s in seen] == [5] * 7 + [2]


def test_solar_plan_reports_delivered_batches_and_rows_moved(tmp_path, capsys):
    args = ["plan", "--samples", 1000, "--sample-bytes", 4096, "-P", 4, "-B", 8, "-E", 3, "-C",
            60, "--drop-last", "--equal-batches", "--json"]  # fmt: skip
    try:
        main([str(a) for a in args])
    except SystemExit as exc:
        assert exc.code == 0
    s = json.loads(capsys.readouterr().out)
    assert s["equal_batches"] is True
    assert all(r["min_batch"] == r["max_batch"] == 8 for r in s["ranks"])
    sent = sum(r["sent"] for r in s["ranks"])
    assert sent == sum(r["received"] for r in s["ranks"]) > 0
    assert s["rows_moved_per_epoch"] == sent / 3
    assert s["bytes_moved_per_epoch"] == sent / 3 * 4096
    assert 0 < s["moved_share"] <= 0.25  # at most the slack's share of the epoch


if __name__ == "__main__":
    sys.exit(pytest.main([str(Path(__file__))]))

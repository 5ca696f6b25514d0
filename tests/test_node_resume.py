"""Resume with one buffer per node: node planner snapshots (rank 0 saves every host's, a
stream replans from the newest of its grouping, exactly as planned from epoch 0, tier
included), a snapshot of another grouping refused in one line. (Under mpiexec, an exact
resume from a snapshot and an elastic one: tests/test_node_tier.py.)"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

from solar import BufferConfig, PlanSpec, RunConfig, Weighted
from solar.schedule.keep.grouping import Hosts, stage_bound
from solar.schedule.keep.planner import Planner
from solar.schedule.plans.stream import RankStream

N = 211
FIELDS = ("samples", "read_rows", "hit_slots", "admit_slots", "tier_slots", "demote_tslots",
          "tadmit_tslots", "peer_at", "stage_at")  # fmt: skip


def _spec() -> PlanSpec:
    w = (1.0 + np.arange(N)) ** -0.8
    return PlanSpec(RunConfig(N, 4, 7, 4, seed=3), BufferConfig(N // 40, 0.1, N // 20),
                    sampler=Weighted(w, affinity=False))  # fmt: skip


def _steps(stream: RankStream, ks: range) -> list:
    out = [stream.window(k).step(k) for k in ks]
    stream.close()
    return out


def _same(a: list, b: list) -> None:
    for x, y in zip(a, b, strict=True):
        for name in FIELDS:
            np.testing.assert_array_equal(getattr(x, name), getattr(y, name), err_msg=name)


def test_a_node_stream_resumes_from_rank_0s_snapshot_as_planned_from_epoch_0(tmp_path, monkeypatch):
    spec, hosts = _spec(), Hosts.grid(2, 2)
    bound = stage_bound(spec, hosts)
    spe, steps = spec.run.steps_per_epoch, spec.run.num_steps
    ref = _steps(RankStream(spec, 1, hosts=hosts, stage_rows=bound), range(steps))
    # Rank 0 saves.
    _steps(RankStream(spec, 0, snapshots=tmp_path, hosts=hosts, stage_rows=bound), range(steps))
    assert sorted(os.listdir(tmp_path))[-1].endswith("-e3.npz")
    # The others do not.
    _steps(RankStream(spec, 1, snapshots=tmp_path / "none", hosts=hosts, stage_rows=bound),
           range(1))  # fmt: skip
    assert not (tmp_path / "none").exists()
    monkeypatch.setattr(Planner, "skip", lambda self: pytest.fail("replayed an epoch"))
    k0 = 3 * spe + 1  # a jump into epoch 3: the host's buffer and tier as planned there
    stream = RankStream(spec, 1, snapshots=tmp_path, hosts=hosts, stage_rows=bound)
    cells, _ = stream.window(k0).refill_at(k0)
    assert np.any(cells >= stream.slots)  # tier cells among them
    _same(_steps(stream, range(k0, steps)), ref[k0:])


def test_a_snapshot_of_another_grouping_is_refused_in_one_line(tmp_path):
    spec = _spec()
    _steps(RankStream(spec, 0, snapshots=tmp_path, hosts=Hosts.grid(1, 4), stage_rows=64),
           range(spec.run.num_steps))  # fmt: skip
    hosts = Hosts.grid(2, 2)
    k0 = 2 * spec.run.steps_per_epoch
    ref = _steps(RankStream(spec, 0, hosts=hosts, stage_rows=64), range(k0, k0 + 3))
    with pytest.warns(UserWarning) as caught:
        got = _steps(RankStream(spec, 0, snapshots=tmp_path, hosts=hosts, stage_rows=64),
                     range(k0, k0 + 3))  # fmt: skip
    msg = str(caught[0].message)
    assert "refused" in msg and "hosts [[0, 1, 2, 3]]" in msg and "\n" not in msg, msg
    _same(got, ref)  # replanned from epoch 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # its own grouping's are taken without a word
        _steps(RankStream(spec, 0, snapshots=tmp_path, hosts=Hosts.grid(1, 4), stage_rows=64),
               range(k0, k0 + 1))  # fmt: skip

"""One GNN batch is sampled once per run: the planner's draw is what the runtime serves.

Every call of the neighbour sampling kernel is counted by its (stream key, seeds): the key
names the (epoch, step), the seeds the rank's batch. A Loader run over all its epochs must
sample each of its rank's batches exactly once, and nothing else."""

from __future__ import annotations

from collections import Counter

import h5py
import numpy as np
import pytest

from solar import Loader, NeighborSampler, PlanningConfig, RunConfig
from solar.graph import generate_graph, neighbor
from solar.schedule.draw import rng
from solar.schedule.draw.draws import every_rank, own_draws


@pytest.fixture(scope="module")
def graph_file(tmp_path_factory):
    """997 nodes, 5 floats per node, 30 % of them training seeds."""
    path = tmp_path_factory.mktemp("graph") / "g.h5"
    generate_graph(path, 997, 6.0, 5, seed=3, train_fraction=0.3)
    return path


class _Counted:
    """The sampling kernel, counting its calls by (stream key, seeds)."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.calls: Counter = Counter()

    def __call__(self, indptr, indices, seeds, fanouts, key):
        self.calls[int(key), np.asarray(seeds).tobytes()] += 1
        return self.kernel(indptr, indices, seeds, fanouts, key)

    def __getattr__(self, name):  # (compile, signatures: the kernel's)
        return getattr(self.kernel, name)


def _expected(sampler: NeighborSampler, run, rank: int) -> Counter:
    """Each of rank ``rank``'s batches of the run, once (computed without sampling)."""
    return Counter({
        (int(rng.stream_key(run.seed, neighbor._NEIGHBOR_STREAM, e, t)),
         sampler.seeds(run, e, t, rank).tobytes()): 1
        for e in range(run.epochs) for t in range(run.steps_per_epoch)
    })  # fmt: skip


@pytest.mark.parametrize("world, snapshots", [(1, False), (3, False), (3, True)])
def test_each_gnn_batch_is_sampled_once_over_a_run(graph_file, world, snapshots, tmp_path,
                                                   monkeypatch):  # fmt: skip
    """(With snapshots every rank plans every rank: the others' batches are sampled by its
    planner too, its own still once.)"""
    with h5py.File(graph_file) as f:
        feats = f["features"][()]
    counted = _Counted(neighbor._sample)
    monkeypatch.setattr(neighbor, "_sample", counted)
    rank = world - 1
    sampler = NeighborSampler(graph_file, (4, 3), batch_size=16)
    planning = PlanningConfig(snapshots=tmp_path if snapshots else None)
    with Loader(graph_file, ["features"], sampler=sampler, epochs=3, buffer=150, rank=rank,
                world_size=world, planning=planning) as ld:  # fmt: skip
        served = 0
        for e in range(ld.run.epochs):
            ld.set_epoch(e)
            for b in ld:
                assert b["x"].numpy().tobytes() == feats[b["n_id"].numpy()].tobytes()
                served += 1
        run = ld.run
    assert served == run.epochs * run.steps_per_epoch
    expected = _expected(sampler, run, rank)
    if snapshots:  # every other rank's batches once more, by this rank's planner
        others = [_expected(sampler, run, r) for r in range(world) if r != rank]
        expected = sum(others, expected)
    assert counted.calls == expected, (
        f"{sum(counted.calls.values())} samplings of {len(counted.calls)} batches "
        f"({len(set(counted.calls) - set(expected))} not the run's), expected "
        f"{len(expected)} batches once each"
    )


def test_every_rank_draws_put_together_are_the_epochs_draws(graph_file):
    sampler = NeighborSampler(graph_file, (4, 3), batch_size=16)
    n = sampler.graph.num_nodes
    run = RunConfig(n, 3, 16, 2, 7, False, sampler.draws(n, 48))
    whole = sampler.epoch(run, 1)
    parts = every_rank(run, {r: own_draws(sampler, run, 1, r) for r in range(3)})
    np.testing.assert_array_equal(parts.offsets, whole.offsets)
    np.testing.assert_array_equal(parts.ids, whole.ids)

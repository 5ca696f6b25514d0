"""Graphs (solar.graph): CSR validation, the generator, neighbour sampling and GNN batches."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_samplers import brute_force_steps

from solar import Graph, Loader, NeighborSampler, PlanSpec, make_plan
from solar.config import BufferConfig, RunConfig
from solar.errors import SolarError
from solar.graph import generate_graph
from solar.options import ExpertConfig
from solar.schedule import HIT


@pytest.fixture(scope="module")
def graph_file(tmp_path_factory):
    """997 nodes (a prime), 5 floats (20 B) per node, 30 % of them training seeds."""
    path = tmp_path_factory.mktemp("graph") / "g.h5"
    generate_graph(path, 997, 6.0, 5, seed=3, train_fraction=0.3)
    return path


def _run(sampler: NeighborSampler, n: int, world: int, epochs: int = 2, seed: int = 0):
    draws = sampler.draws(n, world * sampler.batch_size)
    return RunConfig(n, world, sampler.batch_size, epochs, seed, False, draws)


# -- CSR ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "indptr, indices, match",
    [
        ([1, 2, 3], [0, 1, 0], "start at 0"),
        ([0, 2, 1, 3], [0, 1, 2], "decreases"),
        ([0, 1, 2], [0, 1, 1], "ends at 2, but indices has 3"),
        ([0, 1, 2], [0, 2], "outside 0..1"),
        ([0, 1, 2], [0, -1], "outside 0..1"),
        ([0.0, 1.0], [0], "integer"),
        ([0], np.zeros(0, np.int64), "N \\+ 1 >= 2"),
    ],
)
def test_a_bad_csr_is_refused_in_one_line(indptr, indices, match):
    with pytest.raises(SolarError, match=match) as info:
        Graph({"indptr": np.array(indptr), "indices": np.array(indices)})
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("n", [1, 8, 13, 64])
def test_node_ids_are_checked_distinct_and_in_range_without_a_sort(n):
    """check_nodes refuses ids outside 0..n-1 and repeats wherever they are (a bitmap of the n
    nodes, its last partial byte included); its result is a copy unless copy=False is given
    int64 ids, which it returns as they are."""
    from solar.graph.csr import check_nodes

    ids = np.random.default_rng(n).permutation(n).astype(np.int32)
    got = check_nodes(ids, n, "w")
    assert got.dtype == np.int64 and np.array_equal(got, ids)
    for bad, why in ((n, "outside"), (-1, "outside"), (2**40, "outside"), (ids[-1], "twice")):
        with pytest.raises(SolarError, match=f"w: .*{why}"):
            check_nodes(np.append(ids, bad), n, "w")
    own = ids.astype(np.int64)
    assert check_nodes(own, n, "w", copy=False) is own
    assert check_nodes(own, n, "w") is not own


def test_a_sampler_keeps_its_own_copy_of_the_seeds_it_is_given():
    g = {"indptr": np.array([0, 1, 2, 3]), "indices": np.array([1, 2, 0]), "train_idx": [2, 0]}
    graph = Graph(g)
    train = np.array([1, 2], np.int64)
    sampler = NeighborSampler(graph, train=train, batch_size=1)
    train[0] = 0  # (the caller's array changed: not the sampler's seeds)
    assert sampler.train.tolist() == [1, 2] and not sampler.train.flags.writeable
    assert NeighborSampler(graph, batch_size=1).train is graph.train_idx  # (no second copy)
    assert graph.train_idx.tolist() == [2, 0] and not graph.train_idx.flags.writeable


def test_bad_labels_and_splits_are_refused(tmp_path):
    g = {"indptr": np.array([0, 1, 2]), "indices": np.array([1, 0])}
    with pytest.raises(SolarError, match="labels: expected 2 integer labels"):
        Graph({**g, "labels": np.array([0, 1, 2])})
    with pytest.raises(SolarError, match="listed twice"):
        Graph({**g, "train_idx": np.array([1, 1])})
    with pytest.raises(SolarError, match=r"outside 0\.\.1"):
        NeighborSampler(Graph(g), train=[0, 2], batch_size=1)
    with pytest.raises(SolarError, match="fanouts"):
        NeighborSampler(Graph(g), fanouts=(2, 0), batch_size=1)
    path = tmp_path / "bad.h5"
    with h5py.File(path, "w") as f:
        f["indptr"] = np.array([0, 1, 3])
        f["indices"] = np.array([1, 0, 7])
    with pytest.raises(SolarError, match=f"graph {path}: indices name nodes outside 0..1"):
        Graph(path)
    with h5py.File(path, "w") as f:
        f["indptr"] = np.array([0, 1, 2])
    with pytest.raises(SolarError, match="no 'indices'"):
        Graph(path)
    (tmp_path / "junk.h5").write_bytes(b"not hdf5")
    with pytest.raises(SolarError, match="not a readable HDF5 file"):
        Graph(tmp_path / "junk.h5")


def test_a_graph_from_npy_files_is_the_same_private_graph(tmp_path, graph_file):
    with h5py.File(graph_file) as f:
        parts = {k: f[k][()] for k in ("indptr", "indices", "labels", "train_idx")}
    for k, v in parts.items():
        np.save(tmp_path / f"{k}.npy", v)
    g = Graph({k: str(tmp_path / f"{k}.npy") for k in parts})
    assert not isinstance(g.indices, np.memmap) and not g.indices.flags.writeable
    assert g.identity == Graph(graph_file).identity


def _first_use(sampler: NeighborSampler):
    assert sampler.graph.shared is None and sampler.graph._bulk is None  # (not read yet)
    return lambda: sampler.graph.indptr


def test_a_deferred_topology_refuses_its_file_rewritten_with_the_same_shapes(
    graph_file, tmp_path, monkeypatch
):
    """A topology read later than its splits (Graph(defer=True); a NeighborSampler's with no
    communicator in a job of several ranks a host, until hold() or first use) comes from the
    file the splits came from: one rewritten in place with the same shapes is refused in one
    line naming it, never half old (the seeds), half new (the edges)."""
    path = tmp_path / "g.h5"
    monkeypatch.setattr("solar.graph.neighbor.ranks_here", lambda: 2)  # (a host of two ranks)
    opened = {
        "Graph(defer=True), hold()": lambda: Graph(path, defer=True).hold,
        "NeighborSampler, first use": lambda: _first_use(NeighborSampler(path, (3,), 8)),
    }
    for how, later in opened.items():
        shutil.copy(graph_file, path)
        read = later()
        st = os.stat(path)
        with h5py.File(path, "r+") as f:
            f["indices"][...] = 0  # every shape as it was
        # (a later mtime, as a clock tick would give: a coarse clock may not have moved yet)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        with pytest.raises(SolarError, match=f"graph {path}: changed since it was opened") as e:
            read()
        assert "\n" not in str(e.value), how
    shutil.copy(graph_file, path)  # unchanged: read as before
    assert np.array_equal(Graph(path, defer=True).indices, Graph(graph_file).indices)


def test_a_graph_holds_its_seeds_and_reads_the_other_splits_again_at_first_use(
    graph_file, tmp_path
):
    """Every split is checked when the graph is opened, but only the seeds' is held then: the
    others (a batch's masks) are read again at first use -- a sampler's bind, which its Loader
    calls, or the masks asked for -- from the unchanged file, equal to what it holds; a file
    rewritten meanwhile is refused in one line by either. Splits given in memory are held
    (read again, they could be the caller's changes)."""
    path = tmp_path / "g.h5"
    shutil.copy(graph_file, path)
    with h5py.File(path, "r") as f:
        want = {k: f[k][...] for k in ("train_idx", "valid_idx", "test_idx")}
    g = Graph(path)
    assert set(g._splits) == {"train_idx"} and g._later == ("valid_idx", "test_idx")
    sampler = NeighborSampler(g, (2,), 8)
    assert sampler.train is g.train_idx and g._later  # (a planner needs no more)
    sampler.bind(None)  # (its Loader's: the batches' masks need them, read now)
    assert sorted(g._splits) == sorted(want) and g._later == ()
    assert sorted(g.splits) == sorted(want) and g._later == ()
    for k, ids in want.items():
        assert np.array_equal(g.splits[k], ids) and not g.splits[k].flags.writeable
    bits = g.split_bits
    assert bits is not None and np.array_equal(np.flatnonzero(bits & 2), np.sort(want["valid_idx"]))
    g = Graph(path)
    st = os.stat(path)
    with h5py.File(path, "r+") as f:
        f["test_idx"][...] = f["test_idx"][...][::-1]  # every shape as it was
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    for first_use in (lambda: g.split_bits, lambda: NeighborSampler(g, (2,), 8).bind(None)):
        with pytest.raises(SolarError, match=f"graph {path}: changed since it was opened") as e:
            first_use()
        assert "\n" not in str(e.value)
    parts = {"indptr": np.array([0, 1, 2]), "indices": np.array([1, 0]),
             "valid_idx": np.array([1])}  # fmt: skip
    g = Graph(parts)
    parts["valid_idx"][0] = 0  # (the caller's array: not the graph's split)
    assert g._later == () and g.splits["valid_idx"].tolist() == [1]


# -- the generator -----------------------------------------------------------------------------
def test_the_generated_graph_is_a_power_law_block_model(graph_file):
    g = Graph(graph_file)
    assert g.indptr.dtype == np.int64 and g.indices.dtype in (np.int32, np.int64)
    assert not isinstance(g.indptr, np.memmap)  # private memory: no file can change it under us
    dst = np.repeat(np.arange(g.num_nodes), g.degree())
    src = np.asarray(g.indices, np.int64)
    assert np.all(src != dst)  # no self-loops
    assert np.unique(src * g.num_nodes + dst).size == src.size  # no repeated edge
    deg = g.degree()
    assert deg.max() > 4 * deg.mean() and abs(deg.mean() - 6.0) < 0.5  # skewed: a few hubs
    assert not np.all(np.diff(np.argsort(-deg)[:20]) == 1)  # hubs spread over the ids
    # Most neighbours are of the node's community, its label; classes balanced.
    assert np.mean(g.labels[src] == g.labels[dst]) > 0.7
    assert np.bincount(g.labels).min() > 997 // 8 - 2
    with h5py.File(graph_file) as f:
        x = f["features"]
        assert x.shape == (997, 5) and x.dtype == np.float32 and x.chunks is None
        assert x.id.get_offset() % 4096 == 0
        train, valid = f["train_idx"][()], f["valid_idx"][()]
        assert train.size == 299 and valid.size == 100 and np.intersect1d(train, valid).size == 0


def test_the_generator_is_seeded(tmp_path):
    a, b, c = (tmp_path / f"{k}.h5" for k in "abc")
    generate_graph(a, 300, 4.0, 3, seed=1)
    generate_graph(b, 300, 4.0, 3, seed=1)
    generate_graph(c, 300, 4.0, 3, seed=2)
    with h5py.File(a) as fa, h5py.File(b) as fb, h5py.File(c) as fc:
        for k in fa:
            np.testing.assert_array_equal(fa[k][()], fb[k][()])
        assert not np.array_equal(fa["indices"][()], fc["indices"][()])
    with pytest.raises(SolarError, match="avg-degree"):
        generate_graph(tmp_path / "d.h5", 10, 20.0, 3)
    assert not (tmp_path / "d.h5").exists()


# -- sampling ----------------------------------------------------------------------------------
def _check_subgraph(g: Graph, sampler: NeighborSampler, sub, seeds: np.ndarray) -> None:
    """Everything a subgraph promises, checked against the topology itself."""
    nodes, src, dst = sub.nodes, sub.src, sub.dst
    assert np.unique(nodes).size == nodes.size
    np.testing.assert_array_equal(nodes[: seeds.size], seeds)
    assert sub.hop_nodes.sum() == nodes.size and sub.hop_edges.sum() == src.size
    bounds = np.concatenate([[0], np.cumsum(sub.hop_nodes)])
    edge_bounds = np.concatenate([[0], np.cumsum(sub.hop_edges)])
    indptr, indices = np.asarray(g.indptr), np.asarray(g.indices)
    for h, fanout in enumerate(sampler.fanouts):
        es = slice(edge_bounds[h], edge_bounds[h + 1])
        # Targets of hop h are exactly the nodes first reached at hop h - 1 (the seeds at 0).
        targets = np.arange(bounds[h], bounds[h + 1])
        count = np.bincount(dst[es] - bounds[h], minlength=targets.size)
        assert np.all((dst[es] >= bounds[h]) & (dst[es] < bounds[h + 1]))
        deg = indptr[nodes[targets] + 1] - indptr[nodes[targets]]
        np.testing.assert_array_equal(count, np.minimum(deg, fanout) if fanout > 0 else deg)
        # New nodes of hop h + 1 are reached by hop h's edges, and only by edges so far.
        assert np.all(src[es] < bounds[h + 2])
        new = np.arange(bounds[h + 1], bounds[h + 2])
        assert np.isin(new, src[es]).all()
    for s, d in zip(nodes[src].tolist(), nodes[dst].tolist(), strict=True):
        assert s in indices[indptr[d] : indptr[d + 1]]
    # Without replacement: no neighbour twice for one target (the generator has no multi-edges).
    pairs = src * nodes.size + dst
    assert np.unique(pairs).size == pairs.size


@pytest.mark.parametrize("fanouts", [(3, 2), (4,), (-1, 2, 1)])
def test_subgraphs_follow_the_topology_and_the_fanouts(graph_file, fanouts):
    sampler = NeighborSampler(graph_file, fanouts, batch_size=16)
    g = sampler.graph
    run = _run(sampler, g.num_nodes, 3)
    for step, rank in [(0, 0), (2, 1), (run.steps_per_epoch - 1, 2)]:
        sub = sampler.subgraph(run, 1, step, rank)
        _check_subgraph(g, sampler, sub, sampler.seeds(run, 1, step, rank))


def test_sampling_is_a_pure_function_of_seed_epoch_step_and_rank(graph_file):
    a = NeighborSampler(graph_file, (5, 3), batch_size=16)
    run = _run(a, a.graph.num_nodes, 2)
    whole = a.epoch(run, 1)
    b = NeighborSampler(graph_file, (5, 3), batch_size=16)  # a fresh process's sampler
    for t in (run.steps_per_epoch - 1, 3, 0):
        for r in (1, 0):
            sa, sb = a.subgraph(run, 1, t, r), b.subgraph(run, 1, t, r)
            for f in ("nodes", "src", "dst", "hop_nodes", "hop_edges"):
                np.testing.assert_array_equal(getattr(sa, f), getattr(sb, f))
            i = t * 2 + r
            np.testing.assert_array_equal(whole.ids[whole.offsets[i] : whole.offsets[i + 1]],
                                          sa.nodes)  # fmt: skip
    other = b.epoch(run, 0)
    assert not np.array_equal(other.ids[: other.offsets[1]], whole.ids[: whole.offsets[1]])
    reseeded = b.epoch(_run(b, b.graph.num_nodes, 2, seed=5), 1)
    assert not np.array_equal(reseeded.ids, whole.ids)


def test_every_seed_once_per_epoch_over_uneven_ranks(graph_file):
    sampler = NeighborSampler(graph_file, (2,), batch_size=23)
    run = _run(sampler, sampler.graph.num_nodes, 3)
    for e in range(2):
        seeds = [sampler.seeds(run, e, t, r) for t in range(run.steps_per_epoch) for r in range(3)]
        np.testing.assert_array_equal(np.sort(np.concatenate(seeds)), sampler.train)
    with pytest.raises(SolarError, match="batch_size 8"):
        sampler.epoch(RunConfig(997, 1, 8, 1, draws=299), 0)
    with pytest.raises(SolarError, match="features have 5 rows"):
        sampler.check(5)


# -- batches -----------------------------------------------------------------------------------
@pytest.mark.parametrize("world", [1, 2])
def test_loader_batches_are_pyg_shaped_and_byte_exact(graph_file, world):
    with h5py.File(graph_file) as f:
        feats, labels = f["features"][()], f["labels"][()]
    seen = []
    for rank in range(world):
        sampler = NeighborSampler(graph_file, (4, 3), batch_size=40)
        with Loader(graph_file, ["features"], sampler=sampler, epochs=2, buffer=150, rank=rank,
                    world_size=world) as ld:  # fmt: skip
            assert sampler.graph._later == ()  # (the masks' splits read as it was made)
            for e in range(2):
                ld.set_epoch(e)
                for t, b in enumerate(ld):
                    n_id = b["n_id"].numpy()
                    assert b["x"].numpy().tobytes() == feats[n_id].tobytes()
                    assert "features" not in b and "index" not in b  # x and n_id say it
                    bs = b["batch_size"]
                    np.testing.assert_array_equal(b["y"].numpy()[:bs], labels[n_id[:bs]])
                    np.testing.assert_array_equal(b["y"].numpy(), labels[n_id])  # every node's
                    assert sum(b["num_sampled_nodes"]) == n_id.size
                    assert sum(b["num_sampled_edges"]) == b["edge_index"].shape[1]
                    ei = b["edge_index"].numpy()
                    assert ei.dtype == np.int64 and ei.min() >= 0 and ei.max() < n_id.size
                    seeds = sampler.seeds(ld.run, e, t, rank)
                    np.testing.assert_array_equal(n_id[:bs], seeds)
                    seen.append((e, seeds))
            planned = ld.plan.stats[rank]
            assert sum(s.hits for s in ld.stats.epochs.values()) == planned.hits > 0
    for e in range(2):
        got = np.concatenate([s for k, s in seen if k == e])
        np.testing.assert_array_equal(np.sort(got), sampler.train)


def test_the_loader_takes_its_batch_size_from_the_sampler_or_refuses(graph_file):
    sampler = NeighborSampler(graph_file, (2,), batch_size=30)
    with pytest.raises(SolarError, match="batch_size 31"):
        Loader(graph_file, ["features"], sampler=sampler, batch_size=31, epochs=1, buffer=10)
    with pytest.raises(SolarError, match="needs batch_size"):
        Loader(graph_file, ["features"], epochs=1, buffer=10)


# -- planning ----------------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(3, 7), edges=st.integers(2, 12), train=st.integers(1, 4),
    batch=st.integers(1, 2), capacity=st.integers(1, 3), seed=st.integers(0, 10**6),
)  # fmt: skip
def test_one_rank_gnn_plan_hits_equal_beladys_optimum(n, edges, train, batch, capacity, seed):
    """On tiny random graphs the planner's hits are the exhaustive optimum of the subgraphs'
    node sets (each step's distinct nodes hit if held), and every hit is a held node."""
    if batch > train:
        return
    r = np.random.default_rng(seed)
    u, v = r.integers(0, n, edges), r.integers(0, n, edges)
    key = np.unique(np.concatenate([u * n + v, v * n + u]))
    src, dst = np.divmod(key, n)
    indptr = np.concatenate([[0], np.cumsum(np.bincount(src, minlength=n))])
    sampler = NeighborSampler({"indptr": indptr, "indices": dst}, (2, 1), batch_size=batch,
                              train=r.permutation(n)[:train])  # fmt: skip
    run = _run(sampler, n, 1, epochs=2, seed=seed % 7)
    plan = make_plan(PlanSpec(run, BufferConfig(capacity, 0.0), sampler=sampler))
    rp = plan.rank(0)
    steps = [rp.step(k).samples.tolist() for k in range(run.num_steps)]
    assert [sorted(s) for s in steps] == [
        sorted(sampler.batch(run, k // run.steps_per_epoch, k % run.steps_per_epoch, 0).tolist())
        for k in range(run.num_steps)
    ]
    assert plan.hits == brute_force_steps(steps, capacity)
    assert int(np.count_nonzero(rp.flags & HIT)) == plan.hits


def test_direct_io_gathers_small_rows_exactly_and_names_a_short_file(graph_file, tmp_path):
    """Under O_DIRECT small rows are read in page spans (solar.io.tasks.PageGather)."""
    from helpers import skip_without_o_direct

    from solar import ReaderConfig

    path = tmp_path / "g.h5"
    path.write_bytes(graph_file.read_bytes())
    with h5py.File(path) as f:
        feats = f["features"][()]
    sampler = NeighborSampler(path, (3, 2), batch_size=64)
    with skip_without_o_direct():
        ld = Loader(path, ["features"], sampler=sampler, epochs=1, buffer=100,
                    reader=ReaderConfig(direct_io=True))  # fmt: skip
        for b in ld:
            assert b["x"].numpy().tobytes() == feats[b["n_id"].numpy()].tobytes()
        assert ld.stats.epochs[0].bytes_read % 4096 == 0  # whole pages from storage
        with h5py.File(path) as f:
            end = f["features"].id.get_offset() + feats.nbytes
        with open(path, "r+b") as f:
            f.truncate(end - 3000)
        with pytest.raises(SolarError, match=r"short read|truncated"):
            for _ in Loader(path, ["features"], sampler=sampler, epochs=1, buffer=0,
                            reader=ReaderConfig(direct_io=True)):  # fmt: skip
                pass


@pytest.mark.parametrize("policy", ["solar", "lru", "static"])
@pytest.mark.parametrize("world", [2, 3])
def test_a_rank_planning_alone_plans_what_the_whole_run_gives_it(graph_file, world, policy):
    """Without affinity a rank's part depends on its own draws alone: a planner of that rank
    (sampling only its subgraphs, as a Loader's does) decides exactly as one of every rank,
    tier included, and holds the same cells; solar's keeps that rank's heaps and cells alone
    (one row, not P)."""
    from solar.schedule.keep.planner import Planner

    sampler = NeighborSampler(graph_file, (3, 2), batch_size=16)
    run = _run(sampler, 997, world, epochs=3)
    tier = 40 if policy == "solar" else 0
    spec = PlanSpec(run, BufferConfig(25, 0.0, tier), policy, sampler=sampler)
    everyone = Planner(spec)
    alone = [Planner(spec, only_rank=r) for r in range(world)]
    for _ in range(run.epochs):
        whole = everyone.next_all()
        for r, planner in enumerate(alone):
            got, want = planner.next_rank(r), whole.rank(r)
            for name in ("sample", "slot", "flags", "step_offsets", "tslot"):
                assert np.array_equal(getattr(got, name), getattr(want, name)), (r, name)
            assert np.array_equal(planner.contents(r), everyone.contents(r))
            other = (r + 1) % world  # (not planned there: nothing held)
            assert np.all(planner.contents(other) == -1)
            assert planner.contents(other).shape == everyone.contents(other).shape
    if policy == "solar":
        for planner in alone:
            state = planner.policy
            assert state.key.shape[0] == state.heap.shape[0] == state.cells.shape[0] == 1
            assert everyone.policy.cells.shape[0] == world
    with pytest.raises(ValueError, match="plans rank 0 alone"):
        Planner(spec, only_rank=0).next_rank(1)


def test_memory_checks_count_a_batch_as_its_subgraph_not_its_seeds(graph_file, monkeypatch):
    """A step's batch holds its subgraph's nodes (~10x the seeds here): the Loader's check of
    buffer + batches in flight and the planner's of the trace use the sampler's bound on them,
    which no sampled subgraph exceeds."""
    import solar._memory
    from solar import ReaderConfig
    from solar.schedule.plans.plan import trace_accesses

    sampler = NeighborSampler(graph_file, (3, 2), batch_size=16)
    run = _run(sampler, 997, 2, epochs=2)
    bound = sampler.batch_bound(run)
    assert bound == 16 * (1 + 3 + 3 * 2)
    assert max(sampler.batch(run, e, t, r).size for e in range(2)
               for t in range(run.steps_per_epoch) for r in range(2)) <= bound  # fmt: skip
    assert NeighborSampler(graph_file, (-1,), batch_size=4).batch_bound(run) <= 997
    # Room for the buffer and 4 batches of seeds, not for 4 batches of subgraphs (20 B rows).
    monkeypatch.setattr(solar._memory, "available_memory", lambda: (100 + 4 * 16 * 4) * 20)
    reader = ReaderConfig(read_ahead=2)
    # (Each batch with room for as many side rows: the 20 B rows share pages, pagemates.py.)
    with pytest.raises(SolarError, match=r"buffer and batches: 100 buffer rows \+ 4 batches "
                                         r"of up to 320 rows, 20 B each") as info:  # fmt: skip
        Loader(graph_file, ["features"], sampler=sampler, epochs=1, buffer=100, reader=reader,
               expert=ExpertConfig(warm=False))  # fmt: skip
    assert "\n" not in str(info.value)
    monkeypatch.setattr(solar._memory, "available_memory", lambda: (100 + 4 * 320) * 20)
    Loader(graph_file, ["features"], sampler=sampler, epochs=1, buffer=100, reader=reader,
           expert=ExpertConfig(warm=False)).close()  # fmt: skip
    # The planner's trace: every rank's subgraph every step, not one access per seed; each
    # counted as the sampler's typical subgraph (a few sampled, the largest + 10 %), at most
    # its bound, at least what an epoch draws.
    spec = PlanSpec(run, BufferConfig(10, 0.0), "solar", sampler=sampler)
    per_epoch, estimated = trace_accesses(spec)
    typical = sampler.typical_batch(run)
    assert estimated and typical is not None and typical <= bound
    assert per_epoch == 2 * run.steps_per_epoch * typical > run.samples_per_epoch
    for e in range(2):
        drawn = sum(sampler.batch(run, e, t, r).size for t in range(run.steps_per_epoch)
                    for r in range(2))  # fmt: skip
        assert drawn <= per_epoch
    # ~122 kB counting one access per seed, ~340 kB counting the subgraphs.
    monkeypatch.setattr(solar._memory, "available_memory", lambda: 250_000)
    with pytest.raises(SolarError, match=f"planning an estimated {2 * per_epoch} accesses"):
        make_plan(spec)


def test_the_typical_subgraph_samples_a_few_steps_whatever_the_world(graph_file, monkeypatch):
    """The trace's estimate of a subgraph (typical_batch) samples the first two steps of at
    most four ranks spread over the world (rank 0 and the last among them), not every rank's:
    its cost is bounded at any P."""
    sampler = NeighborSampler(graph_file, (3, 2), batch_size=2)
    seen: list[tuple[int, int]] = []
    sample = sampler._sample

    def counted(run, epoch, step, rank):
        seen.append((step, rank))
        return sample(run, epoch, step, rank)

    monkeypatch.setattr(sampler, "_sample", counted)
    for world, ranks in ((3, {0, 1, 2}), (13, {0, 4, 8, 12})):
        seen.clear()
        run = _run(sampler, 997, world)
        typical = sampler.typical_batch(run)
        assert sorted(seen) == sorted((t, r) for t in (0, 1) for r in ranks), world
        largest = max(sample(run, 0, t, r).nodes.size for t, r in seen)
        assert typical == min(sampler.batch_bound(run), int(1.1 * largest))


def test_the_mmap_baseline_gathers_exact_rows_through_a_page_lru_of_its_budget(tmp_path):
    """solar.graph.mmapbase: rows byte-identical to h5py's, a budget of 3 pages (steps larger
    than the budget gathered in chunks), whole pages read, rows counted as hits only when every
    page of theirs was cached; a truncated file is a short read."""
    from helpers import skip_without_o_direct

    from solar.graph.mmapbase import MmapGather

    path = tmp_path / "g.h5"
    generate_graph(path, 500, 4.0, 300, seed=1)  # 1200-byte rows: some span two pages
    with h5py.File(path) as f:
        feats = f["features"][()]
    rng = np.random.default_rng(0)
    with skip_without_o_direct(), MmapGather.of_key(path, "features", budget=3 * 4096) as g:
        assert g.pool.nbytes == 3 * 4096  # the emulated page cache: the budget
        for size in (1, 7, 40):
            ids = rng.choice(500, size, replace=False)
            assert g.gather(ids).tobytes() == feats[ids].tobytes()
        reads = g.bytes_read
        assert reads % 4096 == 0 and reads >= 48 * 1200
        ids = np.array([10])  # its pages were just read: cached unless evicted since
        g.gather(ids)
        g.gather(ids)
        assert g.rows == 50 and g.hits >= 1 and g.bytes_read <= reads + 2 * 4096
    big = MmapGather.of_key(path, "features", budget=10**6)
    with big:
        everything = big.gather(np.arange(500))
        first = big.hits  # rows whose page a previous chunk's row read (a chunk: 122 rows)
        again = big.gather(np.arange(500)[::-1])
        assert 0 < first < 10 and big.hits == first + 500  # all cached the second time
        assert everything.tobytes() == feats.tobytes()
        assert again.tobytes() == feats[::-1].tobytes()
    with pytest.raises(SolarError, match="no dataset key"):
        MmapGather.of_key(path, "labels_missing", budget=4096)
    with h5py.File(path) as f:
        offset = f["features"].id.get_offset()
    with open(path, "r+b") as f:
        f.truncate(offset + feats.nbytes - 3000)
    with MmapGather(path, offset, 1200, budget=4 * 4096) as g:
        with pytest.raises(SolarError, match="short read"):
            g.gather(np.array([499]))


def test_the_graphsage_example_learns_and_resumes_exactly_under_either_launcher(tmp_path):
    """Loss falls over 3 epochs on 2 ranks; a run resumed under torchrun from the mid-epoch
    checkpoint an mpiexec run kept ends with that run's parameters."""
    from pathlib import Path

    from test_mpi import launch

    example = Path(__file__).parent.parent / "examples" / "train_graphsage.py"
    common = ["--data", tmp_path / "g.h5", "--nodes", 3000, "--features", 16, "--batch-size",
              32, "--epochs", 3]  # fmt: skip

    def train(launcher: str, *extra) -> str:
        result = launch(launcher, 2, example, *common, *extra)
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout

    whole = train("mpiexec", "--checkpoint", tmp_path / "a.pt", "--checkpoint-every", 6,
                  "--keep-checkpoints")  # fmt: skip
    losses = [float(line.split()[3]) for line in whole.splitlines() if line.startswith("epoch")]
    assert len(losses) == 3 and losses[0] > losses[1] > losses[2], whole
    assert "hit rate" in whole
    resumed = train("torchrun", "--checkpoint", tmp_path / "a.pt.step6", "--resume")
    assert "at global step 6" in resumed and "training on 2 ranks (torchrun)" in resumed
    checksum = [line for line in whole.splitlines() if "checksum" in line]
    assert checksum and checksum == [line for line in resumed.splitlines() if "checksum" in line]


@pytest.mark.parametrize("ranks", [2, 3])
def test_ranks_serve_h5py_rows_and_every_seed_once_under_mpiexec(graph_file, ranks):
    from test_mpi import launch

    result = launch("mpiexec", ranks, "graph_coverage.py", graph_file)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ok" in result.stdout


def test_a_features_key_the_loader_does_not_read_is_one_line(graph_file):
    """batch['x'] is the features key's rows: a Loader reading other keys would yield batches
    without x, silently; it is refused at construction, naming the key."""
    sampler = NeighborSampler(graph_file, fanouts=(3,), batch_size=8, features="features")
    with pytest.raises(SolarError, match=r"features='features'.*keys labels"):
        Loader(graph_file, ["labels"], sampler=sampler, epochs=1, buffer=0, rank=0,
               world_size=1)  # fmt: skip


def _left_by(job: list[str]) -> list[str]:
    """What the job's own processes left (its "ok" lines: pid, start time and the /dev/shm
    names each rank mapped or held): a rank still running -- the same pid and start time --
    and its descriptors of sealed topologies (solar/host/sealed.py), or one of those names
    still in /dev/shm. Other jobs' processes and names on the machine are not looked at."""
    left = []
    for line in job:
        pid, start, *names = line.split()[3:]
        left += [f"/dev/shm/{n}" for n in names if os.path.exists(f"/dev/shm/{n}")]
        left += [f"/dev/shm/{n}" for n in names if "solar-sealed" in n]  # (never named)
        try:
            with open(f"/proc/{pid}/stat") as f:
                alive = f.read().rsplit(")", 1)[1].split()[19] == start
            fds = [os.readlink(p) for p in Path(f"/proc/{pid}/fd").iterdir()] if alive else []
        except OSError:  # (gone)
            continue
        if alive:
            left += [f"rank process {pid}", *(f for f in fds if "solar-sealed" in f)]
    return left


@pytest.mark.parametrize("launcher", ["mpiexec", "torchrun"])
def test_one_sealed_topology_per_host_under_a_launcher(graph_file, tmp_path, launcher):
    """Given the job's communicator, or by default through the Loader's (MPI's world or
    torch.distributed's group): one sealed memfd per host (tests/mpi/shared_graph.py)."""
    from test_mpi import launch

    path = tmp_path / "g.h5"  # (rewritten by the job)
    shutil.copy(graph_file, path)
    result = launch(launcher, 2, "shared_graph.py", path)
    assert result.returncode == 0, result.stderr[-3000:]
    job = [line for line in result.stdout.splitlines() if line.startswith("ok")]
    inodes = {line.split()[2] for line in job}
    assert len(inodes) == 1, result.stdout  # both ranks mapped the same memfd
    assert result.stdout.count("ok ") == 2, result.stdout
    assert not _left_by(job)

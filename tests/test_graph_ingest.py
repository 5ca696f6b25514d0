"""Graphs as users have them (solar.graph.ingest, solar.graph.csrwrite): a PyG Data, an
OGB-style directory, an edge list; conversion in bounded memory; PyG-native batches; a
generated graph on which a GNN must use the edges."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from solar import Graph, Loader, NeighborSampler
from solar.cli import main as cli_main
from solar.errors import SolarError
from solar.graph import generate_graph, write_graph

ROOT = Path(__file__).resolve().parent.parent


class _Data:
    """A minimal stand-in for torch_geometric's Data (attributes only)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def _pairs(indptr, indices, n):
    """The sorted (source, target) keys of a CSR by target."""
    dst = np.repeat(np.arange(n), np.diff(indptr))
    return np.sort(np.asarray(indices, np.int64) * n + dst)


def test_a_pyg_data_converts_and_is_served_byte_identical(tmp_path):
    """10^5 nodes, 10^6 edges, in a budget that takes several passes over the edges: the
    file's CSR holds exactly the edges (by target), its rows the source's bytes, and a
    Loader serves x, y and edges that are the Data's."""
    n, e = 100_000, 1_000_000
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    y = torch.randint(0, 7, (n,), generator=g)
    train = torch.zeros(n, dtype=torch.bool)
    train[torch.randperm(n, generator=g)[:600]] = True
    data = _Data(
        x=x, edge_index=torch.randint(0, n, (2, e), generator=g), y=y, train_mask=train
    )  # attributes as PyG's Data has them (imported below)
    got = write_graph(data, tmp_path / "g.h5", memory="16MiB")
    assert got["nodes"] == n and got["edges"] == e and got["splits"] == ["train_idx"]
    graph = Graph(tmp_path / "g.h5")
    ei = data.edge_index.numpy()
    keys = np.sort(ei[0] * n + ei[1])
    np.testing.assert_array_equal(_pairs(graph.indptr, graph.indices, n), keys)
    np.testing.assert_array_equal(graph.labels, y.numpy())
    np.testing.assert_array_equal(graph.train_idx, np.flatnonzero(train.numpy()))
    with h5py.File(tmp_path / "g.h5") as f:
        assert f["features"][()].tobytes() == x.numpy().tobytes()
        assert all(f[k].id.get_offset() % 4096 == 0 for k in f)
    sampler = NeighborSampler(tmp_path / "g.h5", (4, 2), batch_size=200)
    with Loader(tmp_path / "g.h5", ["features"], sampler=sampler, epochs=1, buffer="5%",
                rank=0, world_size=1) as ld:  # fmt: skip
        seeds = []
        for b in ld:
            n_id = b["n_id"].numpy()
            assert b["x"].numpy().tobytes() == x.numpy()[n_id].tobytes()
            np.testing.assert_array_equal(b["y"].numpy()[: b["batch_size"]],
                                          y.numpy()[n_id[: b["batch_size"]]])  # fmt: skip
            np.testing.assert_array_equal(b["y"].numpy(), y.numpy()[n_id])  # every node's
            src, dst = n_id[b["edge_index"].numpy()]
            pos = np.minimum(np.searchsorted(keys, src * n + dst), e - 1)
            assert np.array_equal(keys[pos], src * n + dst)  # every edge served is the Data's
            seeds.append(n_id[: b["batch_size"]])
        np.testing.assert_array_equal(np.sort(np.concatenate(seeds)), graph.train_idx)


def test_an_ogb_directory_and_an_edge_list_convert_with_the_cli(tmp_path, capsys):
    r = np.random.default_rng(1)
    n, e = 500, 3000
    root = tmp_path / "ogbn-toy"
    (root / "split" / "time").mkdir(parents=True)
    (root / "raw").mkdir()
    edges = r.integers(0, n, (e, 2))
    np.save(root / "raw" / "edge.npy", edges)  # (E, 2), in raw/ as OGB's own layout
    feats = r.standard_normal((n, 6)).astype(np.float16)
    np.save(root / "node_feat.npy", feats)
    labels = r.integers(0, 4, (n, 1)).astype(np.float64)
    labels[::9] = np.nan  # unlabelled nodes, as ogbn-papers100M's
    np.save(root / "node_label.npy", labels)
    perm = r.permutation(n)
    for name, ids in (("train", perm[:50]), ("valid", perm[50:80]), ("test", perm[80:99])):
        np.save(root / "split" / "time" / f"{name}.npy", ids)
    cli_main(["convert", str(root), str(tmp_path / "o.h5")])
    assert "graph of 500 nodes, 3000 edges" in capsys.readouterr().out
    g = Graph(tmp_path / "o.h5")
    np.testing.assert_array_equal(_pairs(g.indptr, g.indices, n),
                                  np.sort(edges[:, 0] * n + edges[:, 1]))  # fmt: skip
    want = np.where(np.isnan(labels[:, 0]), -1, labels[:, 0]).astype(np.int64)
    np.testing.assert_array_equal(g.labels, want)
    with h5py.File(tmp_path / "o.h5") as f:
        assert f["features"].dtype == np.float16 and f["features"][()].tobytes() == feats.tobytes()
        np.testing.assert_array_equal(f["valid_idx"][()], perm[50:80])
    # A graph file converts whole (not as samples of one key), to the same bytes.
    cli_main(["convert", str(tmp_path / "o.h5"), str(tmp_path / "o2.h5")])
    with h5py.File(tmp_path / "o.h5") as a, h5py.File(tmp_path / "o2.h5") as b:
        assert sorted(a) == sorted(b) and all(a[k][()].tobytes() == b[k][()].tobytes() for k in a)
    with pytest.raises(SystemExit):
        cli_main(["convert", str(tmp_path / "o.h5"), str(tmp_path / "o3.h5"), "--key", "features"])
    assert "a graph converts whole" in capsys.readouterr().err
    # A gzipped CSV edge list with a header and comments, both directions, features beside it.
    text = "# a comment\nsrc,dst\n" + "".join(f"{a},{b}\n" for a, b in edges[:100])
    with gzip.open(tmp_path / "e.csv.gz", "wt") as f:
        f.write(text)
    np.save(tmp_path / "x.npy", feats)
    with pytest.warns(UserWarning, match="no labels"):
        cli_main(["convert", str(tmp_path / "e.csv.gz"), str(tmp_path / "c.h5"), "--features",
                  str(tmp_path / "x.npy"), "--undirected", "--split", f"train={root}/split/"
                  "time/train.npy"])  # fmt: skip
    g = Graph(tmp_path / "c.h5")
    both = np.concatenate([edges[:100], edges[:100, ::-1]])
    np.testing.assert_array_equal(
        _pairs(g.indptr, g.indices, n), np.sort(both[:, 0] * n + both[:, 1])
    )
    with pytest.raises(SolarError, match=r"outside 0\.\.9"):
        write_graph({"edge_index": np.array([[0, 1], [1, 10]])}, tmp_path / "bad.h5", num_nodes=10)
    assert not (tmp_path / "bad.h5").exists()
    with pytest.raises(SolarError, match=r"edge.npy: an edge names a node outside 0\.\.2"):
        write_graph(root, tmp_path / "bad.h5", features=np.zeros((3, 2)))  # N from the rows
    with pytest.raises(SolarError, match="features: 3 rows, but the graph has 500 nodes"):
        write_graph(root, tmp_path / "bad.h5", features=np.zeros((3, 2)), num_nodes=500)


def test_features_four_times_the_memory_limit_convert_within_it(tmp_path):
    """In a subprocess: 128 MiB of features (and 10^6 edges) from .npy files with
    memory=32MiB; the peak resident memory of the conversion stays within 32 MiB of what the
    process held before (its row pointers: 8 B per node, counted in the budget's slack)."""
    n, f = 1 << 15, 1024
    x = np.lib.format.open_memmap(tmp_path / "x.npy", "w+", np.float32, (n, f))
    for lo in range(0, n, 8192):
        x[lo : lo + 8192] = np.random.default_rng(lo).standard_normal((8192, f), np.float32)
    x.flush()
    del x
    np.save(tmp_path / "e.npy", np.random.default_rng(0).integers(0, n, (2, 1_000_000)))
    script = textwrap.dedent(f"""
        import json, numpy as np
        from solar.graph import write_graph
        def status(key):
            for line in open("/proc/self/status"):
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
        write_graph({{"edge_index": np.array([[0, 1], [1, 0]]), "x": np.zeros((2, 2))}},
                    {str(tmp_path / "warm.h5")!r})  # kernels loaded, imports done
        before = status("VmRSS:")
        open("/proc/self/clear_refs", "w").write("5")  # the peak (VmHWM) from now on
        write_graph({str(tmp_path / "e.npy")!r}, {str(tmp_path / "g.h5")!r},
                    features={str(tmp_path / "x.npy")!r}, memory="32MiB")
        print(json.dumps({{"before": before, "peak": status("VmHWM:")}}))
    """)
    with warnings.catch_warnings():
        got = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             cwd=ROOT, check=False)  # fmt: skip
    assert got.returncode == 0, got.stderr
    rss = json.loads(got.stdout.strip().splitlines()[-1])
    assert rss["peak"] - rss["before"] <= 32 * 2**20, rss
    with h5py.File(tmp_path / "g.h5") as out:
        src = np.load(tmp_path / "x.npy", mmap_mode="r")
        assert out["features"][-5:].tobytes() == np.asarray(src[-5:]).tobytes()


def test_the_sampler_takes_graphs_in_memory_and_the_loader_refuses_features_there(tmp_path):
    n = 50
    ei = np.array([np.arange(n), (np.arange(n) + 1) % n])
    y = np.arange(n) % 3
    Data = _Data
    data = Data(edge_index=torch.from_numpy(ei), y=torch.from_numpy(y),
                train_mask=torch.from_numpy(y == 0))  # fmt: skip
    sampler = NeighborSampler(data, (2,), batch_size=4)
    g = sampler.graph
    np.testing.assert_array_equal(np.asarray(g.indices)[g.indptr[1] : g.indptr[2]], [0])  # 0 → 1
    np.testing.assert_array_equal(sampler.train, np.flatnonzero(y == 0))
    with pytest.warns(UserWarning, match="no labels") as caught:
        NeighborSampler({"edge_index": ei}, (2,), batch_size=4)
    assert any("no training split" in str(w.message) for w in caught)
    x = torch.zeros(n, 3)
    with pytest.raises(SolarError, match=r"solar.graph.write_graph\(data") as info:
        Loader(Data(x=x, edge_index=torch.from_numpy(ei)), epochs=1, buffer=1, batch_size=2)
    assert "\n" not in str(info.value)
    with pytest.raises(SolarError, match="array in memory"):
        Loader(x, epochs=1, buffer=1, batch_size=2)
    with pytest.raises(SolarError, match="takes a dict with edge_index"):
        Graph({"edge_index": ei})


def test_batches_are_pyg_data_by_one_argument(tmp_path):
    pytest.importorskip("torch_geometric")
    from torch_geometric.data import Data

    path = tmp_path / "g.h5"
    generate_graph(path, 400, 5.0, 4, seed=2, train_fraction=0.3)
    with h5py.File(path) as f:
        feats = f["features"][()]
    sampler = NeighborSampler(path, (3, 2), batch_size=32)
    with Loader(path, ["features"], sampler=sampler, epochs=1, buffer=50, rank=0, world_size=1,
                batch_format="pyg") as ld:  # fmt: skip
        for b in ld:
            assert isinstance(b, Data)
            b = b.to("cpu")
            assert b.x.numpy().tobytes() == feats[b.n_id.numpy()].tobytes()
            assert b.batch_size == b.y[: b.batch_size].shape[0] == b.num_sampled_nodes[0] <= 32
            assert b.y.shape[0] == b.num_nodes  # every sampled node's label, as PyG's
            assert sum(b.num_sampled_edges) == b.edge_index.shape[1]
            assert b.num_nodes == b.n_id.shape[0]
            assert "features" not in b and "index" not in b
    # A real Data converts as the stand-in does, and a .pt file of it too.
    with h5py.File(path) as f:
        ei = np.stack([f["indices"][()], np.repeat(np.arange(400), np.diff(f["indptr"][()]))])
    data = Data(x=torch.from_numpy(feats), edge_index=torch.from_numpy(ei.astype(np.int64)),
                y=torch.from_numpy(np.arange(400) % 3), train_idx=torch.arange(10))  # fmt: skip
    torch.save(data, tmp_path / "d.pt")
    cli_main(["convert", str(tmp_path / "d.pt"), str(tmp_path / "d.h5")])
    with h5py.File(tmp_path / "d.h5") as f, h5py.File(path) as g:
        for k in ("indptr", "indices", "features"):
            assert f[k][()].tobytes() == g[k][()].tobytes()
        np.testing.assert_array_equal(f["train_idx"][()], np.arange(10))
    with pytest.raises(SolarError, match="batch_format must be"):
        Loader(path, ["features"], sampler=sampler, epochs=1, buffer=50, batch_format="dgl",
               rank=0, world_size=1)  # fmt: skip


def test_graphsage_beats_an_mlp_on_the_generated_graph(tmp_path):
    """Labels are communities and features only weakly informative: a 2-layer GraphSAGE
    (mean aggregation, plain torch) beats an MLP on the same features by >= 10 points."""
    path = tmp_path / "g.h5"
    n = 3000
    generate_graph(path, n, 10.0, 32, seed=4, train_fraction=0.5)
    g = Graph(path)
    with h5py.File(path) as f:
        x, y = torch.from_numpy(f["features"][()]), torch.from_numpy(f["labels"][()])
        train, test = f["train_idx"][()], f["test_idx"][()]
    src = torch.from_numpy(np.asarray(g.indices, np.int64))
    dst = torch.from_numpy(np.repeat(np.arange(n), g.degree()))
    count = torch.zeros(n).index_add_(0, dst, torch.ones(dst.shape[0])).clamp(min=1)[:, None]

    class Sage(torch.nn.Module):
        def __init__(self, a, b):
            super().__init__()
            self.neigh, self.root = torch.nn.Linear(a, b), torch.nn.Linear(a, b, bias=False)

        def forward(self, h):
            mean = torch.zeros_like(h).index_add_(0, dst, h[src]) / count
            return self.neigh(mean) + self.root(h)

    def accuracy(model, gnn):
        torch.manual_seed(0)
        opt = torch.optim.Adam(model.parameters(), lr=0.02)
        for _ in range(40):
            opt.zero_grad()
            out = model[1](torch.relu(model[0](x))) if gnn else model(x)
            torch.nn.functional.cross_entropy(out[train], y[train]).backward()
            opt.step()
        with torch.no_grad():
            out = model[1](torch.relu(model[0](x))) if gnn else model(x)
            return float((out[test].argmax(1) == y[test]).float().mean())

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a few ms of work: threads would only contend
    torch.manual_seed(0)
    mlp = accuracy(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                       torch.nn.Linear(64, 8)), gnn=False)  # fmt: skip
    torch.manual_seed(0)
    sage = accuracy(torch.nn.ModuleList([Sage(32, 64), Sage(64, 8)]), gnn=True)
    torch.set_num_threads(threads)
    assert sage >= mlp + 0.10, (sage, mlp)
    assert mlp < 0.6  # the features alone are weak


def test_a_node_order_relabels_topology_rows_and_splits(tmp_path):
    """The converter's hook for a locality order: new node i is old node order[i], given as
    an array or by a function of the topology (called once, on the written CSR)."""
    r = np.random.default_rng(0)
    n = 100
    ei = r.integers(0, n, (2, 500))
    x = r.standard_normal((n, 3)).astype(np.float32)
    parts = {"edge_index": ei, "x": x, "y": np.arange(n) % 4, "train_idx": np.arange(0, n, 7)}
    order = r.permutation(n)
    calls = []
    write_graph(parts, tmp_path / "a.h5", order=order)
    write_graph(parts, tmp_path / "b.h5", order=lambda g: calls.append(g.num_edges) or order)
    assert calls == [500]
    inv = np.argsort(order)
    with h5py.File(tmp_path / "a.h5") as a, h5py.File(tmp_path / "b.h5") as b:
        assert a["features"][()].tobytes() == x[order].tobytes()
        np.testing.assert_array_equal(a["labels"][()], parts["y"][order])
        np.testing.assert_array_equal(a["train_idx"][()], np.sort(inv[parts["train_idx"]]))
        assert all(a[k][()].tobytes() == b[k][()].tobytes() for k in a)
    g = Graph(tmp_path / "a.h5")
    np.testing.assert_array_equal(
        _pairs(g.indptr, g.indices, n), np.sort(inv[ei[0]] * n + inv[ei[1]])
    )
    with pytest.raises(SolarError, match="not a permutation"):
        write_graph(parts, tmp_path / "c.h5", order=np.zeros(n, np.int64))

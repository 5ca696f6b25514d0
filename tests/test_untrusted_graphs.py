"""Graph files as they come (issue 33, causes 1-2): any integer type or byte order, and files
changed under a run, never reach the sampling kernel unchecked."""

from __future__ import annotations

import hashlib
import os
import pickle
import re
import subprocess
import sys
import tracemalloc

import h5py
import numpy as np
import pytest

from solar import Graph, NeighborSampler
from solar.config import RunConfig
from solar.errors import SolarError
from solar.graph import csr, generate_graph


@pytest.fixture(scope="module")
def graph_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("graph") / "g.h5"
    generate_graph(path, 600, 6.0, 4, seed=5, train_fraction=0.5)
    return path


def _parts(path) -> dict[str, np.ndarray]:
    with h5py.File(path) as f:
        return {k: f[k][()] for k in ("indptr", "indices", "labels", "train_idx")}


def _samples(sampler: NeighborSampler, epochs: range) -> str:
    """sha256 of every subgraph of ``epochs`` (one rank)."""
    n = sampler.graph.num_nodes
    run = RunConfig(n, 1, sampler.batch_size, 4, 0, False, sampler.draws(n, sampler.batch_size))
    h = hashlib.sha256()
    for e in epochs:
        for t in range(run.steps_per_epoch):
            sub = sampler.subgraph(run, e, t, 0)
            for a in (sub.nodes, sub.src, sub.dst):
                h.update(a.tobytes())
    return h.hexdigest()


_RUN = """
import sys, hashlib, os
import numpy as np, h5py
sys.path.insert(0, {tests!r})
from test_untrusted_graphs import _samples
from solar import NeighborSampler
path, how = sys.argv[1:]
with h5py.File(path) as f:
    start = min(f[k].id.get_offset() for k in ("indptr", "indices"))
sampler = NeighborSampler(path, (10, 5), batch_size=32)
_samples(sampler, range(1))  # the run is under way
with open(path, "r+b") as f:  # the same inode: what cp or h5py.File(path, "w") do
    if how == "rewrite":
        f.seek(start)
        f.write(np.random.default_rng(1).integers(0, 256, os.path.getsize(path) - start,
                                                  dtype=np.uint8).tobytes())
    else:
        f.truncate(start + 64)
print(_samples(sampler, range(1, 3)))
"""


@pytest.mark.parametrize("how", ["rewrite", "truncate"])
def test_a_graph_file_changed_in_place_mid_run_changes_nothing_sampled(graph_file, tmp_path, how):
    """Rewritten with random bytes, or truncated, under a running sampler: its subgraphs are
    still the original graph's (no segfault, bus error or other graph's nodes)."""
    path = tmp_path / "g.h5"
    path.write_bytes(graph_file.read_bytes())
    want = _samples(NeighborSampler(graph_file, (10, 5), batch_size=32), range(1, 3))
    script = _RUN.format(tests=str(__import__("pathlib").Path(__file__).parent))
    out = subprocess.run([sys.executable, "-c", script, str(path), how], capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    assert out.stdout.strip() == want


TYPES = [(np.uint32, np.uint32), (np.uint64, np.uint64), (">i8", ">i4"), (">u4", "<u2"),
         (np.int32, np.int64)]  # fmt: skip


def _as_files(parts: dict, directory) -> tuple:
    """The graph's parts as one HDF5 file and as a dict of .npy paths."""
    h5 = directory / "g.h5"
    with h5py.File(h5, "w") as f:
        for k, v in parts.items():
            f[k] = v
    for k, v in parts.items():
        np.save(directory / f"{k}.npy", v)
    return h5, {k: str(directory / f"{k}.npy") for k in parts}


@pytest.mark.parametrize(("indptr_type", "indices_type"), TYPES)
def test_any_integer_csr_is_converted_once_to_the_kernels_types(
    graph_file, tmp_path, indptr_type, indices_type
):
    """uint32 (the compact CSR), uint64 and big-endian parts, from HDF5, .npy or arrays: the
    same graph, sampled the same, as the native one."""
    parts = _parts(graph_file)
    want = Graph(graph_file)
    ref = _samples(NeighborSampler(want, (4, 3), batch_size=40), range(2))
    given = {**parts, "indptr": parts["indptr"].astype(indptr_type),
             "indices": parts["indices"].astype(indices_type)}  # fmt: skip
    for source in (*_as_files(given, tmp_path), given):
        g = Graph(source)
        assert g.indptr.dtype == np.int64 and g.indices.dtype in (np.int32, np.int64)
        assert np.array_equal(g.indptr, want.indptr) and np.array_equal(g.indices, want.indices)
        assert _samples(NeighborSampler(g, (4, 3), batch_size=40), range(2)) == ref


def test_a_value_no_native_type_holds_is_refused_in_one_line(tmp_path):
    indptr = np.array([0, 1, 2], np.uint64)
    indptr[1] = 2**63 + 1  # wraps negative as int64: refused, never indexed
    with pytest.raises(SolarError, match=r"decreases|start at 0|ends at") as info:
        Graph({"indptr": indptr, "indices": np.array([1, 0], np.uint64)})
    assert "\n" not in str(info.value)
    with pytest.raises(SolarError, match=r"outside 0\.\.1"):
        Graph({"indptr": np.array([0, 1, 2]), "indices": np.array([1, 2**31 + 1], np.uint32)})


@pytest.mark.parametrize("window", [None, 24])
def test_column_labels_and_splits_are_taken_from_hdf5_as_from_npy(graph_file, tmp_path,
                                                                  monkeypatch, window):  # fmt: skip
    """OGB keeps labels (and some splits) as (N, 1), some files as (1, N): accepted from every
    source alike, whether read at once or a few rows at a time (window: bytes per read)."""
    if window is not None:
        monkeypatch.setattr(csr, "_WINDOW", window)
    parts = _parts(graph_file)
    cols = {**parts, "labels": parts["labels"][:, None], "train_idx": parts["train_idx"][None]}
    for source in (*_as_files(cols, tmp_path), cols):
        g = Graph(source)
        assert np.array_equal(g.labels, parts["labels"])
        assert np.array_equal(g.train_idx, parts["train_idx"])
        assert np.array_equal(g.indptr, parts["indptr"])
        assert np.array_equal(g.indices, parts["indices"])


def test_a_hosts_copy_written_a_few_bytes_at_a_time_holds_every_part(graph_file, tmp_path,
                                                                     monkeypatch):  # fmt: skip
    """The host's copy filled a window at a time, each window's pages dropped from its writer
    as it is filled (written(): windows of 24 bytes, never page-aligned, many to a page, a
    page shared by two parts): every part there is what h5py reads, from HDF5, .npy and
    arrays, a (1, N) labels column and an (N, 1) split included."""
    monkeypatch.setattr(csr, "_WINDOW", 24)
    parts = _parts(graph_file)
    with h5py.File(graph_file) as f:
        parts["valid_idx"] = f["valid_idx"][()]
    cols = {**parts, "labels": parts["labels"][None], "valid_idx": parts["valid_idx"][:, None]}
    for source in (*_as_files(cols, tmp_path), cols):
        opened = Graph(source, defer=True)._opened
        shared, got = csr._host_copy(opened, "graph", None)
        try:
            assert sorted(got) == sorted(parts)
            for k, want in parts.items():
                assert got[k].shape == want.shape and np.array_equal(got[k], want), (source, k)
                assert not got[k].flags.writeable
        finally:
            del got
            shared.close()


def test_a_npy_part_is_read_whole_from_the_file_it_opened(tmp_path, monkeypatch):
    """A part read over several windows reads them all from one descriptor: a .npy file
    replaced by rename meanwhile (what np.save to a temporary name then mv does) is never
    read half from each (that it changed is the graph's identity check's to refuse)."""
    monkeypatch.setattr(csr, "_WINDOW", 64)
    path, other = tmp_path / "labels.npy", tmp_path / "new.npy"
    want = np.arange(100, dtype=np.int64)
    np.save(path, want)
    np.save(other, want[::-1])
    part = csr._opened(str(path), "graph labels")
    swapped = []

    def written(view: np.ndarray) -> None:
        if not swapped:
            os.replace(other, path)
            swapped.append(view.size)

    got = csr._read({"labels": part}, {"labels": np.empty(100, np.int64)}, written)["labels"]
    assert swapped == [8] and np.array_equal(got, want)


@pytest.mark.parametrize("name", ["train_idx", "valid_idx"])
def test_a_split_that_is_not_one_dimensional_is_refused_before_it_is_read(tmp_path, name):
    """A 0-d split (a scalar: an array, a 0-d .npy, an HDF5 scalar dataset) or a table of ids
    is refused in one line naming it, as check_nodes refuses such ids, never an IndexError;
    so is one of more ids than the graph has nodes, and an HDF5 dataset of no dataspace."""
    csr_ = {"indptr": np.array([0, 1, 2]), "indices": np.array([1, 0])}
    for bad in (np.int64(0), np.array([[0, 1], [1, 0]], np.int32)):
        says = rf"{name}: expected a (non-empty )?1-D integer array, got {bad.dtype} "
        says += re.escape(str(np.shape(bad)))
        h5, npys = _as_files({**csr_, name: bad}, tmp_path)
        for source in (h5, npys, {**csr_, name: bad}):
            with pytest.raises(SolarError, match=rf"^graph( {h5})?: {says}$"):
                Graph(source)
    h5, npys = _as_files({**csr_, name: np.array([1, 0, 1])}, tmp_path)
    for source in (h5, npys):
        with pytest.raises(SolarError, match=rf"{name}: 3 ids of 2 nodes: a node is listed"):
            Graph(source)
    with h5py.File(h5, "w") as f:
        f["indptr"], f["indices"] = csr_["indptr"], csr_["indices"]
        f.create_dataset(name, data=h5py.Empty("i8"))
    with pytest.raises(SolarError, match=rf"^graph {h5}: {name} holds no array") as info:
        Graph(h5)
    assert "\n" not in str(info.value)


def test_splits_are_checked_without_memory_for_the_nodes_a_file_declares(tmp_path):
    """A few KB of HDF5 can declare 2^50 nodes (chunked datasets, nothing written): its splits
    are checked for range and repeats in memory of their own size, not of the node count (a
    bitmap of 2^50 nodes is 128 TiB; tracemalloc sees numpy's allocations), and its topology
    is refused in one line by the memory check before anything of it is read, as is a split
    of more ids than memory holds."""
    from solar.graph.csr import check_nodes

    n = 2**50
    check_nodes(np.array([3, 1]), n, "w")  # (compiled before measuring)
    path = tmp_path / "huge.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("indptr", shape=(n + 1,), dtype="i8", chunks=(1024,))
        f.create_dataset("indices", shape=(2**40,), dtype="i8", chunks=(1024,))
        f["train_idx"] = np.array([0, n - 1, 3])
        f["valid_idx"] = np.array([7, 2**40])
    assert path.stat().st_size < 1 << 16
    tracemalloc.start()
    try:
        assert check_nodes(np.array([5, n - 1, 0]), n, "w").tolist() == [5, n - 1, 0]
        for ids, why in (([5, 0, 5], "listed twice"), ([0, n], "outside"), ([-1, 1], "outside")):
            with pytest.raises(SolarError, match=f"^w: .*{why}"):
                check_nodes(np.array(ids), n, "w")
        g = Graph(path, defer=True)
        assert g.num_nodes == n and g.train_idx.tolist() == [0, n - 1, 3]
        assert g.splits["valid_idx"].tolist() == [7, 2**40]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak
    with pytest.raises(SolarError, match=f"^graph {path}: its topology in memory") as info:
        Graph(path)
    assert "\n" not in str(info.value)
    with h5py.File(path, "a") as f:  # (a split as large, nothing behind it either)
        f.create_dataset("test_idx", shape=(2**44,), dtype="i8", chunks=(1024,))
    with pytest.raises(SolarError, match=f"^graph {path}: test_idx: its {2**44} ids in memory"):
        Graph(path, defer=True)


def test_a_graph_changed_before_another_process_opens_it_is_refused(graph_file, tmp_path):
    """A sampler pickled to another process reads its graph again: a different graph there is
    one line, not a batch that differs from the plan."""
    path = tmp_path / "g.h5"
    path.write_bytes(graph_file.read_bytes())
    sampler = NeighborSampler(path, (3,), batch_size=8)
    blob = pickle.dumps(sampler)
    assert _samples(pickle.loads(blob), range(1)) == _samples(sampler, range(1))
    path.unlink()
    generate_graph(path, 600, 6.0, 4, seed=6, train_fraction=0.5)
    with pytest.raises(SolarError, match=f"graph {path}: changed since it was opened") as info:
        pickle.loads(blob)
    assert "\n" not in str(info.value)


def _npy_with_header(path, header: str, data: bytes = b"\0" * 64, version: bytes = b"\x01\x00"):
    """A file that starts as a .npy file does, with ``header`` as its header's text."""
    text = header.encode("latin1")
    pad = (64 - (10 + len(text) + 1) % 64) % 64
    text += b" " * pad + b"\n"
    path.write_bytes(b"\x93NUMPY" + version + len(text).to_bytes(2, "little") + text + data)
    return path


ODD_HEADERS = {
    "a negative dimension": ("{'descr': '<i8', 'fortran_order': False, 'shape': (-4, 2), }",
                             "shape"),
    "more entries than int64 counts": (
        "{'descr': '<i8', 'fortran_order': False, 'shape': (4294967296, 4294967296), }",
        "shape"),
    "a dimension past int64 beside a zero": (
        "{'descr': '<i8', 'fortran_order': False, 'shape': (1180591620717411303424, 0), }",
        "shape"),
    "a header that does not parse": ("{'descr': '<i8', 'fortran_order': False, 'shape': (4, 2 }",
                                     "not a readable"),
    "strings": ("{'descr': '<U3', 'fortran_order': False, 'shape': (4, 2), }",
                "not an array of numbers"),
}  # fmt: skip


@pytest.mark.parametrize("case", ODD_HEADERS)
def test_odd_npy_headers_are_refused_in_one_line_by_every_npy_reader(tmp_path, case):
    """One parser of untrusted .npy headers (solar.io.npy.read_npy_header) for the Loader's
    .npy sources, the graph converter's edges, rows and splits, and a Graph's parts: each
    refuses the file in one line naming it, never crashes or reads past the file."""
    from solar.graph import write_graph
    from solar.io.sources import describe_source

    header, says = ODD_HEADERS[case]
    bad = _npy_with_header(tmp_path / "bad.npy", header)
    edges = np.array([[0, 1], [1, 0]])
    readers = {
        "loader": lambda: describe_source(bad),
        "edges": lambda: write_graph(bad, tmp_path / "g.h5", num_nodes=2),
        "rows": lambda: write_graph({"edge_index": edges}, tmp_path / "g.h5", features=bad),
        "split": lambda: write_graph({"edge_index": edges}, tmp_path / "g.h5",
                                     features=np.zeros((2, 2)), train_idx=bad),
        "graph": lambda: Graph({"indptr": bad, "indices": np.array([1, 0])}),
    }  # fmt: skip
    for name, read in readers.items():
        with pytest.raises(SolarError) as info:
            read()
        msg = str(info.value)
        assert "bad.npy" in msg and says in msg and "\n" not in msg, (name, msg)
    assert not (tmp_path / "g.h5").exists()
    # An unknown format version, and a header that ends the file, alike.
    _npy_with_header(bad, "{'descr': '<i8', 'fortran_order': False, 'shape': (4,), }",
                     version=b"\x09\x00")  # fmt: skip
    for read in readers.values():
        with pytest.raises(SolarError, match=r"bad\.npy: not a readable \.npy file"):
            read()
    bad.write_bytes(bad.read_bytes()[:20])
    for read in readers.values():
        with pytest.raises(SolarError, match=r"bad\.npy: not a readable \.npy file"):
            read()


def test_big_endian_and_fortran_npy_rows_and_edges_are_converted(tmp_path):
    """What only the graph converter takes from .npy files (the Loader serves bytes as they
    lie, so refuses them): another byte order, and (2, E) edges in Fortran order."""
    from solar.graph import write_graph

    feats = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.save(tmp_path / "x.npy", feats.astype(">f4"))
    np.save(tmp_path / "e.npy", np.asfortranarray(np.array([[0, 1, 2, 3], [1, 2, 3, 0]], ">i8")))
    write_graph(tmp_path / "e.npy", tmp_path / "g.h5", features=tmp_path / "x.npy",
                labels=np.zeros(4, np.int64), train_idx=np.arange(2))  # fmt: skip
    with h5py.File(tmp_path / "g.h5") as f:
        assert f["features"].dtype == np.float32 and f["features"].dtype.isnative
        assert f["features"][()].tobytes() == feats.tobytes()
    g = Graph(tmp_path / "g.h5")
    assert g.num_nodes == 4 and g.num_edges == 4

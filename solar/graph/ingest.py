"""A graph as users have it, in solar's graph file: :func:`write_graph` (and ``solar
convert``); the sources it takes are listed in its docstring.

:func:`topology` gives :class:`~solar.graph.neighbor.NeighborSampler` a graph from the same
in-memory forms (the CSR built in memory; features stay where the Loader reads them).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from solar.errors import SolarError
from solar.graph.csr import MASKS, Graph, as_graph
from solar.graph.csrwrite import (
    DEFAULT_MEMORY,
    GraphParts,
    Progress,
    class_labels,
    edge_block,
    memory_bytes,
    row_ranges,
    write_csr_graph,
)
from solar.graph.textedges import TextEdges, read_numbers
from solar.io.npy import read_npy_header

# Names an OGB-style directory's arrays go by (the first found wins), looked up in the
# directory and its raw/ subdirectory.
EDGE_FILES = ("edge_index.npy", "edge.npy", "edges.npy", "edge_list.npy", "edge.csv.gz",
              "edge.csv", "edges.csv", "edges.txt")  # fmt: skip
FEATURE_FILES = ("node_feat.npy", "node-feat.npy", "x.npy", "features.npy", "feat.npy")
LABEL_FILES = ("node_label.npy", "node-label.npy", "y.npy", "labels.npy", "label.npy",
               "node-label.csv.gz", "node-label.csv")  # fmt: skip
SPLIT_STEMS = {"train_idx": ("train_idx", "train"), "valid_idx": ("valid_idx", "val_idx",
               "valid", "val"), "test_idx": ("test_idx", "test")}  # fmt: skip
_TEXT = (".csv", ".txt", ".tsv", ".el", ".edges")


def write_graph(
    source: Any,
    dst: str | os.PathLike,
    *,
    features: Any = None,
    labels: Any = None,
    train_idx: Any = None,
    valid_idx: Any = None,
    test_idx: Any = None,
    num_nodes: int | None = None,
    undirected: bool = False,
    weights: str | None = None,
    memory: int | str = DEFAULT_MEMORY,
    order: Any = None,
    force: bool = False,
    progress: Progress | None = None,
) -> dict:
    """Write ``source`` to ``dst`` as solar's graph file, verified and atomically (what
    ``solar convert`` does); keyword arrays or ``.npy`` paths add or replace its parts.

    ``source`` is one of:

    * a PyTorch Geometric ``Data`` (or any object with ``edge_index``, and optionally ``x``,
      ``y``, ``train_mask``/``val_mask``/``test_mask`` or ``train_idx``/...), or a ``.pt`` file
      holding one (``torch.save(data, path)``; loaded with pickle: only files you trust);
    * a dict of the same names (``edge_index``, ``x`` or ``features``, ``y`` or ``labels``,
      masks or index arrays, ``num_nodes``), or of a CSR's ``indptr`` and ``indices``;
    * an OGB-style directory of ``.npy`` files (the arrays of OGB's node-property datasets as
      ``NodePropPredDataset`` gives them: ``edge_index.npy`` (2, E) or ``edge.npy`` (E, 2),
      ``node_feat.npy``, ``node_label.npy`` (N,) or (N, 1), ``train_idx.npy`` or
      ``split/<name>/train.npy`` and ``valid``/``test``; OGB's ``edge.csv(.gz)`` and split
      CSVs too; also in a ``raw/`` subdirectory);
    * an edge list: a ``.npy`` file of (2, E) or (E, 2) node ids, or a text file (``.csv``,
      ``.txt``, ``.tsv``, gzipped or not), read strictly (:mod:`solar.graph.textedges`): two
      integer ids a line separated by a comma or blanks, ``#``/``%`` comments and one header
      line skipped, any other line refused naming its file and line; with ``features=``,
      ``labels=`` and the splits given as arrays or ``.npy`` paths.

    Edges are source → target (PyG's ``edge_index[0]`` → ``edge_index[1]``);
    ``undirected=True`` stores both directions. Arrays in memory (numpy, torch) are read in
    blocks; files are read with ``pread`` in blocks, never memory-mapped whole, so a graph
    larger than memory converts in about ``memory`` bytes (bytes or ``"512MiB"``) plus 8 bytes
    per node (:mod:`solar.graph.csrwrite`), the pass finding the node count (when not given)
    included. Missing labels or training split: a warning (once each), since batches then have
    no ``y`` or every node seeds. ``dst`` existing is refused unless ``force``.

    ``weights``: a text edge list's third column, a weight (``"ignore"``: checked as a number
    and dropped); ``None``: two ids a line.

    ``order``: a node permutation (new id i is old node ``order[i]``) or a function of the
    written :class:`~solar.graph.csr.Graph` returning one, to relabel the nodes (e.g. for
    locality). Returns what was written (nodes, edges, features' shape and dtype, splits)."""
    dst = Path(dst)
    if dst.exists() and not force:
        raise SolarError(f"{dst}: exists (use --force to overwrite)")
    memory_bytes(memory)  # (a bad budget refused before any pass)
    parts = graph_parts(source, features=features, labels=labels, train_idx=train_idx,
                        valid_idx=valid_idx, test_idx=test_idx, num_nodes=num_nodes,
                        undirected=undirected, weights=weights, memory=memory)  # fmt: skip
    warn_missing(str(source) if isinstance(source, str | os.PathLike) else "graph",
                 parts.labels is not None, parts.splits.get("train_idx") is not None)  # fmt: skip
    if callable(order):
        order = _order_of(order, parts, dst, memory)
    return write_csr_graph(dst, parts, memory=memory, order=order, progress=progress)


def graph_parts(source: Any, **given: Any) -> GraphParts:
    """``source`` and the keyword parts as the writer's :class:`GraphParts` (``memory``: the
    budget of the pass finding the node count, ``weights``: :func:`write_graph`'s)."""
    num_nodes = given.pop("num_nodes", None)
    undirected = bool(given.pop("undirected", False))
    weights = given.pop("weights", None)
    memory = given.pop("memory", DEFAULT_MEMORY)
    found: dict[str, Any] = {}
    if isinstance(source, str | os.PathLike):
        path = Path(source)
        if path.is_dir():
            found = _ogb_dir(path)
        elif path.suffix in (".pt", ".pth"):
            found = _fields(_torch_load(path))
        elif path.suffix in (".h5", ".hdf5"):
            found = _h5_graph(path)
        elif path.suffix == ".npy" or _is_text(path):
            if not path.is_file():
                raise SolarError(f"{path}: no such file")
            found = {"edges": path}
        else:
            raise SolarError(f"{path}: not a graph source (a PyG .pt file, an OGB-style "
                             "directory, or an edge list .npy/.csv)")  # fmt: skip
    elif source is not None:
        found = _fields(source)
    for k, v in given.items():
        if v is not None:
            found["features" if k == "features" else k] = v
    if "edges" not in found:
        raise SolarError("graph: no edges (give edge_index, a CSR's indptr and indices, or an "
                         "edge list file)")  # fmt: skip
    feats = rows_of(found["features"], "features") if found.get("features") is not None else None
    labs = rows_of(found["labels"], "labels") if found.get("labels") is not None else None
    if num_nodes is None:
        num_nodes = found.get("num_nodes")
    if num_nodes is None:
        num_nodes = (
            feats.shape[0] if feats is not None else labs.shape[0] if labs is not None else None
        )
    edges = edges_of(found["edges"], None if num_nodes is None else int(num_nodes),
                     weights=weights, memory=memory)  # fmt: skip
    splits = {k: _index(found[k], k) for k in SPLIT_STEMS if found.get(k) is not None}
    return GraphParts(edges, feats, labs, splits, undirected)


def warn_missing(where: str, labels: bool, train: bool) -> None:
    """Warn (once per kind and process, :mod:`warnings`' default) of a graph without labels or
    without a training split."""
    if not labels:
        warnings.warn(f"{where}: the graph has no labels: batches carry no 'y'",
                      stacklevel=3)  # fmt: skip
    if not train:
        warnings.warn(f"{where}: the graph has no training split: every node is a seed",
                      stacklevel=3)  # fmt: skip


def is_graph_source(path: str | os.PathLike) -> bool:
    """Whether ``solar convert`` should read ``path`` as a graph: a ``.pt`` file, an edge list
    text file, or a directory holding an OGB-style edge file."""
    p = Path(path)
    if p.is_dir():
        return any(_find(p, (name,)) is not None for name in EDGE_FILES)
    if p.suffix in (".h5", ".hdf5") and p.is_file():
        import h5py

        try:
            with h5py.File(p, "r") as f:
                return "indptr" in f and "indices" in f
        except OSError:
            return False
    return p.suffix in (".pt", ".pth") or _is_text(p)


# -- in-memory topology ------------------------------------------------------------------------
def topology(graph: Any, comm: Any = None, defer: bool = False) -> Graph:
    """A :class:`Graph` from what :class:`~solar.graph.neighbor.NeighborSampler` is given: a
    Graph, a path, a dict of CSR parts, or an in-memory PyG ``Data`` / dict with
    ``edge_index`` (the CSR by target built here; its ``y`` and splits, as masks or indices,
    come along, its features do not: the Loader reads them from a file). ``comm``: a path or
    CSR parts are held once per host of its job (:class:`Graph`); ``defer``: read when the
    Loader passes its communicator (:meth:`Graph.hold`), or when first used."""
    if isinstance(graph, Graph | str | os.PathLike):
        return as_graph(graph, comm, defer)
    if isinstance(graph, Mapping) and "edge_index" not in graph:
        return as_graph(graph, comm, defer)
    if not (isinstance(graph, Mapping) or hasattr(graph, "edge_index")):
        raise SolarError(f"graph: expected a path, a Graph, a PyG Data or a dict with "
                         f"edge_index or indptr/indices, got {type(graph).__name__}")  # fmt: skip
    f = _fields(graph)
    n = f.get("num_nodes")
    ei = _int_array(f["edges"], "edge_index")
    if ei.ndim != 2 or ei.shape[0] != 2:
        raise SolarError(f"graph: edge_index must be (2, E), got {ei.shape}")
    if n is None:
        n = int(ei.max()) + 1 if ei.size else 1
        for k in ("features", "labels"):
            if f.get(k) is not None and hasattr(f[k], "shape"):
                n = int(f[k].shape[0])
    n = int(n)
    if ei.size and (ei.min() < 0 or ei.max() >= n):
        raise SolarError(f"graph: edge_index names nodes outside 0..{n - 1}")
    src, dst = ei[0], ei[1]
    order = np.argsort(dst, kind="stable")
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    parts: dict[str, Any] = {"indptr": indptr, "indices": src[order]}
    if f.get("labels") is not None:
        parts["labels"] = class_labels(_numpy(f["labels"]))
    for k in SPLIT_STEMS:
        if f.get(k) is not None:
            parts[k] = _index(f[k], k)
    return Graph(parts, comm, defer=defer)


# -- reading what users have -------------------------------------------------------------------
def _fields(obj: Any) -> dict[str, Any]:
    """The parts of a PyG ``Data``-like object or a dict, by solar's names."""
    get = obj.get if isinstance(obj, Mapping) else (lambda k: getattr(obj, k, None))
    if not isinstance(obj, Mapping) and not hasattr(obj, "edge_index"):
        raise SolarError(f"graph: a {type(obj).__name__} has no edge_index (expected a PyG Data "
                         "or a dict)")  # fmt: skip
    out: dict[str, Any] = {}
    if get("edge_index") is not None:
        out["edges"] = get("edge_index")
    elif get("indptr") is not None and get("indices") is not None:
        out["edges"] = Graph({"indptr": get("indptr"), "indices": get("indices")})
    for name, keys in (("features", ("x", "features", "node_feat")),
                       ("labels", ("y", "labels", "node_label"))):  # fmt: skip
        for k in keys:
            if get(k) is not None:
                out[name] = get(k)
                break
    for name, stems in SPLIT_STEMS.items():
        for k in (*stems, MASKS[name]):
            if get(k) is not None:
                out[name] = get(k)
                break
    n = get("num_nodes")
    if n is not None:
        out["num_nodes"] = int(n)
    return out


def _h5_graph(path: Path) -> dict[str, Any]:
    """A graph file (solar's, or chunked / compressed / reordered alike) as parts: its CSR
    memory-mapped or read, its rows read by blocks through h5py."""
    import h5py

    graph = Graph(path)
    f = h5py.File(path, "r")  # kept open by the datasets read below, closed with them
    out: dict[str, Any] = {"edges": graph, "num_nodes": graph.num_nodes}
    for name in ("features", "labels"):
        if name in f:
            out[name] = f[name]
    for name in SPLIT_STEMS:
        if name in f:
            out[name] = f[name][()]
    return out


def _torch_load(path: Path) -> Any:
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise SolarError(f"{path}: not a readable torch file ({type(exc).__name__}: {exc})"
                         ) from None  # fmt: skip


def _ogb_dir(root: Path) -> dict[str, Any]:
    found: dict[str, Any] = {}
    edges = _find(root, EDGE_FILES)
    if edges is None:
        raise SolarError(f"{root}: no edge file (one of {', '.join(EDGE_FILES)}) in it or raw/")
    found["edges"] = edges
    for name, files in (("features", FEATURE_FILES), ("labels", LABEL_FILES)):
        got = _find(root, files)
        if got is not None:
            found[name] = got
    nn = _find(root, ("num_nodes.npy", "num-node-list.csv.gz", "num-node-list.csv"))
    if nn is not None:
        found["num_nodes"] = int(np.asarray(_small(nn)).reshape(-1)[0])
    for name, stems in SPLIT_STEMS.items():
        names = tuple(f"{s}{ext}" for s in stems for ext in (".npy", ".csv.gz", ".csv"))
        got = _find(root, names, splits=True)
        if got is not None:
            found[name] = _small(got)
    return found


def _find(root: Path, names: tuple[str, ...], splits: bool = False) -> Path | None:
    dirs = [root, root / "raw"]
    if splits:
        for base in (root, root / "raw"):
            s = base / "split"
            if s.is_dir():
                dirs += [s, *sorted(p for p in s.iterdir() if p.is_dir())]
    for d in dirs:
        for name in names:
            if (d / name).is_file():
                return d / name
    return None


def _small(path: Path, labels: bool = False) -> np.ndarray:
    """A small array (a split, a count, labels) read whole: an ``.npy`` file, or a text file
    of one column (:func:`~solar.graph.textedges.read_numbers`, node ids or ``labels``)."""
    if path.suffix == ".npy":
        read_npy_header(path)  # (an odd header: refused in one line, as by every .npy reader)
        try:
            return np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise SolarError(f"{path}: not a readable .npy file ({exc})") from None
    return read_numbers(path, labels)


def rows_of(value: Any, name: str) -> Any:
    """A row source (:class:`~solar.graph.csrwrite.RowSource`) for an array, a tensor or an
    ``.npy`` path."""
    if isinstance(value, str | os.PathLike):
        path = Path(value)
        if path.suffix == ".npy":
            return NpyRows(path)
        if _is_text(path) and name == "labels":
            return ArrayRows(_small(path, labels=True), name)
        if _is_text(path):  # (a text file is read as one column: a row of several is refused)
            raise SolarError(f"{name}: {path}: give rows of several numbers as an .npy file")
        raise SolarError(f"{name}: {path} is not an .npy file")
    return ArrayRows(value, name)


def edges_of(
    value: Any,
    num_nodes: int | None,
    *,
    weights: str | None = None,
    memory: int | str = DEFAULT_MEMORY,
) -> Any:
    """An edge source for a (2, E) or (E, 2) array or tensor, an .npy or text edge list, or a
    :class:`Graph`; ``num_nodes`` found by a pass over the ids (in blocks the ``memory``
    budget holds) if not given. ``weights``: a text edge list's weight column."""
    text = isinstance(value, str | os.PathLike) and Path(value).suffix != ".npy"
    if weights is not None and not text:
        raise SolarError(f"weights={weights!r}: only a text edge list has a weight column")
    if isinstance(value, Graph):
        src: Any = CsrEdges(value)
    elif isinstance(value, str | os.PathLike):
        path = Path(value)
        src = TextEdges(path, weights) if text else NpyEdges(path)
    else:
        src = ArrayEdges(value)
    if num_nodes is None:
        num_nodes = src.num_nodes if getattr(src, "num_nodes", None) else (
            _max_id(src, edge_block(memory_bytes(memory))) + 1)  # fmt: skip
    src.num_nodes = int(num_nodes)
    return src


def _max_id(src: Any, block: int) -> int:
    top = -1
    for s, d in src.chunks(block):
        s, d = np.asarray(s), np.asarray(d)
        if s.size:
            top = max(top, int(s.max()), int(d.max()))
    if top < 0:
        raise SolarError(f"{src.where}: no edges and no node count (give num_nodes)")
    return top


class ArrayRows:
    """Rows of an in-memory array or tensor (or a memory map) read by slices."""

    def __init__(self, a: Any, name: str) -> None:
        if not hasattr(a, "shape"):
            a = np.asarray(a)
        if len(a.shape) < 1:
            raise SolarError(f"{name}: expected an array of rows, got a scalar")
        self.a, self.shape = a, tuple(int(x) for x in a.shape)
        self.dtype = _np_dtype(a)

    def read(self, lo: int, hi: int) -> np.ndarray:
        return _numpy(self.a[lo:hi])

    def take(self, ids: np.ndarray) -> np.ndarray:
        return _numpy(self.a[ids])


class NpyRows:
    """Rows of an ``.npy`` file read with ``pread`` (not mapped: a file larger than memory is
    read in blocks without growing the process)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        h = read_npy_header(path)  # (another byte order is converted as the rows are written)
        self.shape, self.dtype, self.offset = h.shape, h.dtype, h.offset
        if h.fortran and len(self.shape) > 1:
            raise SolarError(f"{path}: Fortran-ordered rows (save it C-ordered)")
        if not self.shape:
            raise SolarError(f"{path}: a scalar, not rows")
        self.row = self.dtype.itemsize * int(np.prod(self.shape[1:], dtype=np.int64))

    def read(self, lo: int, hi: int) -> np.ndarray:
        out = np.empty((hi - lo, *self.shape[1:]), self.dtype)
        _pread_into(self.path, out, self.offset + lo * self.row)
        return out

    def take(self, ids: np.ndarray) -> np.ndarray:
        a = np.load(self.path, mmap_mode="r", allow_pickle=False)
        return np.asarray(a[ids])


class ArrayEdges:
    """Edges of a (2, E) or (E, 2) array or tensor (a (2, 2) one is taken as (2, E))."""

    where = "edge_index"

    def __init__(self, a: Any) -> None:
        if not hasattr(a, "shape"):
            a = np.asarray(a)
        shape = tuple(a.shape)
        if len(shape) != 2 or 2 not in shape:
            raise SolarError(f"edge_index: expected (2, E) or (E, 2) node ids, got {shape}")
        self.a, self.pairs = a, shape[0] != 2
        self.num_edges = shape[0] if self.pairs else shape[1]
        self.num_nodes: int | None = None

    def chunks(self, size: int, lo: int = 0, hi: int | None = None):
        for a in range(0, self.num_edges, size):
            b = min(a + size, self.num_edges)
            if self.pairs:
                block = _numpy(self.a[a:b])
                yield block[:, 0], block[:, 1]
            else:
                yield _numpy(self.a[0, a:b]), _numpy(self.a[1, a:b])

    def degrees(self) -> None:
        return None


class NpyEdges:
    """Edges of an ``.npy`` file of (2, E) or (E, 2) ids, read with ``pread`` in blocks."""

    def __init__(self, path: Path) -> None:
        self.where = str(path)
        h = read_npy_header(path)
        shape, self.dtype, self.offset = h.shape, h.dtype, h.offset
        if len(shape) != 2 or 2 not in shape or not np.issubdtype(self.dtype, np.integer):
            raise SolarError(f"{path}: expected (2, E) or (E, 2) integer node ids, got "
                             f"{self.dtype} {shape}")  # fmt: skip
        self.path = path
        self.num_edges = shape[1] if shape[0] == 2 else shape[0]
        # Whether each edge's two ids are adjacent in the file: (E, 2) in C order, (2, E) in F.
        self.interleaved = (shape[0] != 2) != h.fortran
        self.num_nodes: int | None = None

    def chunks(self, size: int, lo: int = 0, hi: int | None = None):
        """(src, dst) arrays of at most ``size`` edges, reused: each pair is valid until the
        next is asked for (one block's worth in memory, not two)."""
        item, e = self.dtype.itemsize, self.num_edges
        size = max(1, min(int(size), e))
        src, dst = np.empty(size, self.dtype), np.empty(size, self.dtype)
        block = np.empty((size, 2), self.dtype) if self.interleaved else None
        for a in range(0, e, size):
            k = min(a + size, e) - a
            if block is not None:
                _pread_into(self.path, block[:k], self.offset + 2 * a * item)
                src[:k], dst[:k] = block[:k, 0], block[:k, 1]
            else:
                _pread_into(self.path, src[:k], self.offset + a * item)
                _pread_into(self.path, dst[:k], self.offset + (e + a) * item)
            yield src[:k], dst[:k]

    def degrees(self) -> None:
        return None


class CsrEdges:
    """Edges of a :class:`Graph` (sources = ``indices``, targets = the rows), by row blocks."""

    def __init__(self, graph: Graph) -> None:
        self.graph, self.where = graph, graph.where
        self.num_nodes: int | None = graph.num_nodes
        self.num_edges = graph.num_edges

    def chunks(self, size: int, lo: int = 0, hi: int | None = None):
        indptr = np.asarray(self.graph.indptr)
        stop = self.graph.num_nodes if hi is None else hi
        for a, b in row_ranges(indptr, size):
            if b <= lo or a >= stop:
                continue
            rows = np.repeat(np.arange(a, b, dtype=np.int64), np.diff(indptr[a : b + 1]))
            yield np.asarray(self.graph.indices[indptr[a] : indptr[b]]), rows

    def degrees(self) -> np.ndarray:
        return self.graph.degree()


def _order_of(fn: Any, parts: GraphParts, dst: Path, memory: int | str) -> np.ndarray:
    """Call ``fn`` on the graph's topology (written beside ``dst`` for the call, then removed)."""
    tmp = dst.with_name(f".{dst.name}.topology.h5")
    try:
        write_csr_graph(tmp, GraphParts(parts.edges, undirected=parts.undirected), memory=memory)
        order = np.asarray(fn(Graph(tmp)), np.int64)
    finally:
        tmp.unlink(missing_ok=True)
    return order


# -- files -------------------------------------------------------------------------------------
def _pread_into(path: Path, out: np.ndarray, offset: int) -> None:
    view = out.data.cast("B")
    fd = os.open(path, os.O_RDONLY)
    try:
        done = 0
        while done < view.nbytes:
            got = os.preadv(fd, [view[done:]], offset + done)
            if got <= 0:
                raise SolarError(f"{path}: short read at byte {offset + done}")
            done += got
    finally:
        os.close(fd)


def _is_text(path: Path) -> bool:
    suffixes = path.suffixes
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    return bool(suffixes) and suffixes[-1] in _TEXT


def _np_dtype(a: Any) -> np.dtype:
    if isinstance(a, np.ndarray):
        return a.dtype
    dt = getattr(a, "dtype", None)
    if dt is not None and not isinstance(dt, np.dtype):  # a torch dtype
        import torch

        return np.dtype(torch.empty(0, dtype=dt).numpy().dtype)
    return np.dtype(dt) if dt is not None else np.asarray(a).dtype


def _numpy(a: Any) -> np.ndarray:
    if isinstance(a, np.ndarray):
        return a
    if hasattr(a, "detach"):
        return a.detach().cpu().numpy()
    return np.asarray(a)


def _int_array(a: Any, name: str) -> np.ndarray:
    v = _numpy(a)
    if not np.issubdtype(v.dtype, np.integer):
        raise SolarError(f"{name}: node ids must be integers, got {v.dtype}")
    return v.astype(np.int64, copy=False)


def _index(value: Any, name: str) -> np.ndarray:
    """A split as node ids: an index array, or a boolean mask over the nodes."""
    if isinstance(value, str | os.PathLike):
        value = _small(Path(value))
    a = _numpy(value)
    if a.dtype == np.bool_:
        return np.flatnonzero(a.reshape(-1)).astype(np.int64)
    if not np.issubdtype(a.dtype, np.integer):
        raise SolarError(f"{name}: expected node ids or a boolean mask, got {a.dtype}")
    return a.reshape(-1).astype(np.int64)


def convert_graph(
    src: str | os.PathLike, dst: str | os.PathLike, *, splits: tuple[str, ...] = (), **kw: Any
) -> dict:
    """``solar convert`` of a graph: :func:`write_graph` with splits given as ``name=file``
    (``train``, ``valid``, ``test``, with or without ``_idx``)."""
    names = {"train": "train_idx", "valid": "valid_idx", "val": "valid_idx", "test": "test_idx"}
    for item in splits:
        name, eq, path = item.partition("=")
        key = names.get(name.removesuffix("_idx"))
        if not eq or key is None:
            raise SolarError(f"--split {item!r}: expected train=FILE, valid=FILE or test=FILE")
        kw[key] = path
    return write_graph(src, dst, **kw)

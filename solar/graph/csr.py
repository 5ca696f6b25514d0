"""A graph's topology in CSR, memory-mapped where it can be, validated before use.

``indptr`` (N + 1,) and ``indices`` (E,) say that node v's neighbours are
``indices[indptr[v]:indptr[v + 1]]`` (for a PyG ``NeighborLoader`` user: the nodes whose
messages reach v, i.e. CSC of ``edge_index`` with edges source → target). ``labels`` (N,) and
``train_idx`` are optional. A graph comes from one HDF5 file (datasets ``indptr``,
``indices``, ``labels``, ``train_idx``: what ``solar gen --preset graph`` writes), or from a
dict of arrays or ``.npy`` paths (an OGB-style graph as it is, no conversion).

Contiguous HDF5 datasets and ``.npy`` files are memory-mapped: a graph of 10^9 edges costs no
read at start-up beyond the validation pass. Everything read from disk is untrusted: indptr
must start at 0, never decrease and end at E; indices must name nodes; labels and the
training split must fit N. A bad graph is refused with one line naming the file and dataset.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from numba import njit

from solar.errors import SolarError

PARTS = ("indptr", "indices", "labels", "train_idx")


class Graph:
    """A validated CSR graph (see the module's docstring).

    ``Graph(path)``: an HDF5 file holding ``indptr`` and ``indices`` (and optionally
    ``labels``, ``train_idx``); ``Graph({"indptr": ..., "indices": ..., ...})``: arrays or
    ``.npy`` paths, memory-mapped. The arrays are read-only views.
    """

    def __init__(self, source: str | os.PathLike | Mapping[str, Any]) -> None:
        self._source = source
        if isinstance(source, Mapping):
            unknown = set(source) - set(PARTS)
            if unknown:
                hint = ""
                if "edge_index" in unknown:  # PyG's form: the sampler or the converter take it
                    hint = ": NeighborSampler takes a dict with edge_index; write_graph a file"
                raise SolarError(f"graph: unknown parts {sorted(unknown)} (expected {PARTS}){hint}")
            self.where = "graph"
            parts = {k: _array(v, f"graph {k}") for k, v in source.items() if v is not None}
        else:
            self.where = f"graph {source}"
            parts = _from_hdf5(Path(source))
        for need in ("indptr", "indices"):
            if need not in parts:
                raise SolarError(f"{self.where}: no {need!r}")
        self.indptr, self.indices = parts["indptr"], parts["indices"]
        self.labels: np.ndarray | None = parts.get("labels")
        self.train_idx: np.ndarray | None = parts.get("train_idx")
        self.num_nodes = check_csr(self.indptr, self.indices, self.where)
        self.num_edges = int(self.indices.shape[0])
        if self.labels is not None:
            self.labels = _node_array(self.labels, self.num_nodes, f"{self.where}: labels")
        if self.train_idx is not None:
            self.train_idx = check_nodes(self.train_idx, self.num_nodes, f"{self.where}: train_idx")
        self._digest: str | None = None

    @property
    def identity(self) -> str:
        """sha256 of the topology (indptr and indices): what a plan's fingerprint records."""
        if self._digest is None:
            h = hashlib.sha256()
            for a in (self.indptr, self.indices):
                h.update(str(a.dtype).encode())
                for lo in range(0, a.shape[0], 1 << 24):  # bounded memory for a mapped array
                    h.update(np.ascontiguousarray(a[lo : lo + (1 << 24)]).tobytes())
            self._digest = h.hexdigest()
        return self._digest

    def degree(self) -> np.ndarray:
        """(N,) int64 number of neighbours of every node."""
        return np.diff(self.indptr).astype(np.int64)

    def __getstate__(self) -> dict:
        # A mapped graph is mapped again in the new process, not copied through a pipe.
        if isinstance(self._source, Mapping):
            return dict(self.__dict__)
        return {"_source": self._source, "_digest": self._digest}

    def __setstate__(self, state: dict) -> None:
        if "indptr" in state:
            self.__dict__.update(state)
            return
        self.__init__(state["_source"])  # type: ignore[misc]
        self._digest = state["_digest"]


def as_graph(graph: Graph | str | os.PathLike | Mapping[str, Any]) -> Graph:
    """``graph`` as a :class:`Graph` (a path or a dict of parts is opened)."""
    return graph if isinstance(graph, Graph) else Graph(graph)


def check_csr(indptr: np.ndarray, indices: np.ndarray, where: str) -> int:
    """Refuse a CSR that is not one (one line naming ``where``); return its node count."""
    for name, a in (("indptr", indptr), ("indices", indices)):
        if a.ndim != 1 or not np.issubdtype(a.dtype, np.integer):
            raise SolarError(f"{where}: {name} must be a 1-D integer array, got {a.dtype} "
                             f"{a.shape}")  # fmt: skip
    if indptr.shape[0] < 2:
        raise SolarError(f"{where}: indptr needs N + 1 >= 2 entries, got {indptr.shape[0]}")
    n, e = indptr.shape[0] - 1, indices.shape[0]
    bad = _csr_problem(indptr, indices, n)
    if bad == 1:
        raise SolarError(f"{where}: indptr must start at 0, got {int(indptr[0])}")
    if bad == 2:
        raise SolarError(f"{where}: indptr decreases (not a CSR row pointer)")
    if bad == 3:
        raise SolarError(f"{where}: indptr ends at {int(indptr[-1])}, but indices has {e} entries")
    if bad == 4:
        raise SolarError(f"{where}: indices name nodes outside 0..{n - 1}")
    return int(n)


@njit(cache=True, nogil=True)
def _csr_problem(indptr, indices, n):  # pragma: no cover - compiled
    """0 if ``indptr``/``indices`` are a CSR of ``n`` nodes, else the first problem's code."""
    if indptr[0] != 0:
        return 1
    for v in range(n):
        if indptr[v + 1] < indptr[v]:
            return 2
    if indptr[n] != indices.shape[0]:
        return 3
    for j in range(indices.shape[0]):
        if indices[j] < 0 or indices[j] >= n:
            return 4
    return 0


def check_nodes(ids: Any, n: int, where: str) -> np.ndarray:
    """``ids`` as distinct int64 node ids of a graph of ``n`` nodes, or a one-line refusal."""
    a = np.asarray(ids)
    if a.ndim != 1 or a.size == 0 or not np.issubdtype(a.dtype, np.integer):
        raise SolarError(f"{where}: expected a non-empty 1-D integer array, got {a.dtype} "
                         f"{a.shape}")  # fmt: skip
    a = a.astype(np.int64)
    if a.min() < 0 or a.max() >= n:
        raise SolarError(f"{where}: node ids outside 0..{n - 1}")
    if np.unique(a).size != a.size:
        raise SolarError(f"{where}: a node is listed twice")
    return a


def _node_array(a: np.ndarray, n: int, where: str) -> np.ndarray:
    if a.ndim != 1 or a.shape[0] != n or not np.issubdtype(a.dtype, np.integer):
        raise SolarError(f"{where}: expected {n} integer labels, got {a.dtype} {a.shape}")
    return a


def _array(value: Any, where: str) -> np.ndarray:
    if isinstance(value, str | os.PathLike):
        try:
            value = np.load(Path(value), mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise SolarError(f"{where}: {value} is not a readable .npy file ({exc})") from None
    a = value if isinstance(value, np.ndarray) else np.asarray(value)  # (a memmap stays one)
    if a.ndim == 2 and 1 in a.shape:  # OGB keeps labels as (N, 1)
        a = a.reshape(-1)
    return a


def _from_hdf5(path: Path) -> dict[str, np.ndarray]:
    """The parts an HDF5 file holds: contiguous datasets memory-mapped, others read."""
    import h5py

    out: dict[str, np.ndarray] = {}
    try:
        with h5py.File(path, "r") as f:
            for name in PARTS:
                if name not in f:
                    continue
                d = f[name]
                if not isinstance(d, h5py.Dataset):
                    raise SolarError(f"graph {path}: {name} is not a dataset")
                out[name] = _mapped(path, d)
    except OSError as exc:
        raise SolarError(f"graph {path}: not a readable HDF5 file ({exc})") from None
    return out


def _mapped(path: Path, d: Any) -> np.ndarray:
    offset = d.id.get_offset()
    if (d.chunks is None and offset is not None and d.dtype.isnative and d.size
            and np.issubdtype(d.dtype, np.integer)):  # fmt: skip
        try:
            return np.memmap(path, d.dtype, "r", offset=offset, shape=d.shape)
        except ValueError:
            raise SolarError(f"graph {path}: {d.name} lies beyond the end of the file") from None
    out = d[()]
    if out.ndim == 2 and 1 in out.shape:
        out = out.reshape(-1)
    return out

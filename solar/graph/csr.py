"""A graph's topology in CSR, read once into private memory and validated there.

``indptr`` (N + 1,) and ``indices`` (E,) say that node v's neighbours are
``indices[indptr[v]:indptr[v + 1]]`` (for a PyG ``NeighborLoader`` user: the nodes whose
messages reach v, i.e. CSC of ``edge_index`` with edges source → target). ``labels`` (N,) and
the splits ``train_idx``, ``valid_idx``, ``test_idx`` are optional. A graph comes from one
HDF5 file (datasets ``indptr``, ``indices``, ``labels`` and the splits: what ``solar gen
--preset graph`` and ``write_graph`` write), or from a dict of arrays or ``.npy`` paths (an
OGB-style graph as it is, no conversion).

The parts are read (not memory-mapped) into private arrays of the types the kernels take
(``indptr`` int64, ``indices`` int32 or int64: uint32, uint64 or big-endian as stored are
converted once), and validated there: no later change of the files (rewritten in place,
truncated) can reach a kernel, which may thus index them unchecked (measured, issue 33: the
copy costs its memory, checked first, and a read; a mapped topology checked in the kernel would
still fault on a truncated file). Given the job's communicator, a host of several ranks holds one
such copy (issue 48: 2.2 GB at 3·10^7 nodes, per rank before): read and validated by its local
rank 0 into a memfd then sealed against any write (solar/host/sealed.py), mapped read-only by
every rank of the host; no process can change those bytes after the check, so the kernels stay
bounds-safe. Every split is read and checked when the graph is opened, but only the seeds'
(``train_idx``) is kept: the others, read from files, are read again (and checked) at first use
-- a NeighborSampler's :meth:`~solar.graph.neighbor.NeighborSampler.bind`, which its Loader
calls --, so a planner's process never holds them. A graph opened with ``defer`` reads the
topology when :meth:`Graph.hold` is given the communicator (a NeighborSampler's, in a job of
several ranks a host: its Loader's, by default) or when first used (privately). Everything read
is untrusted: indptr must start at 0, never decrease and end at E; indices must name nodes;
labels and the splits must fit N (an (N, 1) column, as OGB keeps labels, from any source), a
split being a 1-D array naming no node twice, refused before it is read if its shape cannot be
one. A bad graph is refused with one line naming the file and dataset.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from numba import njit

from solar._memory import require_memory
from solar.errors import SolarError
from solar.host.region import layout
from solar.host.sealed import SealedBytes, host_sealed, host_shares
from solar.io.identity import FileChanged, Identities
from solar.io.npy import read_npy_header
from solar.launch import ranks_here

SPLITS = ("train_idx", "valid_idx", "test_idx")
BULK = ("indptr", "indices", "labels")  # what a host holds once (the splits: every rank)
PARTS = (*BULK, *SPLITS)
# A split's name in a batch (PyG's: a boolean mask over the batch's nodes), and its bit in
# Graph.split_bits.
MASKS = {"train_idx": "train_mask", "valid_idx": "val_mask", "test_idx": "test_mask"}


class Graph:
    """A validated CSR graph (see the module's docstring).

    ``Graph(path)``: an HDF5 file holding ``indptr`` and ``indices`` (and optionally
    ``labels``, ``train_idx``, ``valid_idx``, ``test_idx``); ``Graph({"indptr": ..., "indices":
    ..., ...})``: arrays or ``.npy`` paths. The arrays are private, read-only copies: ``indptr``
    int64, ``indices`` int32 (int64 when N or the stored type needs it), any byte order or
    integer type converted once, then validated. ``splits``: the splits present, by name;
    ``split_bits`` (N,) uint8, bit i set where node v is in the i-th of :data:`SPLITS` (None
    without splits): what a batch's masks are sliced from, one byte per node.

    ``comm`` (the job's communicator; a collective of its ranks): where a host runs several
    ranks, the parts are read and validated once per host into a sealed memfd that each of its
    ranks maps read-only (``shared``, solar/host/sealed.py), not copied into every rank.
    ``defer``: only the splits are read now; ``indptr``, ``indices`` and ``labels`` by
    :meth:`hold` (given the communicator then) or when first used: outside a Loader in a job
    of several ranks a host, a private read at first use, so a bad graph's errors appear then.
    The files' identities (solar/io/identity.py) are recorded when the graph is opened and
    compared when the rest is read: a file changed in between (rewritten in place, even with
    the same shapes) is refused in one line naming it, "changed since it was opened".
    """

    def __init__(self, source: str | os.PathLike | Mapping[str, Any], comm: Any = None,
                 *, defer: bool = False) -> None:  # fmt: skip
        self._source = source
        opened: Callable[[Callable[[dict[str, _Part]], Any]], Any]
        if isinstance(source, Mapping):
            unknown = set(source) - set(PARTS)
            if unknown:
                hint = ""
                if "edge_index" in unknown:  # PyG's form: the sampler or the converter take it
                    hint = ": NeighborSampler takes a dict with edge_index; write_graph a file"
                raise SolarError(f"graph: unknown parts {sorted(unknown)} (expected {PARTS}){hint}")
            self.where = "graph"

            def opened(load: Callable[[dict[str, _Part]], Any]) -> Any:
                return load({k: _opened(v, f"graph {k}") for k, v in source.items()
                             if v is not None})  # fmt: skip
        else:
            self.where = f"graph {source}"

            def opened(load: Callable[[dict[str, _Part]], Any]) -> Any:
                return _from_hdf5(Path(source), load)

        self._opened = opened
        self._lock = threading.Lock()
        # The files' identities now, before the splits are read: the topology read later
        # (deferred, or by another process of the host) must come from the same bytes, which
        # equal shapes alone do not show (a file rewritten in place).
        self._files: Identities | None = _identities(source)
        # The splits now, each read and checked in turn (a bad one refused here), the rest by
        # hold(). The seeds' split is kept; the others, read from files, are let go and read
        # again at first use (:attr:`splits`: a batch's masks), so that a planner's process
        # never holds them (issue 48: 160 MB at 10^8 nodes with 10^7 each in valid and test).
        self._kinds, self._splits = opened(self._splits_read)
        self._unchanged()  # (and not rewritten while its splits were read)
        self.num_nodes = int(self._kinds["indptr"][0][0] - 1)
        self.num_edges = int(self._kinds["indices"][0][0])
        if "labels" in self._kinds:
            _node_array(self._kinds["labels"], self.num_nodes, f"{self.where}: labels")
        self._later = tuple(k for k in SPLITS if k in self._kinds and k not in self._splits)
        self.train_idx: np.ndarray | None = self._splits.get("train_idx")
        # (N bytes: made when a batch's masks are first sliced, never by a planner's process)
        self._split_bits: np.ndarray | None = None
        self.shared: SealedBytes | None = None
        self._bulk: dict[str, np.ndarray] | None = None
        self._digest: str | None = None
        if not defer:
            self.hold(comm)

    def _splits_read(self, parts: dict[str, _Part]) -> tuple[dict, dict[str, np.ndarray]]:
        """The parts' kinds and the splits kept now (each checked: the others let go)."""
        kinds = _kinds(parts, self.where)
        src = self._source

        def kept(name: str) -> bool:
            # (a split given in memory is kept: read again, it could be the caller's changes)
            return name == "train_idx" or (
                isinstance(src, Mapping) and not isinstance(src[name], str | os.PathLike)
            )

        names = tuple(k for k in SPLITS if k in parts)
        return kinds, _splits_checked(parts, kinds, names, self.where, kept)

    @property
    def splits(self) -> dict[str, np.ndarray]:
        """The splits present, by name: distinct int64 node ids, read-only (those not kept
        when the graph was opened read again now: :meth:`read_splits`)."""
        self.read_splits()
        return self._splits

    def read_splits(self) -> None:
        """Read again, from its unchanged files, and check the splits not kept when the graph
        was opened (a Loader's sampler does it when bound, :meth:`NeighborSampler.bind`)."""
        if self._later:
            with self._lock:
                if self._later:
                    names = self._later
                    again = self._bulk_opened(
                        lambda parts: _splits_checked(parts, self._kinds, names, self.where),
                        names)  # fmt: skip
                    self._splits = {**self._splits, **again}
                    self._later = ()

    def hold(self, comm: Any = None) -> None:
        """Read the topology (``indptr``, ``indices``, ``labels``) now if it is not yet held:
        once per host into a sealed memfd mapped read-only by each of its ranks where ``comm``
        (the job's communicator) runs several ranks on a host -- a collective of its ranks,
        which all join if any has not read it yet --, else into private memory. A graph made
        with ``defer=True`` (a NeighborSampler's, in a job of several ranks a host, until its
        Loader passes the job's communicator) is held by this call or read privately when
        first used."""
        if comm is not None and host_shares(comm):
            # Every rank's own files checked (its splits came from them), the verdict shared:
            # no rank leaves the collective alone.
            stale = self._changed() if self._bulk is None else None
            states = comm.allgather((self._bulk is None, stale))
            if not any(need for need, _ in states):
                return
            for _, why in states:
                if why is not None:
                    raise FileChanged(why)
            shared, parts = _host_copy(self._bulk_opened, self.where, comm)
            with self._lock:
                if self._bulk is None:
                    self._adopt(parts)
                    self.shared = shared
                    return
            # (this rank had read it already: it keeps what it has served from)
            del parts
            shared.close()
            return
        with self._lock:
            if self._bulk is None:
                parts = self._bulk_opened(lambda p: _load(p, self.where))
                # Checked read-only, as a host's sealed copy is: one signature of the check's
                # kernel for both (numba specialises on the flag), the one `solar warm` compiles.
                _frozen(parts)
                check_csr(parts["indptr"], parts["indices"], self.where)
                self._adopt(parts)

    def _bulk_opened(self, load: Callable[[dict[str, _Part]], Any],
                     names: tuple[str, ...] = BULK) -> Any:  # fmt: skip
        """What ``load`` makes of the topology's parts (or of the parts ``names``; the file
        opened again: its shapes must be the ones seen when the graph was opened)."""

        def bulk(parts: dict[str, _Part]) -> Any:
            got = {k: p for k, p in parts.items() if k in names}
            if {k: p.shape for k, p in got.items()} != {k: self._kinds[k][0] for k in got} or \
                    set(got) != {k for k in self._kinds if k in names}:  # fmt: skip
                raise SolarError(f"{self.where}: changed since it was opened (its parts' "
                                 "shapes differ)")  # fmt: skip
            self._unchanged()
            out = load(got)
            self._unchanged()  # (and not rewritten while it was read)
            return out

        return self._opened(bulk)

    def _unchanged(self) -> None:
        """Refuse files that changed since the graph was opened (:mod:`solar.io.identity`)."""
        if self._files is not None:
            try:
                self._files.check_paths()
            except FileChanged as exc:
                raise FileChanged(f"graph {exc}") from None

    def _changed(self) -> str | None:
        try:
            self._unchanged()
        except FileChanged as exc:
            return str(exc)
        return None

    def _adopt(self, parts: dict[str, np.ndarray]) -> None:
        self._bulk = _frozen(parts)  # validated once: nothing may change them after

    def _held(self) -> dict[str, np.ndarray]:
        if self._bulk is None:
            self.hold()  # (deferred and never given a communicator: private)
        assert self._bulk is not None
        return self._bulk

    @property
    def indptr(self) -> np.ndarray:
        """(N + 1,) int64 row pointer (read-only)."""
        return self._held()["indptr"]

    @property
    def indices(self) -> np.ndarray:
        """(E,) int32 or int64 neighbours (read-only)."""
        return self._held()["indices"]

    @property
    def labels(self) -> np.ndarray | None:
        """(N,) labels as stored (read-only), or None (read only if the graph has them)."""
        return self._held()["labels"] if "labels" in self._kinds else None

    @property
    def has_labels(self) -> bool:
        """Whether the graph has labels (without reading them)."""
        return "labels" in self._kinds

    @property
    def identity(self) -> str:
        """sha256 of the topology (indptr and indices): what a plan's fingerprint records."""
        if self._digest is None:
            h = hashlib.sha256()
            for a in (self.indptr, self.indices):
                h.update(str(a.dtype).encode())
                for lo in range(0, a.shape[0], 1 << 24):
                    h.update(a[lo : lo + (1 << 24)].data)  # (in place: no 128 MB copy)
            self._digest = h.hexdigest()
        return self._digest

    @property
    def split_bits(self) -> np.ndarray | None:
        """(N,) uint8: bit i of node v set where v is in split ``SPLITS[i]`` (None without
        splits), made at first use."""
        splits = self.splits if self._split_bits is None else None  # (takes the lock itself)
        if splits:
            with self._lock:
                if self._split_bits is None:
                    bits = _split_bits(splits, self.num_nodes)
                    bits.flags.writeable = False
                    self._split_bits = bits
        return self._split_bits

    def degree(self) -> np.ndarray:
        """(N,) int64 number of neighbours of every node."""
        return np.diff(self.indptr).astype(np.int64)

    def __getstate__(self) -> dict:
        # A graph read from files is read again in the new process, not copied through a pipe,
        # and must be the same graph there (a file changed since: refused, see __setstate__).
        if isinstance(self._source, Mapping) and not all(
            v is None or isinstance(v, str | os.PathLike) for v in self._source.values()
        ):
            self._held()
            self.read_splits()  # (every split held: nothing is read again there)
            # (its arrays pickled as copies; nothing left to open)
            return {**self.__dict__, **dict.fromkeys(("shared", "_opened", "_lock", "_files"))}
        return {"_source": self._source, "_digest": self.identity}

    def __setstate__(self, state: dict) -> None:
        if "_bulk" in state:
            self.__dict__.update(state, _lock=threading.Lock())
            return
        self.__init__(state["_source"])  # type: ignore[misc]
        if self.identity != state["_digest"]:
            raise SolarError(f"{self.where}: changed since it was opened (its topology differs "
                             "in this process)")  # fmt: skip


def _frozen(parts: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``parts``, each made read-only."""
    for a in parts.values():
        a.flags.writeable = False
    return parts


def as_graph(graph: Graph | str | os.PathLike | Mapping[str, Any], comm: Any = None,
             defer: bool = False) -> Graph:  # fmt: skip
    """``graph`` as a :class:`Graph` (a path or a dict of parts is opened; once per host of
    ``comm``'s job if given; its topology read later if ``defer``: :meth:`Graph.hold`)."""
    return graph if isinstance(graph, Graph) else Graph(graph, comm, defer=defer)


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


def check_nodes(ids: Any, n: int, where: str, empty: bool = False,
                copy: bool = True) -> np.ndarray:  # fmt: skip
    """``ids`` as distinct int64 node ids of a graph of ``n`` nodes (none only if ``empty``), or
    a one-line refusal. A copy, unless ``copy=False`` (ids no one else holds: a part just
    read) and they are int64 already. Its memory is at most the ids' bytes, whatever ``n``
    (a file's declared node count is untrusted)."""
    a = np.asarray(ids)
    _as_ids(a.dtype, a.shape, where, empty)
    a = a.astype(np.int64, copy=copy)
    if a.size == 0:
        return a
    bad = _nodes_problem(a, n)
    if bad == 1:
        raise SolarError(f"{where}: node ids outside 0..{n - 1}")
    if bad == 2:
        raise SolarError(f"{where}: a node is listed twice")
    return a


def _as_ids(dtype: np.dtype, shape: tuple[int, ...], where: str, empty: bool) -> None:
    """Refuse ids (their dtype and shape) that are not a 1-D integer array (a non-empty one
    unless ``empty``)."""
    if len(shape) != 1 or (shape[0] == 0 and not empty) or not np.issubdtype(dtype, np.integer):
        what = "a 1-D" if empty else "a non-empty 1-D"
        raise SolarError(f"{where}: expected {what} integer array, got {dtype} {shape}")


@njit(cache=True, nogil=True)
def _nodes_problem(ids, n):  # pragma: no cover - compiled
    """0 if ``ids`` are distinct nodes of ``0..n-1``, 1 if one is outside, 2 if one repeats.
    The range checked first, allocating nothing; the repeats on a bitmap of the n nodes where
    it is no larger than the ids (n / 8 bytes: 12.5 MB at 10^8 nodes; not np.unique's ~3x the
    ids' bytes), else on a sorted copy of the ids (a few ids of a huge graph)."""
    m = ids.shape[0]
    for i in range(m):
        if ids[i] < 0 or ids[i] >= n:
            return 1
    if n <= 64 * m:
        seen = np.zeros((n + 7) >> 3, np.uint8)
        for i in range(m):
            v = ids[i]
            bit = np.uint8(1 << (v & 7))
            if seen[v >> 3] & bit:
                return 2
            seen[v >> 3] |= bit
        return 0
    s = np.sort(ids)
    for i in range(1, m):
        if s[i] == s[i - 1]:
            return 2
    return 0


def _splits_checked(
    parts: dict[str, _Part],
    kinds: dict,
    names: tuple[str, ...],
    where: str,
    kept: Callable[[str], bool] | None = None,
) -> dict[str, np.ndarray]:
    """The splits ``names`` of ``parts``, each read and checked in turn (only the training
    split may not be empty), read-only; those ``kept`` refuses are let go once checked. A
    split whose shape or type cannot be distinct node ids is refused before it is read."""
    n = kinds["indptr"][0][0] - 1
    out = {}
    for name in names:
        what, shape = f"{where}: {name}", parts[name].shape
        _as_ids(parts[name].dtype, shape, what, empty=name != "train_idx")
        if shape[0] > n:
            raise SolarError(f"{what}: {shape[0]} ids of {n} nodes: a node is listed twice")
        # (the ids as read, and check_nodes' bitmap or sorted copy: at most 8 bytes an id)
        need = shape[0] * (kinds[name][1].itemsize + 8)
        require_memory(need, f"{what}: its {shape[0]} ids in memory", ranks_here())
        ids = _read({name: parts[name]}, {name: np.empty(*kinds[name])})[name]
        got = check_nodes(ids, n, what, empty=name != "train_idx", copy=False)
        got.flags.writeable = False  # validated once: nothing may change it after
        if kept is None or kept(name):
            out[name] = got
    return out


def _split_bits(splits: Mapping[str, np.ndarray], n: int) -> np.ndarray:
    """(n,) uint8: bit i of node v set where v is in split ``SPLITS[i]`` (validated ids)."""
    bits = np.zeros(n, np.uint8)
    for i, name in enumerate(SPLITS):
        if name in splits:
            bits[splits[name]] |= np.uint8(1 << i)
    return bits


def _node_array(kind: tuple[tuple[int, ...], np.dtype], n: int, where: str) -> None:
    """Refuse labels (their shape and dtype as stored) that are not one integer per node."""
    shape, dtype = kind
    if len(shape) != 1 or shape[0] != n or not np.issubdtype(dtype, np.integer):
        raise SolarError(f"{where}: expected {n} integer labels, got {dtype} {shape}")


Reader = Callable[[np.ndarray, int, int], None]  # (out, lo, hi): out[lo:hi] of the first axis


class _Part(NamedTuple):
    """A part as stored: its shape (an (n, 1) or (1, n) column flattened, as OGB keeps
    labels), its stored dtype, and ``open()``: a context giving the :data:`Reader` of its rows
    into an array of a given dtype (a file it reads opened once, for every window of rows)."""

    shape: tuple[int, ...]
    dtype: np.dtype
    open: Callable[[], AbstractContextManager[Reader]]


def _load(parts: dict[str, _Part], where: str) -> dict[str, np.ndarray]:
    """Every part read once into private memory, in the dtype the kernels take (checked
    against the memory the job has first)."""
    kinds = _kinds(parts, where)
    nbytes = sum(int(np.prod(shape, dtype=np.int64)) * dt.itemsize for shape, dt in kinds.values())
    n, e = kinds["indptr"][0][0] - 1, kinds["indices"][0][0]
    # Every rank of the host holds its own copy: the check counts them all.
    require_memory(nbytes, f"{where}: its topology in memory ({n} nodes, {e} edges)",
                   ranks_here())  # fmt: skip
    return _read(parts, {k: np.empty(shape, dt) for k, (shape, dt) in kinds.items()})


def _kinds(parts: dict[str, _Part], where: str) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """The shape and the dtype the kernels take of every part (checked: the CSR is there and
    of integers)."""
    for need in ("indptr", "indices"):
        if need not in parts:
            raise SolarError(f"{where}: no {need!r}")
    for name in ("indptr", "indices"):
        p = parts[name]
        if len(p.shape) != 1 or p.dtype.kind not in "iu":
            raise SolarError(f"{where}: {name} must be a 1-D integer array, got {p.dtype} "
                             f"{p.shape}")  # fmt: skip
    n = parts["indptr"].shape[0] - 1
    dtypes = {k: p.dtype.newbyteorder("=") for k, p in parts.items()}
    dtypes["indptr"] = np.dtype(np.int64)
    small = parts["indices"].dtype.itemsize <= 4 and n <= np.iinfo(np.int32).max
    dtypes["indices"] = np.dtype(np.int32 if small else np.int64)
    return {k: (tuple(p.shape), dtypes[k]) for k, p in parts.items()}


_WINDOW = 1 << 26  # bytes a part is read in at a time (a host's copy: what its writer holds)


def _read(
    parts: dict[str, _Part],
    into: dict[str, np.ndarray],
    written: Callable[[np.ndarray], None] | None = None,
) -> dict[str, np.ndarray]:
    """``parts`` read into the arrays ``into`` (of their :func:`_kinds`: converted, columns
    flattened), a window of rows at a time; ``written`` is told each window once it is
    filled. Returns ``into``."""
    for k, p in parts.items():
        a = into[k]
        if not a.size:
            continue
        rows = max(1, _WINDOW // max(1, a[:1].nbytes))
        with p.open() as read:
            for lo in range(0, len(a), rows):
                read(a, lo, min(len(a), lo + rows))
                if written is not None:
                    written(a[lo : lo + rows])
    return into


def _host_copy(opened: Callable[[Callable[[dict[str, _Part]], Any]], Any], where: str,
               comm: Any) -> tuple[SealedBytes, dict[str, np.ndarray]]:  # fmt: skip
    """The parts read once per host into a sealed memfd (solar/host/sealed.py) and checked
    there by local rank 0; this rank's read-only views of them (a collective of ``comm``)."""

    def produce(alloc: Callable[[int], np.ndarray], written: Callable[[np.ndarray], None]
                ) -> dict[str, Any]:  # fmt: skip
        def load(parts: dict[str, _Part]) -> dict[str, Any]:
            kinds = _kinds(parts, where)
            offsets, total = layout(kinds)
            buf = alloc(total)
            views = {k: np.ndarray(shape, dt, buffer=buf, offset=offsets[k])
                     for k, (shape, dt) in kinds.items()}  # fmt: skip
            _read(parts, views, written)  # (its pages leave this process as they are filled)
            return {k: (offsets[k], shape, dt.str) for k, (shape, dt) in kinds.items()}

        return opened(load)

    def check(sealed: SealedBytes, record: dict[str, Any]) -> dict[str, Any]:
        got = _carved(sealed, record)
        check_csr(got["indptr"], got["indices"], where)  # once, on bytes no one can change now
        return record

    shared, record = host_sealed(comm, produce, check, f"{where}: its topology")
    return shared, _carved(shared, record)


def _identities(source: str | os.PathLike | Mapping[str, Any]) -> Identities | None:
    """The identities of the files ``source`` names, pinned now (None: all in memory)."""
    if isinstance(source, Mapping):
        paths = [v for v in source.values() if isinstance(v, str | os.PathLike)]
    else:
        paths = [source]
    if not paths:
        return None
    files = Identities(paths)
    try:
        files.check_paths()
    except SolarError:  # (absent or unreadable: opening it says so, in the graph's words)
        return None
    return files


def _carved(sealed: SealedBytes, record: dict[str, Any]) -> dict[str, np.ndarray]:
    return {k: sealed.array(offset, shape, dt) for k, (offset, shape, dt) in record.items()}


def _opened(value: Any, where: str) -> _Part:
    """A part given as an array or a ``.npy`` path, not yet read."""
    if isinstance(value, str | os.PathLike):
        return _npy(Path(value), where)
    a = value if isinstance(value, np.ndarray) else np.asarray(value)

    def read(out: np.ndarray, lo: int, hi: int) -> None:
        out[lo:hi] = a.reshape(out.shape)[lo:hi]  # converted; a copy the caller cannot change

    return _Part(_flat(a.shape), a.dtype, _always(read))


def _always(read: Reader) -> Callable[[], AbstractContextManager[Reader]]:
    """A part's ``open`` for ``read`` that needs nothing opened (an array; an HDF5 file,
    open while it is read)."""
    return lambda: nullcontext(read)


def _flat(shape: tuple[int, ...]) -> tuple[int, ...]:
    """``shape`` as read: an (n, 1) or (1, n) column as (n,)."""
    return (int(np.prod(shape)),) if len(shape) == 2 and 1 in shape else tuple(shape)


def _npy(path: Path, where: str) -> _Part:
    """A ``.npy`` file's part, read with ``read`` calls (a file truncated under the run is a
    short read, never a fault in mapped memory), every window of rows from one descriptor (a
    file replaced by rename between two is not read half from each)."""
    try:
        h = read_npy_header(path)
    except SolarError as exc:
        raise SolarError(f"{where}: {exc}") from None
    shape, dtype, start = h.shape, h.dtype, h.offset
    if h.fortran and len(shape) > 1 and 1 not in shape:
        raise SolarError(f"{where}: {path}: {dtype} {shape} is not a plain array")

    @contextmanager
    def opened() -> Iterator[Reader]:
        with open(path, "rb") as f:

            def read(out: np.ndarray, first: int, end: int) -> None:
                row = int(np.prod(out.shape[1:], dtype=np.int64))
                flat, step = out.reshape(-1), max(1, (1 << 24) // dtype.itemsize)
                f.seek(start + first * row * dtype.itemsize)
                for lo in range(first * row, end * row, step):
                    hi = min(end * row, lo + step)
                    raw = f.read((hi - lo) * dtype.itemsize)
                    if len(raw) != (hi - lo) * dtype.itemsize:
                        raise SolarError(f"{where}: {path} ends before its {flat.size} entries")
                    flat[lo:hi] = np.frombuffer(raw, dtype)

            yield read

    return _Part(_flat(shape), dtype, opened)


def _from_hdf5(path: Path, load: Callable[[dict[str, _Part]], Any]) -> Any:
    """What ``load`` makes of the parts an HDF5 file holds (read while it is open; HDF5
    converts the types)."""
    import h5py

    try:
        with h5py.File(path, "r") as f:
            parts = {}
            for name in PARTS:
                if name not in f:
                    continue
                d = f[name]
                if not isinstance(d, h5py.Dataset):
                    raise SolarError(f"graph {path}: {name} is not a dataset")
                if d.shape is None:
                    raise SolarError(f"graph {path}: {name} holds no array (an empty dataspace)")
                parts[name] = _Part(_flat(d.shape), d.dtype, _always(_h5_reader(path, d)))
            return load(parts)
    except OSError as exc:
        raise SolarError(f"graph {path}: not a readable HDF5 file ({exc})") from None


def _h5_reader(path: Path, d: Any) -> Reader:
    # Rows of the stored shape: a (1, n) column's are its columns.
    across = d.ndim == 2 and d.shape[0] == 1 and d.shape[1] != 1

    def read(out: np.ndarray, lo: int, hi: int) -> None:
        sel = np.s_[:, lo:hi] if across else np.s_[lo:hi]
        try:
            d.read_direct(out.reshape(d.shape), sel, sel)
        except (OSError, TypeError, ValueError) as exc:
            raise SolarError(f"graph {path}: {d.name} cannot be read ({exc})") from None

    return read

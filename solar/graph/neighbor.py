"""``NeighborSampler``: k-hop neighbour sampling around seed nodes, as a solar sampler.

Each epoch the training nodes are permuted (``solar.schedule.draw.order.epoch_permutation`` of the
split, keyed by the run's seed and the epoch); global step t takes positions ``[t·G,
(t+1)·G)`` of it, G = P·B, and rank r the r-th contiguous share (``affinity`` is False: the
sampler, not the planner, fixes the split, so every seed is served exactly once per epoch).
Around its seeds a rank samples ``fanouts[h]`` neighbours per node at hop h, without
replacement (all of them when a node has fewer; -1: all), expanding at hop h only the nodes
first reached at hop h - 1, as PyTorch Geometric's ``NeighborLoader`` does. Which neighbours
node v draws at hop h of step t of epoch e is a pure function of (seed, e, t, v, h): the
counter-based stream of :mod:`solar.schedule.draw.rng` (splitmix64), Floyd's sampling of k of d
positions. Any step is recomputed alone, on any rank, in any process.

A step's ids are its subgraph's distinct nodes, seeds first, then each hop's new nodes in the
order they were reached: the feature rows solar plans and reads. A rank's epoch is sampled once
(:meth:`NeighborSampler.rank_epoch`, for its planner): the subgraphs travel with the draws to
delivery (``EpochDraws.outputs``, PyG's ``SamplerOutput``), where
:meth:`NeighborSampler.extras` joins a step's subgraph to its rows and to the graph's node
attributes, once, adding what PyG's ``NeighborLoader`` yields for a homogeneous graph: ``x``
(the rows of the loader's feature key, which it replaces in the batch), every node attribute
the graph holds sliced by ``n_id`` -- ``y`` (every sampled node's label: the seeds' are
``y[:batch_size]``) and ``train_mask`` / ``val_mask`` / ``test_mask`` (bool, from the graph's
splits, each where the graph has it) --, ``edge_index`` (2, E) in local ids, edges from the
sampled neighbour (row 0) to the node it was sampled for (row 1), ``n_id`` (the node ids,
replacing the Loader's ``index``), ``input_id`` (the seeds' positions in the sampler's
``train``, NeighborLoader's index into its ``input_nodes``), ``batch_size`` and
``num_sampled_nodes`` / ``num_sampled_edges`` per hop. No ``e_id``: a graph file does not keep
the edges' ids in their source (its CSR is the edges regrouped by target), so no edge
attribute could be joined to them. Labels and splits are held in memory (8 bytes and one byte
per node), validated when the graph is read. ``Loader(..., batch_format="pyg")`` makes each
batch a PyG ``Data`` of these.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit, typeof

from solar._kept import Kept
from solar._prefetch import prefetch
from solar.config import RunConfig
from solar.errors import SolarError
from solar.graph.csr import MASKS, SPLITS, Graph, check_nodes
from solar.graph.ingest import topology, warn_missing
from solar.launch import ranks_here
from solar.schedule.draw import rng
from solar.schedule.draw.draws import EpochDraws, every_rank, one_per_step, rank_draws
from solar.schedule.draw.grow import grown
from solar.schedule.draw.idtable import find, id_table
from solar.schedule.draw.order import epoch_permutation
from solar.schedule.draw.rng import GOLDEN, mix64
from solar.schedule.draw.samplers import BatchExtras, Sampler, _span

_NEIGHBOR_STREAM = 2  # spawn-key tag of the neighbour draws (Weighted's is 1)
MAX_HOPS = 64
_EMPTY = np.zeros(0, np.int64)
_LOCAL_MAX = 2**31 - 1  # a subgraph's local ids are int32
# typical_batch samples these many first steps of these many ranks: its cost is bounded at any
# world size (every rank's first steps sampled was slow at large P).
_TYPICAL_STEPS, _TYPICAL_RANKS = 2, 4


@dataclass(frozen=True)
class Subgraph:
    """One (epoch, step, rank) sample, the sampler's output of a batch (PyG's
    ``SamplerOutput``): ``nodes`` (seeds first, distinct), the edges in local ids (``src`` the
    sampled neighbour, ``dst`` the node it was drawn for), per hop the nodes first reached
    and the edges drawn (``hop_nodes[0]`` = the seeds), and ``input_id``, the seeds' positions
    in the sampler's ``train`` (PyG's ``SamplerOutput.metadata[0]``)."""

    nodes: np.ndarray  # (n,) int64
    # Local ids as int32 (a subgraph has fewer than 2^31 nodes: check_run): an epoch of them
    # is kept for delivery, at half the bytes (bench/sample_once.py).
    src: np.ndarray  # (E,) int32
    dst: np.ndarray  # (E,) int32
    hop_nodes: np.ndarray  # (hops + 1,) int64
    hop_edges: np.ndarray  # (hops,) int64
    input_id: np.ndarray  # (seeds,) int64


class NeighborSampler(Sampler, BatchExtras):
    """k-hop neighbour sampling around each rank's seed nodes (see the module's docstring).

    ``graph``: a :class:`~solar.graph.csr.Graph`, an HDF5 path (as ``solar gen --preset
    graph`` and :func:`~solar.graph.ingest.write_graph` write), a dict of CSR arrays / ``.npy``
    paths, or in memory a PyG ``Data`` or a dict with ``edge_index`` (its topology, labels and
    training split; features are read from the Loader's file). ``fanouts``: neighbours per node at
    each hop (-1: all). ``batch_size``: seeds per rank and step (the Loader's default).
    ``train``: the seed nodes (default: the graph's ``train_idx``, else every node).
    ``features``: the loader key whose rows become ``x``. ``comm``: the job's communicator (an
    mpi4py communicator or :class:`~solar.dist.TorchComm`; a collective of its ranks): a graph
    read from files is held once per host, sealed and mapped read-only by its ranks, not once
    per rank. Without it, in a job of several ranks a host, the topology is read when the
    Loader passes its communicator (:meth:`bind`; a Loader's default): once per host as well.
    Used outside a Loader there, the topology is read privately (a copy per rank) at first
    use, and a bad graph's errors appear then, not here; a graph file changed since this
    sampler opened it (its identity, solar/io/identity.py) is refused then, naming the file.
    """

    kind = "neighbor"
    affinity = False
    direct_by_default = True  # its feature rows: the buffer is their one cache
    # A subgraph's nodes: its seeds distinct (train is checked: check_nodes), each node
    # after them added once (_sample's table of them).
    distinct = True
    # A node's reuse is steps away, not epochs (measured, README "Graphs": 20 steps of
    # look-ahead hold every hit of the full future), so the planner looks one epoch ahead:
    # the first batch waits for two epochs' subgraphs, not the whole run's.
    horizon = 1

    def __init__(
        self,
        graph: Graph | str | Any,
        fanouts: Sequence[int] = (10, 5),
        batch_size: int = 1024,
        train: Any = None,
        features: str = "features",
        comm: Any = None,
    ) -> None:
        # In a job of several ranks a host and no communicator yet, the topology waits for the
        # Loader's (bind): one copy per host by default, not one per rank.
        self.graph = topology(graph, comm, defer=comm is None and ranks_here() > 1)
        f = tuple(fanouts)
        if not 1 <= len(f) <= MAX_HOPS or not all(
            isinstance(x, int | np.integer) and not isinstance(x, bool) and (x > 0 or x == -1)
            for x in f
        ):
            raise SolarError(f"fanouts must be 1..{MAX_HOPS} integers > 0 or -1, got {fanouts!r}")
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
            raise SolarError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.fanouts = tuple(int(x) for x in f)
        self.batch_size = batch_size
        n = self.graph.num_nodes
        warn_missing(self.graph.where, self.graph.has_labels,
                     train is not None or self.graph.train_idx is not None)  # fmt: skip
        if train is None and self.graph.train_idx is not None:
            self.train = self.graph.train_idx  # (the graph's own, validated, read-only)
        else:
            # (a caller's ids copied; the default range is this sampler's own)
            self.train = check_nodes(np.arange(n) if train is None else train, n, "train",
                                     copy=train is not None)  # fmt: skip
            self.train.flags.writeable = False
        if not isinstance(features, str):
            raise SolarError("features: the name of the Loader's key (e.g. 'features'); "
                             "features in memory go to storage first: "
                             "solar.graph.write_graph(data, 'graph.h5')")  # fmt: skip
        self.features = features
        # The batch keeps one name for each thing: x (not the key), n_id (not index).
        self.supersedes = ("index", features)
        self._cache: Kept[EpochDraws] = Kept(3)  # every rank's nodes (a whole plan's)
        self._perms: Kept[np.ndarray] = Kept(4)  # the split's permutation of recent epochs
        self._typical: Kept[int] = Kept(2)  # typical_batch of recent runs

    # -- the sampler contract ----------------------------------------------------------------
    def bind(self, comm: Any) -> None:
        """The Loader's communicator (a collective of its ranks): the topology, if not yet
        read, is read now, once per host where a host runs several of them; and the splits a
        batch's masks come from (a planner, never bound, holds only the seeds')."""
        self.graph.hold(comm)
        # Here, not at the first batch: a file changed since is refused as the Loader is
        # made (which takes the job down), never mid-epoch, and no batch waits for a read.
        self.graph.read_splits()

    def draws(self, num_samples: int, global_batch: int) -> int:
        return int(self.train.size)  # positions of an epoch: one per seed

    def check(self, num_samples: int) -> None:
        if num_samples != self.graph.num_nodes:
            raise SolarError(f"{self.graph.where}: {self.graph.num_nodes} nodes, but the "
                             f"features have {num_samples} rows")  # fmt: skip

    def check_keys(self, keys: Sequence[str]) -> None:
        """The features' key must be among the batches' keys: it becomes ``x``."""
        if self.features not in keys:
            raise SolarError(f"NeighborSampler(features={self.features!r}): the Loader's keys "
                             f"{', '.join(keys)} do not hold it (batch['x'] is its rows): pass "
                             f"keys=[{self.features!r}] or features= one of them")  # fmt: skip

    def check_run(self, run: RunConfig) -> None:
        """Refuse a run whose local batch is not this sampler's, whose last global batch
        would leave a rank without a seed, or whose subgraph could have 2^31 nodes."""
        if run.batch_size != self.batch_size:
            raise SolarError(f"NeighborSampler(batch_size={self.batch_size}) in a run of "
                             f"batch_size {run.batch_size}")  # fmt: skip
        last = run.samples_per_epoch - (run.steps_per_epoch - 1) * run.global_batch
        if last < run.world_size:
            fix = "drop_last=True or another batch size" if run.steps_per_epoch > 1 else \
                "fewer ranks"  # fmt: skip
            raise SolarError(f"the last global batch has {last} seeds for {run.world_size} "
                             f"ranks: use {fix}")  # fmt: skip
        if self.graph.num_nodes > _LOCAL_MAX and self.batch_bound(run) > _LOCAL_MAX:
            raise SolarError(f"NeighborSampler: a subgraph of up to {self.batch_bound(run)} "
                             f"nodes, over {_LOCAL_MAX}: use smaller fanouts")  # fmt: skip

    def seed_count(self, run: RunConfig, step: int) -> int:
        """Seeds of global step ``step`` (within an epoch) over all ranks: what a per-seed
        loss summed over the ranks is divided by (``solar.dist.scale_loss``)."""
        return int(min(run.global_batch, run.samples_per_epoch - step * run.global_batch))

    def loss_count(self, run: RunConfig, step: int) -> int | None:
        """A node classification loss averages over the step's seeds, not its rows."""
        return self.seed_count(run, step)

    def seeds(self, run: RunConfig, epoch: int, step: int, rank: int) -> np.ndarray:
        """Rank ``rank``'s seed nodes at ``step`` of ``epoch`` (int64)."""
        return self.train[self.input_id(run, epoch, step, rank)]

    def input_id(self, run: RunConfig, epoch: int, step: int, rank: int) -> np.ndarray:
        """The positions in ``train`` of rank ``rank``'s seeds at ``step`` of ``epoch``."""
        lo, hi = _span(run, step, rank)
        return self._permutation(run.seed, epoch)[lo:hi]

    def _permutation(self, seed: int, epoch: int) -> np.ndarray:
        return self._perms.get((seed, epoch),
                               lambda: epoch_permutation(seed, epoch, self.train.size))  # fmt: skip

    def subgraph(self, run: RunConfig, epoch: int, step: int, rank: int) -> Subgraph:
        """The sampled subgraph of rank ``rank`` at ``step`` of ``epoch``, sampled now (a run
        samples each once: :meth:`rank_epoch`)."""
        self.check_run(run)
        return self._sample(run, epoch, step, rank)

    def _sample(self, run: RunConfig, epoch: int, step: int, rank: int) -> Subgraph:
        key = rng.stream_key(run.seed, _NEIGHBOR_STREAM, epoch, step)
        g = self.graph
        at = self.input_id(run, epoch, step, rank)
        nodes, src, dst, hop_nodes, hop_edges = _sample(
            g.indptr, g.indices, self.train[at], np.array(self.fanouts, np.int64), key
        )
        return Subgraph(nodes, src, dst, hop_nodes, hop_edges, np.asarray(at, np.int64))

    def epoch(self, run: RunConfig, epoch: int) -> EpochDraws:
        def make() -> EpochDraws:
            self.check_run(run)
            rows = [
                self._sample(run, epoch, t, r).nodes
                for t in range(run.steps_per_epoch)
                for r in range(run.world_size)
            ]
            offsets = np.zeros(len(rows) + 1, np.int64)
            np.cumsum([r.size for r in rows], out=offsets[1:])
            ids = np.empty(int(offsets[-1]), np.int64)
            for i in range(len(rows)):  # each row let go once copied: one copy at a time
                ids[offsets[i] : offsets[i + 1]] = rows[i]
                rows[i] = _EMPTY
            return EpochDraws(ids, offsets)

        return self._cache.get((run, epoch), make)

    def window(self, run: RunConfig, epoch: int, t0: int, t1: int,
               rank: int | None = None) -> EpochDraws:  # fmt: skip
        """Only steps ``t0 .. t1 - 1``'s subgraphs (of every rank, or of ``rank`` alone): a
        plan in windows of steps holds a window's nodes, never an epoch's."""
        self.check_run(run)
        ranks = range(run.world_size) if rank is None else [rank]
        mine = {r: one_per_step([self._sample(run, epoch, t, r).nodes for t in range(t0, t1)])
                for r in ranks}  # fmt: skip
        return every_rank(run, mine, t1 - t0)

    def rank_epoch(self, run: RunConfig, epoch: int, rank: int) -> EpochDraws:
        """Only rank ``rank``'s subgraphs of ``epoch`` (a P-th of :meth:`epoch`'s work): their
        nodes the draws, the subgraphs their outputs (each one's nodes a view of the draws)."""
        self.check_run(run)
        subs = [self._sample(run, epoch, t, rank) for t in range(run.steps_per_epoch)]
        d = rank_draws(run, [s.nodes for s in subs], rank)
        at = d.offsets[np.arange(run.steps_per_epoch) * run.world_size + rank]
        outputs: list[Any] = [None] * (run.steps_per_epoch * run.world_size)
        # Each subgraph's nodes a view of the draws: one copy of them is held.
        outputs[rank :: run.world_size] = [dataclasses.replace(s, nodes=d.ids[a : a + s.nodes.size])
                                           for s, a in zip(subs, at, strict=True)]  # fmt: skip
        return dataclasses.replace(d, outputs=outputs)

    def rehearse(self, run: RunConfig, rank: int) -> None:
        """Compile (or load) the sampling kernel for this graph's arrays, sampling nothing:
        every batch of the run is sampled once, by its draws."""
        g = self.graph
        seeds = self.train[:1].copy()  # (writeable, as every call passes)
        args = (g.indptr, g.indices, seeds, np.array(self.fanouts, np.int64), np.uint64(0))
        _sample.compile(tuple(typeof(a) for a in args))

    def batch(self, run: RunConfig, epoch: int, step: int, rank: int) -> np.ndarray:
        return self.subgraph(run, epoch, step, rank).nodes

    def max_batch(self, run: RunConfig) -> int | None:
        return None  # a subgraph's size varies (the batch pool grows as needed)

    def batch_bound(self, run: RunConfig) -> int:
        """The most nodes a rank's subgraph can have: its seeds, then each hop's frontier times
        that hop's fanout (-1: the largest degree), at most N. (With fanouts (10, 5) and 1024
        seeds: 62,464 rows, against ~53k sampled on average at N = 10^6.)"""
        seeds = -(-run.global_batch // run.world_size)  # the largest nominal share
        n = self.graph.num_nodes
        widest = int(np.diff(self.graph.indptr).max(initial=0)) if min(self.fanouts) < 0 else 0
        total = frontier = min(seeds, self.batch_size)
        for f in self.fanouts:
            frontier = min(n, frontier * (widest if f < 0 else f))
            total = min(n, total + frontier)
        return int(total)

    def typical_batch(self, run: RunConfig) -> int | None:
        """An estimate: the subgraphs of the first (up to) two steps of epoch 0 of at most
        four ranks spread over the world (rank 0 and the last among them; every rank up to
        four) sampled, their largest size plus 10 %: what a step's accesses come to (their sizes
        vary little with ~10^3 seeds), at most :meth:`batch_bound` (a worst case, ~2x at 10^6
        nodes: issue 48). A bounded cost whatever the world's size (8 subgraphs at most)."""
        self.check_run(run)

        def sampled() -> int:
            steps = range(min(_TYPICAL_STEPS, run.steps_per_epoch))
            ranks = np.unique(np.linspace(0, run.world_size - 1,
                                          min(_TYPICAL_RANKS, run.world_size)).round())  # fmt: skip
            sizes = [self._sample(run, 0, t, int(r)).nodes.size for t in steps for r in ranks]
            return min(self.batch_bound(run), int(1.1 * max(sizes)))

        return self._typical.get(run, sampled)

    def identity(self) -> dict[str, Any]:
        return {"kind": self.kind, "graph": self.graph.identity, "fanouts": list(self.fanouts),
                "batch_size": self.batch_size, "train": self._train_digest}  # fmt: skip

    @functools.cached_property
    def _train_digest(self) -> str:
        """train's hash, once: it is this sampler's own read-only copy (identity is asked per
        step, by is_shuffle)."""
        return hashlib.sha256(self.train.data).hexdigest()  # (in place: no copy)

    def extras(self, output: Any, batch: Mapping[str, Any]) -> dict[str, Any]:
        """PyG ``NeighborLoader``'s fields for a batch from its subgraph ``output``, joined to
        its rows and to the graph's node attributes (module docstring)."""
        import torch

        if not isinstance(output, Subgraph):
            raise SolarError("NeighborSampler: a batch delivered without its subgraph (its "
                             "draws came from another sampler)")  # fmt: skip
        sub = output
        out: dict[str, Any] = {
            "edge_index": torch.from_numpy(_edge_index(sub)),
            "n_id": torch.from_numpy(sub.nodes),
            "input_id": torch.from_numpy(sub.input_id),
            "batch_size": int(sub.hop_nodes[0]),
            "num_sampled_nodes": sub.hop_nodes.tolist(),
            "num_sampled_edges": sub.hop_edges.tolist(),
        }
        if self.features in batch:
            out["x"] = batch[self.features]
        out.update({k: torch.from_numpy(v) for k, v in node_attributes(self.graph, sub.nodes)})
        return out


def node_attributes(graph: Graph, n_id: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """The graph's node attributes held in memory sliced by ``n_id`` (validated node ids), by
    their names in a PyG batch: ``y`` (int64 labels), then each split's boolean mask."""
    out = []  # (np.take: about half the time of an index array's subscript, measured)
    if graph.labels is not None:
        out.append(("y", np.asarray(np.take(graph.labels, n_id), np.int64)))
    if graph.split_bits is not None:
        bits = np.take(graph.split_bits, n_id)
        out += [(MASKS[name], (bits & np.uint8(1 << i)) != 0)
                for i, name in enumerate(SPLITS) if name in graph.splits]  # fmt: skip
    return out


def _edge_index(sub: Subgraph) -> np.ndarray:
    """PyG's ``edge_index`` of ``sub``: (2, E) int64, row 0 ``src``, row 1 ``dst``."""
    out = np.empty((2, sub.src.size), np.int64)
    out[0], out[1] = sub.src, sub.dst
    return out


@njit(cache=True, nogil=True)
def _choose(key, v, h, d, k, chosen):  # pragma: no cover - compiled
    """Floyd's sampling of ``k`` of positions ``0..d-1`` without replacement into
    ``chosen[:k]``: draw c (0-based) is position ``c + 1`` of the stream of (``key``, node v,
    hop h), a 53-bit uniform scaled to ``0..j`` (Floyd's j)."""
    sub = mix64(key + (np.uint64(v) * np.uint64(MAX_HOPS) + np.uint64(h) + np.uint64(1)) * GOLDEN)
    c = 0
    for j in range(d - k, d):
        u = mix64(sub + np.uint64(c + 1) * GOLDEN) >> np.uint64(11)
        t = int(np.float64(u) * (1.0 / 9007199254740992.0) * (j + 1))  # 0..j
        if t > j:
            t = j
        for i in range(c):
            if chosen[i] == t:
                t = j
                break
        chosen[c] = t
        c += 1


@njit(cache=True)
def _table(nodes, n, room):  # pragma: no cover - compiled
    """A table of ``nodes[:n]`` (node -> local id) with room for ``room`` nodes at most half
    full: (keys, local ids, mask)."""
    keys, mask = id_table(room)
    local = np.empty(keys.shape[0], np.int32)
    for i in range(n):
        at = find(keys, nodes[i], mask)
        keys[at] = nodes[i]
        local[at] = i
    return keys, local, mask


@njit(cache=True, nogil=True)
def _sample(indptr, indices, seeds, fanouts, key):  # pragma: no cover - compiled
    """The k-hop sample around ``seeds``. Each node's local id is kept in a hash table of the
    subgraph's nodes (sized by the subgraph, never by the graph: a step costs what its
    subgraph costs, issue 48).

    Returns (nodes, src, dst, hop_nodes, hop_edges) as in :class:`Subgraph`."""
    hops = fanouts.shape[0]
    s = seeds.shape[0]
    nodes = np.empty(max(16, 4 * s), np.int64)
    src = np.empty(max(16, 4 * s), np.int32)
    dst = np.empty(max(16, 4 * s), np.int32)
    hop_nodes = np.zeros(hops + 1, np.int64)
    hop_edges = np.zeros(hops, np.int64)
    chosen = np.empty(max(1, fanouts.max()), np.int64)
    for i in range(s):
        nodes[i] = seeds[i]
    keys, local, mask = _table(nodes, 0, s)
    for i in range(s):  # (seeds are distinct: train is checked)
        at = find(keys, seeds[i], mask)
        keys[at] = seeds[i]
        local[at] = i
    n = s
    e = 0
    lo, hi = 0, s
    hop_nodes[0] = s
    for h in range(hops):
        f = fanouts[h]
        # Room for this hop's edges and new nodes: at most min(f, degree) per frontier node.
        need = 0
        for i in range(lo, hi):
            d = indptr[nodes[i] + 1] - indptr[nodes[i]]
            need += d if f < 0 or f > d else f
        if e + need > src.shape[0]:
            size = max(2 * src.shape[0], e + need)
            src = grown(src, size, e)
            dst = grown(dst, size, e)
        if n + need > nodes.shape[0]:
            nodes = grown(nodes, max(2 * nodes.shape[0], n + need), n)
        if 2 * (n + need) > keys.shape[0]:
            keys, local, mask = _table(nodes, n, n + need)
        for i in range(lo, hi):
            # The frontier's next nodes' offsets, then its next-but-few's neighbours: their
            # misses overlap this node's (solar/_prefetch.py).
            if i + 8 < hi:
                prefetch(indptr, nodes[i + 8])
            if i + 3 < hi:
                prefetch(indices, indptr[nodes[i + 3]])
            v = nodes[i]
            a = indptr[v]
            d = indptr[v + 1] - a
            k = d if f < 0 or f >= d else f
            if k < d:
                _choose(key, v, h, d, k, chosen)
            for j in range(k):
                u = np.int64(indices[a + (chosen[j] if k < d else j)])
                at = find(keys, u, mask)
                if keys[at] < 0:
                    keys[at] = u
                    local[at] = n
                    nodes[n] = u
                    n += 1
                src[e] = local[at]
                dst[e] = i
                e += 1
        hop_nodes[h + 1] = n - hi
        hop_edges[h] = e - (hop_edges[:h].sum())
        lo, hi = hi, n
    return nodes[:n].copy(), src[:e].copy(), dst[:e].copy(), hop_nodes, hop_edges

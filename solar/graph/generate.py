"""A synthetic graph whose labels need its edges: ``solar gen --preset graph``.

A degree-corrected stochastic block model, generated target by target in bounded memory:

* Node weights follow a power law: the node of weight rank r has weight ``(1 + r) ** -ALPHA``;
  ranks are spread over the node ids by a keyed pseudo-random permutation (a Feistel network
  on the ids, cycle-walked), so hubs lie all over the file, not at its start (which would
  flatter page-sized reads), and no permutation array is held.
* Communities: rank r belongs to community ``r mod CLASSES`` (each has the same degree
  profile); a node's label is its community.
* Node v has ``round(avg_degree · w_v / mean w)`` in-neighbours (its CSR row), distinct and
  never itself: each drawn from v's own community with probability ``HOMOPHILY``, else from
  another community chosen uniformly; within a community, in proportion to the weights (an
  inverse-CDF draw of the power law). Hubs are hubs both ways: a node's in-degree and its
  expected out-degree both follow its weight.
* Features are weakly informative float32 rows: Gaussian noise plus the community's centroid
  scaled to ``SIGNAL`` (the distance between centroids relative to the noise, whatever F), so
  an MLP on the features alone is far from perfect while a GNN that averages a node's
  neighbours (mostly of its community) sees through the noise: on a small graph a 2-layer
  GraphSAGE beats an MLP by tens of points (tests/test_graph_ingest.py).

Every value is a pure function of the seed and the node (counter-based draws), so a block of
nodes is generated alone, in any order, with no state: the same file whatever the memory.
The file goes through the converter's path (:mod:`solar.graph.csrwrite`): rows of
targets written range by range, features in blocks, verified, atomic. Time is linear in the
edges and the features; memory is 16 bytes per node (row pointers) plus blocks.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
from numba import njit

from solar.errors import SolarError
from solar.graph.csrwrite import GraphParts, write_csr_graph
from solar.schedule.draw.rng import GOLDEN, mix64

ALPHA = 0.5
CLASSES = 8
HOMOPHILY = 0.8
SIGNAL = 1.0
VALID_FRACTION = TEST_FRACTION = 0.1
_ROW_BLOCK = 4096  # features are drawn per block of this many nodes (a fixed stream each)


def generate_graph(
    path: str | os.PathLike,
    nodes: int,
    avg_degree: float,
    features: int,
    *,
    seed: int = 0,
    train_fraction: float = 0.1,
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """Write the graph of the module's docstring to ``path``: datasets ``indptr`` (N + 1,)
    int64, ``indices`` (E,) int32 (int64 from 2^31 nodes), ``features`` (N, F) float32,
    ``labels`` (N,) int64, ``train_idx``, ``valid_idx``, ``test_idx`` (sorted) int64 (a
    ``train_fraction`` of the nodes, then 10 % each, disjoint)."""
    for name, value in (("nodes", nodes), ("features", features)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise SolarError(f"{name} must be a positive integer, got {value!r}")
    if not (0 < avg_degree < nodes):
        raise SolarError(f"avg-degree must be in (0, nodes), got {avg_degree}")
    if not 0 < train_fraction <= 1:
        raise SolarError(f"train fraction must be in (0, 1], got {train_fraction}")
    model = _Model(nodes, float(avg_degree), ALPHA, CLASSES, HOMOPHILY, seed)
    rows = _Features(model, features, SIGNAL, seed)
    splits = _splits(model, train_fraction)
    parts = GraphParts(model, rows, _Labels(model), splits)
    write_csr_graph(path, parts, progress=progress)
    return Path(path)


class _Model:
    """The block model as an edge source (:class:`~solar.graph.csrwrite.EdgeSource`) whose
    degrees are known in closed form and whose edges come target block by target block."""

    where = "generated graph"

    def __init__(self, n: int, d: float, alpha: float, k: int, homophily: float, seed: int):
        self.num_nodes, self.alpha, self.classes, self.homophily = n, alpha, k, homophily
        self.key = _key(seed)
        bits = max(2, (n - 1).bit_length())
        self.bits = bits + (bits & 1)  # a balanced Feistel network: an even number of bits
        mean_w = ((1.0 + n) ** (1 - alpha) - 1.0) / ((1 - alpha) * n)  # ∫ (1+x)^-α dx / n
        self.scale = d / mean_w
        self.cap = max(1, (n - 1) // 2)  # room to draw distinct neighbours quickly
        self.num_edges = None  # known once degrees() ran

    def degrees(self, lo: int = 0, hi: int | None = None) -> np.ndarray:
        hi = self.num_nodes if hi is None else hi
        out = np.empty(hi - lo, np.int64)
        _degrees(lo, hi, self.num_nodes, self.bits, self.key, self.alpha, self.scale, self.cap,
                 out)  # fmt: skip
        return out

    def ranks(self, lo: int, hi: int) -> np.ndarray:
        out = np.empty(hi - lo, np.int64)
        _ranks(lo, hi, self.num_nodes, self.bits, self.key, out)
        return out

    def chunks(self, size: int, lo: int = 0, hi: int | None = None):
        hi = self.num_nodes if hi is None else hi
        a = lo
        while a < hi:
            b = min(hi, a + max(1, size // 64))
            deg = self.degrees(a, b)
            while b - a > 1 and deg.sum() > size:  # a block of at most ``size`` edges
                b = a + (b - a) // 2
                deg = deg[: b - a]
            src = np.empty(int(deg.sum()), np.int64)
            _edges(a, b, self.num_nodes, self.bits, self.key, self.alpha, self.classes,
                   self.homophily, deg, src)  # fmt: skip
            yield src, np.repeat(np.arange(a, b, dtype=np.int64), deg)
            a = b


class _Labels:
    """Labels (communities) as rows of the graph file."""

    def __init__(self, model: _Model) -> None:
        self.model = model
        self.shape: tuple[int, ...] = (model.num_nodes,)
        self.dtype = np.dtype(np.int64)

    def read(self, lo: int, hi: int) -> np.ndarray:
        return self.model.ranks(lo, hi) % self.model.classes

    def take(self, ids: np.ndarray) -> np.ndarray:  # pragma: no cover - no reordering here
        raise NotImplementedError


class _Features:
    """Noise plus the community's centroid, drawn per fixed block of nodes."""

    def __init__(self, model: _Model, f: int, signal: float, seed: int) -> None:
        self.model, self.seed = model, seed
        self.shape: tuple[int, ...] = (model.num_nodes, f)
        self.dtype = np.dtype(np.float32)
        centroids = np.random.default_rng([seed, 22]).standard_normal((model.classes, f))
        # Unit-norm directions scaled so that two centroids are ~signal·√2 apart (noise: 1).
        centroids /= np.linalg.norm(centroids, axis=1, keepdims=True)
        self.centroids = (centroids * signal).astype(np.float32)

    def read(self, lo: int, hi: int) -> np.ndarray:
        f = self.shape[1]
        out = np.empty((hi - lo, f), np.float32)
        first = lo // _ROW_BLOCK
        for blk in range(first, (hi - 1) // _ROW_BLOCK + 1):
            a, b = blk * _ROW_BLOCK, min((blk + 1) * _ROW_BLOCK, self.shape[0])
            rng = np.random.default_rng([self.seed, 23, blk])
            noise = rng.standard_normal((b - a, f), np.float32)
            s, e = max(a, lo), min(b, hi)
            rows = noise[s - a : e - a]
            rows += self.centroids[self.model.ranks(s, e) % self.model.classes]
            out[s - lo : e - lo] = rows
        return out

    def take(self, ids: np.ndarray) -> np.ndarray:  # pragma: no cover - no reordering here
        raise NotImplementedError


def _splits(model: _Model, train: float) -> dict[str, np.ndarray]:
    """Train, valid and test nodes: ``round(fraction · N)`` each (10 % for valid and test, as
    far as nodes remain), by the order of a per-node uniform draw."""
    n = model.num_nodes
    u = np.empty(n, np.float64)
    _uniforms(n, model.key, u)
    k = max(1, round(train * n))
    kv = min(round(VALID_FRACTION * n), n - k)
    kt = min(round(TEST_FRACTION * n), n - k - kv)
    cuts = sorted({c for c in (k, k + kv, k + kv + kt) if 0 < c < n})
    order = np.argpartition(u, cuts) if cuts else np.arange(n)
    del u
    out = {"train_idx": np.sort(order[:k])}
    if kv:
        out["valid_idx"] = np.sort(order[k : k + kv])
    if kt:
        out["test_idx"] = np.sort(order[k + kv : k + kv + kt])
    return out


def _key(seed: int) -> np.uint64:
    return np.uint64(int.from_bytes(np.random.default_rng([seed, 21]).bytes(8), "little"))


# -- counter-based draws (numba) ---------------------------------------------------------------
@njit(cache=True, inline="always")
def _u01(key, a, b):  # pragma: no cover - compiled
    """A uniform in [0, 1) from the stream (key, a, b)."""
    z = mix64(key + np.uint64(a) * GOLDEN)
    z = mix64(z + (np.uint64(b) + np.uint64(1)) * GOLDEN)
    return np.float64(z >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@njit(cache=True, inline="always")
def _feistel(x, bits, key, inverse):  # pragma: no cover - compiled
    """A keyed permutation of [0, 2^bits): 4 rounds of a balanced Feistel network whose
    round function is the high bits of one multiplication."""
    half = np.uint64(bits // 2)
    mask = (np.uint64(1) << half) - np.uint64(1)
    shift = np.uint64(64) - half
    left = np.uint64(x) >> half
    right = np.uint64(x) & mask
    for i in range(4):
        r = 3 - i if inverse else i
        k = key + np.uint64(r + 1) * GOLDEN
        if inverse:
            left, right = right ^ ((((left ^ k) | np.uint64(1)) * GOLDEN) >> shift), left
        else:
            left, right = right, left ^ ((((right ^ k) | np.uint64(1)) * GOLDEN) >> shift)
    return (left << half) | right


@njit(cache=True, inline="always")
def _permute(x, n, bits, key, inverse):  # pragma: no cover - compiled
    """The permutation of [0, n): the Feistel network cycle-walked back into range."""
    y = _feistel(x, bits, key, inverse)
    while y >= np.uint64(n):
        y = _feistel(y, bits, key, inverse)
    return np.int64(y)


@njit(cache=True, nogil=True)
def _ranks(lo, hi, n, bits, key, out):  # pragma: no cover - compiled
    """Weight rank of nodes lo..hi-1 (rank 0: the heaviest)."""
    for v in range(lo, hi):
        out[v - lo] = _permute(v, n, bits, key, True)


@njit(cache=True, nogil=True)
def _degrees(lo, hi, n, bits, key, alpha, scale, cap, out):  # pragma: no cover - compiled
    for v in range(lo, hi):
        r = _permute(v, n, bits, key, True)
        want = scale * (1.0 + r) ** -alpha
        d = math.floor(want + _u01(key, v, 0x7FFFFFFF))  # rounded without bias
        out[v - lo] = min(max(d, 1), cap)


@njit(cache=True, nogil=True)
def _uniforms(n, key, out):  # pragma: no cover - compiled
    for v in range(n):
        out[v] = _u01(key ^ np.uint64(0x5851F42D4C957F2D), v, 0)


@njit(cache=True, inline="always")
def _draw(key, base, i, n, bits, k, own, homophily, inv_e, a, lo, span):  # pragma: no cover
    """Draw i of node v's neighbours: a community (its own with probability ``homophily``,
    else another uniformly), then a member by the power law's inverse CDF (community c's
    member j has weight ∝ (a[c] + j)^-alpha; lo, span: the CDF's ends, precomputed;
    ``base``: node v's stream)."""
    z = mix64(base + (np.uint64(i) + np.uint64(1)) * GOLDEN)
    c = own
    if k > 1:
        coin = np.float64(z & np.uint64(0x7FF)) * (1.0 / 2048.0)  # 11 low bits: ~0.05 %
        if coin >= homophily:
            c = (own + 1 + int(np.float64((z >> np.uint64(11)) & np.uint64(0xFFFF)) *
                               (1.0 / 65536.0) * (k - 1))) % k  # fmt: skip
    u = np.float64(mix64(z ^ GOLDEN) >> np.uint64(11)) * (1.0 / 9007199254740992.0)
    t = lo[c] + u * span[c]
    x = (t * t if inv_e == 2.0 else t**inv_e) - a[c]
    size = (n - c + k - 1) // k  # members c, c + k, ... below n
    j = min(max(int(x), 0), size - 1)
    return _permute(c + j * k, n, bits, key, False)


@njit(cache=True, nogil=True)
def _edges(lo, hi, n, bits, key, alpha, k, homophily, deg, out):  # pragma: no cover
    """The in-neighbours of nodes lo..hi-1 into ``out`` (rows of ``deg`` entries each):
    distinct, never the node itself, sorted."""
    e = 1.0 - alpha
    a = np.empty(k)
    first = np.empty(k)
    span = np.empty(k)
    for c in range(k):
        a[c] = (1.0 + c) / k
        size = (n - c + k - 1) // k
        first[c] = a[c] ** e
        span[c] = (a[c] + size) ** e - first[c]
    inv_e = 1.0 / e
    p = 0
    for v in range(lo, hi):
        d = deg[v - lo]
        draws = 0  # node v's own stream: the same whatever block it is drawn in
        own = _permute(v, n, bits, key, True) % k
        base = mix64(key + np.uint64(v) * GOLDEN)
        row = out[p : p + d]
        got = 0
        tries = 0
        while got < d and tries < 8:
            for t in range(got, d):
                row[t] = _draw(key, base, draws, n, bits, k, own, homophily, inv_e, a, first, span)
                draws += 1
            row.sort()
            got = 0
            for t in range(d):  # keep the distinct ones other than v
                x = row[t]
                if x != v and (got == 0 or row[got - 1] != x):
                    row[got] = x
                    got += 1
            tries += 1
        x = v
        while got < d:  # rare (a node as heavy as its community): the next ids not held
            x = (x + 1) % n
            present = False
            for t in range(got):
                if row[t] == x:
                    present = True
                    break
            if x != v and not present:
                row[got] = x
                got += 1
        row.sort()
        p += d

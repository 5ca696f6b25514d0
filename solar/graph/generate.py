"""A synthetic power-law graph with node features: ``solar gen --preset graph``.

Chung–Lu: node i's expected degree is proportional to ``(1 + i) ** -alpha`` (scaled to the
average degree asked for); each of N·D/2 edges joins two endpoints drawn independently in
proportion to those weights, both directions are stored, self-loops and repeated edges are
dropped. Node ids are then relabelled by a random permutation, so hot nodes are spread over the
file as in a real graph, not packed at its start (which would flatter page-sized reads).

Features are float32 rows of F values: the centroid of the node's class (8 classes) plus
Gaussian noise, so a GraphSAGE model has something to learn. Everything is a pure function of
the seed. The file is written atomically, its datasets contiguous and page-aligned (the
features are what solar reads with offsets; the topology is memory-mapped).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np

from solar._atomic import atomic_path
from solar.errors import SolarError

CLASSES = 8
_BLOCK_BYTES = 64 * 2**20  # bounded memory while writing features


def generate_graph(
    path: str | os.PathLike,
    nodes: int,
    avg_degree: float,
    features: int,
    *,
    seed: int = 0,
    alpha: float = 0.5,
    train_fraction: float = 0.1,
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """Write a power-law graph of ``nodes`` nodes to ``path`` (see the module's docstring):
    datasets ``indptr`` (N + 1,) int64, ``indices`` (E,) int32 or int64, ``features``
    (N, F) float32, ``labels`` (N,) int64, ``train_idx`` (sorted) int64."""
    for name, value in (("nodes", nodes), ("features", features)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise SolarError(f"{name} must be a positive integer, got {value!r}")
    if not (0 < avg_degree < nodes):
        raise SolarError(f"avg-degree must be in (0, nodes), got {avg_degree}")
    if not 0 < train_fraction <= 1:
        raise SolarError(f"train fraction must be in (0, 1], got {train_fraction}")
    if not 0 <= alpha < 1:
        raise SolarError(f"alpha must be in [0, 1), got {alpha}")
    rng = np.random.default_rng([seed, 21])
    indptr, indices = chung_lu(nodes, avg_degree, alpha, rng)
    labels = rng.integers(0, CLASSES, nodes)
    train = np.sort(rng.permutation(nodes)[: max(1, round(train_fraction * nodes))])
    centroids = np.random.default_rng([seed, 22]).standard_normal((CLASSES, features)) * 0.5
    block = max(1, _BLOCK_BYTES // (4 * features))
    with atomic_path(path) as tmp:
        with h5py.File(tmp, "w", alignment_threshold=1, alignment_interval=4096) as f:
            f.create_dataset("indptr", data=indptr)
            f.create_dataset("indices", data=indices)
            f.create_dataset("labels", data=labels)
            f.create_dataset("train_idx", data=train)
            x = f.create_dataset("features", (nodes, features), np.float32)
            for lo in range(0, nodes, block):
                hi = min(lo + block, nodes)
                noise = np.random.default_rng([seed, 23, lo]).standard_normal(
                    (hi - lo, features), np.float32
                )
                x[lo:hi] = noise + centroids[labels[lo:hi]].astype(np.float32)
                if progress is not None:
                    progress(hi, nodes)
    return Path(path)


def chung_lu(
    n: int, avg_degree: float, alpha: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """A symmetric Chung–Lu graph as CSR ``(indptr, indices)``, ids randomly relabelled."""
    w = (1.0 + np.arange(n)) ** -alpha
    cdf = np.cumsum(w / w.sum())
    cdf[-1] = 1.0
    m = round(n * avg_degree / 2)
    ends = np.searchsorted(cdf, rng.random(2 * m), side="right")
    relabel = rng.permutation(n)
    u, v = relabel[ends[:m]], relabel[ends[m:]]
    keep = u != v
    src = np.concatenate([u[keep], v[keep]])
    dst = np.concatenate([v[keep], u[keep]])
    key = np.unique(src.astype(np.int64) * n + dst)  # sorted by source, then target
    src, dst = np.divmod(key, n)
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=indptr[1:])
    return indptr, dst.astype(np.int32 if n < 2**31 else np.int64)

"""Node orders that put rows used at the same steps into the same pages.

A GNN's feature rows (512 B-2 KiB) are read in 4 KiB pages: a page read for one row brings
its page mates along, useful only if they are used at the same step (coalesced: one read) or
soon after (kept as page mates, :mod:`solar.schedule.draw.pagemates`). With nodes numbered at
random a page's other rows are random nodes, seldom in the same subgraph. DiskGNN (arXiv
2405.05231) reorders nodes so that a mini-batch's rows are packed; solar's converter may renumber
nodes when it writes a graph (the sampler's results are the same up to the renumbering), and
these orders are cheap proxies for "used together", computed in O(N + E):

* ``"degree"``: by degree, highest first. Neighbour sampling reaches a node about in proportion
  to its degree, so the rows read most often share pages with each other.
* ``"bfs"``: breadth-first from the highest-degree node (each new component from the highest
  unvisited one), neighbours in CSR order: a node's neighbours are numbered next to each
  other, and one hop of a sample draws several of them.
* ``"hybrid"`` (the default): the top ``hot`` share of nodes by degree first (hubs, read at
  most steps, packed together), then the rest in breadth-first order.

:func:`reorder_nodes` returns ``order``, a permutation: new id ``i`` is old node ``order[i]``;
the converter renumbers a graph by it as it writes it (:func:`solar.graph.write_graph`'s
``order``). ``bench/gnn_io_bench.py reorder`` measures rows per page read before and after.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from solar.errors import SolarError

METHODS = ("hybrid", "bfs", "degree", "none")


def reorder_nodes(
    indptr: np.ndarray, indices: np.ndarray, *, method: str = "hybrid", hot: float = 0.01
) -> np.ndarray:
    """A permutation ``order`` (int64, N) of the nodes of the CSR graph ``(indptr,
    indices)``: new id ``i`` is old node ``order[i]`` (module docstring for ``method``;
    ``hot``: the share of nodes the hybrid order puts first by degree). ``"none"``: the
    identity."""
    indptr = np.asarray(indptr, np.int64)
    indices = np.asarray(indices)
    n = indptr.size - 1
    if method not in METHODS:
        raise SolarError(f"reorder: method must be one of {', '.join(METHODS)}, got {method!r}")
    if n < 0 or indptr[0] != 0 or (n and np.any(np.diff(indptr) < 0)) or indptr[-1] != indices.size:
        raise SolarError("reorder: indptr must start at 0, not decrease, and end at len(indices)")
    if indices.size and (indices.min() < 0 or indices.max() >= n):
        raise SolarError(f"reorder: indices must be node ids in 0..{n - 1}")
    if not 0 <= hot <= 1:
        raise SolarError(f"reorder: hot must be a share in [0, 1], got {hot}")
    if method == "none" or n == 0:
        return np.arange(n, dtype=np.int64)
    by_degree = np.argsort(-np.diff(indptr), kind="stable").astype(np.int64)
    if method == "degree":
        return by_degree
    first = round(hot * n) if method == "hybrid" else 0
    return _bfs(indptr, indices, by_degree, first)


@njit(cache=True, nogil=True)
def _bfs(indptr, indices, by_degree, first):  # pragma: no cover - compiled
    """``by_degree[:first]``, then breadth-first over the rest, each new start the next
    unvisited node of ``by_degree``."""
    n = indptr.shape[0] - 1
    seen = np.zeros(n, np.bool_)
    order = np.empty(n, np.int64)
    for i in range(first):
        order[i] = by_degree[i]
        seen[by_degree[i]] = True
    head = tail = first
    s = first
    while tail < n:
        if head == tail:  # a new component (or the first start)
            while seen[by_degree[s]]:
                s += 1
            order[tail] = by_degree[s]
            seen[by_degree[s]] = True
            tail += 1
        v = order[head]
        head += 1
        for j in range(indptr[v], indptr[v + 1]):
            u = indices[j]
            if not seen[u]:
                seen[u] = True
                order[tail] = u
                tail += 1
    return order


def rows_per_page(
    steps: list[np.ndarray], row_bytes: int, offset: int = 0, page: int = 4096
) -> float:
    """Rows read per page read when each step reads rows ``steps[t]`` (node ids), every page
    once per step: the read amplification's inverse in rows (higher is better)."""
    rows = pages = 0
    for ids in steps:
        ids = np.unique(np.asarray(ids, np.int64))
        lo = (offset + ids * row_bytes) // page
        hi = (offset + ids * row_bytes + row_bytes - 1) // page
        rows += ids.size
        pages += np.unique(np.concatenate([lo, hi])).size
    return rows / max(1, pages)

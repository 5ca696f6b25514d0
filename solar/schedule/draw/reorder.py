"""Epoch order optimisation, as in SOLAR: order the epochs' permutations to chain well.

The weight of following epoch i by epoch j is how many of the last W samples of i are among the
first W of j, W = min(P·C, samples per epoch): what a buffer holding i's tail could serve at
j's start. The best open path through all epochs (an asymmetric TSP) is searched greedily from
every start, then improved by moving single epochs. With i.i.d. permutations the gain is small;
`bench/plan_bench.py` measures it.
"""

from __future__ import annotations

import numpy as np

from solar.config import RunConfig
from solar.schedule.draw.order import epoch_permutation, epoch_samples


def overlap_weights(run: RunConfig, capacity: int) -> np.ndarray:
    """``w[i, j]``: samples in the tail of epoch i that open epoch j."""
    width = min(run.world_size * capacity, run.samples_per_epoch)
    heads, in_tail = [], []
    for e in range(run.epochs):
        served = epoch_samples(run, epoch_permutation(run.seed, e, run.num_samples))
        heads.append(served[:width])
        mark = np.zeros(run.num_samples, np.bool_)
        mark[served[served.size - width :]] = True
        in_tail.append(mark)
    w = np.array([[np.count_nonzero(tail[h]) for h in heads] for tail in in_tail], np.int64)
    np.fill_diagonal(w, -1)
    return w


def path_weight(w: np.ndarray, order: np.ndarray) -> int:
    return int(w[order[:-1], order[1:]].sum())


def best_path(w: np.ndarray) -> np.ndarray:
    """A heavy open path through all nodes of ``w`` (greedy from each start, then or-opt)."""
    n = w.shape[0]
    best, best_weight = np.arange(n), path_weight(w, np.arange(n))
    for start in range(n):
        order, free = [start], np.ones(n, np.bool_)
        free[start] = False
        for _ in range(n - 1):
            row = np.where(free, w[order[-1]], np.iinfo(np.int64).min)
            nxt = int(np.argmax(row))
            order.append(nxt)
            free[nxt] = False
        weight = path_weight(w, np.array(order))
        if weight > best_weight:
            best, best_weight = np.array(order), weight
    return _or_opt(w, best)


def _or_opt(w: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Move single nodes to better positions while that increases the path weight."""
    improved = True
    current = path_weight(w, order)
    while improved:
        improved = False
        for i in range(order.size):
            rest = np.delete(order, i)
            for j in range(rest.size + 1):
                candidate = np.insert(rest, j, order[i])
                weight = path_weight(w, candidate)
                if weight > current:
                    order, current, improved = candidate, weight, True
                    break
            if improved:
                break
    return order


def reorder_epochs(run: RunConfig, capacity: int) -> np.ndarray:
    """The run's epoch order: ``order[k]`` is the permutation index used by epoch k."""
    if run.epochs < 2 or capacity == 0:
        return np.arange(run.epochs, dtype=np.int64)
    return best_path(overlap_weights(run, capacity)).astype(np.int64)

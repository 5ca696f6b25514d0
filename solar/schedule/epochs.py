"""The run's order one epoch at a time, and next uses from the epochs that follow.

Every epoch is a permutation, so the next use of a sample served in epoch k is its position
in epoch k+1 (with ``drop_last``, a sample left out of k+1 is looked up in k+2, and so on):
Belady needs a few epochs of order, never the whole run.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
from numba import njit

from solar.config import RunConfig
from solar.schedule._common import NEVER
from solar.schedule.order import epoch_permutation, epoch_samples


@njit(cache=True, nogil=True)
def _positions(served, base, pos):
    """``pos[x] = base + j`` for ``x = served[j]``; every other entry -1."""
    if served.shape[0] < pos.shape[0]:  # some samples are not served (drop_last)
        pos[:] = -1
    for j in range(served.shape[0]):
        pos[served[j]] = base + j


@njit(cache=True, nogil=True)
def _fill_next(seq, pending, pos, out):
    """Resolve ``out[i]`` for pending ``i`` found in ``pos``; returns the still-pending ones."""
    left = 0
    for j in range(pending.shape[0]):
        i = pending[j]
        p = pos[seq[i]]
        if p >= 0:
            out[i] = p
        else:
            pending[left] = i
            left += 1
    return pending[:left]


class EpochOrder:
    """Served samples of each run epoch (``epoch_order[k]`` names its permutation), generated on
    demand; the last few are kept, since planning epoch k reads epochs k and k+1."""

    def __init__(self, run: RunConfig, epoch_order: np.ndarray, keep: int = 4) -> None:
        self.run = run
        self.epoch_order = epoch_order
        self._keep = keep
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()
        self._pos: np.ndarray | None = None
        self._ahead: dict[int, Future[np.ndarray]] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._pid = os.getpid()

    def _draw(self, k: int) -> np.ndarray:
        perm = epoch_permutation(self.run.seed, int(self.epoch_order[k]), self.run.num_samples)
        return epoch_samples(self.run, perm)

    def prefetch(self, k: int) -> None:
        """Start drawing epoch ``k``'s order in a background thread. numpy holds the GIL while
        it shuffles, but the planning kernels release it, so the two overlap on two cores."""
        if os.getpid() != self._pid:  # forked: the pool's thread did not come along
            self._pid, self._pool, self._ahead = os.getpid(), None, {}
        if k >= self.run.epochs or k in self._cache or k in self._ahead:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="solar-order")
        self._ahead[k] = self._pool.submit(self._draw, k)

    def served(self, k: int) -> np.ndarray:
        """Samples served by run epoch ``k``, in order: shape (samples per epoch,)."""
        got = self._cache.get(k)
        if got is None:
            ahead = self._ahead.pop(k, None) if os.getpid() == self._pid else None
            got = self._cache[k] = ahead.result() if ahead is not None else self._draw(k)
            while len(self._cache) > self._keep:
                self._cache.popitem(last=False)
        return got

    def next_use(self, k: int, seq: np.ndarray) -> np.ndarray:
        """Global position of the next access to each of epoch ``k``'s samples ``seq`` (NEVER
        if none): shape (samples per epoch,) int64."""
        run = self.run
        out = np.full(seq.shape[0], NEVER, np.int64)
        if self._pos is None:
            self._pos = np.empty(run.num_samples, np.int64)
        pending = np.arange(seq.shape[0], dtype=np.int64)
        for later in range(k + 1, run.epochs):
            _positions(self.served(later), later * run.samples_per_epoch, self._pos)
            pending = _fill_next(seq, pending, self._pos, out)
            if pending.size == 0:
                break
        return out

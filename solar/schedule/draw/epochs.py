"""The run's order one epoch at a time, and next uses from the epochs that follow.

Every epoch is a permutation, so the next use of a sample served in epoch k is its position
in epoch k+1 (with ``drop_last``, a sample left out of k+1 is looked up in k+2, and so on):
Belady needs a few epochs of order, never the whole run.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
from numba import njit

from solar._kept import Kept
from solar._process import ProcessLocal
from solar.config import RunConfig
from solar.schedule.draw.order import epoch_permutation, epoch_samples
from solar.schedule.policy import NEVER


@njit(cache=True, nogil=True)
def _positions(served, base, pos):
    """``pos[x] = base + j`` for ``x = served[j]``; every other entry -1."""
    if served.shape[0] < pos.shape[0]:  # some samples are not served (drop_last)
        pos[:] = -1
    for j in range(served.shape[0]):
        pos[served[j]] = base + j


@njit(cache=True, nogil=True)
def _fill_first(seq, pos, unserved, out):
    """``out[i] = pos[seq[i]]`` where found; returns the ``i`` not found, at most
    ``unserved`` (the samples ``pos``'s epoch leaves out: drop_last)."""
    pending = np.empty(unserved, np.int64)
    left = 0
    for i in range(seq.shape[0]):
        p = pos[seq[i]]
        if p >= 0:
            out[i] = p
        else:
            if left == unserved:  # only if seq repeats a sample: never write past the end
                raise ValueError("next uses asked for a repeated sample")
            pending[left] = i
            left += 1
    return pending[:left]


class EpochOrder:
    """Served samples of each run epoch (``epoch_order[k]`` names its permutation), generated on
    demand; the last few are kept, since planning epoch k reads epochs k and k+1.

    One background thread works ahead: :meth:`prefetch` draws an epoch's order there, and
    :meth:`ahead` also computes its next uses, so that the planner finds both ready while its
    kernel (which releases the GIL) runs on the epoch before. The cache (each epoch drawn once)
    and the position buffer are guarded by locks, so the caller may use :meth:`served`
    meanwhile.
    """

    def __init__(self, run: RunConfig, epoch_order: np.ndarray, keep: int = 4) -> None:
        self.run = run
        self.epoch_order = epoch_order
        self._cache: Kept[np.ndarray] = Kept(keep)
        self._pos: np.ndarray | None = None
        self._pos_lock = threading.Lock()
        self._spare: list[np.ndarray] = []  # next-use buffers handed back: no fresh pages
        # The background thread and its jobs, per process: a forked child's did not come along.
        self._bg: ProcessLocal[_Background] = ProcessLocal(_Background)

    def _draw(self, k: int) -> np.ndarray:
        perm = epoch_permutation(self.run.seed, int(self.epoch_order[k]), self.run.num_samples)
        return epoch_samples(self.run, perm)

    def _submit(self, kind: str, k: int, fn, *args) -> None:
        bg = self._bg.get()
        if k >= self.run.epochs or (kind, k) in bg.jobs:
            return
        bg.jobs[kind, k] = bg.pool.submit(fn, *args)

    def _take(self, kind: str, k: int) -> Future | None:
        """The job started for (kind, k), if any and if waiting for it cannot deadlock: never
        in the pool's own thread, where it would wait for a job queued behind itself."""
        bg = self._bg.here()
        if bg is None or getattr(bg.local, "worker", False):
            return None
        return bg.jobs.pop((kind, k), None)

    def prefetch(self, k: int) -> None:
        """Start drawing epoch ``k``'s order in the background thread (numpy's shuffle and the
        planning kernels both release the GIL, so the two overlap on two cores)."""
        if k not in self._cache:
            self._submit("served", k, self._draw, k)

    def ahead(self, k: int) -> None:
        """Start computing epoch ``k``'s order and next uses in the background thread."""
        self._submit("next_use", k, self._with_next_use, k)

    def with_next_use(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Epoch ``k``'s served samples and their next uses (see :meth:`next_use`): from the
        background thread if :meth:`ahead` started them, else computed now."""
        job = self._take("next_use", k)
        return job.result() if job is not None else self._with_next_use(k)

    def _with_next_use(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        seq = self.served(k)
        return seq, self.next_use(k, seq)

    def served(self, k: int) -> np.ndarray:
        """Samples served by run epoch ``k``, in order: shape (samples per epoch,)."""

        def make() -> np.ndarray:
            # (A "served" job draws without the cache: waiting for it cannot wait for this.)
            job = self._take("served", k)
            return job.result() if job is not None else self._draw(k)

        return self._cache.get(k, make)

    def recycle(self, next_use: np.ndarray) -> None:
        """Hand back a next-use array no longer used, to be filled again for a later epoch."""
        if next_use.shape == (self.run.samples_per_epoch,) and len(self._spare) < 2:
            self._spare.append(next_use)

    def next_use(self, k: int, seq: np.ndarray) -> np.ndarray:
        """Global position of the next access to each of epoch ``k``'s samples ``seq`` (NEVER
        if none): shape (samples per epoch,) int64."""
        run = self.run
        out = self._spare.pop() if self._spare else np.empty(0, np.int64)
        if out.shape != seq.shape:
            out = np.empty(seq.shape, np.int64)
        out.fill(NEVER)
        with self._pos_lock:
            if self._pos is None:
                self._pos = np.empty(run.num_samples, np.int64)
            for later in range(k + 1, run.epochs):
                _positions(self.served(later), later * run.samples_per_epoch, self._pos)
                if later == k + 1:
                    unserved = run.num_samples - run.samples_per_epoch
                    pending = _fill_first(seq, self._pos, unserved, out)
                else:  # the few samples left out of every epoch so far (drop_last)
                    found = self._pos[seq[pending]]
                    out[pending[found >= 0]] = found[found >= 0]
                    pending = pending[found < 0]
                if pending.size == 0:
                    break
        return out


class _Background:
    """An EpochOrder's thread and the jobs it was given, in one process."""

    def __init__(self) -> None:
        self.jobs: dict[tuple[str, int], Future] = {}
        self.local = threading.local()  # marks the pool's own thread
        self.pool = ThreadPoolExecutor(
            1, thread_name_prefix="solar-order", initializer=self._mark_worker
        )

    def _mark_worker(self) -> None:
        self.local.worker = True

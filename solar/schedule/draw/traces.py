"""A general sampler's trace one epoch at a time, and next uses over a horizon.

A rank's accesses at a step are the distinct ids of its batch, in first-occurrence order (a
repeat within the batch is a copy, not a second read). Without affinity the planner keys them
by (rank, sample) pairs, ``rank * N + sample``: each rank is a cache of its own. With affinity
(the planner splits each global batch) an epoch is the sequence of each global batch's
distinct ids, keyed by sample, who serves each left to the planner (``rank`` all 0 here,
``counts`` one column). The next use of an access is the position of the same key's next
access: positions are ``(epoch << 40) + index``, ordering accesses whatever the epochs' lengths.

Next uses are looked up ``horizon`` epochs ahead (beyond: NEVER, evicted first): epoch k's
come from one backward pass over epochs k..k+H. With the horizon reaching the end of the run
(the default when the run's trace fits the memory budget) one pass over the rest of the run
serves every later epoch. Under skew a sample's next draw may be epochs away; the planner's
hits against the horizon are what ``bench/sampler_bench.py`` reports.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from numba import njit

from solar.config import RunConfig
from solar.schedule.draw.draws import EpochDraws, RankDraws, every_rank
from solar.schedule.draw.order import sample_dtype
from solar.schedule.draw.pagemates import LOOK_AHEAD, LaterUses, PageLayout
from solar.schedule.draw.samplers import Sampler
from solar.schedule.policy import EPOCH_SHIFT, NEVER

# Bytes the planner holds per access of the horizon: its pair id, next use, sample, rank and
# decisions (measured: bench/sampler_bench.py).
BYTES_PER_ACCESS = 40


@dataclass(frozen=True)
class EpochTrace:
    """One epoch's accesses, step-major then rank-major: rank r's accesses at the epoch's step
    t are ``[bounds[t] + counts[t, :r].sum(), ...)``, ``counts[t, r]`` of them: the distinct
    ids of its batch, in first-occurrence order until the planner puts its hits first."""

    sample: np.ndarray  # (A,) sample ids (sample_dtype)
    pair: np.ndarray  # (A,) int64 rank * N + sample
    rank: np.ndarray  # (A,) int16
    counts: np.ndarray  # (steps, P) int32: distinct ids per rank and step
    bounds: np.ndarray  # (steps + 1,) int64: each global step's first access


@njit(cache=True, nogil=True)
def _distinct(ids, offsets, world, stamp, base, sample_out, rank_out, counts):
    """Per (step, rank) batch ``g`` of ``ids``, its distinct ids in first-occurrence order;
    ``stamp[x]`` (carried across calls, ``base`` makes each batch's stamp new) marks ids seen
    in the current batch. Returns the number of accesses."""
    n = 0
    for g in range(offsets.shape[0] - 1):
        tag = base + g
        c = 0
        for j in range(offsets[g], offsets[g + 1]):
            x = ids[j]
            if stamp[x] != tag:
                stamp[x] = tag
                sample_out[n] = x
                rank_out[n] = g % world
                n += 1
                c += 1
        counts[g // world, g % world] = c
    return n


@njit(cache=True, nogil=True)
def _backward(pair, base, nu, last):
    """One epoch of a backward pass: ``nu[i]`` = ``last[pair[i]]`` (the next use seen so far,
    NEVER if none), then ``last[pair[i]]`` = this access's position ``base + i``."""
    for i in range(pair.shape[0] - 1, -1, -1):
        v = pair[i]
        nu[i] = last[v]
        last[v] = base + i


@njit(cache=True, nogil=True)
def _forget(pair, last):
    """``last[v]`` = NEVER again for every id of ``pair``."""
    for i in range(pair.shape[0]):
        last[pair[i]] = NEVER


class TraceOrder:
    """The trace of a sampler's run, epoch by epoch, with next uses ``horizon`` epochs ahead
    (None: the whole run if it fits, else the most epochs that do). ``draws``: a rank's
    :class:`RankDraws`, which keeps its draws for its runtime to serve: the draws of that rank
    are taken from it (default: drawn here), whether it plans alone or every rank."""

    traced = True

    def __init__(
        self,
        run: RunConfig,
        sampler: Sampler,
        horizon: int | None = None,
        affinity: bool = False,
        only_rank: int | None = None,
        pages: PageLayout | None = None,
        draws: RankDraws | None = None,
    ) -> None:
        self.run, self.sampler = run, sampler
        self.affinity = affinity
        self.pages = pages  # where the traced rows lie, for a policy that reads page mates
        # Without affinity each rank's decisions depend on its own accesses alone: a rank
        # planning for itself draws only its own batches (the others' are empty).
        self.only_rank = None if affinity else only_rank
        if draws is not None and (affinity or draws.run != run or
                                  self.only_rank not in (None, draws.rank)):  # fmt: skip
            draws = None  # (another run's or rank's: drawn here)
        self._rank_draws = draws
        self.horizon = default_horizon(run, sampler) if horizon is None else max(0, int(horizon))
        self._keys = run.num_samples * (1 if self.affinity else run.world_size)
        self._last_table: np.ndarray | None = None  # made when next uses are first asked for
        self._lock = threading.Lock()
        self._epochs: dict[int, EpochTrace] = {}
        self._front = 0  # the epoch being planned: the ones before it are done with
        self._nu: dict[int, np.ndarray] = {}  # next uses computed once for the rest of the run

    def epoch(self, k: int) -> EpochTrace:
        """Run epoch ``k``'s accesses (the last few are kept)."""
        with self._lock:
            got = self._epochs.get(k)
            if got is None:
                got = self._epochs[k] = self._make(k)
                lo, hi = self._front, self._front + self.horizon + 1
                for old in [e for e in self._epochs if not lo - 1 <= e <= hi]:
                    del self._epochs[old]
            return got

    def _make(self, k: int) -> EpochTrace:
        run = self.run
        draws = self.draws(k)
        ids, offsets = draws.ids, draws.offsets
        world, steps = run.world_size, run.steps_per_epoch
        if offsets.shape != (steps * world + 1,):
            raise ValueError(f"sampler: epoch {k} has {offsets.size - 1} batches, expected "
                             f"{steps} steps × {world} ranks")  # fmt: skip
        if self.affinity:  # one batch per global step, split by the planner
            offsets, world = offsets[::world], 1
        sample = np.empty(ids.size, sample_dtype(run.num_samples))
        rank = np.empty(ids.size, np.int16)
        counts = np.zeros((steps, world), np.int32)
        stamp = np.full(run.num_samples, -1, np.int64)  # per call: epochs are drawn in threads
        n = _distinct(ids, offsets, world, stamp, 0, sample, rank, counts)
        if n < ids.size:  # (a sampler's batches of distinct ids, as a neighbour sampler's,
            sample, rank = sample[:n].copy(), rank[:n].copy()  # are kept as they are)
        bounds = np.zeros(steps + 1, np.int64)
        np.cumsum(counts.sum(axis=1), out=bounds[1:])
        pair = rank.astype(np.int64)  # rank * N + sample, in place: no temporaries
        pair *= run.num_samples
        pair += sample
        return EpochTrace(sample, pair, rank, counts, bounds)

    def draws(self, k: int) -> EpochDraws:
        """The sampler's draws of epoch ``k`` (only ``only_rank``'s, if set)."""
        mine = self._rank_draws
        if self.only_rank is None:
            if mine is None:
                return self.sampler.epoch(self.run, k)
            # Every rank planned: the rank's own draws kept for it, the others' drawn here.
            return every_rank(self.run, {r: mine.source(k, r) for r in range(self.run.world_size)})
        if mine is not None:
            return mine.epoch(k)
        return self.sampler.rank_epoch(self.run, k, self.only_rank)

    @property
    def _last(self) -> np.ndarray:
        """The backward pass's table, one entry per key: N (affinity) or P·N."""
        if self._last_table is None:
            self._last_table = np.full(self._keys, NEVER, np.int64)
        return self._last_table

    def served(self, k: int) -> np.ndarray:
        """Run epoch ``k``'s accesses' sample ids."""
        return self.epoch(k).sample

    def with_next_use(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Epoch ``k``'s (rank, sample) ids and their next uses (positions, NEVER for none
        within the horizon)."""
        with self._lock:
            self._front = k
            nu = self._nu.pop(k, None)
        if nu is None:
            nu = self._window(k)
        return self.epoch(k).pair, nu

    def _window(self, k: int) -> np.ndarray:
        end = min(self.run.epochs, k + self.horizon + 1)
        with self._lock:
            missing = [e for e in range(k, end) if e not in self._epochs]
        if len(missing) > 1:  # drawn side by side: the kernels and numpy release the GIL
            with ThreadPoolExecutor(2, thread_name_prefix="solar-trace") as pool:
                made = dict(zip(missing, pool.map(self._make, missing), strict=True))
            with self._lock:
                for e, t in made.items():
                    self._epochs.setdefault(e, t)
        parts = [self.epoch(e) for e in range(k, end)]
        nus = [np.empty(p.pair.size, np.int64) for p in parts]
        with self._lock:  # latest epoch first: each access sees the next use after it
            for e, p, nu in zip(range(end - 1, k - 1, -1), parts[::-1], nus[::-1], strict=True):
                _backward(p.pair, np.int64(e) << EPOCH_SHIFT, nu, self._last)
            for p in parts:
                _forget(p.pair, self._last)
        if end == self.run.epochs:  # the window reaches the end: later epochs' are final
            with self._lock:
                self._nu.update({e: nu for e, nu in zip(range(k + 1, end), nus[1:], strict=True)})
        return nus[0]

    def later_uses(self, k: int) -> LaterUses:
        """Each key's first use in epoch ``k`` and the next (within the horizon;
        :mod:`solar.schedule.draw.pagemates`): when a row not accessed now is next used. Raises
        SolarError if a rank planning alone was given another rank's keys."""
        end = min(self.run.epochs, k + min(self.horizon, LOOK_AHEAD) + 1)
        pairs = [self.epoch(e).pair for e in range(k, end)]
        if self.only_rank is None:
            return LaterUses.of(k, pairs, 0, self._keys)
        n = self.run.num_samples  # a rank planning alone draws only its own keys
        return LaterUses.of(k, pairs, self.only_rank * n, n)

    def next_use(self, k: int, pairs: np.ndarray) -> np.ndarray:
        """The first position after epoch ``k`` (within the horizon of epoch k + 1) of each of
        ``pairs``: what a snapshot's held ids need on restore."""
        out = np.full(pairs.size, NEVER, np.int64)
        for e in range(k + 1, min(self.run.epochs, k + self.horizon + 2)):
            t = self.epoch(e).pair
            order = np.argsort(t, kind="stable")
            at = np.searchsorted(t[order], pairs)
            at = np.minimum(at, max(t.size - 1, 0))
            found = (t.size > 0) & (t[order][at] == pairs) & (out == NEVER)
            out[found] = (np.int64(e) << EPOCH_SHIFT) + order[at[found]]
        return out

    def ahead(self, k: int) -> None:
        """(Shuffle's order works ahead in a thread; a trace is drawn when asked.)"""

    prefetch = ahead

    def recycle(self, next_use: np.ndarray) -> None:
        """(Nothing to recycle.)"""


# The trace a default horizon may hold: a constant, not the memory free now, so that every rank
# (and every resume) resolves the same horizon for the same run.
HORIZON_BUDGET = 4 << 30


def default_horizon(run: RunConfig, sampler: Sampler | None = None) -> int:
    """Epochs of look-ahead: the sampler's own ``horizon`` if it has one, else the whole run
    if its trace fits ``HORIZON_BUDGET`` (at most ``BYTES_PER_ACCESS`` per access), else the
    most epochs that do (at least 1). A pure function of the run (and sampler): ranks that
    plan alike must look equally far."""
    if sampler is not None and sampler.horizon is not None:
        return int(min(max(0, run.epochs - 1), sampler.horizon))
    per_epoch = max(1, run.samples_per_epoch) * BYTES_PER_ACCESS
    return int(max(1, min(run.epochs - 1, HORIZON_BUDGET // per_epoch - 1)))

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

An epoch whose trace does not fit (:func:`default_window`), or a plan asked so
(``PlanSpec.window``), is planned in windows of W steps (:meth:`TraceOrder.windows`): each
window's next uses come from a backward pass over it and the window after it (the next
epoch's first, for the last, within the horizon), each window drawn once (the sampler's
``window``). The planner then holds two windows of trace, not two epochs; a reuse farther
than the next window is not seen (bench/window_hits.py: the hits a window costs).

Every table of a pass is sized by the keys it touches, numbered densely
(:mod:`solar.schedule.draw.keyspace`), never by N or P·N: a window's keys, or an epoch's and its
look-ahead's (issue 48).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from numba import njit

from solar.config import RunConfig
from solar.errors import SolarError
from solar.schedule.draw.draws import EpochDraws, RankDraws, every_rank, steps_of
from solar.schedule.draw.keyspace import distinct_batches, number_keys
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


@dataclass(frozen=True)
class Window:
    """Steps ``first_step ..`` of epoch ``epoch`` (``trace``: their accesses, as an epoch's),
    with each access's next use (global positions) up to the end of the window after it, and
    page mates' next uses over the two (``later``, given a page layout). ``offset``: its first
    access's index within the epoch. ``keys``: the distinct keys of the window and the window
    after it, sorted (the local keys of ``later``'s rows); ``local``: the window's accesses
    as local keys (keyspace.py)."""

    epoch: int
    first_step: int
    offset: int
    trace: EpochTrace
    next_use: np.ndarray  # (accesses,) int64
    keys: np.ndarray  # (keys,) int64, sorted
    local: np.ndarray  # (accesses,) int64: indices into keys
    later: LaterUses | None = None


@njit(cache=True, nogil=True)
def _backward(pair, shift, base, nu, last):
    """One epoch of a backward pass over local keys ``pair - shift`` (keyspace.Numbering):
    ``nu[i]`` = ``last[v]`` (the next use seen so far, NEVER if none), then ``last[v]`` =
    this access's position ``base + i``."""
    for i in range(pair.shape[0] - 1, -1, -1):
        v = pair[i] - shift
        nu[i] = last[v]
        last[v] = base + i


@njit(cache=True, nogil=True)
def _remember(pair, shift, base, last):
    """:func:`_backward` keeping no next uses: ``last[pair[i] - shift]`` = ``base + i``, the
    first access of each key (a window's look-ahead, whose own next uses are not asked)."""
    for i in range(pair.shape[0] - 1, -1, -1):
        last[pair[i] - shift] = base + i


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
        window: int | None = None,
    ) -> None:
        self.run, self.sampler = run, sampler
        # Steps per window of an epoch planned in windows (None: whole epochs).
        self.window = None if window is None else max(1, min(int(window), run.steps_per_epoch))
        self._ahead: dict[tuple[int, int], EpochTrace] = {}  # the window drawn as look-ahead
        self.affinity = affinity
        # Batches of distinct ids (Sampler.distinct) traced as drawn; not under affinity: a
        # global step's batch, the ranks' joined, may repeat an id.
        self.distinct = sampler.distinct and not affinity
        self.pages = pages  # where the traced rows lie, for a policy that reads page mates
        # Without affinity each rank's decisions depend on its own accesses alone: a rank
        # planning for itself draws only its own batches (the others' are empty).
        self.only_rank = None if affinity else only_rank
        if draws is not None and (affinity or draws.run != run or
                                  self.only_rank not in (None, draws.rank)):  # fmt: skip
            draws = None  # (another run's or rank's: drawn here)
        self._rank_draws = draws
        self.horizon = default_horizon(run, sampler) if horizon is None else max(0, int(horizon))
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
        return self._trace(self.draws(k), k, self.run.steps_per_epoch)

    def _trace(self, draws: EpochDraws, k: int, steps: int) -> EpochTrace:
        """The accesses of ``draws``, ``steps`` steps of epoch ``k`` (an epoch, or a window)."""
        run = self.run
        ids, offsets = draws.ids, draws.offsets
        world = run.world_size
        if offsets.shape != (steps * world + 1,):
            raise ValueError(f"sampler: epoch {k} has {offsets.size - 1} batches, expected "
                             f"{steps} steps × {world} ranks")  # fmt: skip
        n_samples = run.num_samples
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= n_samples):
            # (once here: every table after it is indexed by these ids, unchecked)
            raise SolarError(f"sampler {type(self.sampler).__name__}: epoch {k} draws a sample "
                             f"id outside 0..{n_samples - 1}")  # fmt: skip
        if self.affinity:  # one batch per global step, split by the planner
            offsets, world = offsets[::world], 1
        sample = np.empty(ids.size, sample_dtype(run.num_samples))
        rank = np.empty(ids.size, np.int16)
        counts = np.zeros((steps, world), np.int32)
        n = distinct_batches(ids, offsets, world, sample, rank, counts, self.distinct)
        if self.only_rank is not None and np.delete(counts, self.only_rank, 1).any():
            # (once here: a rank planned alone has one row of tables, indexed rank - only_rank)
            raise SolarError(f"sampler {type(self.sampler).__name__}: epoch {k} gives batches "
                             f"of ranks other than {self.only_rank}, planned alone (its "
                             "rank_epoch must leave the others' batches empty)")  # fmt: skip
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

    # -- an epoch in windows of steps ------------------------------------------------------------
    @property
    def window_count(self) -> int:
        """Windows of an epoch (1: planned whole)."""
        w = self.window or self.run.steps_per_epoch
        return -(-self.run.steps_per_epoch // w)

    def _steps(self, j: int) -> tuple[int, int]:
        w = self.window or self.run.steps_per_epoch
        return j * w, min((j + 1) * w, self.run.steps_per_epoch)

    def window_draws(self, k: int, j: int) -> EpochDraws:
        """The draws of window ``j`` of epoch ``k`` (of ``only_rank`` alone, if set): a
        rank's kept draws cut, else the sampler's ``window``."""
        t0, t1 = self._steps(j)
        mine = self._rank_draws
        if mine is not None and self.only_rank is not None:
            return steps_of(mine.epoch(k), self.run, t0, t1)
        return self.sampler.window(self.run, k, t0, t1, self.only_rank)

    def window_trace(self, k: int, j: int) -> EpochTrace:
        """Window ``j`` of epoch ``k``'s accesses: the one drawn as look-ahead, or drawn now."""
        with self._lock:
            got = self._ahead.pop((k, j), None)
        return self._draw_window(k, j) if got is None else got

    def _draw_window(self, k: int, j: int) -> EpochTrace:
        t0, t1 = self._steps(j)
        return self._trace(self.window_draws(k, j), k, t1 - t0)

    def _next_window(self, k: int, j: int) -> tuple[int, int] | None:
        """The window after window ``j`` of epoch ``k`` within the horizon (None: none)."""
        if j + 1 < self.window_count:
            return k, j + 1
        if k + 1 < self.run.epochs and self.horizon >= 1:
            return k + 1, 0
        return None

    def windows(self, k: int) -> Iterator[Window]:
        """Epoch ``k`` window by window, in order, each with its next uses up to the end of
        the window after it (:class:`Window`); the window after is drawn once, kept for its
        turn. Memory: two windows of trace."""
        offset = 0
        with self._lock:
            self._front = k
            self._epochs.clear()  # (whole epochs are not held beside windows)
        for j in range(self.window_count):
            trace = self.window_trace(k, j)
            nxt = self._next_window(k, j)
            ahead = None if nxt is None else self._draw_window(*nxt)
            base = (np.int64(k) << EPOCH_SHIFT) + offset
            # Where the window after begins (its own epoch's start, if the next epoch's).
            after = base + trace.pair.size if nxt is None or nxt[0] == k else \
                np.int64(nxt[0]) << EPOCH_SHIFT  # fmt: skip
            nu = np.empty(trace.pair.size, np.int64)
            num = number_keys([trace.pair] if ahead is None else [trace.pair, ahead.pair])
            last = np.full(num.keys.size, NEVER, np.int64)
            if ahead is not None:  # its first uses: where the window's next uses end
                assert nxt is not None
                with self._lock:
                    self._ahead = {nxt: ahead}
                _remember(num.arrays[1], num.shift, after, last)
            _backward(num.arrays[0], num.shift, base, nu, last)
            del last
            local = num.local(0)  # (its plan reorders it)
            later = None
            if self.pages is not None:
                starts = [int(base), int(after)][: len(num.arrays)]
                limit = int(after) + ahead.pair.size if ahead is not None else \
                    int(base) + trace.pair.size  # fmt: skip
                later = LaterUses.at(k, num, local, starts, limit)
            size = trace.pair.size
            yield Window(k, self._steps(j)[0], offset, trace, nu, num.keys, local, later)
            del trace, nu, later, ahead, num, local  # (let go before the next is drawn)
            offset += size

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
        # The later epochs' next uses are final only where the window reaches the run's end
        # (kept for their turn); else only their first uses are needed: no array of them.
        final = end == self.run.epochs
        nus = [np.empty(p.pair.size, np.int64) for p in (parts if final else parts[:1])]
        num = number_keys([p.pair for p in parts])
        last = np.full(num.keys.size, NEVER, np.int64)
        # Latest epoch first: each access sees the next use after it.
        for e in range(end - 1, k - 1, -1):
            base = np.int64(e) << EPOCH_SHIFT
            if final or e == k:
                _backward(num.arrays[e - k], num.shift, base, nus[e - k], last)
            else:
                _remember(num.arrays[e - k], num.shift, base, last)
        del last, num
        if final:
            with self._lock:
                self._nu.update({e: nu for e, nu in zip(range(k + 1, end), nus[1:], strict=True)})
        return nus[0]

    def later_uses(self, k: int) -> LaterUses:
        """Each key's first use in epoch ``k`` and the next (within the horizon;
        :mod:`solar.schedule.draw.pagemates`): when a row not accessed now is next used; with
        epoch ``k``'s accesses as local keys (``local``: one numbering for its plan)."""
        end = min(self.run.epochs, k + min(self.horizon, LOOK_AHEAD) + 1)
        num = number_keys([self.epoch(e).pair for e in range(k, end)])
        starts = [e << EPOCH_SHIFT for e in range(k, end)]
        return LaterUses.at(k, num, num.local(0), starts, end << EPOCH_SHIFT)

    def next_use(self, k: int, pairs: np.ndarray) -> np.ndarray:
        """The first position after epoch ``k`` (within the horizon of epoch k + 1) of each of
        ``pairs``: what a snapshot's held ids need on restore."""
        out = np.full(pairs.size, NEVER, np.int64)
        later = range(k + 1, min(self.run.epochs, k + self.horizon + 2))
        if self.window is not None:  # the window after the epoch's last, if any
            later = later[: min(1, self.horizon)]
        for e in later:
            # (planned in windows, the keys as epoch k + 1 starts look into its first window)
            t = self.epoch(e).pair if self.window is None else self._draw_window(e, 0).pair
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


# The trace an epoch planned whole may hold with its look-ahead (two epochs of it, at
# ``BYTES_PER_ACCESS``): beyond, it is planned in windows of steps that do fit. A constant, as
# ``HORIZON_BUDGET``: every rank (and every resume) cuts an epoch alike.
WINDOW_BUDGET = 6 << 30


def step_accesses(run: RunConfig, sampler: Sampler, typical: bool = True) -> int:
    """About this many accesses in a step of a sampler's trace, over every rank: the
    sampler's typical batch (a few drawn; ``typical`` False: never drawn), else its bound, or
    a step's draws if more."""
    drawn = sampler.typical_batch(run) if typical else None
    batch = sampler.batch_bound(run) if drawn is None else drawn
    return int(max(run.global_batch, batch * run.world_size))


def default_window(run: RunConfig, sampler: Sampler) -> int | None:
    """Steps per window of an epoch planned in windows where its trace and its look-ahead
    do not fit ``WINDOW_BUDGET`` (the most that do, with one window of look-ahead; at least
    1), else None: whole epochs. A pure function of the run and sampler; a run that fits by
    the sampler's bound draws nothing to know it."""
    for typical in (False, True):
        per_step = step_accesses(run, sampler, typical) * BYTES_PER_ACCESS
        if 2 * per_step * run.steps_per_epoch <= WINDOW_BUDGET:
            return None
    return int(max(1, WINDOW_BUDGET // (2 * per_step)))

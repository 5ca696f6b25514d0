"""Page mates: rows that share a page with a step's reads, and when each is next used.

Small rows (a GNN's feature rows: 512 B–2 KiB) are read in whole pages, so a page read for a
miss brings its neighbours' bytes along. Belady over rows alone cannot use them; the planner
can: after a step's own decisions it offers each such page mate to the buffer as a free read,
kept if its next use is sooner than the farthest held (:func:`solar.schedule.keep.belady._mates`).
The runtime reads the kept ones with the step's reads and stores them as it stores
admissions: a side row of the step (``SIDE``), never served. Under O_DIRECT a step's rows are
read in page spans (solar.io.tasks.PageGather): its side rows add no page and no request;
buffered, the kernel has read their pages with the reads' anyway.

This module holds the pure parts: the layout that says which rows share a page
(:class:`PageLayout`), the index of next uses by (rank, sample) key over the epoch planned and
the next (:class:`LaterUses`, ``LOOK_AHEAD``), and the merge of a step's side rows after its
batch (:func:`with_sides`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from solar._memory import PAGE
from solar.errors import SolarError
from solar.schedule.policy import EPOCH_SHIFT


@dataclass(frozen=True)
class PageLayout:
    """Sample ``x``'s row is bytes ``[offset + x·row_bytes, + row_bytes)`` of the file read,
    read in ``page``-byte pages: rows wholly inside one page are its mates."""

    offset: int
    row_bytes: int
    page: int = PAGE

    def __post_init__(self) -> None:
        ok = all(isinstance(v, int) and not isinstance(v, bool) for v in self.as_record())
        if not ok or self.offset < 0 or self.row_bytes < 1 or self.page < 1:
            raise SolarError(f"pages: offset >= 0, row_bytes >= 1 and page >= 1 bytes, got "
                             f"{self.as_record()}")  # fmt: skip

    def as_record(self) -> list[int]:
        """``[offset, row_bytes, page]``: what a plan file records."""
        return [self.offset, self.row_bytes, self.page]

    @classmethod
    def from_record(cls, rec: object) -> PageLayout:
        """The layout :meth:`as_record` recorded."""
        if not isinstance(rec, list) or len(rec) != 3:
            raise SolarError(f"pages: expected [offset, row_bytes, page], got {rec!r}")
        return cls(*rec)

    @staticmethod
    def worth_it(row_bytes: int, page: int = PAGE) -> bool:
        """Whether a page holds at least two whole rows: else a read brings no mate along."""
        return 0 < 2 * row_bytes <= page


# Epochs after the current one whose uses a page mate's next use is looked for: a row used
# later than that is not kept (it would be evicted before then anyway); the index stays O(A).
LOOK_AHEAD = 1


@dataclass(frozen=True)
class LaterUses:
    """Every access position of epoch ``epoch`` and the next few (a window of the trace:
    ``starts[e]`` is the window position where epoch ``epoch + e`` begins), grouped by key:
    key ``base + v``'s positions, ascending, are ``pos[first[v]:first[v + 1]]`` (a counting
    sort, O(window + keys))."""

    epoch: int
    base: int  # the first key indexed (a rank planning alone: its own keys only)
    first: np.ndarray  # (keys + 1,) int32 (int64 for a window of 2^31 accesses or more)
    pos: np.ndarray  # (window,) as first
    starts: np.ndarray  # (epochs in window + 1,) int64

    @classmethod
    def of(cls, epoch: int, pairs: list[np.ndarray], base: int, keys: int) -> LaterUses:
        """The index of the window whose epochs' keys, in order, are ``pairs``, all within
        ``base .. base + keys - 1``."""
        starts = np.zeros(len(pairs) + 1, np.int64)
        np.cumsum([p.size for p in pairs], out=starts[1:])
        # (one epoch's keys are used as they are: no copy of the window, 8 B per access)
        window = pairs[0] if len(pairs) == 1 else np.concatenate(pairs) if pairs else \
            np.zeros(0, np.int64)  # fmt: skip
        if window.size and (window.min() < base or window.max() >= base + keys):
            raise SolarError(f"page mates: the trace names keys outside {base}..{base + keys - 1}"
                             " (a sampler's rank_epoch gave another rank's batches?)")  # fmt: skip
        # Offsets and positions within the window: int32 while it holds fewer than 2^31
        # accesses (4 B per key, P·N of them without affinity, and 4 B per access).
        dt = np.int32 if window.size < 2**31 else np.int64
        first = np.zeros(keys + 1, dt)
        pos = np.empty(window.size, dt)
        _group_positions(window, np.int64(base), first, pos)
        return cls(epoch, base, first, pos, starts)


@njit(cache=True, nogil=True)
def _group_positions(window, base, first, pos):
    """Counting sort of window positions by key: ``first`` (keys + 1, zeroed) becomes the
    offsets, ``pos`` the positions, each key's ascending."""
    for i in range(window.shape[0]):
        first[window[i] - base + 1] += 1
    for v in range(1, first.shape[0]):
        first[v] += first[v - 1]
    fill = first[:-1].copy()
    for i in range(window.shape[0]):
        v = window[i] - base
        pos[fill[v]] = i
        fill[v] += 1


@njit(cache=True, inline="always")
def next_after(v, w, first, pos, starts, epoch):
    """Key ``v``'s (indexed from the index's ``base``) first use at window position ``w`` or
    later, as a global position (``(epoch << EPOCH_SHIFT) + index``), or -1 if none."""
    lo, hi = first[v], first[v + 1]
    while lo < hi:  # the first position >= w
        mid = (lo + hi) // 2
        if pos[mid] < w:
            lo = mid + 1
        else:
            hi = mid
    if lo == first[v + 1]:
        return -1
    p = pos[lo]
    e = 0
    while starts[e + 1] <= p:
        e += 1
    return ((epoch + e) << EPOCH_SHIFT) + (p - starts[e])


@njit(cache=True, inline="always")
def mates_of(p, offset, row_bytes, page, n):
    """Rows ``[lo, hi)`` lying wholly inside page ``p`` (of ``n`` rows)."""
    start = p * page - offset
    lo = 0 if start <= 0 else (start + row_bytes - 1) // row_bytes
    hi = min(n, (start + page) // row_bytes) if start + page > 0 else 0
    return lo, max(lo, hi)


@njit(cache=True, nogil=True)
def _merge(counts, sample, rank, slot, flags, side_seg, side_sample, side_slot, side_rank,
           sides, out_sample, out_rank, out_slot, out_flags, side_flag):  # fmt: skip
    """Each (step, rank) segment's accesses, then its side rows: ``counts`` (steps, P)
    segments, step-major, side rows recorded in segment order."""
    world = counts.shape[1]
    i = j = o = 0
    for t in range(counts.shape[0]):
        for r in range(world):
            g = t * world + r
            for _ in range(counts[t, r]):
                out_sample[o] = sample[i]
                out_rank[o] = rank[i]
                out_slot[o] = slot[i]
                out_flags[o] = flags[i]
                i += 1
                o += 1
            while j < side_seg.shape[0] and side_seg[j] == g:
                out_sample[o] = side_sample[j]
                out_rank[o] = side_rank[j]
                out_slot[o] = side_slot[j]
                out_flags[o] = side_flag
                sides[t, r] += 1
                j += 1
                o += 1


def with_sides(
    counts: np.ndarray,
    sample: np.ndarray,
    rank: np.ndarray,
    slot: np.ndarray,
    flags: np.ndarray,
    side_seg: np.ndarray,
    side_sample: np.ndarray,
    side_slot: np.ndarray,
    side_flag: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """An epoch's accesses with each segment's side rows after it: ``(sample, rank, slot,
    flags, sides)``; ``side_seg`` names each side row's segment ``t·P + r`` (ascending)."""
    n = sample.size + side_sample.size
    world = counts.shape[1]
    out = (np.empty(n, sample.dtype), np.empty(n, rank.dtype), np.empty(n, slot.dtype),
           np.empty(n, flags.dtype))  # fmt: skip
    sides = np.zeros(counts.shape, np.int32)
    side_rank = (side_seg % world).astype(rank.dtype)
    _merge(counts, sample, rank, slot, flags, side_seg, side_sample.astype(sample.dtype),
           side_slot, side_rank, sides, *out, np.uint8(side_flag))  # fmt: skip
    return (*out, sides)

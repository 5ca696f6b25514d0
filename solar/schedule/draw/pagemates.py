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
(:class:`PageLayout`), the table of each (rank, sample) key's next use over the epoch planned
and the next (:class:`LaterUses`, ``LOOK_AHEAD``), and the merge of a step's side rows after its
batch (:func:`with_sides`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from solar._memory import PAGE
from solar.errors import SolarError
from solar.schedule.draw.keyspace import Numbering
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
# later than that is not kept (it would be evicted before then anyway).
LOOK_AHEAD = 1


NEXT, SEEN, OFFERED = 0, 1, 2  # columns of LaterUses.table


@dataclass(frozen=True)
class LaterUses:
    """When each key is next used, over a window of the trace: epoch ``epoch`` and the next
    (solar.schedule.draw.traces.TraceOrder.later_uses), or a window of an epoch's steps and
    the window after it (TraceOrder.windows), up to (not including) global position
    ``limit``. The window's keys are numbered densely (solar.schedule.draw.keyspace): row
    ``v`` is key ``keys[v]``. ``table[v, NEXT]`` is its first access in the window, as a
    global position (``(epoch << EPOCH_SHIFT) + index``), or -1; ``table[v, SEEN]`` and
    ``table[v, OFFERED]``, -1.

    The planner moves it forward as it passes the window's steps
    (:func:`solar.schedule.keep.belady._trace_steps`): a key accessed at global step k gets
    that access's next use and ``SEEN`` = k, so ``table[v, NEXT]`` is always the key's first
    use not yet passed (a position at or past ``limit`` lies outside the window: not used
    within it), and ``SEEN`` says whether the key was accessed at the step being planned.
    ``OFFERED`` = k marks the first of a page's rows among the window's keys (a rank's keys
    are its own) as that page's, offered at global step k: a page a rank reads twice in a step
    is offered once. A stamp in the row the planner reads next anyway, where a set of the
    step's pages cost two more cache misses a read. One row of 24 B per key (its fields
    mostly in one cache line), no index of every position (built in one pass). Each window has
    its own table, sized by its keys, let go with it."""

    epoch: int
    table: np.ndarray  # (keys, 3) int64, moved forward in place by the planner
    limit: int  # the first global position past the window
    keys: np.ndarray  # each row's key, sorted
    local: np.ndarray  # the window's first part's accesses as local keys (rows)

    @property
    def end(self) -> int:
        """The first epoch wholly past the window."""
        return ((self.limit - 1) >> EPOCH_SHIFT) + 1

    @classmethod
    def at(cls, epoch: int, num: Numbering, local: np.ndarray, starts: list[int],
           limit: int) -> LaterUses:  # fmt: skip
        """The table of the window (of epoch ``epoch`` on) whose parts' accesses are numbered
        by ``num`` (keyspace.number_keys), part ``e``'s first at global position
        ``starts[e]``, ending before ``limit``; ``local``: the first part's local keys, as an
        array of their own (``num.local(0)``, kept as :attr:`local`)."""
        table = np.full((num.keys.size, 3), -1, np.int64)
        # Latest part first, each backwards: a key's earliest access is written last.
        for e in range(len(num.arrays) - 1, -1, -1):
            _first_uses(num.arrays[e], num.shift, np.int64(starts[e]), table)
        return cls(epoch, table, int(limit), num.keys, local)


@njit(cache=True, nogil=True)
def _first_uses(pair, shift, start, table):
    """``table[pair[i] - shift, NEXT]`` = ``start + i`` (local keys: keyspace.Numbering), the
    earliest i last."""
    for i in range(pair.shape[0] - 1, -1, -1):
        table[pair[i] - shift, NEXT] = start + i


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

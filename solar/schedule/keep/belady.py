"""The ``solar`` policy: rank affinity plus Belady eviction with bypass.

Each rank keeps a max-heap of its C slots keyed by the next use of the sample in the slot
(empty or dead slots have key NEVER and so sit on top). A read is admitted only if its next use
is sooner than the farthest one in the heap, replacing it; otherwise it bypasses the buffer.
With affinity, a held sample's next use is its next global appearance, so with one rank this is
exactly Belady's optimal replacement for the access sequence.

With a second tier of D slots (:func:`_tiered_steps`), two Belady caches run on the same
accesses: one over all C + D cells decides what a rank holds (so what is read, and who serves
what, is exactly the plan of a RAM-only buffer of C + D), and one over the C RAM cells decides
which of the held samples sit in RAM, as MIN on RAM alone would (MIN is a stack algorithm: its
content with C slots is always inside its content with C + D). The tier holds the difference:
a sample leaving RAM while still held is demoted (written to the tier), a tier hit that MIN on
RAM would admit is promoted. With one rank, hits from both tiers are Belady's optimum for
C + D, and RAM hits are those of a RAM-only plan of C.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from solar._prefetch import prefetch
from solar.config import BufferConfig, RunConfig
from solar.schedule.draw.grow import grown
from solar.schedule.draw.keyspace import key_space
from solar.schedule.draw.order import sample_dtype, step_bounds
from solar.schedule.draw.pagemates import NEXT, OFFERED, SEEN, LaterUses, mates_of, with_sides
from solar.schedule.draw.traces import EpochTrace, Window
from solar.schedule.keep.assign import assign_affinity, assign_balanced, step_caps
from solar.schedule.keep.maxheap import ARITY, empty_heaps, rekey, sift_down, sift_up
from solar.schedule.policy import (
    ADMIT,
    DEMOTE,
    HIT,
    NEVER,
    RELEASE,
    SIDE,
    TADMIT,
    THIT,
    EpochSchedule,
    NextUse,
    OccupantContents,
    cap_table,
    no_tier,
    slot_count,
    tier_slot_count,
)

POS, OCC, RPOS = 0, 1, 2  # fields of ``cells``: heap position, sample, position in RAM's heap


@njit(cache=True, inline="always")
def _place(seq, a, b, k, world, cap_of, holder, hslot, count, rank_out, slot_out, flags):
    """Who serves each access of global step ``k`` (``[a, b)``): affinity to the rank holding
    it (a hit, ``slot_out`` its cell) while under its cap, then the balanced assignment of the
    rest. ``count[r]`` becomes rank r's local batch."""
    cap = np.zeros(world, np.int64)
    reads = np.zeros(world, np.int64)
    step_caps(b - a, world, cap_of, cap)
    count[:] = 0
    assign_affinity(seq, a, b, holder, hslot, count, cap, rank_out, slot_out, flags)
    assign_balanced(a, b, k, world, count, reads, cap, rank_out)


@njit(cache=True, inline="always")
def _used(x, n, r, s, c, holder, key, heap, rkey, rheap, cells):
    """Sample ``x`` in rank r's cell ``s`` is used now: the cell is keyed by x's next use ``n``
    in the heap of all cells (and in RAM's, for a RAM cell of a tiered buffer: ``s < c``), or
    freed at x's last use (True). Its key was this use, so a later one only moves it up."""
    i = cells[r, s, POS]
    key[r, i] = n
    sift_up(key, heap, cells, POS, r, i)
    if s < c:
        i = cells[r, s, RPOS]
        rkey[r, i] = n
        sift_up(rkey, rheap, cells, RPOS, r, i)
    if n == NEVER:
        holder[x] = -1
        cells[r, s, OCC] = -1
        return True
    return False


@njit(cache=True, inline="always")
def _replace_top(x, n, r, holder, hslot, key, heap, cells):
    """Sample ``x``, next used at ``n``, takes the cell on top of rank r's heap (the farthest
    next use), evicting its sample; returns the cell."""
    s = heap[r, 0]
    old = cells[r, s, OCC]
    if old >= 0:
        holder[old] = -1
    cells[r, s, OCC] = x
    holder[x] = r
    hslot[x] = s
    key[r, 0] = n
    sift_down(key, heap, cells, POS, r, 0)
    return s


@njit(cache=True, inline="always")
def _ram_step(seq, nu, a, b, rank_out, slot_out, flags, holder, hslot, key, heap, cells, base,
              held_hit):  # fmt: skip
    """Buffer updates of one step's accesses ``[a, b)``, placed, in access order: a hit's key
    becomes its next use; a read is admitted if used sooner than the farthest, else bypasses.
    A sample hit in this step has its key equal to its position here, sooner than any read's
    next use, so it is never evicted before it is served. Rank r's buffer is row r - ``base``
    of the heaps and cells (``base`` > 0: a policy keeping only rank ``base``'s rows).
    ``held_hit``: the caller flagged HIT every access whose id is held as the step starts, and
    a step's ids are distinct (a trace's: (rank, sample) pairs of batches made distinct,
    traces.py), so no read's id is held: not looked up (a cache miss a read). Not so under
    affinity, where a held sample is read when its holder is at its cap."""
    cap_slots = key.shape[1]
    # ``_used`` with c = 0: one heap, no RAM heap to keep beside it (key/heap stand in, unused).
    for i in range(a, b):
        x = seq[i]
        r = rank_out[i] - base
        n = nu[i]
        if flags[i] & HIT:
            if _used(x, n, r, slot_out[i], 0, holder, key, heap, key, heap, cells):
                flags[i] |= RELEASE
            continue
        h = -1 if held_hit else holder[x]
        if h >= 0:
            # Held by a rank already at its cap: that rank keeps it for its next use.
            _used(x, n, h, hslot[x], 0, holder, key, heap, key, heap, cells)
        elif cap_slots > 0 and n < key[r, 0]:
            slot_out[i] = _replace_top(x, n, r, holder, hslot, key, heap, cells)
            flags[i] = ADMIT


@njit(cache=True, nogil=True)
def _solar_steps(
    seq, nu, bounds, k0, world, cap_of,  # inputs: one epoch; k0 is its first global step
    holder, hslot, key, heap, cells,  # buffer state, carried across calls
    rank_out, slot_out, flags, counts,  # outputs
):  # fmt: skip
    count = np.zeros(world, np.int64)
    for k in range(bounds.shape[0] - 1):
        a, b = bounds[k], bounds[k + 1]
        _place(seq, a, b, k0 + k, world, cap_of, holder, hslot, count, rank_out, slot_out, flags)
        _ram_step(seq, nu, a, b, rank_out, slot_out, flags, holder, hslot, key, heap, cells,
                  0, False)  # fmt: skip
        counts[k, :] = count


@njit(cache=True, inline="always")
def _tiered_step(seq, nu, a, b, rank_out, slot_out, tslot_out, flags, holder, hslot, key, heap,
                 rkey, rheap, cells, base):  # fmt: skip
    """:func:`_ram_step` over cells ``0..C-1`` (RAM slots) and ``C..C+D-1`` (tier slots); rank
    r's rows are r - ``base`` as there.

    ``key/heap`` (positions ``cells[..., POS]``) is the max-heap of all C + D cells,
    ``rkey/rheap`` (positions ``cells[..., RPOS]``) that of the C RAM cells; ``hslot[x]`` is
    the cell holding x. An empty cell has key NEVER, a held one the next use of its sample
    (unique), so a RAM cell on top of the whole heap is on top of RAM's too.
    """
    c = rkey.shape[1]
    u = key.shape[1]
    for i in range(a, b):
        x = seq[i]
        r = rank_out[i] - base
        n = nu[i]
        tslot_out[i] = -1
        if flags[i] & HIT:
            s = slot_out[i]  # a cell: a RAM slot or C + a tier slot
            if s >= c:
                flags[i] = THIT
                slot_out[i] = -1
                tslot_out[i] = s - c
            if _used(x, n, r, s, c, holder, key, heap, rkey, rheap, cells):
                flags[i] |= RELEASE
            elif s >= c and c > 0 and n < rkey[r, 0]:
                # MIN on RAM alone would admit x now: promote it, demoting RAM's farthest.
                d = rheap[r, 0]
                y = cells[r, d, OCC]
                ky = rkey[r, 0]
                cells[r, d, OCC] = x
                hslot[x] = d
                rekey(key, heap, cells, POS, r, d, n)
                rkey[r, 0] = n
                sift_down(rkey, rheap, cells, RPOS, r, 0)
                flags[i] |= ADMIT
                slot_out[i] = d
                cells[r, s, OCC] = y
                if y >= 0:
                    hslot[y] = s
                    rekey(key, heap, cells, POS, r, s, ky)
                    flags[i] |= DEMOTE
                else:
                    rekey(key, heap, cells, POS, r, s, NEVER)
            continue
        h = holder[x]
        if h >= 0:
            # Held by a rank already at its cap: that rank keeps it for its next use.
            _used(x, n, h, hslot[x], c, holder, key, heap, rkey, rheap, cells)
            continue
        if u == 0 or n >= key[r, 0]:
            continue  # bypass: every cell holds a sample used sooner
        z = heap[r, 0]  # the cell given up: the farthest next use of all
        if c > 0 and n < rkey[r, 0]:
            d = rheap[r, 0]  # x goes to RAM, in place of RAM's farthest
            y = cells[r, d, OCC]
            ky = rkey[r, 0]
            if y >= 0 and d != z:
                # y is still worth holding: demoted into z (a tier cell), evicting its sample.
                old = cells[r, z, OCC]
                if old >= 0:
                    holder[old] = -1
                cells[r, z, OCC] = y
                hslot[y] = z
                rekey(key, heap, cells, POS, r, z, ky)
                flags[i] = ADMIT | DEMOTE
                tslot_out[i] = z - c
            else:
                if y >= 0:
                    holder[y] = -1  # d was the farthest of all: y is evicted
                flags[i] = ADMIT
            cells[r, d, OCC] = x
            holder[x] = r
            hslot[x] = d
            rekey(key, heap, cells, POS, r, d, n)
            rkey[r, 0] = n
            sift_down(rkey, rheap, cells, RPOS, r, 0)
            slot_out[i] = d
        else:
            # RAM holds only sooner uses: x goes to the tier, in place of the farthest.
            tslot_out[i] = _replace_top(x, n, r, holder, hslot, key, heap, cells) - c
            flags[i] = TADMIT


@njit(cache=True, nogil=True)
def _tiered_steps(
    seq, nu, bounds, k0, world, cap_of,  # inputs: one epoch; k0 is its first global step
    holder, hslot, key, heap, rkey, rheap, cells,  # state, carried across calls
    rank_out, slot_out, tslot_out, flags, counts,  # outputs
):  # fmt: skip
    """:func:`_solar_steps` with a second tier (:func:`_tiered_step`)."""
    count = np.zeros(world, np.int64)
    for k in range(bounds.shape[0] - 1):
        a, b = bounds[k], bounds[k + 1]
        _place(seq, a, b, k0 + k, world, cap_of, holder, hslot, count, rank_out, slot_out, flags)
        _tiered_step(seq, nu, a, b, rank_out, slot_out, tslot_out, flags, holder, hslot, key,
                     heap, rkey, rheap, cells, 0)  # fmt: skip
        counts[k, :] = count


@njit(cache=True, inline="always")
def _longest(bounds):
    """The most accesses of any step."""
    n = 0
    for k in range(bounds.shape[0] - 1):
        n = max(n, bounds[k + 1] - bounds[k])
    return n


@njit(cache=True, inline="always")
def _hits_first(a, b, seq, nu, sample, rank, slot, flags, scratch):
    """Stably move the accesses of ``[a, b)`` that are hits before the rest, permuting the
    access arrays alike (``scratch``: room for b - a positions)."""
    m = a
    while m < b and flags[m] & HIT:
        m += 1  # the first miss
    late = False
    for i in range(m, b):
        if flags[i] & HIT:
            late = True
            break
    if not late:
        return  # the hits are first already
    j = 0
    for hit in (True, False):
        for i in range(a, b):
            if (flags[i] & HIT != 0) == hit:
                scratch[j] = i
                j += 1
    order = scratch[: b - a]
    seq[a:b] = seq[order]
    nu[a:b] = nu[order]
    sample[a:b] = sample[order]
    rank[a:b] = rank[order]
    slot[a:b] = slot[order]
    flags[a:b] = flags[order]


# Fields of ``_trace_steps``'s page ``layout`` (int64): where rows lie (pagemates.PageLayout),
# N, the first global position past the window of ``later``, and the epoch's first global step.
_OFFSET, _ROW, _PAGE, _N, _LIMIT, _K0 = range(6)


@njit(cache=True, inline="always")
def _key(keys, v, dense):
    """Local key ``v``'s key: ``keys[0] + v`` where ``dense`` (the keys are every key of their
    span, keyspace's offset numbering: no read of a line the step has not touched), else
    ``keys[v]``."""
    return keys[0] + v if dense else keys[v]


@njit(cache=True, inline="always")
def _at_least(keys, x, v, dense):
    """The first position of sorted ``keys`` (distinct) whose key is >= ``x``: by offset where
    ``dense`` (:func:`_key`), else walked to from position ``v`` (a page mate's key lies a few
    rows from the read's own, ``v``: a walk of a few steps in one cache line, not a binary
    search over the window's keys)."""
    if dense:
        return min(max(x - keys[0], 0), keys.shape[0])
    while v > 0 and keys[v - 1] >= x:
        v -= 1
    while v < keys.shape[0] and keys[v] < x:
        v += 1
    return v


@njit(cache=True, inline="always")
def _mates(seq, sample, flags, a, b, t, world, seg_counts, layout, later, keys, holder, hslot,
           key, heap, cells, seg_id, side_sample, side_slot, m, base):  # fmt: skip
    """Offer step ``t``'s page mates (accesses ``[a, b)``) to each rank's buffer
    (pagemates.py): a row wholly inside a page the rank reads now, not accessed by it now and
    not held, is admitted, as a read is, if its next use is sooner than the farthest held; at
    most as many as the rank's batch (they share its batch memory). Writes ``(segment,
    sample, slot)`` to the side arrays from row ``m`` (room for ``b - a`` more: no array is
    reassigned in the loops, which would cost numba a reference count per pass); returns the
    new row count. Keys are the window's local keys: local key ``v`` is (rank, sample) key
    ``keys[v]`` (sorted); ``seq[i]`` is access i's."""
    if key.shape[1] == 0:
        return m  # no buffer to offer them to
    # (Rank r's buffer is row r - ``base``, as in _ram_step: a rank without a row has no
    # accesses here, TraceOrder._trace refusing a trace that gives it any.)
    offset, row_bytes, page, n = layout[_OFFSET], layout[_ROW], layout[_PAGE], layout[_N]
    now = layout[_K0] + t
    u = keys.shape[0]
    dense = u > 0 and keys[u - 1] - keys[0] + 1 == u  # (sorted and distinct: keys[0] + v each)
    p = a
    for r in range(world):
        q = p + seg_counts[r]
        room = m + seg_counts[r]  # side rows up to the batch's own length
        for i in range(p, q):
            if m == room:
                break
            if i + 12 < q:  # a later read's rows: their misses overlap this one's
                prefetch(later, seq[i + 12])
                prefetch(holder, seq[i + 12])
            if flags[i] & HIT:
                continue
            x = sample[i]
            lo = (offset + x * row_bytes) // page
            hi = (offset + x * row_bytes + row_bytes - 1) // page
            for pg in range(lo, hi + 1):
                y0, y1 = mates_of(pg, offset, row_bytes, page, n)
                # Rank r's keys of rows y0..y1 - 1 among the window's: a run of the sorted
                # keys (a mate the window never uses is never kept), in the rows' order; the
                # first of them stamped with the page's step (rank r's keys are its own).
                v = _at_least(keys, r * n + y0, seq[i], dense)
                if v == u or _key(keys, v, dense) >= r * n + y1 or later[v, OFFERED] == now:
                    continue  # none of the page's rows among the keys, or offered already
                later[v, OFFERED] = now
                while v < u and _key(keys, v, dense) < r * n + y1:
                    if m == room:
                        break
                    w, y = v, _key(keys, v, dense) - r * n
                    v += 1
                    nxt = later[w, NEXT]  # its first use past this step
                    if later[w, SEEN] == now or nxt < 0 or nxt >= layout[_LIMIT]:
                        continue  # accessed by the rank now, or not used within the window
                    if nxt >= key[r - base, 0] or holder[w] >= 0:
                        continue  # the buffer holds sooner, or holds it (read last: a miss)
                    seg_id[m] = t * world + r
                    side_sample[m] = y
                    side_slot[m] = _replace_top(w, nxt, r - base, holder, hslot, key, heap,
                                                cells)  # fmt: skip
                    m += 1
        p = q
    return m


@njit(cache=True, inline="always")
def _passed(seq, nu, a, b, now, later):
    """Global step ``now``'s accesses ``[a, b)`` are passed: each key's first use not yet
    passed (pagemates.LaterUses) becomes its next use, and the key is marked seen now."""
    for i in range(a, b):
        w = seq[i]
        if 0 <= w < later.shape[0]:
            later[w, NEXT] = nu[i]
            later[w, SEEN] = now


@njit(cache=True, nogil=True)
def _trace_steps(
    seq, nu, sample, rank, bounds, counts, tiered,  # one epoch of a trace: (rank, sample) ids
    holder, hslot, key, heap, rkey, rheap, cells, base,  # state (rows from rank base on)
    slot_out, tslot_out, flags,  # outputs
    layout, later, keys, side,  # page mates (layout empty: none), see _mates
):  # fmt: skip
    """Belady over a sampler's trace: the sampler chose who serves each access (``rank``), and
    an id names a (rank, sample) pair, so an id held is held by the rank serving it: a hit.

    A step's hits read the buffer as it starts; then, as Ginex's changesets do, the rank keeps
    the C ids of (held ∪ step) used soonest. So each rank's hits of the step come first (the
    accesses are reordered: a step's accesses are a set, the runtime puts each in its batch
    row), their keys become their next uses, and only then are the reads admitted or bypassed.
    Then, given a page ``layout``, the rows sharing pages with the reads are offered
    (:func:`_mates`), their next uses read from ``later`` (pagemates.LaterUses.table, moved
    forward here step by step). Returns the side rows kept: their count and ``side``.
    """
    scratch = np.empty(_longest(bounds), np.int64)
    seg_id, side_sample, side_slot = side
    m = 0
    for k in range(bounds.shape[0] - 1):
        a, b = bounds[k], bounds[k + 1]
        for i in range(a, b):
            s = hslot[seq[i]] if holder[seq[i]] >= 0 else -1
            slot_out[i] = s
            flags[i] = HIT if s >= 0 else 0
        p = a
        for r in range(counts.shape[1]):
            q = p + counts[k, r]
            _hits_first(p, q, seq, nu, sample, rank, slot_out, flags, scratch)
            p = q
        if tiered:
            _tiered_step(seq, nu, a, b, rank, slot_out, tslot_out, flags, holder, hslot, key,
                         heap, rkey, rheap, cells, base)  # fmt: skip
        else:
            _ram_step(seq, nu, a, b, rank, slot_out, flags, holder, hslot, key, heap, cells,
                      base, True)  # fmt: skip
            if layout.shape[0]:
                _passed(seq, nu, a, b, layout[_K0] + k, later)
            # The run's first step is read before its plan is made (Reads.start_first in
            # solar/runtime/reads.py): no page mates there, they would be read apart from its
            # pages.
            if layout.shape[0] and layout[_K0] + k > 0:
                if m + b - a > side_sample.shape[0]:  # (a step keeps at most b - a side rows)
                    size = max(2 * side_sample.shape[0] + 16, m + b - a)
                    seg_id, side_sample, side_slot = (grown(seg_id, size, m),
                                                      grown(side_sample, size, m),
                                                      grown(side_slot, size, m))  # fmt: skip
                m = _mates(seq, sample, flags, a, b, k, counts.shape[1], counts[k], layout, later,
                           keys, holder, hslot, key, heap, cells, seg_id, side_sample, side_slot,
                           m, base)  # fmt: skip
    return m, (seg_id, side_sample, side_slot)


@njit(cache=True, nogil=True)
def _affinity_steps(
    seq, nu, sample, bounds, k0, world, cap_of, tiered,  # one epoch of a trace's global steps
    holder, hslot, key, heap, rkey, rheap, cells,  # state, carried across calls
    rank_out, slot_out, tslot_out, flags, counts,  # outputs
):  # fmt: skip
    """:func:`_solar_steps` (or :func:`_tiered_steps`) over a sampler's global steps of
    distinct ids, with a step's hits first as in :func:`_trace_steps`: with one rank, the
    optimum when hits read the buffer as the step starts."""
    count = np.zeros(world, np.int64)
    scratch = np.empty(_longest(bounds), np.int64)
    for k in range(bounds.shape[0] - 1):
        a, b = bounds[k], bounds[k + 1]
        _place(seq, a, b, k0 + k, world, cap_of, holder, hslot, count, rank_out, slot_out, flags)
        _hits_first(a, b, seq, nu, sample, rank_out, slot_out, flags, scratch)
        if tiered:
            _tiered_step(seq, nu, a, b, rank_out, slot_out, tslot_out, flags, holder, hslot, key,
                         heap, rkey, rheap, cells, 0)  # fmt: skip
        else:
            _ram_step(seq, nu, a, b, rank_out, slot_out, flags, holder, hslot, key, heap, cells,
                      0, False)  # fmt: skip
        counts[k, :] = count


class SolarPolicy(OccupantContents):
    """Rank affinity and per-rank Belady eviction; state carried across epochs, O(N + P·C)
    (O(N + C) for a rank planned alone)."""

    needs_next_use = True
    ids_per_rank = False  # ids are samples; TracePolicy's name (rank, sample) pairs

    def __init__(self, run: RunConfig, buffer: BufferConfig, order: Any = None) -> None:
        self.run = run
        # A sampler's trace with affinity (traces.py): its epochs' global steps vary in size.
        self.order = order if getattr(order, "traced", False) else None
        world, c = run.world_size, slot_count(run, buffer)
        # The ranks whose buffers are kept: every rank's, or only the rank a planner plans
        # alone (TraceOrder.only_rank), whose row 0 then stands for rank ``base``: the heaps
        # and cells are O(C), not O(P·C), in each process planning a rank.
        alone: int | None = getattr(order, "only_rank", None)
        self.base, rows = (0, world) if alone is None else (alone, 1)
        self.tier = tier_slot_count(run, buffer)
        u = c + self.tier  # cells: RAM slots, then tier slots
        self.ids = run.num_samples * (world if self.ids_per_rank else 1)
        # holder[x] (rank) and hslot[x] (cell) side by side: one cache miss finds both. (A
        # trace's policy makes them per window, for its keys alone: TracePolicy._plan.)
        held = np.full((0 if self.ids_per_rank else self.ids, 2), -1, np.int32)
        self.holder, self.hslot = held[:, 0], held[:, 1]
        self.key, self.heap = empty_heaps(rows, u)
        self.rkey, self.rheap = empty_heaps(rows, c if self.tier else 0)
        # Per cell, side by side: its heap position(s) and its sample (one miss finds all).
        self.cells = np.full((rows, u, RPOS + 1 if self.tier else OCC + 1), -1,
                             sample_dtype(self.ids))  # fmt: skip
        self.cells[:, :, POS] = self.heap
        if self.tier:
            self.cells[:, :c, RPOS] = self.rheap
        self.occupant = self.cells[:, :, OCC]  # (rows, cells) view: the sample in each cell
        self.cap_of = cap_table(run, buffer)
        self.bounds = step_bounds(run)

    def snapshot(self) -> dict[str, np.ndarray]:
        """The state between epochs, less what the order gives back (keys are next uses, and
        who holds what is in the cells): each cell's sample, and the heaps' layouts."""
        return {"occupant": self.occupant, "heap": self.heap, "rheap": self.rheap}

    def restore(self, state: dict[str, np.ndarray], next_use: NextUse) -> None:
        """Take the state of :meth:`snapshot`, proven consistent first: ``next_use(samples)``
        gives their next uses from the epoch it was taken before. Raises ValueError naming
        what is wrong, leaving the policy as it was."""
        rows, u = self.occupant.shape
        c = self.rkey.shape[1]
        occ = _array(state, "occupant", self.occupant.dtype, (rows, u))
        heap = _array(state, "heap", np.int32, (rows, u))
        rheap = _array(state, "rheap", np.int32, (rows, c))
        if occ.size and (occ.min() < -1 or occ.max() >= self.ids):
            raise ValueError("occupant: a sample id out of range")
        ranks, where = np.nonzero(occ >= 0)  # row-major, as occ[occ >= 0]
        held = occ[ranks, where]
        if np.unique(held).size != held.size:
            raise ValueError("occupant: a sample held in two cells")
        uses = next_use(held)
        if np.any(uses == NEVER) and self.order is None:  # (a trace's horizon may end first)
            raise ValueError("occupant: a sample held but never used again")
        keys = np.full((rows, u), NEVER, np.int64)
        keys[ranks, where] = uses
        key, pos = _heap_of(keys, heap, "heap")
        rkey, rpos = _heap_of(keys[:, :c], rheap, "rheap")
        if not self.ids_per_rank:
            self.holder[:] = -1
            self.holder[held] = ranks
            self.hslot[held] = where
        self.occupant[:] = occ
        self.key[:], self.heap[:], self.cells[:, :, POS] = key, heap, pos
        self.rkey[:], self.rheap[:] = rkey, rheap
        if self.tier:
            self.cells[:, :c, RPOS] = rpos

    def plan_epoch(self, k: int, seq: np.ndarray, next_use: np.ndarray | None) -> EpochSchedule:
        """Decide epoch ``k``; ``next_use`` is required."""
        assert next_use is not None
        out = EpochSchedule.empty(self.run, with_tier=self.tier > 0, n=seq.size)
        k0, world = k * self.run.steps_per_epoch, self.run.world_size
        if self.order is not None:  # a sampler's trace, its global steps split by affinity
            trace = self.order.epoch(k)
            _affinity_steps(
                seq, next_use, trace.sample, trace.bounds, k0, world, self.cap_of, self.tier > 0,
                self.holder, self.hslot, self.key, self.heap, self.rkey, self.rheap, self.cells,
                out.rank, out.slot, out.tslot if self.tier else np.empty(0, np.int32), out.flags,
                out.counts,
            )  # fmt: skip
        elif self.tier:
            _tiered_steps(
                seq, next_use, self.bounds, k0, world, self.cap_of, self.holder, self.hslot,
                self.key, self.heap, self.rkey, self.rheap, self.cells,
                out.rank, out.slot, out.tslot, out.flags, out.counts,
            )  # fmt: skip
        else:
            _solar_steps(
                seq, next_use, self.bounds, k0, world, self.cap_of, self.holder, self.hslot,
                self.key, self.heap, self.cells,
                out.rank, out.slot, out.flags, out.counts,
            )  # fmt: skip
        return out


class TracePolicy(SolarPolicy):
    """Belady with bypass, per rank, over a general sampler's trace (the sampler decides who
    serves what: no affinity). Ids are (rank, sample) pairs, ``rank * N + sample``; each
    window (or epoch) is planned over its keys numbered densely (keyspace.py), held ids
    included, so that its tables are O(keys of the window + P·C) (+ C, not P·C, for a rank
    planned alone), never O(P·N)."""

    ids_per_rank = True

    def __init__(self, run: RunConfig, buffer: BufferConfig, order: Any) -> None:
        super().__init__(run, buffer, order)
        self.pages = order.pages  # where rows lie, to keep their page mates (PlanSpec.pages)

    def contents(self, r: int) -> np.ndarray:
        if not 0 <= r - self.base < self.occupant.shape[0]:  # a rank not planned here: empty
            return np.full(self.occupant.shape[1], -1, np.int64)
        ids = self.occupant[r - self.base].astype(np.int64)
        return np.where(ids >= 0, ids - r * self.run.num_samples, -1)

    def plan_epoch(self, k: int, seq: np.ndarray, next_use: np.ndarray | None) -> EpochSchedule:
        """Decide epoch ``k``: ``seq`` holds its (rank, sample) ids, ``next_use`` theirs."""
        assert next_use is not None and self.order is not None
        k0, trace = k * self.run.steps_per_epoch, self.order.epoch(k)
        if self.pages is None:
            return self._plan(k0, trace, seq, next_use, None)
        uses = self.order.later_uses(k)  # (its keys number the epoch's: numbered once)
        return self._plan(k0, trace, seq, next_use, uses, uses.keys, uses.local)

    def plan_window(self, w: Window) -> EpochSchedule:
        """Decide window ``w`` of an epoch planned in windows (traces.TraceOrder.windows): its
        steps' decisions, as an epoch's, with its accesses named (``sample``)."""
        k0 = w.epoch * self.run.steps_per_epoch + w.first_step
        out = self._plan(k0, w.trace, w.trace.pair, w.next_use, w.later, w.keys, w.local)
        if out.sample is None:
            out.sample = w.trace.sample
        return out

    def _plan(self, k0: int, trace: EpochTrace, seq: np.ndarray, next_use: np.ndarray,
              uses: LaterUses | None, keys: np.ndarray | None = None,
              local: np.ndarray | None = None) -> EpochSchedule:  # fmt: skip
        """Decide the steps of ``trace`` (an epoch's, or a window's), the first global step
        ``k0``: ``seq`` holds its (rank, sample) ids, ``next_use`` theirs, ``uses`` page
        mates' next uses (pagemates.LaterUses, given a page layout); ``keys`` the keys
        numbering ``uses``' rows (sorted) and ``local`` ``seq`` as local keys of them (not
        given: ``seq``'s own, keyspace.key_space)."""
        if keys is None or local is None:
            keys, (local,) = key_space([seq])
        # self.occupant holds window-local keys until the finally below restores its ids:
        # snapshot() returns it (a view) and contents() reads it, so both belong to the
        # thread that plans (a Planner is driven by one thread; none reads it mid-plan).
        held, extra = _local_cells(self.occupant, keys)
        try:
            out = self._decide(k0, trace, local, next_use, uses, keys, held)
        finally:
            _global_cells(self.occupant, keys, extra)
        # (the kernel put each step's hits first: seq moves alike; "clip", as local keys are
        # indices of keys by construction: raise's mode buffers the output in a temporary)
        np.take(keys, local, out=seq, mode="clip")
        return out

    def _decide(self, k0: int, trace: EpochTrace, seq: np.ndarray, next_use: np.ndarray,
                uses: LaterUses | None, keys: np.ndarray,
                held: np.ndarray) -> EpochSchedule:  # fmt: skip
        """:meth:`_plan` over local keys: ``seq`` and the cells' ids name ``held``'s rows
        (holder, cell)."""
        n = seq.size
        out = EpochSchedule(
            rank=trace.rank, slot=np.empty(n, np.int32), flags=np.zeros(n, np.uint8),
            counts=trace.counts, tslot=np.full(n, -1, np.int32) if self.tier else no_tier(n),
        )  # fmt: skip
        tslot = out.tslot if self.tier else np.empty(0, np.int32)
        none = np.zeros(0, np.int64)
        layout, later = none, np.zeros((0, 3), np.int64)
        if self.pages is not None:
            assert uses is not None
            p = self.pages
            layout = np.array([p.offset, p.row_bytes, p.page, self.run.num_samples, uses.limit,
                               k0], np.int64)  # fmt: skip
            later = uses.table
        # Side rows: room for half the accesses (~a third are kept at a 10 % buffer), grown
        # if more are; memory is only touched as rows are kept.
        room = 0 if self.pages is None else n // 2 + 16
        side = (np.empty(room, np.int64), np.empty(room, np.int64), np.empty(room, np.int32))
        m, side = _trace_steps(
            seq, next_use, trace.sample, trace.rank, trace.bounds, trace.counts, self.tier > 0,
            held[:, 0], held[:, 1], self.key,
            self.heap, self.rkey, self.rheap, self.cells, self.base, out.slot, tslot, out.flags,
            layout, later, keys, side,
        )  # fmt: skip
        if self.pages is None:
            return out
        sample, rank, slot, flags, sides = with_sides(
            trace.counts, trace.sample, trace.rank, out.slot, out.flags, side[0][:m],
            side[1][:m], side[2][:m], SIDE | ADMIT,
        )  # fmt: skip
        return EpochSchedule(rank, slot, flags, trace.counts, no_tier(sample.size), sample, sides)


def _local_cells(occ: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cells' ids (``occ``, in place) as local keys: ``keys[v]`` is ``v``, a held id not
    among them ``keys.size + j`` (``extra[j]``). Returns ``(held, extra)``: ``held[v]`` the
    (rank, cell) holding local key ``v`` (int32, -1: none), sized by the keys and the held."""
    ranks, where = np.nonzero(occ >= 0)
    ids = occ[ranks, where].astype(np.int64)
    at = np.searchsorted(keys, ids)
    inside = at < keys.size
    inside[inside] = keys[at[inside]] == ids[inside]
    extra = ids[~inside]
    at[~inside] = keys.size + np.arange(extra.size)
    held = np.full((keys.size + extra.size, 2), -1, np.int32)
    held[at, 0], held[at, 1] = ranks, where
    occ[ranks, where] = at
    return held, extra


def _global_cells(occ: np.ndarray, keys: np.ndarray, extra: np.ndarray) -> None:
    """The cells' local keys (:func:`_local_cells`) back to ids, in place."""
    held = occ >= 0
    occ[held] = np.concatenate([keys, extra])[occ[held]]


def _array(state: dict[str, np.ndarray], name: str, dtype, shape: tuple[int, int]) -> np.ndarray:
    a = state.get(name)
    if not isinstance(a, np.ndarray) or a.dtype != dtype or a.shape != shape:
        raise ValueError(f"{name}: expected {np.dtype(dtype)} {shape}")
    return a


def _heap_of(keys: np.ndarray, heap: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Keys in ``heap``'s order and its inverse (``pos``), once ``heap`` is proven to be, row by
    row, a permutation of the cells that orders ``keys`` as a max-heap."""
    cells = keys.shape[1]
    if not np.array_equal(np.sort(heap, axis=1), np.broadcast_to(np.arange(cells), heap.shape)):
        raise ValueError(f"{name}: a row is not a permutation of the cells")
    key = np.take_along_axis(keys, heap.astype(np.intp), axis=1)
    child = np.arange(1, cells)
    if np.any(key[:, child] > key[:, (child - 1) // ARITY]):
        raise ValueError(f"{name}: not a heap under the next uses")
    pos = np.empty_like(heap)
    np.put_along_axis(pos, heap.astype(np.intp), np.arange(cells, dtype=np.int32)[None], axis=1)
    return key, pos

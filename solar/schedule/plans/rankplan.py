"""One rank's part of a plan, and the pure values the runtime executes: steps and buffer states.

The runtime never works out what to do from flags itself: it asks :meth:`RankPlan.step` for a
:class:`StepPlan` (what to read, gather and store at one step) and :meth:`RankPlan.refill_at`
for what the buffer must hold to start at a step. Both are pure functions of the plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
from numba import njit
from numpy.typing import NDArray

from solar.errors import CorruptPlanError
from solar.schedule.keep.transfer import Transfer, rank_transfer
from solar.schedule.policy import ADMIT, DEMOTE, HIT, RELEASE, SIDE, TADMIT, THIT, no_tier

if TYPE_CHECKING:  # planner.py does not import this module: no cycle at run time either
    from solar.schedule.keep.planner import RankEpoch

_NONE = np.zeros(0, np.int64)
_NONE.flags.writeable = False


class StepPlan(NamedTuple):  # a NamedTuple: one is made per step, cheaper than a dataclass
    """What one rank does at one global step. Rows index the step's batch (0..size-1), then
    its side rows (size..rows_needed-1), read only to be stored.

    ``hit_rows`` are gathered from RAM ``hit_slots`` and ``tier_rows`` read from tier
    ``tier_slots``, both as they stand at the start of the step; ``read_rows`` are read from
    storage. Once the batch is assembled, in order: RAM ``demote_slots`` are written to tier
    ``demote_tslots``, ``admit_rows`` are stored into RAM ``admit_slots`` and ``tadmit_rows``
    written to tier ``tadmit_tslots``. When a RAM slot is stored or a tier slot written twice
    in the step (``in_order``), these must be applied access by access, as
    :meth:`RankPlan.step_actions` lists them. All arrays are int64 and 1-D.
    """

    step: int
    samples: NDArray[np.int64]  # (size,) sample ids in batch order
    read_rows: NDArray[np.int64]  # (reads,)
    hit_rows: NDArray[np.int64]  # (hits,)
    hit_slots: NDArray[np.int64]  # (hits,)
    admit_rows: NDArray[np.int64]  # (admits,)
    admit_slots: NDArray[np.int64]  # (admits,)
    tier_rows: NDArray[np.int64] = _NONE  # (tier hits,)
    tier_slots: NDArray[np.int64] = _NONE  # (tier hits,)
    demote_slots: NDArray[np.int64] = _NONE  # (demotions,)
    demote_tslots: NDArray[np.int64] = _NONE  # (demotions,)
    tadmit_rows: NDArray[np.int64] = _NONE  # (tier admits,)
    tadmit_tslots: NDArray[np.int64] = _NONE  # (tier admits,)
    in_order: bool = False
    # A sampler's batch with repeats: access j lands in batch row ``rows[j]`` (None: row j),
    # and once the batch is assembled rows ``copy_src`` are copied into ``copy_dst``.
    rows: NDArray[np.int64] | None = None
    copy_src: NDArray[np.int64] = _NONE
    copy_dst: NDArray[np.int64] = _NONE
    # Side rows (pagemates.py): read with the reads into rows ``size..size + m - 1`` after the
    # batch, stored as admissions (``admit_rows`` name them), never served.
    side_samples: NDArray[np.int64] = _NONE  # (m,)
    # A node buffer (plans/hostwindow.py): rows this rank read that other local ranks take, put
    # into the host's staging rows ``stage_at``; rows it takes from staging rows ``peer_at``.
    stage_rows: NDArray[np.int64] = _NONE
    stage_at: NDArray[np.int64] = _NONE
    peer_rows: NDArray[np.int64] = _NONE
    peer_at: NDArray[np.int64] = _NONE
    # A node step whose host updates a cell twice: its updates in phases applied in turn,
    # each demotion's, admission's and tier admission's phase, and before each phase whether
    # the host's ranks wait for each other (keep/hostplan.host_phases; None: one phase).
    phase_waits: NDArray[np.bool_] | None = None
    demote_phase: NDArray[np.int64] | None = None
    admit_phase: NDArray[np.int64] | None = None
    tadmit_phase: NDArray[np.int64] | None = None

    @property
    def size(self) -> int:
        """Rows served: the batch."""
        return int(self.samples.size)

    @property
    def rows_needed(self) -> int:
        """Rows of batch memory: the batch, then its side rows."""
        return int(self.samples.size + self.side_samples.size)

    def storage_reads(self) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """``(samples, rows)`` read from storage: the batch's reads, then its side rows."""
        if not self.side_samples.size:
            return self.samples[self.read_rows], self.read_rows
        sides = np.arange(self.size, self.rows_needed, dtype=np.int64)
        return (np.concatenate([self.samples[self.read_rows], self.side_samples]),
                np.concatenate([self.read_rows, sides]))  # fmt: skip

    def row(self, j: int) -> int:
        """The batch row of the step's access ``j``."""
        return j if self.rows is None else int(self.rows[j])

    def in_batch(self, ids: NDArray[np.int64]) -> StepPlan:
        """This step as a sampler's batch ``ids`` (batch order, repeats allowed): each access
        lands in the row of its sample's first occurrence, repeats are copies of it. Raises
        ValueError unless the step's accesses are exactly the distinct ``ids``."""
        rows = np.empty(self.size, np.int64)  # access j -> the first row of its sample
        src = np.empty(ids.size, np.int64)  # row i -> the first row of its sample
        # A hash of the batch's ids, not a sort: a step costs O(its rows) (issue 47).
        if not _batch_rows(ids, self.samples, rows, src):
            raise ValueError("the sampler's batch differs from the plan's accesses")
        if self.size == ids.size and np.array_equal(rows, np.arange(ids.size)):
            return self  # the accesses are the batch, in its order
        dst = np.flatnonzero(src != np.arange(ids.size))
        # Side rows follow the batch: they move with its length.
        rows = np.concatenate([rows, np.arange(self.side_samples.size) + ids.size])
        return self._replace(
            samples=ids.astype(np.int64), read_rows=rows[self.read_rows],
            hit_rows=rows[self.hit_rows], admit_rows=rows[self.admit_rows],
            tier_rows=rows[self.tier_rows], tadmit_rows=rows[self.tadmit_rows],
            stage_rows=rows[self.stage_rows], peer_rows=rows[self.peer_rows], rows=rows,
            copy_src=src[dst], copy_dst=dst,
        )  # fmt: skip

    @property
    def tier_writes(self) -> NDArray[np.int64]:
        """Tier slots this step writes."""
        return np.concatenate([self.demote_tslots, self.tadmit_tslots])


@dataclass(frozen=True)
class RankPlan:
    """One rank's accesses in service order, cut into global steps, over ``slots`` RAM slots
    and ``tier_slots`` tier slots.

    It may be a window of the run: steps ``first_step`` to ``first_step + num_steps - 1``,
    with the buffer holding ``initial`` (sample per cell, -1: nothing needed) as the window
    starts; ``complete`` says whether the window reaches the end of the run. Steps are always
    named by their global index. Buffer states are arrays over cells: RAM slots ``0..slots-1``,
    then tier slot t as cell ``slots + t``.
    """

    rank: int
    sample: NDArray[np.integer]  # (A,) sample id of each access (int32, or int64 if N >= 2**31)
    slot: NDArray[np.int32]  # (A,) RAM slot, -1: none
    flags: NDArray[np.uint8]  # (A,) HIT | ADMIT | RELEASE | THIT | TADMIT | DEMOTE | SIDE
    step_offsets: NDArray[np.int64]  # (num_steps + 1,) local step t is [offsets[t], [t + 1])
    slots: int
    first_step: int = 0
    initial: NDArray[np.int64] | None = None  # (cells,); None: an empty buffer
    complete: bool = True
    tier_slots: int = 0
    # (A,) tier slot, -1: none (without a tier, ``no_tier``'s -1s in no memory)
    tslot: NDArray[np.int32] = field(kw_only=True)
    # With equal batches: every rank's served counts at each step, (num_steps, P) int32.
    peers: NDArray[np.int32] | None = field(default=None, kw_only=True)

    @property
    def cells(self) -> int:
        """RAM slots and tier slots together."""
        return self.slots + self.tier_slots

    @classmethod
    def from_parts(
        cls,
        rank: int,
        parts: list[RankEpoch],
        slots: int,
        first_step: int = 0,
        initial: NDArray[np.int64] | None = None,
        complete: bool = True,
        tier_slots: int = 0,
    ) -> RankPlan:
        """Concatenate consecutive epochs' parts (``RankEpoch``) of one rank."""
        offsets = [np.zeros(1, np.int64)]
        base = 0
        for p in parts:
            offsets.append(p.step_offsets[1:] + base)
            base += int(p.step_offsets[-1])
        sample = np.concatenate([p.sample for p in parts])
        tslot = np.concatenate([p.tslot for p in parts]) if tier_slots else no_tier(sample.size)
        peers = None
        if parts and all(p.peers is not None for p in parts):
            peers = np.concatenate([p.peers for p in parts])
        return cls(
            rank,
            sample,
            np.concatenate([p.slot for p in parts]),
            np.concatenate([p.flags for p in parts]),
            np.concatenate(offsets),
            slots,
            first_step,
            initial,
            complete,
            tier_slots,
            tslot=tslot,
            peers=peers,
        )

    @property
    def num_steps(self) -> int:
        return int(self.step_offsets.size - 1)

    @property
    def end_step(self) -> int:
        """The first global step after the window."""
        return self.first_step + self.num_steps

    @property
    def hit(self) -> np.ndarray:
        """Accesses served from a buffer (RAM or tier), not read from storage."""
        return (self.flags & (HIT | THIT)) != 0

    @property
    def served(self) -> np.ndarray:
        """Accesses served (all but side rows)."""
        return (self.flags & SIDE) == 0

    def steps(self) -> np.ndarray:
        """Global step index of every access: shape (A,)."""
        return self.first_step + np.repeat(np.arange(self.num_steps), np.diff(self.step_offsets))

    def batch_sizes(self) -> np.ndarray:
        """Local batch size at every step of the window: shape (num_steps,)."""
        sizes = np.diff(self.step_offsets)
        side = np.flatnonzero((self.flags & SIDE) != 0)
        if side.size:
            step = np.searchsorted(self.step_offsets, side, side="right") - 1
            sizes = sizes - np.bincount(step, minlength=self.num_steps)
        return sizes

    def _local(self, k: int, end_ok: bool = False) -> int:
        t = k - self.first_step
        if not 0 <= t <= self.num_steps - (0 if end_ok else 1):
            raise IndexError(f"step {k} is outside steps {self.first_step}..{self.end_step - 1}")
        return t

    def step(self, k: int) -> StepPlan:
        """The instructions of global step ``k``."""
        t = self._local(k)
        a, b = int(self.step_offsets[t]), int(self.step_offsets[t + 1])
        flags, slots = self.flags[a:b], self.slot[a:b].astype(np.int64)
        hit = (flags & HIT) != 0
        admit = (flags & ADMIT) != 0
        samples = self.sample[a:b].astype(np.int64)
        served = b - a
        if self.tier_slots == 0 and served and flags[-1] & SIDE:  # side rows follow the batch
            served = int(np.argmax((flags & SIDE) != 0))
            side = np.arange(served, b - a)
            return StepPlan(k, samples[:served], np.flatnonzero(~hit[:served]),
                            np.flatnonzero(hit), slots[hit], np.flatnonzero(admit),
                            slots[admit], side_samples=samples[side])  # fmt: skip
        if not self.tier_slots or not np.any(flags & (THIT | TADMIT | DEMOTE)):
            return StepPlan(k, samples, np.flatnonzero(~hit), np.flatnonzero(hit), slots[hit],
                            np.flatnonzero(admit), slots[admit])  # fmt: skip
        tslots = self.tslot[a:b].astype(np.int64)
        thit = (flags & THIT) != 0
        demote = (flags & DEMOTE) != 0
        tadmit = (flags & TADMIT) != 0
        admit_slots = slots[admit]
        writes = tslots[demote | tadmit]
        # Applying demotions, then stores, then tier admissions in bulk is the access order
        # unless a RAM slot is stored twice or a tier slot written twice.
        in_order = np.unique(admit_slots).size < admit_slots.size or (
            np.unique(writes).size < writes.size
        )
        return StepPlan(
            k, samples, np.flatnonzero(~(hit | thit)), np.flatnonzero(hit), slots[hit],
            np.flatnonzero(admit), admit_slots, np.flatnonzero(thit), tslots[thit],
            slots[demote], tslots[demote], np.flatnonzero(tadmit), tslots[tadmit],
            in_order=bool(in_order),
        )  # fmt: skip

    def transfer(self, k: int) -> Transfer | None:
        """Step ``k``'s exchange of rows with the other ranks (equal batches), or None."""
        if self.peers is None:
            return None
        return rank_transfer(self.peers[self._local(k)], self.rank)

    def step_actions(self, k: int) -> list[tuple[int, int, int]]:
        """Step ``k``'s buffer updates access by access, for steps ``in_order``: a list of
        ``(flag, row, slot)`` with flag DEMOTE (``row`` is the RAM slot, ``slot`` the tier
        slot), ADMIT (row into RAM slot) or TADMIT (row into tier slot)."""
        t = self._local(k)
        a, b = int(self.step_offsets[t]), int(self.step_offsets[t + 1])
        out = []
        for j in np.flatnonzero(self.flags[a:b] & (ADMIT | TADMIT | DEMOTE)).tolist():
            f, s, ts = int(self.flags[a + j]), int(self.slot[a + j]), int(self.tslot[a + j])
            if f & DEMOTE:
                out.append((DEMOTE, s, ts))
            if f & ADMIT:
                out.append((ADMIT, j, s))
            if f & TADMIT:
                out.append((TADMIT, j, ts))
        return out

    def contents_at(self, k: int) -> NDArray[np.int64]:
        """The sample each cell holds at the start of step ``k`` (-1: empty): shape (cells,).

        A replay, from ``initial``, of the window's admissions and releases before step ``k``.
        """
        t = self._local(k, end_ok=True)
        if self.initial is None:
            state = np.full(self.cells, -1, np.int64)
        else:
            state = self.initial.astype(np.int64, copy=True)
        end = int(self.step_offsets[t])
        bad = _replay(self.sample, self.slot, self.tslot, self.flags, 0, end, self.slots, state)
        if bad >= 0:
            raise CorruptPlanError(
                f"rank {self.rank}: access {bad} names slot {self.slot[bad]} / "
                f"tier slot {self.tslot[bad]}"
            )
        return state

    def refill_at(self, k: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """``(cells, samples)`` the buffer must hold to start at step ``k``: those a later hit
        (or demotion) reads before anything overwrites them (the rest of :meth:`contents_at`
        is dead). In an incomplete window, a held cell untouched till its end is kept too."""
        t = self._local(k, end_ok=True)
        needed = np.zeros(self.cells, np.bool_)
        decided = _read_before_overwrite(
            self.slot, self.tslot, self.flags, self.step_offsets, t, self.slots, needed
        )
        contents = self.contents_at(k)
        if not self.complete:
            needed |= ~decided & (contents >= 0)
        cells = np.flatnonzero(needed)
        samples = contents[cells]
        if np.any(samples < 0):
            raise CorruptPlanError(f"rank {self.rank}, step {k}: a later hit reads an empty slot")
        return cells, samples


@njit(cache=True, nogil=True)
def _batch_rows(ids, samples, rows, src):  # pragma: no cover - compiled
    """Whether ``samples`` are the distinct ``ids`` (each once, in any order); fills ``rows[j]``
    with the first position of ``samples[j]`` in ``ids`` and ``src[i]`` with that of
    ``ids[i]``. An open-addressed table of the ids (linear probing), sized by the batch."""
    n = ids.shape[0]
    bits = 4
    while (1 << bits) < 2 * n:
        bits += 1
    mask = (1 << bits) - 1
    shift = np.uint64(64 - bits)
    keys = np.empty(1 << bits, np.int64)
    first = np.zeros(1 << bits, np.int64)  # first position + 1 (0: an empty slot)
    distinct = 0
    for i in range(n):
        x = ids[i]
        at = np.intp((np.uint64(x) * np.uint64(0x9E3779B97F4A7C15)) >> shift)
        while first[at] != 0 and keys[at] != x:
            at = (at + 1) & mask
        if first[at] == 0:
            keys[at] = x
            first[at] = i + 1
            distinct += 1
        src[i] = first[at] - 1
    if distinct != samples.shape[0]:
        return False
    for j in range(samples.shape[0]):
        x = samples[j]
        at = np.intp((np.uint64(x) * np.uint64(0x9E3779B97F4A7C15)) >> shift)
        while first[at] != 0 and keys[at] != x:
            at = (at + 1) & mask
        if first[at] <= 0:
            return False  # not among the ids, or a second access to one
        rows[j] = first[at] - 1
        first[at] = -first[at]  # taken
    return True


@njit(cache=True, nogil=True)
def _replay(sample, slot, tslot, flags, start, end, c, state):
    """Apply the buffer updates of accesses ``[start, end)`` to ``state`` (cells: RAM slots,
    then ``c`` + tier slot); the first access naming a cell outside it, or -1."""
    n = state.shape[0]
    for i in range(start, end):
        f = flags[i]
        if not f & (ADMIT | RELEASE | TADMIT | DEMOTE):
            continue
        s = slot[i]
        ts = c + tslot[i]
        if (f & (ADMIT | DEMOTE | HIT) and not 0 <= s < c) or (
            f & (TADMIT | DEMOTE | THIT) and not c <= ts < n
        ):
            return i
        if f & DEMOTE:
            state[ts] = state[s]
        elif f & THIT and f & (ADMIT | RELEASE):
            state[ts] = -1  # promoted (to RAM) or released: the tier slot is free
        if f & ADMIT:
            state[s] = sample[i]
        elif f & TADMIT:
            state[ts] = sample[i]
        elif f & RELEASE and f & HIT:
            state[s] = -1
    return -1


@njit(cache=True)
def _read_before_overwrite(slot, tslot, flags, step_offsets, k, c, needed):
    """``needed[cell]``: the cell is read (hit, or the source of a demotion) at or after local
    step k before anything overwrites it. Returns ``decided``: cells touched at all from step
    k on. Within a step, hits read the buffer as it stood at the step's start, so they count
    first; then updates apply in access order."""
    n = needed.shape[0]
    decided = np.zeros(n, np.bool_)
    left = n
    for t in range(k, step_offsets.shape[0] - 1):
        a, b = step_offsets[t], step_offsets[t + 1]
        for i in range(a, b):
            f = flags[i]
            cell = slot[i] if f & HIT else (c + tslot[i] if f & THIT else -1)
            if 0 <= cell < n and not decided[cell]:
                decided[cell] = True
                needed[cell] = True
                left -= 1
        for i in range(a, b):
            f = flags[i]
            s = slot[i]
            if f & DEMOTE and 0 <= s < c and not decided[s]:
                decided[s] = True  # read by the demotion
                needed[s] = True
                left -= 1
            if f & ADMIT and 0 <= s < c and not decided[s]:
                decided[s] = True  # overwritten
                left -= 1
            ts = c + tslot[i]
            if f & (TADMIT | DEMOTE) and c <= ts < n and not decided[ts]:
                decided[ts] = True  # overwritten
                left -= 1
        if left == 0:
            break
    return decided

"""A rank's window of its buffer's plan, and the pure values the runtime executes: steps and
buffer states. A buffer of its own is a host of one rank: one :class:`RankPlan` serves both.

The runtime never works out what to do from flags itself: it asks :meth:`RankPlan.step` for a
:class:`StepPlan` (what to read, gather and store at one step) and :meth:`RankPlan.refill_at`
for what the buffer must hold to start at a step. Both are pure functions of the plan.

With one buffer per host (``MemoryConfig(share="node")``) the window's epochs are the host
plan's (:class:`~solar.schedule.keep.grouping.HostEpoch`, schedule/keep/hostplan.py: Belady over
the union of the host's ranks' accesses) and a step is this rank's: its hits in the host's
slots, its own storage reads, the admissions it stores (only a row's reader stores it), and its
``PEER`` rows, read at the same step by another local rank and taken from the host's staging
rows (``stage_rows``/``stage_at``, ``peer_rows``/``peer_at``). Buffer states are the host's
(every local rank fills its share of a refill). With equal batches, :meth:`RankPlan.transfer`
is the rank's exchange of rows with other ranks (of other hosts: solar/schedule/keep/hostequal.py).
Where the host (or a rank alone) updates a cell twice in a step, its updates are cut into phases
applied in turn (:func:`~solar.schedule.keep.hostplan.host_phases`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from numba import njit
from numpy.typing import NDArray

from solar.errors import CorruptPlanError, SolarError
from solar.schedule.draw.idtable import find, id_table
from solar.schedule.keep.grouping import HostEpoch
from solar.schedule.keep.hostequal import host_transfer
from solar.schedule.keep.hostplan import host_phases
from solar.schedule.keep.planner import RankEpoch
from solar.schedule.keep.transfer import Transfer, rank_transfer
from solar.schedule.policy import ADMIT, DEMOTE, HIT, PEER, RELEASE, SIDE, TADMIT, THIT, no_tier

_NONE = np.zeros(0, np.int64)
_NONE.flags.writeable = False


class StepPlan(NamedTuple):  # a NamedTuple: one is made per step, cheaper than a dataclass
    """What one rank does at one global step. Rows index the step's batch (0..size-1), then
    its side rows (size..rows_needed-1), read only to be stored.

    ``hit_rows`` are gathered from RAM ``hit_slots`` and ``tier_rows`` read from tier
    ``tier_slots``, both as they stand at the start of the step; ``read_rows`` are read from
    storage. Once the batch is assembled, in order: RAM ``demote_slots`` are written to tier
    ``demote_tslots``, ``admit_rows`` are stored into RAM ``admit_slots`` and ``tadmit_rows``
    written to tier ``tadmit_tslots``; where the buffer updates a cell twice in the step, in
    the phases below, in turn. All arrays are int64 and 1-D.
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
    # A sampler's batch with repeats: once the batch is assembled rows ``copy_src`` are copied
    # into ``copy_dst``.
    copy_src: NDArray[np.int64] = _NONE
    copy_dst: NDArray[np.int64] = _NONE
    # Side rows (pagemates.py): read with the reads into rows ``size..size + m - 1`` after the
    # batch, stored as admissions (``admit_rows`` name them), never served.
    side_samples: NDArray[np.int64] = _NONE  # (m,)
    # A host's buffer: rows this rank read that other local ranks take, put
    # into the host's staging rows ``stage_at``; rows it takes from staging rows ``peer_at``.
    stage_rows: NDArray[np.int64] = _NONE
    stage_at: NDArray[np.int64] = _NONE
    peer_rows: NDArray[np.int64] = _NONE
    peer_at: NDArray[np.int64] = _NONE
    # A step whose buffer updates a cell twice: its updates in phases applied in turn, each
    # demotion's, admission's and tier admission's phase, and before each phase whether the
    # host's ranks wait for each other (keep/hostplan.host_phases; None: one phase).
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

    def in_batch(self, ids: NDArray[np.int64], distinct: bool = False) -> StepPlan:
        """This step as a sampler's batch ``ids`` (batch order, repeats allowed): each access
        lands in the row of its sample's first occurrence, repeats are copies of it. Raises
        ValueError unless the step's accesses are exactly the distinct ``ids``. ``distinct``:
        the sampler's batches have no repeat (Sampler.distinct)."""
        rows = np.empty(self.size, np.int64)  # access j -> the first row of its sample
        # A trace's plan keeps its batch's order but for its hits, put first (belady.py
        # _hits_first): distinct ids are then its hits and the rest interleaved, a merge;
        # else a hash of the batch's ids, not a sort: a step costs O(its rows) (issue 47).
        first = self.hit_rows.size + self.tier_rows.size
        if distinct and _merged_rows(ids, self.samples, first, rows):
            src = dst = _NONE  # (each row its sample's only one: no copies)
        else:
            src = np.empty(ids.size, np.int64)  # row i -> the first row of its sample
            if not _batch_rows(ids, self.samples, rows, src):
                raise ValueError("the sampler's batch differs from the plan's accesses")
            dst = np.flatnonzero(src != np.arange(ids.size))
        if self.size == ids.size and np.array_equal(rows, np.arange(ids.size)):
            return self  # the accesses are the batch, in its order
        # Side rows follow the batch: they move with its length.
        rows = np.concatenate([rows, np.arange(self.side_samples.size) + ids.size])
        return self._replace(
            samples=ids.astype(np.int64), read_rows=rows[self.read_rows],
            hit_rows=rows[self.hit_rows], admit_rows=rows[self.admit_rows],
            tier_rows=rows[self.tier_rows], tadmit_rows=rows[self.tadmit_rows],
            stage_rows=rows[self.stage_rows], peer_rows=rows[self.peer_rows],
            copy_src=src[dst], copy_dst=dst,
        )  # fmt: skip

    @property
    def tier_writes(self) -> NDArray[np.int64]:
        """Tier slots this step writes."""
        return np.concatenate([self.demote_tslots, self.tadmit_tslots])


def elsewhere(k: int, ids: NDArray[np.int64]) -> StepPlan:
    """Step ``k`` of batch ``ids`` served by another member of the plan (a preprocessing
    worker: solar/schedule/draw/members.py): its distinct samples, none read, hit or kept
    here."""
    _, first = np.unique(ids, return_index=True)
    samples = np.asarray(ids, np.int64)[np.sort(first)]
    return StepPlan(k, samples, _NONE, _NONE, _NONE, _NONE, _NONE)


@dataclass(frozen=True)
class Share:
    """Rank ``rank``'s place in its buffer: local rank ``local`` of host ``host`` (global ranks
    ``group``), the buffer's ``slots`` and ``tier_slots``, the host's ``stage_rows`` (rows one
    local rank reads for others at a step, at most), the run's steps per epoch ``spe`` and
    whether its batches are equalised across hosts (``equal``). A buffer of its own: a host of
    one rank (:meth:`alone`)."""

    rank: int
    host: int
    local: int
    group: tuple[int, ...]
    slots: int
    tier_slots: int
    stage_rows: int
    spe: int
    equal: bool

    @classmethod
    def alone(cls, rank: int, slots: int, tier_slots: int, spe: int) -> Share:
        """Rank ``rank`` with a buffer of its own (its exchange, if any, is in its epochs)."""
        return cls(rank, rank, 0, (rank,), slots, tier_slots, 0, spe, False)


def _decision(i: int, doc: str) -> Any:
    """A :class:`RankPlan` attribute: its ``i``-th array of the buffer's decisions."""
    return property(lambda self: self._arrays[i], doc=doc)


class RankPlan:
    """Rank ``share.rank``'s window of its buffer's plan: consecutive epochs ``parts`` (its own
    :class:`~solar.schedule.keep.planner.RankEpoch`, or its host's
    :class:`~solar.schedule.keep.grouping.HostEpoch`) from global step ``first_step``, over
    ``slots`` RAM slots and ``tier_slots`` tier slots, with the buffer holding ``initial``
    (sample per cell, -1: nothing needed; None: empty) as the window starts; ``complete`` says
    whether the window reaches the end of the run. Steps are always named by their global
    index. Buffer states are arrays over cells: RAM slots ``0..slots-1``, then tier slot t as
    cell ``slots + t``. The buffer's decisions over the window (``sample``, ``slot``,
    ``flags``, ``step_offsets``, ``tslot``: a host's, the host as one rank) are put together
    when first asked (a host's: by a resume's replay)."""

    def __init__(self, share: Share, parts: list, first_step: int = 0,
                 initial: np.ndarray | None = None, complete: bool = True) -> None:  # fmt: skip
        self.share, self.parts, self.first_step = share, parts, first_step
        self.initial, self.complete = initial, complete
        self.rank, self.slots, self.tier_slots = share.rank, share.slots, share.tier_slots
        self.end_step = first_step + len(parts) * share.spe  # the first global step after it

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
        """Consecutive epochs' parts (``RankEpoch``) of one rank's own buffer."""
        spe = int(parts[0].step_offsets.size - 1) if parts else 0
        return cls(Share.alone(rank, slots, tier_slots, spe), parts, first_step, initial,
                   complete)  # fmt: skip

    def _rank_parts(self) -> list:
        """The window's epochs as the buffer's own (a host's: the host as one rank)."""
        parts = self.parts
        if parts and isinstance(parts[0], HostEpoch):
            return [ne.host.rank(self.share.host) for ne in parts]
        return parts

    @functools.cached_property
    def _arrays(self) -> tuple[Any, ...]:
        """The buffer's decisions over the window: sample, slot, flags, step offsets, tslot,
        peers (every rank's served counts with equal batches, else None)."""
        parts = self._rank_parts()
        if len(parts) == 1:  # (as given: a validator's epoch is checked as read)
            p = parts[0]
            return p.sample, p.slot, p.flags, p.step_offsets, p.tslot, p.peers
        offsets = [np.zeros(1, np.int64)]
        base = 0
        for p in parts:
            offsets.append(p.step_offsets[1:] + base)
            base += int(p.step_offsets[-1])
        sample = np.concatenate([p.sample for p in parts])
        tslot = np.concatenate([p.tslot for p in parts]) if self.tier_slots \
            else no_tier(sample.size)  # fmt: skip
        peers = None
        if parts and all(p.peers is not None for p in parts):
            peers = np.concatenate([p.peers for p in parts])
        return (sample, np.concatenate([p.slot for p in parts]),
                np.concatenate([p.flags for p in parts]), np.concatenate(offsets), tslot,
                peers)  # fmt: skip

    sample = _decision(0, "(A,) sample id of each access (int32, or int64 if N >= 2**31)")
    slot = _decision(1, "(A,) int32 RAM slot, -1: none")
    flags = _decision(2, "(A,) uint8: HIT | ADMIT | RELEASE | THIT | TADMIT | DEMOTE | SIDE")
    step_offsets = _decision(3, "(num_steps + 1,) int64: local step t is [offsets[t], [t + 1])")
    tslot = _decision(4, "(A,) int32 tier slot, -1: none (no tier: no_tier's, in no memory)")
    peers = _decision(5, "With equal batches: every rank's served counts, (num_steps, P)")

    @property
    def cells(self) -> int:
        """RAM slots and tier slots together."""
        return self.slots + self.tier_slots

    @property
    def num_steps(self) -> int:
        return self.end_step - self.first_step

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
        """The rank's instructions at global step ``k``: its accesses in service order, then
        its side rows."""
        e, t = divmod(self._local(k), self.share.spe)
        part = self.parts[e]
        if isinstance(part, HostEpoch):
            return self._host_step(k, part, t)
        a, b = int(part.step_offsets[t]), int(part.step_offsets[t + 1])
        f, slot, tslot = part.flags[a:b], part.slot[a:b], part.tslot[a:b]
        return _step_plan(k, self.tier_slots, f, part.sample[a:b], slot, tslot,
                          lambda: _updates([(np.arange(b - a), f, slot, tslot)]), 0,
                          True)  # fmt: skip

    def _host_step(self, k: int, ne: HostEpoch, t: int) -> StepPlan:
        """Step ``k`` (local step ``t`` of ``ne``) of a rank sharing its host's buffer."""
        s = self.share
        ranks, so = ne.ranks, ne.ranks.step_offsets

        def span(q: int) -> slice:
            lo = ranks.rank_offsets[q]
            return slice(int(lo + so[q, t]), int(lo + so[q, t + 1]))

        # The host's staging rows of the step: its accesses some local rank takes as PEER, in
        # sample order (every local rank computes the same, or takes the published ones).
        if ne.staged is not None:
            shared = ne.staged[1][ne.staged[0][t] : ne.staged[0][t + 1]]
        else:
            taken = [ne.at[span(q)][(ranks.flags[span(q)] & PEER) != 0] for q in s.group]
            shared = np.unique(np.concatenate(taken))
        if shared.size > s.stage_rows:
            raise SolarError(f"host buffer: step {k} shares {shared.size} rows between local "
                             f"ranks, more than the {s.stage_rows} staging rows made for a "
                             "batch of at most the sampler's bound")  # fmt: skip
        mine = span(s.rank)
        f, at = ranks.flags[mine], ne.at[mine]

        def updates() -> np.ndarray:
            spans = [span(r) for r in s.group]
            return _updates([(ne.at[q], ranks.flags[q], ranks.slot[q], ranks.tslot[q])
                             for q in spans])  # fmt: skip

        step = _step_plan(k, s.tier_slots, f, ranks.sample[mine], ranks.slot[mine],
                          ranks.tslot[mine], updates, s.local, len(s.group) == 1)  # fmt: skip
        if not shared.size:
            return step
        peer = (f & PEER) != 0
        stage = ((f & (HIT | THIT | PEER)) == 0) & np.isin(at, shared)
        peer_at = np.searchsorted(shared, at[peer]).astype(np.int64)
        stage_at = np.searchsorted(shared, at[stage]).astype(np.int64)
        if ne.staged is not None and not (_found(shared, peer_at, at[peer])
                                          and _found(shared, stage_at, at[stage])):  # fmt: skip
            raise CorruptPlanError(f"host plan (shared epoch): step {k}'s staging set does not "
                                   "hold the rows its ranks stage and take")  # fmt: skip
        return step._replace(stage_rows=np.flatnonzero(stage), stage_at=stage_at,
                             peer_rows=np.flatnonzero(peer), peer_at=peer_at)  # fmt: skip

    def transfer(self, k: int) -> Transfer | None:
        """Step ``k``'s exchange of rows with the other ranks (equal batches; with a host's
        buffer, the rows it serves over its share go to ranks of other hosts), or None."""
        e, t = divmod(self._local(k), self.share.spe)
        part = self.parts[e]
        if isinstance(part, HostEpoch):
            if not self.share.equal:
                return None
            so = part.ranks.step_offsets if part.all_steps is None else part.all_steps
            return host_transfer(so, t, self.rank, part.hosts.count)
        return None if part.peers is None else rank_transfer(part.peers[t], self.rank)

    def contents_at(self, k: int) -> NDArray[np.int64]:
        """The sample each cell holds at the start of step ``k`` (-1: empty): shape (cells,).

        A replay, from ``initial``, of the window's admissions and releases before step ``k``.
        """
        t = self._local(k, end_ok=True)
        if self.initial is None:
            state = np.full(self.cells, -1, np.int64)
        else:
            state = self.initial.astype(np.int64, copy=True)
        # Epoch by epoch: the window's arrays are not joined for it (each epoch's would be
        # copied into fresh memory, once per window, as the stream trims a window every epoch).
        spe, done = self.share.spe, 0
        for e, p in enumerate(self._rank_parts()):
            if e * spe >= t:
                break
            end = int(p.step_offsets[min(t - e * spe, spe)])
            bad = _replay(p.sample, p.slot, p.tslot, p.flags, 0, end, self.slots, state)
            if bad >= 0:
                raise CorruptPlanError(
                    f"rank {self.rank}: access {done + bad} names slot {p.slot[bad]} / "
                    f"tier slot {p.tslot[bad]}"
                )
            done += int(p.step_offsets[-1])
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


def _step_plan(k: int, tier_slots: int, f: np.ndarray, sample: np.ndarray, slot: np.ndarray,
               tslot: np.ndarray, updates: Callable[[], np.ndarray], local: int,
               alone: bool) -> StepPlan:  # fmt: skip
    """Step ``k`` of a rank (local rank ``local`` of its buffer; ``alone``: the buffer's only
    rank) whose accesses are ``f``, ``sample``, ``slot``, ``tslot``; ``updates()``, its
    buffer's updates of the step (as :func:`_updates` gives them), asked only where a tier's
    updates may need phases."""
    x = sample.astype(np.int64)
    slot = slot.astype(np.int64)
    # One pass over the step's accesses sorts them into what each stage does (_split_step).
    out = np.empty((_TIER_ROWS if tier_slots else _RAM_ROWS, f.size), np.int64)
    bad, served, own, hits, admits, thits, demotes, tadmits, again = _split_step(
        f.astype(np.uint8), slot, tslot.astype(np.int64) if tier_slots else slot, out
    )  # fmt: skip
    if bad == 1:
        raise CorruptPlanError(f"host plan: step {k} uses a tier the buffer does not have")
    if bad == 2:
        raise CorruptPlanError(f"host plan: step {k}'s side rows do not follow its batch")
    step = StepPlan(k, x[:served], out[0, :own], out[1, :hits], out[2, :hits], out[3, :admits],
                    out[4, :admits], side_samples=x[served:])  # fmt: skip
    if not tier_slots:
        return step
    tier: dict[str, Any] = dict(
        tier_rows=out[5, :thits], tier_slots=out[6, :thits], demote_slots=out[8, :demotes],
        demote_tslots=out[9, :demotes], tadmit_rows=out[10, :tadmits],
        tadmit_tslots=out[11, :tadmits],
    )  # fmt: skip
    # The buffer's phases: where it updates a cell twice, in turn (the host's ranks alike). A
    # rank alone whose updates name each cell once has one phase: the kernel is not asked.
    if again or not alone:
        u = updates()
        phase, waits = host_phases(u[:, 1], u[:, 3], u[:, 4], u[:, 5])
        if waits.size > 1:
            of = np.full(f.size, -1, np.int64)
            me = u[:, 1] == local
            of[u[me, 2]] = phase[me]
            tier.update(phase_waits=waits, demote_phase=of[out[7, :demotes]],
                        admit_phase=of[out[3, :admits]],
                        tadmit_phase=of[out[10, :tadmits]])  # fmt: skip
    return step._replace(**tier)


# Rows of _split_step's output: without a tier, then with one.
_RAM_ROWS, _TIER_ROWS = 5, 12


@njit(cache=True, nogil=True)
def _split_step(flags, slot, tslot, out):  # pragma: no cover - compiled
    """A step's accesses sorted into what is done with each, in access order, into the rows of
    ``out``: 0 storage reads (not hit, taken from a peer or a side row), 1-2 hits and their
    slots, 3-4 admissions and their slots; with a tier (12 rows), 5-6 tier hits and their tier
    slots, 7-9 demotions (access, slot, tier slot), 10-11 tier admissions and their tier slots.
    Returns ``(bad, served, reads, hits, admits, tier hits, demotions, tier admits, again)``:
    bad 1, a tier used without one; 2, a side row before a served one; ``served``, rows before
    the side rows; ``again``, whether (with a tier) a RAM slot is stored, or a tier slot
    written, twice (keep/hostplan.host_phases' phases are needed)."""
    tier = out.shape[0] > 5
    n = flags.shape[0]
    bad = 0
    served = n
    c = np.zeros(6, np.int64)
    for i in range(n):
        f = flags[i]
        if f & (THIT | TADMIT | DEMOTE) and not tier:
            bad = 1
        if f & SIDE:
            served = min(served, i)
        elif served < n and bad == 0:
            bad = 2
        if not f & (HIT | THIT | PEER | SIDE):
            out[0, c[0]] = i
            c[0] += 1
        if f & HIT:
            out[1, c[1]] = i
            out[2, c[1]] = slot[i]
            c[1] += 1
        if f & ADMIT:
            out[3, c[2]] = i
            out[4, c[2]] = slot[i]
            c[2] += 1
        if not tier:
            continue
        if f & THIT:
            out[5, c[3]] = i
            out[6, c[3]] = tslot[i]
            c[3] += 1
        if f & DEMOTE:
            out[7, c[4]] = i
            out[8, c[4]] = slot[i]
            out[9, c[4]] = tslot[i]
            c[4] += 1
        if f & TADMIT:
            out[10, c[5]] = i
            out[11, c[5]] = tslot[i]
            c[5] += 1
    again = False
    if tier and bad == 0:
        # A cell named twice: its stores (RAM slots admitted), then its writes (tier slots
        # admitted or demoted into, one per access), each sorted, then side by side.
        stores = np.sort(out[4, : c[2]])
        writes = np.empty(n, np.int64)
        m = 0
        for i in range(n):
            if flags[i] & (TADMIT | DEMOTE):
                writes[m] = tslot[i]
                m += 1
        writes = np.sort(writes[:m])
        for cells in (stores, writes):
            for j in range(1, cells.shape[0]):
                if cells[j] >= 0 and cells[j] == cells[j - 1]:
                    again = True
    return bad, served, c[0], c[1], c[2], c[3], c[4], c[5], again


def rehearse_phases() -> None:
    """Build a step whose buffer stores a RAM slot twice: the phases' kernels
    (keep/hostplan.host_phases), which a rank alone asks only of such a step, now and then
    inside an epoch, are loaded before it (solar/warm.py)."""
    f, slot, tslot = np.full(2, ADMIT, np.uint8), np.zeros(2, np.int32), np.full(2, -1, np.int32)
    step = _step_plan(0, 1, f, np.arange(2), slot, tslot,
                      lambda: _updates([(np.arange(2), f, slot, tslot)]), 0, True)  # fmt: skip
    if step.phase_waits is None:
        raise AssertionError("a slot stored twice in a step: phases expected")


def _updates(ranks: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]) -> np.ndarray:
    """A buffer's updates at one step, from each local rank's ``(at, flags, slot, tslot)`` of
    its accesses, in the buffer's access order (``at``): rows ``(at, local rank, access,
    flags, slot, tslot)`` (access: its index in that rank's step), int64."""
    parts = []
    for q, (at, f, slot, tslot) in enumerate(ranks):
        j = np.flatnonzero(f & (ADMIT | TADMIT | DEMOTE))
        parts.append(np.stack([at[j], np.full(j.size, q), j, f[j], slot[j], tslot[j]], axis=1))
    out = np.concatenate(parts).astype(np.int64)
    return out if len(parts) == 1 else out[np.argsort(out[:, 0], kind="stable")]


def _found(shared: np.ndarray, where: np.ndarray, rows: np.ndarray) -> bool:
    """Whether ``shared[where]`` is ``rows`` (a staging set received is untrusted)."""
    return not where.size or (int(where.max()) < shared.size
                              and bool(np.all(shared[where] == rows)))  # fmt: skip


@njit(cache=True, nogil=True)
def _merged_rows(ids, samples, h, rows):  # pragma: no cover - compiled
    """Whether ``ids`` are ``samples[:h]`` and ``samples[h:]`` interleaved, each in its order
    (every id matched once); fills ``rows[j]`` with the position of ``samples[j]`` in ``ids``.
    With distinct ``ids`` that is :func:`_batch_rows`' answer where it holds (False: ask it)."""
    n, m = ids.shape[0], samples.shape[0]
    if n != m or not 0 <= h <= m:
        return False
    p, q = 0, h
    for i in range(n):
        x = ids[i]
        if p < h and samples[p] == x:
            rows[p] = i
            p += 1
        elif q < m and samples[q] == x:
            rows[q] = i
            q += 1
        else:
            return False
    return True


@njit(cache=True, nogil=True)
def _batch_rows(ids, samples, rows, src):  # pragma: no cover - compiled
    """Whether ``samples`` are the distinct ``ids`` (each once, in any order); fills ``rows[j]``
    with the first position of ``samples[j]`` in ``ids`` and ``src[i]`` with that of
    ``ids[i]``. A table of the ids (draw/idtable.py), sized by the batch."""
    n = ids.shape[0]
    keys, mask = id_table(n)
    first = np.zeros(keys.shape[0], np.int64)  # first position + 1 (0: not an id)
    distinct = 0
    for i in range(n):
        x = ids[i]
        if x < 0:
            return False  # not a sample id
        at = find(keys, x, mask)
        if keys[at] < 0:
            keys[at] = x
            first[at] = i + 1
            distinct += 1
        src[i] = first[at] - 1
    if distinct != samples.shape[0]:
        return False
    for j in range(samples.shape[0]):
        x = samples[j]
        at = find(keys, x, mask) if x >= 0 else 0
        if x < 0 or keys[at] != x or first[at] <= 0:
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

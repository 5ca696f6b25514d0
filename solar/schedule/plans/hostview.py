"""A rank's view of its host's epoch planned in parts (solar/schedule/keep/hostparts.py).

Each local rank plans one part of the host's buffer and posts it (schedule/plans/hostpayload.py);
every rank takes all of them and puts together only what it uses: its own service (the
merged plan's order: every step's served rows part by part, then its side rows), the staging
sets, the host's buffer as the epoch starts and, only when a resume asks, the host's decisions
(:class:`PartedHost`). The other ranks' services stay in the parts' shared pages (a tier's
phases need the host's updates: then its ranks' services are put together too). Host indexes
(``at``, staging sets) number the parts' accesses one part after another.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from solar.schedule.keep.grouping import HostEpoch
from solar.schedule.keep.hostparts import Parts, merged
from solar.schedule.keep.planner import EpochPlan, RankEpoch


class PartedHost(EpochPlan):
    """The host's decisions of an epoch planned in parts, merged when first asked (a resume's
    replay): the parts' host plans, each checked as it is read."""

    _parts: list[EpochPlan]
    _bases: tuple[list[int], list[int]]
    _whole: EpochPlan | None

    @classmethod
    def of(cls, epoch: int, parts: list[EpochPlan], slot_bases: list[int],
           tier_bases: list[int]) -> PartedHost:  # fmt: skip
        first = parts[0]
        empty = np.zeros(0, np.int64)
        out = cls(epoch, first.rank_offsets * 0, first.step_offsets * 0, empty, empty, empty,
                  empty)  # fmt: skip
        object.__setattr__(out, "_parts", parts)
        object.__setattr__(out, "_bases", (slot_bases, tier_bases))
        object.__setattr__(out, "_whole", None)
        return out

    def rank(self, r: int) -> RankEpoch:
        if self._whole is None:
            for p in self._parts:
                p.rank(r)  # (a shared part's decisions are checked as they are first used)
            object.__setattr__(self, "_whole", merged(self._parts, *self._bases)[0])
        assert self._whole is not None
        return self._whole.rank(r)


def _kept(ranks: EpochPlan, keep: list[int]) -> EpochPlan:
    """The consecutive ranks ``keep``'s entries of ``ranks``, as ranks 0.. of their own (a
    rank's view merges its host's ranks, never the job's)."""
    lo, hi = int(ranks.rank_offsets[keep[0]]), int(ranks.rank_offsets[keep[-1] + 1])
    steps = np.ascontiguousarray(ranks.step_offsets[keep])
    offsets = np.zeros(len(keep) + 1, np.int64)
    np.cumsum(steps[:, -1], out=offsets[1:])
    return EpochPlan(ranks.epoch, offsets, steps, ranks.sample[lo:hi], ranks.slot[lo:hi],
                     ranks.flags[lo:hi], ranks.tslot[lo:hi])  # fmt: skip


def _in_world(kept: EpochPlan, keep: list[int], world: int) -> EpochPlan:
    """``kept`` (ranks ``keep`` as 0..) back in the job's numbering: the others empty."""
    steps = np.zeros((world, kept.step_offsets.shape[1]), np.int64)
    steps[keep] = kept.step_offsets
    offsets = np.zeros(world + 1, np.int64)
    np.cumsum(steps[:, -1], out=offsets[1:])
    return dataclasses.replace(kept, rank_offsets=offsets, step_offsets=steps)


def _staged(parts: list[HostEpoch], starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every step's staging set over the parts (each part's, numbered after the earlier
    parts' accesses): (offsets, values), sorted per step."""
    offs = [p.staged[0] for p in parts if p.staged is not None]
    vals = [p.staged[1] for p in parts if p.staged is not None]
    counts = np.stack([np.diff(o) for o in offs])  # (p, steps)
    total = counts.sum(axis=0)
    offsets = np.zeros(total.size + 1, np.int64)
    np.cumsum(total, out=offsets[1:])
    before = np.cumsum(counts, axis=0) - counts
    values = np.empty(int(offsets[-1]), np.int64)
    for j, (o, v) in enumerate(zip(offs, vals, strict=True)):
        step = np.repeat(np.arange(total.size), counts[j])
        values[offsets[step] + before[j][step] + np.arange(v.size) - o[step]] = v + starts[j]
    return offsets, values


def assemble(parts: list[HostEpoch], rank: int, group: list[int], layout: Parts, slots: int,
             tier: int) -> HostEpoch:  # fmt: skip
    """Rank ``rank``'s view of its host's epoch from the host's ``parts`` (each as
    :func:`~solar.schedule.plans.hostpayload.unpack` checked it; cells numbered within the part)
    of a     buffer of ``slots`` RAM and ``tier`` tier slots cut by ``layout``."""
    first = parts[0]
    slot_bases, tier_bases = layout.bases(slots), layout.bases(tier)
    keep = group if tier else [rank]  # (a tier's phases read the host's updates)
    mine, places = merged([_kept(p.ranks, keep) for p in parts], slot_bases, tier_bases)
    ranks = _in_world(mine, keep, first.ranks.rank_offsets.size - 1)
    n_host = [int(p.host.rank_offsets[-1]) for p in parts]
    starts = np.concatenate([[0], np.cumsum(n_host)[:-1]]).astype(np.int64)
    reader = np.empty(ranks.sample.size, first.reader.dtype)
    at = np.empty(ranks.sample.size, np.int64)
    for j, (p, d) in enumerate(zip(parts, places, strict=True)):
        lo, hi = int(p.ranks.rank_offsets[keep[0]]), int(p.ranks.rank_offsets[keep[-1] + 1])
        reader[d] = p.reader[lo:hi]
        at[d] = p.at[lo:hi] + starts[j]
    cells = [p.initial for p in parts]
    assert all(c is not None for c in cells)  # (unpack gives every part's)
    initial = layout.cells(cells, slots)  # type: ignore[arg-type]
    all_steps = sum(p.all_steps for p in parts)  # type: ignore[misc]
    host = PartedHost.of(first.epoch, [p.host for p in parts], slot_bases, tier_bases)
    return HostEpoch(first.epoch, first.hosts, host, ranks, reader, at,
                     staged=_staged(parts, starts), initial=initial,
                     all_steps=np.asarray(all_steps, np.int64))  # fmt: skip

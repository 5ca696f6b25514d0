"""A host's buffer in parts: one Belady per part, planned side by side (issue 35).

Planning a host's union on one process costs that process several times one rank's planning
(Belady over the union alone exceeds it at 8 local ranks). Where a sampler fixes each rank's
batch, the host's buffer is cut into ``p`` parts (``p``: the host's ranks): a row belongs to
part ``page(row) mod p`` (its first byte's page; without a page layout, ``row mod p``), and
part ``j`` owns the RAM slots ``base(S, j)..`` (``S // p`` of them, one more for the first
``S % p`` parts) and its share of the tier slots alike. Each part is planned as a host plan
of its own (the host's ranks' batches filtered to its rows, its slots): parts share no row
and no cell, so every part's decisions hold in the whole buffer, and local rank ``j`` can
plan part ``j`` while the others plan theirs. A page's rows fall in one part, so its page
mates do too (a mate of another part has no use in this part's trace: never kept). Cutting
the buffer so keeps one buffer's hits: replayed at 10^6 nodes (bench/node_partition_sim.py)
100 % at 4 ranks, 99.9999 % at 8; planned at 4 ranks (bench/node_bench.py gnn), the same
rows-alone hits, 99.999 % with page mates.

:func:`merge` puts the parts' epochs together into the host's (one definition of the node
plan, whoever computes it): side rows follow a step's served rows, so at every step the
host's served rows come part by part, then its side rows part by part; a rank's service
likewise. Where a job plans, each local rank plans one part (solar/schedule/plans/hostview.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solar.config import BufferConfig
from solar.errors import CorruptPlanError
from solar.schedule.draw.draws import EpochDraws
from solar.schedule.draw.pagemates import PageLayout
from solar.schedule.keep.planner import EpochPlan
from solar.schedule.policy import SIDE


@dataclass(frozen=True)
class Parts:
    """``count`` parts of a host's buffer, rows dealt by page (``pages``) or by id."""

    count: int
    pages: PageLayout | None = None

    def of(self, ids: np.ndarray) -> np.ndarray:
        """Each id's part: (n,) int64."""
        ids = np.asarray(ids, np.int64)
        if self.pages is None:
            return ids % self.count
        p = self.pages
        return ((p.offset + ids * p.row_bytes) // p.page) % self.count

    def size(self, total: int, j: int) -> int:
        """Part ``j``'s share of ``total`` cells."""
        return total // self.count + int(j < total % self.count)

    def base(self, total: int, j: int) -> int:
        """Part ``j``'s first cell of ``total``."""
        return j * (total // self.count) + min(j, total % self.count)

    def bases(self, total: int) -> list[int]:
        """Every part's first cell of ``total``."""
        return [self.base(total, j) for j in range(self.count)]

    def cells(self, contents: list[np.ndarray], slots: int) -> np.ndarray:
        """The whole buffer's cells (RAM slots, then tier slots) from every part's
        ``contents`` (each its RAM slots, then its tier slots) of a host's ``slots``: the
        parts' RAM, then the parts' tiers."""
        ram = [self.size(slots, j) for j in range(self.count)]
        return np.concatenate([c[:n] for c, n in zip(contents, ram, strict=True)]
                              + [c[n:] for c, n in zip(contents, ram, strict=True)])  # fmt: skip

    def buffer(self, slots: int, tier: int, slack: float, j: int) -> BufferConfig:
        """Part ``j``'s buffer of a host's ``slots`` RAM and ``tier`` tier slots."""
        return BufferConfig(self.size(slots, j), slack, self.size(tier, j))

    def split(self, draws: EpochDraws) -> list[EpochDraws]:
        """``draws`` cut into every part's ids, each batch keeping its order (one sort)."""
        part = self.of(draws.ids).astype(np.uint8)  # (uint8: numpy sorts it by radix)
        order = np.argsort(part, kind="stable")
        batches = draws.offsets.size - 1
        batch = np.repeat(np.arange(batches), np.diff(draws.offsets))
        counts = np.bincount(
            part.astype(np.int64) * batches + batch, minlength=self.count * batches
        ).reshape(self.count, batches)
        ends = np.cumsum(counts.sum(axis=1))
        out = []
        for j in range(self.count):
            offsets = np.zeros(batches + 1, np.int64)
            np.cumsum(counts[j], out=offsets[1:])
            out.append(EpochDraws(draws.ids[order[ends[j] - offsets[-1] : ends[j]]], offsets))
        return out


def _places(plans: list[EpochPlan]) -> tuple[list[np.ndarray], np.ndarray]:
    """Where each part's entries go in the merged plan, and its (blocks, steps) counts: every
    (block, step) holds the parts' served rows in part order, then their side rows."""
    shape = plans[0].step_offsets[:, 1:].shape  # (blocks: hosts or ranks, steps)
    nb = shape[0] * shape[1]
    blocks, side = [], []
    for p in plans:
        counts = np.diff(p.step_offsets, axis=1).reshape(-1)
        blocks.append(np.repeat(np.arange(nb, dtype=np.int64), counts))
        side.append((p.flags & SIDE) != 0)
    served = np.stack([np.bincount(b[~s], minlength=nb) for b, s in zip(blocks, side, strict=True)])
    sides = np.stack([np.bincount(b[s], minlength=nb) for b, s in zip(blocks, side, strict=True)])
    total = (served + sides).sum(axis=0)  # (blocks · steps,)
    start = np.concatenate([[0], np.cumsum(total)[:-1]])
    served_before = np.cumsum(served, axis=0) - served  # earlier parts' rows of the block
    sides_before = np.cumsum(sides, axis=0) - sides + served.sum(axis=0)
    out = []
    for j, (b, s) in enumerate(zip(blocks, side, strict=True)):
        # An entry's place in its block: served rows count from 0, side rows after them.
        src = np.concatenate([[0], np.cumsum(served[j] + sides[j])[:-1]])
        within = np.arange(b.size, dtype=np.int64) - src[b]
        within[s] -= served[j][b[s]]
        out.append(start[b] + np.where(s, sides_before[j][b], served_before[j][b]) + within)
    # Every place taken once, or the parts' side rows did not follow their served rows in
    # some block (a part is untrusted where another process planned it): never a hole.
    m = int(total.sum())
    every = np.concatenate(out) if out else np.zeros(0, np.int64)
    if every.size != m or (m and (every.min() < 0 or every.max() >= m
                                  or np.any(np.bincount(every, minlength=m) != 1))):  # fmt: skip
        raise CorruptPlanError("host plan (parts): a part's side rows do not follow its "
                               "served rows at every step")  # fmt: skip
    return out, total.reshape(shape)


def _cells(values: np.ndarray, base: int) -> np.ndarray:
    """A part's slots (or tier slots) in the whole buffer (-1 stays -1)."""
    v = np.asarray(values)
    return np.where(v >= 0, v + base, -1).astype(v.dtype)


def merged(plans: list[EpochPlan], slot_bases: list[int],
            tier_bases: list[int]) -> tuple[EpochPlan, list[np.ndarray]]:  # fmt: skip
    """The parts' plans as one (see :func:`_places`), and where each part's entries went."""
    places, counts = _places(plans)
    first, m = plans[0], int(counts.sum())
    sample, slot = np.empty(m, first.sample.dtype), np.empty(m, first.slot.dtype)
    tslot, flags = np.empty(m, first.tslot.dtype), np.empty(m, first.flags.dtype)
    for j, (p, d) in enumerate(zip(plans, places, strict=True)):
        sample[d], flags[d] = p.sample, p.flags
        slot[d], tslot[d] = _cells(p.slot, slot_bases[j]), _cells(p.tslot, tier_bases[j])
    offsets = np.zeros(counts.shape[0] + 1, np.int64)
    np.cumsum(counts.sum(axis=1), out=offsets[1:])
    steps = np.zeros((counts.shape[0], counts.shape[1] + 1), np.int64)
    np.cumsum(counts, axis=1, out=steps[:, 1:])
    return EpochPlan(first.epoch, offsets, steps, sample, slot, flags, tslot), places


def merge(
    host_parts: list[EpochPlan],
    rank_parts: list[EpochPlan],
    readers: list[np.ndarray],
    ats: list[np.ndarray],
    slot_bases: list[int],
    tier_bases: list[int],
) -> tuple[EpochPlan, EpochPlan, np.ndarray, np.ndarray]:
    """The parts' epochs (each part's host plan, ranks' services, readers and ``at`` into its
    own host plan) as the host's: its host plan, ranks' services, readers and ``at`` (see the
    module's docstring for the order). Slots are moved to each part's cells."""
    host, h_places = merged(host_parts, slot_bases, tier_bases)
    ranks, r_places = merged(rank_parts, slot_bases, tier_bases)
    reader = np.empty(ranks.sample.size, readers[0].dtype)
    at = np.empty(ranks.sample.size, ats[0].dtype)
    for j, d in enumerate(r_places):
        reader[d] = readers[j]
        at[d] = h_places[j][ats[j]]
    return host, ranks, reader, at

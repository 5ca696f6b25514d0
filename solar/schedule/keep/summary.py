"""What a plan comes to: per-rank totals, the figures derived from them, and
:class:`PlanSummary`, all that :func:`~solar.schedule.plans.plan.simulate` keeps of a run."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numba import njit

from solar.config import RunConfig
from solar.schedule.keep.transfer import moved_rows, shares_of_steps
from solar.schedule.policy import ADMIT, HIT, SIDE, THIT, EpochSchedule
from solar.schedule.spec import PlanSpec

if TYPE_CHECKING:
    from solar.schedule.keep.grouping import Hosts


@dataclass(frozen=True)
class RankStats:
    """One rank's totals over the run."""

    accesses: int
    hits: int  # from RAM or the tier
    reads: int
    admits: int
    min_batch: int  # delivered local batches (with equal batches: each rank's share)
    max_batch: int
    tier_hits: int = 0
    sent: int = 0  # equal batches: rows served here and delivered by another rank
    received: int = 0  # equal batches: rows delivered here that another rank served


@dataclass(frozen=True)
class HostTotals:
    """A plan grouped by host's totals over the run
    (:func:`~solar.schedule.keep.hostplan.host_totals`, what ``solar plan --share node``
    reports): the node's accesses (the union of each host's ranks'), hits (from RAM or the
    tier), tier hits, storage reads (page mates apart), rows a rank takes from another's read."""

    hosts: list  # the global ranks of each host
    buffer_per_host: Any  # int, or each host's where hosts differ in size (list)
    accesses: int
    hits: int  # from RAM or the tier
    tier_hits: int
    reads: int
    side_reads: int  # page mates
    peer_rows: int
    hit_rate: float
    reads_per_epoch: float
    moved_rows: int | None = None  # equal batches: rows the exchange moves between hosts

    def as_dict(self) -> dict:
        """JSON-ready (a plan file's ``stats``; ``moved_rows`` only with equal batches)."""
        out = asdict(self)
        if self.moved_rows is None:
            del out["moved_rows"]
        return out


class Totals:
    """Figures of a run derived from its spec and per-rank totals (or, grouped by host, the
    node's :class:`HostTotals`): shared by :class:`PlanSummary` and
    :class:`~solar.schedule.plans.plan.Plan`."""

    spec: PlanSpec
    stats: tuple[RankStats, ...] | HostTotals

    def _sum(self, name: str) -> int:
        if isinstance(self.stats, HostTotals):
            return int(getattr(self.stats, name))
        return sum(getattr(s, name) for s in self.stats)

    @property
    def run(self) -> RunConfig:
        return self.spec.run

    @property
    def world_size(self) -> int:
        return self.spec.run.world_size

    @property
    def accesses(self) -> int:
        return self._sum("accesses")

    @property
    def hits(self) -> int:
        """Hits from RAM and from the tier."""
        return self._sum("hits")

    @property
    def tier_hits(self) -> int:
        return self._sum("tier_hits")

    @property
    def ram_hits(self) -> int:
        return self.hits - self.tier_hits

    @property
    def hit_rate(self) -> float:
        return self.hits / self.accesses

    @property
    def bound(self) -> float:
        """Largest possible hit rate (:attr:`PlanSpec.bound`)."""
        return self.spec.bound


@dataclass(frozen=True)
class PlanSummary(Totals):
    """A run's totals without its decisions: what :func:`~solar.schedule.plans.plan.simulate`
    returns, and :attr:`Plan.summary <solar.schedule.plans.plan.Plan.summary>`."""

    spec: PlanSpec
    stats: tuple[RankStats, ...] | HostTotals
    plan_seconds: float
    fingerprint: str
    hosts: Hosts | None = None  # the grouping by host (None: a buffer per rank)


@njit(cache=True, nogil=True)
def _tally(rank, flags, out):
    """Add each rank's accesses, hits (either tier), admissions and tier hits to ``out``
    (4, P): one pass over an epoch's decisions in access order. A side row is an admission,
    not an access (nothing serves it)."""
    for i in range(rank.shape[0]):
        r = rank[i]
        f = flags[i]
        if f & SIDE:
            out[2, r] += 1
            continue
        out[0, r] += 1
        if f & (HIT | THIT):
            out[1, r] += 1
        if f & ADMIT:
            out[2, r] += 1
        if f & THIT:
            out[3, r] += 1


class Tally:
    """Per-rank totals, accumulated epoch by epoch."""

    def __init__(self, world: int, equal_batches: bool = False) -> None:
        self.equal_batches = equal_batches
        self.a = np.zeros((6, world), np.int64)  # accesses, hits, admits, tier hits, sent, recv
        self.max_batch = np.zeros(world, np.int64)
        self.min_batch = np.full(world, np.iinfo(np.int64).max, np.int64)

    def add(self, sched: EpochSchedule) -> None:
        """Count one epoch's decisions."""
        _tally(sched.rank, sched.flags, self.a)
        counts = sched.counts
        if self.equal_batches:  # what each rank delivers: its share (transfer.py)
            sent, received = moved_rows(counts)
            self.a[4] += sent
            self.a[5] += received
            counts = shares_of_steps(counts)
        self.max_batch = np.maximum(self.max_batch, counts.max(axis=0))
        self.min_batch = np.minimum(self.min_batch, counts.min(axis=0))

    def stats(self) -> tuple[RankStats, ...]:
        """Each rank's totals so far."""
        acc, hits, admits, tier, sent, received = (row.tolist() for row in self.a)
        low, high = self.min_batch.tolist(), self.max_batch.tolist()
        each = zip(acc, hits, admits, low, high, tier, sent, received, strict=True)
        return tuple(RankStats(a, h, a - h, ad, lo, hi, t, s, rc)
                     for a, h, ad, lo, hi, t, s, rc in each)  # fmt: skip

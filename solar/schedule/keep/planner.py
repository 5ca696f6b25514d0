"""Streamed planning: one epoch at a time, memory O(N + P·C) whatever the number of epochs.

:class:`Planner` walks the run's epochs in order. For each it generates the epoch's order and
(for Belady) the next uses from the epochs that follow, lets the policy decide, and returns
the decisions grouped by rank (:class:`EpochPlan`), or only one rank's part
(:class:`RankEpoch`): a rank that simulates every rank keeps just its own. The decisions are
exactly those of planning the whole run at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from numba import njit

from solar.schedule.draw.draws import RankDraws
from solar.schedule.draw.epochs import EpochOrder
from solar.schedule.draw.reorder import reorder_epochs
from solar.schedule.draw.traces import TraceOrder
from solar.schedule.keep.policies import make_policy
from solar.schedule.policy import EpochSchedule, no_tier, tier_slot_count
from solar.schedule.spec import PlanSpec


@dataclass(frozen=True)
class RankEpoch:
    """One rank's part of one run epoch: its accesses in service order, cut into steps."""

    epoch: int
    sample: np.ndarray  # (n,) sample ids
    slot: np.ndarray  # (n,) int32 RAM slot, -1: none
    flags: np.ndarray  # (n,) uint8
    step_offsets: np.ndarray  # (steps per epoch + 1,) int64, from 0 to n
    tslot: np.ndarray  # (n,) int32 tier slot, -1: none
    # With equal batches: every rank's served counts, (steps per epoch, P) int32 (transfer.py).
    peers: np.ndarray | None = None


@dataclass(frozen=True)
class EpochPlan:
    """Every rank's part of one run epoch, rank-major."""

    epoch: int
    rank_offsets: np.ndarray  # (P + 1,) rank r's accesses are [rank_offsets[r], [r + 1])
    step_offsets: np.ndarray  # (P, steps per epoch + 1) within rank r's part
    sample: np.ndarray  # (samples per epoch,)
    slot: np.ndarray
    flags: np.ndarray
    tslot: np.ndarray
    equal_batches: bool = False  # a rank's part carries every rank's counts

    def rank(self, r: int) -> RankEpoch:
        lo, hi = self.rank_offsets[r], self.rank_offsets[r + 1]
        return RankEpoch(
            self.epoch, self.sample[lo:hi], self.slot[lo:hi], self.flags[lo:hi],
            self.step_offsets[r], self.tslot[lo:hi],
            peer_counts(self.step_offsets) if self.equal_batches else None,
        )  # fmt: skip


def peer_counts(step_offsets: np.ndarray) -> np.ndarray:
    """Every rank's served counts from every rank's step offsets (P, steps + 1): (steps, P)."""
    return np.ascontiguousarray(np.diff(step_offsets, axis=1).T, dtype=np.int32)


def epoch_order_of(spec: PlanSpec) -> np.ndarray:
    """The permutation index each run epoch uses (SOLAR's TSP order, or the identity)."""
    run = spec.run
    if spec.reorder_epochs:
        return reorder_epochs(run, spec.buffer.capacity + spec.buffer.tier)  # all a rank holds
    return np.arange(run.epochs, dtype=np.int64)


def rank_alone(spec: PlanSpec) -> bool:
    """Whether a rank's part of ``spec``'s plan depends on its own accesses alone: a sampler's
    trace split by the sampler (no affinity), without equal batches (which need every rank's
    counts)."""
    return spec.traced and not spec.affinity and not spec.equal_batches


class Planner:
    """Plans ``spec``'s run epoch by epoch; call :meth:`next` once per epoch, in order."""

    def __init__(
        self,
        spec: PlanSpec,
        epoch_order: np.ndarray | None = None,
        only_rank: int | None = None,
        draws: RankDraws | None = None,
    ) -> None:
        self.spec = spec
        run = spec.run
        self.epoch_order = epoch_order_of(spec) if epoch_order is None else epoch_order
        self.order: EpochOrder | TraceOrder
        # ``only_rank``: plan that rank alone, where its part does not depend on the others'
        # (a sampler's trace without affinity: the sampler split it); :meth:`next_rank` of it
        # is the same, the other ranks' parts are empty. ``draws``: that rank's draws, kept
        # for its runtime to serve (solar/schedule/draw/samplers.py).
        self.only_rank = only_rank if rank_alone(spec) else None
        # ``window``: an epoch's steps planned in windows of that many (PlanSpec.steps_window:
        # the trace of an epoch too large to hold), None: whole epochs.
        self.window = spec.steps_window if spec.traced else None
        if spec.traced:
            self.order = TraceOrder(run, spec.sampler, spec.horizon, spec.affinity,
                                    self.only_rank, spec.pages, draws, self.window)  # fmt: skip
        else:
            self.order = EpochOrder(run, self.epoch_order)
        self.policy = make_policy(spec.policy, run, spec.buffer, self.order)
        self.epoch = 0  # the next epoch to plan

    def next_schedule(self) -> tuple[np.ndarray, EpochSchedule]:
        """Plan the next epoch: its served samples and the policy's decisions, in access order
        (what a simulation needs; :meth:`next_all` and :meth:`next_rank` group them)."""
        k = self.epoch
        if k >= self.spec.run.epochs:
            raise IndexError(f"the run has {self.spec.run.epochs} epochs, all planned")
        if self.window is not None:
            sched = joined(list(self.next_parts()))
            assert sched.sample is not None
            return sched.sample, sched
        if self.policy.needs_next_use:
            seq, nu = self.order.with_next_use(k)
            self.order.ahead(k + 1)  # computed while the kernel below runs without the GIL
        else:
            seq, nu = self.order.served(k), None
            self.order.prefetch(k + 1)
        sched = self.policy.plan_epoch(k, seq, nu)
        if nu is not None:
            self.order.recycle(nu)
        self.epoch += 1
        if sched.sample is not None:  # the policy added side rows: its accesses are its own
            seq = sched.sample
        elif self.spec.traced:  # seq held (rank, sample) pairs; the plan names samples
            seq = self.order.served(k)
        return seq, sched

    def next_parts(self) -> Iterator[EpochSchedule]:
        """Plan the next epoch in its windows of steps, each window's decisions as it is
        planned (``sample`` names its accesses): all a tally needs, in memory that grows with
        the window, not the epoch (:meth:`next_schedule` joins them). Planned whole (no
        window), the epoch is one part. Consume it to the end before planning on."""
        if self.window is None:
            seq, sched = self.next_schedule()
            sched.sample = seq
            yield sched
            return
        k = self.epoch
        if k >= self.spec.run.epochs:
            raise IndexError(f"the run has {self.spec.run.epochs} epochs, all planned")
        assert isinstance(self.order, TraceOrder)
        for w in self.order.windows(k):
            part = self.policy.plan_window(w)  # type: ignore[attr-defined]
            del w  # (its trace and page mates' table let go before the next window is drawn)
            yield part
        self.epoch += 1

    def snapshot(self) -> dict[str, np.ndarray] | None:
        """The state before the next epoch (:mod:`solar.schedule.plans.snapshot`), or None if the
        policy has no :meth:`restore` (it is replanned from epoch 0)."""
        take = getattr(self.policy, "snapshot", None)
        return take() if take is not None else None

    def restore(self, epoch: int, state: dict[str, np.ndarray]) -> None:
        """Continue from the state a planner had before ``epoch`` (0 < epoch < E); raises
        ValueError if ``state`` is not consistent with this run's order."""
        if not 0 < epoch < self.spec.run.epochs:
            raise ValueError(f"epoch {epoch} outside 1..{self.spec.run.epochs - 1}")
        restore = getattr(self.policy, "restore", None)
        if restore is None:
            raise ValueError(f"policy {self.spec.policy!r} cannot be restored from a snapshot")
        restore(state, lambda samples: self.order.next_use(epoch - 1, samples))
        self.epoch = epoch

    def skip(self) -> None:
        """Plan the next epoch and keep nothing of it (to reach a later epoch)."""
        self.next_schedule()

    def next_all(self) -> EpochPlan:
        """Plan the next epoch; every rank's part."""
        return self.group(*self.next_schedule())

    def group(self, seq: np.ndarray, sched: EpochSchedule) -> EpochPlan:
        """The last epoch planned, ``seq`` and ``sched`` from :meth:`next_schedule`, grouped
        by rank."""
        world = self.spec.run.world_size
        counts = sched.access_counts
        per_rank = counts.sum(axis=0, dtype=np.int64)
        rank_offsets = np.concatenate([[0], np.cumsum(per_rank)]).astype(np.int64)
        step_offsets = np.zeros((world, counts.shape[0] + 1), np.int64)
        np.cumsum(counts.T, axis=1, out=step_offsets[:, 1:])
        sample, slot = np.empty_like(seq), np.empty_like(sched.slot)
        flags = np.empty_like(sched.flags)
        _group(sched.rank, seq, sched.slot, sched.flags, rank_offsets[:-1].copy(), sample, slot,
               flags)  # fmt: skip
        tslot = sched.tslot
        if tier_slot_count(self.spec.run, self.spec.buffer):  # else all -1s, in no memory
            tslot = np.empty_like(sched.tslot)
            _group_one(sched.rank, sched.tslot, rank_offsets[:-1].copy(), tslot)
        return EpochPlan(self.epoch - 1, rank_offsets, step_offsets, sample, slot, flags, tslot,
                         self.spec.equal_batches)  # fmt: skip

    def next_rank(self, r: int) -> RankEpoch:
        """Plan the next epoch; only rank ``r``'s part (every rank is simulated, unless this
        planner plans rank ``r`` alone)."""
        if self.only_rank is not None and r != self.only_rank:
            raise ValueError(f"this planner plans rank {self.only_rank} alone, not rank {r}")
        return self.rank_part(r, *self.next_schedule())

    def rank_part(self, r: int, seq: np.ndarray, sched: EpochSchedule) -> RankEpoch:
        """Rank ``r``'s part of the last epoch planned (``seq`` and ``sched`` from
        :meth:`next_schedule`)."""
        # Planned alone, every access is the rank's own: its arrays as they are (no gather of
        # an epoch's ~10^7 accesses into fresh memory).
        mine = slice(None) if self.only_rank == r else np.flatnonzero(sched.rank == r)
        step_offsets = np.zeros(sched.counts.shape[0] + 1, np.int64)
        np.cumsum(sched.access_counts[:, r], out=step_offsets[1:])
        peers = sched.counts.astype(np.int32) if self.spec.equal_batches else None
        return RankEpoch(self.epoch - 1, seq[mine], sched.slot[mine], sched.flags[mine],
                         step_offsets, sched.tslot[mine], peers)  # fmt: skip

    def contents(self, r: int) -> np.ndarray:
        """What rank r's cells (RAM slots, then tier slots) hold for later use before the next
        epoch: (slots + tier slots,) int64."""
        return self.policy.contents(r)


def joined(parts: list[EpochSchedule]) -> EpochSchedule:
    """The decisions of consecutive windows of an epoch as the epoch's (each field joined in
    turn, the parts' copy of it let go: the epoch's decisions are held about once)."""

    def join(name: str) -> np.ndarray:
        arrays = [getattr(p, name) for p in parts]
        for p in parts:
            setattr(p, name, None)
        return np.concatenate(arrays)

    n = sum(p.rank.size for p in parts)
    tiered = any(p.tslot.strides != (0,) for p in parts)  # (no_tier: -1s in no memory)
    sides = None if parts[0].sides is None else join("sides")
    return EpochSchedule(
        rank=join("rank"), slot=join("slot"), flags=join("flags"), counts=join("counts"),
        tslot=join("tslot") if tiered else no_tier(n), sample=join("sample"), sides=sides,
    )  # fmt: skip


@njit(cache=True, nogil=True)
def _group(rank, seq, slot, flags, fill, sample_out, slot_out, flags_out):
    """Stable counting sort of an epoch's decisions into rank-major order."""
    for i in range(rank.shape[0]):
        j = fill[rank[i]]
        sample_out[j] = seq[i]
        slot_out[j] = slot[i]
        flags_out[j] = flags[i]
        fill[rank[i]] += 1


@njit(cache=True, nogil=True)
def _group_one(rank, values, fill, out):
    """:func:`_group` of one more array."""
    for i in range(rank.shape[0]):
        out[fill[rank[i]]] = values[i]
        fill[rank[i]] += 1

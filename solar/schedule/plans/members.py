"""A member's plan: the buffer of the steps of a trainer that one member serves.

The trace is solar/schedule/draw/members.py's (:class:`MemberTrace`); here, the spec that
plans it: the trainer's, its batches masked to the member's steps. Where the sampler fixes
each rank's batch (no affinity, no equal batches; Shuffle for a trainer alone, its epochs in
the sampler's order) they are the sampler's. Where the plan decides them -- Shuffle over
several trainers (the planner splits each global batch with affinity to what each rank's
buffer holds, within the slack), Shuffle with ``reorder_epochs`` (the planner picks each
epoch's permutation), a sampler with affinity, equal batches -- planning is two passes, the
batches unchanged:

1. the whole job's plan, every rank, exactly as without workers (:class:`Decided`): of it,
   the trainer's served batches in their order and, with equal batches, its exchange of rows;
2. each member's buffer planned over those decided batches (a trace with no affinity: the
   planner's trace path, unchanged).

Trainer and workers each compute pass 1 themselves (a pure function of the spec): nothing
more is exchanged. Pass 1 is planned on demand, in order, in the thread that asks first: pass
2's planner (its look-ahead asks the epoch after the one it plans) or the runtime; it is kept
from the consumer's epoch on (:meth:`Decided.forget_before`).
"""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import Any

import numpy as np

from solar.config import RunConfig
from solar.schedule.draw.draws import EpochDraws, every_rank, given_draws
from solar.schedule.draw.members import MemberTrace, Roster
from solar.schedule.draw.samplers import NO_EXTRAS, Sampler, extras_of, is_shuffle
from solar.schedule.keep.planner import Planner, RankEpoch
from solar.schedule.keep.transfer import Transfer, rank_transfer
from solar.schedule.plans.rankplan import RankPlan
from solar.schedule.policy import TRACE_POLICIES
from solar.schedule.spec import PlanSpec

Mine = tuple[EpochDraws, "np.ndarray | None"]  # a rank's batches of an epoch, its peers' counts


class WholePlan:
    """Pass 1 of ``spec``: the whole job's plan, every rank, as the run without workers plans
    it, epoch by epoch, when asked, in order; of each epoch planned, the batches of each rank
    a :class:`Decided` asks for (a worker's trainers share one: one planner, however many
    trainers it serves), kept from that rank's consumer's epoch on (:meth:`forget_before`).
    No planner snapshots: a resume plans pass 1 from epoch 0."""

    def __init__(self, spec: PlanSpec) -> None:
        self.spec = spec
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._planner: Planner | None = None
        self._planning = threading.Lock()  # one epoch planned at a time, in order
        self._lock = threading.Lock()  # the epochs kept (read while the next is planned)
        self._kept: dict[tuple[int, int], Mine] = {}  # by (rank, epoch)
        self._floors: dict[int, int] = {}  # each rank's consumer's epoch: none kept before
        self.planned = 0  # epochs planned by this process (a replan counts again)

    def __getstate__(self) -> dict:
        return {"spec": self.spec}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset()

    def _here(self) -> None:
        if self._pid != os.getpid():  # a forked child: its parent's planner may be mid-epoch
            self._reset()

    def floor(self, rank: int) -> int:
        """The epoch rank ``rank``'s consumer serves (as last told)."""
        return self._floors.get(rank, 0)

    def forget_before(self, rank: int, epoch: int) -> None:
        """Rank ``rank``'s consumer serves ``epoch`` next: its epochs before it are dropped
        (and not kept if planned again); a seek back lowers the mark."""
        self._here()
        with self._lock:
            self._floors[rank] = epoch
            self._kept = {(r, e): v for (r, e), v in self._kept.items() if r != rank or e >= epoch}

    def join(self, rank: int) -> None:
        """Rank ``rank``'s batches are kept from now on, from epoch 0 (its consumer's, until it
        says): a rank joining after pass 1 planned on has the epochs before planned again."""
        self._here()
        with self._lock:
            self._floors.setdefault(rank, 0)

    def release(self, rank: int) -> None:
        """Rank ``rank`` is no longer served here: nothing more kept for it."""
        with self._lock:
            self._floors.pop(rank, None)
            self._kept = {(r, e): v for (r, e), v in self._kept.items() if r != rank}

    def decided(self, rank: int, epoch: int) -> Mine:
        """Epoch ``epoch``'s batches of rank ``rank``, one per step ((steps + 1) offsets), and
        every rank's served counts per step ((steps, P); None without equal batches)."""
        self._here()
        with self._lock:
            self._floors.setdefault(rank, 0)
            got = self._kept.get((rank, epoch))
        if got is not None:
            return got
        with self._planning:
            with self._lock:
                got = self._kept.get((rank, epoch))
            p = self._planner
            if got is None and (p is None or p.epoch > epoch):
                p = self._planner = Planner(self.spec)
            while got is None:
                assert p is not None
                try:
                    seq, sched = p.next_schedule()
                except BaseException:
                    self._planner = None  # (mid-epoch: planned again from epoch 0 if asked)
                    raise
                self.planned += 1
                e = p.epoch - 1
                with self._lock:
                    # (kept from their floors on; the asker's only at the epoch it asks)
                    ranks = [r for r, f in self._floors.items()
                             if e >= f or (r, e) == (rank, epoch)]  # fmt: skip
                made = {r: self._served(r, p.rank_part(r, seq, sched)) for r in ranks}
                with self._lock:
                    for r, mine in made.items():
                        if e >= self._floors.get(r, e + 1):
                            self._kept[r, e] = mine
                got = made[rank] if e == epoch else None
            return got

    def _served(self, rank: int, part: RankEpoch) -> Mine:
        """Rank ``rank``'s batches of a planned epoch (``part``, its part) and every rank's
        served counts: its served accesses (not side rows) in service order; a traced
        sampler's (affinity), the draws of each global batch the plan gave it, in draw order
        (repeats too), as the runtime serves them (solar/runtime/steps.py)."""
        run = self.spec.run
        spe = run.steps_per_epoch
        plan = RankPlan.from_parts(rank, [part], 0)  # (what a rank serves: one place)
        served = plan.served
        step = plan.steps()[served]
        ids = plan.sample[served].astype(np.int64)
        if self.spec.traced:
            d = self.spec.sampler.epoch(run, part.epoch)
            of = np.repeat(np.arange(spe), np.diff(d.offsets[:: run.world_size]))
            n = run.num_samples
            mine = given_draws(of * n + d.ids, step * n + ids)
            ids, step = d.ids[mine].astype(np.int64), of[mine]
        offsets = np.zeros(spe + 1, np.int64)
        np.cumsum(np.bincount(step, minlength=spe), out=offsets[1:])
        return EpochDraws(ids, offsets), part.peers


class Decided(Sampler):
    """Trainer ``rank``'s batches as ``spec``'s whole plan decides them (pass 1, of ``whole``,
    which it may share: a worker's trainers' ranks): of each epoch the rank's served batches
    (in the order served) and every rank's served counts (equal batches: the rank's exchange,
    :meth:`transfer`). Its epochs hold the rank's batches, every other rank's empty: a trace
    that fixes the rank's batches, a :class:`MemberTrace`'s base.

    Planned when asked, in order, and kept from the consumer's epoch on
    (:meth:`forget_before`, which :class:`~solar.runtime.steps.Steps` calls as a step is
    entered): at most the epochs from the one served to the last pass 2 has planned, plus its
    look-ahead -- the span of pass 2's own window (its stream plans ahead as far as it is let;
    schedule/plans/stream.py), one epoch more. An epoch asked before the consumer's (a seek back
    past it, or pass 2 planned again from epoch 0 after a roster change) is planned again from
    epoch 0, not kept. No planner snapshots: a resume plans pass 1 from epoch 0."""

    kind = "decided"
    affinity = False
    horizon = 1  # (pass 2's look-ahead at most: see member_spec)

    def __init__(self, spec: PlanSpec, rank: int, whole: WholePlan | None = None) -> None:
        self.spec, self.rank = spec, rank
        self.whole = WholePlan(spec) if whole is None else whole
        self.whole.join(rank)
        self._identity: dict[str, Any] | None = None

    @property
    def floor(self) -> int:
        """The epoch the rank's consumer serves (as last told)."""
        return self.whole.floor(self.rank)

    @property
    def planned(self) -> int:
        """Epochs pass 1 planned in this process (a replan counts again)."""
        return self.whole.planned

    def forget_before(self, epoch: int) -> None:
        """The consumer serves ``epoch`` next: the epochs before it are dropped (and not kept
        if planned again); a seek back lowers the mark."""
        if epoch != self.floor:  # (asked every step)
            self.whole.forget_before(self.rank, epoch)

    def release(self) -> None:
        """The rank is no longer served here (its pass 1 shared: the others' kept)."""
        self.whole.release(self.rank)

    def decided(self, epoch: int) -> Mine:
        """Epoch ``epoch``'s batches of the rank, one per step ((steps + 1) offsets), and
        every rank's served counts per step ((steps, P); None without equal batches)."""
        return self.whole.decided(self.rank, epoch)

    def rank_batches(self, run: RunConfig, epoch: int) -> EpochDraws:
        """The rank's batches of ``epoch``, one per step (a :class:`MemberTrace`'s
        ``batches``: no round trip through every rank's layout)."""
        return self.decided(epoch)[0]

    def epoch(self, run: RunConfig, epoch: int) -> EpochDraws:
        return every_rank(run, {self.rank: self.decided(epoch)[0]})

    def transfer(self, k: int) -> Transfer | None:
        """The rank's exchange of rows at global step ``k`` (equal batches), or None: pass
        1's, as the run without workers exchanges them."""
        e, t = divmod(k, self.spec.run.steps_per_epoch)
        peers = self.decided(e)[1]
        return None if peers is None else rank_transfer(peers[t], self.rank)

    def max_batch(self, run: RunConfig) -> int | None:
        s = self.spec
        return s.sampler.max_batch(run) if s.traced else s.buffer.cap(run.batch_size)

    def batch_bound(self, run: RunConfig) -> int:
        s = self.spec
        return s.sampler.batch_bound(run) if s.traced else s.buffer.cap(run.batch_size)

    def identity(self) -> dict[str, Any]:
        if self._identity is None:  # (asked whenever a spec's mode is: made once)
            self._identity = {"kind": self.kind, "plan": self.spec.fingerprint, "rank": self.rank}
        return self._identity


def member_spec(
    spec: PlanSpec,
    rank: int,
    keep: int,
    roster: Roster,
    member: int,
    *,
    ram: bool = False,
    before: MemberTrace | None = None,
    whole: WholePlan | None = None,
) -> PlanSpec | None:
    """The plan of ``member``'s buffer over trainer ``rank``'s steps it owns (``spec``: the
    trainer's run; ``roster``: its workers by epoch, from epoch 0), or None where it has no
    worker or its sampler delivers more than rows: there every member reads its steps' rows
    unplanned. Where the plan decides the trainer's batches, they are pass 1's
    (:class:`Decided`; ``before``: an earlier member trace of this trainer, another roster,
    whose pass 1 is taken over: its epochs kept from the one served on, reused; those before,
    which pass 2, planned again from epoch 0, asks again, are planned again once). ``ram``:
    a buffer in RAM alone (a worker's). ``whole``: pass 1, shared by the trainers this process
    serves (a worker's: one planner, not one per trainer)."""
    base: Sampler = spec.sampler
    if extras_of(base) is not NO_EXTRAS or not any(w for _, w in roster):
        return None
    fixed = spec.run.world_size == 1 and not spec.reorder_epochs if is_shuffle(base) \
        else not spec.affinity  # fmt: skip
    horizon = spec.horizon
    if not fixed or spec.equal_batches:
        base = before.base if before is not None and isinstance(before.base, Decided) \
            else Decided(spec, rank, whole)  # fmt: skip
        # Pass 2 looks ahead the user's horizon, at most one epoch (the buffer's reuse across
        # an epoch's end): every epoch it looks ahead is one more pass 1 plans and keeps
        # beyond the one served (pass 1 itself plans with the user's).
        horizon = 1 if spec.horizon is None else min(spec.horizon, 1)
    batches = base.rank_batches if isinstance(base, Decided) else None
    trace = MemberTrace(base, rank, keep, roster, member, spec.run.steps_per_epoch, batches)
    buffer = dataclasses.replace(spec.buffer, tier=0) if ram else spec.buffer
    # The trainer's policy where it plans a trace (Belady, ``solar``, where it does not).
    policy = spec.policy if spec.policy in TRACE_POLICIES and not buffer.tier else "solar"
    return dataclasses.replace(spec, sampler=trace, policy=policy, pages=None, buffer=buffer,
                               horizon=horizon, equal_batches=False,
                               reorder_epochs=False)  # fmt: skip

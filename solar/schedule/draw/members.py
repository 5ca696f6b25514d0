"""A member's trace: the steps of a trainer that one member of its plan serves.

A trainer (a Loader's rank) served by preprocessing workers (solar/remote) shares its steps
with them: step ``k`` is the trainer's own or one worker's (:func:`owner`, a pure function of
the step). Each member keeps a buffer of its own over the steps it owns: the trainer reads and
keeps only its own steps' rows, a worker those of its steps. A member's buffer is planned by
the same planner as any rank's, fed :class:`MemberTrace`: the trainer's batches with every
step another member owns left empty. A step mask over a trace, so the planner's trace path
(TraceOrder, Belady per rank) plans it unchanged.

The trainer's batches are those of its run without workers, whoever decides them: its
sampler, where it splits its own batches (no affinity, no equal batches) or is Shuffle for a
trainer alone without ``reorder_epochs``; else the whole job's plan (Shuffle over several
ranks, whose planner splits each global batch with affinity to the ranks' buffers; Shuffle
whose planner picks each epoch's permutation, ``reorder_epochs``; a sampler with affinity; equal
batches), planned first, every rank, as without workers: pass 1 of
:func:`solar.schedule.plans.members.member_spec` (a level up: it plans), whose decided batches
are the trace's base here. Every batch is the same either way; only who reads and keeps its
rows differs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from solar._kept import Kept
from solar.config import RunConfig
from solar.schedule.draw.draws import EpochDraws, every_rank, rank_steps
from solar.schedule.draw.samplers import Sampler

TRAINER = -1  # the member that is the trainer itself (workers are numbered from 0)


def owner(k: int, keep: int, workers: list[int] | tuple[int, ...]) -> int | None:
    """Who transforms step ``k`` of a trainer served by ``workers`` (live, sorted): None for the
    trainer itself (``keep`` steps of every ``keep + len(workers)``), else a worker."""
    if not workers:
        return None
    p = k % (keep + len(workers))
    return None if p < keep else workers[p - keep]


Batches = Callable[[RunConfig, int], EpochDraws]  # a rank's batches of an epoch, one per step
Roster = tuple[tuple[int, tuple[int, ...]], ...]  # (first epoch, workers) by epoch, sorted


def workers_in(roster: Roster, epoch: int) -> tuple[int, ...]:
    """The workers of ``roster`` in ``epoch``: those of its last entry at or before it."""
    got: tuple[int, ...] = ()
    for first, workers in roster:
        if first > epoch:
            break
        got = workers
    return got


class MemberTrace(Sampler):
    """The steps of trainer ``rank`` that ``member`` owns (:data:`TRAINER`, or a worker's
    number) when ``keep`` and the workers of each epoch (``roster``) share them
    (:func:`owner`): ``base``'s batches of the rank there, every other batch empty. Epochs
    not in the roster yet are taken to have its last entry's workers (a later entry is a new
    trace: its members plan again). ``batches(run, epoch)``: the rank's batches of an epoch,
    one per step, where ``base`` has them so (pass 1's decided batches:
    solar/schedule/plans/members.py); else cut from ``base``'s epoch."""

    kind = "member"
    affinity = False

    def __init__(self, base: Sampler, rank: int, keep: int, roster: Roster, member: int,
                 spe: int, batches: Batches | None = None) -> None:  # fmt: skip
        self.base, self.rank, self.keep, self.batches = base, rank, keep, batches
        self.roster, self.member, self.spe = roster, member, spe
        self.horizon = base.horizon
        self._base: Kept[EpochDraws] = Kept(3)  # planner and runtime ask alike

    def owns(self, k: int) -> bool:
        """Whether global step ``k`` of the trainer is this member's."""
        w = owner(k, self.keep, workers_in(self.roster, k // self.spe))
        return (w is None) if self.member == TRAINER else w == self.member

    def base_epoch(self, run: RunConfig, epoch: int) -> EpochDraws:
        """The trainer's batches of ``epoch``, every step (one per step: (steps + 1) offsets)."""
        batches = self.batches
        if batches is None:
            return self._base.get(
                (run, epoch), lambda: rank_steps(self.base.epoch(run, epoch), run, self.rank)
            )
        # (kept here too: pass 1 keeps none before its consumer's epoch, which pass 2 planned
        # again from epoch 0 asks, as the current and as the look-ahead epoch)
        return self._base.get((run, epoch), lambda: batches(run, epoch))

    def base_batch(self, run: RunConfig, epoch: int, step: int) -> np.ndarray:
        """The trainer's batch at ``step`` of ``epoch``, whoever owns it."""
        d = self.base_epoch(run, epoch)
        return d.ids[d.offsets[step] : d.offsets[step + 1]]

    def epoch(self, run: RunConfig, epoch: int) -> EpochDraws:
        d = self.base_epoch(run, epoch)
        spe = run.steps_per_epoch
        mine = np.array([self.owns(epoch * spe + t) for t in range(spe)], np.bool_)
        sizes = np.diff(d.offsets) * mine
        offsets = np.zeros(spe + 1, np.int64)
        np.cumsum(sizes, out=offsets[1:])
        ids = d.ids[np.repeat(mine, np.diff(d.offsets))]
        return every_rank(run, {self.rank: EpochDraws(ids, offsets)})

    def max_batch(self, run: RunConfig) -> int | None:
        return self.base.max_batch(run)

    def batch_bound(self, run: RunConfig) -> int:
        return self.base.batch_bound(run)

    def identity(self) -> dict[str, Any]:
        return {"kind": self.kind, "base": self.base.identity(), "rank": self.rank,
                "keep": self.keep, "roster": [[e, list(w)] for e, w in self.roster],
                "member": self.member}  # fmt: skip

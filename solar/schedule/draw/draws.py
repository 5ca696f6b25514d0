"""A sampler's draws of an epoch (:class:`EpochDraws`) and their reshapings: one rank's batches
one per step (:func:`rank_steps`), every rank's put back in an epoch's layout
(:func:`every_rank`); :class:`RankDraws`, a rank's draws kept from the planner to the runtime
so that each batch is drawn once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from solar._kept import Kept
from solar.config import RunConfig


@dataclass(frozen=True)
class EpochDraws:
    """One epoch's draws of every rank: rank r's batch at the epoch's step t is
    ``ids[offsets[t * P + r] : offsets[t * P + r + 1]]``, in batch order; ``outputs[t * P +
    r]`` is what the sampler made of it for delivery (``BatchExtras``: e.g. a neighbour
    sampler's subgraph, whose nodes are the batch's ids), None where it made nothing."""

    ids: np.ndarray  # (draws,) int64 sample ids
    offsets: np.ndarray  # (steps * P + 1,) int64
    outputs: Sequence[Any] | None = None  # (steps * P,) per batch, or None: no outputs


class Drawer(Protocol):
    """What draws a rank's epoch (a :class:`~solar.schedule.draw.samplers.Sampler`)."""

    def rank_epoch(self, run: RunConfig, epoch: int, rank: int) -> EpochDraws: ...


class RankDraws:
    """Rank ``rank``'s draws of ``run``, one epoch at a time, each drawn once
    (``Sampler.rank_epoch``) by whichever asks first -- the planner looking ahead, or the
    runtime serving a plan made elsewhere -- and kept, with the sampler's output of each batch,
    until the runtime is past it (:meth:`forget_before`): the planner's draw is what the
    runtime serves (for a sampler with a delivery side, ``extras_of``, each of whose
    batches is then sampled once per run; any other is asked again for a batch when it is
    served, and a batch that differs from its plan's is refused). At most ``keep`` epochs are
    held (the one served, the one planned ahead and the planner's look-ahead): beyond that
    the oldest is dropped (drawn again if asked)."""

    def __init__(self, sampler: Drawer, run: RunConfig, rank: int, keep: int) -> None:
        self.sampler, self.run, self.rank = sampler, run, rank
        self._kept: Kept[EpochDraws] = Kept(keep)

    def epoch(self, epoch: int) -> EpochDraws:
        """The rank's draws of ``epoch`` (``Sampler.rank_epoch``'s layout and outputs)."""
        return self._kept.get(epoch, lambda: self.sampler.rank_epoch(self.run, epoch, self.rank))

    def own(self, epoch: int) -> EpochDraws:
        """:meth:`epoch` with one batch per step (steps + 1 offsets; no outputs)."""
        return rank_steps(self.epoch(epoch), self.run, self.rank)

    def source(self, epoch: int, rank: int) -> EpochDraws:
        """Rank ``rank``'s batches of ``epoch``, one per step, for a planner of this rank's
        host (solar/schedule/keep/hostplan.py): this rank's kept (:meth:`own`), another's drawn."""
        if rank == self.rank:
            return self.own(epoch)
        return own_draws(self.sampler, self.run, epoch, rank)

    def batch(self, k: int) -> tuple[np.ndarray, Any]:
        """Global step ``k``'s batch of the rank: its ids and the sampler's output (or None)."""
        e, t = divmod(k, self.run.steps_per_epoch)
        d = self.epoch(e)
        g = t * self.run.world_size + self.rank
        return d.ids[d.offsets[g] : d.offsets[g + 1]], \
            None if d.outputs is None else d.outputs[g]  # fmt: skip

    def forget_before(self, epoch: int) -> None:
        """The epochs before ``epoch`` are served: drop them."""
        self._kept.drop(lambda e: e < epoch)  # type: ignore[operator]


def given_draws(drawn: np.ndarray, given: np.ndarray) -> np.ndarray:
    """Which of a global batch's draws ``drawn`` (in draw order, repeats too) a rank serves,
    where the plan splits the batch (a sampler with affinity): those among ``given``, the ids
    the plan gave the rank -- its batch is ``drawn[mask]``, in draw order. The one rule, for
    a step (solar/runtime/steps.py) or an epoch at once (keys ``step * N + id`` on both
    sides: solar/schedule/plans/members.py)."""
    return np.isin(drawn, given)


def steps_of(draws: EpochDraws, run: RunConfig, t0: int, t1: int) -> EpochDraws:
    """Steps ``t0 .. t1 - 1`` of an epoch's ``draws``: every rank's batches at those steps, in
    :class:`EpochDraws`' layout ((t1 - t0) steps), views of ``draws``' ids (no outputs)."""
    w = run.world_size
    offsets = draws.offsets[t0 * w : t1 * w + 1]
    return EpochDraws(draws.ids[offsets[0] : offsets[-1]], offsets - offsets[0])


def only_rank(draws: EpochDraws, run: RunConfig, rank: int) -> EpochDraws:
    """``draws`` with every batch but rank ``rank``'s emptied (the same layout)."""
    return every_rank(run, {rank: rank_steps(draws, run, rank)})


def rank_steps(draws: EpochDraws, run: RunConfig, rank: int) -> EpochDraws:
    """Rank ``rank``'s batches of ``draws`` with one batch per step: (steps + 1) offsets."""
    g = np.arange(run.steps_per_epoch) * run.world_size + rank
    lo, hi = draws.offsets[g], draws.offsets[g + 1]
    offsets = np.zeros(lo.size + 1, np.int64)
    np.cumsum(hi - lo, out=offsets[1:])
    idx = np.repeat(lo - offsets[:-1], hi - lo) + np.arange(int(offsets[-1]))
    return EpochDraws(draws.ids[idx], offsets)


def own_draws(sampler: Drawer, run: RunConfig, epoch: int, rank: int) -> EpochDraws:
    """Rank ``rank``'s batches of ``epoch`` as ``sampler`` draws them (``Sampler.rank_epoch``),
    one per step: (steps + 1) offsets."""
    return rank_steps(sampler.rank_epoch(run, epoch, rank), run, rank)


def every_rank(run: RunConfig, steps: Mapping[int, EpochDraws],
               count: int | None = None) -> EpochDraws:  # fmt: skip
    """One epoch's draws in :class:`EpochDraws`' layout from ``steps[r]``, rank r's batches one
    per step (:func:`rank_steps`' layout); a rank not in ``steps`` has empty batches. No
    outputs. ``count``: steps of them (default: an epoch's). With one rank in ``steps``, the
    ids may be a view of its ids (drawn ids are never written in place)."""
    world, n = run.world_size, run.steps_per_epoch if count is None else count
    sizes = np.zeros((n, world), np.int64)
    for r, d in steps.items():
        sizes[:, r] = np.diff(d.offsets)
    offsets = np.zeros(sizes.size + 1, np.int64)
    np.cumsum(sizes.reshape(-1), out=offsets[1:])
    if len(steps) == 1:  # the others' batches empty: its batches, in step order, are the ids
        (d,) = steps.values()
        return EpochDraws(d.ids[: int(d.offsets[-1])].astype(np.int64, copy=False), offsets)
    ids = np.empty(int(offsets[-1]), np.int64)
    starts = offsets[:-1].reshape(n, world)
    for r, d in steps.items():  # each rank's batches moved to their places at once
        lo = d.offsets[:-1]
        ids[np.repeat(starts[:, r] - lo, np.diff(d.offsets)) + np.arange(int(d.offsets[-1]))] = \
            d.ids[: int(d.offsets[-1])]  # fmt: skip
    return EpochDraws(ids, offsets)


def one_per_step(batches: list[np.ndarray]) -> EpochDraws:
    """A rank's ``batches``, one per step, in :func:`rank_steps`' layout."""
    offsets = np.zeros(len(batches) + 1, np.int64)
    np.cumsum([b.size for b in batches], out=offsets[1:])
    ids = np.concatenate(batches) if batches else np.zeros(0, np.int64)
    return EpochDraws(ids, offsets)


def rank_draws(run: RunConfig, batches: list[np.ndarray], rank: int) -> EpochDraws:
    """An epoch's draws in :class:`EpochDraws`' layout from rank ``rank``'s ``batches`` (one
    per step), every other rank's batch empty."""
    return every_rank(run, {rank: one_per_step(batches)})

"""One rank's part of a plan, and the pure values the runtime executes: steps and buffer states.

The runtime never works out what to do from flags itself: it asks :meth:`RankPlan.step` for a
:class:`StepPlan` (what to read, gather and store at one step) and :meth:`RankPlan.refill_at`
for what the buffer must hold to start at a step. Both are pure functions of the plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from numba import njit
from numpy.typing import NDArray

from solar.errors import CorruptPlanError
from solar.schedule._common import ADMIT, HIT, RELEASE


class StepPlan(NamedTuple):  # a NamedTuple: one is made per step, cheaper than a dataclass
    """What one rank does at one global step. Rows index the step's batch (0..size-1).

    ``hit_rows`` are gathered from ``hit_slots`` as the buffer stands at the start of the step;
    ``read_rows`` are read from storage; then ``admit_rows`` (a subset of the reads) are stored
    into ``admit_slots`` in order. All arrays are int64 and 1-D.
    """

    step: int
    samples: NDArray[np.int64]  # (size,) sample ids in batch order
    read_rows: NDArray[np.int64]  # (reads,)
    hit_rows: NDArray[np.int64]  # (hits,)
    hit_slots: NDArray[np.int64]  # (hits,)
    admit_rows: NDArray[np.int64]  # (admits,)
    admit_slots: NDArray[np.int64]  # (admits,)

    @property
    def size(self) -> int:
        return int(self.samples.size)


@dataclass(frozen=True)
class RankPlan:
    """One rank's accesses in service order, cut into global steps, over ``slots`` slots.

    It may be a window of the run: steps ``first_step`` to ``first_step + num_steps - 1``,
    with the buffer holding ``initial`` (sample per slot, -1: nothing needed) as the window
    starts; ``complete`` says whether the window reaches the end of the run. Steps are always
    named by their global index.
    """

    rank: int
    sample: NDArray[np.integer]  # (A,) sample id of each access (int32, or int64 if N >= 2**31)
    slot: NDArray[np.int32]  # (A,) buffer slot, -1 for a read kept nowhere
    flags: NDArray[np.uint8]  # (A,) HIT | ADMIT | RELEASE
    step_offsets: NDArray[np.int64]  # (num_steps + 1,) local step t is [offsets[t], [t + 1])
    slots: int
    first_step: int = 0
    initial: NDArray[np.int64] | None = None  # (slots,); None: an empty buffer
    complete: bool = True

    @classmethod
    def from_parts(
        cls,
        rank: int,
        parts: list[Any],
        slots: int,
        first_step: int = 0,
        initial: NDArray[np.int64] | None = None,
        complete: bool = True,
    ) -> RankPlan:
        """Concatenate consecutive epochs' parts (``RankEpoch``) of one rank."""
        offsets = [np.zeros(1, np.int64)]
        base = 0
        for p in parts:
            offsets.append(p.step_offsets[1:] + base)
            base += int(p.step_offsets[-1])
        return cls(
            rank,
            np.concatenate([p.sample for p in parts]),
            np.concatenate([p.slot for p in parts]),
            np.concatenate([p.flags for p in parts]),
            np.concatenate(offsets),
            slots,
            first_step,
            initial,
            complete,
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
        return (self.flags & HIT) != 0

    def steps(self) -> np.ndarray:
        """Global step index of every access: shape (A,)."""
        return self.first_step + np.repeat(np.arange(self.num_steps), np.diff(self.step_offsets))

    def batch_sizes(self) -> np.ndarray:
        """Local batch size at every step of the window: shape (num_steps,)."""
        return np.diff(self.step_offsets)

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
        return StepPlan(
            step=k,
            samples=self.sample[a:b].astype(np.int64),
            read_rows=np.flatnonzero(~hit),
            hit_rows=np.flatnonzero(hit),
            hit_slots=slots[hit],
            admit_rows=np.flatnonzero(admit),
            admit_slots=slots[admit],
        )

    def contents_at(self, k: int) -> NDArray[np.int64]:
        """The sample each slot holds at the start of step ``k`` (-1: empty): shape (slots,).

        A replay, from ``initial``, of the window's admissions and releases before step ``k``.
        """
        t = self._local(k, end_ok=True)
        if self.initial is None:
            state = np.full(self.slots, -1, np.int64)
        else:
            state = self.initial.astype(np.int64, copy=True)
        end = int(self.step_offsets[t])
        bad = _replay(self.sample, self.slot, self.flags, end, state)
        if bad >= 0:
            raise CorruptPlanError(f"rank {self.rank}: access {bad} names slot {self.slot[bad]}")
        return state

    def refill_at(self, k: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """``(slots, samples)`` the buffer must hold to start at step ``k``: those a later hit
        reads before anything overwrites them (the rest of :meth:`contents_at` is dead). In an
        incomplete window, a held slot untouched till its end is kept too."""
        t = self._local(k, end_ok=True)
        needed = np.zeros(self.slots, np.bool_)
        decided = _hit_before_overwrite(self.slot, self.flags, self.step_offsets, t, needed)
        contents = self.contents_at(k)
        if not self.complete:
            needed |= ~decided & (contents >= 0)
        slots = np.flatnonzero(needed)
        samples = contents[slots]
        if np.any(samples < 0):
            raise CorruptPlanError(f"rank {self.rank}, step {k}: a later hit reads an empty slot")
        return slots, samples

    def freed(self, k: int) -> np.ndarray:
        """Slots whose content is no longer needed after step ``k``: released or overwritten."""
        t = self._local(k)
        a, b = self.step_offsets[t], self.step_offsets[t + 1]
        f, s = self.flags[a:b], self.slot[a:b]
        return np.unique(s[((f & RELEASE) != 0) | ((f & ADMIT) != 0)])


@njit(cache=True)
def _replay(sample, slot, flags, end, state):
    """Apply admissions and releases of accesses ``[0, end)``; the first bad access, or -1."""
    n = state.shape[0]
    for i in range(end):
        f = flags[i]
        if f & (ADMIT | RELEASE):
            s = slot[i]
            if s < 0 or s >= n:
                return i
            state[s] = sample[i] if f & ADMIT else -1
    return -1


@njit(cache=True)
def _hit_before_overwrite(slot, flags, step_offsets, k, needed):
    """``needed[s]``: slot s is hit at or after local step k before an admission overwrites it.
    Returns ``decided``: slots touched at all from step k on.

    Within a step, hits read the buffer as it stood at the step's start, so they count first.
    """
    n = needed.shape[0]
    decided = np.zeros(n, np.bool_)
    left = n
    for t in range(k, step_offsets.shape[0] - 1):
        a, b = step_offsets[t], step_offsets[t + 1]
        for i in range(a, b):
            s = slot[i]
            if flags[i] & HIT and 0 <= s < n and not decided[s]:
                decided[s] = True
                needed[s] = True
                left -= 1
        for i in range(a, b):
            s = slot[i]
            if flags[i] & ADMIT and 0 <= s < n and not decided[s]:
                decided[s] = True
                left -= 1
        if left == 0:
            break
    return decided

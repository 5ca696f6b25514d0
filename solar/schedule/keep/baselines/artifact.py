"""The ``solar-artifact`` baseline: what SOLAR's public artifact does.

FIFO eviction, every read admitted; rank affinity only during the first ceil(C·P/G) steps of
each epoch (the steps the previous epoch's buffers can cover), with misses dealt round-robin;
the rest of the epoch uses the interleaved split. A sample may be held by several ranks.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from solar.config import BufferConfig, RunConfig
from solar.schedule.draw.order import sample_dtype, step_bounds
from solar.schedule.keep.assign import assign_interleaved, assign_round_robin, step_caps
from solar.schedule.policy import (
    ADMIT,
    HIT,
    EpochSchedule,
    OccupantContents,
    cap_table,
    slot_count,
)


@njit(cache=True, nogil=True)
def _artifact_steps(
    seq, bounds, k0, world, cap_of, affinity_steps,
    slot_of, occupant, fifo_next,
    rank_out, slot_out, flags, counts,
):  # fmt: skip
    cap_slots = occupant.shape[1]
    count = np.zeros(world, np.int64)
    cap = np.zeros(world, np.int64)
    for k in range(bounds.shape[0] - 1):
        a, b = bounds[k], bounds[k + 1]
        count[:] = 0
        if k < affinity_steps:
            step_caps(b - a, world, cap_of, cap)
            for i in range(a, b):
                rank_out[i] = -1
                slot_out[i] = -1
                flags[i] = 0
                for r in range(world):
                    s = slot_of[r, seq[i]]
                    if s >= 0 and count[r] < cap[r]:
                        rank_out[i] = r
                        slot_out[i] = s
                        flags[i] = HIT
                        count[r] += 1
                        break
            assign_round_robin(a, b, k0 + k, world, count, cap, rank_out)
        else:
            assign_interleaved(a, b, world, count, rank_out, slot_out, flags)
            for i in range(a, b):
                s = slot_of[rank_out[i], seq[i]]
                if s >= 0:
                    flags[i] = HIT
                    slot_out[i] = s
        # Admissions after the step's hits were decided: the runtime gathers hits first.
        for i in range(a, b):
            x, r = seq[i], rank_out[i]
            if flags[i] & HIT or cap_slots == 0 or slot_of[r, x] >= 0:
                continue
            s = fifo_next[r]
            fifo_next[r] = (s + 1) % cap_slots
            old = occupant[r, s]
            if old >= 0:
                slot_of[r, old] = -1
            occupant[r, s] = x
            slot_of[r, x] = s
            flags[i] = ADMIT
            slot_out[i] = s
        counts[k, :] = count


class ArtifactPolicy(OccupantContents):
    """SOLAR's artifact: FIFO, affinity in each epoch's first steps, round-robin misses."""

    needs_next_use = False

    def __init__(self, run: RunConfig, buffer: BufferConfig) -> None:
        self.run = run
        world, c = run.world_size, slot_count(run, buffer)
        self.slot_of = np.full((world, run.num_samples), -1, np.int32)
        self.occupant = np.full((world, c), -1, sample_dtype(run.num_samples))
        self.fifo_next = np.zeros(world, np.int64)
        self.affinity_steps = math.ceil(c * world / run.global_batch)
        self.cap_of = cap_table(run, buffer)
        self.bounds = step_bounds(run)

    def plan_epoch(self, k: int, seq: np.ndarray, next_use: np.ndarray | None) -> EpochSchedule:
        out = EpochSchedule.empty(self.run)
        _artifact_steps(
            seq, self.bounds, k * self.run.steps_per_epoch, self.run.world_size, self.cap_of,
            self.affinity_steps, self.slot_of, self.occupant, self.fifo_next,
            out.rank, out.slot, out.flags, out.counts,
        )  # fmt: skip
        return out

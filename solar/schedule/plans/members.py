"""A member's plan: the buffer of the steps of a trainer that one member serves.

The trace is solar/schedule/draw/members.py's (:class:`MemberTrace`); here, the spec that
plans it (the trainer's, its sampler masked to the member's steps), where it can be planned
apart from the trainer's other members.
"""

from __future__ import annotations

import dataclasses

from solar.schedule.draw.members import MemberTrace, Roster
from solar.schedule.draw.samplers import NO_EXTRAS, extras_of, is_shuffle
from solar.schedule.policy import TRACE_POLICIES
from solar.schedule.spec import PlanSpec


def member_spec(spec: PlanSpec, rank: int, keep: int, roster: Roster,
                member: int) -> PlanSpec | None:  # fmt: skip
    """The plan of ``member``'s buffer over trainer ``rank``'s steps it owns (``spec``: the
    trainer's run; ``roster``: its workers by epoch, from epoch 0), or None where it has no
    worker, or where the trainer's batches depend on its buffer's plan (Shuffle
    over several ranks, a sampler with affinity or equal batches) or its sampler delivers
    more than rows: there every member reads its steps' rows unplanned."""
    base = spec.sampler
    fixed = spec.run.world_size == 1 and not spec.reorder_epochs if is_shuffle(base) \
        else not spec.affinity  # fmt: skip
    if (
        not fixed
        or spec.equal_batches
        or extras_of(base) is not NO_EXTRAS
        or not any(w for _, w in roster)
    ):
        return None
    trace = MemberTrace(base, rank, keep, roster, member, spec.run.steps_per_epoch)
    # The trainer's policy where it plans a trace (Belady, ``solar``, where it does not).
    policy = spec.policy if spec.policy in TRACE_POLICIES and not spec.buffer.tier else "solar"
    return dataclasses.replace(spec, sampler=trace, policy=policy, pages=None)

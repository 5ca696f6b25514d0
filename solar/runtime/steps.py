"""What step k is: the one place that answers it for the runtime.

Every stage asks :class:`Steps` about a global step ``k`` — its plan in the sampler's batch
order, the sampler's output of it, the rows of batch memory it needs, its exchange of rows, its
transform jobs — and nothing else reads the rank's plan. A sampler that draws each rank's
batches is asked once per epoch: its draws (the planner's,
:attr:`~solar.schedule.plans.stream.RankStream.drawn`) are what the steps serve. The window of
planned epochs is trimmed in one place, :meth:`Steps.enter`: when a step becomes the next one
served, the epochs before it are done with.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from solar.errors import SolarError
from solar.schedule.draw.draws import given_draws
from solar.schedule.draw.members import MemberTrace
from solar.schedule.draw.samplers import NO_EXTRAS, Sampler, extras_of
from solar.schedule.keep.transfer import Transfer
from solar.schedule.plans.members import Decided
from solar.schedule.plans.packing import EpochWindows
from solar.schedule.plans.rankplan import StepPlan, elsewhere
from solar.schedule.plans.stream import RankStream
from solar.schedule.spec import PlanSpec
from solar.transform import Rows, repeats


class Steps:
    """Rank ``rank``'s steps of ``spec``'s run, as ``stream`` plans them."""

    def __init__(self, spec: PlanSpec, rank: int, stream: RankStream) -> None:
        self.spec = spec
        self.run = spec.run
        self.rank = rank
        self.sampler: Sampler = spec.sampler
        self._stream = stream
        self.spe = spec.run.steps_per_epoch
        # A trace split by the sampler (not the planner): a rank's batch is the sampler's;
        # one with a delivery side is drawn once: the planner's draws of its epoch are served.
        # Modes decided once (each asks the sampler for its identity: not per step).
        self.traced, self.affinity = spec.traced, spec.affinity
        self.distinct = spec.sampler.distinct  # its batches without repeats: merged, not hashed
        self.own_batches = self.traced and not self.affinity
        # A member's buffer (solar/schedule/draw/members.py): the stream plans the steps this
        # member owns; the others are served by another member of the trainer's plan, their
        # rows neither read nor kept here.
        self.member: MemberTrace | None = None
        self._decided: Decided | None = None  # the trainer's batches as pass 1 decided them
        self._trace(stream.spec.sampler)
        own = self.own_batches and self.member is None
        self._drawn = stream.drawn if own else None
        self._served = self._drawn if extras_of(spec.sampler) is not NO_EXTRAS else None

    def _trace(self, member: Sampler) -> None:
        """A member's buffer's trace (else none), and the plan that decided its batches (pass
        1: solar/schedule/plans/members.py) where the sampler did not."""
        self.member = member if isinstance(member, MemberTrace) else None
        base = None if self.member is None else self.member.base
        self._decided = base if isinstance(base, Decided) else None

    def retrace(self, stream: RankStream) -> None:
        """A member's buffer planned again (its epoch's members changed: solar/remote): the
        steps from now on are ``stream``'s (the holdings refill to it)."""
        assert self.member is not None and isinstance(stream.spec.sampler, MemberTrace)
        self._stream = stream
        self._trace(stream.spec.sampler)

    def release(self) -> None:
        """This rank's steps are no longer served here: pass 1 keeps nothing more for it (it
        may be shared with other trainers' steps: a worker's)."""
        if self._decided is not None:
            self._decided.release()

    def enter(self, k: int) -> None:
        """Step ``k`` is served next: planned now if it must be (waiting for the planner),
        and the window's epochs before it dropped. The only trim of the window, and of pass
        1's epochs (a seek back lowers their mark first: what it plans again is kept)."""
        e, decided = k // self.spe, self._decided
        if decided is not None and e < decided.floor:
            decided.forget_before(e)
        self._stream.window(k, trim=True)
        if decided is not None:
            decided.forget_before(e)
        if self._drawn is not None:
            self._drawn.forget_before(k // self.spe)

    @property
    def last_planned(self) -> int:
        """The last step planned so far (reads run ahead only into planned steps: they never
        wait for the planner)."""
        return min(self.run.num_steps, self._stream.planned_end) - 1

    @property
    def planned_any(self) -> bool:
        """Whether any step is planned yet (without waiting)."""
        return self._stream.planned_end > 0

    def plan(self, k: int) -> StepPlan:
        """Step ``k``'s plan, its rows in the sampler's batch order."""
        if self.member is not None:
            return self._member_step(k)
        step = self._stream.window(k, trim=False).step(k)
        if not self.traced:
            return step  # Shuffle: the planner chose the batch, its order is the plan's
        e, t = divmod(k, self.spe)
        if self.affinity:  # the draws of the global batch the planner gave this rank
            draws = self.sampler.global_batch(self.run, e, t)
            ids = draws[given_draws(draws, step.samples)]
        else:
            ids = self._own(k)[0]
        return self._in_batch(k, step, ids)

    def _member_step(self, k: int) -> StepPlan:
        """Step ``k`` of a member's buffer: planned if the member owns it; else its batch with
        nothing read or kept here (another member serves it)."""
        assert self.member is not None
        ids = self.member.base_batch(self.run, *divmod(k, self.spe))
        if self.member.owns(k):
            return self._in_batch(k, self._stream.window(k, trim=False).step(k), ids)
        return self._in_batch(k, elsewhere(k, ids), ids)

    def owns(self, k: int) -> bool:
        """Whether this member reads and keeps step ``k``'s rows (every step, but for a
        member's buffer: :attr:`member`)."""
        return self.member is None or self.member.owns(k)

    def _in_batch(self, k: int, step: StepPlan, ids: np.ndarray) -> StepPlan:
        """``step`` as the sampler's batch ``ids`` (refused in one line if it is not)."""
        try:
            return step.in_batch(ids, self.distinct)
        except ValueError:
            why = "its input changed since it was planned"
            if self.sampler.kind == "trace":
                why = "a Trace function must return the same ids for the same arguments"
            raise SolarError(
                f"step {k}, rank {self.rank}: the {self.sampler.kind} sampler's batch is not "
                f"the one planned ({why})"
            ) from None

    def windows(self, epoch: int) -> EpochWindows | None:
        """Where the planner decided this rank reads its misses of ``epoch`` (random pages
        or packed windows), once it is planned; None without packing."""
        return self._stream.windows(epoch)

    def first_batch(self) -> np.ndarray:
        """The run's first step's ids as the sampler draws them for this rank (a sampler
        that splits its own batches: known once its first epoch is drawn, before it is
        planned)."""
        return np.asarray(self._own(0)[0], np.int64)

    def output(self, k: int) -> Any:
        """What the sampler made of step ``k``'s batch when it drew it, for delivery (e.g. a
        neighbour sampler's subgraph), or None."""
        return self._own(k)[1] if self._served is not None else None

    def _own(self, k: int) -> tuple[np.ndarray, Any]:
        """This rank's batch at step ``k`` (a sampler that splits its own batches) and the
        sampler's output of it: the planner's draws, or (a sampler without a delivery side)
        drawn again, to be checked against the plan's."""
        if self._served is not None:
            return self._served.batch(k)
        e, t = divmod(k, self.spe)
        return self.sampler.batch(self.run, e, t, self.rank), None

    def transfer(self, k: int) -> Transfer | None:
        """Step ``k``'s exchange of rows with the other ranks (equal batches), or None; a
        member's buffer: pass 1's (its plan is of the rank's batches alone)."""
        if self._decided is not None:
            return self._decided.transfer(k)
        return self._stream.window(k, trim=False).transfer(k)

    def rows(self, k: int, step: StepPlan) -> tuple[int, int]:
        """Rows of batch memory step ``k`` needs, raw and transformed: what it serves (raw:
        and its side rows, read to be stored), or its share if more."""
        tr = self.transfer(k)
        if tr is not None:
            n = max(step.size, tr.size)
            return n, n
        return step.rows_needed, step.size

    def served_rows(self) -> int:
        """Rows a served batch may have: no local batch exceeds the cap of a full nominal
        share (or a sampler's longest; batch memory grows for a longer one)."""
        rows = self.spec.buffer.cap(self.run.batch_size)
        if self.traced:
            rows = self.sampler.max_batch(self.run) or rows
        return rows

    def refill_at(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(cells, samples)`` the buffer and tier must hold to start at step ``k`` (which is
        served next: the window is trimmed to it)."""
        self.enter(k)
        return self._stream.window(k, trim=False).refill_at(k)

    def transform_job(self, k: int, step: StepPlan, rows: np.ndarray) -> Rows:
        """The transform job of ``rows`` of step ``k``: their samples and each draw's
        occurrence (the generator's input: a resumed run replays the same augmentation)."""
        e, t = divmod(k, self.spe)
        again = repeats(step.samples) if step.copy_dst.size else np.zeros(step.size, np.int64)
        if self.own_batches:
            again += self.rank << 32  # a trace's ranks may draw one sample in the same step
        return Rows(e, t, step.samples[rows], again[rows], rows)

    def global_rows(self, epoch: int) -> np.ndarray:
        """Rows of every global step of ``epoch`` over all ranks: (steps per epoch,). With a
        sampler's trace it needs every rank's batches of the epoch (drawn when asked)."""
        d = self.sampler.epoch(self.run, epoch)
        rows = np.diff(d.offsets).reshape(self.spe, self.run.world_size)
        return rows.sum(axis=1)


def planned_rows(
    spec: PlanSpec,
    rank: int,
    plan: PlanSpec,
    mine: Callable[[int], bool] | None = None,
    each: Callable[[int, Steps, StepPlan], None] | None = None,
) -> tuple[int, int, int]:
    """Rows read, hit and served over the run, by its plan, at the steps ``mine`` says (every
    one, if None) that ``plan``'s member owns: ``plan`` of trainer ``rank``, a member's buffer
    (solar/schedule/plans/members.py) or the rank's own (``spec``: the trainer's run). A
    member reads exactly its plan's misses, so the counts are what a run reads (tests and
    bench/member_reads.py count them). ``each(k, steps, step)`` is shown every step served."""
    stream = RankStream(plan, rank)
    steps, reads, hits, rows = Steps(spec, rank, stream), 0, 0, 0
    try:
        for k in range(spec.run.num_steps):
            steps.enter(k)
            step = steps.plan(k)
            if each is not None:
                each(k, steps, step)
            if (mine is None or mine(k)) and steps.owns(k):
                reads += step.read_rows.size
                hits += step.hit_rows.size
                rows += step.size
    finally:
        stream.close()
    return reads, hits, rows

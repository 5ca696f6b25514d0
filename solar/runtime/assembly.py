"""Assembly: a step's batch made from its reads and its hits.

Where a sample's bytes are copied into a batch: storage and tier reads land in the batch's
rows (solar.runtime.reads), and :meth:`Assembly.assemble` gathers the step's hits from the
buffer into the rest (:meth:`~solar.runtime.holdings.Holdings.gather`), then applies the
step's buffer updates. With a transform the stage is one of solar.runtime.transforms, chosen
at construction; this one serves rows as read.
"""

from __future__ import annotations

from solar.runtime.holdings import Holdings
from solar.runtime.memory import BatchMemory, InFlight
from solar.runtime.reads import ReadAhead
from solar.runtime.steps import Steps


class Assembly:
    """Rows as read: hits gathered, updates applied as soon as the reads are in."""

    def __init__(
        self, steps: Steps, queue: ReadAhead, memory: BatchMemory, holdings: Holdings
    ) -> None:
        self.steps = steps
        self.queue = queue
        self.memory = memory
        self.holdings = holdings

    def next_step(self) -> int:
        """The step this stage serves next (-1: none until the holdings are refilled)."""
        return self.holdings.at

    def take(self, k: int) -> InFlight:
        """Step ``k``, assembled (its transforms under way, if any)."""
        return self.assemble(k)

    def assemble(self, k: int) -> InFlight:
        """Step ``k``'s batch as read: its reads waited for, its hits gathered, then shaped."""
        self.holdings.lose()  # until the step is assembled, the buffer matches no step
        # Read ahead only into steps already planned: never wait for the planner here.
        io = self.queue.take(k, self.steps.last_planned)
        self.queue.finish(io)
        if not io.batch:  # a step of hits: memory taken now (recently freed, cache-warm)
            self.memory.provide(io, *self.steps.rows(k, io.plan))
        self.shape(k, io)
        return io

    def shape(self, k: int, io: InFlight) -> None:
        """Gather the hits and settle: the holdings then match step ``k + 1``."""
        self.holdings.gather(io.plan, io.batch)
        self.holdings.settle(k, io.plan, io.batch)

    def finish(self, k: int, io: InFlight) -> None:
        """Step ``k`` ready to deliver (nothing left to do for rows as read)."""

    def wait(self) -> None:
        """Wait for work under way for steps assembled ahead (none here)."""

    def drain(self) -> None:
        """Forget steps assembled ahead, their work waited for (none here)."""

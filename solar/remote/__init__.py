"""Preprocessing workers on other hosts: planned, as members of the plan's grouping.

A trainer (a Loader's rank) with ``Transform(fn, remote=Remote(...))`` is served by workers
started as a job of their own (``solar worker ADDRESS``, solar/worker.py), so that a
worker's death never takes the trainers' job down (mpiexec and torchrun end every rank of a job
when one dies). They meet at a TCPStore served by trainer rank 0 (solar/remote/link.py); each
(trainer, worker) pair then talks over a two-rank gloo process group of its own, whose dead
peer raises on the other side instead of ending it. (MPI's port functions were the other
engine at hand: MPICH refuses to connect two singleton processes, ``MPI_Comm_connect`` failing
with overlapping groups, and without ULFM gives no promise about a peer that dies.)

Every member runs the same pure plan: a worker knows which samples its trainers serve at each
step, and each step of a trainer is owned by the trainer or one of its workers
(:func:`~solar.schedule.draw.members.owner`, a pure function of the step). Each member keeps a
buffer of its own over the steps it owns (solar/schedule/draw/members.py: the trainer's trace
masked to them, planned by the same planner): the trainer reads and keeps only its own steps'
rows, a worker those of its steps (a buffer per trainer it serves). A worker reads and
transforms its steps ahead, within the credit its trainer gives it (``window`` steps past the
step being served), and sends each finished step; the trainer's transform stage takes it when
it arrives and, what was not delivered in time or was owned by a worker that died, reads from
storage (outside its buffer) and transforms itself (solar/runtime/remote.py). The bytes are
the same either way: a sample's generator is a function of (seed, epoch, sample, occurrence).
Where the trainer's batches depend on the whole job's plan (Shuffle over several trainers,
whose planner splits each global batch with affinity to the ranks' buffers; a sampler with
affinity; equal batches) planning is two passes, on every member alike
(solar/schedule/plans/members.py): pass 1 plans the whole job as without workers and gives
the trainer's batches (and its exchange of rows), pass 2 each member's buffer over its steps
of them. Only where a plan is given (a file), or the sampler delivers more than rows, do
members read their steps' rows unplanned.

Modules: this one the configuration; ``link`` the meeting and the pairs. The worker's loop is
solar/worker.py (it builds on solar.runtime, which builds on this package).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from solar.errors import SolarError

__all__ = ["Remote"]


@dataclass(frozen=True)
class Remote:
    """Where a Loader's trainers meet their preprocessing workers, and how they share steps.

    ``address``: ``"host:port"`` where trainer rank 0 serves the meeting's store (its host, a
    free port: workers connect to it with ``solar worker host:port``). ``workers``: how many
    the trainers wait for, at most ``join_s`` seconds (fewer joined: the trainers transform
    the rest). ``keep``: of every ``keep + n`` steps of a trainer served by ``n`` workers,
    the trainer transforms ``keep`` itself (0: all to the workers, whose late steps the trainer
    still transforms). ``window``: steps past the one being served that a worker may deliver
    (its credit). ``wait_s``: how long a trainer waits for a worker's step it needs before
    transforming it itself. ``key``: the secret shared with the workers (default:
    ``$SOLAR_REMOTE_KEY``; one of the two is required): the job they run and the rows they send
    are signed with it; give it to the workers out of band (their ``SOLAR_REMOTE_KEY``).
    """

    address: str
    workers: int = 1
    keep: int = 1
    window: int = 8
    wait_s: float = 2.0
    join_s: float = 60.0
    key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        host, sep, port = self.address.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise SolarError(f"Remote address must be 'host:port', got {self.address!r}")
        for name in ("workers", "keep", "window"):
            v = getattr(self, name)
            low = 1 if name != "keep" else 0
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise SolarError(f"Remote {name} must be an integer >= {low}, got {v!r}")
        if self.key is not None and (not isinstance(self.key, str) or not self.key):
            raise SolarError("Remote key must be a non-empty string")
        for name in ("wait_s", "join_s"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
                raise SolarError(f"Remote {name} must be a positive number, got {v!r}")

    @property
    def host_port(self) -> tuple[str, int]:
        """The store's host and port."""
        host, _, port = self.address.rpartition(":")
        return host, int(port)

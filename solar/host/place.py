"""A process's place among the ranks of its host: the one answer to "which ranks share my host".

:func:`place` returns this rank's :class:`Place`, two answers in one record: the machine it
runs on (the ranks that share its cores and memory: budgets, devices) and the grouping the host
buffer runs (the machine's, unless ``SOLAR_HOSTS=HxL`` or ``SOLAR_HOSTS=3,1`` forces one of
consecutive ranks: tests and benches emulate several hosts on one machine with it). It is one
collective of the job's ranks, memoised: under MPI, ranks share a machine where MPI says they
share memory (``Split_type(COMM_TYPE_SHARED)``); otherwise (:class:`~solar.dist.TorchComm`),
where they run on a host of the same name (one allgather of names).

:func:`host_comm` makes the host buffer's communicator, on first use only: every Loader
places its rank, few run a host buffer, and under torch.distributed the split creates one gloo
group per host (``new_subgroups_by_enumeration``: a collective of the whole job, every rank
creating every host's group in the same order).

Memoised per job: the default process group under torch.distributed (a re-init makes another,
and drops what was made for the old one), the communicator under MPI (dropped, with the
communicators made here freed, once it is freed or gone).
"""

from __future__ import annotations

import os
import socket
import weakref
from dataclasses import dataclass, field
from typing import Any

from solar.host.grouping import host_sizes

__all__ = ["Place", "forced_grouping", "host_comm", "place"]


@dataclass(frozen=True)
class Place:
    """This rank's host, both ways the job asks.

    The host buffer's grouping (``SOLAR_HOSTS`` forces it): ``groups[h]``, host h's global
    ranks in local-rank order (hosts in order of their first rank), this rank's ``host`` and
    its ``local_rank`` there. The machine, whatever ``SOLAR_HOSTS`` says: ``machine_rank`` of
    the ``machine_size`` ranks that share its cores and memory, and under MPI
    ``machine_comm``, their communicator (the job's for a job of one rank; None otherwise).
    ``split``: whether :func:`host_comm` holds a host's ranks alone (one host, an MPI
    communicator, a TorchComm), not the job's (a comm that cannot split, e.g. a test's fake).
    """

    groups: tuple[tuple[int, ...], ...]
    host: int
    local_rank: int
    machine_rank: int = 0
    machine_size: int = 1
    split: bool = True
    machine_comm: Any = field(default=None, compare=False, repr=False)

    @property
    def ranks(self) -> tuple[int, ...]:
        """The global ranks of this host, in local-rank order."""
        return self.groups[self.host]

    @property
    def local_size(self) -> int:
        """How many ranks the host buffer groups on this host."""
        return len(self.ranks)


ALONE = Place(((0,),), 0, 0)


@dataclass
class _Held:
    """A place made for the job of ``owner`` (held weakly: a dead job's is dropped), with the
    communicators made here (freed when dropped) and the host communicator once made."""

    scope: Any
    owner: Any  # () -> the owner, or None once collected
    place: Place
    machines: tuple[tuple[int, ...], ...]  # the ranks grouped by machine
    made: list = field(default_factory=list)
    host: Any = None


_held: dict[tuple[Any, int, str], _Held] = {}


def forced_grouping(world: int) -> list[int] | None:
    """The ranks of each host ``SOLAR_HOSTS`` forces (refused unless they add up to
    ``world``), or None."""
    forced = os.environ.get("SOLAR_HOSTS", "").strip()
    return host_sizes(forced, world, "SOLAR_HOSTS") if forced else None


def place(comm: Any) -> Place:
    """This rank's :class:`Place` in the job of ``comm`` (an mpi4py communicator, a
    :class:`~solar.dist.TorchComm`, or None: a process alone); a collective of ``comm`` the
    first time for a job and grouping, then memoised. It makes no host communicator
    (:func:`host_comm` does)."""
    return ALONE if comm is None else _entry(comm).place


def host_comm(comm: Any) -> Any:
    """This rank's communicator among its host's ranks in :func:`place`'s grouping (None for a
    job of one rank; ``comm`` itself for one host or a comm that cannot split), made the first
    time and memoised with the place. Making it is a collective of every rank of ``comm`` (under
    torch.distributed, every rank creates every host's gloo group, also a host of one rank):
    call it only where every rank has agreed to run a host buffer."""
    if comm is None or comm.Get_size() <= 1:
        return None
    held = _entry(comm)
    if held.host is None:
        held.host = _split(comm, held.place, held.machines)
        if held.host is not comm and held.host is not held.place.machine_comm:
            held.made.append(held.host)
    return held.host


def _entry(comm: Any) -> _Held:
    # A TorchComm names its job by its process group, resolved now (``scope`` holds one live
    # group at a time: the default group); anything else by itself.
    scope, owner = getattr(comm, "group_key", (None, comm))
    forced = forced_grouping(comm.Get_size())
    _drop_stale(scope, owner)
    key = (scope, id(owner), repr(forced))
    got = _held.get(key)
    if got is not None:
        return got
    made, machines = _make(comm, forced)
    held = _Held(scope, _ref(owner), made, machines)
    if made.machine_comm is not None and made.machine_comm is not comm:
        held.made.append(made.machine_comm)
    _held[key] = held
    return held


def _ref(owner: Any) -> Any:
    try:
        return weakref.ref(owner)
    except TypeError:  # (an object without weak references: held while its place is)
        return lambda: owner


def _drop_stale(scope: Any, owner: Any) -> None:
    """Forget the places of jobs gone: an owner collected or freed (MPI), or a scope's other
    group (a torch.distributed re-init), freeing the MPI communicators made for them."""
    for key, held in list(_held.items()):
        was = held.owner()
        if was is None or _freed(was) or (scope is not None and held.scope == scope
                                          and was is not owner):  # fmt: skip
            del _held[key]
            for c in held.made:
                if hasattr(c, "Free") and not _freed(c):
                    c.Free()


def _freed(comm: Any) -> bool:
    if not type(comm).__module__.startswith("mpi4py"):
        return False
    from mpi4py import MPI  # (imported already: comm is one of its objects)

    return bool(comm == MPI.COMM_NULL)


def _make(comm: Any, forced: list[int] | None) -> tuple[Place, tuple[tuple[int, ...], ...]]:
    """The place of ``comm``'s rank (a collective) and the ranks grouped by machine."""
    size, rank = comm.Get_size(), comm.Get_rank()
    mpi = hasattr(comm, "Split_type")
    if size <= 1:
        return Place(((rank,),), 0, 0, machine_comm=comm if mpi else None), ((rank,),)
    machine = None
    if mpi:  # the ranks that share memory, a host named by its first rank
        from mpi4py import MPI

        machine = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)  # (local ranks in order)
        physical = _by_name(comm.allgather(machine.bcast(rank, root=0)))
    else:
        physical = _by_name(comm.allgather(socket.gethostname()))
    mine = next(g for g in physical if rank in g)
    groups = physical if forced is None else _consecutive(forced)
    host = next(h for h, g in enumerate(groups) if rank in g)
    split = len(groups) == 1 or hasattr(comm, "Split") or hasattr(comm, "split_hosts")
    made = Place(tuple(tuple(g) for g in groups), host, groups[host].index(rank),
                 mine.index(rank), len(mine), split, machine)  # fmt: skip
    return made, tuple(tuple(g) for g in physical)


def _consecutive(sizes: list[int]) -> list[list[int]]:
    out, at = [], 0
    for n in sizes:
        out.append(list(range(at, at + n)))
        at += n
    return out


def _by_name(names: list[Any]) -> list[list[int]]:
    """Ranks grouped by ``names[r]``, hosts in order of their first rank."""
    seen: dict[Any, list[int]] = {}
    for r, n in enumerate(names):
        seen.setdefault(n, []).append(r)
    return list(seen.values())


def _split(comm: Any, where: Place, machines: tuple[tuple[int, ...], ...]) -> Any:
    """``comm`` split by ``where.groups`` (a collective, decided alike on every rank): the
    machines' communicator where they are the grouping (MPI), MPI's ``Split``, a TorchComm's
    gloo groups; a comm that cannot split stays the job's (:attr:`Place.split`)."""
    groups = [list(g) for g in where.groups]
    if len(groups) == 1:
        return comm
    if where.machine_comm is not None and where.groups == machines:
        return where.machine_comm
    if hasattr(comm, "Split"):
        return comm.Split(where.host, comm.Get_rank())
    if hasattr(comm, "split_hosts"):
        return comm.split_hosts(groups)
    return comm

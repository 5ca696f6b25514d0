"""A process's place among the ranks of its host: the one answer to "which ranks share my host".

:func:`place` splits the job's communicator into one communicator per host, once per process
and grouping (a collective of the job's ranks, memoised), and returns this rank's
:class:`Place`. Under MPI, ranks share a host where MPI says they share memory
(``Split_type(COMM_TYPE_SHARED)``); under torch.distributed (:class:`~solar.dist.TorchComm`),
where they run on a host of the same name, each host a gloo group of its own (every rank
creates every host's group, in the same order: ``new_subgroups_by_enumeration``).
``SOLAR_HOSTS=HxL`` or ``SOLAR_HOSTS=3,1`` forces a grouping of consecutive ranks instead
(tests emulate several hosts on one machine with it): the split follows it.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any

from solar.host.grouping import host_sizes

__all__ = ["Place", "forced_grouping", "place"]


@dataclass(frozen=True)
class Place:
    """This rank's host: its communicator (None: a process alone, or a job of one rank),
    the job's ranks grouped by host (``groups[h]``: host h's global ranks in local-rank order;
    hosts in order of their first rank), this rank's host and its local rank there."""

    comm: Any
    groups: tuple[tuple[int, ...], ...]
    host: int
    local_rank: int

    @property
    def ranks(self) -> tuple[int, ...]:
        """The global ranks of this host, in local-rank order."""
        return self.groups[self.host]

    @property
    def local_size(self) -> int:
        """How many ranks run on this host."""
        return len(self.ranks)

    @property
    def split(self) -> bool:
        """Whether :attr:`comm` holds this host's ranks alone (a communicator that cannot
        split, e.g. a test's fake, is the job's: a superset)."""
        return self.comm is None or self.comm.Get_size() == self.local_size


ALONE = Place(None, ((0,),), 0, 0)
_places: dict[tuple[Any, str], tuple[Any, Place]] = {}


def forced_grouping(world: int) -> list[int] | None:
    """The ranks of each host ``SOLAR_HOSTS`` forces (refused unless they add up to
    ``world``), or None."""
    forced = os.environ.get("SOLAR_HOSTS", "").strip()
    return host_sizes(forced, world, "SOLAR_HOSTS") if forced else None


def place(comm: Any) -> Place:
    """This rank's :class:`Place` in the job of ``comm`` (an mpi4py communicator, a
    :class:`~solar.dist.TorchComm`, or None: a process alone); a collective of ``comm`` the
    first time for a grouping, then memoised (the host communicator lives as long as the
    process: every Loader of the job uses it)."""
    if comm is None:
        return ALONE
    size, rank = comm.Get_size(), comm.Get_rank()
    forced = forced_grouping(size)
    key = (getattr(comm, "group_key", id(comm)), repr(forced))
    got = _places.get(key)
    if got is not None:
        return got[1]
    if size <= 1:
        made = Place(None, ((rank,),), 0, 0)
    elif forced is not None:
        made = _split(comm, _consecutive(forced), rank)
    elif hasattr(comm, "Split_type"):  # MPI: the ranks that share memory
        made = _shared(comm, rank)
    else:
        names = comm.allgather(socket.gethostname())
        made = _split(comm, _by_name(names), rank)
    _places[key] = (comm, made)  # (comm kept: its id names no other while memoised)
    return made


def _consecutive(sizes: list[int]) -> list[list[int]]:
    out, at = [], 0
    for n in sizes:
        out.append(list(range(at, at + n)))
        at += n
    return out


def _by_name(names: list[str]) -> list[list[int]]:
    """Ranks grouped by ``names[r]``, hosts in order of their first rank."""
    seen: dict[str, list[int]] = {}
    for r, n in enumerate(names):
        seen.setdefault(n, []).append(r)
    return list(seen.values())


def _split(comm: Any, groups: list[list[int]], rank: int) -> Place:
    """``comm`` split by ``groups`` (a collective): MPI's ``Split``, a TorchComm's gloo
    groups; a communicator that cannot split stays the job's (:attr:`Place.split`)."""
    host = next(h for h, g in enumerate(groups) if rank in g)
    if len(groups) == 1:
        sub = comm
    elif hasattr(comm, "Split"):
        sub = comm.Split(host, rank)
    elif hasattr(comm, "split_hosts"):
        sub = comm.split_hosts(groups)
    else:
        sub = comm
    local = groups[host].index(rank)
    return Place(sub, tuple(tuple(g) for g in groups), host, local)


def _shared(comm: Any, rank: int) -> Place:
    """MPI: the ranks of ``comm`` that share memory with this one (a collective), the job's
    grouping from every host's first rank."""
    from mpi4py import MPI

    sub = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)  # (local ranks in global order)
    first = sub.bcast(rank, root=0)  # a host is named by its first rank
    groups = _by_name([str(f) for f in comm.allgather(first)])
    host = next(h for h, g in enumerate(groups) if rank in g)
    return Place(sub, tuple(tuple(g) for g in groups), host, sub.Get_rank())

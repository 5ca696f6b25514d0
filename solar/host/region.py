"""One shared-memory region per host, mapped by every rank of the host: the node buffer's bytes.

Local rank 0 creates a ``memfd`` (solar/host/memfd.py: its pages reserved, so a region that does
not fit fails here with one line, not with SIGBUS mid-run; sealed against shrinking), every
local rank opens it through ``/proc`` and maps it, and local rank 0 closes its descriptor once
all have. It never has a name: nothing is ever in ``/dev/shm`` (nor bounded by its size, a
container's 64 MiB included), whatever happens to the job, ``kill -9`` at any moment included;
the memory goes with the last mapping. The construction is a collective of ``comm`` (the
host's communicator, or the job's: a superset will do).

The region's first page is the host's barrier (solar/host/barrier.py), each rank registered
in it before the construction ends.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from solar._memory import PAGE
from solar.errors import SolarError, first_error
from solar.host import barrier as hostbarrier
from solar.host import memfd as _memfd
from solar.host.barrier import HostBarrier

PREFIX = "solar-node-"  # (the memfd's label, seen in /proc/PID/maps; never a file's name)


class NodeRegion:
    """``nbytes`` of memory shared by the ranks of a host (see the module's docstring), after
    a first page that holds the host's barrier (:meth:`barrier`).

    ``comm``: the collective's ranks (None: this process alone); ``host``: this host's index
    and ``local_rank`` this rank's on it, of ``local_size``.
    """

    def __init__(self, nbytes: int, comm: Any, host: int, local_rank: int,
                 what: str = "node buffer", local_size: int = 1) -> None:  # fmt: skip
        header = -(-hostbarrier.nbytes(local_size) // PAGE) * PAGE
        self.nbytes = header + max(int(nbytes), 1)
        self.local_rank = local_rank
        fd, err, made = -1, "", (os.getpid(), -1, -1)
        if local_rank == 0:
            try:
                fd = _memfd.reserved(PREFIX + "region", self.nbytes, what)
                _memfd.seal(fd, _memfd.SIZE_SEALS)  # never shorter than mapped: no SIGBUS
                made = _memfd.ident(fd)
            except SolarError as exc:
                err = str(exc)
            except OSError as exc:
                os.close(fd)
                fd, err = -1, f"{what}: cannot seal its shared memory: {exc.strerror}"
        try:
            err, made = host_creators(comm, host, local_rank, err, made)
            if not err and local_rank != 0:
                fd, err = _memfd.open_peer(made, self.nbytes, os.O_RDWR, what)
                if not err and not _memfd.sealed(fd, _memfd.SIZE_SEALS):
                    err = f"{what}: /proc/{made[0]}/fd/{made[1]} is not sealed against shrinking"
            if not err:
                try:
                    self._map = mmap.mmap(fd, self.nbytes, mmap.MAP_SHARED)
                except (OSError, ValueError) as exc:
                    gib = self.nbytes / 2**30
                    err = f"{what}: cannot map {gib:.2f} GiB of shared memory: {exc}"
            # Every local rank has it mapped (or failed) before local rank 0 lets its descriptor
            # go, and every rank fails alike: none skips the collectives the others run.
            err = first_error(comm, err)
        finally:
            if fd >= 0:
                os.close(fd)
        self._used = 0
        if not err:
            self.header = self.carve((header // 8,), np.int64)
            hostbarrier.register(self.header, local_rank)  # before any peer can wait for it
        if comm is not None and comm.Get_size() > 1:
            comm.Barrier()  # every rank registered in its barrier before any goes on
        if err:
            raise SolarError(err)

    def barrier(self, ranks: Sequence[int], per_epoch: int = 0) -> HostBarrier:
        """This rank's barrier of the host, whose global ranks are ``ranks`` in local order
        (``per_epoch``: steps per epoch, for messages)."""
        return HostBarrier(self.header, self.local_rank, ranks, per_epoch)

    @property
    def array(self) -> np.ndarray:
        """The whole region as bytes."""
        return np.frombuffer(self._map, np.uint8)

    def carve(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """The next page-aligned array of ``shape`` and ``dtype`` in the region (every rank
        carving the same sequence gets the same views)."""
        dt = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        lo = self._used
        if lo + n > self.nbytes:
            raise SolarError(f"node region: {n} more bytes at {lo} exceed its {self.nbytes}")
        self._used = -(-(lo + n) // PAGE) * PAGE
        return np.ndarray(shape, dt, buffer=self._map, offset=lo)

    @staticmethod
    def size_of(parts: list[tuple[tuple[int, ...], Any]]) -> int:
        """Bytes :meth:`carve` needs for ``parts`` (shape, dtype), in order."""
        return layout(dict(enumerate(parts)))[1]


def layout(parts: dict[Any, tuple[tuple[int, ...], Any]]) -> tuple[dict[Any, int], int]:
    """Page-aligned byte offsets of ``parts`` (name: (shape, dtype)), in order, as
    :meth:`NodeRegion.carve` places them, and the bytes they take."""
    at, offsets = 0, {}
    for name, (shape, dt) in parts.items():
        offsets[name] = at
        n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize
        at = -(-(at + n) // PAGE) * PAGE
    return offsets, at


def host_creators(comm: Any, host: int, local: int, err: str, made: Any) -> tuple[str, Any]:
    """The first error of ``comm``'s ranks ("" if none) and what local rank 0 of ``host``
    made (a path, a memfd's ident; each local rank 0 contributes its own: ``comm`` may span
    several hosts)."""
    if comm is None or comm.Get_size() <= 1:
        return err, made
    every = comm.allgather((host, local, err, made))
    err = next((e for _, _, e, _ in every if e), "")
    mine = [p for h, q, _, p in every if h == host and q == 0]
    if not err and len(mine) != 1:  # (the grouping gives every host one local rank 0)
        err = f"host {host}: {len(mine)} local ranks 0 among the ranks of the collective"
    return err, mine[0] if mine else made

"""The node's second tier: one preallocated file of tier slots shared by the ranks of a host.

The node-shared version of :class:`~solar.cache.tier.TierFile` (the same slots, tasks, size
checks around every read and write, O_DIRECT): local rank 0 creates the file in the tier
directory under a name unique to the job and host (``posix_fallocate``: a tier that does not
fit fails here, in one line, not mid-run), every local rank opens it, and as soon as all have,
local rank 0 unlinks it: the descriptors live on, the name does not, so nothing is left on
disk whatever happens to the job later (``kill -9`` of any rank included), as with the node's
RAM region (solar/cache/shared.py). A name left by a job killed during that short window (its
creator dead) is removed by the next node tier made on the host. The construction is a
collective of ``comm`` (the host's communicator, or a superset).

Which rank writes or reads which slot at which step is the node plan's; the order between
ranks is the host's barriers' (solar/runtime/nodeholdings.py): no lock.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from solar._units import format_bytes
from solar.cache.shared import _create, _creators, _first, _unlink
from solar.cache.tier import TierFile, _sanitise, remove_stale, reopen_direct
from solar.errors import SolarError
from solar.io.executor import Executor
from solar.io.info import KeyInfo

PREFIX = "solar-nodetier-"


class NodeTierFile(TierFile):
    """``slots`` whole-sample tier slots in one file in ``directory`` shared by the ranks of
    a host (see the module's docstring): ``comm`` the collective's ranks (None: this process
    alone), ``key`` the same on every rank of the job (``solar.dist.shared_key``), ``host``
    this host's index and ``local_rank`` this rank's on it. Each rank runs its own reads and
    writes on its ``executor``; the hazards between ranks are the caller's."""

    def __init__(
        self, directory: str | os.PathLike, *, slots: int, keys: tuple[KeyInfo, ...],
        executor: Executor, comm: Any, key: int, host: int, local_rank: int,
        direct_io: bool = True, staging_slots: int = 256,
    ) -> None:  # fmt: skip
        directory = self._lay_out(directory, slots, keys, executor, staging_slots)
        machine = _sanitise(os.uname().nodename)
        fd, err, made = -1, "", ""
        if local_rank == 0:
            remove_stale(directory, machine, PREFIX)
            name = f"{PREFIX}{key & (2**64 - 1):016x}-{host}-{machine}-{os.getpid()}.bin"
            self.path = directory / name
            err = _room(directory, self.nbytes, slots, self.stride)
            if not err:
                fd, err = _create(str(self.path), self.nbytes, f"tier {directory}")
            made = str(self.path)
        # Every host's local rank 0 made its own: this host's path (``comm`` may span hosts).
        err, made = _creators(comm, host, local_rank, err, made)
        self.path = Path(made)
        if not err and local_rank != 0:
            try:
                fd = os.open(self.path, os.O_RDWR)
            except OSError as exc:
                err = f"tier {self.path}: cannot open the node's tier ({exc.strerror})"
        err = _first(comm, err)  # every local rank has it open (or failed): the name can go
        if local_rank == 0 and fd >= 0:
            _unlink(str(self.path))
        if comm is not None and comm.Get_size() > 1:
            comm.Barrier()  # unlinked before any rank goes on: none can see the name after
        if err:
            if fd >= 0:
                os.close(fd)
            raise SolarError(err)
        try:
            fd, direct = reopen_direct(fd, self.path, direct_io)
        except BaseException:
            os.close(fd)
            raise
        self._adopt(fd, direct)


def _room(directory: Path, nbytes: int, slots: int, stride: int) -> str:
    """Why ``nbytes`` do not fit in ``directory`` now ("" if they do), in one line."""
    vfs = os.statvfs(directory)
    free = vfs.f_bavail * vfs.f_frsize
    if nbytes <= free:
        return ""
    return (f"tier {directory}: the node's tier needs {format_bytes(nbytes)} for {slots} slots "
            f"of {format_bytes(stride)}, {format_bytes(free)} free (a smaller tier_size, or "
            "another directory)")  # fmt: skip

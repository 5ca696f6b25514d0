"""The node's second tier: one preallocated file of tier slots shared by the ranks of a host.

The node-shared version of :class:`~solar.cache.tier.TierFile` (the same slots, tasks, size
checks around every read and write, O_DIRECT): local rank 0 creates the file in the tier
directory without a name, as a rank's tier is (``O_TMPFILE``; where the file system lacks it,
created and unlinked at once), reserves its bytes (``posix_fallocate``: a tier that does not
fit fails here, in one line, not mid-run), and every local rank opens it through
``/proc/PID/fd`` (solar/host/memfd.py, as the node's RAM region): nothing is left on disk
whatever happens to the job (``kill -9`` of any rank at any moment included), but where the
file system lacks ``O_TMPFILE``, a crash in the instant between the creation and the
unlinking; such names, and earlier versions', are removed when a node tier is made. The
construction is a collective of ``comm`` (the host's communicator, or a superset).

Which rank writes or reads which slot at which step is the node plan's; the order between
ranks is the host's barriers' (solar/runtime/holdings.py): no lock.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from solar.cache.tier import TierFile, remove_stale, reopen_direct, reserved_file, room, sanitise
from solar.errors import SolarError, first_error
from solar.host import memfd as _memfd
from solar.host.region import host_creators
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
        machine = sanitise(os.uname().nodename)
        fd, err, made = -1, "", ("", (os.getpid(), -1, -1))
        if local_rank == 0:
            name = f"{PREFIX}{key & (2**64 - 1):016x}-{host}-{machine}-{os.getpid()}.bin"
            self.path = directory / name  # (names it in messages only)
            try:  # (any failure here is said in the collective below, never skips it)
                remove_stale(directory, machine, PREFIX)
                err = room(directory, self.nbytes, slots, self.stride, "the node's tier ")
                if not err:
                    fd = reserved_file(self.path, self.nbytes)
            except SolarError as exc:
                err = str(exc)
            except OSError as exc:
                err = f"tier {directory}: {exc.strerror}"
            made = (str(self.path), _memfd.ident(fd) if fd >= 0 else made[1])
        # Every host's local rank 0 made its own: this host's (``comm`` may span hosts).
        err, made = host_creators(comm, host, local_rank, err, made)
        self.path = Path(made[0])
        if not err and local_rank != 0:
            fd, err = _memfd.open_peer(made[1], self.nbytes, os.O_RDWR, f"tier {self.path}")
        # Every local rank has it open (or failed) before local rank 0 may let it go.
        err = first_error(comm, err)
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

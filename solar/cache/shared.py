"""One shared-memory region per host, mapped by every rank of the host: the node buffer's bytes.

Local rank 0 creates a file in ``/dev/shm`` (``posix_fallocate``: a region that does not fit
fails here with one line, not with SIGBUS mid-run), every local rank maps it, and as soon as
all have, local rank 0 unlinks it: the mappings live on, the name does not, so nothing is left
in ``/dev/shm`` whatever happens to the job later (``kill -9`` included). The construction is a
collective of ``comm`` (the host's communicator, or the job's: a superset will do).

Between the creation and the unlinking the name exists: a job killed then leaves it. The name
carries its creator's pid namespace, pid and start time, and every construction first removes
the names whose creator is dead (a live job's, whose creator runs, are never touched); an
error on the creator's side in between unlinks at once (also at an abort of the job).

The region's first page is the host's barrier (solar/cache/hostbarrier.py), each rank registered
in it before the construction ends.
"""

from __future__ import annotations

import mmap
import os
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from solar._memory import PAGE, memory_room
from solar._process import alive, at_abort, start_time
from solar.cache import hostbarrier
from solar.cache.hostbarrier import HostBarrier
from solar.errors import SolarError

SHM_DIR = "/dev/shm"
PREFIX = "solar-node-"
# solar-node-KEY-HOST-PIDNS-PID-START: the job's key and host, the creator's identity
_NAME = re.compile(re.escape(PREFIX) + r"[0-9a-f]{16}-\d+-(\d+)-(\d+)-(\d+)")


def shm_free(directory: str = SHM_DIR) -> int | None:
    """Bytes free in ``directory`` (None where unknown)."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def fits(nbytes: int, what: str, directory: str = SHM_DIR) -> str:
    """Why ``nbytes`` of shared memory do not fit now ("" if they do): /dev/shm's free space
    and the memory available, one line naming ``what``."""
    gib = nbytes / 2**30
    free = shm_free(directory)
    if free is not None and nbytes > free:
        return (f"{what}: {gib:.2f} GiB of shared memory exceed the {free / 2**30:.2f} GiB free "
                f"in {directory} (a smaller buffer, or a larger {directory})")  # fmt: skip
    room = memory_room()  # the host's MemAvailable or the cgroup's room (shm is charged there)
    if room is not None and nbytes > room[0]:
        return f"{what}: {gib:.2f} GiB exceed the {room[0] / 2**30:.2f} GiB of memory {room[1]}"
    return ""


class NodeRegion:
    """``nbytes`` of memory shared by the ranks of a host (see the module's docstring), after
    a first page that holds the host's barrier (:meth:`barrier`).

    ``comm``: the collective's ranks (None: this process alone); ``host``: this host's index
    and ``local_rank`` this rank's on it, of ``local_size``; ``key``: the same on every rank of
    the job (``solar.dist.shared_key``), naming the file apart from any other job's.
    """

    def __init__(self, nbytes: int, comm: Any, key: int, host: int, local_rank: int,
                 what: str = "node buffer", directory: str = SHM_DIR,
                 local_size: int = 1) -> None:  # fmt: skip
        header = -(-hostbarrier.nbytes(local_size) // PAGE) * PAGE
        self.nbytes = header + max(int(nbytes), 1)
        self.local_rank = local_rank
        fd, err, path, forget = -1, "", "", None
        if local_rank == 0:
            sweep(directory)
            err = fits(self.nbytes, what, directory)
            if not err:
                path = os.path.join(directory, _name(key, host))
                fd, err = _create(path, self.nbytes, what)
            if fd >= 0:  # an abort before the unlinking below leaves no name
                forget = at_abort(lambda: _unlink(path))
        try:
            err, path = _creators(comm, host, local_rank, err, path)
            if not err and local_rank != 0:
                try:
                    fd = os.open(path, os.O_RDWR)
                except OSError as exc:
                    err = f"{what}: cannot open {path}: {exc.strerror}"
            err = _first(comm, err)  # every local rank has it open (or failed): the name can go
        finally:
            if forget is not None:
                _unlink(path)
                forget()
        try:
            if not err:
                self._map = mmap.mmap(fd, self.nbytes, mmap.MAP_SHARED)
        finally:
            if fd >= 0:
                os.close(fd)
        self.path = path  # (unlinked: for messages)
        self._used = 0
        if not err:
            self.header = self.carve((header // 8,), np.int64)
            hostbarrier.register(self.header, local_rank)  # before any peer can wait for it
        if comm is not None and comm.Get_size() > 1:
            comm.Barrier()  # unlinked and registered before any rank goes on
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
        total = 0
        for shape, dt in parts:
            total = -(-(total + int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize)
                      // PAGE) * PAGE  # fmt: skip
        return total


def sweep(directory: str = SHM_DIR) -> list[str]:
    """Remove the regions in ``directory`` whose creator is dead (a job killed while making
    its region); the names removed. A name of another pid namespace, or of an older format,
    is never touched (its creator cannot be seen from here)."""
    ns = _pid_namespace()
    gone: list[str] = []
    if ns < 0:
        return gone
    try:
        names = os.listdir(directory)
    except OSError:
        return gone
    for name in names:
        m = _NAME.fullmatch(name)
        if m and int(m.group(1)) == ns and not alive(int(m.group(2)), int(m.group(3))):
            _unlink(os.path.join(directory, name))
            gone.append(name)
    return gone


def _name(key: int, host: int) -> str:
    pid = os.getpid()
    return f"{PREFIX}{key & (2**64 - 1):016x}-{host}-{_pid_namespace()}-{pid}-{start_time(pid)}"


def _pid_namespace() -> int:
    """This process's pid namespace (its inode; -1: unknown): pids name processes within it."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return -1


def _creators(comm: Any, host: int, local: int, err: str, path: str) -> tuple[str, str]:
    """The first error of ``comm``'s ranks ("" if none) and the path local rank 0 of ``host``
    created (each local rank 0 contributes its path: ``comm`` may span several hosts)."""
    if comm is None or comm.Get_size() <= 1:
        return err, path
    every = comm.allgather((host, local, err, path))
    err = next((e for _, _, e, _ in every if e), "")
    return err, next((p for h, q, _, p in every if h == host and q == 0), "")


def _create(path: str, nbytes: int, what: str) -> tuple[int, str]:
    """A new file ``path`` of ``nbytes`` reserved bytes (a node region, a node's tier): its
    descriptor, or a line naming ``what``."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    except OSError as exc:
        return -1, f"{what}: cannot create {path}: {exc.strerror}"
    try:
        os.posix_fallocate(fd, 0, nbytes)  # reserved now: no SIGBUS / ENOSPC mid-run
    except OSError as exc:
        os.close(fd)
        _unlink(path)
        return -1, f"{what}: cannot reserve {nbytes / 2**30:.2f} GiB in {path}: {exc.strerror}"
    return fd, ""


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _first(comm: Any, err: str) -> str:
    """The first rank's error of ``comm`` ("" if none): every rank then fails alike."""
    if comm is None or comm.Get_size() <= 1:
        return err
    return next((e for e in comm.allgather(err) if e), "")

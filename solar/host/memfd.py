"""Memory the processes of a host share without a name: a ``memfd`` that one process creates
and the others open through ``/proc/PID/fd/FD`` while it holds it, checking the inode that
proves it is still that file. Nothing is ever put in ``/dev/shm`` (nor bounded by its size):
whatever happens to the job, ``kill -9`` included, the memory goes with the last descriptor
or mapping. Seals fix what no process may change afterwards: its size (a mapping past a
shrunk end faults with SIGBUS), or its bytes too.
"""

from __future__ import annotations

import fcntl
import os

import numpy as np

from solar._memory import memory_room
from solar.errors import SolarError

# Never shorter or longer than mapped; F_SEAL_SEAL: no later seal either.
SIZE_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
FROZEN = fcntl.F_SEAL_WRITE | SIZE_SEALS  # and no byte written anymore

Ident = tuple[int, int, int]  # (pid, fd, inode): how the other processes find it


def create(label: str, nbytes: int, reserve: bool = False) -> int:
    """A new memfd of ``nbytes`` (its descriptor, close-on-exec, sealable); ``reserve``: its
    pages allocated now, so that memory running out fails here, not with SIGBUS mid-run.
    Raises OSError."""
    fd = os.memfd_create(label, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, nbytes)
        if reserve and nbytes:
            os.posix_fallocate(fd, 0, nbytes)
    except BaseException:
        os.close(fd)
        raise
    return fd


def fits(nbytes: int, what: str) -> str:
    """Why ``nbytes`` of shared memory do not fit now ("" if they do): the memory available
    (a memfd's pages are charged there, not to /dev/shm), one line naming ``what``."""
    room = memory_room()  # the host's MemAvailable or the cgroup's room
    if room is not None and nbytes > room[0]:
        gib = nbytes / 2**30
        return f"{what}: {gib:.2f} GiB exceed the {room[0] / 2**30:.2f} GiB of memory {room[1]}"
    return ""


def reserved(label: str, nbytes: int, what: str) -> int:
    """:func:`create` with its pages reserved, refused first if it does not :func:`fit
    <fits>`; raises SolarError in one line naming ``what``."""
    err = fits(nbytes, what)
    if err:
        raise SolarError(err)
    try:
        return create(label, nbytes, reserve=True)
    except OSError as exc:
        raise SolarError(f"{what}: cannot reserve {nbytes / 2**30:.2f} GiB of shared memory: "
                         f"{exc.strerror}") from None  # fmt: skip


def seal(fd: int, seals: int) -> None:
    """Add ``seals`` (:data:`SIZE_SEALS`, :data:`FROZEN`) to the memfd ``fd``."""
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)


def sealed(fd: int, seals: int) -> bool:
    """Whether ``fd`` carries every one of ``seals``."""
    return fcntl.fcntl(fd, fcntl.F_GET_SEALS) & seals == seals


def ident(fd: int) -> Ident:
    """How another process of the host opens ``fd`` (:func:`open_peer`)."""
    return os.getpid(), fd, os.fstat(fd).st_ino


def open_peer(of: Ident, size: int, mode: int, what: str) -> tuple[int, str]:
    """A descriptor of the memfd ``of`` another process holds, at least ``size`` bytes long,
    or (-1, a line naming ``what`` and why)."""
    pid, fd, ino = of
    path = f"/proc/{pid}/fd/{fd}"
    try:
        got = os.open(path, mode)
    except OSError as exc:
        return -1, f"{what}: cannot open {path}: {exc.strerror}"
    st = os.fstat(got)
    if st.st_ino != ino or st.st_size < size:
        os.close(got)
        return -1, f"{what}: {path} is no longer the file its creator shared"
    return got, ""


def frozen(label: str, nbytes: int, pieces: list[tuple[int, np.ndarray]]) -> int:
    """A new memfd of ``nbytes`` holding each ``(offset, array)`` of ``pieces``, sealed
    :data:`FROZEN` (checked once, then used in place: no process can rewrite, shrink or grow
    it); its descriptor."""
    fd = create(label, nbytes)
    try:
        for at, a in pieces:
            # The kernel copies: no page faults of a fresh mapping.
            view = np.ascontiguousarray(a).data.cast("B")
            done = 0
            while done < view.nbytes:
                done += os.pwrite(fd, view[done:], at + done)
        seal(fd, FROZEN)
    except BaseException:
        os.close(fd)
        raise
    return fd

"""Making storage cold: drop files' pages from the page cache; and whether a file's reads
can be tried against the page cache alone."""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from solar.io.libc import CLIB, NOWAIT, O_READ, PREADV2


def evict(paths: Sequence[str | os.PathLike] | str | os.PathLike, offset: int = 0,
          length: int = 0) -> None:  # fmt: skip
    """Drop each file's pages (:func:`drop`; ``length`` bytes from ``offset``, 0: to the end):
    their next reads come from storage."""
    for path in [paths] if isinstance(paths, str | os.PathLike) else paths:
        fd = os.open(Path(path), os.O_RDONLY)
        try:
            drop(fd, offset, length)
        finally:
            os.close(fd)


def cold_rounds(names: list[str], epochs: int, comm: Any,
                make_cold: Callable[[], None]) -> Iterator[tuple[int, str]]:  # fmt: skip
    """(epoch, name) of every loader's epochs, as the benches run them: in an order rotated
    each epoch (no loader always follows the same one), each begun cold (``make_cold()`` on
    rank 0 of ``comm``, then a barrier)."""
    for epoch in range(epochs):
        k = epoch % len(names)
        for name in names[k:] + names[:k]:
            if comm.Get_rank() == 0:
                make_cold()
            comm.Barrier()
            yield epoch, name


def drop(fd: int, offset: int = 0, length: int = 0) -> None:
    """posix_fadvise(DONTNEED) over ``length`` bytes from ``offset`` (0: to the end) of an open
    file. Synced first: DONTNEED drops only clean pages, and freshly written ones are dirty."""
    os.fdatasync(fd)
    os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)


def takes_tries(path: str | os.PathLike) -> bool:
    """Whether reads of ``path``'s file can be tried against the page cache alone
    (``preadv2`` with ``RWF_NOWAIT``: a miss fails at once, its fetch started), by a one-byte
    try: not where the kernel or file system refuses it (tmpfs, some network file systems),
    nor where the file does not open (its reads name that). Through libc's ``syscall``, as
    the reading kernel calls it, not ``os.preadv``: a probe, not a read of the data."""
    if PREADV2 < 0:
        return False
    try:
        fd = os.open(path, O_READ)
    except OSError:
        return False
    try:
        byte = ctypes.create_string_buffer(1)
        iov = (ctypes.c_void_p * 2)(ctypes.addressof(byte), 1)
        args = (PREADV2, fd, ctypes.addressof(iov), 1, 0, 0, NOWAIT)
        got = CLIB.syscall(*(ctypes.c_long(a) for a in args))
        return got >= 0 or ctypes.get_errno() == errno.EAGAIN
    finally:
        os.close(fd)

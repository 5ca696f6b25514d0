"""Making storage cold: drop files' pages from the page cache."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any


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

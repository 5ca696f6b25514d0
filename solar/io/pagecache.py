"""Making storage cold: drop files' pages from the page cache."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path


def evict(paths: Sequence[str | os.PathLike] | str | os.PathLike) -> None:
    """Drop each file's pages (:func:`drop`): its next reads come from storage."""
    for path in [paths] if isinstance(paths, str | os.PathLike) else paths:
        fd = os.open(Path(path), os.O_RDONLY)
        try:
            drop(fd)
        finally:
            os.close(fd)


def drop(fd: int, offset: int = 0, length: int = 0) -> None:
    """posix_fadvise(DONTNEED) over ``length`` bytes from ``offset`` (0: to the end) of an open
    file. Synced first: DONTNEED drops only clean pages, and freshly written ones are dirty."""
    os.fdatasync(fd)
    os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)

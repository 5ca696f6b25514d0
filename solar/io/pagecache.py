"""Making storage cold: drop files' pages from the page cache."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path


def evict(paths: Sequence[str | os.PathLike] | str | os.PathLike) -> None:
    """posix_fadvise(DONTNEED) over each file: its next reads come from storage.

    fsync first: DONTNEED drops only clean pages, and a freshly written file has dirty ones.
    """
    for path in [paths] if isinstance(paths, str | os.PathLike) else paths:
        fd = os.open(Path(path), os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)

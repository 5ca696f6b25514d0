"""Advice to the kernel (WILLNEED) for the chunk runs a pool job is about to read.

"Read-ahead" is the Loader's pipeline of steps; *advice* is this: telling the kernel which
byte ranges a job reads next, so that their fetches start while the job decodes what it has.
The executor builds a job's :class:`Advice` before the job starts and passes it to the tasks
that read.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence

from solar.errors import SolarError
from solar.io.tasks import ChunkReads, Task


class Advice:
    """WILLNEED advice for a job's chunk runs, kept ``WINDOW`` bytes ahead of its reads, in
    the order it reads them.

    Advice starts a fetch without waiting, so the next runs arrive while this one decodes
    (a job otherwise waits for each pread in turn). Not every run of a huge job at once: the
    kernel's elevator serves queued reads in disk order, not in the order they are needed,
    so the first pread can wait for most of what is queued (traced once: 34 ms of a 50 ms
    step). Measured on 32-sample steps (~4.5 MiB per job), 2 cores: windows of 4 MiB and
    more, and no window, perform alike; 2 MiB was slower (deeper queues read faster).
    """

    WINDOW = 8 * 2**20

    def __init__(
        self,
        fd: Callable[[int], contextlib.AbstractContextManager[int]],
        tasks: Sequence[ChunkReads],
    ) -> None:
        self._fd = fd
        self._runs = [
            (t.file, lo, hi)
            for t in tasks
            for lo, hi in zip(t.spans.lo.tolist(), t.spans.hi.tolist(), strict=True)
        ]
        self._next = 0  # first run not advised yet
        self._advised = 0  # bytes advised
        self._read = 0  # bytes the job has said it reads

    @classmethod
    def for_job(
        cls,
        fd: Callable[[int], contextlib.AbstractContextManager[int]],
        tasks: Sequence[Task],
        more_than: int = 0,
    ) -> Advice | None:
        """Advice over a job's chunk runs if it has more than ``more_than`` of them."""
        runs = [t for t in tasks if isinstance(t, ChunkReads)]
        return cls(fd, runs) if sum(t.spans.lo.size for t in runs) > more_than else None

    def advise(self, nbytes: int) -> None:
        """The job reads its next ``nbytes``: advise runs up to them plus the window."""
        self._read += nbytes
        while self._next < len(self._runs) and self._advised < self._read + self.WINDOW:
            file, lo, hi = self._runs[self._next]
            try:
                with self._fd(file) as fd:
                    os.posix_fadvise(fd, lo, hi - lo, os.POSIX_FADV_WILLNEED)
            except (OSError, SolarError):  # only advice: the reads themselves name a problem
                pass
            self._advised += hi - lo
            self._next += 1

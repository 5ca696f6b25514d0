"""The identity of every file a run reads: size, modification and status change times, device
and inode (:func:`stamp`, the one definition of it).

A file rewritten in place (``cp`` over it, ``h5py.File(path, "w")``: the same inode, a new
mtime or size) or replaced (another inode under the name) no longer holds the bytes the run
planned from; reading on would serve other bytes as the old samples. The mtime can be put back
(``os.utime``, ``cp -p``, ``rsync --inplace -t``), the ctime cannot: any write, chmod, chown or
link sets it to the kernel's clock. So the size, mtime and ctime are recorded when the dataset
is described (they are the same on every host of a shared file system), the device and inode
are pinned by each process when it first opens the file (they are a host's: a FUSE mount
numbers inodes per mount), and every later open, every use of a descriptor and each epoch's
start compare them: a change refuses the run in one line naming the file, "changed since it
was opened". solar never writes, renames, chmods or links a data file it reads, so a ctime
that moved is someone else's doing (a rename, link or chmod of the data while a run reads it is
refused too: by metadata it cannot be told from a rewrite whose mtime was put back). Where the
file system moves ctimes on its own (an HSM's archive attributes, ACL or chmod sweeps, a
backup's hard links), ``ReaderConfig(identity="mtime")`` leaves the ctime out: a rewrite with
its mtime put back then goes unseen (the strict ``"ctime"`` is the default).

:class:`Identities` is one process's table of them, by path index; its ``table`` is what the
compiled open-read-close loop checks (solar/io/executor.py) without the GIL.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence

import numpy as np

from solar.errors import SolarError

# Columns of Identities.table (-1: not known yet): what a scan records of a file, then what
# each process pins at its first open. solar/io/executor.py reads the same from statx.
SIZE, MTIME, CTIME, DEV, INO = range(5)
UNKNOWN = -1  # a column not known yet: pinned at the first open
IGNORED = -2  # a column never compared nor pinned (the ctime under identity="mtime")
# ReaderConfig.identity: what a file's identity includes beyond size, device and inode.
IDENTITIES = ("ctime", "mtime")
# The opt-out a ctime refusal names (ReaderConfig's docstring says when it fits).
CTIME_OPT_OUT = 'ReaderConfig(identity="mtime") if the file system moves ctimes itself'


def stamp(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """A file's identity from its stat, in the columns of :attr:`Identities.table`."""
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_dev, st.st_ino)


class FileChanged(SolarError):
    """A file the run reads changed since it was opened (rewritten, truncated or replaced)."""


def changed(path: str | os.PathLike, what: str) -> FileChanged:
    """The one-line error for ``path`` having changed (``what``: how)."""
    return FileChanged(f"{path}: changed since it was opened ({what})")


def _change(was: tuple[int, ...], now: tuple[int, ...]) -> str | None:
    size, mtime, ctime, dev, ino = was
    if (dev >= 0 and now[DEV] != dev) or (ino >= 0 and now[INO] != ino):
        return "another file replaced it"
    if size >= 0 and now[SIZE] != size:
        how = "truncated" if now[SIZE] < size else "grown"
        return f"{how}: {size} -> {now[SIZE]} bytes"
    if mtime >= 0 and now[MTIME] != mtime:
        return "modified in place" if ino >= 0 else "modified or replaced"
    if ctime >= 0 and now[CTIME] != ctime:
        return ("its ctime moved, its size and mtime did not: rewritten with its mtime put "
                f"back, or renamed, linked or chmod'ed; {CTIME_OPT_OUT}")  # fmt: skip
    return None


class Identities:
    """One process's identities of ``paths``: size, mtime and ctime as described (-1:
    unknown, then taken at the first open), device and inode pinned at the first open.
    ``identity="mtime"`` (:data:`IDENTITIES`): the ctime is :data:`IGNORED`."""

    def __init__(
        self,
        paths: Sequence[str | os.PathLike],
        sizes: np.ndarray | None = None,
        times: np.ndarray | None = None,
        cut: Callable[[int, int], str | None] | None = None,
        identity: str = "ctime",
    ) -> None:
        """``times``: (paths, 2) mtime and ctime ns as described. ``cut(i, size)``: what a
        truncation of path i to ``size`` bytes lost (e.g. the first sample), said in its
        error. ``identity``: ``"ctime"`` (all of :func:`stamp`) or ``"mtime"`` (the ctime
        neither pinned nor compared: ``ReaderConfig.identity``)."""
        self.paths = paths
        self.cut = cut
        n = len(paths)
        # (paths, 5) int64: SIZE, MTIME, CTIME, DEV, INO. Written by the compiled loop too (a
        # pin, the same value whoever writes it), so a plain array.
        self.table = np.full((n, 5), UNKNOWN, np.int64)
        if sizes is not None:
            self.table[:, SIZE] = np.asarray(sizes, np.int64).reshape(n)
        if times is not None:
            self.table[:, MTIME : CTIME + 1] = np.asarray(times, np.int64).reshape(n, 2)
        if identity not in IDENTITIES:
            raise SolarError(f"identity must be one of {IDENTITIES}, got {identity!r}")
        if identity == "mtime":
            self.table[:, CTIME] = IGNORED
        self._lock = threading.Lock()
        # Rows known in full, as tuples: the common check is one comparison (a descriptor is
        # checked after every use: this is on the hot path).
        self._known: list[tuple[int, ...] | None] = [None] * n

    def check(self, i: int, st: os.stat_result) -> None:
        """``st`` (of path i, just stat'ed) is its identity; pins what is not known yet."""
        now = stamp(st)
        if self._known[i] == now:
            return
        row = self.table[i]
        was = tuple(row.tolist())
        what = _change(was, now)
        if what is not None:
            lost = self.cut(i, now[0]) if self.cut and what.startswith("truncated") else None
            raise changed(self.paths[i], what if lost is None else f"{what}: {lost}")
        if UNKNOWN in was:
            with self._lock:
                for c in range(len(now)):
                    if row[c] == UNKNOWN:
                        row[c] = now[c]
        self._known[i] = now

    def check_fd(self, i: int, fd: int) -> None:
        """The descriptor ``fd`` of path i is still its file."""
        self.check(i, os.fstat(fd))

    def check_paths(self, which: Sequence[int] | None = None) -> None:
        """Every path (or ``which``) still names its file: none replaced, rewritten or gone."""
        for i in range(len(self.paths)) if which is None else which:
            try:
                st = os.stat(self.paths[i])
            except FileNotFoundError:
                raise changed(self.paths[i], "removed") from None
            except OSError as exc:
                raise SolarError(f"{self.paths[i]}: cannot stat ({exc.strerror})") from None
            self.check(i, st)

"""State that belongs to one process: the one mechanism that rebuilds it after fork or spawn.

Threads, pools, locks, descriptors and h5py handles never survive ``fork`` (the child has no
threads; a lock may be held forever; a descriptor's offset and an HDF5 handle are shared with
the parent), and they do not pickle for ``spawn``. An object keeps such state in a
:class:`ProcessLocal`: built on first use in each process, never handed to another.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

# Guards making each ProcessLocal's own build lock, briefly; made anew in a forked child, since
# a thread of the parent may have held it at the fork.
_LOCKS = threading.Lock()


def _new_lock() -> None:
    global _LOCKS
    _LOCKS = threading.Lock()


os.register_at_fork(after_in_child=_new_lock)


class ProcessLocal(Generic[T]):
    """A value built by ``build()`` on first use in each process.

    In a forked child (or an unpickled copy) :meth:`get` builds a fresh value; the parent's is
    never returned, used or closed there. Pickling keeps only ``build``.
    """

    __slots__ = ("_build", "_lock", "_lock_pid", "_pid", "_value")

    def __init__(self, build: Callable[[], T]) -> None:
        self._build = build
        self._pid = self._lock_pid = -1
        self._lock = threading.Lock()
        self._value: T | None = None

    def get(self) -> T:
        """This process's value, built now if it has none (once, whichever thread asks)."""
        pid = os.getpid()
        if self._pid != pid:
            with self._build_lock(pid):
                if self._pid != pid:
                    self._value = self._build()
                    self._pid = pid
        assert self._value is not None
        return self._value

    def _build_lock(self, pid: int) -> threading.Lock:
        """This process's lock for building (one per instance: a slow build holds up no
        other ProcessLocal)."""
        if self._lock_pid != pid:
            with _LOCKS:
                if self._lock_pid != pid:
                    self._lock = threading.Lock()
                    self._lock_pid = pid
        return self._lock

    def here(self) -> T | None:
        """This process's value if it was built here, else None (builds nothing)."""
        return self._value if self._pid == os.getpid() else None

    def drop(self) -> T | None:
        """Forget the value; returns it if it was built in this process (for the caller to
        close), None otherwise (a forked child never closes its parent's threads or files)."""
        value = self.here()
        self._pid, self._value = -1, None
        return value

    def __getstate__(self) -> dict:
        return {"build": self._build}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["build"])  # type: ignore[misc]

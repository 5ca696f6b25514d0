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

# Serialises builds (several pool threads may ask first at once); reentrant, since a build may
# use another ProcessLocal. A new one in a forked child: a thread of the parent may have held it.
_BUILD = threading.RLock()


def _new_lock() -> None:
    global _BUILD
    _BUILD = threading.RLock()


os.register_at_fork(after_in_child=_new_lock)


class ProcessLocal(Generic[T]):
    """A value built by ``build()`` on first use in each process.

    In a forked child (or an unpickled copy) :meth:`get` builds a fresh value; the parent's is
    never returned, used or closed there. Pickling keeps only ``build``.
    """

    __slots__ = ("_build", "_pid", "_value")

    def __init__(self, build: Callable[[], T]) -> None:
        self._build = build
        self._pid = -1
        self._value: T | None = None

    def get(self) -> T:
        """This process's value, built now if it has none (once, whichever thread asks)."""
        if self._pid != os.getpid():
            with _BUILD:
                if self._pid != os.getpid():
                    self._value = self._build()
                    self._pid = os.getpid()
        assert self._value is not None
        return self._value

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

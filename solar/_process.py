"""State that belongs to one process: the one mechanism that rebuilds it after fork or spawn.

Threads, pools, locks, descriptors and h5py handles never survive ``fork`` (the child has no
threads; a lock may be held forever; a descriptor's offset and an HDF5 handle are shared with
the parent), and they do not pickle for ``spawn``. An object keeps such state in a
:class:`ProcessLocal`: built on first use in each process, never handed to another.

What a process starts that could outlive it (worker processes) registers :func:`at_abort`: an
abort of the job (``solar.dist``) ends it before ``os._exit`` or ``MPI_Abort``, which run no
finaliser. :func:`nofile_error` is the one line for a process out of descriptors.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from solar.errors import SolarError

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


# -- what an abort ends ------------------------------------------------------------------------
_AT_ABORT: dict[int, Callable[[], None]] = {}
_AT_ABORT_IDS = iter(range(1 << 62))


def at_abort(fn: Callable[[], None]) -> Callable[[], None]:
    """Run ``fn`` when this process aborts the job (:func:`run_abort_hooks`, called before
    ``os._exit``, which runs no finaliser); returns the call that forgets it."""
    key = next(_AT_ABORT_IDS)
    _AT_ABORT[key] = fn
    return lambda: _AT_ABORT.pop(key, None) and None


def run_abort_hooks() -> None:
    """End what this process started that would outlive it (worker processes), now."""
    for fn in list(_AT_ABORT.values()):
        try:
            fn()
        except Exception:  # an abort goes on whatever a hook does
            pass


def nofile_error(what: str) -> SolarError:
    """The one line for EMFILE: ``what`` needs a descriptor beyond this process's limit."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return SolarError(f"{what}: too many open files: this process may open {soft} (ulimit -n "
                      f"{soft}): raise the limit, or use fewer workers or files")  # fmt: skip


# -- a wait that gives up ------------------------------------------------------------------------
def poll(done: Callable[[], bool], check: Callable[[], None], every: float = 0.05) -> None:
    """Wait until ``done()``, calling ``check()`` every ``every`` seconds (it raises to give
    up: a peer gone). Sleeps grow from 50 µs to 5 ms: a collective's completion is seen within
    5 ms without a core spun (the one polling loop of solar's non-blocking collectives)."""
    pause, due = 5e-5, time.monotonic() + every
    while not done():
        if time.monotonic() > due:
            check()
            due = time.monotonic() + every
        time.sleep(pause)
        pause = min(2 * pause, 0.005)


def wait_quietly(comm: Any) -> None:
    """A barrier of ``comm`` waited for without spinning: MPI's blocking collectives spin, and
    a process done early would take a core from those still working (ranks may outnumber
    cores); an ``Ibarrier`` :func:`poll`-ed instead. Nothing for a communicator without one
    (torch.distributed's: its collectives wait without spinning, and the next one orders)."""
    if not hasattr(comm, "Ibarrier"):
        return
    poll(comm.Ibarrier().Test, lambda: None)


# -- a process's identity ------------------------------------------------------------------------
def start_time(pid: int) -> int:
    """When process ``pid`` started (clock ticks since boot; -1: no such process). With the
    pid it names one process: a pid is reused, the pair is not."""
    stat = _stat(pid)
    return int(stat[19]) if stat is not None else -1


def alive(pid: int, start: int) -> bool:
    """Whether process ``pid`` started at ``start`` (:func:`start_time`) still runs (a zombie,
    exited but not yet reaped, does not)."""
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X") and int(stat[19]) == start


def _stat(pid: int) -> list[str] | None:
    """``/proc/PID/stat``'s fields from the state on (field 3; None: no such process)."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()  # the name in parentheses may hold anything

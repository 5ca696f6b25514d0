"""What a host's ranks exchange while they plan (their draws, their planned parts): the bytes
in sealed memfds, their names over a communicator that the planning thread alone uses.

A :class:`HostExchange` is made by the host's ranks together, in the foreground, from the
host's communicator: it makes a second one (MPI ``Dup``; under torch.distributed a second gloo
group per host, :meth:`~solar.dist.TorchComm.dup`) that only the planning thread calls, so that
the foreground's collectives and the planning thread's never meet on one communicator. A
:meth:`~HostExchange.round` is one allgather on it of a small record per local rank (the
payload's pid, descriptor, inode and size, what it is and of which epoch): every rank then
knows where every payload is and maps what it needs (:meth:`~HostExchange.open`: the inode
that proves it is still that file, its seals: no process can change it after its checks; the
caller checks its contents as untrusted input). A poster keeps its descriptors until the next
round completes: every rank mapped them by then (each maps what a round names before it enters
the next). No lock shared between processes, no polling, no marks.

The rounds are collectives, so every local rank's planning thread makes the same rounds in the
same order (the planner's epochs, in order), and a round's records must agree (kind and epoch:
a rank that does otherwise is named in one line). A planning thread blocked in a round cannot be
interrupted, so a restart or a close stops it with the host's ranks together
(:meth:`~HostExchange.stop`, in the foreground, a collective of the host's communicator every
local rank makes at a restart or a close): they agree on the number of rounds the furthest
rank's thread has begun; each rank makes the rounds its own thread has not (with a stop record:
a thread that receives one ends its epoch with :class:`Interrupted`), and its thread begins no
more; then they release their payloads. A rank failing alone does not stop: it abandons its
exchange (:meth:`~HostExchange.abandon`, no collective: its peers, alive, may never close) and
the job ends. Nothing waits forever: a peer that dies ends the job (the launcher's teardown),
and the foreground's waits check that every peer still runs.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from solar._process import alive, poll, start_time
from solar.errors import CorruptPlanError, SolarError
from solar.host import memfd as _memfd
from solar.host.barrier import TIMEOUT_S

# A record: int64 fields, one per local rank and round.
_FIELDS = 9
HOST, LOCAL, KIND, EPOCH, PID, FD, INO, NBYTES, ROUND = range(_FIELDS)
STOP = -1  # KIND of a round made by a stopping rank's foreground
FAILED = -2  # FD of a rank that could not make its payload (NBYTES: the errno)
TICK_S = 0.05  # how often a foreground wait checks its peers and its watch
_PEER = "host exchange: a local rank's payload"


class Payload(NamedTuple):
    """Bytes a rank posts (:meth:`HostExchange.post`): ``nbytes`` long, each ``(offset,
    array)`` of ``pieces`` at its offset; ``label`` names its memfd."""

    label: str
    nbytes: int
    pieces: list[tuple[int, np.ndarray]]


class Interrupted(SolarError):
    """A round ended by a stop of the host's ranks (a restart or a close): its epoch is dropped."""


def threads_unsupported(comm: Any) -> str:
    """Why ``comm`` cannot serve a planning thread's collectives beside the foreground's, or
    "": MPI must run threads concurrently (``MPI.THREAD_MULTIPLE``, mpi4py's default).
    (solar.runtime.setup's list of what a node buffer does not run holds it.)"""
    if not hasattr(comm, "Dup"):  # (not mpi4py: torch.distributed's groups are thread-safe)
        return ""
    multiple, level = _mpi_threads()
    if multiple:
        return ""
    return (f"MPI runs threads at level THREAD_{level}, but a host's ranks exchange their "
            "plans from a planning thread while the foreground runs its own collectives: "
            "initialise MPI with THREAD_MULTIPLE (mpi4py's default; mpi4py.rc.threads = True) "
            'or use share="rank"')  # fmt: skip


def _mpi_threads() -> tuple[bool, str]:
    """Whether MPI runs threads concurrently (THREAD_MULTIPLE), and its level's name."""
    from mpi4py import MPI

    level = MPI.Query_thread()
    names = {MPI.THREAD_SINGLE: "SINGLE", MPI.THREAD_FUNNELED: "FUNNELED",
             MPI.THREAD_SERIALIZED: "SERIALIZED", MPI.THREAD_MULTIPLE: "MULTIPLE"}  # fmt: skip
    return level >= MPI.THREAD_MULTIPLE, names.get(level, str(level))


def planning_comm(comm: Any) -> Any:
    """A communicator of ``comm``'s ranks for the planning thread alone (a collective of
    ``comm``; under torch.distributed, of the whole job: every rank creates every host's
    group). Refused in one line where MPI does not run threads concurrently
    (:func:`threads_unsupported`)."""
    why = threads_unsupported(comm)
    if why:
        raise SolarError(f"host buffer: {why}")
    if hasattr(comm, "Dup"):  # mpi4py
        return comm.Dup()
    if hasattr(comm, "dup"):
        return comm.dup()
    raise SolarError("host buffer: its communicator cannot make one for the planning thread "
                     "(an mpi4py communicator or solar.dist.TorchComm)")  # fmt: skip


def _gather(comm: Any, rec: np.ndarray, check: Callable[[], None] | None = None) -> np.ndarray:
    """Every rank's ``rec`` (int64, one row per rank of ``comm``); ``check``: called every
    tick until it completes (it raises to give up: a peer gone), where the communicator has a
    non-blocking collective (MPI's waits otherwise never end for a peer that is gone)."""
    size = comm.Get_size()
    if hasattr(comm, "Iallgather"):  # MPI: the records as they are, no pickling
        out = np.empty((size, rec.size), np.int64)
        req = comm.Iallgather(rec, out)
        if check is None:
            req.Wait()
            return out
        poll(req.Test, check, TICK_S)
        return out
    if hasattr(comm, "allgather_ints"):
        return comm.allgather_ints(rec, check)
    return np.array(comm.allgather(rec.tolist()), np.int64).reshape(size, rec.size)


class HostExchange:
    """The exchange of local rank ``local`` of host ``host`` (``size`` local ranks) over
    ``comm``, the host's communicator (or a communicator of several hosts: other hosts'
    records are left out). A collective of ``comm``: every rank also states ``extra`` (an int),
    every local rank's in :attr:`extras`."""

    def __init__(self, comm: Any, host: int, local: int, size: int, extra: int = 0,
                 names: dict[int, str] | None = None) -> None:  # fmt: skip
        self.comm, self.host, self.local, self.size = comm, host, local, size
        self.names = names or {}  # kinds named in messages
        self.pcomm = planning_comm(comm)
        self.pid = os.getpid()  # (its own payloads are mapped through its descriptors)
        me = np.array([host, local, os.getpid(), start_time(os.getpid()), int(extra)], np.int64)
        every = _gather(comm, me)
        mine = every[every[:, 0] == host]
        if sorted(mine[:, 1].tolist()) != list(range(size)):
            raise SolarError(f"host exchange: host {host}'s ranks are not {size} local ranks")
        mine = mine[np.argsort(mine[:, 1])]
        self.peers = [(int(p), int(s)) for p, s in mine[:, 2:4]]
        self.extras = [int(x) for x in mine[:, 4]]
        self.watch: Callable[[], None] | None = None  # the foreground's waits call it
        # A foreground wait for ranks alive that never begin a round (one that seeked alone)
        # gives up after this: the host barrier's (RankStream.watch sets its barrier's).
        self.limit_s = TIMEOUT_S
        self._waiting = (0.0, "")  # (since when, for what) the foreground waits
        self._state = threading.Lock()  # guards rounds, limit and the held descriptors
        self._turn = threading.Lock()  # one round at a time (the planner's two threads)
        self.rounds = 0  # rounds begun on the planning communicator
        self._limit: int | None = None  # no round begins past it (a stop under way)
        self._held: list[int] = []  # descriptors posted in the last round (or since a stop)
        self.closed = False
        self._abandoned = False  # closed alone, on an error path (abandon)

    # -- the planning thread --------------------------------------------------------------------
    def round(self, kind: int, epoch: int, fd: int = -1, part: int = 0,
              failed: Exception | None = None) -> list[np.ndarray | None]:  # fmt: skip
        """One round (a collective of the planning communicator): this rank posts the sealed
        memfd ``fd`` (-1: nothing; the exchange owns it from now on) as ``kind`` of ``epoch``,
        or that it ``failed`` to make it; returns every local rank's record (None where it
        posted nothing). Raises :class:`Interrupted` if the host's ranks are stopping, and
        SolarError (one line, on every rank) if one failed."""
        with self._turn:
            with self._state:
                if self.closed or (self._limit is not None and self.rounds >= self._limit):
                    _close(fd)
                    raise Interrupted(f"host exchange: {self._name(kind)} of epoch {epoch} "
                                      "interrupted")  # fmt: skip
                self.rounds += 1
                n = self.rounds
            rec = np.array([self.host, self.local, kind, epoch, -1, -1, -1, 0, n], np.int64)
            try:
                if fd >= 0:
                    st = os.fstat(fd)
                    rec[PID : NBYTES + 1] = (os.getpid(), fd, st.st_ino, st.st_size)
                elif failed is not None:
                    rec[FD], rec[NBYTES] = FAILED, getattr(failed, "errno", errno.ENOMEM) or 0
                got = self._local(_gather(self.pcomm, rec, self._planning_check))
            except BaseException:
                _close(fd)
                raise
            stopping = bool(np.any(got[:, KIND] == STOP))
            # A stop round was made by a rank's foreground, maybe while its thread still maps
            # the round before's payloads: nothing is released until the stop's last gather
            # (every thread joined).
            self._rotate([fd] if fd >= 0 else [], keep=stopping)
        if stopping:
            raise Interrupted(f"host exchange: {self._name(kind)} of epoch {epoch} interrupted")
        bad = np.flatnonzero(got[:, FD] == FAILED)
        if bad.size:
            q, code = int(bad[0]), int(got[bad[0], NBYTES])
            raise SolarError(
                f"host exchange: local rank {q} cannot post its {self._name(kind)} of epoch "
                f"{epoch}: {os.strerror(code) if code else 'its memfd failed'}"
            ) from failed
        odd = np.flatnonzero((got[:, KIND] != kind) | (got[:, EPOCH] != epoch))
        if odd.size:
            q = int(odd[0])
            raise SolarError(
                f"host exchange: local rank {self.local} exchanges {self._name(kind)} of epoch "
                f"{epoch} but local rank {q} {self._name(int(got[q, KIND]))} of epoch "
                f"{int(got[q, EPOCH])}: the ranks "
                "of a host must plan the same epochs in the same order"
            )
        return [None if r[FD] < 0 else r for r in got]

    def post(self, kind: int, epoch: int,
             payload: Payload | None = None) -> list[np.ndarray | None]:  # fmt: skip
        """:meth:`round`, posting ``payload`` (None: nothing) in a sealed memfd of its own."""
        if payload is None:
            return self.round(kind, epoch)
        try:
            fd = _memfd.frozen(*payload)
        except (OSError, MemoryError) as exc:  # (no memory or room: the peers wait in the round)
            return self.round(kind, epoch, failed=exc)
        return self.round(kind, epoch, fd)

    def _name(self, kind: int) -> str:
        return self.names.get(kind, f"kind {kind}")

    def _local(self, every: np.ndarray) -> np.ndarray:
        mine = every[every[:, HOST] == self.host]
        return mine[np.argsort(mine[:, LOCAL])]

    def _rotate(self, fds: list[int], keep: bool = False) -> None:
        """Close the descriptors of the round before (every rank mapped its payloads before
        it entered this one); hold ``fds`` until the next. ``keep``: close none (a stop's
        round: the rounds before may not all be mapped yet). Once abandoned, close all."""
        with self._state:
            if keep and not self._abandoned:
                old, self._held = [], self._held + fds
            else:
                old, self._held = self._held, fds
            if self._abandoned:
                old, self._held = old + self._held, []
        for fd in old:
            _close(fd)

    def open(self, rec: np.ndarray) -> mmap.mmap:
        """The payload ``rec`` names, mapped read-only: this rank's own, or a peer's opened
        through /proc with its inode proved and its seals checked (it cannot change after the
        caller checks it). Refused in one line otherwise."""
        pid, fd, ino, nbytes = (int(v) for v in rec[PID : NBYTES + 1])
        if pid == self.pid:
            return mmap.mmap(fd, nbytes, prot=mmap.PROT_READ)
        got, err = _memfd.open_peer((pid, fd, ino), nbytes, os.O_RDONLY, _PEER)
        if got < 0:
            raise SolarError(err)
        try:
            if not _memfd.sealed(got, _memfd.FROZEN):
                raise CorruptPlanError(f"{_PEER} (/proc/{pid}/fd/{fd}) is not sealed: another "
                                       "process could change it after it was checked")  # fmt: skip
            return mmap.mmap(got, nbytes, prot=mmap.PROT_READ)
        finally:
            os.close(got)

    # -- the foreground -------------------------------------------------------------------------
    def stop(self, join: Callable[[], None], epoch: int = -1) -> None:
        """Stop the planning thread's rounds with the host's ranks (a collective of the host's
        communicator, in the foreground): agree on the rounds the furthest thread began, make
        the ones this rank's thread has not (stop records), ``join`` the thread (its next
        round raises :class:`Interrupted`), release the payloads. Rounds may begin again
        after. ``epoch``: the epoch this rank restarts at (-1: it closes): the host's ranks
        must agree, else the first that differs is named in one line (by the watch first: the
        host barrier names both ranks and steps)."""
        with self._state:
            self._limit = self.rounds  # no round begins meanwhile
        self._waiting = (time.monotonic(), "its host's ranks to stop their planning together")
        me = np.array([self.host, self.local, self.rounds, epoch], np.int64)
        every = self._local(_gather(self.comm, me, self._check))
        odd = np.flatnonzero(every[:, 3] != epoch)
        if odd.size:  # (every rank is still in its stop: the watch sees it waiting)
            if self.watch is not None:
                self.watch()
            q, e = int(odd[0]), int(every[odd[0], 3])
            raise SolarError(
                f"host exchange: local rank {self.local} of host {self.host} "
                f"{_doing(epoch)} but local rank {q} {_doing(e)}: the ranks of a host must "
                "take the same epochs (did one seek alone with set_epoch or load_state_dict?)"
            )
        target = int(every[:, 2].max())
        with self._state:
            self._limit = target
        while self._stop_round(target):
            pass
        join()
        # Every rank's thread is joined: what they mapped is mapped; then the last payloads go.
        _gather(self.pcomm, np.array([self.host, self.local, STOP, -1, -1, -1, -1, 0, 0],
                                     np.int64), self._check)  # fmt: skip
        self._rotate([])
        with self._state:
            self._limit = None

    def _stop_round(self, target: int) -> bool:
        """Make one round this rank's thread has not, short of ``target`` (False: none left)."""
        self._acquire(self._turn)  # (the thread may be in a round: the others complete it)
        try:
            with self._state:
                if self.rounds >= target:
                    return False
                self.rounds += 1
                n = self.rounds
            rec = np.array([self.host, self.local, STOP, -1, -1, -1, -1, 0, n], np.int64)
            _gather(self.pcomm, rec, self._check)
            return True
        finally:
            self._turn.release()

    def _acquire(self, lock: threading.Lock) -> None:
        while not lock.acquire(timeout=TICK_S):
            self._check()

    def _check(self) -> None:
        """A foreground wait's tick: its watch (a rank elsewhere is named), every peer alive,
        the wait within :attr:`limit_s`."""
        if self.watch is not None:
            self.watch()
        self._alive()
        since, what = self._waiting
        if time.monotonic() - since > self.limit_s:
            others = [q for q in range(self.size) if q != self.local]
            raise SolarError(
                f"host exchange: local rank {self.local} of host {self.host} waited more than "
                f"{self.limit_s:g} s for {what}: local ranks {others} run but one never began "
                "the round (did a rank seek alone with set_epoch or load_state_dict, or hang?)"
            )

    def _planning_check(self) -> None:
        """A planning thread's wait's tick: its exchange abandoned (its round ends), every peer
        alive."""
        if self._abandoned:
            raise Interrupted("host exchange: abandoned (this rank is failing)")
        self._alive()

    def _alive(self) -> None:
        """Raise if a local rank is gone (a round would wait for it forever)."""
        for q, (pid, start) in enumerate(self.peers):
            if q != self.local and not alive(pid, start):
                raise SolarError(f"host exchange: local rank {q} of host {self.host} (pid {pid}) "
                                 "is gone")  # fmt: skip

    def wait(self, future: Any) -> Any:
        """``future``'s result (the planning thread's epoch), checking meanwhile."""
        self._waiting = (time.monotonic(), "its host's ranks' rounds of the plan it waits for")
        while True:
            try:
                return future.result(timeout=TICK_S)
            except TimeoutError:
                self._check()

    def close(self, join: Callable[[], None]) -> None:
        """Stop (:meth:`stop`) for good and free the planning communicator."""
        if self.closed:
            return
        self.stop(join)
        with self._state:
            self.closed = True
        if hasattr(self.pcomm, "Free"):
            self.pcomm.Free()

    def abandon(self) -> None:
        """Close alone, on an error path (this rank is failing; its peers, alive, may never
        close: a stop would wait for them forever): no collective. The planning thread's
        round ends within a tick (:class:`Interrupted`) and begins no more; this rank's
        payloads are released. The planning communicator is left to the job's end (a round
        of it may be pending)."""
        with self._state:
            self.closed = self._abandoned = True
        self._rotate([])


def _doing(epoch: int) -> str:
    return "closes" if epoch < 0 else f"restarts at epoch {epoch}"


def _close(fd: int) -> None:
    if fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass

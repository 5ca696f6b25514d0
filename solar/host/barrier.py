"""The barrier of a host's ranks, in their shared region: no communicator, no lock, no hang.

The node buffer's ranks meet twice per step (solar/runtime/holdings.py). The host's
communicator (solar/host/place.py) has a barrier, but it would not do: a gloo barrier costs
milliseconds, twice a step, and an MPI barrier waits forever for a rank that left the steps
early (``break``), seeked alone or died, naming no one. This barrier lives in the first bytes
of the host's shared region (solar/host/region.py) and every rank writes only its own line
of it:

* ``arrivals``: how many barriers it has entered, stored after its label ``(step, phase)``;
* the generation word: the number of the last barrier released, which its last arriver (any
  rank seeing every line at its number with its label) stores and wakes the sleepers of with
  one ``futex`` call; a waiter spins briefly (yielding the core: 4 ranks share 2 cores here),
  then sleeps in ``futex`` for a tick at a time;
* its pid and start time (a peer that is gone, or a zombie, or a reused pid, is dead) and a
  state word (it closed its loader, or gave up at a barrier);
* the step whose plan it waits for, if it does (:meth:`HostBarrier.planning`): a rank that
  waits for the plan of another step than the one its host's ranks wait at (or for) took
  another epoch or step than its host's (``set_epoch``, ``load_state_dict``), which the
  waiters on both sides name at once (:meth:`HostBarrier.check_planning`).

Between ticks a waiter checks its peers: one that is dead, gone, or gave up, one that waits at
the same barrier number with another label (it runs other steps), or no release within
``timeout_s``, each raise one line naming the ranks and steps, so that the job ends (the caller
aborts it) instead of waiting in a collective that cannot complete.

Atomic loads and stores (sequentially consistent: a rank's label and rows are visible before
its arrival) are LLVM's, through numba intrinsics; ``futex`` is a system call (as
solar/io/aio.py's). Where the platform has no known ``futex`` number, waiters poll instead.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from solar._process import alive, start_time
from solar.errors import SolarError

TIMEOUT_S = 1800.0  # torch.distributed's default collective timeout: a rank may be slow, not gone
TICK_S = 0.05  # how often a sleeping waiter checks its peers (dead, gone, elsewhere)
SPINS = 4  # checks (each yielding the core) before a waiter sleeps: bench/host_barrier.py

# The words of the area (int64): the generation word, then one 64-byte line per local rank.
LINE = 8
ARRIVALS, STEP, PHASE, PID, START, STATE, PLAN = range(7)  # PLAN: 1 + the step awaited
LIVE, CLOSED, BROKE = 1, 2, 3  # STATE: registered; its loader closed; it gave up at a barrier
# The phases of a node step and refill (solar/runtime/holdings.py), named in messages.
STAGED, STORED, REFILL, REFILLED, UPDATED = range(5)
PHASES = ("its rows staged", "its stores done", "a refill's start", "a refill's end",
          "a phase of its updates done")  # fmt: skip

_SAME = (
    "the ranks of a host must run the same steps (did one leave an epoch early with "
    "break, or seek alone with set_epoch or load_state_dict?)"
)
RELEASED, WAITING = -1, -2  # kernel results; >= 0: a peer at this barrier with another label

_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine(), -1)
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1  # not FUTEX_PRIVATE: the word is shared between processes
_i64 = types.int64


def _external(name: str, sig):  # untyped, as solar/io/libc.py's: numba's types confuse mypy
    return types.ExternalFunction(name, sig)


def _intrinsic(fn) -> Any:  # untyped: mypy reads an intrinsic's typing context as an argument
    return intrinsic(fn)


_syscall = _external("syscall", _i64(_i64, _i64, _i64, _i64, _i64, _i64, _i64))
_yield = _external("sched_yield", types.int32())


def nbytes(local_size: int) -> int:
    """Bytes of the area for ``local_size`` ranks."""
    return 8 * LINE * (1 + max(1, local_size))


def register(area: np.ndarray, local: int) -> None:
    """Record this process as local rank ``local`` of ``area`` (before any barrier: its peers
    can then tell when it is dead), its kernels loaded (the first barrier waits for no JIT)."""
    warm_up()
    line = _words(area)[LINE * (1 + local) :]
    line[PID], line[START], line[STATE] = os.getpid(), start_time(os.getpid()), LIVE


def warm_up() -> None:
    """Compile (or load from numba's cache) the barrier's kernels now."""
    w, ts = np.zeros(nbytes(1) // 8, np.int64), np.zeros(2, np.int64)
    _load_word(w, 0)
    _store_word(w, LINE + PLAN, 0)
    _arrive_and_wait(w, 0, 1, 1, 0, 0, 0, ts, -1)  # alone: released at once, no system call


class HostBarrier:
    """Local rank ``local``'s barrier over ``area`` (a region's first :func:`nbytes` bytes,
    zeroed at creation, every rank in it by :func:`register`). ``ranks``: the host's global ranks
    in local order (for messages); ``per_epoch``: steps per epoch (for messages)."""

    def __init__(self, area: np.ndarray, local: int, ranks: Sequence[int], per_epoch: int = 0,
                 timeout_s: float = TIMEOUT_S, spins: int = SPINS) -> None:  # fmt: skip
        self.words = _words(area)
        self.local, self.ranks, self.size = local, tuple(ranks), len(ranks)
        if not 0 <= local < self.size or self.words.size < nbytes(self.size) // 8:
            raise SolarError(f"host barrier: local rank {local} of {self.size} over "
                             f"{area.nbytes} bytes")  # fmt: skip
        self.per_epoch, self.timeout_s, self.spins = per_epoch, timeout_s, spins
        self._n = int(self.words[LINE * (1 + local) + ARRIVALS])  # barriers passed
        self._ts = np.zeros(2, np.int64)  # the futex's timeout (a timespec)
        tick = int(TICK_S * 1e9)
        self._ts[:] = divmod(tick, 10**9)
        self.sleep_s = 0.0 if _FUTEX >= 0 else 0.0005  # no futex: poll

    def __call__(self, k: int, phase: int) -> None:
        """Wait until every local rank waits here at step ``k``'s ``phase`` (a collective of
        the host's ranks, all at the same step and phase)."""
        if self.size == 1:
            return
        n = self._n + 1
        w, me, size = self.words, self.local, self.size
        r = _arrive_and_wait(w, me, size, n, k, phase, self.spins, self._ts, _FUTEX)
        if r != RELEASED:
            self._sleep(n, k, phase, r)
        self._n = n

    def planning(self, k: int | None) -> None:
        """This rank waits for step ``k``'s plan from now on (None: no longer)."""
        _store_word(self.words, LINE * (1 + self.local) + PLAN, 0 if k is None else k + 1)

    def check_planning(self) -> None:
        """While this rank waits for a step's plan (:meth:`planning`): raise, naming both,
        if a peer waits for another step's plan, or at a barrier of another step this rank
        has not entered (the next it enters is its step's: they run other steps)."""
        w, me = self.words, LINE * (1 + self.local)
        mine = int(_load_word(w, me + PLAN))
        if not mine:
            return
        n = int(_load_word(w, me + ARRIVALS))
        for q in range(self.size):
            line = LINE * (1 + q)
            if q == self.local:
                continue
            theirs = int(_load_word(w, line + PLAN))
            if theirs and theirs != mine:
                self._mismatch(mine - 1, q, f"for its plan of {self._at(theirs - 1)}")
            if int(_load_word(w, line + ARRIVALS)) == n + 1:
                step, phase = self._label(q)
                if step != mine - 1 and int(_load_word(w, line + ARRIVALS)) == n + 1:
                    self._mismatch(mine - 1, q, f"at {self._at(step, phase)}")

    def _mismatch(self, k: int, q: int, where: str) -> None:
        self._give_up(f"{self._who(self.local)} waits for its plan of {self._at(k)} but "
                      f"{self._who(q)} waits {where}: {_SAME}")  # fmt: skip

    def close(self) -> None:
        """This rank leaves (its loader is closed): a peer still waiting raises."""
        line = self.words[LINE * (1 + self.local) :]
        if line[STATE] == LIVE:
            line[STATE] = CLOSED

    def _sleep(self, n: int, k: int, phase: int, r: int) -> None:
        t0 = time.monotonic()
        w, me, size = self.words, self.local, self.size
        while r != RELEASED:
            if r >= 0:
                self._give_up(
                    f"{self._who(me)} waits at {self._at(k, phase)} but "
                    f"{self._who(r)} at {self._at(*self._label(r))}: {_SAME}"
                )
            self._check_peers(n, k, phase, time.monotonic() - t0)
            if self.sleep_s:
                time.sleep(self.sleep_s)
            r = _wait(w, me, size, n, k, phase, 0, self._ts, _FUTEX)

    def _check_peers(self, n: int, k: int, phase: int, waited: float) -> None:
        """Raise if a peer is gone, closed or gave up, or past the timeout (barrier ``n`` not
        released: a peer's state is read before the generation word, which a release sets
        before any rank leaves)."""
        w = self.words
        here = f"{self._who(self.local)} waits at {self._at(k, phase)}"
        missing, causes = [], []
        for q in range(self.size):
            line = w[LINE * (1 + q) :]
            if q == self.local:
                continue
            state, pid, arrived = int(line[STATE]), int(line[PID]), int(line[ARRIVALS])
            plan = int(_load_word(w, LINE * (1 + q) + PLAN))
            if plan and plan - 1 != k and arrived == n - 1:  # (its next barrier: its step's)
                self._give_up(f"{here} but {self._who(q)} waits for its plan of "
                              f"{self._at(plan - 1)}: {_SAME}")  # fmt: skip
            if state == BROKE:  # named last: the cause it gave up on is the one to tell
                causes.append("gave up at a barrier")
            elif pid and not alive(pid, int(line[START])):
                causes.append(f"is gone (pid {pid})")
            elif state == CLOSED:
                causes.append("closed its loader")
            else:
                causes.append("")
            if arrived > n:
                return
            if arrived < n:
                missing.append(q)
        if _released(w, n):
            return
        peers = [q for q in range(self.size) if q != self.local]
        for word in ("is gone", "closed", "gave up"):
            for q, why in zip(peers, causes, strict=True):
                if why.startswith(word):
                    self._give_up(f"{here}: {self._who(q)} {why}")
        if waited > self.timeout_s and missing and not _released(w, n):
            last = ", ".join(f"{self._who(q)} last at {self._at(*self._label(q))}"
                             for q in missing)  # fmt: skip
            self._give_up(f"{here}: no release within {self.timeout_s:g} s ({last})")

    def _give_up(self, why: str) -> None:
        self.words[LINE * (1 + self.local) + STATE] = BROKE
        raise SolarError(f"host barrier: {why}")

    def _label(self, q: int) -> tuple[int, int]:
        line = self.words[LINE * (1 + q) :]
        return int(line[STEP]), int(line[PHASE])

    def _who(self, q: int) -> str:
        return f"rank {self.ranks[q]}"

    def _at(self, k: int, phase: int | None = None) -> str:
        where = f"epoch {k // self.per_epoch} step {k % self.per_epoch}" if self.per_epoch \
            else f"step {k}"  # fmt: skip
        if phase is None:
            return where
        what = PHASES[phase] if 0 <= phase < len(PHASES) else f"phase {phase}"
        return f"{where} ({what})"


def _words(area: np.ndarray) -> np.ndarray:
    return area if area.dtype == np.int64 else area.view(np.int64)


def _released(w: np.ndarray, n: int) -> bool:
    return bool(_load_word(w, 0) >= n)


# -- the kernels ---------------------------------------------------------------------------------
@_intrinsic
def _load(typingctx, addr):
    """The int64 at ``addr``, loaded atomically (sequentially consistent)."""

    def codegen(context, builder, sig, args):
        ptr = builder.inttoptr(args[0], ir.IntType(64).as_pointer())
        return builder.load_atomic(ptr, "seq_cst", 8)

    return _i64(_i64), codegen


@_intrinsic
def _store(typingctx, addr, value):
    """Store int64 ``value`` at ``addr`` atomically (sequentially consistent)."""

    def codegen(context, builder, sig, args):
        ptr = builder.inttoptr(args[0], ir.IntType(64).as_pointer())
        builder.store_atomic(args[1], ptr, "seq_cst", 8)
        return context.get_dummy_value()

    return types.void(_i64, _i64), codegen


@njit(cache=True)
def _load_word(w, i):  # pragma: no cover
    return _load(w.ctypes.data + 8 * i)


@njit(cache=True)
def _store_word(w, i, value):  # pragma: no cover
    _store(w.ctypes.data + 8 * i, value)


@njit(cache=True, inline="always")
def _check(w, me, size, n, k, phase, futex):  # pragma: no cover
    """RELEASED, WAITING, or a peer waiting at barrier ``n`` with another label. The last
    arriver (every line at ``n``, one label) releases ``n``."""
    base = w.ctypes.data
    if _load(base) >= n:
        return RELEASED
    here = True
    for q in range(size):
        if q == me:
            continue
        line = base + 8 * LINE * (1 + q)
        a = _load(line + 8 * ARRIVALS)
        if a > n:  # it left barrier n: n was released
            return RELEASED
        if a < n:
            here = False
            continue
        if _load(line + 8 * STEP) != k or _load(line + 8 * PHASE) != phase:
            if _load(line + 8 * ARRIVALS) != n:  # read while it moved on: n was released
                return RELEASED
            if _load(base) >= n:  # it labelled its next barrier before arriving there
                return RELEASED
            return q
    if not here:
        return WAITING
    _store(base, n)
    if futex >= 0:
        _syscall(futex, np.int64(base), _FUTEX_WAKE, 2**31 - 1, 0, 0, 0)
    return RELEASED


@njit(cache=True, nogil=True)
def _wait(w, me, size, n, k, phase, spins, ts, futex):  # pragma: no cover
    """Wait at barrier ``n``: ``spins`` checks yielding the core, then one futex sleep of
    ``ts`` (or until woken); the check's result."""
    for _ in range(spins):
        r = _check(w, me, size, n, k, phase, futex)
        if r != WAITING:
            return r
        _yield()
    base = w.ctypes.data
    g = _load(base)  # before the check: a release after it changes the word, and the futex
    r = _check(w, me, size, n, k, phase, futex)  # then returns at once (no lost wake-up)
    if r != WAITING or futex < 0:
        return r
    _syscall(futex, np.int64(base), _FUTEX_WAIT, g & 0xFFFFFFFF, np.int64(ts.ctypes.data), 0, 0)
    return _check(w, me, size, n, k, phase, futex)


@njit(cache=True, nogil=True)
def _arrive_and_wait(w, me, size, n, k, phase, spins, ts, futex):  # pragma: no cover
    """Enter barrier ``n`` at ``(k, phase)`` (the label stored before the arrival), then
    :func:`_wait`."""
    line = w.ctypes.data + 8 * LINE * (1 + me)
    _store(line + 8 * STEP, k)
    _store(line + 8 * PHASE, phase)
    _store(line + 8 * ARRIVALS, n)
    return _wait(w, me, size, n, k, phase, spins, ts, futex)

"""The second cache tier: one preallocated file per rank on node-local storage (NVMe).

A :class:`TierFile` holds ``slots`` tier slots, each one whole sample: every key's row packed in
key order, padded so that a slot starts at a multiple of 4096 bytes (what ``O_DIRECT`` needs).
It owns the file, its staged writes and every tier-slot hazard; which sample lives in which
tier slot is the planner's business. Its reads and writes are tasks (solar/io/tasks.py) run by
the rank's one executor (solar/io/executor.py), as the dataset's reads are.

The file has no name: it is created unlinked (``O_TMPFILE``; where the file system lacks it,
created and unlinked at once), so no other process can open, truncate or overwrite it by name,
and nothing is left behind when the process dies, however it dies (SIGKILL, an MPI abort): the
kernel frees it with the last descriptor. ``TierFile.path``
(``solar-tier-{name}.{n}-{host}-{pid}.bin``, n counting the process's tiers) names it in
messages only. Its size is checked around every read and write task: a tier file truncated or
grown through ``/proc/PID/fd`` fails the tier in one line before any slot is served (a slot
past a truncation would read back as zeros once a later write re-extended the file). Named
files left by crashed runs of earlier versions on this host are removed when a tier is created.

Why an unlinked file rather than a tag per slot: a tag verified on read (a checksum of the
slot's bytes) costs a pass over every byte read from the tier (bench/tier_check_cost.py: with
the fastest hash at hand, 9-13 % of a tier read of 256 KiB-1 MiB slots at ~800 MB/s here, more
on faster NVMe; zlib.crc32 40-50 %), and would catch only an overwrite in place by a process
holding the tier's descriptor (nothing else can reach an unlinked file); a tag of sample id
and step alone misses an overwrite that keeps it, and a tag in the slot grows a page-multiple
slot by a page; an unlinked file leaves nothing to tamper with by name and costs two ``fstat``
calls per task.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import errno
import functools
import itertools
import multiprocessing.util
import os
import re
import socket
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from concurrent.futures import Future, wait
from pathlib import Path

import numpy as np

from solar._memory import PAGE, aligned
from solar._units import format_bytes
from solar.cache.slots import copy_rows
from solar.errors import SolarError
from solar.io.executor import Executor, combine, when_all
from solar.io.handles import NoDirectIO, memory_fault, open_descriptor
from solar.io.info import KeyInfo
from solar.io.tasks import SlotLayout, plan_slot_reads, plan_slot_writes

_INSTANCES = itertools.count()


def tier_stride(keys: tuple[KeyInfo, ...]) -> int:
    """Bytes per tier slot: the keys' rows back to back, rounded up to a multiple of 4096."""
    return SlotLayout(tuple(k.row_bytes for k in keys)).stride


class TierFile:
    """``slots`` whole-sample slots in a new preallocated file in ``directory``: a byte source
    of ``executor`` (the rank's, solar/io/executor.py), which runs its reads and writes as
    tasks. The file belongs to the process that created it: another (a forked child) is
    refused and makes a tier of its own.

    ``slots`` must be at least 1 (a caller with no tier creates none). ``staging_slots`` bounds
    the page-aligned memory (``staging_slots * stride`` bytes, touched as used) holding rows
    copied by :meth:`submit_write` until they are on disk.

    The tier owns every tier-slot hazard. Writes of one slot complete in submission order; a
    read starts after every write of its slots submitted before it, and a write after every
    read of its slots submitted before it. Within a run of steps, :meth:`expect_writes`
    announces the slots a step will write once it is served, and :meth:`read_step` of a later
    step holds back a read of such a slot until :meth:`done_writing` says that step's writes
    are submitted. A slot never written reads as zeros.

    A failed write leaves its slots unknown: every later call raises its error (one line).
    """

    def __init__(
        self, directory: str | os.PathLike, *, slots: int, keys: tuple[KeyInfo, ...], name: str,
        executor: Executor, direct_io: bool = True, staging_slots: int = 256,
    ) -> None:  # fmt: skip
        directory = self._lay_out(directory, slots, keys, executor, staging_slots)
        host = sanitise(socket.gethostname())
        remove_stale(directory, host)  # first: a crashed run's file may hold the space we need
        err = room(directory, self.nbytes, slots, self.stride)
        if err:
            raise SolarError(err)
        # A process may hold several tiers of one plan and rank (loaders live side by side).
        seq = next(_INSTANCES)
        self.path = directory / f"solar-tier-{sanitise(name)}.{seq}-{host}-{os.getpid()}.bin"
        self._adopt(*create_file(self.path, self.nbytes, direct_io))

    def _lay_out(self, directory: str | os.PathLike, slots: int, keys: tuple[KeyInfo, ...],
                 executor: Executor, staging_slots: int) -> Path:  # fmt: skip
        """The slots' layout and sizes (no file yet); ``directory`` checked."""
        if slots < 1 or staging_slots < 1:
            raise SolarError(f"tier: slots ({slots}) and staging_slots must be >= 1")
        self.keys, self.slots = tuple(keys), slots
        self.layout = SlotLayout(tuple(k.row_bytes for k in self.keys))
        self.stride = self.layout.stride
        self.nbytes = slots * self.stride
        self.staging_slots = staging_slots
        self.executor = executor
        self.throttle = None  # node-local: never the emulated remote file system
        # Not tried from the page cache first: a buffered tier's writes drop their pages.
        self.cache_first = False
        directory = Path(directory)
        check_directory(directory)
        return directory

    def _adopt(self, fd: int, direct_io: bool) -> None:
        """Run the tier over ``fd`` (``nbytes`` allocated, O_DIRECT or not), this process's."""
        self._pid = os.getpid()
        self._fd, self.direct_io = fd, direct_io
        self._finalizer = weakref.finalize(self, os.close, self._fd)
        # Also at the exit of a multiprocessing child, which skips atexit (and so weakref's).
        multiprocessing.util.Finalize(self, self._finalizer, exitpriority=0)
        self.bytes_written = self.bytes_read = 0  # bytes submitted
        self.write_wait_seconds = 0.0
        self._error: BaseException | None = None  # a failed write: the tier is unusable
        self._closed = False
        self._st = _State(self.slots, self.staging_slots, self.stride)

    # -- a byte source of the executor ---------------------------------------------------------
    def fd(self, i: int) -> contextlib.AbstractContextManager[int]:
        """The tier's descriptor (it has one file: ``i`` is 0), its size checked before and
        after the task's reads or writes: a truncated (or re-extended) file yields no slot."""
        return Checked(self.check_size, self._fd)

    def check_size(self) -> None:
        """Raise (one line) unless the file still has its ``nbytes``."""
        size = os.fstat(self._fd).st_size
        if size != self.nbytes:
            raise SolarError(
                f"tier {self.path}: the file is {size} bytes, not {self.nbytes}: truncated or "
                "grown by another process; its slots cannot be trusted"
            )

    def io_error(self, i: int, offset: int, exc: OSError) -> SolarError:
        if exc.errno == errno.EFAULT:  # the memory read into or written from, not the tier
            return memory_fault(f"tier {self.path}: slot {offset // self.stride}")
        return SolarError(f"tier {self.path}: slot {offset // self.stride}: {exc.strerror}")

    def short_transfer(self, i: int, offset: int, want: int, got: int, write: bool) -> SolarError:
        verb = "wrote" if write else "read"
        slot = offset // self.stride
        return SolarError(f"tier {self.path}: slot {slot}: {verb} {got} of {want} B")

    def _into_rows(self, out: list[np.ndarray]) -> bool:
        """Read straight into the destination rows: always when buffered; with O_DIRECT only
        if every row starts page-aligned in the slot and in memory."""
        if not self.direct_io:
            return True
        return all(s % PAGE == 0 for s in self.layout.sizes) and all(
            a.ctypes.data % PAGE == 0 for a in out
        )

    # -- writes ----------------------------------------------------------------------------
    def submit_write(
        self, tslots: np.ndarray, sources: list[np.ndarray], rows: np.ndarray
    ) -> list[Future]:
        """Start writing ``sources[i][rows[j]]`` (every key i) to tier slot ``tslots[j]``.

        The rows are copied before returning (the caller may overwrite ``sources`` at once);
        this waits while staging memory is full (counted in ``write_wait_seconds``). If a tier
        slot appears twice, the last one wins. Each future's result is (bytes written, seconds),
        as the reader's are (``solar.io.executor.wait_all`` waits for either).
        """
        t, r = self._check(tslots, rows, sources)
        st = self._st
        last = t.size - 1 - np.unique(t[::-1], return_index=True)[1]  # sorted by tier slot
        t, r = t[last], r[last]
        sizes = self.layout.sizes
        src = [_rows_u8(np.ascontiguousarray(a), s) for a, s in zip(sources, sizes, strict=True)]
        # Jobs of consecutive slots, enough for every thread, each within the staging memory.
        cap = min(self.layout.run_cap, self.staging_slots)
        job = min(self.staging_slots, max(cap, -(-t.size // self.executor.threads)))
        futures = []
        for a in range(0, t.size, job):
            stage, waited = st.take(min(job, t.size - a))
            self.write_wait_seconds += waited
            slots = t[a : a + job]
            for s, off, size in zip(src, self.layout.fields, self.layout.sizes, strict=True):
                copy_rows(s, r[a : a + job], st.staging[:, off : off + size], stage)
            task = plan_slot_writes(self.layout, slots, st.staging, stage, drop=not self.direct_io)
            listed = slots.tolist()
            with st.lock:
                # The slot's earlier writes must have landed (their error is ours); its old
                # content must have been read (a failed read leaves no slot unknown).
                (fut,) = self.executor.start(
                    self, [task], after=st.writes_to(listed), settled=st.reads_of(slots)
                )
                st.pending.update(dict.fromkeys(listed, fut))
                st.writes[fut] = None
                self.bytes_written += slots.size * self.stride
            fut.add_done_callback(functools.partial(self._written, listed, stage))
            futures.append(fut)
        return futures

    def _written(self, slots: list[int], stage: np.ndarray, fut: Future) -> None:
        st = self._st
        with st.lock:
            for x in slots:
                if st.pending.get(x) is fut:
                    del st.pending[x]
            st.writes.pop(fut, None)
            if self._error is None and not fut.cancelled():
                self._error = fut.exception()
            st.free.extend(stage.tolist())
            st.room.notify_all()

    def wait_writes(self) -> None:
        """Wait for every write in flight; raise the first error of any write so far."""
        self._owned()
        with self._st.lock:
            futures = list(self._st.writes)
        wait(futures)
        for f in futures:
            if not f.cancelled() and f.exception() is not None and self._error is None:
                self._error = f.exception()
        if self._error is not None:
            raise SolarError(str(self._error))

    # -- reads -----------------------------------------------------------------------------
    def submit_read(
        self, tslots: np.ndarray, out: list[np.ndarray], rows: np.ndarray
    ) -> list[Future]:
        """Start reading tier slot ``tslots[j]`` into ``out[i][rows[j]]`` for every key i, after
        the writes of those slots submitted so far.

        ``out`` arrays must be C-contiguous. Each future's result is (bytes read, seconds).
        """
        t, r = self._check(tslots, rows, out)
        return self._read(t, out, r)

    def _read(self, t: np.ndarray, out: list[np.ndarray], r: np.ndarray) -> list[Future]:
        """:meth:`submit_read` of checked arguments."""
        if t.size == 0:
            return []
        st = self._st
        dests = [_rows_u8(a, s) for a, s in zip(out, self.layout.sizes, strict=True)]
        tasks = plan_slot_reads(
            self.layout, t, dests, r, into_rows=self._into_rows(out),
            scratch=st.scratch.ctypes.data, groups=self.executor.threads,
        )  # fmt: skip
        with st.lock:
            # With no write in flight, no per-slot lookups.
            after = st.writes_to(t.tolist()) if st.pending else set()
            futures = self.executor.start(self, tasks, after=after)
            call = next(st.calls)
            st.reads[call] = (t, futures)  # a later write of these slots waits for them
            self.bytes_read += t.size * self.stride
        when_all(futures, functools.partial(st.read_done, call))
        return futures

    def expect_writes(self, step: int, tslots: np.ndarray) -> None:
        """Step ``step`` writes ``tslots`` once it is served (see :meth:`read_step`)."""
        self._st.written_at[tslots] = step  # the plan's slots: checked when it was read

    def read_step(
        self, step: int, tslots: np.ndarray, out: list[np.ndarray], rows: np.ndarray
    ) -> list[Future]:
        """:meth:`submit_read` for step ``step`` of a run, which may be read ahead of steps
        not served yet: a slot that such an earlier step writes (:meth:`expect_writes`) holds
        its sample only once that step's writes are submitted, so its read waits for
        :meth:`done_writing` of that step, behind a future returned now."""
        t, r = self._check(tslots, rows, out)
        st = self._st
        w = st.written_at[t]
        late = (w >= st.submitted) & (w < step)
        if not late.any():
            return self._read(t, out, r)
        futures = self._read(t[~late], out, r[~late])
        held: Future = Future()
        st.held.append((int(w[late].max()), t[late], out, r[late], held))
        return [*futures, held]

    def done_writing(self, step: int) -> None:
        """Every write of steps up to ``step`` is submitted: start the reads they held. A read
        that cannot start (the tier failed) fails its future; none is left pending."""
        self._owned()
        st = self._st
        st.submitted = step + 1
        ready = [h for h in st.held if h[0] <= step]
        st.held = [h for h in st.held if h[0] > step]
        for _, t, out, rows, held in ready:
            if not held.set_running_or_notify_cancel():
                continue
            try:
                self._check(t, rows, out)  # the tier may have failed (or closed) meanwhile
                futures = self._read(t, out, rows)
            except BaseException as exc:
                held.set_exception(exc)
                continue
            when_all(futures, functools.partial(_settle, held, futures))

    def reset(self, step: int) -> None:
        """Start a run of steps at ``step``: no step after it has announced writes; held
        reads are cancelled (their results were not wanted)."""
        self._owned()
        st = self._st
        st.written_at[:] = -1
        st.submitted = step
        _cancel([held for *_, held in st.held])
        st.held = []

    def _check(self, tslots, rows, arrays: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Arguments as int64 arrays, every slot and row in range: before any I/O."""
        if self._closed:
            raise SolarError(f"tier {self.path}: used after close()")
        self._owned()
        if self._error is not None:
            raise SolarError(str(self._error))
        t, r = np.asarray(tslots, np.int64).ravel(), np.asarray(rows, np.int64).ravel()
        if t.shape != r.shape or (arrays and len(arrays) != len(self.keys)):
            raise SolarError(f"tier: {t.size} slots, {r.size} rows, {len(arrays)} arrays")
        bad = np.flatnonzero((t < 0) | (t >= self.slots))
        if bad.size:
            raise SolarError(f"tier {self.path}: slot {t[bad[0]]} outside 0..{self.slots - 1}")
        if arrays:
            n = min(a.shape[0] for a in arrays)
            bad = np.flatnonzero((r < 0) | (r >= n))
            if bad.size:
                raise SolarError(f"tier {self.path}: row {r[bad[0]]} outside 0..{n - 1}")
        return t, r

    def _owned(self) -> None:
        """Refuse a process other than the one that made the tier (its I/O state is not
        this process's: a forked child makes a tier of its own)."""
        if os.getpid() != self._pid:
            raise SolarError(
                f"tier {self.path}: belongs to process {self._pid}; a forked child makes its own"
            )

    def close(self) -> None:
        """Wait for the reads and writes in flight, close and remove the file (idempotent).

        Errors of writes nobody waited for are dropped with the file: :meth:`wait_writes`
        first to see them. In a forked child this closes the child's descriptor only.
        """
        if self._closed:
            return
        self._closed = True
        if os.getpid() == self._pid:  # a forked child never waits for its parent's I/O
            st = self._st
            _cancel([held for *_, held in st.held])
            with st.lock:
                flying = list(st.writes) + [f for _, fs in st.reads.values() for f in fs]
            wait(flying)
        self._finalizer()

    def __enter__(self) -> TierFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Checked:
    """A task's use of a file's descriptor ``fd``, ``check()`` called before and after it (a
    class, not a generator: it is entered per task): a tier's size, a packed layout's
    identity."""

    __slots__ = ("check", "fd")

    def __init__(self, check: Callable[[], None], fd: int) -> None:
        self.check, self.fd = check, fd

    def __enter__(self) -> int:
        self.check()
        return self.fd

    def __exit__(self, kind: object, *rest: object) -> None:
        if kind is None:
            self.check()


class _State:
    """A tier's I/O state: staging memory, reads and writes in flight, held reads."""

    def __init__(self, slots: int, staging_slots: int, stride: int) -> None:
        self.lock = threading.Lock()
        self.room = threading.Condition(self.lock)  # staging slots freed
        self.staging = aligned(staging_slots * stride).reshape(-1, stride)
        self.free = collections.deque(range(staging_slots))
        self.scratch = aligned(PAGE)  # padding between slots read into rows (discarded)
        self.pending: dict[int, Future] = {}  # tier slot -> its latest write in flight
        self.writes: dict[Future, None] = {}  # writes in flight, oldest first
        self.reads: dict[int, tuple[np.ndarray, list[Future]]] = {}  # read calls in flight
        self.calls = itertools.count()
        self.written_at = np.full(slots, -1, np.int64)  # the last step announced to write it
        self.submitted = 0  # steps before this one have submitted their writes
        # Reads held back: (the step whose writes they wait for, slots, out, rows, future).
        self.held: list[tuple[int, np.ndarray, list[np.ndarray], np.ndarray, Future]] = []

    def writes_to(self, slots: list[int]) -> set[Future]:
        """The writes in flight to any of ``slots`` (the lock held)."""
        return {f for x in slots if (f := self.pending.get(x)) is not None}

    def reads_of(self, slots: np.ndarray) -> list[Future]:
        """The reads in flight of any of ``slots`` (the lock held): a few calls at most (the
        read-ahead's), so one vector test each."""
        return [f for read, fs in self.reads.values() if np.isin(slots, read).any() for f in fs]

    def read_done(self, call: int) -> None:
        """A read call's futures have all ended: its slots are free to write."""
        with self.lock:
            del self.reads[call]

    def take(self, n: int) -> tuple[np.ndarray, float]:
        """``n`` free staging slots, and the seconds spent waiting for writes to free them."""
        t0 = time.perf_counter()
        with self.room:
            while len(self.free) < n:
                self.room.wait()
            stage = np.array([self.free.popleft() for _ in range(n)], np.int64)
        return stage, time.perf_counter() - t0


def _cancel(held: list[Future]) -> None:
    """Cancel futures no executor runs; notified at once, so that ``wait`` sees them done."""
    for f in held:
        f.cancel()
        f.set_running_or_notify_cancel()


def _settle(held: Future, futures: list[Future]) -> None:
    """Complete ``held`` with the combined result of ``futures`` (all ended)."""
    try:
        held.set_result(combine(futures))
    except BaseException as exc:
        held.set_exception(exc)


def create_file(path: Path, nbytes: int, direct_io: bool,
                what: str = "tier") -> tuple[int, bool]:  # fmt: skip
    """A new unlinked file of ``nbytes`` allocated bytes in ``path``'s directory; its
    descriptor and whether O_DIRECT is on. Nothing is left open if it fails (one line,
    naming ``what``: a tier, a packed layout)."""
    fd = reserved_file(path, nbytes, what)
    try:
        return reopen_direct(fd, path, direct_io, what)
    except (OSError, SolarError) as exc:
        os.close(fd)
        why = exc.strerror if isinstance(exc, OSError) else exc
        raise SolarError(f"{what} {path}: cannot allocate {format_bytes(nbytes)} ({why})") from None


def reserved_file(path: Path, nbytes: int, what: str = "tier") -> int:
    """A new unlinked file (:func:`unlinked_file`) of ``nbytes`` reserved bytes: a file that
    does not fit fails here, in one line naming ``what``, not mid-run; nothing left open."""
    fd = unlinked_file(path, what)
    try:
        os.posix_fallocate(fd, 0, nbytes)  # before O_DIRECT: glibc may emulate it by writes
    except OSError as exc:
        os.close(fd)
        raise SolarError(f"{what} {path}: cannot allocate {format_bytes(nbytes)} "
                         f"({exc.strerror})") from None  # fmt: skip
    return fd


def room(directory: Path, nbytes: int, slots: int, stride: int, whose: str = "") -> str:
    """Why ``nbytes`` of ``slots`` slots do not fit in ``directory`` now ("" if they do), in
    one line (``whose``: "the node's tier " for a host's)."""
    vfs = os.statvfs(directory)
    free = vfs.f_bavail * vfs.f_frsize
    if nbytes <= free:
        return ""
    return (f"tier {directory}: {whose}needs {format_bytes(nbytes)} for {slots} slots of "
            f"{format_bytes(stride)}, {format_bytes(free)} free (a smaller tier_size, or "
            "another directory)")  # fmt: skip


def reopen_direct(fd: int, path: str | os.PathLike, direct_io: bool,
                  what: str = "tier") -> tuple[int, bool]:  # fmt: skip
    """``fd`` opened again with O_DIRECT (by its descriptor: it may have no name) and closed,
    if ``direct_io`` and the file system has it; else ``fd``. The descriptor and whether
    O_DIRECT is on."""
    if direct_io:
        try:
            dfd = open_descriptor(f"/proc/self/fd/{fd}", os.O_RDWR, o_direct=True)
        except NoDirectIO:
            warnings.warn(f"{what} {path}: no O_DIRECT here, using buffered I/O", stacklevel=4)
        else:
            os.close(fd)
            return dfd, True
    return fd, False


def unlinked_file(path: Path, what: str = "tier") -> int:
    """A new empty file in ``path``'s directory with no name (O_TMPFILE; else created as
    ``path`` and unlinked at once, a crash in between leaving it to :func:`remove_stale`)."""
    flags = os.O_RDWR | getattr(os, "O_TMPFILE", 0)
    try:
        if flags != os.O_RDWR:
            return os.open(path.parent, flags, 0o600)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOENT):
            raise SolarError(f"{what} {path}: cannot create ({exc.strerror})") from None
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise SolarError(f"{what} {path}: cannot create ({exc.strerror})") from None
    try:
        os.unlink(path)
    except OSError as exc:
        os.close(fd)
        raise SolarError(f"{what} {path}: cannot unlink ({exc.strerror})") from None
    return fd


def check_directory(directory: Path, what: str = "tier") -> None:
    """Raise (one line naming ``what``) unless ``directory`` is a writable directory."""
    if not directory.exists():
        raise SolarError(f"{what} {directory}: directory does not exist")
    if not directory.is_dir():
        raise SolarError(f"{what} {directory}: not a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise SolarError(f"{what} {directory}: directory is not writable")


_IN_MEMORY = (0x01021994, 0x858458F6)  # statfs f_type of tmpfs, ramfs (linux/magic.h)


def in_memory(directory: str | os.PathLike) -> bool:
    """Whether ``directory``'s file system keeps files in memory (tmpfs, ramfs): statfs's
    f_type, the struct's first field (``os.statvfs`` has no type)."""
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(512)  # struct statfs is 120 bytes on 64-bit Linux
    if libc.statfs(os.fsencode(directory), buf) != 0:
        return False  # not Linux, or not statfs-able: the writes will tell
    return ctypes.c_long.from_buffer(buf).value in _IN_MEMORY


def remove_stale(directory: Path, host: str, prefix: str = "solar-tier-") -> list[Path]:
    """Remove this host's tier files (named ``{prefix}...-{host}-{pid}.bin``: a rank's, or a
    node's, solar/cache/nodetier.py) whose creating process is dead; returns them."""
    pattern = re.compile(rf"{re.escape(prefix)}.+-{re.escape(host)}-(\d+)\.bin")
    removed = []
    for entry in sorted(os.listdir(directory)):
        m = pattern.fullmatch(entry)
        if m is None or _alive(int(m.group(1))):
            continue
        try:
            os.unlink(directory / entry)
        except OSError:
            continue  # another rank of this node removed it first, or it is not ours to remove
        warnings.warn(
            f"removed a tier file left by a crashed run: {directory / entry}", stacklevel=3
        )
        removed.append(directory / entry)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's process, or not a pid: leave its file alone
    return True


def _rows_u8(a: np.ndarray, row_bytes: int) -> np.ndarray:
    """``a`` as (rows, row_bytes) uint8, sharing its memory."""
    if not a.flags.c_contiguous or (a.shape[0] and a[0].nbytes != row_bytes):
        raise SolarError(
            f"tier: an array of shape {a.shape} is not C-contiguous {row_bytes} B rows"
        )
    return a.view(np.uint8).reshape(a.shape[0], row_bytes)


def sanitise(s: str) -> str:
    """``s`` with only letters, digits and ``_.-`` (a host name in a file name)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", s)

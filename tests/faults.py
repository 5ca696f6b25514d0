"""A seeded fault injector at the executor's system calls, and whole runs under it (issue 33).

No LD_PRELOAD: the executor calls its read kernels and ``os.preadv`` through module globals
(solar/io/executor.py), so :class:`Faults` wraps them. As SQLite's fault-injection tests do,
each run is driven by a seed, counts what it injected, and its outcome is judged by one rule:
every batch served holds exactly h5py's bytes of the original files, or the run stops with one
line naming the fault; and nothing is left behind (descriptors, processes, /dev/shm names).

The faults, each at a read the kernels make (a preadv run, one file's read, a page span):

* ``eintr``: the call is interrupted, nothing read, the destination holds other bytes;
* ``short``: it returns fewer bytes than asked, the rest of the destination other bytes;
* ``eio_once``: it fails with EIO once (a transient error): the read again succeeds;
* ``eio``: it fails with EIO, and so does every read again of the same bytes (a bad sector);
* ``change``: a data file is rewritten in place before the call (other bytes, same inode).

The first three must be served exactly (retried transparently); ``eio`` must stop the run with
"Input/output error", ``change`` with "changed since it was opened" (or be served exactly when
no read of the changed file follows it). Used by tests/test_faults.py (a few seeds, one process
and ``mpiexec -n 3``: tests/mpi/faults.py) and bench/fault_bench.py (many seeds).
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import gc
import os
import random
import shutil
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from solar.io import aio
from solar.io import executor as executor_mod

KINDS = ("eintr", "short", "eio_once", "eio", "change")
WEIGHTS = {"eintr": 3, "short": 3, "eio_once": 2, "eio": 1, "change": 1}  # transient ones first
TRANSIENT = ("eintr", "short", "eio_once")
_SCRIBBLE = 0x5A  # what a destination holds where a faulty call read nothing


class Faults:
    """Seeded faults: each read a kernel makes fails with probability ``rate``, as one of
    ``kinds``; ``files`` are the data files, which ``change`` rewrites (once per run at most,
    and only with ``changes``)."""

    def __init__(self, seed: int, rate: float = 0.05, kinds: tuple[str, ...] = KINDS,
                 files: tuple[Path, ...] = (), changes: bool = True) -> None:  # fmt: skip
        self.seed = seed
        self.rng = random.Random(seed)  # (the bytes a fault scribbles: any will do)
        self._calls: Counter[tuple[int, int]] = Counter()
        self.rate, self.kinds, self.files, self.changes = rate, kinds, files, changes
        self._ids: dict[int, int] = {}  # inode -> index in files
        self.counts: Counter[str] = Counter()
        self._bad: set[tuple[int, int]] = set()  # (inode, offset) that always fail: eio
        self._once: set[tuple[int, int]] = set()  # faulted once: the next read succeeds
        self._lock = threading.Lock()
        self._changed = False
        self._real: dict[str, Callable] = {}

    # -- drawing -------------------------------------------------------------------------------
    def _draw(self, fd: int, offset: int, write: bool, python: bool = False) -> str | None:
        """The fault of a call reading (writing) at ``offset`` of ``fd`` (-1 - i: data file
        i, opened inside a compiled loop), if any. ``python``: an ``os.preadv``, which
        retries EINTR itself, and whose first failure the executor does not retry (EIO
        there is a stop)."""
        key = (self._file(fd), offset)
        with self._lock:
            if key in self._bad:
                return "eio"
            if key in self._once:  # a transient fault is transient: this read succeeds
                self._once.discard(key)
                return None
            # Drawn from (seed, the bytes read, how often read): the same faults whatever
            # order the reader threads make their calls in.
            self._calls[key] += 1
            rng = random.Random(f"{self.seed}:{key[0]}:{key[1]}:{self._calls[key]}")
            if rng.random() >= self.rate:
                return None
            kinds = [k for k in self.kinds if not write or k in ("eintr", "eio_once")]
            if python:
                kinds = [k for k in kinds if k not in ("eintr", "eio_once")]
            if self._changed or not self.changes or not self.files:
                kinds = [k for k in kinds if k != "change"]
            if not kinds:
                return None
            kind = rng.choices(kinds, [WEIGHTS[k] for k in kinds])[0]
            self.counts[kind] += 1
            if kind == "eio":
                self._bad.add(key)
            elif kind != "change":
                self._once.add(key)
            else:
                self._changed = True
            return kind

    def _change(self) -> None:
        """Rewrite some bytes of a data file in place: the same inode, other bytes."""
        path = self.rng.choice(self.files)
        size = os.path.getsize(path)
        at = self.rng.randrange(size - size // 4, size - 64)  # data: the metadata is first
        with open(path, "r+b") as f:
            f.seek(at)
            old = f.read(64)
            f.seek(at)
            f.write(bytes(b ^ 0xFF for b in old))

    def _file(self, fd: int) -> int:
        """Which file a call reads, as an index in ``files`` (-1: another, the tier): a bad
        sector is the file's, whatever descriptor reads it."""
        if fd < 0:
            return -1 - fd
        try:
            return self._ids.get(os.fstat(fd).st_ino, -1)
        except OSError:
            return -1

    # -- the wrapped kernels -----------------------------------------------------------------
    def _runs(self, fd, iov, starts, counts, offsets, write, got, cached):
        """_iov_runs: one preadv (pwritev) per run."""
        pre = [self._draw(fd, int(o), bool(write)) for o in offsets.tolist()]
        if "change" in pre:
            self._change()
        self._real["_iov_runs"](fd, iov, starts, counts, offsets, write, got, cached)
        for j, kind in enumerate(pre):
            if kind in (None, "change"):
                continue
            a, n = int(starts[j]), int(counts[j])
            _fault(kind, iov[a : a + n], got, j, write, self.rng)

    def _each(self, fds, iov, offsets, got):
        """_advise_preadv_each: read j of descriptor fds[j]."""
        pre = [self._draw(int(fd), int(o), False) if fd >= 0 else None
               for fd, o in zip(fds.tolist(), offsets.tolist(), strict=True)]  # fmt: skip
        if "change" in pre:
            self._change()
        self._real["_advise_preadv_each"](fds, iov, offsets, got)
        for j, kind in enumerate(pre):
            if kind not in (None, "change"):
                _fault(kind, iov[j : j + 1], got, j, False, self.rng)

    def _open_each(self, names, name_at, files, iov, offsets, got, *more):
        """_open_read_close: files opened per read; faults by (path index, offset)."""
        pre = [self._draw(-1 - int(f), int(o), False)
               for f, o in zip(files.tolist(), offsets.tolist(), strict=True)]  # fmt: skip
        if "change" in pre:
            self._change()
        self._real["_open_read_close"](names, name_at, files, iov, offsets, got, *more)
        for j, kind in enumerate(pre):
            if kind not in (None, "change"):
                _fault(kind, iov[j : j + 1], got, j, False, self.rng)

    def _spans(self, ctx, fd, buf, at, lo, size, got, depth):
        """aio.read_spans: O_DIRECT page spans, many in flight (PageGather)."""
        pre = [self._draw(int(fd), int(o), False) for o in lo.tolist()]
        if "change" in pre:
            self._change()
        done = self._real["read_spans"](ctx, fd, buf, at, lo, size, got, depth)
        for j, kind in enumerate(pre):
            if kind not in (None, "change"):
                iov = np.array([[buf.ctypes.data + int(at[j]), int(size[j])]], np.uint64)
                _fault(kind, iov, got, j, False, self.rng)
        return done

    def _preadv(self, fd, buffers, offset):
        """os.preadv, as the executor's reads again and Python-side reads call it."""
        kind = self._draw(fd, offset, False, python=True)
        if kind == "eio":
            raise OSError(errno.EIO, "Input/output error")
        if kind == "change":
            self._change()
        n = self._real["preadv"](fd, buffers, offset)
        if kind == "short" and n > 0:
            keep = self.rng.randrange(0, n)
            at = 0
            for b in buffers:  # past what it reports: other bytes
                view = np.frombuffer(b, np.uint8)
                lo = max(keep - at, 0)
                if lo < view.size:
                    view[lo:] = _SCRIBBLE
                at += view.size
            return keep
        return n

    @contextmanager
    def installed(self) -> Iterator[Faults]:
        """The executor's calls wrapped while the block runs."""
        self._ids = {os.stat(p).st_ino: i for i, p in enumerate(self.files)}
        names = ("_iov_runs", "_advise_preadv_each", "_open_read_close")
        self._real = {name: getattr(executor_mod, name) for name in names}
        self._real["preadv"] = os.preadv
        self._real["read_spans"] = aio.read_spans
        aio.read_spans = self._spans  # type: ignore[assignment]
        executor_mod._iov_runs = self._runs
        executor_mod._advise_preadv_each = self._each
        executor_mod._open_read_close = self._open_each
        os.preadv = self._preadv  # type: ignore[assignment]
        try:
            yield self
        finally:
            for name in ("_iov_runs", "_advise_preadv_each", "_open_read_close"):
                setattr(executor_mod, name, self._real[name])
            os.preadv = self._real["preadv"]  # type: ignore[assignment]
            aio.read_spans = self._real["read_spans"]  # type: ignore[assignment]


def _fault(kind: str, iov: np.ndarray, got: np.ndarray, j: int, write: bool, rng) -> None:
    """What the call returns under ``kind``; a read's destination past what it reports read
    holds other bytes (the retry must overwrite them)."""
    want = int(iov[:, 1].sum())
    keep = rng.randrange(0, max(1, want)) if kind == "short" else 0
    got[j] = keep if kind == "short" else -1
    if write:
        return
    at = 0
    for addr, n in iov.tolist():
        lo = max(keep - at, 0)
        if lo < n:
            ctypes.memset(int(addr) + lo, _SCRIBBLE, int(n) - lo)
        at += int(n)


# -- whole runs --------------------------------------------------------------------------------
@dataclass
class Outcome:
    """What one seeded run did."""

    seed: int
    mode: str
    injected: Counter = field(default_factory=Counter)
    batches: int = 0
    stopped: str | None = None  # the error's message: one line
    leftovers: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Exact bytes, or a one-line stop for the fault that warrants one; nothing left."""
        if any(self.leftovers.values()):
            return False
        if self.stopped is None:
            return self.injected["eio"] == 0  # a bad sector read is never served around
        if "\n" in self.stopped:
            return False
        if "Input/output error" in self.stopped:
            return self.injected["eio"] > 0
        if "changed since it was opened" in self.stopped:
            return self.injected["change"] > 0
        return False


def snapshot() -> dict[str, set]:
    """Descriptors, child processes and the /dev/shm names this process maps, now."""
    fds = set(os.listdir("/proc/self/fd"))
    children = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == os.getpid():
                        children.add(pid)
            except OSError:
                continue
    with open("/proc/self/maps") as f:
        shm = {line.split("/dev/shm/", 1)[1].split()[0] for line in f if "/dev/shm/" in line}
    return {"fds": fds, "children": children, "shm": shm}


@contextmanager
def shm_created() -> Iterator[set[str]]:
    """The /dev/shm names this process creates while the block runs (shared memory:
    multiprocessing.shared_memory's ``shm_open``). The machine is shared: other jobs' names
    come and go in /dev/shm, so a name is counted as left only if this process made it."""
    import _posixshmem  # type: ignore[import-not-found]

    created: set[str] = set()
    real = _posixshmem.shm_open

    def shm_open(path, flags, mode=0o777):
        fd = real(path, flags, mode)
        if flags & os.O_CREAT:
            created.add(path.lstrip("/"))
        return fd

    _posixshmem.shm_open = shm_open
    try:
        yield created
    finally:
        _posixshmem.shm_open = real


def leftovers(before: dict[str, set], created: set[str] = frozenset()) -> dict[str, int]:  # type: ignore[assignment]
    """What appeared since ``before`` and is still there: descriptors, child processes,
    /dev/shm names this process created (``created``) or still maps."""
    after = snapshot()
    new = {k: after[k] - before[k] for k in before}
    new["shm"] |= created & set(os.listdir("/dev/shm"))
    return {k: len(v) for k, v in new.items()}


MODES = ("buffered", "direct", "one_per_file", "tier")


def make_data(directory: Path, mode: str, n: int = 96) -> list[Path]:
    """The original files of a mode (written once; a run uses a copy)."""
    rng = np.random.default_rng(7)
    directory.mkdir(parents=True, exist_ok=True)
    if mode == "one_per_file":
        paths = []
        for i in range(n):
            p = directory / f"s{i:03d}.h5"
            with h5py.File(p, "w") as f:
                f["x"] = rng.integers(0, 2**31, 256, np.int32)
            paths.append(p)
        return paths
    width = 1024 if mode == "direct" else 200  # O_DIRECT: page spans of small rows
    p = directory / "d.h5"
    with h5py.File(p, "w") as f:
        f["x"] = rng.integers(0, 2**31, (n, width), np.int32)
        f["y"] = np.arange(n, dtype=np.int64)
    return [p]


def fresh_copy(originals: list[Path], work: Path) -> list[Path]:
    """Copies of ``originals`` in an empty ``work`` (a run may change them)."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    return [Path(shutil.copy(p, work / p.name)) for p in originals]


def run(seed: int, mode: str, originals: list[Path], work: Path, rate: float = 0.05,
        epochs: int = 2, comm=None, changes: bool = True, rank_seed: int = 0,
        kinds: tuple[str, ...] = KINDS) -> Outcome:  # fmt: skip
    """One seeded run of ``mode`` over fresh copies of ``originals`` in ``work`` (with
    ``comm``: the files given, shared by the ranks; ``changes``: this rank may change them;
    ``rank_seed``: its faults' seed is ``1000 * seed + rank_seed``)."""
    from solar import ExpertConfig, Loader, MemoryConfig, SolarError
    from solar.config import ReaderConfig
    from solar.errors import first_line

    paths = originals if comm is not None else fresh_copy(originals, work)
    ref: dict[str, list] = {}
    for p in paths:
        with h5py.File(p) as f:
            for k in f:
                data = f[k][()]
                ref.setdefault(k, []).append(data[None] if mode == "one_per_file" else data)
    refs = {k: np.concatenate(v) for k, v in ref.items()}
    out = Outcome(seed, mode)
    gc.collect()
    before = snapshot()
    reader = ReaderConfig(threads=2, read_ahead=2, direct_io=mode == "direct")
    kw: dict = {"batch_size": 8, "epochs": epochs, "buffer": 16, "seed": seed, "reader": reader,
                "expert": ExpertConfig(warm=False)}  # fmt: skip
    if mode == "one_per_file":
        kw.update(reader=dataclasses.replace(reader, one_per_file=True), buffer=0)
    nvme = work / ("nvme" if comm is None else f"nvme{comm.Get_rank()}")
    if mode == "tier":
        nvme.mkdir(parents=True, exist_ok=True)
        kw.update(buffer=8, memory=MemoryConfig(tier=nvme, tier_size=48))
    if comm is not None:
        kw["comm"] = comm
    faults = Faults(1000 * seed + rank_seed, rate, kinds, tuple(paths), changes)
    loader = None
    watch = shm_created()
    created = watch.__enter__()
    try:
        loader = Loader(paths, **kw)
        with faults.installed():
            for e in range(epochs):
                loader.set_epoch(e)
                for batch in loader:
                    ids = batch["index"].numpy()
                    for k, v in refs.items():
                        got = batch[k].numpy()
                        if not np.array_equal(got, v[ids]):
                            raise AssertionError(f"seed {seed} {mode}: wrong bytes in {k}")
                    out.batches += 1
    except SolarError as exc:
        out.stopped = str(exc) if "\n" in str(exc) else first_line(exc)
    finally:
        out.injected = faults.counts
        if loader is not None:
            loader.close()
        del loader
        gc.collect()
        watch.__exit__(None, None, None)
        out.leftovers = leftovers(before, created)
        if mode == "tier":
            out.leftovers["tier_files"] = len(os.listdir(nvme))
    return out

"""What the storage gives: random 4 KiB page reads per second against queue depth, and
sequential bandwidth, measured with ``O_DIRECT`` on a file (beside every figure of ``solar bench
--sampler neighbor``, and for a packing cost model given no rates).

A GNN's feature gathering is bound by random page reads (README, "Graphs"): the rate it
reaches means something only next to the rate the device gives at the queue depth the reader
keeps. Reads are native AIO at the depth asked (:mod:`solar.io.aio`), as ``fio --ioengine=libaio
--direct=1`` reads; where the kernel refuses AIO, ``depth`` threads each read one page at a
time (the synchronous rate, lower than AIO's at depth 32 on this machine).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
from numba import njit

from solar._cpu import cores
from solar._memory import PAGE, aligned
from solar._units import format_bytes
from solar.errors import SolarError
from solar.io import aio, libc

DEPTHS = (1, 8, 32, 64)
SEQ_BLOCK = 2**20  # sequential reads: 1 MiB each, 4 in flight
SUBMITTERS = max(1, min(2, cores()))  # threads submitting AIO reads


@dataclass(frozen=True)
class ProbeResult:
    """Random ``PAGE``-byte reads per second at each queue depth, sequential bytes per second."""

    path: str
    span_bytes: int  # the part of the file the random reads fell in
    random: dict[int, float] = field(default_factory=dict)  # depth -> pages/s
    sequential: float = 0.0  # bytes/s
    engine: str = "aio"  # "aio", or "threads" where the kernel refused AIO

    def rate(self, depth: int = 32) -> float:
        """Pages/s at ``depth`` (the nearest depth measured at or below it)."""
        best = [d for d in self.random if d <= depth] or [min(self.random)]
        return self.random[max(best)]

    @property
    def best(self) -> float:
        """The best random page rate measured."""
        return max(self.random.values())

    def as_dict(self) -> dict:
        return {
            "path": self.path, "span_bytes": self.span_bytes, "engine": self.engine,
            "random_pages_per_second": {str(d): r for d, r in self.random.items()},
            "sequential_bytes_per_second": self.sequential,
        }  # fmt: skip

    def describe(self) -> str:
        """One line, as the CLI prints it."""
        depths = "/".join(str(d) for d in self.random)
        rates = "/".join(f"{r / 1e3:.0f}k" for r in self.random.values())
        return (f"storage probe ({self.engine}, O_DIRECT, {format_bytes(self.span_bytes)} of "
                f"{self.path}): random {PAGE // 1024} KiB reads {rates} pages/s at queue depth "
                f"{depths}; sequential {self.sequential / 1e9:.2f} GB/s")  # fmt: skip


def probe(
    path: str | os.PathLike,
    *,
    depths: tuple[int, ...] = DEPTHS,
    seconds: float = 1.0,
    offset: int = 0,
    length: int | None = None,
    seed: int = 0,
) -> ProbeResult:
    """Measure the storage under the file ``path``: its bytes ``[offset, offset + length)``
    are read, never written. About ``seconds`` per depth and for the sequential read."""
    path = os.fspath(path)
    try:
        size = os.path.getsize(path)
    except OSError as exc:
        raise SolarError(f"{path}: cannot probe ({exc.strerror})") from None
    lo = offset // PAGE * PAGE
    hi = size if length is None else min(size, offset + length)
    pages = (hi - lo) // PAGE
    if pages < 1:
        raise SolarError(f"{path}: nothing to probe (fewer than {PAGE} bytes)")
    if not depths or any(not isinstance(d, int) or d < 1 for d in depths):
        raise SolarError(f"probe depths must be integers >= 1, got {depths!r}")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
    except OSError as exc:
        raise SolarError(f"{path}: cannot open with O_DIRECT ({exc.strerror})") from None
    rng = np.random.default_rng(seed)
    try:
        # One submitting thread per core: one thread's system calls alone stop short of the
        # device at depth 32 on a loaded 2-core machine (63k/s against 78k/s from threads).
        ctxs = [c for c in (aio.context(max(depths)) for _ in range(SUBMITTERS)) if c is not None]
        ctx = ctxs or None
        engine = "aio" if ctx is not None else "threads"
        random: dict[int, float] = {}
        for d in depths:
            random[d] = _random_rate(fd, ctx, d, lo, pages, seconds, rng)
        seq = _sequential_rate(fd, ctx, lo, hi, seconds)
        for c in ctxs:
            c.close()
    finally:
        os.close(fd)
    return ProbeResult(path, pages * PAGE, random, seq, engine)


def _random_rate(fd, ctx, depth, lo, pages, seconds, rng) -> float:
    buf = aligned(depth * PAGE)
    done = 0
    batch = max(256, 64 * depth)
    t0 = time.perf_counter()
    while True:
        offsets = lo + rng.integers(0, pages, batch, dtype=np.int64) * PAGE
        _read_pages(fd, ctx, depth, buf, offsets, PAGE)
        done += batch
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            return done / elapsed
        batch = int(min(4 * batch, max(256, done / elapsed * 0.25)))  # ~0.25 s per call


def _sequential_rate(fd, ctx, lo, hi, seconds) -> float:
    blocks = max(1, (hi - lo) // SEQ_BLOCK)
    buf = aligned(4 * SEQ_BLOCK)
    done = 0
    t0 = time.perf_counter()
    b = 0
    while True:
        n = min(64, blocks - b)
        offsets = lo + (b + np.arange(n, dtype=np.int64)) * SEQ_BLOCK
        done += _read_pages(fd, ctx, 4, buf, offsets, min(SEQ_BLOCK, hi - lo))
        b = (b + n) % blocks
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds or (b == 0 and elapsed >= min(seconds, 0.2)):
            return done / elapsed


def _read_pages(fd, ctx, depth, buf, offsets, size) -> int:
    """Read ``size`` bytes at each offset, ``depth`` in flight; returns the bytes read."""
    n = offsets.size
    at = (np.arange(n, dtype=np.int64) % depth) * size
    sizes = np.full(n, size // PAGE * PAGE, np.int64)
    got = np.empty(n, np.int64)
    if ctx is not None:  # ``depth`` in flight over k submitting threads, depth / k each
        k = min(len(ctx), depth)
        each = depth // k

        def submit(j: int) -> int:
            s = slice(j, None, k)
            m = offsets[s].size
            where = (np.arange(m, dtype=np.int64) % each + j * each) * size
            part = np.empty(m, np.int64)
            r = aio.read_spans(ctx[j].handle, fd, buf, where, offsets[s], sizes[s], part, each)
            got[s] = part
            return r

        if k == 1:
            failed = submit(0) < 0
        else:
            with ThreadPoolExecutor(k) as pool:
                failed = min(pool.map(submit, range(k))) < 0
        if failed:
            raise SolarError("probe: the kernel stopped taking AIO reads")
    else:  # one synchronous reader per depth

        def part(k: int) -> None:
            s = slice(k, None, depth)
            _pread_each(fd, buf, at[s], offsets[s], sizes[s], got[s])

        with ThreadPoolExecutor(depth) as pool:
            list(pool.map(part, range(depth)))
    if (got < 0).any():
        raise SolarError(f"probe: a read failed ({os.strerror(-int(got[got < 0][0]))})")
    return int(got.sum())


@njit(cache=True, nogil=True)
def _pread_each(fd, buf, at, offsets, sizes, got):  # pragma: no cover - compiled
    for j in range(offsets.shape[0]):
        got[j] = libc.pread(fd, buf.ctypes.data + at[j], sizes[j], offsets[j])

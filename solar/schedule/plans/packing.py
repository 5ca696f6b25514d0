"""Where a window of steps reads its misses: random pages of the source (as the reader does)
or a layout packed in plan order on node-local disk. A pure decision, made from the plan's
misses and the device's rates on the planning thread, as each epoch of a rank's plan is made
(:func:`epoch_windows`, called by solar/schedule/plans/stream.py, of the rank's own storage reads
whichever buffer it plans); the runtime obeys it (solar/runtime/packing.py).

Costs, in seconds of one device (the packing shares it with the steps it overlaps):

* random: the distinct pages holding the window's missed rows, each a random read, at the
  probe's random page rate (solar/io/probe.py);
* packed: a sequential scan of the source chunks holding them, a sequential write of the
  window's missed rows (each step's misses contiguous, by sample id) and their sequential
  read back, at the probe's sequential rate.

A row a window misses at two steps is packed twice, once in each step's region: the planner
chose to read it twice (keeping it would have evicted rows needed sooner), and packing
follows the plan rather than second-guessing it; a copy costs a row of sequential bytes,
not a random page, and keeps every step's misses one contiguous region. Page mates are not
planned where packing can pay (:meth:`PackModel.packs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from solar._memory import PAGE


@dataclass(frozen=True)
class DeviceRates:
    """What the storage gives: random ``PAGE``-byte reads per second (at the reader's queue
    depth) and sequential bytes per second (read or write)."""

    random_pages_per_second: float
    sequential_bytes_per_second: float


@dataclass(frozen=True)
class RowsAt:
    """Where the source's rows are: ``rows`` rows of ``row_bytes`` bytes from ``offset`` of
    one file, scanned in chunks of ``chunk_rows`` rows."""

    offset: int
    row_bytes: int
    rows: int
    chunk_rows: int


@dataclass(frozen=True)
class Window:
    """Steps ``[first, end)``, read from a packed layout (``packed``) or as random pages;
    the figures the choice was made from."""

    first: int
    end: int
    packed: bool
    rows: int  # missed rows (each step's reads; side rows where a given plan keeps them)
    nbytes: int  # disk its packed layout takes: the rows, each step's pieces padded to pages
    pages: int  # distinct pages those rows lie in, step by step (the random path's reads)
    scan_bytes: int  # source chunks a packing pass reads
    random_seconds: float
    packed_seconds: float

    def as_dict(self) -> dict:
        return {"steps": [self.first, self.end], "packed": self.packed, "rows": self.rows,
                "disk_bytes": self.nbytes,
                "pages": self.pages, "scan_bytes": self.scan_bytes,
                "random_seconds": self.random_seconds,
                "packed_seconds": self.packed_seconds}  # fmt: skip


def step_pages(samples: np.ndarray, at: RowsAt) -> int:
    """Distinct pages holding rows ``samples`` (sorted; what the random path reads for one
    step)."""
    if samples.size == 0:
        return 0
    start = at.offset + np.asarray(samples, np.int64) * at.row_bytes
    first, last = start // PAGE, (start + at.row_bytes - 1) // PAGE
    # Rows sorted: each row's pages past the last page counted so far are new.
    seen = np.maximum.accumulate(last)
    since = np.maximum(first[1:], seen[:-1] + 1)
    return int(last[0] - first[0] + 1) + int(np.maximum(last[1:] - since + 1, 0).sum())


def step_bytes(samples: np.ndarray, at: RowsAt) -> int:
    """Disk of one step's region (``samples`` sorted): its rows, in one piece per source
    chunk holding any, each padded to whole pages (solar/cache/packed.py)."""
    if samples.size == 0:
        return 0
    chunks = np.asarray(samples, np.int64) // at.chunk_rows
    pieces = 1 + int(np.count_nonzero(np.diff(chunks)))
    return int(samples.size) * at.row_bytes + pieces * PAGE


def scan_bytes(reads: Sequence[np.ndarray], at: RowsAt) -> int:
    """Bytes of the source chunks holding any of the steps' ``reads``."""
    count = -(-at.rows // at.chunk_rows)
    held = np.zeros(count, np.bool_)
    for r in reads:
        held[np.asarray(r, np.int64) // at.chunk_rows] = True
    sizes = np.full(count, at.chunk_rows, np.int64)
    sizes[-1] = at.rows - (count - 1) * at.chunk_rows
    return int(sizes[held].sum()) * at.row_bytes


def costs(
    reads: Sequence[np.ndarray], at: RowsAt, rates: DeviceRates
) -> tuple[int, int, int, float, float]:
    """(rows, pages, scan bytes, random seconds, packed seconds) of steps whose reads are
    ``reads`` (sorted sample ids each)."""
    rows = sum(int(r.size) for r in reads)
    pages = sum(step_pages(r, at) for r in reads)
    scan = scan_bytes(reads, at)
    random, packed = _seconds(pages, scan, rows * at.row_bytes, rates)
    return rows, pages, scan, random, packed


def _seconds(pages: float, scan: int, nbytes: int, rates: DeviceRates) -> tuple[float, float]:
    """(random, packed) seconds: ``pages`` random page reads, against a scan of ``scan``
    bytes, a write of ``nbytes`` and their read back, sequential."""
    return (pages / rates.random_pages_per_second,
            (scan + 2 * nbytes) / rates.sequential_bytes_per_second)  # fmt: skip


def _pays(random: float, packed: float, margin: float) -> bool:
    """Packing chosen: its cost times ``margin`` below the random pages'."""
    return packed * margin < random


def plan_windows(reads: Sequence[np.ndarray], first: int, at: RowsAt, rates: DeviceRates, *,
                 window_bytes: int, margin: float, lead: bool) -> list[Window]:  # fmt: skip
    """Steps ``first, first + 1, ...`` (their reads: ``reads[j]``, sorted, of step
    ``first + j``) cut into windows of at most ``window_bytes`` packed bytes (a step's misses
    are never split; a step larger than that is a window of its own, read at random), each
    packed where its packed cost times ``margin`` is below its random cost. ``lead``: an
    earlier window is served while the first one is packed. Without one (the run's start),
    the first window is read at random while the next is packed: its steps, the fewest
    (one at least) whose random reads take as long as that packing pass would."""
    windows: list[Window] = []
    disk = [step_bytes(r, at) for r in reads]
    lead_in = len(reads) if lead else _lead_in(reads, disk, at, rates, window_bytes)
    a = 0
    while a < len(reads):
        b, nbytes = a, 0
        opening = a == 0 and not lead  # the run's first window: lead_in steps, at random
        while b < len(reads):
            if b > a and (b >= lead_in if opening else nbytes + disk[b] > window_bytes):
                break
            nbytes += disk[b]
            b += 1
        rows, pages, scan, random, packed = costs(reads[a:b], at, rates)
        fits = nbytes <= window_bytes
        choose = fits and rows > 0 and _pays(random, packed, margin) and (lead or bool(windows))
        windows.append(Window(first + a, first + b, choose, rows, nbytes, pages, scan, random,
                              packed))  # fmt: skip
        a = b
    return windows


def _lead_in(reads: Sequence[np.ndarray], disk: list[int], at: RowsAt, rates: DeviceRates,
             window_bytes: int) -> int:  # fmt: skip
    """Steps of the run's first window: the fewest (one at least) whose random reads take as
    long as the pass packing the next window (a scan and a write of at most
    ``window_bytes``)."""
    write = min(window_bytes, sum(disk))
    build = (scan_bytes(reads, at) + write) / rates.sequential_bytes_per_second
    spent = 0.0
    for j, r in enumerate(reads):
        spent += step_pages(r, at) / rates.random_pages_per_second
        if spent >= build:
            return j + 1
    return len(reads)


@dataclass(frozen=True)
class PackModel:
    """What the planner decides a rank's windows from: where the source's rows are, the
    device's rates, a window's most disk and the margin packing must win by."""

    at: RowsAt
    rates: DeviceRates
    window_bytes: int
    margin: float

    def packs(self, most_rows: int) -> bool:
        """Whether packing can pay on this device, an upper estimate: the largest window there
        can be (its misses filling ``window_bytes``, at most ``most_rows``: an epoch's reads of
        a rank, hits and all), its misses on pages of their own, each costing the pages a row
        spans here, the whole source scanned, is packed by :func:`plan_windows`' rule.

        Where it is, the plan reads rows alone (solar/runtime/setup.py; why:
        docs/concepts/buffer.md); where not, nothing is packed."""
        at = self.at
        rows = max(1, min(self.window_bytes // at.row_bytes, most_rows))
        # Pages a row spans, on average (one straddling a page boundary costs two), over up to
        # 4096 rows spaced so that none shares a page: a sample, O(1) at any N.
        step = -(-PAGE // at.row_bytes) + 1
        spaced = np.arange(0, min(at.rows, 4096 * step), step, dtype=np.int64)
        pages = rows * step_pages(spaced, at) / max(1, spaced.size)
        random, packed = _seconds(pages, at.rows * at.row_bytes, rows * at.row_bytes, self.rates)
        return _pays(random, packed, self.margin)


@dataclass(frozen=True)
class EpochWindows:
    """A rank's windows of one epoch (they cover its steps, in order), and the sorted reads
    of each packed window's steps (by its first step): what its packing pass lays out."""

    epoch: int
    windows: tuple[Window, ...]
    reads: dict[int, list[np.ndarray]]


def epoch_windows(epoch: int, reads: Sequence[np.ndarray], first: int, model: PackModel,
                  lead: bool) -> EpochWindows:  # fmt: skip
    """Epoch ``epoch``'s windows (its steps from ``first``, their storage reads ``reads[j]``
    in any order), as :func:`plan_windows` cuts and chooses them."""
    ordered = [np.sort(np.asarray(r, np.int64)) for r in reads]
    ws = plan_windows(ordered, first, model.at, model.rates, window_bytes=model.window_bytes,
                      margin=model.margin, lead=lead)  # fmt: skip
    packed = {w.first: ordered[w.first - first : w.end - first] for w in ws if w.packed}
    return EpochWindows(epoch, tuple(ws), packed)

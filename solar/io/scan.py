"""One scan of a dataset's files per job: each rank scans a share, the ranks exchange the table.

Describing a dataset opens every file (HDF5) or reads every header (.npy): at 10^5 files and
thousands of ranks, every rank doing it is a metadata storm on a parallel file system. With a
communicator, rank 0 lists the files (:func:`on_root`), each rank scans a contiguous share of
them (:func:`shared_scan`) and an allgather gives every rank the whole table, in file order.
One process scans everything itself, as before.

What a share's scan yields is a :class:`ScanPart`: per file its length, where each key is
stored and its size. A part that comes from another rank is untrusted input, as a file is:
:func:`check_part` checks its types, shapes and values (lengths, offsets within the file)
before it is used, and :func:`merge_parts` checks that every file holds the same keys, shapes
and dtypes, naming the first file that differs. A scan error on any rank (a corrupt file) is
raised, with its message, on every rank (each checks every part alike); any other failure
while scanning aborts the job (:func:`solar.dist.abort_job_on_error`), so no rank waits in a
collective for a dead peer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from solar._process import wait_quietly
from solar.dist import abort_job_on_error
from solar.errors import SolarError

T = TypeVar("T")

# How ranks share a scan: "split" (each rank scans a share, allgather) or "root" (rank 0 scans
# everything, broadcast); "every" (each rank scans every file, as before) is for comparison.
# Measured by bench/scan_bench.py: split is the fastest (see its docstring).
SPLIT, ROOT, EVERY = "split", "root", "every"
SCAN_MODE = SPLIT


@dataclass(frozen=True)
class ScanPart:
    """What a scan of consecutive files found.

    ``keys``: (name, per-sample shape, dtype string) of each key in the part's first file
    (empty for no files); ``lengths``: samples per file; ``where[f, k]``: (byte offset or -1,
    rows per chunk or 0, 1 if solar decodes its chunks) of key k in file f; ``sizes[f, j]``:
    bytes of file f (one column for HDF5; one per key for .npy, whose keys have files each);
    ``times[f, j]``: their modification and status change times in ns (None: not recorded).
    With the sizes they are the files' identity as described (solar/io/identity.py).
    """

    keys: tuple[tuple[str, tuple[int, ...], str], ...]
    lengths: np.ndarray  # (files,) int64
    where: np.ndarray  # (files, keys, 3) int64
    sizes: np.ndarray  # (files, 1 or keys) int64
    times: np.ndarray | None = None  # (files, 1 or keys, 2) int64: mtime, ctime


def empty_part(nkeys: int, size_columns: int) -> ScanPart:
    """The part of no files."""
    z = np.zeros(0, np.int64)
    sizes = np.zeros((0, size_columns), np.int64)
    times = np.zeros((0, size_columns, 2), np.int64)
    return ScanPart((), z, np.zeros((0, nkeys, 3), np.int64), sizes, times)


def share(n: int, rank: int, world: int) -> tuple[int, int]:
    """Rank ``rank``'s contiguous share ``[lo, hi)`` of ``n`` files."""
    return n * rank // world, n * (rank + 1) // world


def on_root(comm: Any, make: Callable[[], T]) -> T:
    """``make()`` run on rank 0 only and broadcast (a collective); its SolarError is raised on
    every rank with the same message. Without a communicator, just ``make()``."""
    if comm is None or comm.Get_size() <= 1:
        return make()
    out: Any = None
    with abort_job_on_error(comm):
        if comm.Get_rank() == 0:
            try:
                out = ("ok", make())
            except SolarError as exc:
                out = ("error", str(exc))
        wait_quietly(comm)
        out = comm.bcast(out, root=0)
    if not (isinstance(out, tuple) and len(out) == 2 and out[0] in ("ok", "error")):
        raise SolarError("rank 0 sent a malformed description of the dataset's files")
    if out[0] == "error":
        raise SolarError(str(out[1]))
    return out[1]


def shared_scan(
    comm: Any,
    n: int,
    scan: Callable[[int, int], ScanPart],
    check: Callable[[ScanPart, int, int], None],
) -> list[ScanPart]:
    """Every rank's parts of a scan of ``n`` files, in file order: ``scan(lo, hi)`` scans files
    ``[lo, hi)``; parts received from other ranks pass ``check(part, lo, hi)`` first."""
    if comm is None or comm.Get_size() <= 1:
        return [scan(0, n)]
    mode = SCAN_MODE  # (bench/scan_bench.py sets it to compare the three)
    if mode == EVERY:
        return [scan(0, n)]
    rank, world = comm.Get_rank(), comm.Get_size()
    # Only the scan and the collective can fail on one rank alone (an unexpected error): that
    # takes the job down. Every rank checks the same parts the same way, so a bad part or a
    # peer's scan error is raised on all of them alike.
    with abort_job_on_error(comm):
        if mode == ROOT:
            mine = _attempt(scan, 0, n) if rank == 0 else None
            wait_quietly(comm)
            got = [comm.bcast(mine, root=0)]
            spans = [(0, n)]
        else:
            mine = _attempt(scan, *share(n, rank, world))
            wait_quietly(comm)
            got = comm.allgather(mine)
            spans = [share(n, r, world) for r in range(world)]
    if not isinstance(got, list) or len(got) != len(spans):
        raise SolarError(f"scan: {len(got)} parts for {len(spans)} ranks")
    parts = []
    for (lo, hi), item in zip(spans, got, strict=True):
        if not (isinstance(item, tuple) and len(item) == 2 and item[0] in ("ok", "error")):
            raise SolarError(f"scan: a malformed answer for files {lo}..{hi - 1}")
        if item[0] == "error":
            raise SolarError(str(item[1]))
        if not isinstance(item[1], ScanPart):
            raise SolarError(f"scan: a malformed part for files {lo}..{hi - 1}")
        check(item[1], lo, hi)
        parts.append(item[1])
    return parts


def _attempt(scan: Callable[[int, int], ScanPart], lo: int, hi: int) -> tuple[str, Any]:
    try:
        return "ok", scan(lo, hi)
    except SolarError as exc:
        return "error", str(exc)


def check_part(
    part: ScanPart,
    files: Sequence[Path],
    lo: int,
    hi: int,
    nkeys: int,
    size_columns: int,
    one_per_file: bool,
) -> None:
    """Refuse a part (another rank's scan of ``files[lo:hi]``) whose table is malformed or
    inconsistent: wrong shapes or types, negative lengths, a dataset past its file's end."""
    m = hi - lo
    where = f"scan of {files[lo] if m else 'no files'}" + (f" .. {files[hi - 1]}" if m > 1 else "")

    def bad(what: str) -> SolarError:
        return SolarError(f"{where}: {what} (the table from another rank is malformed)")

    for name, a, shape in (("lengths", part.lengths, (m,)), ("where", part.where, (m, nkeys, 3)),
                           ("sizes", part.sizes, (m, size_columns))):  # fmt: skip
        if not isinstance(a, np.ndarray) or a.dtype != np.int64 or a.shape != shape:
            raise bad(f"{name} is not int64 {shape}")
    times = part.times
    if times is not None and (
        not isinstance(times, np.ndarray) or times.dtype != np.int64
        or times.shape != (m, size_columns, 2)
    ):  # fmt: skip
        raise bad(f"times is not int64 {(m, size_columns, 2)}")
    if not isinstance(part.keys, tuple) or len(part.keys) != (nkeys if m else 0):
        raise bad(f"{len(part.keys) if isinstance(part.keys, tuple) else '?'} keys, not {nkeys}")
    row_bytes = np.zeros(nkeys, np.int64)
    for k, key in enumerate(part.keys):
        name, shape, dtype = _checked_key(key, bad)
        row_bytes[k] = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if m == 0:
        return
    if np.any(part.lengths < 0) or (one_per_file and np.any(part.lengths != 1)):
        raise bad("a file's sample count is out of range")
    offsets, chunk_rows, decoded = part.where[..., 0], part.where[..., 1], part.where[..., 2]
    if np.any(offsets < -1) or np.any(chunk_rows < 0) or np.any((decoded != 0) & (decoded != 1)):
        raise bad("a storage record is out of range")
    if np.any(part.sizes < 0):
        raise bad("a negative file size")
    col = np.arange(nkeys) if size_columns > 1 else np.zeros(nkeys, np.int64)
    end = offsets + part.lengths[:, None] * row_bytes[None, :]
    past = (offsets >= 0) & (end > part.sizes[:, col])
    if np.any(past):
        f, k = (int(i) for i in np.argwhere(past)[0])
        raise bad(f"key {part.keys[k][0]!r} of {files[lo + f]} ends past the file's end")


def _checked_key(key: Any, bad: Callable[[str], SolarError]) -> tuple[str, tuple, np.dtype]:
    try:
        name, shape, dtype_str = key
        shape = tuple(int(s) for s in shape)
        dtype = np.dtype(dtype_str)
    except (TypeError, ValueError):
        raise bad("a malformed key record") from None
    if not isinstance(name, str) or any(s < 0 for s in shape) or dtype.kind not in "biufc":
        raise bad(f"a malformed key record {key!r}")
    return name, shape, dtype


def merge_parts(
    parts: Sequence[ScanPart], files: Sequence[Path], nkeys: int, size_columns: int
) -> tuple[list[tuple[str, tuple[int, ...], str]], ScanPart]:
    """The whole table from parts in file order; every part's keys must be the first's (the
    error names the part's first file and the dataset's first file)."""
    keys = None
    at = 0
    for p in parts:
        if p.keys:
            if keys is None:
                keys = p.keys
            else:
                for a, b in zip(keys, p.keys, strict=True):
                    if a != b:
                        raise SolarError(
                            f"{files[at]}: key {b[0]!r} holds {b[1]} {np.dtype(b[2])} samples, "
                            f"but {files[0]} holds {a[1]} {np.dtype(a[2])}"
                        )
        at += p.lengths.size
    whole = ScanPart(
        keys or (),
        np.concatenate([p.lengths for p in parts]) if parts else np.zeros(0, np.int64),
        np.concatenate([p.where for p in parts]) if parts else np.zeros((0, nkeys, 3), np.int64),
        np.concatenate([p.sizes for p in parts])
        if parts
        else np.zeros((0, size_columns), np.int64),
        np.concatenate([p.times for p in parts])
        if parts and all(p.times is not None for p in parts)
        else None,
    )
    return list(keys or ()), whole

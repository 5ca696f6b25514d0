"""The I/O plan: typed read tasks, built by pure functions and executed by :class:`Reader`.

:func:`plan_reads` turns "read these samples into these rows" into tasks that name files, byte
offsets and destination rows; it opens nothing, so it is tested without files. A new way of
reading (a local tier, a chunk decoder) is a new task type here and one case in the reader.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from solar.errors import SolarError

IOV_MAX = min(os.sysconf("SC_IOV_MAX"), 1024) if hasattr(os, "sysconf") else 1024
RUN_MAX_BYTES = 8 * 2**20  # largest single read; longer runs are cut so threads share them


@dataclass(frozen=True)
class Layout:
    """Where one key of one file lives: a byte offset, or None to read through h5py."""

    offset: int | None
    row_bytes: int
    chunk_rows: int  # samples per chunk along the first dimension; 0: not chunked


@dataclass(frozen=True)
class Runs:
    """Runs of adjacent samples in a request, cut at ``max_rows``.

    ``order`` sorts the request by sample; run j covers sorted entries
    ``[starts[j], starts[j] + counts[j])``, whose samples are consecutive.
    """

    order: np.ndarray  # (n,)
    starts: np.ndarray  # (runs,)
    counts: np.ndarray  # (runs,)


def coalesce_runs(local: np.ndarray, max_rows: int) -> Runs:
    """Group sample indices (within one file) into runs of adjacent samples, each at most
    ``max_rows`` long; a repeated index starts a new run."""
    order = np.argsort(local, kind="stable")
    srt = local[order]
    new_run = np.ones(srt.size, np.bool_)
    new_run[1:] = np.diff(srt) != 1
    run_start = np.flatnonzero(new_run)
    in_run = np.arange(srt.size) - run_start[np.cumsum(new_run) - 1]
    starts = np.flatnonzero(new_run | (in_run % max(1, max_rows) == 0))
    counts = np.diff(np.append(starts, srt.size))
    return Runs(order, starts, counts)


@dataclass(frozen=True)
class PreadvRuns:
    """Buffered reads: one ``preadv`` per run, scattering rows of ``dest`` through ``iov``."""

    file: int
    dest: np.ndarray  # (batch rows, row bytes) uint8
    rows: np.ndarray  # (n,) destination row of each sorted entry
    iov: np.ndarray  # (n, 2) uint64: (address, length) of each sorted entry's row
    starts: np.ndarray  # (runs,) first sorted entry of each run
    counts: np.ndarray  # (runs,) rows in each run
    offsets: np.ndarray  # (runs,) file byte offset of each run

    @property
    def requests(self) -> int:
        return int(self.starts.size)


@dataclass(frozen=True)
class DirectRun:
    """One ``O_DIRECT`` read of a run through an aligned bounce buffer, then a row copy."""

    file: int
    offset: int
    dest: np.ndarray  # (batch rows, row bytes) uint8
    rows: np.ndarray  # (count,) destination rows, in file order

    requests = 1


@dataclass(frozen=True)
class H5Rows:
    """Rows of a chunked, compressed or non-native dataset, read through h5py."""

    file: int
    key: int
    local: np.ndarray  # (n,) sample index within the file
    rows: np.ndarray  # (n,) destination rows
    out: np.ndarray  # (batch rows, *sample shape) the destination array
    chunk_rows: int

    @property
    def requests(self) -> int:
        """Chunks touched (one request each), or one per sample when not chunked."""
        if self.chunk_rows == 0:
            return int(self.local.size)
        return int(np.unique(self.local // self.chunk_rows).size)


ReadTask = PreadvRuns | DirectRun | H5Rows


def plan_reads(
    layouts: list[list[Layout]],
    file_starts: np.ndarray,
    samples: np.ndarray,
    out: list[np.ndarray],
    rows: np.ndarray,
    *,
    direct_io: bool,
    groups: int,
) -> list[ReadTask]:
    """The tasks that read ``samples[j]`` into ``out[key][rows[j]]`` for every key.

    ``file_starts`` (files + 1,) holds the first global sample id of each file. Buffered runs
    of one file and key are dealt over ``groups`` tasks, so that threads share them.
    """
    samples = np.asarray(samples, np.int64)
    rows = np.asarray(rows, np.int64)
    if samples.size == 0:
        return []
    if samples.min() < 0 or samples.max() >= file_starts[-1]:
        raise SolarError(f"sample id out of range 0..{file_starts[-1] - 1}")
    for a in out:
        if rows.min() < 0 or rows.max() >= a.shape[0]:
            raise SolarError(f"destination row out of range 0..{a.shape[0] - 1}")
    file_index = np.searchsorted(file_starts, samples, side="right") - 1
    local = samples - file_starts[file_index]
    tasks: list[ReadTask] = []
    for f in np.unique(file_index).tolist():
        sel = np.flatnonzero(file_index == f)
        for k, layout in enumerate(layouts[f]):
            if layout.offset is None:
                tasks.append(H5Rows(f, k, local[sel], rows[sel], out[k], layout.chunk_rows))
                continue
            if not out[k].flags.c_contiguous or out[k][:1].nbytes not in (0, layout.row_bytes):
                raise SolarError(
                    f"destination for key {k} must be C-contiguous rows of {layout.row_bytes} B"
                )
            dest = out[k].reshape(out[k].shape[0], -1).view(np.uint8)
            tasks.extend(_offset_tasks(f, layout, local[sel], rows[sel], dest, direct_io, groups))
    return tasks


def _offset_tasks(
    f: int,
    layout: Layout,
    local: np.ndarray,
    rows: np.ndarray,
    dest: np.ndarray,
    direct_io: bool,
    groups: int,
) -> list[ReadTask]:
    assert layout.offset is not None
    row_bytes = layout.row_bytes
    runs = coalesce_runs(local, min(IOV_MAX, RUN_MAX_BYTES // max(1, row_bytes)))
    srt, rows = local[runs.order], rows[runs.order]
    offsets = layout.offset + srt[runs.starts] * row_bytes
    if direct_io:
        return [
            DirectRun(f, int(off), dest, rows[a : a + n])
            for off, a, n in zip(offsets.tolist(), runs.starts, runs.counts, strict=True)
        ]
    iov = np.empty((rows.size, 2), np.uint64)
    iov[:, 0] = dest.ctypes.data + rows.astype(np.uint64) * np.uint64(row_bytes)
    iov[:, 1] = row_bytes
    g = min(groups, runs.starts.size)
    return [
        PreadvRuns(f, dest, rows, iov, runs.starts[i::g], runs.counts[i::g], offsets[i::g])
        for i in range(g)
    ]

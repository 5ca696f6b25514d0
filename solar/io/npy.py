""".npy sources: one array per file, served by byte offset after the header.

A key is a list of ``.npy`` files (paths, globs or directories, sorted); each file holds one
sample (``one_per_file``) or many along axis 0. Several keys pair their files in order: file
``i`` of every key holds the same samples. Only the header of each file is read
(``numpy.lib.format``): shape, dtype, order and where the data start. :func:`read_npy_header`
is solar's one parser of untrusted .npy headers (the graph converter's and loader's too).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from tokenize import TokenError
from typing import Any

import numpy as np
from numpy.lib import format as npformat

from solar.errors import SolarError, first_line, truncated
from solar.io.identity import CTIME, MTIME, stamp
from solar.io.info import DatasetInfo, KeyInfo, StoredLayout
from solar.io.scan import ScanPart, check_part, empty_part, merge_parts, shared_scan


@dataclass(frozen=True)
class NpyHeader:
    """A ``.npy`` file's header, read and checked (:func:`read_npy_header`)."""

    shape: tuple[int, ...]
    dtype: np.dtype
    offset: int  # where the data start
    size: int  # the file's bytes (at least offset + the data's)
    fortran: bool  # the data are in Fortran (column-major) order


def read_npy_header(path: Path) -> NpyHeader:
    """The header of the ``.npy`` file at ``path``, which is untrusted: the one parser of
    solar's .npy readers. A one-line SolarError naming the file unless it is a ``.npy`` file
    of a known version whose header parses, of numbers (no objects, no fields), of dimensions
    >= 0, its data all in the file. Byte order and Fortran order are the reader's to refuse
    (:func:`npy_header`) or to take (solar/graph/ingest.py converts them)."""
    try:
        with open(path, "rb") as fh:
            version = npformat.read_magic(fh)
            if version == (1, 0):
                shape, fortran, dtype = npformat.read_array_header_1_0(fh)
            elif version in ((2, 0), (3, 0)):
                shape, fortran, dtype = npformat.read_array_header_2_0(fh)
            else:
                raise ValueError(f"unknown .npy version {version}")
            offset = fh.tell()
    except FileNotFoundError:
        raise SolarError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise SolarError(f"{path}: is a directory, not a .npy file") from None
    # (numpy parses the header as a Python literal: an odd one raises any of these.)
    except (OSError, ValueError, TypeError, SyntaxError, RecursionError, TokenError) as exc:
        line = first_line(exc)
        raise SolarError(f"{path}: not a readable .npy file ({line})") from None
    dtype = np.dtype(dtype)
    if dtype.hasobject or dtype.kind not in "biufc" or dtype.fields is not None:
        raise SolarError(f"{path}: dtype {dtype} is not an array of numbers")
    # Every dimension, and the bytes of every row whatever the other dimensions (one may be
    # 0), must fit an int64: the readers index with them.
    if any(n < 0 for n in shape) or math.prod(max(1, n) for n in shape) * dtype.itemsize >= 2**63:
        raise SolarError(f"{path}: not a readable .npy file (shape {tuple(shape)})")
    need = offset + math.prod(shape) * dtype.itemsize  # (Python's ints: no overflow)
    size = os.path.getsize(path)
    if size < need:
        raise truncated(path, "the array", need, size)
    return NpyHeader(tuple(int(n) for n in shape), dtype, offset, size, bool(fortran))


def npy_header(path: Path) -> tuple[tuple[int, ...], np.dtype, int, int]:
    """(shape, dtype, data offset, file size) of a .npy file served by offset; a one-line
    SolarError if it cannot be (:func:`read_npy_header`'s refusals, and Fortran order or a
    byte order not this machine's: its bytes are served as they lie)."""
    h = read_npy_header(path)
    if h.fortran and len(h.shape) > 1:
        raise SolarError(f"{path}: Fortran-ordered array; save it C-ordered (np.ascontiguousarray)")
    if not h.dtype.isnative:  # read by offset into native rows, its bytes would be served swapped
        raise SolarError(f"{path}: byte order {h.dtype.str} is not this machine's; save it "
                         "native (arr.astype(arr.dtype.newbyteorder('=')))")  # fmt: skip
    return h.shape, h.dtype, h.offset, h.size


def describe_npy(
    keys: Mapping[str, Sequence[Path]], *, one_per_file: bool = False, comm: Any = None
) -> DatasetInfo:
    """The sample space of .npy files: ``keys`` maps each key to its files (already expanded).
    With a communicator ``comm`` each rank reads a share of the headers (:mod:`solar.io.scan`).
    """
    if not keys:
        raise SolarError("no .npy keys given")
    names = list(keys)
    counts = {k: len(v) for k, v in keys.items()}
    if len(set(counts.values())) != 1:
        raise SolarError(f".npy keys have different numbers of files: {counts}")
    paths = [[p if isinstance(p, Path) else Path(p) for p in keys[name]] for name in names]
    nfiles, nkeys = len(paths[0]), len(names)

    def check(part: ScanPart, lo: int, hi: int) -> None:
        check_part(part, paths[0], lo, hi, nkeys, nkeys, one_per_file)

    def scan(lo: int, hi: int) -> ScanPart:
        return scan_npy(names, [p[lo:hi] for p in paths], one_per_file)

    parts = shared_scan(comm, nfiles, scan, check)
    found, whole = merge_parts(parts, paths[0], nkeys, nkeys)
    stored = StoredLayout(
        whole.where[..., 0], np.zeros((nfiles, nkeys), np.int64),
        np.zeros((nfiles, nkeys), bool), whole.sizes, whole.times,
    )  # fmt: skip
    infos = tuple(KeyInfo(n, s, np.dtype(d)) for n, s, d in found)
    key_files = tuple(tuple(p) for p in paths)
    return DatasetInfo(
        key_files[0], infos, tuple(int(n) for n in whole.lengths), format="npy",
        one_per_file=one_per_file, key_files=key_files, stored=stored,
    )  # fmt: skip


def scan_npy(names: list[str], paths: list[list[Path]], one_per_file: bool) -> ScanPart:
    """Read the headers of files ``paths[k][i]`` (key k's i-th file): every key's files must
    hold the same per-sample shape and dtype as its first, file i of every key the same count."""
    nfiles, nkeys = len(paths[0]), len(names)
    if nfiles == 0:
        return empty_part(nkeys, nkeys)
    where = np.zeros((nfiles, nkeys, 3), np.int64)
    sizes = np.empty((nfiles, nkeys), np.int64)
    times = np.empty((nfiles, nkeys, 2), np.int64)
    lengths = np.empty(nfiles, np.int64)
    infos: list[tuple[str, tuple[int, ...], str]] = []
    for k, name in enumerate(names):
        want: tuple[tuple[int, ...], np.dtype] | None = None
        for i, path in enumerate(paths[k]):
            shape, dtype, offset, sizes[i, k] = npy_header(path)
            times[i, k] = stamp(os.stat(path))[MTIME : CTIME + 1]  # its identity as described
            if not one_per_file and not shape:
                raise SolarError(f"{path}: a scalar (one sample per file? use "
                                 "reader=ReaderConfig(one_per_file=True))")  # fmt: skip
            sample = shape if one_per_file else shape[1:]
            n = 1 if one_per_file else shape[0]
            if want is None:
                want = (sample, dtype)
                infos.append((name, sample, dtype.str))
            elif want != (sample, dtype):
                raise SolarError(
                    f"{path}: key {name!r} holds {sample} {dtype} samples, "
                    f"but {paths[k][0]} holds {want[0]} {want[1]}"
                )
            if k == 0:
                lengths[i] = n
            elif lengths[i] != n:
                raise SolarError(
                    f"{path}: key {name!r} has {n} samples but {paths[0][i]} "
                    f"({names[0]!r}) has {lengths[i]}"
                )
            where[i, k, 0] = offset
    return ScanPart(tuple(infos), lengths, where, sizes, times)

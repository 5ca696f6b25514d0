""".npy sources: one array per file, served by byte offset after the header.

A key is a list of ``.npy`` files (paths, globs or directories, sorted); each file holds one
sample (``one_per_file``) or many along axis 0. Several keys pair their files in order: file
``i`` of every key holds the same samples. Only the header of each file is read
(``numpy.lib.format``): shape, dtype, order and where the data start.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from numpy.lib import format as npformat

from solar.errors import SolarError, first_line, truncated
from solar.io.hdf5 import DatasetInfo, KeyInfo, StoredLayout


def npy_header(path: Path) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, dtype, data offset) of a .npy file; a one-line SolarError if it cannot be
    served by offset (not .npy, Fortran order, objects or structured dtypes, truncated)."""
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
    except (OSError, ValueError, SyntaxError) as exc:
        line = first_line(exc)
        raise SolarError(f"{path}: not a readable .npy file ({line})") from None
    if fortran and len(shape) > 1:
        raise SolarError(f"{path}: Fortran-ordered array; save it C-ordered (np.ascontiguousarray)")
    if dtype.hasobject or dtype.kind not in "biufc" or dtype.fields is not None:
        raise SolarError(f"{path}: dtype {dtype} is not an array of numbers")
    need = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    size = os.path.getsize(path)
    if size < need:
        raise truncated(path, "the array", need, size)
    return tuple(shape), dtype, offset


def describe_npy(keys: Mapping[str, Sequence[Path]], *, one_per_file: bool = False) -> DatasetInfo:
    """The sample space of .npy files: ``keys`` maps each key to its files (already expanded)."""
    if not keys:
        raise SolarError("no .npy keys given")
    names = list(keys)
    counts = {k: len(v) for k, v in keys.items()}
    if len(set(counts.values())) != 1:
        raise SolarError(f".npy keys have different numbers of files: {counts}")
    nfiles = counts[names[0]]
    offsets = np.empty((nfiles, len(names)), np.int64)
    lengths = np.empty(nfiles, np.int64)
    infos: list[KeyInfo] = []
    for k, name in enumerate(names):
        want: tuple[tuple[int, ...], np.dtype] | None = None
        for i, path in enumerate(keys[name]):
            shape, dtype, offset = npy_header(Path(path))
            if not one_per_file and not shape:
                raise SolarError(f"{path}: a scalar (one sample per file? use one_per_file=True)")
            sample = shape if one_per_file else shape[1:]
            n = 1 if one_per_file else shape[0]
            if want is None:
                want = (sample, dtype)
                infos.append(KeyInfo(name, sample, dtype))
            elif want != (sample, dtype):
                raise SolarError(
                    f"{path}: key {name!r} holds {sample} {dtype} samples, "
                    f"but {keys[name][0]} holds {want[0]} {want[1]}"
                )
            if k == 0:
                lengths[i] = n
            elif lengths[i] != n:
                raise SolarError(
                    f"{path}: key {name!r} has {n} samples but {keys[names[0]][i]} "
                    f"({names[0]!r}) has {lengths[i]}"
                )
            offsets[i, k] = offset
    zeros = np.zeros_like(offsets)
    stored = StoredLayout(offsets, zeros, zeros.astype(bool))
    key_files = tuple(tuple(Path(p) for p in keys[name]) for name in names)
    return DatasetInfo(
        key_files[0], tuple(infos), tuple(int(n) for n in lengths), format="npy",
        one_per_file=one_per_file, key_files=key_files, stored=stored,
    )  # fmt: skip

"""Dataset discovery: which files and keys make the sample space, and what they hold.

Samples are rows along the first dimension of one or more datasets (keys) that share that
length; several files concatenate into one sample space in the order given. How the reader
reads each key (at an offset, through solar's chunk decoder, or through h5py) is decided here
once, by :func:`read_path`, and recorded in ``DatasetInfo.stored``.
"""

from __future__ import annotations

import glob
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from solar.errors import SolarError, first_line, truncated
from solar.io.codecs import Decoder, decoder_for, describe_decoding
from solar.io.identity import CTIME, stamp
from solar.io.info import DatasetInfo, KeyInfo, StoredLayout
from solar.io.scan import ScanPart, check_part, empty_part, merge_parts, on_root, shared_scan


def expand_paths(paths: Sequence[str | os.PathLike]) -> list[Path]:
    """Expand globs (sorted) in ``paths``; a pattern that matches nothing is an error."""
    out: list[Path] = []
    for p in paths:
        s = os.fspath(p)
        if glob.has_magic(s) and not os.path.exists(s):  # (no stat per plain name)
            matches = sorted(glob.glob(s))
            if not matches:
                raise SolarError(f"{s}: no file matches this pattern")
            out.extend(Path(m) for m in matches)
        else:
            out.append(p if isinstance(p, Path) else Path(s))  # (pathlib parses are slow)
    if not out:
        raise SolarError("no data files given")
    return out


def open_h5(path: Path) -> h5py.File:
    """Open an HDF5 file read-only, turning every failure into a one-line SolarError."""
    try:
        return h5py.File(path, "r")  # the common case first: no checks ahead (a scan opens many)
    except OSError as exc:
        failure = exc
    if not path.exists():
        raise SolarError(f"{path}: no such file")
    if path.is_dir():
        raise SolarError(f"{path}: is a directory, not an HDF5 file")
    try:
        if not h5py.is_hdf5(path):
            raise SolarError(f"{path}: not an HDF5 file")
    except OSError:
        pass
    raise SolarError(f"{path}: truncated or corrupt HDF5 file ({first_line(failure)})")


def describe(
    paths: Sequence[str | os.PathLike],
    keys: list[str] | None = None,
    *,
    one_per_file: bool = False,
    comm: Any = None,
) -> DatasetInfo:
    """Check the files and keys and describe the sample space they make.

    Without ``keys``, every dataset of the first file is a key, and every file must have them.
    With ``one_per_file`` each file's datasets are one sample. Each file is opened once per
    job: with a communicator ``comm`` each rank opens a share and the ranks exchange what they
    found (:mod:`solar.io.scan`). Where every key is stored is recorded then
    (``DatasetInfo.stored``), so a reader opens no file to plan its reads. Many small files
    read as many samples each get a warning.
    """
    files = expand_paths(paths)
    names = list(keys) if keys else on_root(comm, lambda: _first_datasets(files[0]))

    def check(part: ScanPart, lo: int, hi: int) -> None:
        check_part(part, files, lo, hi, len(names), 1, one_per_file)

    parts = shared_scan(
        comm, len(files), lambda lo, hi: scan_hdf5(files[lo:hi], names, one_per_file), check
    )
    found, whole = merge_parts(parts, files, len(names), 1)
    lengths = [int(n) for n in whole.lengths]
    if not one_per_file and len(files) > 8 and max(lengths) <= 4:
        warnings.warn(
            f"{len(files)} HDF5 files hold at most {max(lengths)} samples each along their "
            "first axis: if each file is one sample, pass "
            "reader=ReaderConfig(one_per_file=True) (--one-per-file)",
            stacklevel=2,
        )
    table = whole.where
    stored = StoredLayout(
        table[..., 0], table[..., 1], table[..., 2].astype(bool), whole.sizes, whole.times
    )
    infos = tuple(KeyInfo(n, s, np.dtype(d)) for n, s, d in found)
    return DatasetInfo(
        tuple(files), infos, tuple(lengths), one_per_file=one_per_file, stored=stored
    )


def _first_datasets(path: Path) -> list[str]:
    """Every dataset of ``path`` (the keys when none are given)."""
    try:
        with open_h5(path) as f:
            return _all_datasets(f, path)
    except (OSError, RuntimeError, KeyError, ValueError, TypeError) as exc:
        raise SolarError(f"{path}: corrupt HDF5 file ({first_line(exc)})") from None


def scan_hdf5(files: Sequence[Path], names: list[str], one_per_file: bool) -> ScanPart:
    """Open each of ``files`` once: its sample count, where each key is stored, its size; each
    key's shape and dtype must be the first file's."""
    infos: list[KeyInfo] | None = None
    lengths = []
    where: list[list[tuple[int, int, bool]]] = []
    sizes = []
    times = []
    encoded = [name.encode() for name in names]
    for path in files:
        try:
            size, *time = stamp(os.stat(path))[: CTIME + 1]  # its identity as described
        except OSError:
            size, time = -1, [-1, -1]  # (open_h5 says why)
        plain = _scan_plain(path, encoded, names, one_per_file, size) if size >= 0 else None
        if plain is not None:
            n, found, stored = plain
            where.append(stored)
        else:
            try:
                with open_h5(path) as f:
                    size, *time = stamp(os.stat(path))[: CTIME + 1]
                    n, found = _check_keys(f, path, names, one_per_file, size)
                    where.append([_stored(f[name]) for name in names])
            except (OSError, RuntimeError, KeyError, ValueError, TypeError) as exc:
                # h5py's errors on damaged files come in many types; all mean the same here.
                raise SolarError(f"{path}: corrupt HDF5 file ({first_line(exc)})") from None
        if infos is None:
            infos = found
        for a, b in zip(infos, found, strict=True):
            if (a.sample_shape, a.dtype) != (b.sample_shape, b.dtype):
                raise SolarError(
                    f"{path}: key {b.name!r} holds {b.sample_shape} {b.dtype} samples, "
                    f"but {files[0]} holds {a.sample_shape} {a.dtype}"
                )
        lengths.append(n)
        sizes.append(size)
        times.append(time)
    if not files:
        return empty_part(len(names), 1)
    keys = tuple((k.name, k.sample_shape, k.dtype.str) for k in infos or ())
    table = np.array(where, np.int64).reshape(len(files), len(names), 3)
    return ScanPart(
        keys, np.array(lengths, np.int64), table, np.array(sizes, np.int64).reshape(-1, 1),
        np.array(times, np.int64).reshape(-1, 1, 2),
    )  # fmt: skip


def open_fid(path: Path) -> h5py.h5f.FileID:
    """``path`` opened read-only with h5py's low-level API (a scan's cheap open)."""
    return h5py.h5f.open(os.fsencode(path), h5py.h5f.ACC_RDONLY)


def _scan_plain(
    path: Path, encoded: list[bytes], names: list[str], one_per_file: bool, size: int
) -> tuple[int, list[KeyInfo], list[tuple[int, int, bool]]] | None:
    """The scan of one file whose keys are all plain (contiguous, written, native numbers,
    within the file), through h5py's low-level calls: a third of the high-level objects' cost
    a file (800 one-sample files: 0.07 s against 0.20 s). ``None`` for anything else, which
    :func:`scan_hdf5` then scans (and explains) the general way."""
    try:
        fid = open_fid(path)
    except (OSError, RuntimeError, ValueError, TypeError):  # the general way says why
        return None
    try:
        infos = []
        stored = []
        first = -1
        for name, raw in zip(names, encoded, strict=True):
            dset = h5py.h5d.open(fid, raw)
            try:
                dtype, shape = dset.dtype, dset.shape
                if (
                    dtype.kind not in "biufc"
                    or dtype.fields is not None
                    or not dtype.isnative
                    or (not shape and not one_per_file)
                    or dset.get_create_plist().get_layout() != h5py.h5d.CONTIGUOUS
                ):
                    return None
                offset = dset.get_offset()
                end = -1 if offset is None else offset + dset.get_storage_size()
            finally:
                dset.close()
            n = 1 if one_per_file else shape[0]
            if offset is None or end > size or int(np.prod(shape)) == 0 or first not in (-1, n):
                return None
            first = n
            infos.append(KeyInfo(name, tuple(shape if one_per_file else shape[1:]), dtype))
            stored.append((int(offset), 0, False))
        return (first, infos, stored) if infos else None
    except (OSError, RuntimeError, KeyError, ValueError, TypeError):  # (the general way)
        return None
    finally:
        fid.close()


def _stored(dset: h5py.Dataset) -> tuple[int, int, bool]:
    """(offset or -1, rows per chunk or 0, chunks solar decodes) of one dataset."""
    path, _ = read_path(dset)
    offset = int(dset.id.get_offset()) if path == "offset" else -1
    chunk_rows = int(dset.chunks[0]) if dset.chunks is not None and dset.ndim else 0
    return offset, chunk_rows, path == "chunks"


def read_path(dset: h5py.Dataset) -> tuple[str, str]:
    """How a Reader reads a dataset, and why (one line): ``"offset"`` (preadv at computed
    offsets), ``"chunks"`` (solar reads and decodes the chunks) or ``"h5py"``."""
    numeric = dset.dtype.kind in "biufc" and dset.dtype.fields is None
    if not numeric:
        return "h5py", f"dtype {dset.dtype} is not numbers"
    if dset.chunks is None:
        if dset.dtype.isnative and dset.id.get_offset() is not None:
            return "offset", "contiguous and native: preadv at computed offsets"
        if not dset.dtype.isnative:
            return "h5py", "contiguous with non-native byte order: h5py converts it"
        return "h5py", "not stored contiguously at one offset (never written, compact, ...)"
    found = decoder_for(dset)
    how = describe_decoding(dset, found)
    if not isinstance(found, Decoder):
        return "h5py", how  # "h5py fallback: <the filter's problem>"
    # Either byte order: scattering a chunk into rows converts to native order.
    return "chunks", f"{how} on the reader's threads"


def dataset_names(f: h5py.File) -> list[str]:
    """Every dataset in the file, at any depth, sorted."""
    names: list[str] = []
    f.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
    return sorted(names)


def _all_datasets(f: h5py.File, path: Path) -> list[str]:
    names = dataset_names(f)
    if not names:
        raise SolarError(f"{path}: holds no datasets")
    return names


def _check_keys(
    f: h5py.File, path: Path, names: list[str], one_per_file: bool = False, size: int = -1
) -> tuple[int, list[KeyInfo]]:
    size = os.path.getsize(path) if size < 0 else size
    first: tuple[str, int] | None = None
    infos = []
    for name in names:
        obj = f.get(name)
        if not isinstance(obj, h5py.Dataset):
            have = ", ".join(_all_datasets(f, path)[:8])
            what = "no dataset" if obj is None else "a group, not a dataset, at"
            raise SolarError(f"{path}: {what} key {name!r} (datasets: {have})")
        if obj.ndim == 0 and not one_per_file:
            raise SolarError(
                f"{path}: key {name!r} is a scalar, not an array of samples "
                "(one sample per file? use --one-per-file)"
            )
        if obj.dtype.kind not in "biufc" or obj.dtype.fields is not None:
            raise SolarError(
                f"{path}: key {name!r} has dtype {obj.dtype}; solar serves arrays of numbers"
            )
        n = 1 if one_per_file else obj.shape[0]
        if first is None:
            first = (name, n)
        elif n != first[1]:
            raise SolarError(
                f"{path}: key {name!r} has {n} samples but {first[0]!r} has {first[1]}"
            )
        _check_contiguous_in_file(obj, path, name, size)
        sample_shape = obj.shape if one_per_file else obj.shape[1:]
        infos.append(KeyInfo(name, tuple(sample_shape), obj.dtype))
    if first is None:
        raise SolarError(f"{path}: no keys given")
    return first[1], infos


def _check_contiguous_in_file(dset: h5py.Dataset, path: Path, name: str, file_size: int) -> None:
    """A contiguous dataset whose bytes run past the end of the file is truncated."""
    if dset.chunks is not None or dset.size == 0:
        return
    offset = dset.id.get_offset()
    if offset is None:
        return  # never written: HDF5 reads it as fill values
    end = offset + dset.id.get_storage_size()
    if end > file_size:
        raise truncated(path, f"key {name!r}", end, file_size)

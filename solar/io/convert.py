"""Rewrite any HDF5 or .npy layout as one contiguous, uncompressed, aligned file (``convert``).

Sources are HDF5 files (many samples per file along the first dimension, or one sample per
file with ``one_per_file``) or ``.npy`` files (likewise), given as paths, globs or directories.
The copy streams in blocks of bounded size (whole chunks at a time for chunked sources), hashes
what it reads, then re-reads the written file and compares hashes before the atomic rename.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from solar._atomic import atomic_path
from solar.errors import SolarError
from solar.io.hdf5 import describe, open_h5
from solar.io.sources import list_sources

_BLOCK_BYTES = 64 * 2**20


@dataclass(frozen=True)
class _Source:
    path: Path
    count: int  # samples in this file


def convert(
    srcs: list[str | os.PathLike],
    dst: str | os.PathLike,
    *,
    keys: list[str] | None = None,
    one_per_file: bool = False,
    align: int = 4096,
    force: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> dict:
    """Convert ``srcs`` into ``dst``; returns what was written (keys, shapes, samples)."""
    dst = Path(dst)
    if dst.exists() and not force:
        raise SolarError(f"{dst}: exists (use --force to overwrite)")
    if align <= 0 or align & (align - 1):
        raise SolarError(f"--align must be a power of two, got {align}")
    npy, found = list_sources(list(srcs), keys)
    ((key, files),) = found.items()
    if any(f.resolve() == dst.resolve() for f in files):
        raise SolarError(f"{dst}: is also a source")
    reader = _NpySources(files, key, one_per_file) if npy else _H5Sources(files, keys, one_per_file)
    n = sum(s.count for s in reader.sources)
    digests = {k: hashlib.blake2b(digest_size=16) for k in reader.keys}
    with atomic_path(dst) as tmp:
        with h5py.File(tmp, "w", alignment_threshold=1, alignment_interval=align) as out:
            dsets = {}
            for k, (shape, dtype) in reader.keys.items():
                dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
                dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)  # offsets exist at once
                dsets[k] = out.create_dataset(k, (n, *shape), dtype.newbyteorder("="), dcpl=dcpl)
            lo, done = 0, 0
            for src in reader.sources:
                for start, block in reader.blocks(src):
                    for k, values in block.items():
                        dsets[k][lo + start : lo + start + len(values)] = values
                        digests[k].update(np.ascontiguousarray(values, dsets[k].dtype).data)
                    done += len(next(iter(block.values())))
                    if progress is not None:
                        progress(done, n)
                lo += src.count
        _verify(tmp, reader.keys, digests)
    return {"samples": n, "keys": {k: [list(s), str(d)] for k, (s, d) in reader.keys.items()}}


def _verify(path: Path, keys: dict, digests: dict) -> None:
    """Re-read the written file and compare its hash with the source's, key by key."""
    with h5py.File(path, "r") as f:
        for k in keys:
            d = f[k]
            h = hashlib.blake2b(digest_size=16)
            rows = max(1, _BLOCK_BYTES // max(1, d.dtype.itemsize * int(np.prod(d.shape[1:]))))
            for lo in range(0, d.shape[0], rows):
                h.update(np.ascontiguousarray(d[lo : lo + rows]).data)
            if h.digest() != digests[k].digest():
                raise SolarError(f"{path}: key {k!r} does not match its source after writing")


class _H5Sources:
    def __init__(self, files: list[Path], keys: list[str] | None, one_per_file: bool) -> None:
        info = describe(files, keys, one_per_file=one_per_file)
        self.one_per_file = one_per_file
        self.sources = [_Source(p, n) for p, n in zip(info.files, info.lengths, strict=True)]
        self.keys = {k.name: (k.sample_shape, k.dtype) for k in info.keys}

    def blocks(self, src: _Source) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
        try:
            with open_h5(src.path) as f:
                if self.one_per_file:
                    yield 0, {k: f[k][()][None] for k in self.keys}
                    return
                rows = _block_rows(f, self.keys)
                for lo in range(0, src.count, rows):
                    yield lo, {k: f[k][lo : lo + rows] for k in self.keys}
        except OSError as exc:
            raise SolarError(f"{src.path}: read error, truncated or corrupt ({exc})") from None


def _block_rows(f: h5py.File, keys: dict) -> int:
    """Rows per copy block: bounded bytes, and whole chunks of chunked sources."""
    row_bytes = sum(int(np.prod(s, dtype=np.int64)) * d.itemsize for s, d in keys.values())
    rows = max(1, _BLOCK_BYTES // max(1, row_bytes))
    chunk = max((f[k].chunks[0] for k in keys if f[k].chunks), default=1)
    return max(chunk, rows // chunk * chunk)


class _NpySources:
    def __init__(self, files: list[Path], key: str, one_per_file: bool) -> None:
        self.key = key
        self.one_per_file = one_per_file
        self.sources = []
        self.keys: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
        for path in files:
            a = self._open(path)
            if a.dtype.kind not in "biufc" or a.dtype.fields is not None:
                raise SolarError(f"{path}: dtype {a.dtype} is not an array of numbers")
            if not one_per_file and a.ndim == 0:
                raise SolarError(f"{path}: a scalar (one sample per file? use --one-per-file)")
            shape = a.shape if one_per_file else a.shape[1:]
            want = self.keys.setdefault(self.key, (shape, a.dtype))
            if want != (shape, a.dtype):
                raise SolarError(
                    f"{path}: holds {shape} {a.dtype} samples, the first file {want[0]} {want[1]}"
                )
            self.sources.append(_Source(path, 1 if one_per_file else a.shape[0]))

    @staticmethod
    def _open(path: Path) -> np.ndarray:
        try:
            return np.load(path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise SolarError(f"{path}: not a readable .npy file ({exc})") from None

    def blocks(self, src: _Source) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
        a = self._open(src.path)
        if self.one_per_file:
            yield 0, {self.key: np.asarray(a)[None]}
            return
        rows = max(1, _BLOCK_BYTES // max(1, a[:1].nbytes))
        for lo in range(0, src.count, rows):
            yield lo, {self.key: np.asarray(a[lo : lo + rows])}

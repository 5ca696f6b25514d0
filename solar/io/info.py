"""What a dataset holds, whatever its format (HDF5, .npy, one sample per file): its keys'
per-sample shapes and types, its files and their lengths, and where each key is stored."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class KeyInfo:
    """One key's per-sample shape and type, the same in every file."""

    name: str
    sample_shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def native_dtype(self) -> np.dtype:
        """The dtype samples have in memory (buffers and batches): native byte order."""
        return self.dtype.newbyteorder("=")

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.sample_shape, dtype=np.int64)) * self.dtype.itemsize


@dataclass(frozen=True, eq=False)
class StoredLayout:
    """Where each key of each file is stored, found once while the files were checked.

    ``offsets[f, k]``: byte offset of a contiguous native dataset (-1: none); ``chunk_rows``:
    samples per chunk (0: not chunked); ``decodable``: chunked with filters solar decodes.
    """

    offsets: np.ndarray  # (files, keys) int64
    chunk_rows: np.ndarray  # (files, keys) int64
    decodable: np.ndarray  # (files, keys) bool
    sizes: np.ndarray | None = None  # (files, 1 or keys) int64: bytes of each (key's) file
    times: np.ndarray | None = None  # (files, 1 or keys, 2) int64: mtime, ctime (ns) as scanned


@dataclass(frozen=True)
class DatasetInfo:
    """The sample space of a list of HDF5 (or .npy) files and keys.

    ``format`` is ``"hdf5"`` or ``"npy"``; with ``one_per_file`` each file (its datasets) is
    one sample. A .npy key has its own files: ``key_files[k]`` (``files`` are the first key's).
    ``stored`` is what the reader needs to serve the files without opening each again.
    """

    files: tuple[Path, ...]
    keys: tuple[KeyInfo, ...]
    lengths: tuple[int, ...]  # samples in each file
    format: str = "hdf5"
    one_per_file: bool = False
    key_files: tuple[tuple[Path, ...], ...] = ()
    stored: StoredLayout | None = field(default=None, compare=False, repr=False)

    @property
    def all_files(self) -> tuple[Path, ...]:
        """Every data file: each .npy key's files in turn, else ``files``."""
        return tuple(p for fs in self.key_files for p in fs) or self.files

    @property
    def num_samples(self) -> int:
        return sum(self.lengths)

    @property
    def sample_bytes(self) -> int:
        return sum(k.row_bytes for k in self.keys)

    @property
    def identity(self) -> str:
        """A digest of file names, sizes, keys, shapes and dtypes (not contents).

        Renaming a directory or copying the files keeps it; another file, key or shape changes it.
        """
        record = [
            [p.name, self._size(p, i, 0), n]
            for i, (p, n) in enumerate(zip(self.files, self.lengths, strict=True))
        ]
        keys = [[k.name, list(k.sample_shape), k.dtype.str] for k in self.keys]
        what: list = [record, keys]
        if self.format != "hdf5" or self.one_per_file:
            # Other sources say what they are, and every key's files (names and sizes).
            more = [
                [p.name, self._size(p, i, k)]
                for k, files in enumerate(self.key_files[1:], 1)
                for i, p in enumerate(files)
            ]
            what += [self.format, self.one_per_file, more]
        return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:32]

    def _size(self, path: Path, i: int, k: int) -> int:
        """Bytes of file ``i`` of key ``k``: as scanned (no stat per file), else asked."""
        sizes = self.stored.sizes if self.stored is not None else None
        if sizes is None:
            return os.path.getsize(path)
        return int(sizes[i, k if sizes.shape[1] > 1 else 0])

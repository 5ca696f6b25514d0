"""What a dataset argument names: HDF5 or .npy files, from paths, globs, directories or a dict.

``describe_source`` is the one entry point of the Loader and the ``solar`` commands:

* a path, glob, directory or list of them naming HDF5 files: the datasets ``keys`` (default:
  all) of every file, many samples per file along axis 0, or one sample per file with
  ``one_per_file``;
* the same naming ``.npy`` files: one key, named ``keys[0]`` or ``"data"``;
* a dict ``{key: path, glob, directory or list}`` of ``.npy`` files: one key per entry, files
  paired in sorted order (``{"x": "data/x_*.npy", "y": "data/y_*.npy"}``).

A directory stands for its sorted ``.h5``, ``.hdf5`` and ``.npy`` files.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from solar.errors import SolarError
from solar.io.hdf5 import DatasetInfo, describe, expand_paths
from solar.io.npy import describe_npy

SUFFIXES = (".h5", ".hdf5", ".npy")

PathsArg = str | os.PathLike | Sequence[str | os.PathLike]


def expand_sources(paths: PathsArg) -> list[Path]:
    """Files named by ``paths``: directories give their sorted .h5/.hdf5/.npy files, globs
    their sorted matches."""
    paths = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
    out: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            found = sorted(q for q in p.iterdir() if q.suffix in SUFFIXES and q.is_file())
            if not found:
                raise SolarError(f"{p}: directory holds no .h5, .hdf5 or .npy files")
            out.extend(found)
        else:
            out.extend(expand_paths([p]))
    if not out:
        raise SolarError("no data files given")
    return out


def describe_source(
    paths: PathsArg | Mapping[str, PathsArg],
    keys: list[str] | None = None,
    *,
    one_per_file: bool = False,
) -> DatasetInfo:
    """Describe the sample space ``paths`` name (see the module docstring)."""
    if isinstance(paths, Mapping):
        if keys:
            raise SolarError("a dict of .npy keys names its keys: give no keys as well")
        by_key = {str(k): expand_sources(v) for k, v in paths.items()}
        for k, fs in by_key.items():
            if any(f.suffix != ".npy" for f in fs):
                raise SolarError(f"key {k!r}: a dict of keys takes .npy files only")
        return describe_npy(by_key, one_per_file=one_per_file)
    files = expand_sources(paths)
    npy = [f.suffix == ".npy" for f in files]
    if any(npy) and not all(npy):
        raise SolarError("sources mix .npy and HDF5 files")
    if all(npy):
        if keys and len(keys) > 1:
            raise SolarError(".npy files hold one array each: give at most one key")
        return describe_npy({keys[0] if keys else "data": files}, one_per_file=one_per_file)
    return describe(files, keys, one_per_file=one_per_file)

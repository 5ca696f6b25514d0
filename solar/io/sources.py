"""What a dataset argument names: HDF5 or .npy files, from paths, globs, directories or a dict.

``describe_source`` is the one entry point of the Loader and the ``solar`` commands:

* a path, glob, directory or list of them naming HDF5 files: the datasets ``keys`` (default:
  all) of every file, many samples per file along axis 0, or one sample per file with
  ``one_per_file``;
* the same naming ``.npy`` files: one key, named ``keys[0]`` or ``"data"``;
* a dict ``{key: path, glob, directory or list}`` of ``.npy`` files: one key per entry, files
  paired in sorted order (``{"x": "data/x_*.npy", "y": "data/y_*.npy"}``).

A directory stands for its ``.h5``, ``.hdf5`` and ``.npy`` files at any depth (``train/000/
*.hdf5``), in sorted order of their paths below it (the order ``solar inspect`` prints); names
starting with a dot (``.ipynb_checkpoints``, editors' temporary files) are skipped.

With a communicator (``comm``), rank 0 lists the files and the ranks share the scan of them
(:mod:`solar.io.scan`): one scan per job. A :class:`DatasetInfo` passes through unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from solar.errors import SolarError
from solar.io.hdf5 import describe, expand_paths
from solar.io.info import DatasetInfo
from solar.io.npy import describe_npy
from solar.io.scan import on_root

SUFFIXES = (".h5", ".hdf5", ".npy")

PathsArg = str | os.PathLike | Sequence[str | os.PathLike]


def expand_sources(paths: PathsArg) -> list[Path]:
    """Files named by ``paths``: directories give their .h5/.hdf5/.npy files at any depth
    (sorted, see the module's docstring), globs their sorted matches."""
    paths = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
    out: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            found = walk(p)
            if not found:
                raise SolarError(f"{p}: directory holds no .h5, .hdf5 or .npy files (at any depth)")
            out.extend(found)
        else:
            out.extend(expand_paths([p]))
    if not out:
        raise SolarError("no data files given")
    return out


def walk(root: Path) -> list[Path]:
    """The data files below ``root``, at any depth, sorted by their path's parts (a
    directory's files before a sibling directory's that sorts after it). Directory entries'
    types come from the listing: no stat per file. Symbolic links to directories are not
    followed (no cycles)."""
    found: list[tuple[str, ...]] = []
    for top, dirs, names in os.walk(root, onerror=_raise):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        rel = Path(top).relative_to(root).parts
        found.extend((*rel, n) for n in names if not n.startswith(".") and _usable(n))
    found.sort()
    return [root.joinpath(*parts) for parts in found]


def _usable(name: str) -> bool:
    return os.path.splitext(name)[1] in SUFFIXES


def _raise(exc: OSError) -> None:
    raise SolarError(f"{exc.filename}: cannot list ({exc.strerror})")


def describe_source(
    paths: PathsArg | Mapping[str, PathsArg] | DatasetInfo,
    keys: list[str] | None = None,
    *,
    one_per_file: bool = False,
    comm: Any = None,
) -> DatasetInfo:
    """Describe the sample space ``paths`` name (see the module docstring); with ``comm`` (a
    collective) every rank gets the same description from one scan of the files."""
    if isinstance(paths, DatasetInfo):
        return paths
    refuse_in_memory(paths)
    npy, names = on_root(comm, lambda: _list(paths, keys))
    # Sent as strings: unpickling 10^5 Paths took seconds a rank (pathlib parses each twice).
    found = {k: [Path(f) for f in fs] for k, fs in names.items()}
    if npy:
        return describe_npy(found, one_per_file=one_per_file, comm=comm)
    return describe(found[""], keys, one_per_file=one_per_file, comm=comm)


def refuse_in_memory(paths: Any) -> None:
    """One line for data given in memory (solar serves rows from storage): how to write it."""
    inner = paths.values() if isinstance(paths, Mapping) else [paths]
    for p in inner:
        if isinstance(p, str | os.PathLike):
            continue
        if hasattr(p, "edge_index") or (isinstance(p, Mapping) and "edge_index" in p):
            raise SolarError("the data is a graph in memory: solar reads node features from "
                             "storage; write it with solar.graph.write_graph(data, "
                             "'graph.h5') (or `solar convert`) and pass that file")  # fmt: skip
        if hasattr(p, "shape") and hasattr(p, "dtype"):
            raise SolarError(f"the data is an array in memory ({type(p).__name__} "
                             f"{tuple(p.shape)}): solar reads from storage; save it "
                             "(numpy.save to .npy, h5py, or solar.graph.write_graph for a "
                             "graph's features) and pass the file")  # fmt: skip


def _list(
    paths: PathsArg | Mapping[str, PathsArg], keys: list[str] | None
) -> tuple[bool, dict[str, list[str]]]:
    """(whether the files are .npy, their files by key; "" for HDF5's)."""
    npy, found = list_sources(paths, keys)
    return npy, {k: [os.fspath(f) for f in fs] for k, fs in found.items()}


def list_sources(
    paths: PathsArg | Mapping[str, PathsArg], keys: list[str] | None
) -> tuple[bool, dict[str, list[Path]]]:
    """(whether the files are .npy, their files by key: a .npy key's own, ``""`` for HDF5's),
    the files' kinds and the keys checked (one key at most for .npy files)."""
    if isinstance(paths, Mapping):
        if keys:
            raise SolarError("a dict of .npy keys names its keys: give no keys as well")
        by_key = {str(k): expand_sources(v) for k, v in paths.items()}
        for k, fs in by_key.items():
            if any(f.suffix != ".npy" for f in fs):
                raise SolarError(f"key {k!r}: a dict of keys takes .npy files only")
        return True, by_key
    files = expand_sources(paths)
    npy = [f.suffix == ".npy" for f in files]
    if any(npy) and not all(npy):
        raise SolarError("sources mix .npy and HDF5 files")
    if all(npy):
        if keys and len(keys) > 1:
            raise SolarError(".npy files hold one array each: give at most one key")
        return True, {keys[0] if keys else "data": files}
    return False, {"": files}

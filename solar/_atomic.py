"""Atomic output: write to a temporary name beside the target, rename only on success."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from solar.errors import SolarError


def check_writable(path: str | os.PathLike) -> Path:
    """Fail now, before any work, if ``path`` cannot be written as a file."""
    path = Path(path)
    if not str(path) or path.name == "":
        raise SolarError(f"output path {str(path)!r} is not a file name")
    if path.is_dir():
        raise SolarError(f"{path}: is a directory")
    if not path.parent.is_dir():
        raise SolarError(f"{path}: directory {path.parent} does not exist")
    if not os.access(path.parent, os.W_OK):
        raise SolarError(f"{path}: directory {path.parent} is not writable")
    return path


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path in ``path``'s directory; rename it to ``path`` if no error."""
    path = check_writable(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise SolarError(f"{path}: cannot write ({exc.strerror})") from None
    os.close(fd)
    tmp_path = Path(tmp)
    # mkstemp makes 0600; give the output the mode any new file would get.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp_path, 0o666 & ~umask)
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    finally:
        tmp_path.unlink(missing_ok=True)


def write_json(path: str | os.PathLike, obj: object) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically, making its directory if need be."""
    import json

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=1) + "\n")

"""Errors that reach users: one line naming the file, key or parameter at fault."""

from __future__ import annotations

from typing import Any


class SolarError(Exception):
    """A user-facing error; the CLI prints its message on one line and exits non-zero."""


class PlanMismatchError(SolarError):
    """A plan was made for another dataset or run."""


class CorruptPlanError(SolarError):
    """A plan file is unreadable, truncated or fails its checksum."""


def truncated(path, what: str, end: int, size: int) -> SolarError:
    """The error for a file shorter than its metadata says: ``what`` (e.g. "key 'x', chunk at
    (4, 0)") ends at byte ``end`` of ``path``, which has ``size`` bytes."""
    return SolarError(f"{path}: truncated file: {what} ends at byte {end}, the file has {size}")


def first_line(exc: BaseException) -> str:
    """An exception's message, first line only (its type's name if it has none)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def first_error(comm: Any, err: str) -> str:
    """The first rank's error of ``comm`` ("" if none; a collective: all must call), so that
    every rank fails alike and none skips the collectives the others go on to."""
    if comm is None:
        return err
    return next((e for e in comm.allgather(err) if e), "")

"""Errors that reach users: one line naming the file, key or parameter at fault."""

from __future__ import annotations


class SolarError(Exception):
    """A user-facing error; the CLI prints its message on one line and exits non-zero."""


class PlanMismatchError(SolarError):
    """A plan was made for another dataset or run."""


class CorruptPlanError(SolarError):
    """A plan file is unreadable, truncated or fails its checksum."""


def first_line(exc: BaseException) -> str:
    """An exception's message, first line only (its type's name if it has none)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__

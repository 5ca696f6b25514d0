"""A grouping of ranks by host as text: ``"HxL"`` (H hosts of L consecutive ranks) or ``"3,1"``
(hosts of 3 and 1 consecutive ranks), as ``SOLAR_HOSTS`` and ``solar plan --hosts`` take it."""

from __future__ import annotations

import re

from solar.errors import SolarError

_GRID = re.compile(r"^\s*(\d+)\s*[x×]\s*(\d+)\s*$")
_SIZES = re.compile(r"^\s*\d+\s*(,\s*\d+\s*)+$")


def host_sizes(text: str, world: int | None = None, what: str = "SOLAR_HOSTS") -> list[int]:
    """The ranks of each host ``text`` names; with ``world``, refused unless they add up to it
    (errors name ``what``, in one line)."""
    if _SIZES.match(str(text)):
        sizes = [int(v) for v in str(text).split(",")]
        if min(sizes) < 1:
            raise SolarError(f"{what}: every host runs a rank or more, got {text!r}")
        if world is not None and sum(sizes) != world:
            raise SolarError(f"{what} {text}: {sum(sizes)} ranks, but the job has {world}")
        return sizes
    m = _GRID.match(str(text))
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise SolarError(f"{what}: expected HOSTSxRANKS such as 2x2, or the ranks of each "
                         f"host such as 3,1, got {text!r}")  # fmt: skip
    h, per = int(m.group(1)), int(m.group(2))
    if world is not None and h * per != world:
        raise SolarError(f"{what} {text}: {h}×{per} ranks, but the job has {world}")
    return [per] * h

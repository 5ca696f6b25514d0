"""Planning policies, chosen by name."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from solar.config import BufferConfig, RunConfig
from solar.errors import SolarError
from solar.schedule import artifact, belady, interleaved, nopfs
from solar.schedule._common import Progress, Schedule

Policy = Callable[[RunConfig, BufferConfig, np.ndarray, Progress | None], Schedule]

POLICIES: dict[str, Policy] = {
    "solar": belady.schedule,
    "lru": interleaved.schedule_lru,
    "fifo": interleaved.schedule_fifo,
    "solar-artifact": artifact.schedule,
    "nopfs": nopfs.schedule,
}


def get_policy(name: str) -> Policy:
    """The policy registered as ``name``."""
    try:
        return POLICIES[name]
    except KeyError:
        raise SolarError(f"policy: unknown {name!r} (choose from {', '.join(POLICIES)})") from None

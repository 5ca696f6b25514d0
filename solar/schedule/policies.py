"""Planning policies, chosen by name: each makes a stateful per-epoch :class:`Policy`."""

from __future__ import annotations

from collections.abc import Callable

from solar.config import BufferConfig, RunConfig
from solar.errors import SolarError
from solar.schedule import artifact, belady, interleaved, nopfs
from solar.schedule._common import Policy
from solar.schedule.epochs import EpochOrder

PolicyFactory = Callable[[RunConfig, BufferConfig, EpochOrder], Policy]

POLICIES: dict[str, PolicyFactory] = {
    "solar": lambda run, buffer, order: belady.SolarPolicy(run, buffer),
    "lru": lambda run, buffer, order: interleaved.InterleavedPolicy(run, buffer, lru=True),
    "fifo": lambda run, buffer, order: interleaved.InterleavedPolicy(run, buffer, lru=False),
    "solar-artifact": lambda run, buffer, order: artifact.ArtifactPolicy(run, buffer),
    "nopfs": nopfs.NopfsPolicy,
}


def get_policy(name: str) -> PolicyFactory:
    """The policy registered as ``name``."""
    try:
        return POLICIES[name]
    except KeyError:
        raise SolarError(f"policy: unknown {name!r} (choose from {', '.join(POLICIES)})") from None

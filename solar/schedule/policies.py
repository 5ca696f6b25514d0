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


TIERED = ("solar", "nopfs")  # the policies that plan a second tier


def get_policy(name: str) -> PolicyFactory:
    """The policy registered as ``name``."""
    try:
        return POLICIES[name]
    except KeyError:
        raise SolarError(f"policy: unknown {name!r} (choose from {', '.join(POLICIES)})") from None


def check_policy(name: str, buffer: BufferConfig) -> None:
    """Refuse an unknown policy, or one that cannot plan ``buffer``'s second tier."""
    get_policy(name)
    if buffer.tier and name not in TIERED:
        raise SolarError(
            f"policy {name!r} has no second tier (tier_size {buffer.tier}): "
            f"use {' or '.join(TIERED)}"
        )


def make_policy(name: str, run: RunConfig, buffer: BufferConfig, order: EpochOrder) -> Policy:
    """The policy ``name`` for a run."""
    check_policy(name, buffer)
    return get_policy(name)(run, buffer, order)

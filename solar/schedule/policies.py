"""Planning policies, chosen by name: each makes a stateful per-epoch :class:`Policy`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from solar.config import BufferConfig, RunConfig
from solar.errors import SolarError
from solar.schedule.baselines import artifact, interleaved, nopfs, tracebase
from solar.schedule.keep import belady
from solar.schedule.policy import Policy

PolicyFactory = Callable[[RunConfig, BufferConfig, Any], Policy]  # (run, buffer, order)

POLICIES: dict[str, PolicyFactory] = {
    "solar": lambda run, buffer, order: belady.SolarPolicy(run, buffer),
    "lru": lambda run, buffer, order: interleaved.InterleavedPolicy(run, buffer, lru=True),
    "fifo": lambda run, buffer, order: interleaved.InterleavedPolicy(run, buffer, lru=False),
    "solar-artifact": lambda run, buffer, order: artifact.ArtifactPolicy(run, buffer),
    "nopfs": nopfs.NopfsPolicy,
}


# The policies of a general sampler's trace (solar.schedule.draw.traces). The baselines take the
# sampler's own split (rank r's share of each global batch), each rank a cache of its own.
TRACE_POLICIES: dict[str, PolicyFactory] = {
    # With affinity the planner splits global batches: Shuffle's policy on the trace's steps.
    "solar": lambda run, buffer, order: (
        belady.SolarPolicy(run, buffer, order)
        if order.affinity
        else belady.TracePolicy(run, buffer, order)
    ),
    "lru": tracebase.TraceLRU,
    "static": tracebase.TraceStatic,
    "nopfs": lambda run, buffer, order: tracebase.TraceStatic(run, buffer, order, whole_run=True),
}


TIERED = ("solar", "nopfs")  # the policies that plan a second tier


def get_policy(name: str, traced: bool = False) -> PolicyFactory:
    """The policy registered as ``name`` (for a general sampler's trace if ``traced``)."""
    table = TRACE_POLICIES if traced else POLICIES
    try:
        return table[name]
    except KeyError:
        what = "for this sampler " if traced else ""
        raise SolarError(
            f"policy: unknown {name!r} {what}(choose from {', '.join(table)})"
        ) from None


def check_policy(name: str, buffer: BufferConfig, traced: bool = False) -> None:
    """Refuse an unknown policy, or one that cannot plan ``buffer``'s second tier."""
    get_policy(name, traced)
    if buffer.tier and name not in (("solar",) if traced else TIERED):
        raise SolarError(
            f"policy {name!r} has no second tier (tier_size {buffer.tier}): "
            f"use {'solar' if traced else ' or '.join(TIERED)}"
        )


def make_policy(name: str, run: RunConfig, buffer: BufferConfig, order: Any) -> Policy:
    """The policy ``name`` for a run whose order (an EpochOrder or a TraceOrder) is ``order``."""
    traced = getattr(order, "traced", False)
    check_policy(name, buffer, traced)
    return get_policy(name, traced)(run, buffer, order)

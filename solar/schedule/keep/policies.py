"""Planning policies, chosen by name (:data:`~solar.schedule.policy.POLICIES`): each makes a
stateful per-epoch :class:`Policy`: solar's Belady (belady.py) or a baseline (baselines/)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from solar.config import BufferConfig, RunConfig
from solar.schedule.keep import belady
from solar.schedule.keep.baselines import artifact, interleaved, nopfs, tracebase
from solar.schedule.policy import POLICIES, TRACE_POLICIES, Policy, check_policy

PolicyFactory = Callable[[RunConfig, BufferConfig, Any], Policy]  # (run, buffer, order)

FACTORIES: dict[str, PolicyFactory] = {
    "solar": lambda run, buffer, order: belady.SolarPolicy(run, buffer),
    "lru": lambda run, buffer, order: interleaved.InterleavedPolicy(run, buffer, lru=True),
    "fifo": lambda run, buffer, order: interleaved.InterleavedPolicy(run, buffer, lru=False),
    "solar-artifact": lambda run, buffer, order: artifact.ArtifactPolicy(run, buffer),
    "nopfs": nopfs.NopfsPolicy,
}


# The policies of a general sampler's trace (solar.schedule.draw.traces). The baselines take the
# sampler's own split (rank r's share of each global batch), each rank a cache of its own.
TRACE_FACTORIES: dict[str, PolicyFactory] = {
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
assert tuple(FACTORIES) == POLICIES and tuple(TRACE_FACTORIES) == TRACE_POLICIES


def get_policy(name: str, traced: bool = False) -> PolicyFactory:
    """The policy registered as ``name`` (for a general sampler's trace if ``traced``)."""
    check_policy(name, BufferConfig(0), traced)
    return (TRACE_FACTORIES if traced else FACTORIES)[name]


def make_policy(name: str, run: RunConfig, buffer: BufferConfig, order: Any) -> Policy:
    """The policy ``name`` for a run whose order (an EpochOrder or a TraceOrder) is ``order``."""
    traced = getattr(order, "traced", False)
    check_policy(name, buffer, traced)
    return (TRACE_FACTORIES if traced else FACTORIES)[name](run, buffer, order)

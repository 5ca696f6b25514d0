"""Node planner snapshots: a node plan's host planner saved at an epoch boundary, so that a
resume with ``share="node"`` replans from the newest one at or before its epoch.

The files are :mod:`solar.schedule.snapshot`'s (untrusted: checksum, header, shapes, ranges and
heap order validated before use), named for the run (the per-rank spec's fingerprint) and
carrying the grouping of the ranks by host they were planned for: a snapshot of another
grouping is refused in one warning line (and the planner replans from epoch 0), whatever the
sampler (a grouping changes a host's union of accesses).
"""

from __future__ import annotations

import os
from pathlib import Path

from solar.schedule import snapshot
from solar.schedule.nodeplan import Hosts, NodePlanner
from solar.schedule.spec import PlanSpec

KIND = "nodeplanner"


def _extra(spec: PlanSpec, hosts: Hosts) -> dict:
    return {"hosts": hosts.as_record(), "run": spec.fingerprint}


def save(directory: str | os.PathLike, planner: NodePlanner) -> Path | None:
    """Write ``planner``'s host planner state before its next epoch into ``directory``
    (atomically; older ones dropped as :func:`solar.schedule.snapshot.save` does); None if its
    policy keeps no state worth saving. The planner must plan every host."""
    if planner.only_host is not None:
        raise ValueError("a node snapshot holds every host's state: plan them all")
    return snapshot.save(directory, planner.planner, key=planner.spec.fingerprint, kind=KIND,
                         extra=_extra(planner.spec, planner.hosts))  # fmt: skip


def load(directory: str | os.PathLike, spec: PlanSpec, hosts: Hosts, epoch: int,
         after: int = -1) -> NodePlanner | None:  # fmt: skip
    """A node planner of ``spec``'s run over ``hosts``, restored from its newest valid snapshot
    in ``directory`` taken at or before ``epoch`` and after ``after``; None if there is none
    (a refused one is named in a warning and skipped)."""
    node = NodePlanner(spec, hosts)
    restored = snapshot.load(directory, node.host_spec, epoch, after, key=spec.fingerprint,
                             kind=KIND, extra=_extra(spec, hosts),
                             make=lambda: node.planner)  # fmt: skip
    return None if restored is None else node

"""Cores: the one place that says how many this process may use, and its share of them."""

from __future__ import annotations

import os


def cores() -> int:
    """Cores this process may run on (its affinity mask, not the machine's count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cpu_share(local_ranks: int = 1) -> int:
    """This rank's share of the cores when ``local_ranks`` ranks run on its host: the cores
    it may use, divided among the ranks if they were not bound to cores of their own (each
    may use all of the host's), so that P ranks' workers do not oversubscribe the host."""
    mine = cores()
    if local_ranks > 1 and mine >= (os.cpu_count() or mine):
        return max(1, mine // local_ranks)
    return mine

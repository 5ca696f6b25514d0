"""An array a kernel fills grown in place of itself: the one helper both a trace's planner
(solar/schedule/keep/belady.py, its page mates' side rows) and the neighbour sampler
(solar/graph/neighbor.py, its subgraph's nodes and edges) grow their outputs with."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, inline="always")
def grown(a, size, used):  # pragma: no cover - compiled
    """``a``'s first ``used`` items in a new array of ``size`` (>= ``used``), its tail
    uninitialised (the caller writes it before reading it)."""
    b = np.empty(size, a.dtype)
    b[:used] = a[:used]
    return b

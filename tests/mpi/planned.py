"""A rank's planned figures for a Loader's run, whichever buffer it runs: its own plan's, or
with a node buffer (``loader.share == "node"``) its share of its host's node plan."""

from typing import NamedTuple

import numpy as np

from solar import host
from solar.schedule.keep.grouping import Hosts
from solar.schedule.keep.hostplan import HostPlanner
from solar.schedule.policy import HIT, PEER, SIDE, THIT


class Planned(NamedTuple):
    hits: int  # served from RAM
    tier_hits: int
    reads: int  # read from storage by this rank (a node's rows read for others included)


def planned(ld, comm) -> Planned:
    """``ld``'s planned figures for this rank (a collective with a node buffer)."""
    if ld.share == "rank":
        s = ld.plan.stats[ld.rank]
        return Planned(s.hits, s.tier_hits, s.reads)
    p = HostPlanner(ld.spec, Hosts(host.place(comm).groups))
    hits = reads = 0
    for _ in range(ld.run.epochs):
        f = p.next().rank(ld.rank).flags
        hits += int(np.count_nonzero(f & HIT))
        reads += int(np.count_nonzero((f & (HIT | THIT | PEER | SIDE)) == 0))
    return Planned(hits, 0, reads)

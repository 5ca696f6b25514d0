"""Equal local batches from a host buffer: a host's served rows dealt over its ranks.

With Shuffle (node-level affinity) the host planner splits each global batch over the hosts,
host h serving ``c_h`` rows within slack (solar/schedule/keep/hostplan.py). With ``equal_batches``
every rank must deliver its nominal share ``n_r``
(:func:`~solar.schedule.draw.order.nominal_batches`
of the global batch over all P ranks, as per-rank mode: a short last batch split evenly, the
lower ranks one row more). The host's ranks' shares add up to ``T_h``:

* a host serving more (``c_h > T_h``) deals its rows so that every local rank serves its share
  plus an even part of the surplus (first to the ranks of the smaller share), and sends that
  part to ranks of other hosts;
* a host serving fewer deals them so that every local rank serves its share less an even part
  of the deficit (first from the ranks of the larger share), and receives that part.

So no local rank sends and another receives on one host: no row moves between the ranks of a
node (any of them serves any row the node holds), and the rows that cross hosts are the
host-level surplus, ``Σ_h max(c_h − T_h, 0)`` a step. Those served counts are a rank-level
:func:`~solar.schedule.keep.transfer.rank_transfer`'s input as in per-rank mode: the existing
exchange (solar/exchange.py) moves them. Within a host, reads are dealt first (round robin over
the ranks with room), then hits, so the local ranks' reads differ by at most one row.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from solar.schedule.keep.transfer import Transfer, rank_transfer
from solar.schedule.policy import HIT, THIT


def rank_targets(host_counts: np.ndarray, groups: tuple[tuple[int, ...], ...]) -> np.ndarray:
    """Rows each rank serves at each step, (steps, P) int64, from each host's served rows
    ``host_counts`` (steps, H) and the hosts' global ranks ``groups`` (see the module)."""
    c = np.asarray(host_counts, np.int64)
    world = sum(len(g) for g in groups)
    sizes = c.sum(axis=1)
    n = sizes[:, None] // world + (np.arange(world)[None, :] < sizes[:, None] % world)
    out = np.empty((c.shape[0], world), np.int64)
    for h, g in enumerate(groups):
        ranks = np.asarray(g, np.int64)
        local = ranks.size
        nh = n[:, ranks]
        d = c[:, h] - nh.sum(axis=1)
        # Position of each local rank by global rank: shares never grow with the rank.
        asc = np.argsort(np.argsort(ranks, kind="stable"), kind="stable")
        sur, dfc = np.maximum(d, 0)[:, None], np.maximum(-d, 0)[:, None]
        extra = sur // local + ((local - 1 - asc)[None, :] < sur % local)  # smaller share first
        less = dfc // local + (asc[None, :] < dfc % local)  # larger share first
        out[:, ranks] = nh + extra - less
    if np.any(out < 0) or not np.array_equal(out.sum(axis=1), sizes):
        raise AssertionError("equal host batches: a host's rows cannot be dealt")
    return out


def deal_equal(bounds: np.ndarray, host_of: np.ndarray, flags: np.ndarray,
               groups: tuple[tuple[int, ...], ...], targets: np.ndarray, reader: np.ndarray,
               out_rank: np.ndarray, out_at: np.ndarray, counts: np.ndarray) -> None:  # fmt: skip
    """Deal every host's accesses of each step (``bounds``, ``host_of``: the host plan's
    step-major schedule) to its ranks, rank r serving ``targets[t, r]`` rows at step t: reads
    first, round robin, then hits; ``reader`` the global rank reading each miss, ``out_rank``
    and ``out_at`` each rank access (in access order), ``counts`` (steps, P) added to."""
    flat = np.concatenate([np.asarray(g, np.int64) for g in groups])
    starts = np.zeros(len(groups) + 1, np.int64)
    np.cumsum([len(g) for g in groups], out=starts[1:])
    _deal(bounds, host_of, flags, flat, starts, targets, reader, out_rank, out_at, counts)


@njit(cache=True, nogil=True)
def _deal(bounds, host_of, flags, flat, starts, targets, reader, out_rank, out_at, counts):
    hosts = starts.shape[0] - 1
    left = np.zeros(flat.shape[0], np.int64)
    cursor = np.zeros(hosts, np.int64)
    who = np.zeros(0, np.int64)
    m = 0
    for t in range(bounds.shape[0] - 1):
        a, b = bounds[t], bounds[t + 1]
        if who.shape[0] < b - a:
            who = np.empty(b - a, np.int64)
        for r in range(flat.shape[0]):
            left[r] = targets[t, r]
        cursor[:] = 0
        for phase in range(2):  # reads, then hits
            for i in range(a, b):
                if ((flags[i] & (HIT | THIT)) != 0) != (phase == 1):
                    continue
                h = host_of[i]
                lo, local = starts[h], starts[h + 1] - starts[h]
                j = cursor[h]
                for _ in range(local):
                    if left[flat[lo + j]] > 0:
                        break
                    j = (j + 1) % local
                r = flat[lo + j]
                left[r] -= 1  # (a target short of the host's rows goes below 0: caught below)
                cursor[h] = (j + 1) % local
                who[i - a] = r
                if phase == 0:
                    reader[i] = r
        for i in range(a, b):
            r = who[i - a]
            out_rank[m] = r
            out_at[m] = i
            m += 1
            counts[t, r] += 1
        for r in range(flat.shape[0]):
            if left[r] != 0:
                raise AssertionError("equal host batches: targets do not match the host's rows")


def host_transfer(step_offsets: np.ndarray, t: int, rank: int, hosts: int) -> Transfer | None:
    """Rank ``rank``'s exchange at local step ``t`` of a host epoch whose ranks' step offsets
    are ``step_offsets`` (P, steps + 1): the rows it serves over its share go to ranks of other
    hosts. None on one host (every rank serves its share)."""
    if hosts <= 1:
        return None
    counts = step_offsets[:, t + 1] - step_offsets[:, t]
    return rank_transfer(counts, rank)

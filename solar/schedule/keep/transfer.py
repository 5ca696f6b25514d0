"""Equal local batches: which rows a rank hands to which other rank at each step.

The planner decides who *serves* each sample of a global batch: affinity and slack let a rank
serve up to ⌈B·(1+slack)⌉ of them, the samples it holds. With ``equal_batches`` every rank
then *delivers* exactly its nominal share (:func:`~solar.schedule.draw.order.nominal_batches`: B,
or the even split of a short last batch). Who hands what to whom is a pure function of the
step's served counts of all ranks (``EpochSchedule.counts``), so every rank works it out alike
and a plan carries nothing more than those counts:

* a rank serving ``c`` rows over its share ``n`` keeps its first ``n`` rows (its service
  order) and sends the other ``c − n``; a rank serving fewer receives ``n − c`` rows, placed
  after its own;
* the senders' surplus rows, concatenated in rank order, fill the receivers' missing rows,
  concatenated in rank order: surplus row i becomes missing row i. So a sender sends to
  consecutive ranks, and a receiver's batch is its own rows, then each sender's rows in
  ascending sender rank, each sender's in its service order.

The sender applies its buffer updates to everything it served before any row leaves, so the
plan's admissions, hits and tier writes are those of the variable-batch plan. Every served
row is delivered exactly once, since the counts of a step add up to the global batch (the
plan's validation proves they do, and that every rank uses the same counts).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

from solar.schedule.draw.order import nominal_batches


class Transfer(NamedTuple):
    """One rank's part of one step's exchange."""

    send: NDArray[np.int64]  # (P,) rows sent to each rank: rows keep.. of its batch, rank order
    recv: NDArray[np.int64]  # (P,) rows received from each rank, placed after its own rows
    keep: int  # rows of its own served batch it keeps: min(served, share)
    size: int  # the batch it delivers: its nominal share
    collective: bool  # some rank of the step sends rows: every rank takes part in the exchange


def shares(counts: NDArray[np.integer]) -> NDArray[np.int64]:
    """Nominal shares of a step whose served counts (all ranks) are ``counts``: (P,)."""
    return nominal_batches(int(counts.sum()), counts.size)


def rank_transfer(counts: NDArray[np.integer], rank: int) -> Transfer:
    """Rank ``rank``'s exchange at a step whose served counts (all ranks) are ``counts``."""
    c = counts.astype(np.int64)
    n = shares(c)
    surplus = np.maximum(c - n, 0)
    missing = np.maximum(n - c, 0)
    s_hi = np.cumsum(surplus)
    s_lo = s_hi - surplus
    m_hi = np.cumsum(missing)
    m_lo = m_hi - missing
    # Overlap of this rank's interval in one stream with every rank's in the other.
    send = np.maximum(np.minimum(s_hi[rank], m_hi) - np.maximum(s_lo[rank], m_lo), 0)
    recv = np.maximum(np.minimum(s_hi, m_hi[rank]) - np.maximum(s_lo, m_lo[rank]), 0)
    return Transfer(send, recv, int(min(c[rank], n[rank])), int(n[rank]), bool(s_hi[-1] > 0))


def transfer_matrix(counts: NDArray[np.integer]) -> NDArray[np.int64]:
    """``m[s, d]``: rows rank s sends to rank d at a step of served ``counts``: (P, P)."""
    return np.stack([rank_transfer(counts, r).send for r in range(counts.size)])


def shares_of_steps(counts: NDArray[np.integer]) -> NDArray[np.int64]:
    """:func:`shares` of every step of ``counts`` (steps, P): (steps, P)."""
    world = counts.shape[1]
    g = counts.sum(axis=1, dtype=np.int64, keepdims=True)
    return g // world + (np.arange(world)[None, :] < g % world)


def moved_rows(counts: NDArray[np.integer]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Rows each rank sends and receives over the steps of ``counts`` (steps, P): two (P,)."""
    c = counts.astype(np.int64)
    n = shares_of_steps(c)
    return np.maximum(c - n, 0).sum(axis=0), np.maximum(n - c, 0).sum(axis=0)


def delivered(
    samples: list[NDArray[np.integer]], offsets: list[NDArray[np.int64]]
) -> list[list[NDArray[np.int64]]]:
    """Each rank's delivered batches: ``samples[r]`` and ``offsets[r]`` are rank r's served
    samples and step offsets (as a plan's); returns, per rank, each step's sample ids in
    batch order. For inspection and tests (a Python loop over steps and ranks)."""
    world = len(samples)
    steps = offsets[0].size - 1
    out: list[list[NDArray[np.int64]]] = [[] for _ in range(world)]
    for t in range(steps):
        served = [samples[r][offsets[r][t] : offsets[r][t + 1]].astype(np.int64)
                  for r in range(world)]  # fmt: skip
        counts = np.array([s.size for s in served])
        m = transfer_matrix(counts)
        tr = [rank_transfer(counts, r) for r in range(world)]
        for d in range(world):
            parts = [served[d][: tr[d].keep]]
            for s in range(world):
                if m[s, d]:
                    lo = tr[s].keep + int(m[s, :d].sum())
                    parts.append(served[s][lo : lo + m[s, d]])
            out[d].append(np.concatenate(parts))
    return out


def check_counts(
    peers: NDArray[np.integer], global_sizes: NDArray[np.int64], rank: int, own: NDArray
) -> str | None:
    """Why the served counts ``peers`` (steps, P) of one epoch cannot drive the exchange, or
    None: they must be non-negative, add up to each step's global batch, and give this rank's
    own counts ``own``."""
    if peers.ndim != 2 or peers.shape[0] != global_sizes.size:
        return f"peer counts are {list(peers.shape)}, expected [{global_sizes.size}, P]"
    bad = np.flatnonzero(
        np.any(peers < 0, axis=1) | (peers.sum(axis=1, dtype=np.int64) != global_sizes)
    )
    if bad.size:
        return f"step {int(bad[0])}: peer counts do not add up to the global batch"
    bad = np.flatnonzero(peers[:, rank] != own)
    if bad.size:
        return f"step {int(bad[0])}: peer counts differ from this rank's own"
    return None

"""The read bandwidths ``solar bench``'s limit is made of, as the loaders see them: every rank
at once, each rank's reader threads, random batches, every batch in flight at once; the best
of a few runs is kept, an upper estimate of the bandwidth, so the limit it gives is a lower
bound on the time.

A single-stream sequential read (what these replaced) measures less than solar's threads reach
(on this machine 0.53-0.78 GB/s against 1.68 GB read in 1.2 s), which put the "limit" above
the measured epochs. Storage's bytes move through the loaders' own
:class:`~solar.io.reader.Reader` (the same executor, threads, read paths and throttle), cold;
a tier's through a :class:`~solar.cache.tier.TierFile` per rank (O_DIRECT, whole-sample slots).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from typing import Any

import numpy as np

from solar._memory import aligned
from solar.cache.tier import TierFile, tier_stride
from solar.config import ReaderConfig
from solar.dist import MAX, SUM, allreduce
from solar.io.executor import Executor, combine
from solar.io.info import DatasetInfo
from solar.io.pagecache import evict
from solar.io.reader import Reader


def _best(comm: Any, repeats: int, batches: Callable[[int], Sequence[np.ndarray]],
          submit: Callable[[np.ndarray], list[Future]],
          nbytes: int | None = None) -> float:  # fmt: skip
    """Aggregate bytes per second over all ranks of ``comm`` (a collective), the best of
    ``repeats`` runs: run ``r``'s ``batches(r)`` (drawn untimed) all submitted at once, timed
    from a barrier to the last rank's end; the bytes the reads report, or ``nbytes`` a rank."""
    best = 0.0
    for r in range(repeats):
        todo = batches(r)
        if comm is not None:
            comm.Barrier()
        t0 = time.perf_counter()
        futures = [f for batch in todo for f in submit(batch)]
        wait(futures)
        got = combine(futures)[0]  # (raises a read's error)
        seconds = allreduce(comm, time.perf_counter() - t0, MAX)
        total = allreduce(comm, got if nbytes is None else nbytes, SUM)
        best = max(best, total / max(seconds, 1e-9))
    return best


def _place(comm: Any) -> tuple[int, int]:
    return (0, 1) if comm is None else (comm.Get_rank(), comm.Get_size())


def read_bandwidth(
    info: DatasetInfo,
    config: ReaderConfig,
    comm: Any,
    batch_size: int,
    throttle: Any = None,
    limit: int = 2**30,
    repeats: int = 3,
    seed: int = 0,
) -> float:
    """Aggregate bytes per second of cold reads of ``info``'s samples by all ranks of ``comm``
    (a collective), each rank with ``config``'s threads reading a random share of at most
    ``limit`` bytes in all, in batches of ``batch_size``; the best of ``repeats`` runs."""
    rank, world = _place(comm)
    n = info.num_samples
    take = int(min(n, max(world, limit // max(1, info.sample_bytes))))
    rows = max(1, batch_size)
    scratch = [np.empty((rows, *k.sample_shape), k.native_dtype) for k in info.keys]
    reader = Reader(info, config, throttle)

    def batches(r: int) -> list[np.ndarray]:
        ids = np.random.default_rng([seed, r]).permutation(n)[:take][rank::world]
        if rank == 0:
            evict(info.all_files)
        return [ids[lo : lo + rows] for lo in range(0, ids.size, rows)]

    try:
        reader.warm_up()
        return _best(comm, repeats, batches,
                     lambda b: reader.submit(b, scratch, np.arange(b.size)))  # fmt: skip
    finally:
        reader.close()


def tier_read_bandwidth(
    info: DatasetInfo,
    config: ReaderConfig,
    comm: Any,
    batch_size: int,
    directory: str | os.PathLike,
    limit: int = 256 * 2**20,
    repeats: int = 3,
    seed: int = 0,
) -> float:
    """Aggregate sample bytes per second read from second tiers in ``directory`` by all ranks
    of ``comm`` at once (a collective), as the loaders read theirs: each rank a
    :class:`~solar.cache.tier.TierFile` of its own, read by ``config``'s threads in random
    batches of ``batch_size`` into page-aligned rows; the best of ``repeats`` runs. At most
    ``limit`` bytes of slots in all and a slot per sample on each rank, written first (a slot
    never written would read as a hole, not from the device)."""
    rank, world = _place(comm)
    stride = tier_stride(info.keys)
    # No more slots than samples (as read_bandwidth reads no more than the dataset): a tier
    # never holds more, and a small dataset's run would otherwise write and read 256 MiB.
    slots = max(1, min(limit // stride // world, info.num_samples))
    rows = max(1, min(batch_size, slots))
    scratch = [
        aligned(rows * k.row_bytes)[: rows * k.row_bytes].view(k.native_dtype)
        .reshape(rows, *k.sample_shape)
        for k in info.keys
    ]  # fmt: skip
    rng = np.random.default_rng([seed, rank])
    for a in scratch:  # incompressible content
        a.view(np.uint8).reshape(-1)[:] = rng.integers(0, 256, a.nbytes, np.uint8)
    executor = Executor(config.thread_count)
    try:
        with TierFile(directory, slots=slots, keys=info.keys, executor=executor,
                      name=f"bandwidth-r{rank}") as tier:  # fmt: skip
            for lo in range(0, slots, rows):
                t = np.arange(lo, min(slots, lo + rows))
                tier.submit_write(t, scratch, np.arange(t.size) % rows)
            tier.wait_writes()

            def batches(r: int) -> list[np.ndarray]:
                order = np.random.default_rng([seed, rank, r]).permutation(slots)
                return [order[lo : lo + rows] for lo in range(0, slots, rows)]

            return _best(comm, repeats, batches,
                         lambda t: tier.submit_read(t, scratch, np.arange(t.size)),
                         slots * info.sample_bytes)  # fmt: skip
    finally:
        executor.close()

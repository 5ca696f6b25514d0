"""Storage read bandwidth as the loaders see it: every rank at once, each rank's reader
threads, random samples in batches (an epoch's misses), cold.

``solar bench`` divides the bytes an epoch reads by this bandwidth for the epoch's time limit.
A single-stream sequential read measures less than solar's threads reach (on this machine
0.53-0.78 GB/s against 1.68 GB read in 1.2 s), which put the "limit" above the measured
epochs. Here the bytes move through the loaders' own :class:`~solar.io.reader.Reader` (the
same executor, threads, read paths and throttle) with every batch submitted at once (no
fewer reads in flight than a loader keeps), on all ranks together; the best of a few runs is
kept, an upper estimate of the bandwidth, so the limit it gives is a lower bound on the time.
"""

from __future__ import annotations

import time
from concurrent.futures import wait
from typing import Any

import numpy as np

from solar.config import ReaderConfig
from solar.dist import MAX, SUM, allreduce
from solar.io.executor import combine
from solar.io.info import DatasetInfo
from solar.io.pagecache import evict
from solar.io.reader import Reader


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
    rank, world = (0, 1) if comm is None else (comm.Get_rank(), comm.Get_size())
    n = info.num_samples
    take = int(min(n, max(world, limit // max(1, info.sample_bytes))))
    rows = max(1, batch_size)
    scratch = [np.empty((rows, *k.sample_shape), k.native_dtype) for k in info.keys]
    reader = Reader(info, config, throttle)
    best = 0.0
    try:
        reader.warm_up()
        for r in range(repeats):
            ids = np.random.default_rng([seed, r]).permutation(n)[:take][rank::world]
            if rank == 0:
                evict(info.all_files)
            if comm is not None:
                comm.Barrier()
            t0 = time.perf_counter()
            futures = []
            for lo in range(0, ids.size, rows):
                batch = ids[lo : lo + rows]
                futures += reader.submit(batch, scratch, np.arange(batch.size))
            wait(futures)
            nbytes = combine(futures)[0]
            seconds = allreduce(comm, time.perf_counter() - t0, MAX)
            total = allreduce(comm, nbytes, SUM)
            best = max(best, total / max(seconds, 1e-9))
    finally:
        reader.close()
    return best

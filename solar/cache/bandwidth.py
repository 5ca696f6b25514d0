"""The second tier's read bandwidth as the loaders see it (``solar bench``'s limit of a tier
run): every rank's tier file at once, random batches of slots, O_DIRECT."""

from __future__ import annotations

import os
import time
from concurrent.futures import wait
from typing import Any

import numpy as np

from solar._memory import aligned
from solar.cache.tier import TierFile, tier_stride
from solar.config import ReaderConfig
from solar.dist import MAX, SUM, allreduce
from solar.io.executor import Executor, combine
from solar.io.info import DatasetInfo


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
    :class:`~solar.cache.tier.TierFile` of its own (O_DIRECT, whole-sample slots), read by
    ``config``'s threads in random batches of ``batch_size`` into page-aligned rows, every
    batch in flight at once; the best of ``repeats`` runs. At most ``limit`` bytes of slots in
    all and a slot per sample on each rank, written first (a slot never written would read as
    a hole, not from the device).

    A single-stream sequential read (what this replaced) measured less than
    the loaders' threads reach, which put a tier run's limit above its measured epochs."""
    rank, world = (0, 1) if comm is None else (comm.Get_rank(), comm.Get_size())
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
    best = 0.0
    try:
        with TierFile(directory, slots=slots, keys=info.keys, executor=executor,
                      name=f"bandwidth-r{rank}") as tier:  # fmt: skip
            for lo in range(0, slots, rows):
                t = np.arange(lo, min(slots, lo + rows))
                tier.submit_write(t, scratch, np.arange(t.size) % rows)
            tier.wait_writes()
            for r in range(repeats):
                order = np.random.default_rng([seed, rank, r]).permutation(slots)
                if comm is not None:
                    comm.Barrier()
                t0 = time.perf_counter()
                futures = []
                for lo in range(0, slots, rows):
                    t = order[lo : lo + rows]
                    futures += tier.submit_read(t, scratch, np.arange(t.size))
                wait(futures)
                combine(futures)  # (raises a read's error)
                seconds = allreduce(comm, time.perf_counter() - t0, MAX)
                total = allreduce(comm, slots * info.sample_bytes, SUM)
                best = max(best, total / max(seconds, 1e-9))
    finally:
        executor.close()
    return best

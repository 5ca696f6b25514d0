"""``solar bench``: loaders side by side, same processes, same epochs, same memory, cold storage.

Every rank runs, for each epoch, each loader in turn (interleaved, in an order rotated every
epoch, so drift in the host's disk cache hits all alike): the PyTorch DataLoader +
DistributedSampler over an h5py Dataset opened lazily in its workers, and solar's Loader with
each policy. Before every loader's epoch rank 0
evicts the data files' pages (posix_fadvise DONTNEED) and all ranks pass a barrier; an epoch's
time is the slowest rank's. Limits measured in the same run: the files' cold read bandwidth
as the loaders read (every rank, its reader threads, random batches; solar/cache/bandwidth.py)
and memory copy bandwidth, giving the epoch time limit
``max(bytes_read / read_bw, bytes_hit / mem_bw, compute)``: these overlap, so an epoch lasts
at least as long as the busiest.

With ``tier`` (a directory on local NVMe) ``solar`` and ``nopfs`` also get a second tier of
``tier_size`` (a size like ``buffer``: solar/config.py), ``solar-ram`` is solar without it, and the
limit takes ``bytes_tier / tier_bw`` into the max, with the tiers' O_DIRECT read bandwidth
measured here as the loaders read them (every rank's tier, its threads, random batches).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from solar._cpu import cores
from solar.cache.bandwidth import read_bandwidth, tier_read_bandwidth
from solar.config import DEFAULT_SLACK, ReaderConfig, per_rank
from solar.dist import MAX, allreduce
from solar.errors import SolarError
from solar.io.pagecache import cold_rounds, evict
from solar.io.sources import describe_source
from solar.io.throttle import Throttle
from solar.options import ExpertConfig, MemoryConfig, PlanningConfig
from solar.schedule.policy import TIERED
from solar.transform import Transform, load_transform, sample_rng
from solar.tune import MAX_READ_THREADS

log = logging.getLogger(__name__)  # solar.bench: what the harness is doing, for long runs' logs
WARM_FIELDS = ("warm_seconds", "compile_seconds")  # of loader.stats, reported per loader
LOADERS = ("torch", "lru", "fifo", "solar-artifact", "nopfs", "solar", "solar-ram", "static")
# With a weighted sampler: solar's baselines on the sampler's own split
# (solar.schedule.keep.baselines.tracebase).
WEIGHTED_LOADERS = ("torch", "lru", "static", "nopfs", "solar", "solar-ram")
# Variants of solar, compared when asked for: equal local batches (surplus rows handed between
# ranks, solar.exchange: the default with several ranks), local batches varying within the
# slack (the opt-in), and equal batches by slack 0 (each rank serves only its share).
VARIANTS: dict[str, dict[str, Any]] = {
    "solar-equal": {"equal_batches": True},
    "solar-variable": {"equal_batches": False},
    "solar-slack0": {"slack": 0.0},
}


# With --transform: solar without it, the transform applied in the training loop; and solar
# with it in worker processes (for transforms that hold the GIL).
INLOOP = "solar-inloop"
PROCS = "solar-procs"


def default_loaders(tier: bool, weighted: bool = False, transform: bool = False) -> tuple[str, ...]:
    """Every loader (of the sampler); ``solar-ram`` (solar without its tier) only when there
    is a tier; ``static`` only with a weighted sampler. With a transform: the DataLoader,
    solar with the transform in the training loop, and solar with it in its pipeline on
    threads and in processes."""
    if transform:
        return ("torch", INLOOP, "solar", PROCS)
    names = WEIGHTED_LOADERS if weighted else LOADERS[:-1]
    return names if tier else tuple(n for n in names if n != "solar-ram")


@dataclass(frozen=True)
class BenchConfig:
    """One benchmark: the data, the run's shape and which loaders to compare."""

    paths: tuple[str, ...]
    keys: tuple[str, ...] | None = None
    batch_size: int = 32
    epochs: int = 5
    # A share of the dataset over all ranks as a fraction (0.5), or a size as solar.config
    # reads it ("500", "2GiB": per rank; "50%").
    buffer: float | str = 0.5
    tier: str | None = None  # directory of the second tier (local NVMe)
    tier_size: float | str = 0.0  # the second tier, as buffer
    slack: float = DEFAULT_SLACK
    loaders: tuple[str, ...] | None = None  # None: default_loaders(tier)
    workers: int | None = None  # DataLoader workers; None: the cores this process may use
    reader: ReaderConfig = field(default_factory=ReaderConfig)  # (and one_per_file)
    throttle: str | None = None  # "MBps,latency_ms"
    compute_ms: float = 0.0
    seed: int = 0
    weights: str | None = None  # a .npy of weights: every loader draws as WeightedRandomSampler
    # MODULE:FUNC, a per-sample transform every loader applies: the DataLoader in
    # __getitem__, solar in its pipeline (transform=), and solar-inloop in the training loop.
    transform: str | None = None


@dataclass
class LoaderResult:
    name: str
    epoch_seconds: list[float] = field(default_factory=list)
    samples: list[int] = field(default_factory=list)
    hits: list[int] = field(default_factory=list)  # from RAM
    tier_hits: list[int] = field(default_factory=list)
    bytes_read: list[int] = field(default_factory=list)  # from storage, as stored
    # From storage, logical: samples read × sample bytes, counted alike for every loader (the
    # DataLoader's stored bytes are h5py's, unseen; a compressed file's differ).
    logical_bytes: list[int] = field(default_factory=list)
    stall_seconds: list[float] = field(default_factory=list)
    rows_moved: list[int] = field(default_factory=list)  # equal batches: between ranks
    exchange_seconds: list[float] = field(default_factory=list)  # moving them (slowest rank)
    cpu_seconds: list[float] = field(default_factory=list)  # the machine's, in each epoch
    # solar loaders, over the run, per rank: stage figures (solar/stats.py), the bottleneck
    # line, and where threads="auto" left its knobs.
    stages: list[dict] = field(default_factory=list)
    bottleneck: list[tuple[str, str]] = field(default_factory=list)
    tuned: list[dict] = field(default_factory=list)


def machine_cpu_seconds() -> float:
    """CPU seconds spent by every process on this machine so far (busy, not idle or waiting
    for I/O): what a loader's epoch costs, workers and ranks included, when it runs alone."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    busy = sum(fields[:3]) + sum(fields[5:8])  # user nice system, irq softirq steal
    return busy / os.sysconf("SC_CLK_TCK")


@functools.cache  # (the machine's: measured once per process, not again each run)
def memory_bandwidth(nbytes: int = 256 * 2**20, repeats: int = 5) -> float:
    """Bytes per second of a large in-memory copy (best of ``repeats``: an upper estimate),
    measured at the first call of a process."""
    src = np.ones(nbytes, np.uint8)
    dst = np.ones_like(src)  # (touched: no page faults in the copies timed)
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best


def limit_terms(
    *,
    bytes_read: int,
    hits: int,
    tier_hits: int,
    steps: int,
    compute_ms: float,
    sample_bytes: int,
    world: int,
    limits: Mapping[str, float],
) -> dict[str, float]:
    """The seconds each part of one solar epoch needs at least, from measured bandwidths.

    ``bytes_read``, ``hits`` (from RAM) and ``tier_hits`` are the epoch's over all ranks;
    ``steps`` its steps per rank, each computing ``compute_ms``; ``limits`` the bandwidths
    measured in the run (bytes/s): ``read_bytes_per_s`` and ``tier_bytes_per_s`` all ranks'
    together, ``mem_bytes_per_s`` one rank's copy. The terms, each present only when the epoch
    has that part (so every term is > 0):

    * ``read``: ``bytes_read / read_bytes_per_s``, storage reads on the reader threads;
    * ``compute``: ``steps * compute_ms``, the training steps;
    * ``memory``: ``hits * sample_bytes / world / mem_bytes_per_s``, copies of RAM hits on the
      consuming thread: memory's bandwidth is one rank's, so the term is the average rank's
      share (the slowest rank has at least as much);
    * ``tier``: ``tier_hits * sample_bytes / tier_bytes_per_s``, second-tier reads.

    These overlap, so the epoch lasts at least as long as the largest (:func:`epoch_limit`);
    their sum would not be a lower bound. Raises ValueError for a negative amount, or a term
    whose bandwidth is missing or not positive.
    """
    if world < 1 or min(bytes_read, hits, tier_hits, steps, compute_ms, sample_bytes) < 0:
        raise ValueError(f"limit: amounts must be >= 0 and world >= 1, got world {world}")
    terms: dict[str, float] = {}
    for name, nbytes, key in (
        ("read", bytes_read, "read_bytes_per_s"),
        ("memory", hits * sample_bytes / world, "mem_bytes_per_s"),
        ("tier", tier_hits * sample_bytes, "tier_bytes_per_s"),
    ):
        if nbytes > 0:
            bandwidth = limits.get(key, 0.0)
            if not bandwidth > 0:  # (also NaN) a term that would be infinite or meaningless
                raise ValueError(f"limit: the {name} term needs {key} > 0, got {bandwidth}")
            terms[name] = nbytes / bandwidth
    if steps > 0 and compute_ms > 0:
        terms["compute"] = steps * compute_ms / 1e3
    return terms


def epoch_limit(terms: Mapping[str, float]) -> float:
    """The lower bound on one solar epoch's time from its :func:`limit_terms`: the largest
    (they overlap); 0 for an epoch with nothing to do."""
    return max(terms.values(), default=0.0)


class H5Dataset:
    """The setup users run today: a map-style Dataset opening the file lazily per worker.

    One-sample files (HDF5 or .npy) are opened per sample, as such datasets are read today.
    """

    def __init__(self, info, throttle: Throttle | None = None, transform: Any = None,
                 seed: int = 0) -> None:  # fmt: skip
        self.files = [str(p) for p in info.files]
        self.keys = [k.name for k in info.keys]
        self.npy = [[str(p) for p in fs] for fs in info.key_files] if info.format == "npy" else []
        self.one_per_file = info.one_per_file
        self.starts = np.concatenate([[0], np.cumsum(info.lengths)])
        self.sample_bytes = info.sample_bytes
        self.throttle = throttle
        self.transform, self.seed = transform, seed
        self.handles: dict[int, Any] = {}

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, i: int) -> dict:
        import h5py
        import torch

        f = int(np.searchsorted(self.starts, i, side="right") - 1)
        local = int(i - self.starts[f])
        if self.npy:
            arrays = [np.load(fs[f], mmap_mode="r") for fs in self.npy]
            rows = [np.array(a if self.one_per_file else a[local]) for a in arrays]
            out = {k: torch.from_numpy(r) for k, r in zip(self.keys, rows, strict=True)}
        elif self.one_per_file:
            with h5py.File(self.files[f], "r") as fh:
                out = {k: torch.from_numpy(np.asarray(fh[k][()])) for k in self.keys}
        else:
            out = self._many(f, local)
        if self.throttle is not None:
            self.throttle.wait(self.sample_bytes, len(self.keys))
        if self.transform is not None:  # as a user's __getitem__ would (its rng: the sample's)
            got = self.transform({k: v.numpy() for k, v in out.items()},
                                 sample_rng(self.seed, 0, i, 0, 0))  # fmt: skip
            out = {k: torch.from_numpy(np.asarray(v)) for k, v in got.items()}
        return out

    def _many(self, f: int, local: int) -> dict:
        import h5py
        import torch

        if f not in self.handles:
            self.handles[f] = h5py.File(self.files[f], "r")
        return {k: torch.from_numpy(self.handles[f][k][local]) for k in self.keys}


def run(cfg: BenchConfig, comm: Any, progress=None) -> dict | None:
    """Run the benchmark on every rank of ``comm``; rank 0 returns the results."""
    rank, world = comm.Get_rank(), comm.Get_size()
    info = describe_source(  # one scan for the job and every loader in it
        list(cfg.paths), list(cfg.keys) if cfg.keys else None,
        one_per_file=cfg.reader.one_per_file, comm=comm,
    )  # fmt: skip
    n, sample_bytes = info.num_samples, info.sample_bytes
    cfg = _with_loaders(cfg)
    solar_sampler = None
    if cfg.weights is not None:
        from solar.schedule.draw.samplers import Weighted

        solar_sampler = Weighted(cfg.weights)
        solar_sampler.check(n)
    sizes = {"num_samples": n, "sample_bytes": sample_bytes, "world_size": world}
    capacity = per_rank(cfg.buffer, name="--buffer", **sizes)
    tier_capacity = per_rank(cfg.tier_size, name="--tier-size", **sizes) if cfg.tier else 0
    throttle = Throttle.parse(cfg.throttle) if cfg.throttle else None
    fn = load_transform(cfg.transform) if cfg.transform else None
    limits = _limits(cfg, info, comm, throttle)
    if rank == 0:
        log.info("bench: constructing the loaders %s (each rehearses its run)",
                 ", ".join(cfg.loaders or ()))  # fmt: skip
    loaders: dict[str, Any] = {}
    if "torch" in (cfg.loaders or ()):
        loaders["torch"] = _torch_loader(cfg, info, comm, throttle, fn, solar_sampler)
    loaders.update(_solar_loaders(cfg, info, comm, (capacity, tier_capacity), throttle, fn,
                                  solar_sampler))  # fmt: skip
    loaders = {name: loaders[name] for name in cfg.loaders or ()}  # the order asked for
    # Each Loader compiled its kernels when constructed (solar/warm.py): none in a timed epoch.
    warm = {
        name: {k: allreduce(comm, float(getattr(ld.stats, k)), MAX) for k in WARM_FIELDS}
        for name, ld in loaders.items()
        if name != "torch"
    }
    results = _run_epochs(cfg, loaders, list(info.all_files), sample_bytes, comm, fn, progress)
    _gather_stages(loaders, results, comm)
    if rank != 0:
        return None
    # The bound is the spec's: no need to plan the run again for it.
    spec = loaders["solar"].spec if "solar" in loaders else None
    out = _summarise(cfg, world, n, sample_bytes, (capacity, tier_capacity), limits, results,
                     spec, throttle)  # fmt: skip
    out["warm"] = warm
    return out


def _with_loaders(cfg: BenchConfig) -> BenchConfig:
    """``cfg`` with its loaders: as named (each known), or the default ones."""
    weighted = cfg.weights is not None
    if cfg.loaders is None:
        chosen = default_loaders(cfg.tier is not None, weighted, cfg.transform is not None)
        cfg = dataclasses.replace(cfg, loaders=chosen)
    assert cfg.loaders is not None
    known = WEIGHTED_LOADERS if weighted else (*LOADERS[:-1], *VARIANTS)
    known += (INLOOP, PROCS) if cfg.transform else ()
    unknown = set(cfg.loaders) - set(known)
    if unknown:
        raise SolarError(
            f"--loaders: unknown {', '.join(sorted(unknown))} (choose from {', '.join(known)})"
        )
    return cfg


def _limits(cfg: BenchConfig, info: Any, comm: Any, throttle: Throttle | None) -> dict:
    """The bandwidths the epochs' limit is made of, measured now, the same on every rank.

    Storage read as the loaders read it (all ranks, their threads, random batches): the
    limit it gives is a lower bound on an epoch's time (solar/cache/bandwidth.py).
    threads="auto" may read with up to MAX_READ_THREADS: the limit is measured with those,
    else it would not bound what the tuned loaders reach."""
    rank, world = comm.Get_rank(), comm.Get_size()
    bw_reader = cfg.reader
    if cfg.reader.auto:
        bw_reader = dataclasses.replace(cfg.reader, threads=MAX_READ_THREADS)
    if rank == 0:
        log.info("bench: %d samples on %d ranks; measuring the cold read bandwidth",
                 info.num_samples, world)  # fmt: skip
    read_bw = read_bandwidth(info, bw_reader, comm, cfg.batch_size, throttle, seed=cfg.seed)
    # The tiers likewise: all ranks' at once, their threads, random batches of slots.
    tier_bw = (tier_read_bandwidth(info, cfg.reader, comm, cfg.batch_size, cfg.tier,
                                   seed=cfg.seed) if cfg.tier else 0.0)  # fmt: skip
    limits = None
    if rank == 0:
        limits = {"read_bytes_per_s": read_bw, "mem_bytes_per_s": memory_bandwidth(),
                  "read_threads": bw_reader.thread_count * world}  # fmt: skip
        if cfg.tier:
            limits["tier_bytes_per_s"] = tier_bw  # all ranks' together, as storage's
    limits = comm.bcast(limits, root=0)
    if throttle is not None:
        limits["read_bytes_per_s"] = min(limits["read_bytes_per_s"], throttle.bytes_per_s * world)
    return limits


def _torch_loader(cfg: BenchConfig, info: Any, comm: Any, throttle: Throttle | None, fn: Any,
                  solar_sampler: Any) -> tuple[Any, Any]:  # fmt: skip
    """The DataLoader and its sampler (DistributedSampler, or per-rank weighted draws)."""
    from torch.utils.data import DataLoader, DistributedSampler

    rank, world = comm.Get_rank(), comm.Get_size()
    workers = cores() if cfg.workers is None else cfg.workers
    ds: Any = H5Dataset(info, throttle, fn, cfg.seed)  # a map-style Dataset by protocol
    sampler: Any = DistributedSampler(ds, num_replicas=world, rank=rank, seed=cfg.seed)
    if solar_sampler is not None:
        sampler = _RankWeighted(solar_sampler.weights, info.num_samples // world, cfg.seed, rank)
    dl: Any = DataLoader(
        ds, batch_size=cfg.batch_size, sampler=sampler, num_workers=workers,
        persistent_workers=workers > 0,
    )  # fmt: skip
    # Fork the persistent workers now, while this process is small: forked after solar's
    # buffers exist, they would share those pages copy-on-write, and every first write to a
    # buffer page (each admission of epoch 0) would pay a page fault and a 4 KiB copy.
    iter(dl)
    return dl, sampler


def _solar_loaders(cfg: BenchConfig, info: Any, comm: Any, capacity: tuple[int, int],
                   throttle: Throttle | None, fn: Any,
                   solar_sampler: Any) -> dict[str, Any]:  # fmt: skip
    """solar's Loader for each of ``cfg``'s other loaders: a policy or a variant of solar,
    under the same RAM ``capacity`` (and tier) per rank."""
    from solar.loader import Loader

    buffer, tier_capacity = capacity
    loaders: dict[str, Any] = {}
    for name in cfg.loaders or ():
        if name == "torch":
            continue
        policy = "solar" if name in ("solar-ram", INLOOP, PROCS) or name in VARIANTS else name
        # The policies that plan a tier (solar-ram is solar without its tier; of a sampler's
        # trace: solar only).
        tiers = ("solar",) if cfg.weights is not None else TIERED
        tiered = policy in tiers and name != "solar-ram" and tier_capacity > 0
        loaders[name] = Loader(
            info, [k.name for k in info.keys], batch_size=cfg.batch_size, epochs=cfg.epochs,
            buffer=buffer, seed=cfg.seed, comm=comm, reader=cfg.reader, sampler=solar_sampler,
            transform=None if name == INLOOP or fn is None
            else Transform(fn, processes=name == PROCS),
            planning=dataclasses.replace(PlanningConfig(policy=policy, slack=cfg.slack),
                                         **VARIANTS.get(name, {})),
            expert=ExpertConfig(throttle=throttle),
            # (The node buffer is solar-host's, in the GNN bench.)
            memory=MemoryConfig(tier=cfg.tier if tiered else None,
                                tier_size=tier_capacity if tiered else 0, share="rank"),
        )  # fmt: skip
    return loaders


def _run_epochs(cfg: BenchConfig, loaders: dict[str, Any], files: list, sample_bytes: int,
                comm: Any, fn: Any, progress: Any) -> dict[str, LoaderResult]:  # fmt: skip
    """Every loader's epochs, interleaved in an order rotated each epoch, each from cold
    storage behind a barrier; their figures over all ranks."""
    results = {name: LoaderResult(name) for name in loaders}
    for epoch, name in cold_rounds(list(loaders), cfg.epochs, comm, lambda: evict(files)):
        loader = loaders[name]
        t0, cpu0 = time.perf_counter(), machine_cpu_seconds()
        inloop = (fn, cfg.seed) if name == INLOOP else None
        count = _epoch(name, loader, epoch, cfg.compute_ms, inloop)
        seconds = allreduce(comm, time.perf_counter() - t0, MAX)
        r = results[name]
        r.epoch_seconds.append(seconds)
        r.cpu_seconds.append(machine_cpu_seconds() - cpu0)  # rank 0's figure is reported
        r.samples.append(comm.allreduce(count))
        if name != "torch":
            st = loader.stats.epochs[epoch]
            r.hits.append(comm.allreduce(st.hits))
            r.tier_hits.append(comm.allreduce(st.tier_hits))
            r.bytes_read.append(comm.allreduce(st.bytes_read))
            r.logical_bytes.append(comm.allreduce(st.reads + st.side_reads) * sample_bytes)
            r.stall_seconds.append(allreduce(comm, st.stall_seconds, MAX))
            r.rows_moved.append(comm.allreduce(st.sent))
            r.exchange_seconds.append(allreduce(comm, st.exchange_seconds, MAX))
        else:
            r.bytes_read.append(r.samples[-1] * sample_bytes)
            r.logical_bytes.append(r.samples[-1] * sample_bytes)
        if progress is not None and comm.Get_rank() == 0:
            progress(epoch, name, seconds)
    return results


def _gather_stages(loaders: dict[str, Any], results: dict[str, LoaderResult], comm: Any) -> None:
    """Each solar loader's stage figures, bottleneck and tuned knobs from every rank into
    ``results`` (on rank 0); then the loaders closed."""
    rank, world = comm.Get_rank(), comm.Get_size()
    for name, loader in loaders.items():
        if name != "torch":
            figures = {n: f.as_dict() for n, f in loader.stats.stages().items()}
            mine = (figures, loader.stats.bottleneck(), loader.stats.tuned)
            every = [mine] if world == 1 else comm.gather(mine, root=0)
            if rank == 0:
                r = results[name]
                r.stages, r.bottleneck, r.tuned = (list(x) for x in zip(*every, strict=True))
            loader.close()


class _RankWeighted:
    """What a DDP user runs with weights: ``WeightedRandomSampler`` on each rank (its own
    seed per rank and epoch, ``num_samples`` N/P), with ``set_epoch``."""

    def __init__(self, weights: np.ndarray, num_samples: int, seed: int, rank: int) -> None:
        self.weights, self.num_samples, self.seed, self.rank = weights, num_samples, seed, rank
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self):
        import torch
        from torch.utils.data import WeightedRandomSampler

        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.rank * 10_007 + self.epoch)
        w: Any = torch.as_tensor(self.weights, dtype=torch.double)  # a Sequence by protocol
        return iter(WeightedRandomSampler(w, self.num_samples, replacement=True, generator=g))


def _epoch(name: str, loader: Any, epoch: int, compute_ms: float, inloop: Any = None) -> int:
    """One epoch of ``loader``; ``inloop`` (fn, seed): transform each batch's samples in the
    training loop, one at a time, as users of a loader without transforms do."""
    count = 0
    if name == "torch":
        dl, sampler = loader
        sampler.set_epoch(epoch)
        batches = iter(dl)
    else:
        loader.set_epoch(epoch)
        batches = iter(loader)
    for step, batch in enumerate(batches):
        count += len(next(iter(batch.values())))
        if inloop is not None:
            fn, seed = inloop
            batch = _transform_in_loop(batch, fn, seed, epoch, step)
        if compute_ms:
            time.sleep(compute_ms / 1e3)
    if name != "torch":
        # Reads started ahead into the next epoch are this window's: none runs on while
        # another loader is timed, and the limit's bytes are all read inside timed windows.
        loader.wait_reads()
    return count


def _transform_in_loop(batch: dict, fn: Any, seed: int, epoch: int, step: int) -> dict:
    import torch

    ids = batch["index"].tolist()
    rows = [fn({k: v[i].numpy() for k, v in batch.items() if k != "index"},
               sample_rng(seed, epoch, s, step, 0)) for i, s in enumerate(ids)]  # fmt: skip
    return {k: torch.from_numpy(np.stack([r[k] for r in rows])) for k in rows[0]}


def _summarise(cfg, world, n, sample_bytes, capacity, limits, results, spec, throttle) -> dict:
    out: dict = {
        "config": {
            **dataclasses.asdict(cfg),
            "world_size": world,
            "num_samples": n,
            "sample_bytes": sample_bytes,
            "buffer_per_rank": capacity[0],
            "tier_per_rank": capacity[1],
            "throttle": str(throttle) if throttle else None,
        },
        "limits": limits,
        "loaders": {},
    }
    base = None
    for name, r in results.items():
        total = sum(r.epoch_seconds)
        rate = sum(r.samples) / total
        entry = {
            "epoch_seconds": r.epoch_seconds,
            "samples_per_second": rate,
            "bytes_read": r.bytes_read,
            "logical_bytes_read": r.logical_bytes,
            "stall_seconds": r.stall_seconds,
            "cpu_seconds_per_sample": sum(r.cpu_seconds) / max(1, sum(r.samples)),
        }
        if r.hits:
            both = [h + t for h, t in zip(r.hits, r.tier_hits, strict=True)]
            entry["hit_rate_per_epoch"] = [h / s for h, s in zip(both, r.samples, strict=True)]
            entry["hit_rate"] = sum(both) / sum(r.samples)
            entry["ram_hits"], entry["tier_hits"] = r.hits, r.tier_hits
        if r.stages:  # per rank
            entry["stages"] = r.stages
            entry["bottleneck"] = [line for _, line in r.bottleneck]
            entry["bottleneck_stage"] = [stage for stage, _ in r.bottleneck]
            if any(r.tuned):
                entry["tuned"] = r.tuned
        if any(r.rows_moved):
            entry["rows_moved"] = r.rows_moved
            entry["bytes_moved"] = [m * sample_bytes for m in r.rows_moved]
            entry["exchange_seconds"] = r.exchange_seconds
        if name == "torch":
            base = rate
        out["loaders"][name] = entry
    for entry in out["loaders"].values():
        entry["speedup"] = entry["samples_per_second"] / base if base else None
    if spec is not None:
        if not spec.traced:  # (P·C bounds permutations only)
            out["bound"] = spec.bound
        r = results["solar"]
        steps = spec.run.steps_per_epoch
        terms = []
        for hits, tier, nbytes in zip(r.hits, r.tier_hits, r.bytes_read, strict=True):
            terms.append(limit_terms(bytes_read=nbytes, hits=hits, tier_hits=tier, steps=steps,
                                     compute_ms=cfg.compute_ms, sample_bytes=sample_bytes,
                                     world=world, limits=limits))  # fmt: skip
        limit = [epoch_limit(t) for t in terms]
        solar = out["loaders"]["solar"]
        # The limit's inputs beside it: the limit can be recomputed from the result alone.
        solar["steps_per_epoch"] = steps
        solar["epoch_limit_terms"] = terms
        solar["epoch_limit_seconds"] = limit
        solar["share_of_limit"] = sum(r.epoch_seconds) / sum(limit)
    return out


def _size(what: str, size: float | str) -> str:
    """A config's size as given: a share (a fraction) over all ranks, else per rank."""
    return f"aggregate {what} {100 * size:.0f} %" if isinstance(size, float) else f"{what} {size}"


def format_results(res: dict) -> str:
    c, lim = res["config"], res["limits"]
    tier = c.get("tier_per_rank", 0)
    lines = [
        f"{c['num_samples']} samples of {c['sample_bytes'] / 2**10:.0f} KiB, P={c['world_size']}, "
        f"B={c['batch_size']}, {c['epochs']} cold epochs, {_size('buffer', c['buffer'])} "
        f"({c['buffer_per_rank']} samples/rank)"
        + (f", {_size('tier', c['tier_size'])} ({tier} samples/rank)" if tier else "")
        + f", compute {c['compute_ms']} ms/step"
        + (f", throttle {c['throttle']}" if c["throttle"] else ""),
        f"limits: cold read {lim['read_bytes_per_s'] / 1e9:.2f} GB/s "
        f"({lim.get('read_threads', 1)} threads over the ranks, random batches), "
        f"memory copy {lim['mem_bytes_per_s'] / 1e9:.2f} GB/s"
        + (f", tier read {lim['tier_bytes_per_s'] / 1e9:.2f} GB/s" if tier else ""),
        "",
        "| loader | samples/s | speedup | hit rate | bound (run) | RAM hits | tier hits | GB read "
        "(logical) | max stall s | CPU ms/sample | epoch s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, e in res["loaders"].items():
        hit = f"{100 * e['hit_rate']:.1f} %" if "hit_rate" in e else "—"
        bound = f"{100 * res['bound']:.1f} %" if "hit_rate" in e and "bound" in res else "—"
        ram, tiers = (sum(e[k]) if k in e else "—" for k in ("ram_hits", "tier_hits"))
        stall = f"{max(e['stall_seconds']):.2f}" if e["stall_seconds"] else "—"
        epochs = " ".join(f"{t:.2f}" for t in e["epoch_seconds"])
        speedup = f"{e['speedup']:.2f}×" if e["speedup"] else "—"
        lines.append(
            f"| {name} | {e['samples_per_second']:.0f} | {speedup} | {hit} | {bound} | {ram} | "
            f"{tiers} | {sum(e['logical_bytes_read']) / 1e9:.2f} | {stall} | "
            f"{1e3 * e['cpu_seconds_per_sample']:.2f} | {epochs} |"
        )
    lines.append("")
    lines.append(
        "GB read (logical): samples read from storage × their size, for every loader alike "
        "(a compressed file's stored bytes are fewer: bytes_read in the JSON)"
    )
    if "bound" in res:
        lines.append(
            f"bound (run): the largest hit rate over the whole run, epoch 0 cold, "
            f"min(P·C, N)·(E−1)/(N·E) = {100 * res['bound']:.1f} %; from epoch 1 on, per "
            f"epoch: {100 * steady_bound(res['bound'], c['epochs']):.1f} % (the plot's dashed line)"
        )
    idle = not res["config"].get("compute_ms")
    for name, e in res["loaders"].items():
        if "bottleneck" in e and idle and e["bottleneck_stage"][0] == "trainer":
            # Nothing trains: the loop keeping up names no stage worth speeding up.
            lines.append(f"{name}: no bottleneck (nothing trains, --compute-ms 0; the loader "
                         "kept up with an empty loop)")  # fmt: skip
        elif "bottleneck" in e:  # rank 0's line; the others' stages if they differ
            others = sorted(set(e["bottleneck_stage"][1:]) - {e["bottleneck_stage"][0]})
            line = f"{name}: {e['bottleneck'][0]}"
            line += f" (other ranks: {', '.join(others)})" if others else ""
            line += f"; tuned {_tuned(e['tuned'][0])}" if e.get("tuned") else ""
            lines.append(line)
    for name, e in res["loaders"].items():
        if "rows_moved" in e:
            lines.append(
                f"\n{name}: moved between ranks {sum(e['bytes_moved']) / 1e9:.2f} GB over "
                f"{len(e['rows_moved'])} epochs ({sum(e['rows_moved'])} rows); exchange s per "
                f"epoch (slowest rank) {' '.join(f'{t:.2f}' for t in e['exchange_seconds'])}"
            )
    if res.get("warm"):
        w = res["warm"].values()
        lines.append(
            f"\nkernels compiled before the first timed epoch: "
            f"{sum(x['warm_seconds'] for x in w):.2f} s warming the loaders, of which "
            f"{sum(x['compile_seconds'] for x in w):.2f} s compiling (max over ranks)"
        )
    s = res["loaders"].get("solar", {})
    if "epoch_limit_seconds" in s:
        # Each epoch's limit and the term that sets it.
        limit = " ".join(
            f"{t:.2f}" + (f" ({max(ts, key=ts.__getitem__)})" if ts else "")
            for t, ts in zip(s["epoch_limit_seconds"], s["epoch_limit_terms"], strict=True)
        )
        lines.append(
            f"\nsolar epoch time / time limit: {s['share_of_limit']:.2f} "
            f"(limits per epoch, s: {limit})"
        )
    return "\n".join(lines)


def _tuned(knobs: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in knobs.items())


def steady_bound(bound: float, epochs: int) -> float:
    """The bound on one epoch's hit rate from epoch 1 on (epoch 0 is cold): the whole run's
    ``bound``, ``min(P·C, N)·(E−1)/(N·E)``, without its cold epoch."""
    return bound * epochs / max(1, epochs - 1)


def plot(res: dict, path: Path) -> None:
    """Throughput per loader and hit rate per epoch against the bound, as a PNG; a GNN
    gathering result (``--sampler neighbor``) plots nodes/s."""
    graph = res["config"].get("sampler") == "neighbor"
    rate, unit = ("nodes_per_second", "nodes/s") if graph else ("samples_per_second", "samples/s")
    names = list(res["loaders"])
    plt, fig, (a, b) = _figure(2)
    a.bar(names, [res["loaders"][k][rate] for k in names], color="tab:blue")
    a.set_ylabel(unit)
    a.set_title("throughput (cold storage each epoch)")
    a.tick_params(axis="x", rotation=30)
    for k in names:
        if "hit_rate_per_epoch" in res["loaders"][k]:
            b.plot([100 * h for h in res["loaders"][k]["hit_rate_per_epoch"]], marker="o", label=k)
    _hit_rate_axes(b, res["config"]["epochs"], res.get("bound"))
    b.set_title("feature rows served from the buffer" if graph else "buffer hit rate")
    _save(plt, fig, b, path)


def plot_plan(summary: dict, path: Path) -> None:
    """``solar plan --plot``: the planned hit rate of every epoch against the bound (P·C
    held of N, from epoch 1 on), as a PNG."""
    plt, fig, (b,) = _figure(1)
    rates = [100 * h for h in summary["hit_rate_per_epoch"]]
    b.plot(range(len(rates)), rates, marker="o", label=f"{summary['policy']} (planned)")
    _hit_rate_axes(b, len(rates), summary.get("bound"), summary["epochs"])
    kind = summary["sampler"]["kind"]
    b.set_title(f"N={summary['num_samples']}, P={summary['world_size']}, "
                f"B={summary['batch_size']}, C={summary['buffer']}/rank, {kind}")  # fmt: skip
    _save(plt, fig, b, path)


def _hit_rate_axes(b: Any, shown: int, bound: float | None, epochs: int | None = None) -> None:
    """``shown`` epochs along x, hit rate % along y, and the bound on epochs >= 1 of a run of
    ``epochs`` (default ``shown``) whose bound is ``bound`` (None: none)."""
    if bound is not None:
        b.axhline(100 * steady_bound(bound, epochs or shown), ls="--", color="gray",
                  label=f"bound, epochs ≥ 1 (run: {100 * bound:.1f} %)")  # fmt: skip
    b.set_xticks(range(shown))
    b.set_xlabel("epoch")
    b.set_ylabel("hit rate %")


def _figure(panels: int) -> tuple[Any, Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels + 1.5, 4), squeeze=False)
    return plt, fig, tuple(axes[0])


def _save(plt: Any, fig: Any, legend_axes: Any, path: Path) -> None:
    """The legend beside the axes (never over a point), the PNG written atomically."""
    top = legend_axes.get_ylim()[1]
    legend_axes.set_ylim(-0.04 * top, 1.06 * top)  # whole markers at 0 % and on the bound
    legend_axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=110, bbox_inches="tight")
    plt.close(fig)
    os.replace(tmp, path)


def relaunch_command(world: int, argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """The command and environment that run this same command under ``mpiexec -n world``.

    The ranks import the solar this process runs, whatever the working directory holds: ``-P``
    keeps the directory (a clone named ``solar/`` beside the user, say) off the import path, and
    a solar run from a source tree has that tree put first."""
    mpiexec = Path(sys.executable).with_name("mpiexec")
    if not mpiexec.exists():
        raise SolarError(f"--world-size {world} needs mpiexec (not found beside {sys.executable})")
    import site

    import solar

    env = {**os.environ, "SOLAR_BENCH_CHILD": "1"}
    root = str(Path(solar.__file__).resolve().parents[1])
    if root not in {str(Path(p).resolve()) for p in site.getsitepackages()}:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    cmd = [str(mpiexec), "-n", str(world), sys.executable, "-P", "-m", "solar.cli", *argv]
    return cmd, env


def relaunch_under_mpi(world: int, argv: list[str]) -> int:
    """Run this same command under ``mpiexec -n world`` (the one beside this Python)."""
    import subprocess

    cmd, env = relaunch_command(world, argv)
    return subprocess.call(cmd, env=env)

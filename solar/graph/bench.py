"""``solar bench GRAPH.h5 --sampler neighbor``: GNN feature gathering, loaders side by side.

The workload is Ginex's: each rank samples a k-hop subgraph around its seeds every step
(:class:`~solar.graph.neighbor.NeighborSampler`) and gathers the feature rows of the
subgraph's distinct nodes. Every loader serves the same subgraphs under the same memory
budget (``buffer``: a share of the feature rows over all ranks, or rows or bytes per rank):

* ``mmap``: PyTorch Geometric's gather from memory-mapped features with the page cache
  limited to the budget, EMULATED (:mod:`solar.graph.mmapbase`: an LRU of 4 KiB pages of the
  budget's bytes, missing pages read with O_DIRECT on the reader's threads);
* ``lru``, ``static`` (hot nodes by the frequency of a pre-sampled epoch, as DiskGNN and GIDS
  cache) and ``solar`` (Belady over the sampler's trace): solar's Loader with that policy, the
  same reader (O_DIRECT page spans of small rows, ``PageGather``); on request ``solar-rows``,
  solar planning rows alone without packing; ``solar-host`` (with several ranks by default,
  ``--share auto``; or ``--share node``), solar with one buffer per host shared by its ranks
  (``MemoryConfig(share="node")``: Belady over the host's union, a row several local ranks need
  read once). ``solar`` and ``solar-host`` read misses from windows packed in plan order where the
  cost model chooses (``--pack-disk``), their plans rows alone where packing can pay
  (``PackModel.packs``); ``solar-random`` and ``solar-host-random`` are them without packing:
  every miss a random page read, their plans keeping page mates
  (:mod:`solar.schedule.draw.pagemates`), today's path.

As in ``solar bench``: every rank runs each loader's epoch in turn, in an order rotated every
epoch, behind a barrier; an epoch's time is the slowest rank's. Feature reads bypass the page
cache (O_DIRECT) and rank 0 also drops the features' cached pages before each loader's epoch;
the topology stays cached (memory-mapped, as any GNN trainer keeps it). Reported per loader:
training steps/s (global steps), nodes gathered/s (all ranks), hit rate (rows served without
a storage read), read amplification (bytes read / bytes of the rows read), construction
seconds and epoch 0's wait for its first batch.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any

from solar._memory import PAGE
from solar.config import ReaderConfig, per_rank
from solar.dist import MAX, allreduce
from solar.errors import SolarError
from solar.io.pagecache import cold_rounds, evict
from solar.io.throttle import Throttle
from solar.options import ExpertConfig, MemoryConfig, PackingConfig, PlanningConfig
from solar.schedule.draw.samplers import sampler_run

GRAPH_LOADERS = ("mmap", "lru", "static", "solar")
# Also on request: ``solar-rows``, solar planning rows alone, no packing: what page mates add;
# ``solar-host``, solar with one buffer per host (--share node; --share auto with -P > 1).
# ``solar-random``, solar reading every miss as random pages (no packing): today's path;
# ``solar-host-random``, solar-host so.
MORE_LOADERS = ("solar-rows", "solar-host", "solar-random", "solar-host-random")
_PACKED = ("solar", "solar-host")  # the loaders packing misses where the model chooses


@dataclass(frozen=True)
class GraphBenchConfig:
    """One GNN gathering benchmark: the graph, the sampling, the budget and the loaders."""

    path: str
    key: str = "features"
    fanouts: tuple[int, ...] = (10, 5)
    batch_size: int = 1024  # seeds per rank and step
    epochs: int = 3
    # The budget: a share of the feature rows over all ranks as a fraction (0.1), or a size as
    # solar.config reads it ("2000" rows, "64MiB": per rank; "10%").
    buffer: float | str = 0.1
    loaders: tuple[str, ...] = GRAPH_LOADERS
    # The Loader's default read path (O_DIRECT for feature rows where the file system takes
    # it: solar.runtime.setup), what a user gets; the mmap baseline reads with O_DIRECT.
    reader: ReaderConfig = field(default_factory=ReaderConfig)
    throttle: str | None = None  # "MBps,latency_ms" per rank
    compute_ms: float = 0.0  # a simulated training step
    seed: int = 0
    # Seconds per queue depth of the storage probe run beside the figures (solar/io/probe.py,
    # on the features' bytes, rank 0, before the epochs); 0: none.
    probe_seconds: float = 1.0
    # ``solar``'s and ``solar-host``'s packed windows (MemoryConfig(pack=...)): their disk per
    # rank (0: none) and
    # directory (None: the system's temporary one, refused where it is tmpfs); the model is fed
    # the probe's rates.
    pack_disk: str = "8GiB"  # (the one default: solar bench --pack-disk leaves it)
    pack_dir: str | None = None

    def __post_init__(self) -> None:
        known = GRAPH_LOADERS + MORE_LOADERS
        unknown = set(self.loaders) - set(known)
        if unknown or not self.loaders:
            what = f"unknown {', '.join(sorted(unknown))}" if unknown else "none given"
            raise SolarError(f"--loaders: {what} with --sampler neighbor "
                             f"(choose from {', '.join(known)})")  # fmt: skip
        if not self.probe_seconds >= 0:
            raise SolarError(f"--probe-seconds must be >= 0, got {self.probe_seconds}")
        if isinstance(self.buffer, float) and not 0 <= self.buffer <= 1:
            raise SolarError(f"--buffer must be a share in [0, 1], got {self.buffer}")


def parse_fanouts(text: str) -> tuple[int, ...]:
    """``"10,5"`` -> (10, 5); -1 takes every neighbour."""
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise SolarError(f"--fanouts: expected integers like 10,5, got {text!r}") from None


def run_graph(cfg: GraphBenchConfig, comm: Any, progress=None) -> dict | None:
    """Run the benchmark on every rank of ``comm``; rank 0 returns the results."""
    from solar.io.sources import describe_source

    rank, world = comm.Get_rank(), comm.Get_size()
    info = describe_source(cfg.path, [cfg.key], comm=comm)
    n, row_bytes = info.num_samples, info.sample_bytes
    offset = -1 if info.stored is None else int(info.stored.offsets[0, 0])
    capacity = per_rank(
        cfg.buffer, num_samples=n, sample_bytes=row_bytes, world_size=world, name="--buffer"
    )
    throttle = Throttle.parse(cfg.throttle) if cfg.throttle else None
    probed = None
    if rank == 0 and cfg.probe_seconds > 0 and offset >= 0 and throttle is None:
        from solar.io.probe import probe

        probed = probe(info.all_files[0], seconds=cfg.probe_seconds, offset=offset,
                       length=n * row_bytes)  # fmt: skip
    # Measured before the loaders are made: the packing model is fed these rates.
    rates = comm.bcast(None if probed is None else (probed.best, probed.sequential), root=0)
    loaders, construct = _make_loaders(cfg, info, comm, capacity, throttle, rates)
    comm.Barrier()
    results = _run_epochs(cfg, loaders, info, offset, comm, progress)
    for ld in loaders.values():
        (ld[0] if isinstance(ld, tuple) else ld).close()  # (figures stay readable)
    packing = _packing_over_ranks(loaders, comm)
    if rank != 0:
        return None
    out: dict = {
        "config": {
            **dataclasses.asdict(cfg),
            "sampler": "neighbor",
            "world_size": world,
            "num_nodes": n,
            "row_bytes": row_bytes,
            "buffer_per_rank": capacity,
            "throttle": str(throttle) if throttle else None,
        },
        "loaders": {name: _figures(r, row_bytes, construct[name]) for name, r in results.items()},
        "probe": None if probed is None else probed.as_dict(),
        "read_path": _read_path(loaders),
    }
    for name, p in packing.items():  # the passes' scans are read bytes of the run too
        e = out["loaders"][name]
        e["packing"] = p
        e["bytes_read_with_packing"] = sum(e["bytes_read"]) + p["scan_bytes"]
    for base in ("mmap", "static"):
        rate = out["loaders"].get(base, {}).get("nodes_per_second")
        for e in out["loaders"].values():
            e[f"vs_{base}"] = e["nodes_per_second"] / rate if rate else None
    return out


def _make_loaders(
    cfg: GraphBenchConfig, info: Any, comm: Any, capacity: int, throttle: Throttle | None,
    rates: tuple[float, float] | None,
) -> tuple[dict[str, Any], dict[str, float]]:  # fmt: skip
    """Each loader of ``cfg`` under ``capacity`` rows per rank, and the seconds each took to
    make (slowest rank). ``solar`` packs misses where the model (fed ``rates``: random pages/s
    and sequential bytes/s, else probed by the Loader) chooses, within ``cfg.pack_disk``."""
    from solar.graph.mmapbase import MmapGather
    from solar.graph.neighbor import NeighborSampler
    from solar.loader import Loader

    world = comm.Get_size()
    loaders: dict[str, Any] = {}
    construct: dict[str, float] = {}
    for name in cfg.loaders:
        t0 = time.perf_counter()
        # (the topology once per host: the Loader's default, given here for the mmap baseline)
        sampler = NeighborSampler(cfg.path, cfg.fanouts, cfg.batch_size, features=cfg.key,
                                  comm=comm)  # fmt: skip
        if name == "mmap":
            gather = MmapGather.of_key(cfg.path, cfg.key, capacity * info.sample_bytes,
                                       cfg.reader.thread_count, throttle)  # fmt: skip
            # The run (and refusals) of the Loaders beside it.
            run = sampler_run(sampler, info.num_samples, world, sampler.batch_size,
                              cfg.epochs, cfg.seed)  # fmt: skip
            loaders[name] = (gather, sampler, run)
        else:
            loaders[name] = Loader(
                info, [cfg.key], sampler=sampler, epochs=cfg.epochs, buffer=capacity, comm=comm,
                reader=cfg.reader, seed=cfg.seed,
                planning=PlanningConfig(policy=name.partition("-")[0]),  # solar-*: solar
                expert=ExpertConfig(throttle=throttle),
                memory=MemoryConfig(page_mates=name != "solar-rows",
                                    share="node" if name.startswith("solar-host") else "rank",
                                    pack=_pack(cfg, rates) if name in _PACKED
                                    else PackingConfig()),
            )  # fmt: skip
        construct[name] = allreduce(comm, time.perf_counter() - t0, MAX)
    return loaders, construct


def _packing_over_ranks(loaders: dict[str, Any], comm: Any) -> dict[str, dict]:
    """Each packing loader's figures (solar.runtime.packing.PackFigures): bytes scanned and
    written, passes' seconds, windows built and the disk held at once, summed over the ranks
    (each packs its own reads); the windows and their choice, rank 0's."""
    out = {}
    for name, ld in loaders.items():
        packing = None if isinstance(ld, tuple) else ld.stats.packing
        if packing is None:  # (alike on every rank: the loaders are the same)
            continue
        p = packing.as_dict()
        for k in ("scan_bytes", "written_bytes", "disk_peak_bytes", "build_seconds",
                  "windows_built"):  # fmt: skip
            p[k] = allreduce(comm, p[k])
        out[name] = p
    return out


def _read_path(loaders: dict[str, Any]) -> str:
    """How solar's loaders read the features (the Loader's choice, or the one given)."""
    paths = {ld.reader.direct_io for ld in loaders.values() if not isinstance(ld, tuple)}
    return " and ".join(sorted("O_DIRECT" if p else "page cache" for p in paths)) or "O_DIRECT"


def _pack(cfg: GraphBenchConfig, rates: tuple[float, float] | None) -> PackingConfig:
    """``solar``'s packing: ``cfg``'s disk and directory, the probe's rates if measured."""
    r, s = rates if rates is not None else (None, None)
    return PackingConfig(disk=cfg.pack_disk, directory=cfg.pack_dir, random_pages_per_second=r,
                         sequential_bytes_per_second=s)  # fmt: skip


def _run_epochs(cfg: GraphBenchConfig, loaders: dict[str, Any], info: Any, offset: int,
                comm: Any, progress: Any) -> dict[str, dict[str, list]]:  # fmt: skip
    """Every loader's epochs, interleaved in an order rotated each epoch, the features'
    cached pages dropped before each; their figures over all ranks."""
    rank = comm.Get_rank()
    results: dict[str, dict[str, list]] = {
        name: {k: [] for k in ("seconds", "steps", "rows", "hits", "reads", "bytes_read", "first")}
        for name in cfg.loaders
    }

    def drop() -> None:  # the features' cached pages (the topology stays mapped)
        if offset >= 0:
            evict(info.all_files[0], offset, info.num_samples * info.sample_bytes)

    for epoch, name in cold_rounds(list(cfg.loaders), cfg.epochs, comm, drop):
        t0 = time.perf_counter()
        steps, rows, hits, reads, nbytes, first = _graph_epoch(loaders[name], epoch, rank,
                                                               cfg.compute_ms)  # fmt: skip
        seconds = allreduce(comm, time.perf_counter() - t0, MAX)
        r = results[name]
        r["seconds"].append(seconds)
        r["steps"].append(allreduce(comm, steps, MAX))  # global steps
        r["first"].append(allreduce(comm, first - t0, MAX))
        for k, v in (("rows", rows), ("hits", hits), ("reads", reads), ("bytes_read", nbytes)):
            r[k].append(comm.allreduce(v))
        if progress is not None and rank == 0:
            progress(epoch, name, seconds)
    return results


def _figures(r: dict[str, list], row_bytes: int, construct: float) -> dict:
    """One loader's reported figures from its epochs' ``r``."""
    secs = sum(r["seconds"])
    missed = sum(r["reads"])  # rows read (a node buffer's peer rows are not)
    return {
        "epoch_seconds": r["seconds"],
        "steps_per_second": sum(r["steps"]) / secs,
        "nodes_per_second": sum(r["rows"]) / secs,
        "hit_rate_per_epoch": _rates(r["hits"], r["rows"]),
        "hit_rate": sum(r["hits"]) / max(1, sum(r["rows"])),
        "bytes_read": r["bytes_read"],
        "pages_per_second": sum(r["bytes_read"]) / PAGE / secs,
        "read_amplification": sum(r["bytes_read"]) / (missed * row_bytes) if missed else None,
        "rows": r["rows"],
        # Rows read from storage (page mates apart): a node buffer's ranks take the rows
        # another local rank read, neither a hit nor a read of theirs.
        "rows_read": r["reads"],
        "construct_seconds": construct,
        # Epoch 0's wait for its first batch (slowest rank). Not construction to first
        # batch: a loader's planning runs on while the loaders before it run their epochs
        # (bench/gnn_bench.py first measures that alone).
        "first_wait_seconds": r["first"][0],
    }


def _rates(hits: list[int], rows: list[int]) -> list[float]:
    return [h / max(1, x) for h, x in zip(hits, rows, strict=True)]


def _graph_epoch(loader: Any, epoch: int, rank: int, compute_ms: float):
    """One epoch of ``loader``: (steps, rows, hits, rows read from storage, bytes read, when
    the first batch came)."""
    steps = rows = 0
    first = math.nan
    if isinstance(loader, tuple):  # mmap: the gather PyG's loader makes, after its sampling
        gather, sampler, run = loader
        h0, b0 = gather.hits, gather.bytes_read
        for t in range(run.steps_per_epoch):
            sub = sampler.subgraph(run, epoch, t, rank)  # sampled once, as PyG's loader does
            x = gather.gather(sub.nodes)
            sampler.extras(sub, {})  # the batch's edges, as the others have
            first = time.perf_counter() if steps == 0 else first
            rows += x.shape[0]
            steps += 1
            if compute_ms:
                time.sleep(compute_ms / 1e3)
        hits = gather.hits - h0
        return steps, rows, hits, rows - hits, gather.bytes_read - b0, first
    loader.set_epoch(epoch)
    for batch in loader:
        first = time.perf_counter() if steps == 0 else first
        rows += batch["x"].shape[0]
        steps += 1
        if compute_ms:
            time.sleep(compute_ms / 1e3)
    loader.wait_reads()  # reads started into the next epoch are this window's
    st = loader.stats.epochs[epoch]
    return steps, rows, st.hits, st.reads, st.bytes_read, first


def format_graph_results(res: dict) -> str:
    """The results as a table (README style)."""
    c = res["config"]
    b = c["buffer"]  # a share as a fraction, else a size as written
    budget = f"aggregate budget {100 * b:.0f} %" if isinstance(b, float) else f"budget {b}"
    lines = [
        f"graph of {c['num_nodes']} nodes, rows of {c['row_bytes']} B, fanouts "
        f"{','.join(map(str, c['fanouts']))}, {c['batch_size']} seeds/rank, P={c['world_size']}, "
        f"{c['epochs']} epochs, {budget} ({c['buffer_per_rank']} rows/rank), "
        f"compute {c['compute_ms']} ms/step"
        + (f", throttle {c['throttle']}" if c["throttle"] else "")
        + " (mmap: emulated page cache of the budget, O_DIRECT page reads)",
        "",
        "| loader | steps/s | nodes/s | vs mmap | vs static | hit rate | rows read "
        "| read ampl. | GB read (pages) | pages/s | construct s | first wait s | epoch s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    pr = res.get("probe")
    if pr:  # the storage's own rates, measured in the same run (solar/io/probe.py)
        from solar.io.probe import ProbeResult

        probed = ProbeResult(pr["path"], pr["span_bytes"],
                             {int(d): r for d, r in pr["random_pages_per_second"].items()},
                             pr["sequential_bytes_per_second"], pr["engine"])  # fmt: skip
        lines.insert(1, probed.describe())

    def ratio(x: float | None) -> str:
        return f"{x:.2f}×" if x else "—"

    for name, e in res["loaders"].items():
        amp = f"{e['read_amplification']:.2f}" if e["read_amplification"] else "—"
        epochs = " ".join(f"{t:.2f}" for t in e["epoch_seconds"])
        lines.append(
            f"| {name} | {e['steps_per_second']:.2f} | {e['nodes_per_second']:,.0f} | "
            f"{ratio(e['vs_mmap'])} | {ratio(e['vs_static'])} | {100 * e['hit_rate']:.1f} % | "
            f"{sum(e['rows_read']):,} | {amp} | {sum(e['bytes_read']) / 1e9:.2f} | "
            f"{e['pages_per_second']:,.0f} | "
            f"{e['construct_seconds']:.2f} | "
            f"{e['first_wait_seconds']:.2f} | {epochs} |"
        )
    lines.append("")
    lines.append(f"read path: {res.get('read_path', 'O_DIRECT')} (the Loader's default; "
                 "solar's packed windows: O_DIRECT page spans too)")  # fmt: skip
    for name, e in res["loaders"].items():
        p = e.get("packing")
        if p is None:
            continue
        ws = p["windows"]
        how = ("packed" if w["packed"] else "random" for w in ws[:12])
        chosen = ", ".join(f"{w['steps'][0]}-{w['steps'][1] - 1}:{h}"
                           for w, h in zip(ws, how, strict=False))  # fmt: skip
        chosen += " ..." if len(ws) > 12 else ""
        lines.append(
            f"{name}: {sum(w['packed'] for w in ws)} of {len(ws)} windows packed on rank 0 "
            f"({chosen}); all ranks' passes scanned {p['scan_bytes'] / 1e9:.2f} GB and wrote "
            f"{p['written_bytes'] / 1e9:.2f} GB in {p['build_seconds']:.1f} s (within the "
            f"epochs' wall time); extra disk at most {p['disk_peak_bytes'] / 1e9:.2f} GB (the "
            f"ranks' peaks summed); GB read with the scans {e['bytes_read_with_packing'] / 1e9:.2f}"
        )
    return "\n".join(lines)

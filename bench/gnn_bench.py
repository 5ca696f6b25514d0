"""GNN feature gathering (issue 21, Ginex): hits, read amplification, speed, throughput.

    python bench/gnn_bench.py plan GRAPH.h5 [--epochs 3 --world 2 --buffer 0.1]
    flock /tmp/solar-bench.lock python bench/gnn_bench.py gaps GRAPH.h5 [--gaps 0,1,2,4]
    flock /tmp/solar-bench.lock mpiexec -n 2 python bench/gnn_bench.py first GRAPH.h5
    flock /tmp/solar-bench.lock python bench/gnn_bench.py inspector GRAPH.h5 [--world 2]
    flock /tmp/solar-bench.lock mpiexec -n 2 python bench/gnn_bench.py run GRAPH.h5 \\
        [--epochs 3 --buffer 0.1 --loaders solar,static,lru,mmap --throttle MBps,ms]

GRAPH.h5 as ``solar gen GRAPH.h5 --preset graph --nodes N --avg-degree D --features F``
writes it. The workload: ``NeighborSampler(fanouts (10, 5), batch 1024)`` on P ranks, an
aggregate budget of ``--buffer`` of the features (per rank: buffer·N/P rows, or those bytes).

``plan`` (one process, no I/O) reports for every rank's trace:
1. hit rates of ``solar`` (Belady, whole-run horizon, keeping the page mates of its reads, as
   the Loader plans), ``solar-rows`` (Belady over rows alone), ``static`` (hot nodes by the
   frequency of a pre-sampled epoch, as DiskGNN/GIDS), ``nopfs`` (hot nodes over the whole
   run), ``lru``;
2. Belady against a sliding look-ahead of H steps: the per-step changeset rule with next uses
   beyond t + H unknown (evicted first). Not Ginex's model: Ginex applies the same rule over
   a whole superbatch and resets and refills its cache at each boundary (docs/performance.md);
3. read amplification of solar's storage reads under O_DIRECT (bytes read / bytes used),
   rows coalesced into page spans bridging gaps of g pages (``solar.io.tasks.page_spans``);
4. sampling and planning speed: an epoch's subgraphs of all ranks and its plan, seconds.

``first`` (under mpiexec) times a solar Loader from construction to its first batch: the
construction, then the first batch (the first epoch is planned in the background from
construction on, the first step's reads start before its plan is done), and of that the time
waited for the plan (slowest rank each).

``inspector`` (one process) times the plan of rank 0's first epoch, planning every rank
against planning rank 0 alone (``Planner(only_rank=0)``), alternated.

``run`` (under mpiexec, one rank per process) times every loader's epochs, cold (O_DIRECT
reads; rank 0 also evicts the file's pages before each loader's epoch), interleaved in a
rotated order per epoch, and reports steps/s, nodes gathered/s, hit rate and bytes read:
* ``solar``, ``static``, ``lru``: solar's Loader with that policy (the same reader);
* ``mmap``: PyG+'s way, a gather from a memory map whose page cache is limited to the budget,
  emulated (no cgroup here) by :class:`solar.graph.mmapbase.MmapGather`: an LRU of 4 KiB pages
  of the budget's bytes, a step's missing pages read with O_DIRECT on the reader's threads;
  its hit rate counts rows whose pages were all cached.

``solar bench GRAPH.h5 --sampler neighbor`` runs the same comparison as a solar command.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from solar import BufferConfig, NeighborSampler, PlanSpec, RunConfig, make_plan
from solar._memory import PAGE
from solar.io.tasks import RUN_MAX_BYTES, page_spans
from solar.options import ExpertConfig, PlanningConfig
from solar.schedule.draw.pagemates import PageLayout
from solar.schedule.draw.samplers import sampler_run
from solar.schedule.plans.plan import simulate

FANOUTS = (10, 5)


def _run(sampler: NeighborSampler, world: int, epochs: int, seed: int = 0) -> RunConfig:
    return sampler_run(sampler, sampler.graph.num_nodes, world, sampler.batch_size, epochs, seed)


def rank_steps(sampler: NeighborSampler, run: RunConfig, r: int) -> list[np.ndarray]:
    """Rank r's distinct ids per step over the run (a subgraph's nodes are distinct)."""
    return [sampler.batch(run, e, t, r) for e in range(run.epochs)
            for t in range(run.steps_per_epoch)]  # fmt: skip


def horizon_hits(steps: list[np.ndarray], n: int, capacity: int, horizon: int) -> int:
    """Hits of the per-step changeset rule (keep the C ids of held ∪ step with the nearest
    next use) when next uses beyond ``horizon`` steps ahead are unknown (evicted first)."""
    never = np.iinfo(np.int64).max
    nxt = []
    last = np.full(n, never, np.int64)
    for t in range(len(steps) - 1, -1, -1):  # next step using each access
        nxt.append(last[steps[t]].copy())
        last[steps[t]] = t
    nxt.reverse()
    held = np.zeros(0, np.int64)
    key = np.zeros(n, np.int64)  # a held id's next use, as known when it was last used
    hits = 0
    for t, ids in enumerate(steps):
        hits += int(np.isin(ids, held, assume_unique=True).sum())
        key[ids] = nxt[t]
        pool = np.union1d(held, ids)
        k = key[pool]
        k = np.where(k - t > horizon, never, k)  # beyond the look-ahead: unknown
        keep = pool[k < never]
        if keep.size > capacity:
            keep = keep[np.argpartition(k[k < never], capacity - 1)[:capacity]]
        held = keep
    return hits


def amplification(plan, run: RunConfig, offset: int, row_bytes: int, gaps) -> dict:
    """Bytes read / bytes used of the plan's storage reads, per gap, and requests per step:
    the pages of the rows read (side rows included: their pages are the reads'), over the
    bytes of the rows served from them."""
    out = {}
    for gap in gaps:
        device = used = requests = 0
        for r in range(run.world_size):
            rp = plan.rank(r)
            for k in range(run.num_steps):
                st = rp.step(k)
                ids = np.sort(st.storage_reads()[0])
                src = offset + ids * row_bytes
                _, size, _ = page_spans(src, row_bytes, gap, RUN_MAX_BYTES, PAGE)
                device += int(size.sum())
                used += st.read_rows.size * row_bytes
                requests += size.size
        out[gap] = {"amplification": device / used,
                    "requests_per_step": requests / (run.num_steps * run.world_size)}  # fmt: skip
    return out


def plan_report(args) -> dict:
    import h5py

    sampler = NeighborSampler(args.graph, FANOUTS, batch_size=args.batch)
    n = sampler.graph.num_nodes
    with h5py.File(args.graph) as f:
        x = f["features"]
        offset, row_bytes = int(x.id.get_offset()), int(x.dtype.itemsize * x.shape[1])
    run = _run(sampler, args.world, args.epochs)
    capacity = int(args.buffer * n / args.world)
    buf = BufferConfig(capacity, 0.0)
    # Warm the kernels on a small run (the timings below must not time numba's compiler).
    tiny = NeighborSampler(args.graph, FANOUTS, batch_size=8)
    for pol in ("solar", "lru", "static", "nopfs"):
        simulate(PlanSpec(_run(tiny, 1, 2), BufferConfig(100, 0.0), pol, sampler=tiny))
    simulate(PlanSpec(_run(tiny, 1, 2), BufferConfig(100, 0.0), sampler=tiny,
                      pages=PageLayout(offset, row_bytes)))  # fmt: skip
    out: dict = {"graph": str(args.graph), "nodes": n, "edges": sampler.graph.num_edges,
                 "row_bytes": row_bytes, "world": args.world, "epochs": args.epochs,
                 "batch": args.batch, "buffer_per_rank": capacity}  # fmt: skip
    # Sampling and planning speed (a fresh sampler: nothing cached).
    fresh = NeighborSampler(args.graph, FANOUTS, batch_size=args.batch)
    t0 = time.perf_counter()
    d = fresh.epoch(run, 0)
    out["sample_epoch_seconds"] = time.perf_counter() - t0
    out["rows_per_rank_step"] = float(np.diff(d.offsets).mean())
    out["accesses_per_epoch"] = int(d.ids.size)
    t0 = time.perf_counter()
    pages = PageLayout(offset, row_bytes)  # as the Loader plans: page mates kept
    plan = make_plan(PlanSpec(run, buf, "solar", sampler=fresh, pages=pages))
    out["sample_and_plan_run_seconds"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    fresh = NeighborSampler(args.graph, FANOUTS, batch_size=args.batch)  # nothing cached
    rows_only = make_plan(PlanSpec(run, buf, "solar", sampler=fresh))
    out["sample_and_plan_run_seconds_rows_only"] = time.perf_counter() - t0
    hits = {"solar": plan.hit_rate, "solar-rows": rows_only.hit_rate}
    for pol in ("static", "nopfs", "lru"):
        hits[pol] = simulate(PlanSpec(run, buf, pol, sampler=sampler)).hit_rate
    out["hit_rate"] = hits
    print(json.dumps(out, indent=1), flush=True)
    # Against the look-ahead, per rank (the full horizon must equal the planner's).
    sweep = {}
    for h in args.horizons:
        got = 0
        for r in range(args.world):
            got += horizon_hits(rank_steps(sampler, run, r), n, capacity, h)
        sweep[h] = got / plan.summary.accesses  # (Belady over rows, no page mates)
        print(f"horizon {h} steps: hit rate {sweep[h]:.4f}", flush=True)
    out["hit_rate_vs_horizon_steps"] = sweep
    out["read_amplification"] = amplification(plan, run, offset, row_bytes, args.gaps)
    return out


# -- run: throughput ---------------------------------------------------------------------------
def mmap_epoch(gather: Any, sampler: NeighborSampler, run: RunConfig, e: int, rank: int):
    """Rank ``rank``'s steps of epoch ``e`` gathered by the mmap baseline: each step's rows."""
    for t in range(run.steps_per_epoch):
        yield gather.gather(sampler.batch(run, e, t, rank))


def run_loaders(args) -> dict | None:
    import h5py

    from solar import Loader, ReaderConfig, dist
    from solar.graph.mmapbase import MmapGather
    from solar.io.pagecache import evict
    from solar.io.throttle import Throttle

    d = dist.init()
    comm, rank, world = d.comm, d.rank, d.world_size
    with h5py.File(args.graph) as f:
        x = f["features"]
        offset, row_bytes = int(x.id.get_offset()), int(x.dtype.itemsize * x.shape[1])
        n = x.shape[0]
    capacity = int(args.buffer * n / world)
    throttle = Throttle.parse(args.throttle) if args.throttle else None
    reader = ReaderConfig(direct_io=True, threads=args.threads, page_gap=args.page_gap)
    loaders: dict = {}
    first_batch: dict = {}
    for name in args.loaders:
        sampler = NeighborSampler(args.graph, FANOUTS, batch_size=args.batch)
        if name == "mmap":
            run = _run(sampler, world, args.epochs)
            gather = MmapGather(args.graph, offset, row_bytes, capacity * row_bytes, args.threads,
                                throttle)  # fmt: skip
            loaders[name] = (gather, sampler, run)
            continue
        t0 = time.perf_counter()
        ld = Loader(args.graph, ["features"], sampler=sampler, epochs=args.epochs, buffer=capacity,
                    comm=comm, reader=reader, seed=0, planning=PlanningConfig(policy=name),
                    expert=ExpertConfig(throttle=throttle))  # fmt: skip
        loaders[name] = ld
        first_batch[name] = time.perf_counter() - t0  # construction; the first batch adds below
    names = list(loaders)
    results = {k: {"seconds": [], "rows": [], "steps": [], "hits": [], "bytes_read": []}
               for k in names}  # fmt: skip
    for e in range(args.epochs):
        for name in names[e % len(names) :] + names[: e % len(names)]:
            if rank == 0:
                evict([args.graph])
            comm.Barrier()
            ld = loaders[name]
            t0 = time.perf_counter()
            rows = steps = 0
            if name == "mmap":
                gather, sampler, run = ld
                h0, b0 = gather.hits, gather.bytes_read
                for out in mmap_epoch(gather, sampler, run, e, rank):
                    rows += out.shape[0]
                    steps += 1
                hits = gather.hits - h0  # rows whose pages were all cached
                nbytes = gather.bytes_read - b0
            else:
                ld.set_epoch(e)
                for b in ld:
                    if e == 0 and steps == 0:
                        first_batch[name] += time.perf_counter() - t0
                    rows += b["x"].shape[0]
                    steps += 1
                st = ld.stats.epochs[e]
                hits, nbytes = st.hits, st.bytes_read
            seconds = dist.allreduce(comm, time.perf_counter() - t0, dist.MAX)
            r = results[name]
            r["seconds"].append(seconds)
            r["rows"].append(comm.allreduce(rows))
            r["steps"].append(steps)
            r["hits"].append(comm.allreduce(hits))
            r["bytes_read"].append(comm.allreduce(nbytes))
            if rank == 0:
                print(f"epoch {e} {name}: {seconds:.2f} s", file=sys.stderr, flush=True)
    for ld in loaders.values():
        (ld[0] if isinstance(ld, tuple) else ld).close()
    if rank != 0:
        return None
    out: dict = {"graph": str(args.graph), "nodes": n, "row_bytes": row_bytes, "world": world,
                 "epochs": args.epochs, "batch": args.batch, "buffer_per_rank": capacity,
                 "throttle": args.throttle, "threads": args.threads, "page_gap": args.page_gap,
                 "loaders": {}}  # fmt: skip
    for name, r in results.items():
        secs = sum(r["seconds"])
        out["loaders"][name] = {
            "epoch_seconds": r["seconds"],
            "steps_per_second": sum(r["steps"]) / secs,
            "nodes_per_second": sum(r["rows"]) / secs,
            "hit_rate": sum(r["hits"]) / sum(r["rows"]),
            "gb_read": sum(r["bytes_read"]) / 1e9,
            "first_batch_seconds": first_batch.get(name),
        }
    base = out["loaders"].get("mmap", {}).get("nodes_per_second")
    for e in out["loaders"].values():
        e["vs_mmap"] = e["nodes_per_second"] / base if base else None
    return out


def gap_report(args) -> dict:
    """Rows/s of solar's O_DIRECT reader on real subgraphs' rows (cold, 8 threads), with rows
    coalesced across gaps of g pages: the measurement behind ``ReaderConfig.page_gap``."""
    from solar import ReaderConfig
    from solar.io.pagecache import evict
    from solar.io.reader import Reader
    from solar.io.sources import describe_source

    info = describe_source(str(args.graph), ["features"])
    sampler = NeighborSampler(args.graph, FANOUTS, batch_size=args.batch)
    run = _run(sampler, args.world, args.epochs)
    readers = {g: Reader(info, ReaderConfig(direct_io=True, threads=args.threads, page_gap=g))
               for g in args.gaps}  # fmt: skip
    for reader in readers.values():
        reader.warm_up()
    rows: dict = {g: [0, 0.0, 0] for g in args.gaps}
    for t in range(min(run.steps_per_epoch, 8)):
        ids = sampler.batch(run, 0, t, 0)
        out = [np.empty((ids.size, *info.keys[0].sample_shape), info.keys[0].native_dtype)]
        for g in args.gaps[t % len(args.gaps) :] + args.gaps[: t % len(args.gaps)]:
            evict([args.graph])
            t0 = time.perf_counter()
            nbytes = readers[g].read(ids, out)
            rows[g][0] += ids.size
            rows[g][1] += time.perf_counter() - t0
            rows[g][2] += nbytes
    for reader in readers.values():
        reader.close()
    out_: dict = {}
    for g, (n, secs, nbytes) in rows.items():
        out_[g] = {"rows_per_second": n / secs, "amplification": nbytes / (n * info.sample_bytes)}
        print(
            f"gap {g} pages: {n / secs:,.0f} rows/s, amplification {out_[g]['amplification']:.2f}"
        )
    return {"graph": str(args.graph), "threads": args.threads, "gaps": out_}


def first_batch(args) -> dict | None:
    """Seconds from a Loader's construction to its first batch (under mpiexec; the slowest
    rank), split into construction, planning the first epoch and the first step's reads."""
    from solar import Loader, ReaderConfig, dist

    d = dist.init()
    comm = d.comm
    comm.Barrier()
    t0 = time.perf_counter()
    sampler = NeighborSampler(args.graph, FANOUTS, batch_size=args.batch)
    capacity = int(args.buffer * sampler.graph.num_nodes / d.world_size)
    reader = ReaderConfig(direct_io=True, threads=args.threads)
    ld = Loader(args.graph, ["features"], sampler=sampler, epochs=args.epochs, buffer=capacity,
                comm=comm, reader=reader, seed=0)  # fmt: skip
    t1 = time.perf_counter()
    # The first epoch is planned in the background from construction on, while the
    # first step's reads start (they need no plan: the buffer is empty): not forced here.
    batch = next(iter(ld))
    t3 = time.perf_counter()
    parts = {"construct": t1 - t0, "plan_wait": ld._stream.wait_seconds,
             "first_step": t3 - t1, "first_batch": t3 - t0}  # fmt: skip
    out = {k: dist.allreduce(comm, v, dist.MAX) for k, v in parts.items()}
    out["rows"] = int(batch["x"].shape[0])
    ld.close()
    if d.rank != 0:
        return None
    print(" ".join(f"{k} {v:.2f} s" for k, v in out.items() if k != "rows"), flush=True)
    return {"graph": str(args.graph), "world": d.world_size, **out}


def inspector(args) -> dict:
    """Seconds to plan rank 0's first epoch (what its first batch waits for), planning every
    rank (as before a rank planned alone) against rank 0 alone, alternated, one process."""
    from solar.schedule.keep.planner import Planner

    tiny = NeighborSampler(args.graph, FANOUTS, batch_size=8)  # kernels loaded, not timed
    Planner(PlanSpec(_run(tiny, 1, 2), BufferConfig(100, 0.25), "solar", sampler=tiny)).next_rank(0)
    out: dict = {"every_rank": [], "rank_alone": []}
    for _ in range(args.repeat):
        for name, alone in (("every_rank", None), ("rank_alone", 0)):
            sampler = NeighborSampler(args.graph, FANOUTS, batch_size=args.batch)
            run = _run(sampler, args.world, args.epochs)
            capacity = int(args.buffer * sampler.graph.num_nodes / args.world)
            spec = PlanSpec(run, BufferConfig(capacity, 0.25), "solar", sampler=sampler)
            t0 = time.perf_counter()
            Planner(spec, only_rank=alone).next_rank(0)
            out[name].append(time.perf_counter() - t0)
            print(f"{name}: plan of epoch 0 {out[name][-1]:.2f} s", flush=True)
    return {"graph": str(args.graph), "world": args.world, **out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["plan", "run", "gaps", "first", "inspector"])
    ap.add_argument("graph", type=Path)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--world", type=int, default=2, help="plan: ranks simulated")
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--buffer", type=float, default=0.1, help="aggregate share of the rows")
    ap.add_argument("--horizons", type=lambda s: [int(x) for x in s.split(",")],
                    default=[1, 5, 20, 10**9])  # fmt: skip
    ap.add_argument("--gaps", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2, 4])
    ap.add_argument("--loaders", type=lambda s: s.split(","), default=["solar", "static", "lru",
                                                                        "mmap"])  # fmt: skip
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=2, help="inspector: alternations")
    ap.add_argument("--page-gap", type=int, default=0, help="run: ReaderConfig.page_gap")
    ap.add_argument("--throttle", help="MBps,latency_ms per rank (emulated storage)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    modes = {
        "plan": plan_report,
        "run": run_loaders,
        "gaps": gap_report,
        "first": first_batch,
        "inspector": inspector,
    }
    out = modes[args.mode](args)
    if out is not None:
        print(json.dumps(out, indent=1))
        if args.json:
            from solar._atomic import write_json

            write_json(args.json, out)


if __name__ == "__main__":
    main()

"""The node buffer at run time (issue 35), per-rank buffers against one node buffer, side by
side in one run, under mpiexec on one host:

    solar gen /tmp/i35-node/g.h5 --preset graph --nodes 200000
    flock /tmp/solar-bench.lock mpiexec -n 4 python bench/node_runtime.py /tmp/i35-node/g.h5 \\
        [--epochs 3 --buffer 0.1 --rounds 2 --out bench/results/node-runtime.json]

GNN feature gathering, ``NeighborSampler(fanouts (10, 5), 1024 seeds per rank)``, an aggregate
buffer of ``--buffer`` of the features. Every mode runs the Loader's node step (a
``RankStream``'s steps of a host's share run by ``Holdings`` of a ``Host``,
solar/runtime/holdings.py) over the same
sampler: ``per-rank`` executes the node plan of one rank per host (today's per-rank plan, C/P
rows each, proven equal by tests/test_nodeplan.py), ``node`` the node plan of one host of P
ranks (C rows shared), its barriers the region's own (solar/host/barrier.py), and
``node-mpi-barrier`` the same with the host communicator's MPI barrier instead (the barrier
before the host barrier); every step's plan is made first (untimed). Reads
are O_DIRECT (the page cache holds nothing of the features between modes), the modes alternate
per round; every rank's rows are checked against the file's bytes once. Reported: rows read
from storage per epoch (all ranks), seconds per epoch (slowest rank), rows gathered per second
(all ranks' batches), and the node mode's barrier seconds. Planning is not timed (done first).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from mpi4py import MPI

from solar import BufferConfig, NeighborSampler, PlanSpec, dist
from solar.cache.slots import SlotBuffer
from solar.config import ReaderConfig
from solar.host.region import NodeRegion
from solar.io.reader import Reader
from solar.io.sources import describe_source
from solar.runtime.holdings import Holdings, Host, RawRefill
from solar.runtime.steps import Steps
from solar.schedule.draw.samplers import sampler_run
from solar.schedule.keep.grouping import Hosts, stage_bound
from solar.schedule.plans.stream import RankStream


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("graph")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--buffer", type=float, default=0.1)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--seeds", type=int, default=1024, help="seeds per rank and step")
    ap.add_argument("--out")
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    dist.install_abort_on_error(comm)
    rank, world = comm.Get_rank(), comm.Get_size()
    sampler = NeighborSampler(a.graph, (10, 5), a.seeds)
    info = describe_source([a.graph], ["features"])
    reader = Reader(info, ReaderConfig(threads=a.threads, direct_io=True))
    n = sampler.graph.num_nodes
    run = sampler_run(sampler, n, world, a.seeds, a.epochs)
    spec = PlanSpec(run, BufferConfig(int(a.buffer * n) // world), sampler=sampler)
    keys = [(k.sample_shape, k.native_dtype) for k in info.keys]
    modes = {"per-rank": Hosts.grid(world, 1), "node": Hosts.grid(1, world),
             "node-mpi-barrier": Hosts.grid(1, world)}  # fmt: skip
    prepared = {}
    for name, hosts in modes.items():  # plan first (untimed): each rank its own host's
        if name == "node-mpi-barrier":  # the node plan, other barriers
            prepared[name] = prepared["node"]
            continue
        stream = RankStream(spec, rank, hosts=hosts, stage_rows=stage_bound(spec, hosts))
        steps = Steps(spec, rank, stream)
        plans = [steps.plan(k) for k in range(run.num_steps)]
        prepared[name] = (hosts, stream, steps, plans)
    hcs = {name: comm.Split(hosts.host_of(rank), rank) for name, hosts in modes.items()}
    results: dict = {name: [] for name in modes}
    checked = False
    for rnd in range(a.rounds):
        order = list(modes) if rnd % 2 == 0 else list(modes)[::-1]
        for name in order:
            hosts, stream, steps, plans = prepared[name]
            hc = hcs[name]
            parts = Host.region_parts(stream.slots, stream.stage_rows, keys)
            region = NodeRegion(NodeRegion.size_of(parts), hc, stream.host, stream.local,
                                local_size=len(stream.group))  # fmt: skip
            barrier = region.barrier(stream.group, run.steps_per_epoch)
            if name == "node-mpi-barrier":
                barrier = lambda k, phase, hc=hc: hc.Barrier()  # noqa: E731
            host = Host(region, stream.slots, stream.stage_rows, keys, barrier)
            buffer = SlotBuffer.over(host.slots, info.keys)
            refill = RawRefill(reader, buffer, None, info.keys, a.seeds, host, stream.local,
                               len(stream.group))  # fmt: skip
            hold = Holdings(buffer, None, steps, refill, host)
            most = max(st.rows_needed for st in plans)
            batch = [np.empty((most, *s), d) for s, d in keys]
            comm.Barrier()
            t0 = time.perf_counter()
            reads = rows = 0
            for k, st in enumerate(plans):
                samples, at = st.storage_reads()
                if samples.size:
                    reader.read(samples, batch, at)
                hold.gather(st, batch)
                hold.settle(k, st, batch)
                reads += samples.size
                rows += st.size
            sec = time.perf_counter() - t0
            if not checked:  # the last batch against the file, once
                ref = reader_ref(a.graph, plans[-1].samples)
                assert batch[0][: plans[-1].size].tobytes() == ref.tobytes()
            slowest = comm.allreduce(sec, MPI.MAX)
            tot_reads, tot_rows = comm.allreduce(reads), comm.allreduce(rows)
            barrier = comm.allreduce(host.barrier_seconds, MPI.MAX)
            results[name].append({
                "seconds_per_epoch": round(slowest / run.epochs, 3),
                "rows_read_per_epoch": tot_reads / run.epochs,
                "rows_per_second": round(tot_rows / slowest),
                "barrier_seconds_per_epoch": round(barrier / run.epochs, 3),
                "barriers_per_epoch": host.barriers / run.epochs,
                "barriers_per_second": round(host.barriers / slowest),
            })  # fmt: skip
            del hold, host, buffer, refill, region
        checked = True
    for _, stream, _, _ in {id(v): v for v in prepared.values()}.values():
        stream.close()
    if rank == 0:
        cmd = (
            f"mpiexec -n {world} python bench/node_runtime.py {a.graph} --epochs {a.epochs} "
            f"--buffer {a.buffer} --rounds {a.rounds} --seeds {a.seeds}"
        )
        out = {"command": cmd, "nodes": n, "world": world, "results": results}
        best = {m: max(r["rows_per_second"] for r in results[m]) for m in results}
        out["gather_speedup_node_vs_per_rank"] = round(best["node"] / best["per-rank"], 3)
        out["gather_speedup_host_barrier_vs_mpi_barrier"] = round(
            best["node"] / best["node-mpi-barrier"], 3
        )
        print(json.dumps(out, indent=1))
        if a.out:
            with open(a.out, "w") as f:
                f.write(json.dumps(out, indent=1) + "\n")


def reader_ref(path: str, samples: np.ndarray) -> np.ndarray:
    import h5py

    with h5py.File(path) as f:
        x = f["features"]
        order = np.argsort(samples)
        got = x[samples[order]]
        out = np.empty_like(got)
        out[order] = got
        return out


if __name__ == "__main__":
    main()

"""A graph's topology per process: private copies (no communicator) or one sealed copy per
host (``Graph(path, comm)``, solar/host/sealed.py), under one launcher; ``--way loader``: a
NeighborSampler made without a communicator, bound to the job's as a Loader binds it (the
default).

    mpiexec -n 4 python bench/shared_topology.py GRAPH.h5 --way private
    mpiexec -n 4 python bench/shared_topology.py GRAPH.h5 --way shared
    mpiexec -n 4 python bench/shared_topology.py GRAPH.h5 --way loader

Each rank opens the graph one way, reads every page of it (a sampler's kernels will), then
reports what that added to its memory in ``/proc/self/smaps_rollup``: RSS, PSS (shared pages
divided among the processes that map them) and private bytes, beside the topology's own bytes
and the seconds the open took (one way per job: freed pages would blur the other's figures).
"""

from __future__ import annotations

import argparse
import json
import time

from solar import dist
from solar.graph.csr import Graph
from solar.graph.neighbor import NeighborSampler


def rollup() -> dict[str, int]:
    out = {}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if len(parts) == 2 and parts[1] == "kB":
                out[key] = int(parts[0]) * 1024
    return out


def opened(path: str, comm, way: str) -> dict:
    before = rollup()
    t0 = time.perf_counter()
    if way == "loader":
        sampler = NeighborSampler(path, (15, 10, 5))
        sampler.bind(comm)  # (what Loader(..., sampler=sampler) does, with the job's comm)
        g = sampler.graph
    else:
        g = Graph(path, comm if way == "shared" else None)
    seconds = time.perf_counter() - t0
    touched = int(g.indptr[::512].sum()) + int(g.indices[::1024].sum())  # every page read
    comm.Barrier()  # every rank's pages touched before any counts whom they are shared by
    after = rollup()
    nbytes = int(g.indptr.nbytes + g.indices.nbytes)
    got = {k: after[k] - before[k] for k in ("Rss", "Pss", "Private_Clean", "Private_Dirty")}
    got.update(seconds=round(seconds, 2), topology_bytes=nbytes, shared=g.shared is not None,
               touched=touched)  # fmt: skip
    return got


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("graph")
    p.add_argument("--way", choices=["private", "shared", "loader"], required=True)
    p.add_argument("--json")
    args = p.parse_args()
    d = dist.init()
    rows = {args.way: d.comm.gather(opened(args.graph, d.comm, args.way), root=0)}
    d.comm.Barrier()  # (every rank still maps it while the others measure)
    if d.is_root:
        result = {"ranks": d.world_size, **rows}
        for way, per in rows.items():
            mean = {k: sum(r[k] for r in per) / len(per) for k in ("Rss", "Pss", "seconds")}
            print(f"{way}: per rank RSS {mean['Rss'] / 2**20:.0f} MiB, PSS "
                  f"{mean['Pss'] / 2**20:.0f} MiB, open {mean['seconds']:.2f} s "
                  f"(topology {per[0]['topology_bytes'] / 2**20:.0f} MiB)")  # fmt: skip
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()

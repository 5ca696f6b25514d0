"""GNN gathering against the device's limit (issue 34): the storage probe, then solar's
Loader gathering a graph's feature rows cold (O_DIRECT), two code trees side by side.

    flock /tmp/solar-bench.lock python bench/gnn_io_bench.py GRAPH.h5 --base /tmp/i34-io/base \\
        [--seeds 40960 --epochs 2 --worlds 1,2 --threads 8] --json bench/results/gnn_io.json

For each P in ``--worlds`` and each tree (``--base``: a checkout of an older solar, e.g. a
worktree of c9277fb; ``new``: this one), alternated, one process per rank (``mpiexec -n P``
for P > 1) runs ``Loader(features, sampler=NeighborSampler(fanouts (10, 5), batch 1024,
train = the first --seeds training nodes), buffer 10 %, O_DIRECT)`` for ``--epochs``
epochs, rank 0 evicting the file's pages first. Reported per run: nodes/s (all ranks),
storage pages read per second (bytes read / 4 KiB over the epochs' wall time), hit rate,
read amplification; beside them the probe's random 4 KiB read rates at queue depth 1/8/32/64
and sequential bandwidth, measured in the same run on the same file
(:func:`solar.io.probe.probe`).

``worker`` mode is what each rank runs (with PYTHONPATH naming the tree).

``--reorder`` (no I/O, no timing) measures node reordering (:mod:`solar.graph.reorder`): the
graph renumbered by each method, the same sampling (fanouts (10, 5), batch 1024, P ranks,
seeds renumbered alike), rows per page read over ``--epochs`` epochs: every row of a step
read (no cache), and solar's reads (its plan of rows alone and with page mates, buffer 10 %,
pages read = distinct pages of a rank's reads and side rows per step).

    python bench/gnn_io_bench.py GRAPH.h5 --reorder [--worlds 2 --epochs 2 --seeds 40960]
    python bench/gnn_io_bench.py - --reorder --community 200000  # communities, ids at random

``solar gen --preset graph`` (Chung-Lu) has no communities: only degree orders its rows;
``--community N`` generates a graph whose communities a breadth-first order finds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PY = sys.executable
HERE = Path(__file__).resolve().parent.parent


def worker(args: argparse.Namespace) -> None:
    import numpy as np

    from solar import Loader, NeighborSampler
    from solar.config import ReaderConfig
    from solar.io.pagecache import drop

    comm = None
    if int(os.environ.get("PMI_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))) > 1:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    rank = 0 if comm is None else comm.Get_rank()
    t0 = time.perf_counter()
    sampler = NeighborSampler(str(args.graph), (10, 5), 1024)
    train = np.sort(sampler.train)[: args.seeds]
    sampler = NeighborSampler(str(args.graph), (10, 5), 1024, train=train)
    loader = Loader(str(args.graph), ["features"], sampler=sampler, epochs=args.epochs,
                    buffer="10%", comm=comm,
                    reader=ReaderConfig(direct_io=True, threads=args.threads))  # fmt: skip
    construct = time.perf_counter() - t0
    if rank == 0:
        fd = os.open(args.graph, os.O_RDONLY)
        drop(fd, 0, os.fstat(fd).st_size)
        os.close(fd)
    if comm is not None:
        comm.Barrier()
    rows = row_bytes = 0
    t0 = time.perf_counter()
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            rows += batch["x"].shape[0]
            row_bytes = batch["x"][0].nbytes
    loader.wait_reads()
    seconds = time.perf_counter() - t0
    hits = sum(e.hits for e in (loader.stats.epochs[k] for k in range(args.epochs)))
    nbytes = sum(e.bytes_read for e in (loader.stats.epochs[k] for k in range(args.epochs)))
    tuned = dict(loader.stats.tuned)
    loader.close()
    out = {"seconds": seconds, "rows": rows, "hits": hits, "bytes_read": nbytes,
           "construct": construct}  # fmt: skip
    if comm is not None:
        from mpi4py import MPI

        out = {k: comm.allreduce(v, MPI.MAX if k in ("seconds", "construct") else MPI.SUM)
               for k, v in out.items()}  # fmt: skip
    if rank == 0:
        missed = out["rows"] - out["hits"]
        out.update(
            nodes_per_second=out["rows"] / out["seconds"],
            pages_per_second=out["bytes_read"] / 4096 / out["seconds"],
            hit_rate=out["hits"] / out["rows"],
            read_amplification=out["bytes_read"] / max(1, missed * row_bytes),
            tuned=tuned,  # threads="auto": where rank 0's knobs settled
        )
        print("RESULT " + json.dumps(out), flush=True)


def run_one(tree: Path, world: int, args: argparse.Namespace) -> dict:
    cmd = [PY, str(HERE / "bench" / "gnn_io_bench.py"), str(args.graph), "--worker",
           "--seeds", str(args.seeds), "--epochs", str(args.epochs),
           "--threads", str(args.threads)]  # fmt: skip
    if world > 1:
        cmd = [str(Path(PY).parent / "mpiexec"), "-n", str(world), *cmd]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{tree} P={world} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")


def reorder(args: argparse.Namespace) -> None:
    import h5py
    import numpy as np

    from solar import BufferConfig, NeighborSampler, PlanSpec, make_plan
    from solar.graph import Graph, write_graph
    from solar.graph.reorder import METHODS, reorder_nodes
    from solar.schedule.draw.pagemates import PageLayout
    from solar.schedule.draw.samplers import sampler_run

    if args.community:  # a graph of communities numbered at random (GRAPH names none)
        indptr, indices = community_graph(args.community)
        rng = np.random.default_rng(1)
        train = np.sort(rng.choice(args.community, args.community // 10, replace=False))
        train, row_bytes = train[: args.seeds], 1024
    else:
        with h5py.File(args.graph, "r") as f:
            indptr, indices = f["indptr"][()], f["indices"][()]
            train = np.sort(f["train_idx"][()])[: args.seeds]
            row_bytes = f["features"][0].nbytes
    n = indptr.size - 1
    res: dict = {"command": " ".join(sys.argv), "num_nodes": n, "row_bytes": row_bytes,
                 "methods": {}}  # fmt: skip
    world = int(args.worlds.split(",")[-1])
    for method in ("none", *[m for m in METHODS if m != "none"]):
        t0 = time.perf_counter()
        order = reorder_nodes(indptr, indices, method=method)
        took = time.perf_counter() - t0
        with tempfile.TemporaryDirectory() as tmp:  # renumbered as the converter writes it
            path = Path(tmp) / "g.h5"
            write_graph({"indptr": indptr, "indices": indices}, path, order=order)
            g = Graph(path)
            graph = {"indptr": np.array(g.indptr), "indices": np.array(g.indices)}
        new_id = np.empty(n, np.int64)
        new_id[order] = np.arange(n)
        sampler = NeighborSampler(graph, (10, 5), 1024, train=np.sort(new_id[train]))
        run = sampler_run(sampler, n, world, 1024, args.epochs)
        entry: dict = {"seconds": took}
        for e in range(args.epochs):  # no cache: every row of every step
            d = sampler.epoch(run, e)
            steps = [d.ids[d.offsets[g] : d.offsets[g + 1]] for g in range(d.offsets.size - 1)]
            entry.setdefault("all_rows", []).append(_rows_pages(steps, row_bytes))
        cap = n // 10 // world
        for pm in (False, True):
            pages = PageLayout(0, row_bytes) if pm else None
            spec = PlanSpec(run, BufferConfig(cap), "solar", sampler=sampler, pages=pages)
            plan = make_plan(spec)
            rows = pgs = 0
            for e in range(args.epochs):
                for r in range(world):
                    got = _plan_reads(plan, e, r, row_bytes)
                    rows, pgs = rows + got[0], pgs + got[1]
            key = "solar" if pm else "solar_rows"
            hits = sum(s.hits for s in plan.stats) / max(1, sum(s.accesses for s in plan.stats))
            entry[key] = {"rows_read": rows, "pages_read": pgs,
                          "rows_per_page": rows / max(1, pgs), "hit_rate": hits}  # fmt: skip
        res["methods"][method] = entry
        print(method, json.dumps(entry), flush=True)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1) + "\n")


def community_graph(n: int, deg: int = 20, comms: int | None = None, inside: float = 0.9):
    """A CSR graph of ``n`` nodes in random communities of ~100 (ids at random): power-law
    weights (i^-0.5), ``inside`` of the edges within the source's community."""
    import numpy as np

    rng = np.random.default_rng(0)
    comms = comms or max(1, n // 100)
    comm = rng.integers(0, comms, n)
    w = (1.0 + np.arange(n)) ** -0.5
    w = w[rng.permutation(n)] / w.sum()
    m = n * deg // 2
    src = rng.choice(n, m, p=w)
    members = np.argsort(comm, kind="stable")
    start = np.searchsorted(comm[members], np.arange(comms + 1))
    c = comm[src]
    near = members[start[c] + (rng.random(m) * (start[c + 1] - start[c])).astype(np.int64)]
    dst = np.where(rng.random(m) < inside, near, rng.choice(n, m, p=w))
    a, b = np.concatenate([src, dst]), np.concatenate([dst, src])
    o = np.lexsort((b, a))
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(a, minlength=n), out=indptr[1:])
    return indptr, b[o]


def _rows_pages(steps, row_bytes: int) -> dict:
    from solar.graph.reorder import rows_per_page

    return {"rows_per_page": rows_per_page(steps, row_bytes)}


def _plan_reads(plan, epoch: int, rank: int, row_bytes: int) -> tuple[int, int]:
    """(rows read from storage, pages read) of a rank's epoch in ``plan``: per step, the
    rows not hit and its side rows, each step's pages counted once."""
    import numpy as np

    from solar.schedule.policy import HIT, SIDE

    re = plan.rank_epoch(rank, epoch)
    rows = pages = 0
    for t in range(re.step_offsets.size - 1):
        a, b = int(re.step_offsets[t]), int(re.step_offsets[t + 1])
        flags, sample = re.flags[a:b], re.sample[a:b].astype(np.int64)
        read = (flags & HIT) == 0
        rows += int((read & ((flags & SIDE) == 0)).sum())
        x = sample[read]
        pages += np.unique(
            np.concatenate([x * row_bytes // 4096, (x * row_bytes + row_bytes - 1) // 4096])
        ).size
    return rows, pages


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("graph", type=Path)
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--base", type=Path)
    ap.add_argument("--seeds", type=int, default=40960)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--threads", type=lambda x: x if x == "auto" else int(x), default=8)
    ap.add_argument("--worlds", default="1,2")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--reorder", action="store_true")
    ap.add_argument("--community", type=int, default=0, help="--reorder: N nodes in communities")
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if args.reorder:
        return reorder(args)
    from solar.io.probe import probe

    t0 = time.time()
    pr = probe(args.graph, seconds=1.0)
    print(pr.describe(), flush=True)
    res: dict = {"command": " ".join(sys.argv), "probe": pr.as_dict(), "runs": []}
    trees = [("new", HERE)] + ([("base", args.base)] if args.base else [])
    for world in [int(w) for w in args.worlds.split(",")]:
        for name, tree in trees if world % 2 else trees[::-1]:
            r = run_one(tree, world, args)
            r.update(tree=name, world_size=world,
                     pages_vs_probe_depth32=r["pages_per_second"] / pr.rate(32))  # fmt: skip
            res["runs"].append(r)
            print(
                f"P={world} {name}: {r['nodes_per_second']:,.0f} nodes/s, "
                f"{r['pages_per_second']:,.0f} pages/s "
                f"({100 * r['pages_vs_probe_depth32']:.0f} % of the probe's depth-32 rate), "
                f"hit rate {100 * r['hit_rate']:.1f} %, read ampl. "
                f"{r['read_amplification']:.2f}, {r['seconds']:.1f} s",
                flush=True,
            )
    pr2 = probe(args.graph, seconds=1.0)
    res["probe_after"] = pr2.as_dict()
    print(pr2.describe())
    res["seconds"] = time.time() - t0
    if args.json:
        args.json.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()

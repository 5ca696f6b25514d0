"""A GNN batch sampled once: what a rank's epoch of subgraphs holds, and a run's CPU per step.

    python bench/sample_once.py bytes GRAPH.h5 [--world 1,4 --batch 1024]
    flock /tmp/solar-bench.lock python bench/sample_once.py run GRAPH.h5 [--world 1 --epochs 3]

``bytes``: rank 0's draws of epoch 0 (``NeighborSampler.rank_epoch``, fanouts (10, 5)): its
ids, and the subgraphs that travel with them to delivery (edges and per-hop counts; a
subgraph's nodes are a view of the ids), in bytes per epoch, per step and per sampled node;
beside it the planner's trace of the same epoch (``traces.BYTES_PER_ACCESS`` per access).

``run``: one rank of a ``world``-rank GNN Loader (fanouts (10, 5), a 10 % buffer) over every
epoch, from construction to the last batch: wall and CPU seconds (this process, every thread)
per step, the time to the first batch, and the sampling kernel's calls. Run it under two
``PYTHONPATH``s, alternating, to compare commits (only a same-run ratio means anything on a
shared machine).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from solar import ExpertConfig, Loader, NeighborSampler
from solar.graph import neighbor
from solar.schedule.draw.samplers import sampler_run

FANOUTS = (10, 5)


def _bytes(args) -> list[dict]:
    from solar.schedule.draw.traces import BYTES_PER_ACCESS

    out = []
    sampler = NeighborSampler(args.graph, FANOUTS, batch_size=args.batch)
    n = sampler.graph.num_nodes
    for world in args.world:
        run = sampler_run(sampler, n, world, args.batch, 2)
        d = sampler.rank_epoch(run, 0, 0)
        subs = [s for s in (d.outputs or []) if s is not None]
        edges = sum(s.src.nbytes + s.dst.nbytes for s in subs)
        hops = sum(s.hop_nodes.nbytes + s.hop_edges.nbytes for s in subs)
        total = d.ids.nbytes + d.offsets.nbytes + edges + hops
        out.append({
            "world": world, "steps": run.steps_per_epoch, "nodes": int(d.ids.size),
            "edges": int(sum(s.src.size for s in subs)), "ids_bytes": int(d.ids.nbytes),
            "edge_bytes": int(edges), "epoch_bytes": int(total),
            "step_bytes": int(total // max(1, run.steps_per_epoch)),
            "bytes_per_node": round(total / max(1, d.ids.size), 1),
            "planner_trace_bytes": int(d.ids.size * BYTES_PER_ACCESS),
        })  # fmt: skip
    return out


def _run(args) -> dict:
    calls = [0]
    kernel = neighbor._sample

    def counted(*a):
        calls[0] += 1
        return kernel(*a)

    neighbor._sample = counted  # (rehearsal off: warm=False, the kernels compiled before)
    world = args.world[0]
    sampler = NeighborSampler(args.graph, FANOUTS, batch_size=args.batch)
    c0, t0 = time.process_time(), time.perf_counter()
    steps, first = 0, None
    with Loader(args.graph, ["features"], sampler=sampler, epochs=args.epochs, buffer="10%",
                rank=0, world_size=world, expert=ExpertConfig(warm=False)) as ld:  # fmt: skip
        for e in range(args.epochs):
            ld.set_epoch(e)
            for b in ld:
                if first is None:
                    first = time.perf_counter() - t0
                steps += 1
                np.asarray(b["edge_index"])
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"world": world, "epochs": args.epochs, "steps": steps, "samplings": calls[0],
            "wall_ms_per_step": 1e3 * wall / steps, "cpu_ms_per_step": 1e3 * cpu / steps,
            "first_batch_s": first}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["bytes", "run"])
    p.add_argument("graph")
    p.add_argument("--world", default="1", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--epochs", type=int, default=3)
    args = p.parse_args()
    got = _bytes(args) if args.mode == "bytes" else _run(args)
    print(json.dumps(got, indent=1))


if __name__ == "__main__":
    main()

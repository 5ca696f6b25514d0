"""Bytes per planned access: the planner's peak memory over its accesses, Shuffle and GNN.

    python bench/plan_memory.py [--nodes 1000000] [--samples 1000000] [--graph G.h5]
                                [--windows 2,5] [--only neighbor] [--json out.json]

Each case runs in a fresh process (``--case``): imports, the graph's topology read (GNN), then
the peak RSS reset (``/proc/self/clear_refs``), then one ``simulate`` of the run (what
``solar plan`` without ``-o`` does, one epoch at a time) or ``plan_to_file`` (``-o``); its
figure is the peak RSS over the RSS before planning, divided by the run's accesses. RSS, not
tracemalloc: numba's arrays are not Python allocations. The topology is reported apart (its
bytes are the graph's, not the plan's).

Cases: Shuffle over ``--samples`` (P=8, B=64, E=3, buffer 10 %); a NeighborSampler over a
generated graph of ``--nodes`` (average degree 16, F=8, 4 % training nodes; fanouts (15, 10,
5), B=1024, P=8, E=1 and 3, buffer 10 %): the issue-48 stand-in's shape at a size planned in a
minute here. ``--graph``: that graph file instead of a generated one. ``--windows``: the GNN
cases again with the epoch planned in windows of that many steps (``PlanSpec.window``), beside
the whole-epoch plan (its hit rate against it). ``--only``: the cases of one sampler.
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


def _rss(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def _spec(args: argparse.Namespace):
    from solar import BufferConfig, PlanSpec, RunConfig
    from solar.config import parse_size

    if args.case == "shuffle":
        n, row = args.samples, 64
        run = RunConfig(n, 8, 64, args.epochs, 0)
        cap = parse_size("10%", sample_bytes=row, num_samples=n, world_size=8, name="buffer")
        return PlanSpec(run, BufferConfig(cap), sample_bytes=row), 0
    from solar.graph.neighbor import NeighborSampler
    from solar.io.sources import describe_source
    from solar.runtime.setup import page_layout

    sampler = NeighborSampler(args.graph, (15, 10, 5), 1024)
    info = describe_source(args.graph, ["features"])
    n, row = info.num_samples, info.sample_bytes
    draws = sampler.draws(n, 8 * 1024)
    run = RunConfig(n, 8, 1024, args.epochs, 0, False, None if draws == n else draws)
    cap = parse_size("10%", sample_bytes=row, num_samples=n, world_size=8, name="buffer")
    spec = PlanSpec(run, BufferConfig(cap), "solar", False, row, info.identity, sampler, None,
                    False, None, args.window)  # fmt: skip
    pages = page_layout(info)
    if pages is not None and spec.plans_page_mates:
        import dataclasses

        spec = dataclasses.replace(spec, pages=pages)
    g = sampler.graph
    return spec, int(g.indptr.nbytes + g.indices.nbytes)


def child(args: argparse.Namespace) -> None:
    """One case, in this process: its figures as one JSON line."""
    from solar.schedule.plans.plan import plan_to_file, simulate

    spec, topology = _spec(args)
    with tempfile.TemporaryDirectory() as tmp:
        # Compiled (or loaded from numba's cache) on a tiny run first: not in the figure.
        from solar.warm import rehearse_planning

        rehearse_planning(spec, lambda s: simulate(s))
        if args.out:
            rehearse_planning(spec, lambda s: plan_to_file(s, Path(tmp) / "w.h5"))
        base = _rss("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # the peak RSS starts again from now
        t0 = time.perf_counter()
        if args.out:
            summary = plan_to_file(spec, Path(tmp) / "p.h5").summary
        else:
            summary = simulate(spec)
        seconds = time.perf_counter() - t0
        peak = _rss("VmHWM")
    accesses = summary.accesses
    print(json.dumps({"case": args.case, "epochs": args.epochs, "to_file": bool(args.out),
                      "window": spec.steps_window if spec.traced else None,
                      "steps_per_epoch": spec.run.steps_per_epoch, "hits": summary.hits,
                      "accesses": accesses, "hit_rate": round(summary.hit_rate, 4),
                      "seconds": round(seconds, 2),
                      "peak_over_base": peak - base, "topology_bytes": topology,
                      "bytes_per_access": round((peak - base) / max(1, accesses), 2)}))  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=1_000_000)
    p.add_argument("--samples", type=int, default=1_000_000)
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--windows", default="", help="GNN cases planned in windows of these steps")
    p.add_argument("--only", choices=["shuffle", "neighbor"], help="the cases of one sampler")
    p.add_argument("--window", type=int, help=argparse.SUPPRESS)
    p.add_argument("--case", help=argparse.SUPPRESS)
    p.add_argument("--graph", help=argparse.SUPPRESS)
    p.add_argument("--epochs", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--out", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.case:
        child(args)
        return
    from solar.graph import generate_graph

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        graph = Path(args.graph) if args.graph else Path(tmp) / "g.h5"
        if not args.graph:
            generate_graph(graph, args.nodes, 16.0, 8, seed=0, train_fraction=0.04)
        gnn = [["--epochs", "1"], ["--epochs", "3"], ["--epochs", "1", "--out"]]
        cases = [["--case", "shuffle", "--epochs", "3"],
                 ["--case", "shuffle", "--epochs", "3", "--out"],
                 *(["--case", "neighbor", *c] for c in gnn),
                 *(["--case", "neighbor", *c, "--window", w] for w in args.windows.split(",")
                   if w for c in gnn)]  # fmt: skip
        cases = [c for c in cases if args.only in (None, c[1])]
        for case in cases:
            cmd = [sys.executable, __file__, *case, "--graph", str(graph),
                   "--samples", str(args.samples)]  # fmt: skip
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=os.environ)
            got = json.loads(out.stdout.strip().splitlines()[-1])
            fields = ("case", "window", "epochs", "to_file")
            key = (got["case"], None, got["epochs"], got["to_file"])
            whole = [r for r in results if tuple(r[f] for f in fields) == key]
            if got["window"] is not None and whole:  # the hits a window keeps
                got["hits_kept"] = round(got["hits"] / max(1, whole[0]["hits"]), 4)
            results.append(got)
            print(json.dumps(got), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

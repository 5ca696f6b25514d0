"""The neighbour-sampling kernel alone (issue 33: a graph's topology private and validated).

    flock /tmp/solar-bench.lock python bench/graph_kernel_bench.py GRAPH.h5 [--epochs 5]

Opens GRAPH.h5 (``solar gen GRAPH.h5 --preset graph --nodes N``), then times, per epoch, every
rank's subgraphs (``NeighborSampler(fanouts (10, 5), batch 1024)``, P = ``--world``): the
kernel ``solar.graph.neighbor._sample`` over a whole epoch, after one warm-up epoch. Prints one
JSON line: the open (copy and validation) and each epoch's seconds. Run it alternately with
``PYTHONPATH`` of two trees for an A/B (``--ab BASE_TREE``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def measure(path: str, epochs: int, world: int) -> dict:
    from solar import NeighborSampler
    from solar.schedule.draw.samplers import sampler_run

    t0 = time.perf_counter()
    sampler = NeighborSampler(path, (10, 5), 1024)
    opened = time.perf_counter() - t0
    n = sampler.graph.num_nodes
    run = sampler_run(sampler, n, world, 1024, epochs + 1, seed=1)
    sampler.rank_epoch(run, 0, 0)  # compiled and warm
    times = []
    for e in range(1, epochs + 1):
        t = time.perf_counter()
        for r in range(world):
            sampler.rank_epoch(run, e, r)
        times.append(time.perf_counter() - t)
    return {"open_s": opened, "epoch_s": times, "best_s": min(times)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("graph")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--ab", help="another tree: alternate runs with PYTHONPATH=it and this one")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", help="write the A/B's JSON here")
    a = p.parse_args()
    if not a.ab:
        print(json.dumps(measure(a.graph, a.epochs, a.world)))
        return
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trees = {"base": a.ab, "this": here}
    runs: dict[str, list] = {k: [] for k in trees}
    for _ in range(a.rounds):
        for name, tree in trees.items():
            env = dict(os.environ, PYTHONPATH=tree)
            cmd = [sys.executable, __file__, a.graph, "--epochs", str(a.epochs),
                   "--world", str(a.world)]  # fmt: skip
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    best = {k: min(r["best_s"] for r in v) for k, v in runs.items()}
    report = {
        "command": " ".join(sys.argv),
        "graph": a.graph,
        "best_epoch_s": best,
        "this_vs_base": best["this"] / best["base"] - 1,
        "open_s": {k: min(r["open_s"] for r in v) for k, v in runs.items()},
        "runs": runs,
    }
    print(json.dumps(report, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()

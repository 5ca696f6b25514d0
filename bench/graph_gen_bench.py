"""``solar gen --preset graph`` at scale: wall time, peak memory and file size, side by side.

    flock /tmp/solar-bench.lock python bench/graph_gen_bench.py --nodes 10000000 \\
        --label new --pythonpath . [--avg-degree 20 --features 256 --out /tmp/g.h5]
    flock /tmp/solar-bench.lock python bench/graph_gen_bench.py --nodes 10000000 \\
        --label base --pythonpath /tmp/base   # a worktree of an older commit

Each run is one ``python -m solar.cli gen`` subprocess; its peak resident memory is the child's
``ru_maxrss`` (getrusage of children, so the benchmark's own process does not count). The
output file is deleted after it is measured unless ``--keep``. Results are merged by label into
``--json`` (default ``bench/results/graph-gen.json``), one entry per (label, nodes, degree,
features), with the command that produced it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--avg-degree", type=float, default=20.0)
    p.add_argument("--features", type=int, default=256)
    p.add_argument("--label", required=True)
    p.add_argument("--pythonpath", default=".")
    p.add_argument("--out", default="/tmp/i34-graph/gen-bench.h5")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--json", default="bench/results/graph-gen.json")
    args = p.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "solar.cli", "gen", str(out), "--preset", "graph", "--nodes",
           str(args.nodes), "--avg-degree", str(args.avg_degree), "--features",
           str(args.features), "--force"]  # fmt: skip
    code = Path(args.pythonpath).resolve()
    env = {**os.environ, "PYTHONPATH": str(code)}
    t0 = time.perf_counter()
    # In the code's directory: ``python -m`` puts the working directory first on sys.path.
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=code)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{done.stderr}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    size = out.stat().st_size
    edges = None
    try:
        import h5py

        with h5py.File(out) as f:
            edges = int(f["indices"].shape[0])
    except Exception:
        pass
    if not args.keep:
        out.unlink()
    row = {"label": args.label, "nodes": args.nodes, "avg_degree": args.avg_degree,
           "features": args.features, "edges": edges, "seconds": round(seconds, 1),
           "peak_rss_gib": round(peak / 2**30, 3), "file_gib": round(size / 2**30, 3),
           "command": " ".join(["flock /tmp/solar-bench.lock python", *sys.argv]),
           "pythonpath": str(code), "stdout": done.stdout.strip()}  # fmt: skip
    print(json.dumps(row))
    path = Path(args.json).resolve()
    rows = json.loads(path.read_text()) if path.exists() else []
    key = ("label", "nodes", "avg_degree", "features")
    rows = [r for r in rows if any(r[k] != row[k] for k in key)] + [row]
    path.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()

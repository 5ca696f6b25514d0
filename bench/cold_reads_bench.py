"""Cold reads through the page cache: a GNN Loader's epochs with the features' pages evicted
before each (``ReaderConfig(direct_io=False)``: buffered reads, as a dataset is read where
``O_DIRECT`` is not chosen), wall and process CPU seconds per epoch.

    solar gen --preset graph --nodes 1000000 /tmp/g1m-f256.h5      # F = 256: 1 KiB rows
    python bench/cold_reads_bench.py compare /tmp/g1m-f256.h5 --base /tmp/base [--runs 2]
    python bench/cold_reads_bench.py run /tmp/g1m-f256.h5 [--epochs 3]       # this tree

``compare``: ``run`` in fresh processes under two trees (``--base``: a checkout of another
commit), alternated. Epoch 0 also pays the graph's first reads; later epochs are the figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def _evict(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def run(args: argparse.Namespace) -> dict:
    from solar import Loader, NeighborSampler, ReaderConfig

    sampler = NeighborSampler(args.graph, (10, 5), batch_size=args.batch)
    epochs = []
    with Loader(args.graph, ["features"], sampler=sampler, epochs=args.epochs,
                buffer=args.buffer, reader=ReaderConfig(direct_io=False)) as ld:  # fmt: skip
        for e in range(args.epochs):
            _evict(args.graph)
            ld.set_epoch(e)
            t, c, rows = time.perf_counter(), time.process_time(), 0
            for b in ld:
                rows += int(b["n_id"].shape[0])
            epochs.append({"wall_s": round(time.perf_counter() - t, 2),
                           "cpu_s": round(time.process_time() - c, 2), "rows": rows})  # fmt: skip
    return {"tree": os.environ.get("PYTHONPATH", ""), "epochs": epochs}


def compare(args: argparse.Namespace) -> dict:
    got: dict[str, list] = {"base": [], "new": []}
    for _ in range(args.runs):
        for name, tree in (("base", str(Path(args.base).resolve())), ("new", str(HERE))):
            cmd = [sys.executable, __file__, "run", args.graph, "--epochs", str(args.epochs)]
            res = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=tree), check=True,
                                 capture_output=True, text=True)  # fmt: skip
            r = json.loads(res.stdout)
            got[name].append(r)
            print(f"{name}: wall {[e['wall_s'] for e in r['epochs']]} s, "
                  f"CPU {[e['cpu_s'] for e in r['epochs']]} s", file=sys.stderr)  # fmt: skip
    return got


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["run", "compare"])
    p.add_argument("graph")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--buffer", default="10%")
    p.add_argument("--base", help="compare: the other tree")
    p.add_argument("--runs", type=int, default=2)
    args = p.parse_args()
    print(json.dumps(run(args) if args.mode == "run" else compare(args), indent=1))


if __name__ == "__main__":
    main()

"""Converting an OGB-style directory of .npy files to solar's graph file: time, peak memory,
and the result served byte-identical to its source.

    flock /tmp/solar-bench.lock python bench/graph_ingest_bench.py \\
        [--nodes 1000000 --degree 10 --features 128 --memory 256MiB --dir /tmp/i34-graph/ogb]

Makes the directory (``edge.npy`` (E, 2) int64, ``node_feat.npy`` float32, ``node_label.npy``
(N, 1) float64 with NaN for unlabelled nodes, ``split/random/{train,valid,test}.npy``) unless it
exists, evicts its files from the page cache, then runs ``solar convert DIR OUT --memory M``
in a subprocess (its peak RSS by ``/usr/bin/time``). Then checks, in bounded memory: the
features byte for byte, the CSR's (source, target) pairs against the edge list (sorted keys),
labels and splits; and serves one epoch of ``NeighborSampler((10, 5), 1024)`` through a Loader
checking every batch's ``x`` against the source rows. Results: ``bench/results/graph-ingest.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def make(root: Path, n: int, degree: int, f: int) -> None:
    (root / "split" / "random").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    e = n * degree
    edges = np.lib.format.open_memmap(root / "edge.npy", "w+", np.int64, (e, 2))
    block = 1 << 22
    for lo in range(0, e, block):
        hi = min(lo + block, e)
        # Power-law-ish targets and uniform sources: some nodes with many in-neighbours.
        edges[lo:hi, 0] = rng.integers(0, n, hi - lo)
        edges[lo:hi, 1] = (n * rng.random(hi - lo) ** 2).astype(np.int64)
    edges.flush()
    del edges
    x = np.lib.format.open_memmap(root / "node_feat.npy", "w+", np.float32, (n, f))
    for lo in range(0, n, 1 << 16):
        hi = min(lo + (1 << 16), n)
        x[lo:hi] = rng.standard_normal((hi - lo, f), np.float32)
    x.flush()
    del x
    labels = rng.integers(0, 40, (n, 1)).astype(np.float64)
    labels[rng.random(n) < 0.05] = np.nan
    np.save(root / "node_label.npy", labels)
    perm = rng.permutation(n)
    k = n // 10
    for name, ids in (
        ("train", perm[:k]),
        ("valid", perm[k : 2 * k]),
        ("test", perm[2 * k : 3 * k]),
    ):
        np.save(root / "split" / "random" / f"{name}.npy", np.sort(ids))


def evict(path: Path) -> None:
    for p in [path] if path.is_file() else path.rglob("*.npy"):
        fd = os.open(p, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def check(root: Path, out: Path, n: int) -> dict:
    import h5py

    from solar import Graph, Loader, NeighborSampler

    t0 = time.perf_counter()
    src = np.load(root / "node_feat.npy", mmap_mode="r")
    with h5py.File(out) as f:
        x = f["features"]
        for lo in range(0, n, 1 << 16):
            if x[lo : lo + (1 << 16)].tobytes() != np.asarray(src[lo : lo + (1 << 16)]).tobytes():
                raise SystemExit(f"features differ at rows {lo}..")
        labels = np.load(root / "node_label.npy")[:, 0]
        want = np.where(np.isnan(labels), -1, labels).astype(np.int64)
        assert np.array_equal(f["labels"][()], want), "labels differ"
        for name in ("train", "valid", "test"):
            ids = np.load(root / "split" / "random" / f"{name}.npy")
            assert np.array_equal(f[f"{name}_idx"][()], ids), name
    g = Graph(out)
    edges = np.load(root / "edge.npy", mmap_mode="r")
    want_keys = np.sort(edges[:, 0] * n + edges[:, 1])
    dst = np.repeat(np.arange(n, dtype=np.int64), g.degree())
    got_keys = np.sort(np.asarray(g.indices, np.int64) * n + dst)
    assert np.array_equal(got_keys, want_keys), "edges differ"
    del want_keys, got_keys, dst
    checked = time.perf_counter() - t0
    t0 = time.perf_counter()
    sampler = NeighborSampler(out, (10, 5), batch_size=1024)
    rows = 0
    with Loader(out, ["features"], sampler=sampler, epochs=1, buffer="10%", rank=0,
                world_size=1) as ld:  # fmt: skip
        for b in ld:
            n_id = b["n_id"].numpy()
            order = np.argsort(n_id)
            want = np.asarray(src[n_id[order]])
            if b["x"].numpy()[order].tobytes() != want.tobytes():
                raise SystemExit("served rows differ from the source")
            rows += n_id.size
    return {"check_seconds": round(checked, 1), "served_rows": rows,
            "serve_seconds": round(time.perf_counter() - t0, 1), "identical": True}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=1_000_000)
    p.add_argument("--degree", type=int, default=10)
    p.add_argument("--features", type=int, default=128)
    p.add_argument("--memory", default="128MiB")  # features 4x that
    p.add_argument("--dir", default="/tmp/i34-graph/ogb")
    p.add_argument("--json", default="bench/results/graph-ingest.json")
    p.add_argument("--no-check", action="store_true")
    args = p.parse_args()
    root, out = Path(args.dir), Path(args.dir).with_suffix(".h5")
    if not (root / "edge.npy").exists():
        t0 = time.perf_counter()
        make(root, args.nodes, args.degree, args.features)
        print(f"made {root} in {time.perf_counter() - t0:.1f} s", flush=True)
    evict(root)
    # Peak RSS by /usr/bin/time: a child's ru_maxrss would count this process's pages at fork.
    cmd = ["/usr/bin/time", "-f", "%M", sys.executable, "-m", "solar.cli", "convert", str(root),
           str(out), "--memory", args.memory, "--force"]  # fmt: skip
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if done.returncode:
        raise SystemExit(done.stderr)
    peak = int(done.stderr.strip().splitlines()[-1]) * 1024
    feat_bytes = args.nodes * args.features * 4
    row = {"nodes": args.nodes, "edges": args.nodes * args.degree, "features": args.features,
           "feature_gib": round(feat_bytes / 2**30, 3), "memory": args.memory,
           "convert_seconds": round(seconds, 1), "peak_rss_gib": round(peak / 2**30, 3),
           "file_gib": round(out.stat().st_size / 2**30, 3), "stdout": done.stdout.strip(),
           "command": " ".join(["flock /tmp/solar-bench.lock python", *sys.argv])}  # fmt: skip
    print(json.dumps(row), flush=True)
    if not args.no_check:
        row.update(check(root, out, args.nodes))
    print(json.dumps(row), flush=True)
    path = Path(args.json)
    rows = json.loads(path.read_text()) if path.exists() else []
    rows = [r for r in rows if (r["nodes"], r["features"], r["memory"]) !=
            (row["nodes"], row["features"], row["memory"])] + [row]  # fmt: skip
    path.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()

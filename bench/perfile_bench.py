"""One sample per file, served as it is, vs the same data converted to one contiguous file.

Writes ``--files`` one-sample HDF5 files (two keys, one inside a group) and as many ``.npy``
files, converts each set with ``solar convert``, then times one epoch of ``Loader`` over each
of the four sources with their pages evicted first (cold), under a lowered RLIMIT_NOFILE so
that the reader's descriptor cache must recycle descriptors. Reports samples/s (best of
``--repeat``) and the per-file rate as a share of the converted one.

    .venv/bin/python bench/perfile_bench.py --files 5000 --nofile 256 \
        --json bench/results/perfile.json
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

from solar import Loader, ReaderConfig
from solar._atomic import write_json
from solar.io.convert import convert
from solar.io.pagecache import evict
from solar.io.sources import describe_source


def write(root: Path, n: int, shape: tuple[int, ...]) -> dict[str, Path]:
    rng = np.random.default_rng(0)
    h5dir, npydir = root / "h5", root / "npy"
    h5dir.mkdir()
    npydir.mkdir()
    for i in range(n):
        x = rng.standard_normal(shape, np.float32)
        with h5py.File(h5dir / f"s{i:06d}.h5", "w") as f:
            f["img"] = x
            f["meta/lab"] = np.full(4, i, np.int32)
        np.save(npydir / f"s{i:06d}.npy", x)
    convert([h5dir], root / "h5.h5", one_per_file=True)
    convert([npydir], root / "npy.h5", one_per_file=True)
    return {
        "h5": h5dir,
        "npy": npydir,
        "h5-converted": root / "h5.h5",
        "npy-converted": root / "npy.h5",
    }


def epoch_rate(source: Path, one_per_file: bool, threads: int, batch: int) -> float:
    info = describe_source(source, one_per_file=one_per_file)
    files = list(info.all_files)
    with Loader(source, batch_size=batch, epochs=1, buffer=1,
                reader=ReaderConfig(threads=threads, one_per_file=one_per_file)) as ld:  # fmt: skip
        evict(files)
        t0 = time.perf_counter()
        n = sum(int(b["index"].numel()) for b in ld)
        return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=5000)
    ap.add_argument("--shape", default="16,32,32", help="float32 sample shape")
    ap.add_argument("--nofile", type=int, default=256, help="RLIMIT_NOFILE soft limit")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (args.nofile, hard))
    shape = tuple(int(s) for s in args.shape.split(","))
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        paths = write(Path(tmp), args.files, shape)
        rates: dict[str, list[float]] = {k: [] for k in paths}
        for _ in range(args.repeat):  # interleaved: the disk's cold latency drifts
            for name, path in paths.items():
                rates[name].append(
                    epoch_rate(path, "converted" not in name, args.threads, args.batch)
                )
    best = {k: max(v) for k, v in rates.items()}
    result = {
        "files": args.files, "sample_shape": shape, "nofile": args.nofile,
        "threads": args.threads, "batch": args.batch, "samples_per_s": best, "all": rates,
        "share_of_converted": {
            k: best[k] / best[f"{k}-converted"] for k in ("h5", "npy")
        },
    }  # fmt: skip
    for k, v in best.items():
        print(f"{k:>14}: {v:10.0f} samples/s")
    for k, v in result["share_of_converted"].items():
        print(f"{k:>14}: {100 * v:.0f} % of converted")
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()

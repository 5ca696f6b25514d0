"""Cold reads of compressed, one-sample-per-chunk files: solar's chunk path vs h5py vs the old one.

For PtychoNN-like samples (256×256 + 2×64×64 float32) stored one sample per chunk with gzip,
zstd and bitshuffle-lz4, this times, with the files' pages evicted before each measurement:

* ``solar``: ``Reader.read`` (ChunkReads: pread, decode on the reader's threads, scatter);
* ``old``: the same Reader with ``decode_chunks=False`` (H5Rows: h5py behind one lock);
* ``h5py``: ``dset[i]`` for every key, one sample at a time;

on random single samples and on sorted batches of 32 random samples. A third pattern is what
a training loop sees: a ``Loader`` at batch size 1 (no buffer, so every sample is read) serves
one epoch, its read-ahead overlapping reads and decodes of the next steps, against h5py
``dset[i]`` over as many random samples (``old``: the Loader with ``decode_chunks=False``).
Reports samples/s, the median of ``--repeat`` interleaved measurements (the disk's cold latency
drifts between runs).

    .venv/bin/python bench/chunk_bench.py --samples 1500 --reads 320 \
        --json bench/results/chunks.json
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

from solar import Loader, ReaderConfig
from solar._atomic import write_json
from solar.io.generate import generate
from solar.io.hdf5 import describe
from solar.io.pagecache import evict
from solar.io.reader import Reader


def write_files(folder: Path, n: int) -> dict[str, Path]:
    """gzip (solar's generator), then zstd and bitshuffle-lz4 copies with the same samples."""
    files = {"gzip": generate(folder / "gzip.h5", "ptychonn", n, chunks=1, compression="gzip")}
    try:
        import hdf5plugin
    except ImportError:
        return files
    filters = {"zstd": hdf5plugin.Zstd(clevel=3), "bitshuffle-lz4": hdf5plugin.Bitshuffle()}
    with h5py.File(files["gzip"]) as src:
        for name, flt in filters.items():
            files[name] = folder / f"{name}.h5"
            with h5py.File(files[name], "w") as dst:
                for key in src:
                    d = src[key]
                    dst.create_dataset(key, data=d[()], chunks=(1, *d.shape[1:]), **dict(flt))
    return files


def _solar(path: Path, batches: list[np.ndarray], decode: bool, threads: int) -> float:
    info = describe([path])
    reader = Reader(info, ReaderConfig(threads=threads, decode_chunks=decode))
    size = max(b.size for b in batches)
    out = [np.empty((size, *k.sample_shape), k.native_dtype) for k in info.keys]
    reader.warm_up()  # numba kernels, the pool, the chunk index: outside the timing
    reader.read(batches[0][:1], out)
    evict(path)
    t0 = time.perf_counter()
    for b in batches:
        reader.read(b, out)
    seconds = time.perf_counter() - t0
    reader.close()
    return sum(b.size for b in batches) / seconds


def _loader(path: Path, decode: bool, threads: int) -> float:
    loader = Loader(
        path, batch_size=1, epochs=1, buffer=0,
        reader=ReaderConfig(threads=threads, decode_chunks=decode),
    )  # fmt: skip
    evict(path)  # after construction: planning and the reader's warm-up are not timed
    t0 = time.perf_counter()
    served = sum(b["index"].numel() for b in loader)
    seconds = time.perf_counter() - t0
    loader.close()
    return served / seconds


def _h5py(path: Path, batches: list[np.ndarray]) -> float:
    evict(path)
    with h5py.File(path) as f:
        dsets = [f[k] for k in f]
        t0 = time.perf_counter()
        for b in batches:
            for i in b.tolist():
                for d in dsets:
                    d[i]
        seconds = time.perf_counter() - t0
    return sum(b.size for b in batches) / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=2000, help="samples per file")
    ap.add_argument("--reads", type=int, default=400, help="samples read per measurement")
    ap.add_argument("--threads", type=int, default=8, help="ReaderConfig.threads (its default)")
    ap.add_argument("--repeat", type=int, default=3, help="medians of this many measurements")
    ap.add_argument("--dir", default=None, help="where to write the files (default: a tmp dir)")
    ap.add_argument("--codecs", default=None, help="comma-separated subset (gzip,zstd,...)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    # (name, samples per read, reads); the Loader serves a whole epoch: h5py reads as many.
    patterns = (
        ("random single", 1, args.reads),
        ("sorted batch 32", 32, args.reads // 32),
        ("loader batch 1", 1, args.samples),
    )
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        files = write_files(Path(tmp), args.samples)
        results = []
        for codec, path in files.items():
            if args.codecs and codec not in args.codecs.split(","):
                continue
            # Different samples per pattern and method: nothing is read warm by accident.
            for pattern, batch, count in patterns:

                def draw(count: int = count, batch: int = batch) -> list[np.ndarray]:
                    picks = rng.choice(args.samples, count * batch, replace=False)  # distinct
                    return [np.sort(p) for p in picks.reshape(count, batch)]

                runs: dict[str, list[float]] = {"solar": [], "old": [], "h5py": []}
                for _ in range(args.repeat):  # interleaved, so drifts of the disk hit all three
                    if pattern.startswith("loader"):
                        runs["solar"].append(_loader(path, True, args.threads))
                        runs["old"].append(_loader(path, False, args.threads))
                    else:
                        runs["solar"].append(_solar(path, draw(), True, args.threads))
                        runs["old"].append(_solar(path, draw(), False, args.threads))
                    runs["h5py"].append(_h5py(path, draw()))
                row = {"codec": codec, "pattern": pattern}
                row.update({k: float(np.median(v)) for k, v in runs.items()})
                row["runs"] = runs
                row["vs_h5py"] = row["solar"] / row["h5py"]
                row["vs_old"] = row["solar"] / row["old"]
                results.append(row)
                print(
                    f"{codec:15s} {pattern:16s} solar {row['solar']:7.0f}/s  "
                    f"old {row['old']:7.0f}/s  h5py {row['h5py']:7.0f}/s  "
                    f"{row['vs_h5py']:.2f}× h5py  {row['vs_old']:.2f}× old",
                    flush=True,
                )
    if args.json:
        meta = {
            "samples": args.samples, "reads": args.reads, "threads": args.threads,
            "repeat": args.repeat, "cpus": os.cpu_count(), "preset": "ptychonn",
            "chunk": "one sample", "evicted": "before each measurement",
        }  # fmt: skip
        write_json(args.json, {"meta": meta, "results": results})


if __name__ == "__main__":
    main()

"""Runtime benchmark: the reader and the loader against numpy, h5py and the PyTorch DataLoader.

    python bench/loader_bench.py [--samples 4096] [--json bench/results/loader.json]

Every storage measurement starts cold: the file's pages are evicted with
posix_fadvise(DONTNEED) before it (the host may still cache the virtual disk, see the design
notes §7, so figures are ratios measured side by side in this one run).

1. hits: a loader step served wholly from the buffer vs ``np.take`` of the same rows;
2. coalesced: the reader on sorted, adjacent samples vs 16 MiB sequential reads of the file;
3. random: the reader on random single samples vs h5py ``dset[i]``;
4. epochs: one process, buffer = half the dataset, 4 cold epochs: solar vs a PyTorch DataLoader
   (DistributedSampler, h5py opened lazily in each of 2 workers).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
import torch
from torch.utils.data import DataLoader, DistributedSampler

from solar import Loader, ReaderConfig
from solar import bench as harness
from solar._atomic import write_json
from solar.io.generate import generate
from solar.io.hdf5 import describe
from solar.io.pagecache import evict
from solar.io.reader import Reader
from solar.options import PlanningConfig


def sequential_bandwidth(path: Path, limit: int = 2**30) -> float:
    """Cold sequential read bandwidth of ``path``: 16 MiB reads of at most ``limit`` bytes,
    one run (main() repeats, interleaved)."""
    block = bytearray(16 * 2**20)
    evict([path])
    total, t0 = 0, time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while total < limit and (n := f.readinto(block)):
            total += n
    return total / (time.perf_counter() - t0)


def bench_hits(path: Path, batch: int) -> dict:
    n = describe([path]).num_samples
    ld = Loader(path, batch_size=batch, epochs=2, buffer=n, planning=PlanningConfig(slack=0))
    ld.set_epoch(0)
    for _ in ld:
        pass
    ld.set_epoch(1)  # every sample is now held: pure hits
    times, t_prev = [], time.perf_counter()
    for b in ld:
        t = time.perf_counter()
        times.append(t - t_prev)
        t_prev = t
        del b
    step = float(np.median(times[1:]))
    assert ld.stats.epochs[1].reads == 0
    bufs = ld.buffer.arrays
    rng = np.random.default_rng(0)
    gather = []
    for _ in range(len(times)):
        idx = rng.choice(n, batch, replace=False)
        t0 = time.perf_counter()
        _ = [np.take(a, idx, axis=0) for a in bufs]
        gather.append(time.perf_counter() - t0)
    ref = float(np.median(gather))
    ld.close()
    return {"step_seconds": step, "numpy_take_seconds": ref, "ratio": step / ref}


def bench_coalesced(path: Path, info, threads: int) -> dict:
    reader = Reader(info, ReaderConfig(threads=threads))
    n = info.num_samples
    out = [np.empty((256, *k.sample_shape), k.native_dtype) for k in info.keys]
    evict(path)
    t0 = time.perf_counter()
    total = 0
    for lo in range(0, n - 255, 256):
        total += reader.read(np.arange(lo, lo + 256), out)
    rate = total / (time.perf_counter() - t0)
    reader.close()
    return {"bytes_per_second": rate}


def bench_random(path: Path, info, threads: int, count: int) -> dict:
    keys = [k.name for k in info.keys]
    rng = np.random.default_rng(1)
    idx = rng.choice(info.num_samples, count, replace=False)
    reader = Reader(info, ReaderConfig(threads=threads))
    out = [np.empty((64, *k.sample_shape), k.native_dtype) for k in info.keys]
    evict(path)
    t0 = time.perf_counter()
    for lo in range(0, count - 63, 64):
        reader.read(idx[lo : lo + 64], out)
    solar_rate = count / (time.perf_counter() - t0)
    reader.close()
    evict(path)
    t0 = time.perf_counter()
    with h5py.File(path, "r") as f:
        dsets = [f[k] for k in keys]
        for i in idx:
            for d in dsets:
                d[int(i)]
    h5_rate = count / (time.perf_counter() - t0)
    return {"solar_samples_per_second": solar_rate, "h5py_samples_per_second": h5_rate,
            "ratio": solar_rate / h5_rate}  # fmt: skip


def bench_epochs(path: Path, batch: int, epochs: int, workers: int, threads: int) -> dict:
    n = describe([path]).num_samples
    ds = harness.H5Dataset(describe([path]))
    sampler = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=0)
    dl = DataLoader(ds, batch_size=batch, sampler=sampler, num_workers=workers,
                    persistent_workers=workers > 0)  # fmt: skip
    iter(dl)  # fork the workers before solar's buffer exists (no copy-on-write sharing)
    solar = Loader(
        path, batch_size=batch, epochs=epochs, buffer=n // 2, reader=ReaderConfig(threads=threads)
    )
    times: dict[str, list[float]] = {"torch": [], "solar": []}
    for e in range(epochs):  # interleaved A/B so that drift on the host hits both alike
        for name in ("torch", "solar"):
            evict(path)
            t0 = time.perf_counter()
            if name == "torch":
                sampler.set_epoch(e)
                count = sum(len(b["diffraction"]) for b in dl)
            else:
                solar.set_epoch(e)
                count = sum(len(b["index"]) for b in solar)
            assert count == n
            times[name].append(time.perf_counter() - t0)
    st = solar.stats.epochs
    result = {
        "epochs": epochs,
        "torch_epoch_seconds": times["torch"],
        "solar_epoch_seconds": times["solar"],
        "torch_samples_per_second": n * epochs / sum(times["torch"]),
        "solar_samples_per_second": n * epochs / sum(times["solar"]),
        "solar_hit_rate": sum(s.hits for s in st.values()) / (n * epochs),
        "bound": solar.plan.bound,
        "solar_stall_seconds": [st[e].stall_seconds for e in range(epochs)],
    }
    result["speedup"] = result["solar_samples_per_second"] / result["torch_samples_per_second"]
    solar.close()
    return result


def _random_tiny(tmp: Path, threads: int) -> dict:
    """Random reads of BraggNN-like samples (484 B + 8 B): per-read overhead, not bandwidth."""
    path = generate(tmp / "braggnn.h5", "braggnn", 200_000)
    return _median([bench_random(path, describe([path]), threads, 8192) for _ in range(3)])


def _median(runs: list[dict]) -> dict:
    return {k: float(np.median([r[k] for r in runs])) for k in runs[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--dir", type=Path, default=None, help="where to write the dataset")
    parser.add_argument("--json", type=Path)
    opts = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(dir=opts.dir) as tmp:
        path = generate(Path(tmp) / "ptychonn.h5", "ptychonn", opts.samples)
        info = describe([path])
        # Storage pairs run interleaved, three times, and report medians (design notes §7).
        seqs, coalesced, random = [], [], []
        for _ in range(3):
            seqs.append(sequential_bandwidth(path))
            coalesced.append(bench_coalesced(path, info, opts.threads))
            random.append(bench_random(path, info, opts.threads, min(1024, opts.samples)))
        seq = float(np.median(seqs))
        results = {
            "samples": opts.samples,
            "sample_bytes": info.sample_bytes,
            "sequential_bytes_per_second": seq,
            "hits": bench_hits(path, 64),
            "coalesced": _median(coalesced),
            "random": _median(random),
            "random_tiny": _random_tiny(Path(tmp), opts.threads),
            "epochs": bench_epochs(path, opts.batch, 4, opts.workers, opts.threads),
        }
    results["coalesced"]["share_of_sequential"] = results["coalesced"]["bytes_per_second"] / seq
    h, c, r, e = (results[k] for k in ("hits", "coalesced", "random", "epochs"))
    mb = info.sample_bytes / 2**10
    print(f"PtychoNN-like, {opts.samples} samples of {mb:.0f} KiB, cold storage each measurement\n")
    print("| measurement | solar | reference | ratio | target |")
    print("|---|---|---|---|---|")
    print(
        f"| pure-hit step, 64 samples | {1e3 * h['step_seconds']:.2f} ms | np.take "
        f"{1e3 * h['numpy_take_seconds']:.2f} ms | {h['ratio']:.2f}× | ≤ 1.5× |"
    )
    print(
        f"| sorted coalesced reads | {c['bytes_per_second'] / 1e9:.2f} GB/s | sequential "
        f"{seq / 1e9:.2f} GB/s | {100 * c['share_of_sequential']:.0f} % | ≥ 80 % |"
    )
    print(
        f"| random single samples | {r['solar_samples_per_second']:.0f}/s | h5py dset[i] "
        f"{r['h5py_samples_per_second']:.0f}/s | {r['ratio']:.1f}× | ≥ 3× |"
    )
    print(
        f"| 4 cold epochs, buffer N/2 | {e['solar_samples_per_second']:.0f}/s | DataLoader "
        f"{e['torch_samples_per_second']:.0f}/s | {e['speedup']:.2f}× | ≥ 2× |"
    )
    t = results["random_tiny"]
    print(
        f"| random, BraggNN-like | {t['solar_samples_per_second']:.0f}/s | h5py dset[i] "
        f"{t['h5py_samples_per_second']:.0f}/s | {t['ratio']:.1f}× | ≥ 3× |"
    )
    print(f"\nsolar hit rate {100 * e['solar_hit_rate']:.1f} % (bound {100 * e['bound']:.1f} %); "
          f"epoch s solar {[round(t, 2) for t in e['solar_epoch_seconds']]} "
          f"torch {[round(t, 2) for t in e['torch_epoch_seconds']]}; "
          f"solar stall s {[round(t, 2) for t in e['solar_stall_seconds']]}")  # fmt: skip
    if opts.json:
        write_json(opts.json, results)


if __name__ == "__main__":
    main()

"""One scan per job: describing N one-sample files with P ranks, against the converted file.

    python bench/scan_bench.py --files 1000 10000 100000 --ranks 1 4 --format h5 \\
        --json bench/results/scan.json

Generates N one-sample files (nested 1,000 a directory, as CosmoFlow's train/000/*.hdf5; the
bytes of one small file written N times, the fastest way to make them) under --dir, converts
them once to one file (``solar convert``), and runs, under ``mpiexec -n P``, for each mode of
solar/io/scan.py: ``every`` (each rank scans every file: solar before one scan per job),
``split`` (each rank scans N/P files, allgather) and ``root`` (rank 0 scans, broadcast):
``describe_source`` and ``Loader`` construction (``warm=False``: construction proper, not the
kernels' warm-up), each the slowest rank's seconds, after a barrier. The same for the
converted file. ``--warm`` constructs the Loader as users do (its kernels' warm-up included);
``--repeat R`` runs every case R times, interleaved, and keeps each case's median (this machine
is shared: single runs vary by 1.5x). The files are deleted at the end (``--keep`` keeps them).
Metadata stays in
the page cache between runs (dropping it needs privileges this machine does not grant): the
figures are the CPU and system-call cost of a scan, the floor of a parallel file system's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from solar.config import ReaderConfig
from solar.options import ExpertConfig

MPIEXEC = Path(sys.executable).with_name("mpiexec")
SOLAR = Path(sys.executable).with_name("solar")
SHAPE = (16, 16)  # float32: 1 KiB a sample


def make_files(root: Path, n: int, fmt: str) -> None:
    """``n`` one-sample files in ``root/000/``, ``root/001/``, ... (1,000 each)."""
    import h5py
    import numpy as np

    root.mkdir(parents=True, exist_ok=True)
    template = root.parent / f"template.{fmt}"
    x = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE)
    if fmt == "npy":
        np.save(template, x)
    else:
        with h5py.File(template, "w") as f:
            f["x"] = x
    data = template.read_bytes()
    suffix = "npy" if fmt == "npy" else "hdf5"
    for i in range(n):
        d = root / f"{i // 1000:03d}"
        if i % 1000 == 0:
            d.mkdir(parents=True, exist_ok=True)
        fd = os.open(d / f"{i:07d}.{suffix}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, data)
        os.close(fd)
    template.unlink()


def child(source: str, mode: str, one_per_file: bool, warm: bool) -> None:
    """Under mpiexec: time describe_source and Loader construction; rank 0 prints JSON."""
    import torch  # noqa: F401  (imported by the Loader: not a cost of the scan)
    from mpi4py import MPI

    import solar.io.scan as scan
    from solar.io.sources import describe_source
    from solar.loader import Loader

    comm = MPI.COMM_WORLD
    scan.SCAN_MODE = mode
    out = {}
    for what in ("describe", "loader"):
        comm.Barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        if what == "describe":
            info = describe_source(source, one_per_file=one_per_file, comm=comm)
        else:
            ld = Loader(source, batch_size=4, epochs=2, buffer=8, comm=comm,
                        reader=ReaderConfig(one_per_file=one_per_file),
                        expert=ExpertConfig(warm=warm))  # fmt: skip
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        out[what] = comm.allreduce(seconds, op=MPI.MAX)
        # CPU seconds (the slowest rank's, all its threads): what a loaded machine disturbs less.
        out[what + "_cpu"] = comm.allreduce(cpu, op=MPI.MAX)
    ld.close()
    out["samples"] = info.num_samples
    if comm.Get_rank() == 0:
        print("RESULT " + json.dumps(out), flush=True)


def _run_once(source: Path, ranks: int, mode: str, one_per_file: bool, warm: bool) -> dict:
    cmd = [str(MPIEXEC), "-n", str(ranks), sys.executable, __file__, "--child", str(source),
           mode, "1" if one_per_file else "0", "1" if warm else "0"]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, check=False,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    if p.returncode:
        raise SystemExit(p.stderr[-3000:])
    line = next(x for x in p.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], sys.argv[4] == "1", sys.argv[5] == "1")
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--format", choices=["h5", "npy"], default="h5")
    ap.add_argument("--modes", nargs="+", default=["every", "split", "root"])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/solar-scan-bench"))
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--warm", action="store_true", help="Loader with its kernels' warm-up")
    ap.add_argument("--repeat", type=int, default=1, help="runs per case (medians)")
    ap.add_argument("--json", type=Path)
    opts = ap.parse_args()
    rows = []
    try:
        for n in opts.files:
            root = opts.dir / f"{opts.format}-{n}" / "train"
            if not root.exists():
                t0 = time.perf_counter()
                make_files(root, n, opts.format)
                print(f"made {n} files in {time.perf_counter() - t0:.1f} s", flush=True)
            single = root.parent / "converted.h5"
            if opts.format == "h5" and not single.exists():
                subprocess.run([str(SOLAR), "convert", str(root), str(single), "--one-per-file"],
                               check=True, capture_output=True)  # fmt: skip
            for p in opts.ranks:
                cases = [(root, mode, True) for mode in (opts.modes if p > 1 else ["every"])]
                cases += [(single, "converted", False)] if single.exists() else []
                runs: list[list[dict]] = [[] for _ in cases]
                for _ in range(opts.repeat):  # interleaved: the machine's load hits all alike
                    for (source, mode, per_file), got in zip(cases, runs, strict=True):
                        got.append(_run_once(source, p, "split" if mode == "converted" else mode,
                                             per_file, opts.warm))  # fmt: skip
                for (_, mode, _), got in zip(cases, runs, strict=True):
                    r = {k: statistics.median(x[k] for x in got) for k in got[0]}
                    rows.append(dict(files=n, ranks=p, mode=mode, warm=opts.warm, **r))
                    print(f"{n:>7} files, P={p}, {mode:>9}: describe {r['describe']:.3f} s, "
                          f"Loader {r['loader']:.3f} s (CPU {r['loader_cpu']:.3f} s)",
                          flush=True)  # fmt: skip
                if single.exists() and len(cases) > 1:
                    conv = rows[-1]["loader"]
                    for row in rows[-len(cases) : -1]:
                        row["loader_vs_converted"] = row["loader"] / conv
                        row["cpu_vs_converted"] = row["loader_cpu"] / rows[-1]["loader_cpu"]
                        print(f"{n:>7} files, P={p}, {row['mode']:>9}: Loader "
                              f"{row['loader_vs_converted']:.2f}x the converted file's "
                              f"(CPU {row['cpu_vs_converted']:.2f}x)", flush=True)  # fmt: skip
    finally:
        if not opts.keep:
            shutil.rmtree(opts.dir, ignore_errors=True)
    if opts.json:
        opts.json.parent.mkdir(parents=True, exist_ok=True)
        opts.json.write_text(json.dumps({"format": opts.format, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()

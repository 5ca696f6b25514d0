"""Preprocessing workers (issue 49): 1 trainer alone vs 1 trainer + 1 worker vs a DataLoader
with one worker process, each process pinned to a core of its own; and the transport's cost
per MB against a local transform's.

    python bench/workers_bench.py --samples 512 --epochs 3 --ms 4 [--cores 0,1]

A transform of about ``--ms`` ms per sample (PtychoNN-like 256x256 float32 in, a 128x128
crop out): repeated numpy passes, calibrated here and handed to every process through
SOLAR_BENCH_REPS. The trainer does nothing but take batches (its core is the transform's when
alone). Modes run one after the other, each in a fresh process (``--mode`` runs one):
``alone``, ``worker`` (Remote, keep=1: every other step the worker's), ``dataloader``
(torch DataLoader, num_workers=1, h5py in the worker), ``transport`` (a gloo pair: one
batch's rows per message), ``fault`` (the worker killed -9 half-way through epoch 1 of 3:
each epoch's seconds, the time lost against half an epoch with it and half alone; needs
``--epochs 3`` or more). Model on paper: with transform time t per sample, transport CPU
cost x per sample on the receiving trainer and c on the sender, a trainer keeping
``keep`` of every ``keep + n`` steps reaches ``(keep + n) / max(keep * t + n * x, t + c)``
samples/s (alone: 1/t); it is printed beside the measured ratio.

Storage: every run starts with the file's pages evicted (posix_fadvise(DONTNEED),
solar.io.pagecache.evict, as bench/loader_bench.py). Rows read from storage are counted per
member: the trainer's (its buffer's misses, plus the worker's steps it had to read and
transform itself) and the worker's (its own buffer's misses; the rows its buffer served).
Alone, the trainer reads what it read with a worker before each member kept its own steps
(the first step of issue 49 left the trainer's plan unchanged); with one, only its own steps'
misses. Several trainers under the default Shuffle (batches the whole plan decides, two-pass
member plans): bench/member_reads.py counts each member's rows read.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
REPS = int(os.environ.get("SOLAR_BENCH_REPS", "8"))


def busy(sample, rng):
    """About ``--ms`` ms: a random crop, then REPS passes of elementwise work over it."""
    i, j = rng.integers(0, 128, size=2)
    x = sample["img"][i : i + 128, j : j + 128].astype(np.float32)
    for _ in range(REPS):
        x = np.sqrt(x * x + 1.0).astype(np.float32) - 0.5
    return {"img": x, "label": sample["label"]}


def calibrate(ms: float) -> int:
    """REPS for ``ms`` ms per sample on this core."""
    global REPS
    sample = {"img": np.random.default_rng(0).random((256, 256), np.float32),
              "label": np.int64(0)}  # fmt: skip
    rng = np.random.default_rng(0)
    REPS = 16
    t0 = time.perf_counter()
    for _ in range(20):
        busy(sample, rng)
    per = (time.perf_counter() - t0) / 20
    return max(1, round(16 * ms / 1e3 / per))


def make_data(path: Path, n: int) -> None:
    import h5py

    rng = np.random.default_rng(1)
    with h5py.File(path, "w") as f:
        f.create_dataset("img", data=rng.random((n, 256, 256), np.float32))
        f.create_dataset("label", data=np.arange(n, dtype=np.int64))


def pin(core: int) -> None:
    os.sched_setaffinity(0, {core})


def free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def timed_epochs(loader, epochs: int, batch: int) -> float:
    """Samples/s over epochs 1.. (epoch 0 warms: kernels, files, the worker's join)."""
    n, t0 = 0, 0.0
    for e in range(epochs):
        if e == 1:
            t0, n = time.perf_counter(), 0
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(e)
        for b in loader:
            n += len(b["label"])
    return n / (time.perf_counter() - t0)


def run_solar(args, remote: bool) -> dict:
    from workers_bench import busy as fn  # pickled by reference: the worker imports it

    from solar import Loader
    from solar.io.pagecache import evict
    from solar.remote import Remote
    from solar.transform import Transform

    pin(args.trainer_core)
    evict(args.data)  # storage cold for every run
    worker = None
    r = None
    if remote:
        address = free_address()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE)]))
        worker = subprocess.Popen(["taskset", "-c", str(args.worker_core), sys.executable, "-m",
                                   "solar.cli", "worker", address, "--threads", "1"],
                                  env=env, stdout=subprocess.PIPE, text=True)  # fmt: skip
        r = Remote(address, keep=1, window=8)
    t = Transform(fn, workers=1, remote=r)
    ld = Loader(args.data, batch_size=args.batch, epochs=args.epochs, buffer=args.buffer,
                seed=0, rank=0, world_size=1, transform=t)  # fmt: skip
    if args.mode == "fault":
        assert worker is not None
        return killed(ld, worker, args.epochs)
    rate = timed_epochs(ld, args.epochs, args.batch)
    figures = {}
    if remote:
        figures = {w: vars(f) for w, f in ld.stats.remote.items()}
    # Rows the trainer read from storage: its buffer's misses, and its workers' steps it read
    # to transform them itself (late or lost).
    fallback = sum(f["read"] for f in figures.values())
    out = {"samples_s": rate, "workers": figures, "trainer_reads": ld.stats.totals().reads,
           "trainer_fallback_reads": fallback, "trainer_hits": ld.stats.totals().hits}  # fmt: skip
    ld.close()
    if worker is not None:
        said, _ = worker.communicate(timeout=120)
        got = re.search(r"(\d+) rows from its buffer, (\d+) read", said or "")
        if got is not None:
            out.update(worker_hits=int(got[1]), worker_reads=int(got[2]))
    return out


def killed(ld, worker: subprocess.Popen, epochs: int) -> dict:
    """kill -9 of the worker half-way through epoch 1: each epoch's seconds (epoch 0 with the
    worker, then the killed one, then the trainer alone) and its figures."""
    seconds = []
    for e in range(epochs):
        ld.set_epoch(e)
        t0 = time.perf_counter()
        for t, _ in enumerate(ld):
            if e == 1 and t == len(ld) // 2:
                worker.kill()
        seconds.append(time.perf_counter() - t0)
    figures = {w: vars(f) for w, f in ld.stats.remote.items()}
    ld.close()
    worker.wait(timeout=60)
    return {"epoch_seconds": seconds, "workers": figures}


def run_dataloader(args) -> dict:
    import h5py
    import torch
    from torch.utils.data import DataLoader, Dataset
    from workers_bench import busy as fn

    class H5(Dataset):
        def __init__(self, path):
            self.path, self.f = path, None

        def __len__(self):
            with h5py.File(self.path) as f:
                return len(f["label"])

        def __getitem__(self, i):
            if self.f is None:
                self.f = h5py.File(self.path)
            s = {"img": self.f["img"][i], "label": self.f["label"][i]}
            out = fn(s, np.random.default_rng(i))
            return {k: torch.from_numpy(np.asarray(v)) for k, v in out.items()}

    pin(args.trainer_core)
    core = args.worker_core
    dl = DataLoader(H5(args.data), batch_size=args.batch, shuffle=True, num_workers=1,
                    worker_init_fn=lambda _: pin(core), persistent_workers=True)  # fmt: skip
    return {"samples_s": timed_epochs(dl, args.epochs, args.batch)}


def run_transport(args) -> dict:
    """One batch's transformed rows per message over a gloo pair (this process receives, a
    child sends, each on its core): seconds per MB on each side."""
    import datetime

    import torch
    import torch.distributed as td

    nbytes = args.batch * (128 * 128 * 4 + 8)
    count = 200
    if args.role == "send":
        pin(args.worker_core)
        host, port = args.address.rsplit(":", 1)
        store = td.TCPStore(host, int(port), None, False, timeout=datetime.timedelta(seconds=60))
        pg = td.ProcessGroupGloo(store, 1, 2, datetime.timedelta(seconds=60))
        t = torch.zeros(nbytes, dtype=torch.uint8)
        c0 = time.process_time()
        for _ in range(count):
            pg.send([t], 0, 2).wait()
        mbs = count * nbytes / 2**20
        print(json.dumps({"send_cpu_s_per_mb": (time.process_time() - c0) / mbs}))
        return {}
    pin(args.trainer_core)
    address = free_address()
    host, port = address.rsplit(":", 1)
    store = td.TCPStore(host, int(port), None, True, timeout=datetime.timedelta(seconds=60),
                        wait_for_workers=False)  # fmt: skip
    child = subprocess.Popen([sys.executable, __file__, "--mode", "transport", "--role", "send",
                              "--address", address, "--batch", str(args.batch),
                              "--worker-core", str(args.worker_core)],
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    pg = td.ProcessGroupGloo(store, 0, 2, datetime.timedelta(seconds=60))
    t = torch.empty(nbytes, dtype=torch.uint8)
    dst = np.empty(nbytes, np.uint8)
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(count):
        pg.recv([t], 1, 2).wait()
        dst[:] = t.numpy()  # the trainer's copy into the batch
    mbs = count * nbytes / 2**20
    wall, cpu = (time.perf_counter() - t0) / mbs, (time.process_time() - c0) / mbs
    out, _ = child.communicate(timeout=60)
    return {
        "wall_s_per_mb": wall,
        "recv_cpu_s_per_mb": cpu,
        **json.loads(out.strip().splitlines()[-1]),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--ms", type=float, default=4.0)
    p.add_argument("--buffer", type=int, default=None, help="samples (default: --batch)")
    p.add_argument("--cores", default="0,1", help="trainer's core, worker's core")
    p.add_argument("--data", default=None, help="HDF5 file (default: made in /tmp)")
    modes = ["all", "alone", "worker", "dataloader", "transport", "fault"]
    p.add_argument("--mode", default="all", choices=modes)
    p.add_argument("--role", default="recv", help=argparse.SUPPRESS)
    p.add_argument("--address", default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker-core", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    args.buffer = args.batch if args.buffer is None else args.buffer
    cores = [int(c) for c in args.cores.split(",")]
    args.trainer_core = cores[0]
    args.worker_core = cores[1] if args.worker_core is None else args.worker_core
    if args.mode == "transport" and args.role == "send":
        run_transport(args)
        return
    if args.mode != "all":
        got = {"alone": lambda: run_solar(args, False), "worker": lambda: run_solar(args, True),
               "fault": lambda: run_solar(args, True),
               "dataloader": lambda: run_dataloader(args),
               "transport": lambda: run_transport(args)}[args.mode]()  # fmt: skip
        print(json.dumps(got))
        return
    pin(args.trainer_core)
    reps = calibrate(args.ms)
    data = Path(args.data or f"/tmp/workers_bench_{args.samples}.h5")
    if not data.exists():
        make_data(data, args.samples)
    # The trainers and the worker share a secret, as any run with workers must (one per run).
    key = os.environ.get("SOLAR_REMOTE_KEY") or secrets.token_hex(16)
    env = dict(os.environ, SOLAR_BENCH_REPS=str(reps), SOLAR_REMOTE_KEY=key,
               PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE)]))  # fmt: skip
    results = {}
    for mode in ("transport", "alone", "worker", "dataloader", "fault"):
        cmd = [sys.executable, __file__, "--mode", mode, "--data", str(data), "--samples",
               str(args.samples), "--epochs", str(args.epochs), "--batch", str(args.batch),
               "--buffer", str(args.buffer), "--cores", args.cores]  # fmt: skip
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
        results[mode] = json.loads(out.strip().splitlines()[-1])
        print(mode, results[mode], flush=True)
    t = 1.0 / results["alone"]["samples_s"]  # the trainer's seconds per sample, alone
    mb = (128 * 128 * 4 + 8) / 2**20
    x = results["transport"]["recv_cpu_s_per_mb"] * mb
    c = results["transport"]["send_cpu_s_per_mb"] * mb
    model = 2.0 / max(t + x, t + c) * t  # keep=1, one worker: the ratio to alone
    wall = results["transport"]["wall_s_per_mb"]
    print(f"transform {t * 1e3:.2f} ms/sample ({t / mb * 1e3:.1f} ms per MB out); transport "
          f"{wall * 1e3:.2f} ms/MB wall, CPU: receiver {x / mb * 1e3:.2f} ms/MB, sender "
          f"{c / mb * 1e3:.2f} ms/MB")  # fmt: skip
    print(f"1 trainer + 1 worker vs alone: {results['worker']['samples_s'] / (1 / t):.2f}x "
          f"(model {model:.2f}x); DataLoader(num_workers=1) vs alone: "
          f"{results['dataloader']['samples_s'] * t:.2f}x")  # fmt: skip
    a, w = results["alone"], results["worker"]
    print(f"rows read from storage over {args.epochs} epochs: trainer alone (as with a worker "
          f"before members kept their own steps) {a['trainer_reads']}; with a worker: trainer "
          f"{w['trainer_reads']} (+{w['trainer_fallback_reads']} of the worker's steps, late), "
          f"worker {w.get('worker_reads')} ({w.get('worker_hits')} from its buffer)")  # fmt: skip
    e0, e1, e2 = results["fault"]["epoch_seconds"][:3]
    print(f"worker killed -9 mid-epoch 1: epochs {e0:.2f} s (with it), {e1:.2f} s (killed), "
          f"{e2:.2f} s (alone); lost vs half of each: {e1 - (e0 + e2) / 2:+.2f} s")  # fmt: skip


if __name__ == "__main__":
    main()

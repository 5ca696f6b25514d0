"""torch.compile (inductor, CPU) on solar's batches: graphs compiled and step times with equal
local batches against variable ones (slack), under DDP.

    mpiexec -n 2 python bench/compile_bench.py [--samples 1001] [--epochs 2] [--slack 0.5]

Each mode trains the same small CNN from the same start for the same epochs (drop_last, so the
only shapes are the loader's): ``equal`` with ``equal_batches=True`` and a plain mean loss,
``variable`` with slack and ``dist.scale_loss``. Reported on rank 0: graphs dynamo compiled
(``unique_graphs``), seconds of the first step (the compilation), of all steps after it, and
of the steps that compiled again. The data (``--samples`` rows of 1×32×32 float32 and a
4-vector) is written to a temporary file.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
import torch
import torch._dynamo
from torch._dynamo.utils import counters
from torch.nn.parallel import DistributedDataParallel as DDP

from solar import Loader, dist
from solar.options import PlanningConfig


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
        torch.nn.Linear(8 * 16 * 16, 4),
    )  # fmt: skip


def train(path: str, equal: bool, opts, d) -> dict:
    torch._dynamo.reset()
    counters.clear()
    ld = Loader(path, batch_size=opts.batch_size, epochs=opts.epochs, buffer=opts.buffer,
                comm=d.comm, drop_last=True,
                planning=PlanningConfig(slack=opts.slack, equal_batches=equal))  # fmt: skip
    ddp = DDP(torch.compile(model(), backend="inductor"))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    times, graphs, sizes = [], [], set()
    for e in range(opts.epochs):
        ld.set_epoch(e)
        for b in ld:
            t0 = time.perf_counter()
            x, y = b["x"], b["y"]
            sizes.add(len(x))
            opt.zero_grad()
            per_sample = ((ddp(x) - y) ** 2).sum(dim=1)
            if equal:  # a plain mean: DDP's average is the global mean
                loss = per_sample.mean()
            else:
                loss = dist.scale_loss(per_sample.sum(), ld.global_batch)
            loss.backward()
            opt.step()
            times.append(time.perf_counter() - t0)
            graphs.append(counters["stats"]["unique_graphs"])
    ld.close()
    later = [t for t, g0, g1 in zip(times[1:], graphs, graphs[1:], strict=False) if g1 > g0]
    return {
        "mode": "equal" if equal else f"variable (slack {opts.slack})",
        "batch_sizes": sorted(sizes),
        "graphs": graphs[-1],
        "first_step_s": times[0],
        "recompiling_steps": len(later),
        "recompile_s": sum(later),
        "steps": len(times),
        "after_first_s": sum(times[1:]),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=1001)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--buffer", type=int, default=200)
    parser.add_argument("--slack", type=float, default=0.5)
    opts = parser.parse_args()
    d = dist.init()
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "data.h5")
        if d.is_root:
            rng = np.random.default_rng(0)
            with h5py.File(path, "w") as f:
                f["x"] = rng.standard_normal((opts.samples, 1, 32, 32), dtype=np.float32)
                f["y"] = rng.standard_normal((opts.samples, 4), dtype=np.float32)
        path = d.comm.bcast(path, root=0)
        d.comm.Barrier()
        rows = [train(path, equal, opts, d) for equal in (True, False)]
    if d.is_root:
        print(f"inductor, P={d.world_size}, B={opts.batch_size}, N={opts.samples}, "
              f"{opts.epochs} epochs, drop_last")  # fmt: skip
        print("| mode | local batch sizes | graphs | first step s | steps that recompiled | "
              "their s | all steps after the first s |")  # fmt: skip
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['mode']} | {r['batch_sizes'][0]}-{r['batch_sizes'][-1]} | {r['graphs']} "
                  f"| {r['first_step_s']:.1f} | {r['recompiling_steps']} | "
                  f"{r['recompile_s']:.1f} | {r['after_first_s']:.1f} |")  # fmt: skip


if __name__ == "__main__":
    main()

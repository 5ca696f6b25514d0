"""Per-step overhead of the Loader: pure-hit steps of tiny (BraggNN-like) samples.

    python bench/step_bench.py [--samples 20000] [--batch 32]

The whole dataset fits the buffer, so epochs after the first are all hits and a step's time is
the runtime's own bookkeeping plus a 32-row gather. Prints µs per step for epochs 1-4.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

from solar import Loader
from solar.options import PlanningConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=32)
    opts = parser.parse_args()
    n = opts.samples
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tiny.h5"
        with h5py.File(path, "w") as f:
            f["x"] = np.random.default_rng(0).standard_normal((n, 11, 11), np.float32)
            f["y"] = np.zeros((n, 2), np.float32)
        ld = Loader(
            path, batch_size=opts.batch, epochs=5, buffer=n, planning=PlanningConfig(slack=0)
        )
        per_step = []
        for e in range(5):
            ld.set_epoch(e)
            t0 = time.perf_counter()
            for _ in ld:
                pass
            per_step.append((time.perf_counter() - t0) / len(ld))
        ld.close()
    later = [round(s * 1e6) for s in per_step[1:]]
    print(f"µs per pure-hit step (epochs 1-4): {later}, median {round(np.median(later))}")


if __name__ == "__main__":
    main()

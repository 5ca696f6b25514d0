"""Streamed planning in the Loader: time to the first batch, memory, stalls, replay to resume.

    python bench/stream_bench.py [--samples N] [--epochs E] [--json bench/results/stream.json]

One rank (rank 0 of P=8, B=64, aggregate buffer 20 %) of a run over N tiny samples, so that
planning, not I/O, is what is measured:
1. construction → first batch, and the process's peak RSS growth over it;
2. three epochs served with a simulated training step (``--compute-ms``), the next epoch being
   planned in the background: time the trainer waited for planning;
3. a Loader resumed near the end of the run (epoch E-1): the replay of the planner up to it
   (skipped with ``--no-replay``);
4. a Loader resumed at epoch 3 from the planner snapshots rank 0 saved while serving (2.): the
   time to its first batch, what a resume at any epoch costs when a snapshot of it is kept.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

from solar import Loader
from solar._atomic import write_json
from solar.options import PlanningConfig


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--world", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--compute-ms", type=float, default=1.0)
    parser.add_argument("--no-replay", action="store_true")
    parser.add_argument("--json", type=Path)
    opts = parser.parse_args()
    n, world = opts.samples, opts.world
    kw = {"batch_size": opts.batch, "epochs": opts.epochs, "buffer": n // 5 // world,
          "rank": 0, "world_size": world}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tiny.h5"
        with h5py.File(path, "w") as f:
            f["x"] = np.arange(2 * n, dtype=np.float32).reshape(n, 2)
        warm = Loader(path, **{**kw, "epochs": 2})  # compile the kernels outside the timings
        next(iter(warm))
        warm.close()
        rss0 = peak_rss()
        t0 = time.perf_counter()
        snaps = Path(tmp) / "snapshots"
        snaps.mkdir()
        ld = Loader(path, **kw, planning=PlanningConfig(snapshots=snaps))
        it = iter(ld)
        next(it)
        first_batch = time.perf_counter() - t0
        rss_growth = peak_rss() - rss0
        served = []
        for e in range(3):
            ld.set_epoch(e)
            t0 = time.perf_counter()
            for _ in ld:
                time.sleep(opts.compute_ms / 1000)
            served.append(time.perf_counter() - t0)
        waited = ld._stream.wait_seconds
        state = ld.state_dict()  # after epoch 2: resume at epoch 3
        ld.close()
        last, replay = opts.epochs - 1, None
        if not opts.no_replay:
            resumed = Loader(path, **kw)
            resumed.set_epoch(last)
            t0 = time.perf_counter()
            next(iter(resumed))
            replay = time.perf_counter() - t0
            resumed.close()
        t0 = time.perf_counter()
        resumed = Loader(path, **kw, planning=PlanningConfig(snapshots=snaps))
        resumed.load_state_dict(state)
        resumed.set_epoch(state["epoch"])
        next(iter(resumed))
        from_snapshot = time.perf_counter() - t0
        resumed.close()
    r = {
        "samples": n, "epochs": opts.epochs, "world_size": world, "batch": opts.batch,
        "accesses": n * opts.epochs, "first_batch_seconds": first_batch,
        "peak_rss_growth_bytes": rss_growth, "epoch_seconds": served,
        "compute_ms": opts.compute_ms, "planning_wait_seconds_3_epochs": waited,
        "replay_to_last_epoch_seconds": replay,
        "resume_from_snapshot_seconds": from_snapshot,
    }  # fmt: skip
    replayed = (
        "skipped" if opts.no_replay
        else f"{replay:.1f} s ({n * last / replay / 1e6:.1f} M accesses/s)"
    )  # fmt: skip
    print(
        f"N={n} P={world} B={opts.batch} E={opts.epochs}: first batch {first_batch:.2f} s after "
        f"construction began, peak RSS +{rss_growth / 2**20:.0f} MiB; 3 epochs with "
        f"{opts.compute_ms} ms steps: {', '.join(f'{s:.2f}' for s in served)} s, waited for "
        f"planning {waited:.2f} s in all (first epoch included); replay to epoch {last}: "
        f"{replayed}; resume at epoch {state['epoch']} from a snapshot: first batch "
        f"{from_snapshot:.2f} s after construction"
    )
    if opts.json:
        write_json(opts.json, r)


if __name__ == "__main__":
    main()

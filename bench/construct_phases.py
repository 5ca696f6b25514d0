"""Where a Loader's construction goes, phase by phase, under mpiexec: the slowest rank's
seconds in the listing and scan (``describe``; of which ``scan_hdf5``, the wait for the
slowest share and the table's checks), the plan agreement, the reader's warm-up (its kernels
loaded from numba's cache, sample 0 read) and the rehearsal (``solar/warm.py``).

    mpiexec -n 4 python bench/construct_phases.py DIR_OR_FILE [--one-per-file] [--reps 3]

The first repetition is what a job meets (a fresh process); later ones show the steady cost.
Compare a directory of one-sample files with the same data converted to one file
(``solar convert DIR FILE --one-per-file``).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch  # noqa: F401  (imported by the Loader: not a cost of construction)
from mpi4py import MPI

import solar.io.hdf5 as hdf5
import solar.io.scan as scan
import solar.io.sources as sources
import solar.loader as loader
import solar.runtime.setup as setup
from solar.config import ReaderConfig

SECONDS: dict[str, float] = {}


def timed(module: Any, name: str, label: str) -> None:
    """Wrap ``module.name`` so that its seconds add up under ``label``."""
    fn: Callable = getattr(module, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SECONDS[label] = SECONDS.get(label, 0.0) + time.perf_counter() - t0

    setattr(module, name, wrapper)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source")
    ap.add_argument("--one-per-file", action="store_true")
    ap.add_argument("--reps", type=int, default=3)
    opts = ap.parse_args()
    for module, name, label in [
        (sources, "describe_source", "describe"), (setup, "describe_source", "describe"),
        (hdf5, "shared_scan", "shared_scan"), (hdf5, "scan_hdf5", "scan_hdf5"),
        (scan, "_wait_quietly", "wait"), (hdf5, "check_part", "check"),
        (setup, "agree", "agree"), (setup.Reader, "warm_up", "reader_warm_up"),
        (loader, "_rehearse", "rehearse"),
    ]:  # fmt: skip
        timed(module, name, label)
    comm = MPI.COMM_WORLD
    for rep in range(opts.reps):
        SECONDS.clear()
        comm.Barrier()
        t0 = time.perf_counter()
        ld = loader.Loader(opts.source, batch_size=4, epochs=2, buffer=8, comm=comm,
                           reader=ReaderConfig(one_per_file=opts.one_per_file))  # fmt: skip
        SECONDS["total"] = time.perf_counter() - t0
        ld.close()
        every = comm.gather(dict(SECONDS), root=0)
        if comm.Get_rank() == 0:
            slowest = {k: round(max(d.get(k, 0.0) for d in every), 3) for k in SECONDS}
            print(f"rep {rep}: {slowest}", flush=True)


if __name__ == "__main__":
    main()

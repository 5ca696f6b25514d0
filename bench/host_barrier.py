"""The host barrier alone (solar/host/barrier.py) against MPI's, side by side in one run:

    flock /tmp/solar-bench.lock mpiexec -n 4 python bench/host_barrier.py \\
        [--barriers 4000 --rounds 3 --work-us 0,500 --spins 0,16,64,256 --out bench/results/X.json]

Every rank waits at ``--barriers`` barriers, with ``--work-us`` microseconds of numpy work
(jittered ±50 % per rank and barrier, as a step's reads and copies are) between two; the modes
alternate per round. Reported per mode and work: barriers per second (the slowest rank's
wall time) and CPU seconds per 1000 barriers summed over the ranks (spinning burns the cores
the ranks' readers need: 4 ranks share 2 cores here).
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import numpy as np
from mpi4py import MPI

from solar import dist
from solar.host.region import NodeRegion


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _work(us: float, rng: np.random.Generator, scratch: np.ndarray) -> None:
    if us <= 0:
        return
    end = time.perf_counter() + us * rng.uniform(0.5, 1.5) * 1e-6
    while time.perf_counter() < end:
        scratch += 1.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--barriers", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work-us", default="0,500")
    ap.add_argument("--spins", default="0,16,64,256")
    ap.add_argument("--out")
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    dist.install_abort_on_error(comm)
    rank, world = comm.Get_rank(), comm.Get_size()
    region = NodeRegion(4096, comm, 0, rank, local_size=world)
    modes = ["mpi"] + [f"shm-spins-{s}" for s in a.spins.split(",")]
    works = [float(w) for w in a.work_us.split(",")]
    scratch = np.zeros(256)
    results: dict = {f"{m} work {w:g} us": [] for w in works for m in modes}
    for rnd in range(a.rounds):
        for w in works:
            for m in modes if rnd % 2 == 0 else modes[::-1]:
                if m == "mpi":
                    wait = lambda k, p: comm.Barrier()  # noqa: E731
                else:
                    b = region.barrier(range(world))
                    b.spins = int(m.rsplit("-", 1)[1])
                    wait = b
                rng = np.random.default_rng(rank + 7 * rnd)
                comm.Barrier()
                t0, c0 = time.perf_counter(), _cpu()
                for i in range(a.barriers):
                    _work(w, rng, scratch)
                    wait(i // 2, i % 2)
                sec, cpu = time.perf_counter() - t0, _cpu() - c0
                slowest = comm.allreduce(sec, MPI.MAX)
                cpus = comm.allreduce(cpu)
                results[f"{m} work {w:g} us"].append({
                    "barriers_per_second": round(a.barriers / slowest),
                    "cpu_seconds_per_1000": round(1000 * cpus / a.barriers, 3),
                })  # fmt: skip
    if rank == 0:
        out = {
            "command": f"mpiexec -n {world} python bench/host_barrier.py --barriers {a.barriers} "
                       f"--rounds {a.rounds} --work-us {a.work_us} --spins {a.spins}",
            "world": world,
            "best": {k: max(v, key=lambda r: r["barriers_per_second"]) for k, v in results.items()},
            "results": results,
        }  # fmt: skip
        print(json.dumps(out, indent=1))
        if a.out:
            with open(a.out, "w") as f:
                f.write(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()

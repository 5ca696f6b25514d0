"""Every rank runs transform processes, reports what it started, then the last rank is killed
(SIGKILL): nothing it or the others started may outlive the job (issue 33).

python tests/mpi/orphans.py DATA.h5 OUT_DIR        (one process: it kills itself)
mpiexec -n 2 python tests/mpi/orphans.py DATA.h5 OUT_DIR

Each rank writes OUT_DIR/rank{r}.json: its pid, its workers' and resource tracker's pids, and
the /dev/shm names any of them holds mapped (deleted ones excluded, and MPICH's own segment,
which MPICH leaves behind when a rank is killed).
"""

import json
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path


def double(sample, rng):
    return {"img": sample["img"] * 2}


def shm_names(pid: int) -> set[str]:
    try:
        lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    except OSError:
        return set()
    return {line.split(None, 5)[5] for line in lines
            if "/dev/shm/" in line and not line.endswith("(deleted)")}  # fmt: skip


if __name__ == "__main__":
    # Imported here: a worker (spawned) runs this file's top for ``double``, without torch.
    from solar import Loader, Transform, dist
    from solar.options import ExpertConfig

    comm = dist.job_comm()  # mpiexec's world (MPICH's /dev/shm names taken off), else None
    rank, size = (comm.Get_rank(), comm.Get_size()) if comm else (0, 1)
    ld = Loader(sys.argv[1], batch_size=4, epochs=2, buffer=0, comm=comm,
                transform=Transform(double, processes=True, workers=1),
                expert=ExpertConfig(warm=False))  # fmt: skip
    batches = iter(ld)
    next(batches), next(batches)  # batch memory made and mapped by the workers
    from multiprocessing import resource_tracker

    workers = [p.pid for p in multiprocessing.active_children()]
    tracker = getattr(resource_tracker._resource_tracker, "_pid", None)
    held = set().union(*(shm_names(p) for p in [os.getpid(), *workers]))
    report = {"pid": os.getpid(), "workers": workers, "tracker": tracker, "shm": sorted(held)}
    (Path(sys.argv[2]) / f"rank{rank}.json").write_text(json.dumps(report))
    if comm is not None:
        comm.Barrier()
    if rank == size - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(600)  # the launcher ends this rank

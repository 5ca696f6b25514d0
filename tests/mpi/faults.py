"""Under mpiexec: whole epochs on every rank under seeded faults at the executor's calls
(tests/faults.py); each rank writes its outcome per seed as one JSON line to
WORK/outcomes-RANK.jsonl (not stdout, where the ranks' lines interleave).

mpiexec -n 3 python tests/mpi/faults.py WORK MODE SEED [SEED ...]

Rank 0 writes the data (WORK/orig) and, per seed, a fresh copy (WORK/run) the ranks share;
rank r injects with seed 1000·seed + r, and only rank 0 may change a file in place (every
rank reading it must then stop, or be served the bytes it read before the change).
"""

import json
import sys
from pathlib import Path

from solar import dist
from tests import faults

d = dist.init()
comm = d.comm
work, mode, seeds = Path(sys.argv[1]), sys.argv[2], [int(s) for s in sys.argv[3:]]
if d.rank == 0:
    originals = faults.make_data(work / "orig", mode)
comm.Barrier()
originals = sorted((work / "orig").glob("*.h5"))
for seed in seeds:
    if d.rank == 0:
        paths = faults.fresh_copy(originals, work / "run")
    comm.Barrier()
    paths = sorted((work / "run").glob("*.h5"))
    o = faults.run(seed, mode, paths, work / "run", rate=0.03, comm=comm, changes=d.rank == 0,
                   rank_seed=d.rank)  # fmt: skip
    with open(work / f"outcomes-{d.rank}.jsonl", "a") as f:
        f.write(json.dumps({"rank": d.rank, "seed": seed, "mode": mode,
                            "injected": dict(o.injected), "batches": o.batches,
                            "stopped": o.stopped, "leftovers": o.leftovers}) + "\n")  # fmt: skip
    comm.Barrier()

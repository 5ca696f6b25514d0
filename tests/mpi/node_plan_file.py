"""Under mpiexec -n 4 with SOLAR_HOSTS=2x2: ``Loader(plan=FILE, share="node")`` serves every
rank exactly its sampler's batches, each row h5py's bytes, and reads from storage exactly the
rows the node plan file gives each rank; then a file made for another grouping is refused by
every rank in one line (the job ends).

SOLAR_HOSTS=2x2 mpiexec -n 4 python tests/mpi/node_plan_file.py DATA.h5 PLAN_2x2.h5 PLAN_1x4.h5
"""

import sys
from pathlib import Path

import h5py
import numpy as np

from solar import Loader, dist
from solar.schedule.nodefile import load_node_plan

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: shared helpers
from helpers import skewed_weighted

path, good, other = sys.argv[1:4]
d = dist.init()
comm, rank = d.comm, d.rank
ref = h5py.File(path)["x"][()]
n = ref.shape[0]
sampler = skewed_weighted(n)
E = 3


def loader(plan):
    return Loader(path, ["x"], batch_size=12, epochs=E, buffer="10%", sampler=sampler, comm=comm,
                  share="node", warm=False, seed=5, equal_batches=False, plan=plan)  # fmt: skip


ld = loader(good)
for e in range(E):
    ld.set_epoch(e)
    for t, b in enumerate(ld):
        ids = b["index"].numpy()
        assert np.array_equal(ids, sampler.batch(ld.run, e, t, rank)), (e, t)
        assert b["x"].numpy().tobytes() == ref[ids].tobytes(), (e, t)
tot = ld.stats.totals()
ld.close()
# The rows this rank read from storage: the accesses the file names it the reader of.
plan = load_node_plan(good)
want = 0
for k in range(E):
    ne = plan.epoch(k)
    lo, hi = ne.ranks.rank_offsets[rank], ne.ranks.rank_offsets[rank + 1]
    want += int(np.count_nonzero(ne.reader[lo:hi] == rank))
assert tot.reads + tot.side_reads == want, (rank, tot.reads, tot.side_reads, want)
reads = comm.allreduce(want)
if rank == 0:
    print(f"node plan file: {reads} rows read as the file says", flush=True)
comm.Barrier()
loader(other)  # made for 1x4: refused on every rank, the job ends
print("unreachable", file=sys.stderr)

"""Under mpiexec -n 4 with SOLAR_HOSTS=2x2: ``Loader(plan=FILE, share="node")`` serves every
rank exactly its sampler's batches, each row h5py's bytes, and reads from storage exactly the
rows the node plan file gives each rank; a file of Shuffle with equal batches serves every rank
its nominal share, the batches the file's counts deliver (its host's surplus crossing hosts),
h5py's bytes; then a file made for another grouping is refused by every rank in one line (the
job ends).

SOLAR_HOSTS=2x2 mpiexec -n 4 python tests/mpi/node_plan_file.py DATA.h5 PLAN_2x2.h5 PLAN_1x4.h5 \
    EQUAL_2x2.h5
"""

import sys
from pathlib import Path

import h5py
import numpy as np

from solar import Loader, Shuffle, dist
from solar.schedule.draw.order import nominal_batches
from solar.schedule.keep.transfer import delivered
from solar.schedule.plans.plan import load_plan

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: shared helpers
from helpers import checked_ids, skewed_weighted

from solar.options import ExpertConfig, MemoryConfig, PlanningConfig

path, good, other, equal = sys.argv[1:5]
d = dist.init()
comm, rank = d.comm, d.rank
ref = h5py.File(path)["x"][()]
n = ref.shape[0]
sampler = skewed_weighted(n)
E = 3


def loader(plan):
    return Loader(path, ["x"], batch_size=12, epochs=E, buffer="10%", sampler=sampler, comm=comm,
                  seed=5, memory=MemoryConfig(share="node"), expert=ExpertConfig(warm=False),
                  planning=PlanningConfig(equal_batches=False, plan=plan))  # fmt: skip


ld = loader(good)
for e in range(E):
    ld.set_epoch(e)
    for t, b in enumerate(ld):
        checked_ids(b, ref, sampler.batch(ld.run, e, t, rank), (e, t))
tot = ld.stats.totals()
ld.close()
# The rows this rank read from storage: the accesses the file names it the reader of.
plan = load_plan(good)
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
# Equal batches (the file's choice): each step the batch the file's counts deliver to this rank.
eq = Loader(path, ["x"], batch_size=12, epochs=E, buffer="10%", sampler=Shuffle(), comm=comm,
            seed=5, memory=MemoryConfig(share="node"), expert=ExpertConfig(warm=False),
            planning=PlanningConfig(plan=equal))  # fmt: skip
assert eq.spec.equal_batches
plan = load_plan(equal)
for e in range(E):
    eq.set_epoch(e)
    ranks = plan.epoch(e).ranks
    parts = [ranks.rank(r) for r in range(comm.Get_size())]
    want = delivered([p.sample for p in parts], [p.step_offsets for p in parts])[rank]
    for t, b in enumerate(eq):
        ids = checked_ids(b, ref, want[t], (e, t))
        assert ids.size == nominal_batches(int(eq.global_batch), comm.Get_size())[rank]
    assert t == len(want) - 1
tot = eq.stats.totals()
eq.close()
moved = comm.allreduce(tot.sent)
assert moved == comm.allreduce(tot.received) == plan.file.stats.moved_rows > 0, moved
if rank == 0:
    print(f"node plan file, equal batches: every rank its share, {moved} rows moved", flush=True)
comm.Barrier()
loader(other)  # made for 1x4: refused on every rank, the job ends
print("unreachable", file=sys.stderr)

"""Under mpiexec -n 4: ``Loader(share="node", tier=..., snapshots=...)`` on one host of 4
ranks: the host's tier one file shared by its ranks; every rank's batches its sampler's, each
row h5py's bytes, the node plan's storage reads (the Loader's counters, summed over the ranks,
equal the plan's), tier hits among its hits. A state taken mid-epoch 2, loaded by new Loaders,
serves the same batches without replaying an epoch (the node planner restored from rank 0's
snapshot, the buffer and tier refilled); loaded by 2 ranks of twice the batch (each half of
the job a 2-rank job of its own, ``comm.Split``, warmed: elastic), the same global batches.
On two hosts of 2 with snapshots on every rank, host 0 follows rank 0's whole plan and host 1
plans in parts: the same batches, planned reads, an exact resume. Nothing is left in the tier
directory.

mpiexec -n 4 python tests/mpi/node_tier.py DATA.h5 TIERDIR SNAPSHOTS_DIR
"""

import os
import sys
from pathlib import Path

import h5py
import numpy as np

from solar import Loader, dist
from solar.schedule.keep.grouping import Hosts
from solar.schedule.keep.hostplan import HostPlanner
from solar.schedule.keep.planner import Planner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: shared helpers
from helpers import checked_ids, skewed_weighted

from solar.options import ExpertConfig, MemoryConfig, PlanningConfig

path, tier, snaps = sys.argv[1], sys.argv[2], sys.argv[3]
d = dist.init()
comm, rank = d.comm, d.rank
ref = h5py.File(path)["x"][()]
n = ref.shape[0]
sampler = skewed_weighted(n)
E, B = 3, 11


def loader(c, batch_size=B, snapshots=None, warm=False):
    return Loader(path, ["x"], batch_size=batch_size, epochs=E, buffer="3%", sampler=sampler,
                  comm=c, seed=5, memory=MemoryConfig(tier=tier, tier_size="6%", share="node"),
                  planning=PlanningConfig(equal_batches=False, snapshots=snapshots),
                  expert=ExpertConfig(warm=warm))  # fmt: skip


os.environ["SOLAR_HOSTS"] = "1x4"
ld = loader(comm, snapshots=snaps)
assert os.listdir(tier) == [], "the node tier's name outlived its opening"
spe = ld.run.steps_per_epoch
served, state = {}, None
for e in range(E):
    ld.set_epoch(e)
    for t, b in enumerate(ld):
        ids = checked_ids(b, ref, sampler.batch(ld.run, e, t, rank), (e, t))
        served[e * spe + t] = ids.copy()
        if (e, t) == (2, 1):
            state = ld.state_dict()
tot = ld.stats.totals()
reads, tier_hits = comm.allreduce(tot.reads + tot.side_reads), comm.allreduce(tot.tier_hits)
planner = HostPlanner(ld.spec, Hosts.grid(1, 4))
planned = sum(planner.next().storage_reads() for _ in range(E))
assert reads == planned and tier_hits > 0, (reads, planned, tier_hits)
ld.close()
comm.Barrier()  # rank 0's snapshots are written
assert state["hosts"] == [[0, 1, 2, 3]] and state["next_step"] == 2 * spe + 2, state

# Exact resume: the node planner restored from the snapshot at epoch 2, no epoch replayed.
skip = Planner.skip
Planner.skip = lambda self: (_ for _ in ()).throw(AssertionError("replayed an epoch"))
again = loader(comm, snapshots=snaps)
again.load_state_dict(state)
k = state["next_step"]
for b in again:
    checked_ids(b, ref, served[k], k)
    k += 1
assert k == E * spe, k
assert comm.allreduce(again.stats.totals().tier_hits) > 0
again.close()
Planner.skip = skip

# Elastic: 4 ranks of B -> 2 ranks of 2B (ranks 0-1 and 2-3 each a job of their own).
everyone = {k: np.sort(np.concatenate(comm.allgather(v))) for k, v in served.items()}
half = comm.Split(rank // 2, rank)
os.environ["SOLAR_HOSTS"] = "1x2"
# Warmed: its rehearsal (a tiny Loader placed as rank 1 of 2 on ranks 1 and 3) runs on the
# real Loader's sub-communicator, not checked against MPI's world of 4.
el = loader(half, batch_size=2 * B, warm=True)
el.load_state_dict(state)
k = state["next_step"]
for b in el:
    ids = checked_ids(b, ref, tag=k)
    assert np.array_equal(np.sort(np.concatenate(half.allgather(ids))), everyone[k]), k
    k += 1
assert k == E * spe, k
el.close()

# Two hosts of 2, snapshots on every rank: host 0's ranks take rank 0's whole plan (it saves
# every host's), host 1's each plan a part of their buffer (solar/schedule/keep/hostparts.py) and
# replan on a resume: the same batches, the planned reads.
os.environ["SOLAR_HOSTS"] = "2x2"
snaps2 = os.path.join(snaps, "2x2")
if rank == 0:
    os.makedirs(snaps2, exist_ok=True)
comm.Barrier()
two = loader(comm, snapshots=snaps2)
assert two._stream.parted == (rank >= 2), "host 0 follows rank 0's snapshots; host 1 plans parts"
got, state = {}, None
for e in range(E):
    two.set_epoch(e)
    for t, b in enumerate(two):
        got[e * spe + t] = checked_ids(b, ref, sampler.batch(two.run, e, t, rank), (e, t)).copy()
        if (e, t) == (2, 1):
            state = two.state_dict()
reads2 = comm.allreduce(two.stats.totals().reads + two.stats.totals().side_reads)
planner = HostPlanner(two.spec, Hosts.grid(2, 2))
assert reads2 == sum(planner.next().storage_reads() for _ in range(E)), reads2
two.close()
comm.Barrier()
again = loader(comm, snapshots=snaps2)
again.load_state_dict(state)
k = state["next_step"]
for b in again:
    assert np.array_equal(checked_ids(b, ref, tag=k), got[k]), k
    k += 1
assert k == E * spe, k
again.close()
comm.Barrier()
assert os.listdir(tier) == []
if rank == 0:
    print(f"node tier: {reads} rows read as planned, {tier_hits} tier hits; resumed exactly "
          f"from step {state['next_step']} (snapshot) and on 2 ranks", flush=True)  # fmt: skip

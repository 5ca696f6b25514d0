"""Under mpiexec: ``Loader(share="node", tier=...)``: the host's tier one file shared by its
ranks; every rank's batches its sampler's, each row h5py's bytes, the node plan's storage
reads (the Loader's counters, summed over the ranks, equal the plan's) with tier hits among
its hits; an exact resume inside epoch 1 (the tier refilled) serves the same batches; nothing
is left in the tier directory.

mpiexec -n 4 python tests/mpi/node_tier.py DATA.h5 TIERDIR run 1x4   (groupings in turn)
mpiexec -n 4 python tests/mpi/node_tier.py DATA.h5 TIERDIR kill 1x4  (rank 1 killed: -9)
"""

import os
import signal
import sys

import h5py
import numpy as np

from solar import Loader, Shuffle, Weighted, dist
from solar.schedule.nodeplan import Hosts, NodePlanner

path, tier, mode, groupings = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
d = dist.init()
comm, rank = d.comm, d.rank
ref = h5py.File(path)["x"][()]
n = ref.shape[0]
weights = (1.0 + np.arange(n)) ** -0.8
sampler = Weighted(weights[np.random.default_rng(1).permutation(n)], affinity=False)
E = 3


def loader(s=sampler):
    return Loader(path, ["x"], batch_size=11, epochs=E, buffer="3%", tier=tier,
                  tier_size="6%", sampler=s, comm=comm, share="node", warm=False, seed=5,
                  equal_batches=False)  # fmt: skip


def planned_reads(ld):
    """Rows the node plan reads from storage over the run, every host's."""
    p = NodePlanner(ld.spec, Hosts.of_names(dist.host_names(comm)))
    return sum(p.next().storage_reads() for _ in range(E))


for grouping in groupings:
    os.environ["SOLAR_HOSTS"] = grouping
    ld = loader()
    assert os.listdir(tier) == [], "the node tier's name outlived its opening"
    if mode == "kill":
        it = iter(ld)
        next(it)
        comm.Barrier()
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        for _ in it:  # the host's barriers would wait forever for rank 1
            pass
        print("unreachable", file=sys.stderr)
        comm.Barrier()
        sys.exit(0)
    spe = ld.run.steps_per_epoch
    served, state = {}, None
    for e in range(E):
        ld.set_epoch(e)
        for t, b in enumerate(ld):
            ids = b["index"].numpy()
            assert np.array_equal(ids, sampler.batch(ld.run, e, t, rank)), (grouping, e, t)
            assert b["x"].numpy().tobytes() == ref[ids].tobytes(), (grouping, e, t)
            served[e * spe + t] = ids
            if (e, t) == (1, 2):
                state = ld.state_dict()
    tot = ld.stats.totals()
    reads = comm.allreduce(tot.reads + tot.side_reads)
    tier_hits = comm.allreduce(tot.tier_hits)
    want = planned_reads(ld)
    assert reads == want, (grouping, reads, want)
    assert tier_hits > 0, grouping
    ld.close()
    # Exact resume inside epoch 1: a new Loader (new shared buffer and tier), refilled.
    again = loader()
    again.load_state_dict(state)
    k = state["next_step"]
    for e in range(1, E):
        again.set_epoch(e) if e > 1 else None
        for b in again:
            ids = b["index"].numpy()
            assert np.array_equal(ids, served[k]) and b["x"].numpy().tobytes() == ref[ids].tobytes()
            k += 1
    assert k == E * spe, (grouping, k)
    again.close()
    # Shuffle: node-level affinity, each sample once per epoch, tier hits.
    sh = loader(Shuffle())
    for e in range(E):
        sh.set_epoch(e)
        mine = []
        for b in sh:
            ids = b["index"].numpy()
            assert b["x"].numpy().tobytes() == ref[ids].tobytes(), (grouping, e)
            mine.append(ids)
        every = np.concatenate(comm.allgather(np.concatenate(mine)))
        assert np.array_equal(np.sort(every), np.arange(n)), (grouping, e)
    tot = sh.stats.totals()
    sreads = comm.allreduce(tot.reads + tot.side_reads)
    stier = comm.allreduce(tot.tier_hits)
    assert sreads == planned_reads(sh) and stier > 0, (grouping, sreads, stier)
    sh.close()
    comm.Barrier()
    assert os.listdir(tier) == []
    if rank == 0:
        print(f"node tier {grouping}: {reads} rows read as planned, {tier_hits} tier hits; "
              f"shuffle {sreads}, {stier}", flush=True)  # fmt: skip
    comm.Barrier()

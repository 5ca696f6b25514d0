"""Under mpiexec: ``Loader(share="node")`` serves every rank exactly its sampler's batches, each
row h5py's bytes, with the node plan's storage reads (the Loader's counters, summed over the
ranks, equal the plan's); an exact resume inside epoch 1 serves the same batches; a GNN
``NeighborSampler`` too; and Shuffle (node-level affinity, equal_batches=False) serves every
sample once per epoch.

mpiexec -n 4 python tests/mpi/node_loader.py DATA.h5 GRAPH.h5 run 1x4 2x2   (groupings in turn)
mpiexec -n 4 python tests/mpi/node_loader.py DATA.h5 GRAPH.h5 kill 2x2      (rank 1 killed: -9)
mpiexec -n 4 python tests/mpi/node_loader.py DATA.h5 GRAPH.h5 break 1x4     (rank 1 breaks early)

Each rank prints ``pid PID`` first: the test looks for /dev/shm names these processes made.
"""

import os
import signal
import sys

import h5py
import numpy as np

from solar import Loader, NeighborSampler, Shuffle, Weighted, dist
from solar.schedule.nodeplan import Hosts, NodePlanner

path, graph, mode, groupings = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
d = dist.init()
comm, rank = d.comm, d.rank
print(f"pid {os.getpid()}", flush=True)
ref = h5py.File(path)["x"][()]
n = ref.shape[0]
weights = (1.0 + np.arange(n)) ** -0.8
sampler = Weighted(weights[np.random.default_rng(1).permutation(n)], affinity=False)
E = 3


def loader(s=sampler, p=path, keys=("x",), batch_size=12, buffer="10%", **kw):
    return Loader(p, list(keys), batch_size=batch_size, epochs=E, buffer=buffer, sampler=s,
                  comm=comm, share="node", warm=False, seed=5, equal_batches=False,
                  **kw)  # fmt: skip


def twice(sample, rng):
    return {"x": sample["x"] * 2}


def planned_reads(ld):
    """Rows the node plan reads from storage over the run, every host's (page mates too)."""
    hosts = Hosts.of_names(dist.host_names(comm))
    p = NodePlanner(ld.spec, hosts)
    return sum(p.next().storage_reads() for _ in range(E))


for grouping in groupings:
    os.environ["SOLAR_HOSTS"] = grouping
    ld = loader()
    if mode == "kill":
        it = iter(ld)
        next(it)
        comm.Barrier()
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        for _ in it:  # rank 0's host barriers would wait forever for rank 1 (host 1's may end)
            pass
        if rank == 0:
            print("unreachable", file=sys.stderr)
        comm.Barrier()  # would wait forever for rank 1
        sys.exit(0)
    if mode == "break":  # rank 1 leaves epoch 0 early: its host's barriers fail, in one line
        for e in range(E):
            ld.set_epoch(e)
            for t, _ in enumerate(ld):
                if (rank, e, t) == (1, 0, 2):
                    break
        print("unreachable", file=sys.stderr)
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
    want = planned_reads(ld)
    assert reads == want, (grouping, reads, want)
    ld.close()
    # Exact resume inside epoch 1: a new Loader (a new shared buffer), refilled to the step;
    # with a transform (raw rows held, transformed on worker threads).
    again = loader(transform=twice)
    again.load_state_dict(state)
    k = state["next_step"]
    for e in range(1, E):
        again.set_epoch(e) if e > 1 else None
        for b in again:
            ids = b["index"].numpy()
            got = b["x"].numpy().tobytes()
            assert np.array_equal(ids, served[k]) and got == (ref[ids] * 2).tobytes()
            k += 1
    assert k == E * spe, (grouping, k)
    again.close()
    # A GNN's neighbour sampler: its subgraphs' feature rows.
    feats = h5py.File(graph)["features"][()]
    g = loader(NeighborSampler(graph, (4, 2), batch_size=13), graph, ("features",), None, 100)
    for e in range(E):
        g.set_epoch(e)
        for b in g:
            assert b["x"].numpy().tobytes() == feats[b["n_id"].numpy()].tobytes(), (grouping, e)
    tot = g.stats.totals()
    greads = comm.allreduce(tot.reads + tot.side_reads)
    gwant = planned_reads(g)
    assert greads == gwant, (grouping, greads, gwant)
    g.close()
    # Shuffle: the host's share of each global batch dealt over its ranks, each sample once.
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
    assert sreads == planned_reads(sh), (grouping, sreads)
    sh.close()
    if rank == 0:
        print(f"node loader {grouping}: {reads} rows read as planned; graph {greads}; "
              f"shuffle {sreads}", flush=True)  # fmt: skip
    comm.Barrier()

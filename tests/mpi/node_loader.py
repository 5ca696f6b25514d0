"""Under mpiexec: ``Loader(share="node")`` serves every rank exactly its sampler's batches, each
row h5py's bytes, with the node plan's storage reads (the Loader's counters, summed over the
ranks, equal the plan's); an exact resume inside epoch 1 serves the same batches; a GNN
``NeighborSampler`` too; Shuffle (node-level affinity, equal_batches=False) serves every
sample once per epoch (each rank's GNN batches sampled once over the run: the planner's draws
are what it serves); and Shuffle with equal batches serves every rank its nominal share, only
the hosts' surplus moving over MPI (none on one host).

mpiexec -n 4 python tests/mpi/node_loader.py DATA.h5 GRAPH.h5 run 1x4 2x2 3,1 (groupings in
turn; 3,1: hosts of 3 ranks and 1, where Shuffle is refused)
torchrun --nproc_per_node 4 tests/mpi/node_loader.py DATA.h5 GRAPH.h5 serve 3,1  (whole epochs
                                    of the skewed sampler only; each host a gloo group)
mpiexec -n 4 python tests/mpi/node_loader.py DATA.h5 GRAPH.h5 kill 2x2      (rank 1 killed: -9,
                                                                          with a node tier)
mpiexec -n 2 python tests/mpi/node_loader.py DATA.h5 GRAPH.h5 break 1x2     (rank 1 breaks early)
mpiexec -n 2 python tests/mpi/node_loader.py DATA.h5 GRAPH.h5 raise 1x2     (rank 1 raises inside
                                    `with Loader`: its close is not a collective)
mpiexec -n 2 python tests/mpi/node_loader.py DATA.h5 GRAPH.h5 mismatch 1x2  (rank 1 serves
                                    epoch 2, its host's ranks epoch 0; torchrun too)
mpiexec -n 3 python tests/mpi/node_loader.py DATA.h5 GRAPH.h5 disagree 2,1  (snapshots on
                                    rank 0 alone; then rank 1 asks share="rank", the others "node")

Modes follow one another in one job, each with its groupings (``run 1x4 2x2 3,1 kill 2x2``:
starting the ranks costs more than a case); before a mode that ends the job, each rank says
``rank R: runs done`` when every rank has passed the checks of the modes before it.

Each rank prints ``pid PID`` first: the test checks these processes are gone and left no
/dev/shm name.
"""

import os
import signal
import sys
from collections import Counter
from pathlib import Path

import h5py
import numpy as np

from solar import Loader, NeighborSampler, Shuffle, dist, host
from solar.errors import SolarError
from solar.graph import neighbor
from solar.schedule.draw.order import nominal_batches
from solar.schedule.draw.rng import stream_key
from solar.schedule.keep.grouping import Hosts
from solar.schedule.keep.hostplan import HostPlanner
from solar.schedule.keep.transfer import moved_rows

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: shared helpers
from helpers import checked_ids, skewed_weighted

from solar.options import ExpertConfig, MemoryConfig, PlanningConfig

MODES = ("run", "serve", "kill", "break", "raise", "mismatch", "disagree")
path, graph = sys.argv[1], sys.argv[2]
cases, mode = [], ""  # (mode, grouping): a mode's word, then its groupings
for word in sys.argv[3:]:
    if word in MODES:
        mode = word
    else:
        cases.append((mode, word))
d = dist.init()
comm, rank = d.comm, d.rank
print(f"pid {os.getpid()}", flush=True)
ref = h5py.File(path)["x"][()]
n = ref.shape[0]
sampler = skewed_weighted(n)
E = 3


def loader(s=sampler, p=path, keys=("x",), batch_size=12, buffer="10%", equal_batches=False,
           share="node", tier=None, tier_size=0, snapshots=None, **kw):  # fmt: skip
    return Loader(p, list(keys), batch_size=batch_size, epochs=E, buffer=buffer, sampler=s,
                  comm=comm, seed=5, **kw,
                  memory=MemoryConfig(share=share, tier=tier, tier_size=tier_size),
                  planning=PlanningConfig(equal_batches=equal_batches, snapshots=snapshots),
                  expert=ExpertConfig(warm=False))  # fmt: skip


def twice(sample, rng):
    return {"x": sample["x"] * 2}


class Counted:
    """The neighbour sampling kernel, counting its calls by (stream key, seeds)."""

    def __init__(self, kernel):
        self.kernel, self.calls = kernel, Counter()

    def __call__(self, indptr, indices, seeds, fanouts, key):
        self.calls[int(key), np.asarray(seeds).tobytes()] += 1
        return self.kernel(indptr, indices, seeds, fanouts, key)

    def __getattr__(self, name):
        return getattr(self.kernel, name)


counted = neighbor._sample = Counted(neighbor._sample)


def planned_reads(ld):
    """Rows the node plan reads from storage over the run, every host's (page mates too)."""
    hosts = Hosts(host.place(comm).groups)
    if not hosts.uniform:  # hosts of different sizes: each planned alone
        planners = [HostPlanner(ld.spec, hosts, only_host=h) for h in range(hosts.count)]
        return sum(p.next().storage_reads() for p in planners for _ in range(E))
    p = HostPlanner(ld.spec, hosts)
    return sum(p.next().storage_reads() for _ in range(E))


def cross_host_surplus(ld):
    """Rows the node plan's hosts serve over their ranks' shares, over the run: what moves."""
    hosts = Hosts(host.place(comm).groups)
    if hosts.count == 1:
        return 0
    p = HostPlanner(ld.spec, hosts)
    return sum(int(moved_rows(np.diff(p.next().ranks.step_offsets, axis=1).T)[0].sum())
               for _ in range(E))  # fmt: skip


for i, (mode, grouping) in enumerate(cases):
    os.environ["SOLAR_HOSTS"] = grouping
    if i and mode not in ("run", "serve"):  # (each case before ended in a barrier after its
        print(f"rank {rank}: runs done", flush=True)  # checks: every rank passed them)
    if mode == "kill":  # with the node's tier (a file in DATA's directory's killtier/)
        tier = os.path.join(os.path.dirname(path), "killtier")
        if rank == 0:
            os.makedirs(tier, exist_ok=True)
        comm.Barrier()
        ld = loader(tier=tier, tier_size="5%")
    elif mode == "disagree":
        # Snapshots given to rank 0 alone (it saves them) on hosts of different sizes, where
        # the node buffer takes none: every rank falls back to a buffer of its own, alike.
        snaps = os.path.join(os.path.dirname(path), "snaps") if rank == 0 else None
        if snaps is not None:
            os.makedirs(snaps, exist_ok=True)
        ld = loader(share="auto", snapshots=snaps)
        assert comm.allgather(ld.share) == ["rank"] * comm.Get_size(), grouping
        ld.close()
        # Different shares asked: refused in one line on every rank, before any host
        # collective.
        loader(share="rank" if rank == 1 else "node")
        print("unreachable", file=sys.stderr)
        sys.exit(0)
    else:
        ld = loader()
    if mode == "serve":  # whole epochs only: each rank's batches, h5py's bytes, planned reads
        for e in range(E):
            ld.set_epoch(e)
            for t, b in enumerate(ld):
                checked_ids(b, ref, sampler.batch(ld.run, e, t, rank), (grouping, e, t))
        tot = ld.stats.totals()
        reads, want = comm.allreduce(tot.reads + tot.side_reads), planned_reads(ld)
        assert reads == want, (grouping, reads, want)
        ld.close()
        if rank == 0:
            print(f"node loader {grouping}: {reads} rows read as planned", flush=True)
        comm.Barrier()
        continue
    if mode == "mismatch":  # rank 1 takes another epoch than its host's: named at once
        ld.set_epoch(E - 1 if rank == 1 else 0)
        for _ in ld:
            pass
        if rank in Hosts(host.place(comm).groups).groups[0]:  # (host 0 holds rank 1)
            print("unreachable", file=sys.stderr)
        sys.exit(0)
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
    if mode == "raise":  # rank 1 raises in its training loop, the others wait in a collective
        with ld:
            for t, _ in enumerate(ld):
                if (rank, t) == (1, 2):
                    raise SolarError("boom from rank 1's training step")
                comm.Barrier()  # a training step: waits for every rank (forever, for rank 1)
        print("unreachable", file=sys.stderr)
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
            ids = checked_ids(b, ref, sampler.batch(ld.run, e, t, rank), (grouping, e, t))
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
    counted.calls.clear()
    ns = NeighborSampler(graph, (4, 2), batch_size=13)
    g = loader(ns, graph, ("features",), None, 100)
    for e in range(E):
        g.set_epoch(e)
        for b in g:
            assert b["x"].numpy().tobytes() == feats[b["n_id"].numpy()].tobytes(), (grouping, e)
    once = Counter({(int(stream_key(5, neighbor._NEIGHBOR_STREAM, e, t)),
                     ns.seeds(g.run, e, t, rank).tobytes()): 1
                    for e in range(E) for t in range(g.run.steps_per_epoch)})  # fmt: skip
    assert counted.calls == once, (grouping, rank, sorted(counted.calls.values()), len(once))
    tot = g.stats.totals()
    greads = comm.allreduce(tot.reads + tot.side_reads)
    gwant = planned_reads(g)
    assert greads == gwant, (grouping, greads, gwant)
    g.close()
    if "," in grouping:  # hosts of different sizes: a sampler with affinity is refused
        if rank == 0:  # (test_nodeplan.py: in one line, at construction)
            print(f"node loader {grouping}: {reads} rows read as planned; graph {greads}")
        comm.Barrier()
        continue
    # Shuffle: the host's share of each global batch dealt over its ranks, each sample once.
    sh = loader(Shuffle())
    for e in range(E):
        sh.set_epoch(e)
        mine = []
        for b in sh:
            ids = checked_ids(b, ref, tag=(grouping, e))
            mine.append(ids)
        every = np.concatenate(comm.allgather(np.concatenate(mine)))
        assert np.array_equal(np.sort(every), np.arange(n)), (grouping, e)
    tot = sh.stats.totals()
    sreads = comm.allreduce(tot.reads + tot.side_reads)
    assert sreads == planned_reads(sh), (grouping, sreads)
    sh.close()
    # Shuffle with equal batches (997 rows: a short last batch of 997 mod 4B rows): every
    # local batch its nominal share, h5py's bytes, each sample once an epoch; rows cross hosts
    # only, as many as the plan's host surplus (none on one host).
    eq = loader(Shuffle(), graph, ("features",), 9, "10%", equal_batches=True)
    assert eq.share == "node" and eq.spec.equal_batches
    for e in range(E):
        eq.set_epoch(e)
        mine = []
        for t, b in enumerate(eq):
            ids = b["index"].numpy()
            share = nominal_batches(int(eq.global_batch), comm.Get_size())[rank]
            assert ids.size == share and (share == 9 or t == eq.run.steps_per_epoch - 1)
            assert b["features"].numpy().tobytes() == feats[ids].tobytes(), (grouping, e, t)
            mine.append(ids)
        every = np.concatenate(comm.allgather(np.concatenate(mine)))
        assert np.array_equal(np.sort(every), np.arange(feats.shape[0])), (grouping, e)
    tot = eq.stats.totals()
    moved = comm.allreduce(tot.sent)
    assert moved == comm.allreduce(tot.received) == cross_host_surplus(eq), (grouping, moved)
    assert comm.allreduce(tot.reads) == planned_reads(eq)
    eq.close()
    if rank == 0:
        print(f"node loader {grouping}: {reads} rows read as planned; graph {greads}; "
              f"shuffle {sreads}; equal batches: {moved} rows moved", flush=True)  # fmt: skip
    comm.Barrier()

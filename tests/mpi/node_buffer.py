"""Under mpiexec: the node buffer (solar/runtime/nodeholdings.py) executing a node plan, every
rank's rows h5py's bytes, every access served, the host's storage reads the plan's; an exact
resume (a new region refilled to a step inside epoch 1) serves the same bytes.

mpiexec -n 4 python tests/mpi/node_buffer.py DATA.h5 run 1x4 2x2   (groupings in turn)
mpiexec -n 4 python tests/mpi/node_buffer.py DATA.h5 kill 2x2      (rank 1 killed: -9)
"""

import os
import signal
import sys

import h5py
import numpy as np

from solar import BufferConfig, PlanSpec, RunConfig, Weighted, dist
from solar.cache.shared import NodeRegion
from solar.io.reader import Reader
from solar.io.sources import describe_source
from solar.runtime.nodeholdings import (
    NodeHoldings,
    host_refill_at,
    node_steps,
    stage_rows_needed,
)
from solar.schedule.nodeplan import Hosts, NodePlanner, node_spec

path, mode, groupings = sys.argv[1], sys.argv[2], sys.argv[3:]
comm = dist.job_comm()  # MPI.COMM_WORLD (MPICH's /dev/shm names taken off)
dist.install_abort_on_error(comm)  # a failed check ends the job, not a hang in a barrier
rank, world = comm.Get_rank(), comm.Get_size()
info = describe_source([path], ["x"])
reader = Reader(info)
ref = h5py.File(path)["x"][()]
n = ref.shape[0]
run = RunConfig(n, world, 12, 3, seed=5)
weights = (1.0 + np.arange(n)) ** -0.8
sampler = Weighted(weights[np.random.default_rng(1).permutation(n)], affinity=False)
spec = PlanSpec(run, BufferConfig(n // 10 // world), sampler=sampler)
keys = [(k.sample_shape, k.native_dtype) for k in info.keys]
for grouping in groupings:
    os.environ["SOLAR_HOSTS"] = grouping
    names = dist.host_names(comm)
    hosts = Hosts.of_names(names)
    hc = dist.host_comm(comm, names)
    planner = NodePlanner(spec, hosts)
    epochs = [planner.next() for _ in range(run.epochs)]
    stage = stage_rows_needed(epochs, hosts)
    slots = node_spec(spec, hosts).slots
    parts = NodeHoldings.region_parts(slots, stage, keys)
    key = dist.shared_key(comm)
    region = NodeRegion(NodeRegion.size_of(parts), hc, key, hosts.host_of(rank), hc.Get_rank())
    assert not os.path.exists(region.path), "the region's name outlived its mapping"
    if mode == "kill":
        comm.Barrier()
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        comm.Barrier()  # would wait forever for rank 1
        print("unreachable", file=sys.stderr)
        sys.exit(0)
    holdings = NodeHoldings(region, slots, stage, keys, hc.Barrier)
    reads = peers = 0
    for ne in epochs:
        for t, st in enumerate(node_steps(ne, rank)):
            batch = [np.full((st.rows_needed, *s), -1, d) for s, d in keys]
            holdings.serve(st, batch, reader.read)
            got = batch[0][: st.samples.size]
            assert got.tobytes() == ref[st.samples].tobytes(), (grouping, ne.epoch, t)
            want = np.unique(sampler.batch(run, ne.epoch, t, rank))
            assert np.array_equal(np.sort(st.samples), want), (grouping, ne.epoch, t)
            reads += st.read_rows.size
            peers += st.peer_rows.size
    # Exact resume: a new region, refilled to a step inside epoch 1, serves the same bytes.
    k0 = run.steps_per_epoch + 2
    fresh = NodeRegion(NodeRegion.size_of(parts), hc, dist.shared_key(comm), hosts.host_of(rank),
                       hc.Get_rank())  # fmt: skip
    again = NodeHoldings(fresh, slots, stage, keys, hc.Barrier)
    cells, held = host_refill_at(epochs, hosts.host_of(rank), k0, slots)
    again.refill(cells, held, hc.Get_rank(), hosts.local, reader.read)
    every = [st for ne in epochs for st in node_steps(ne, rank)]
    for k in range(k0, len(every)):
        st = every[k]
        batch = [np.full((st.rows_needed, *s), -1, d) for s, d in keys]
        again.serve(st, batch, reader.read)
        assert batch[0][: st.samples.size].tobytes() == ref[st.samples].tobytes(), (grouping, k)
    planned = sum(ne.storage_reads() for ne in epochs)
    total = comm.allreduce(reads)
    assert total == planned, (grouping, total, planned)
    shared_rows = comm.allreduce(peers)
    if rank == 0:
        print(
            f"node buffer {grouping}: {total} rows read as planned, {shared_rows} shared, "
            f"{holdings.barriers} barriers {holdings.barrier_seconds:.3f} s"
        )
    comm.Barrier()

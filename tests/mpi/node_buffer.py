"""Under mpiexec: the node buffer (solar/runtime/holdings.py) executing a node plan through
the Loader's own step (``RankStream``'s steps of a host's share run by a ``Host``'s
``Holdings``), without the
rest of the pipeline: every rank's rows h5py's bytes, every access served, the host's storage reads
the plan's; an exact resume (a new region refilled to a step inside epoch 1) serves the same
bytes.

mpiexec -n 4 python tests/mpi/node_buffer.py DATA.h5 run 1x4 2x2   (groupings in turn)
mpiexec -n 4 python tests/mpi/node_buffer.py DATA.h5 kill 2x2      (rank 1 killed: -9)
mpiexec -n 4 python tests/mpi/node_buffer.py DATA.h5 run 1x4 2x2 kill 2x2   (one job: the runs,
                                    every rank saying "rank R: runs done", then the kill)

Each rank prints ``pid PID`` first: the test checks these processes are gone and left no
/dev/shm name.
"""

import os
import signal
import sys
from pathlib import Path

import h5py
import numpy as np

from solar import BufferConfig, PlanSpec, RunConfig, dist, host
from solar.cache.slots import SlotBuffer
from solar.host.region import NodeRegion
from solar.io.reader import Reader
from solar.io.sources import describe_source
from solar.runtime.holdings import Holdings, Host, RawRefill
from solar.runtime.steps import Steps
from solar.schedule.keep.grouping import Hosts, stage_bound
from solar.schedule.keep.hostplan import HostPlanner
from solar.schedule.plans.stream import RankStream

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: shared helpers
from helpers import skewed_weighted

path = sys.argv[1]
cases, mode = [], ""  # (mode, grouping): a mode's word, then its groupings
for word in sys.argv[2:]:
    if word in ("run", "kill"):
        mode = word
    else:
        cases.append((mode, word))
comm = dist.job_comm()  # MPI.COMM_WORLD (MPICH's /dev/shm names taken off)
dist.install_abort_on_error(comm)  # a failed check ends the job, not a hang in a barrier
rank, world = comm.Get_rank(), comm.Get_size()
print(f"pid {os.getpid()}", flush=True)
print(f"pid {os.getpid()}", flush=True)
info = describe_source([path], ["x"])
reader = Reader(info)
ref = h5py.File(path)["x"][()]
n = ref.shape[0]
run = RunConfig(n, world, 12, 3, seed=5)
sampler = skewed_weighted(n)
spec = PlanSpec(run, BufferConfig(n // 10 // world), sampler=sampler)
keys = [(k.sample_shape, k.native_dtype) for k in info.keys]


def holdings(hosts: Hosts, hc) -> tuple[Holdings, Steps]:
    """This rank's node holdings over a new region, and the steps they run."""
    stream = RankStream(spec, rank, hosts=hosts, stage_rows=stage_bound(spec, hosts))
    steps = Steps(spec, rank, stream)
    parts = Host.region_parts(stream.slots, stream.stage_rows, keys)
    region = NodeRegion(NodeRegion.size_of(parts), hc, stream.host, stream.local,
                        local_size=len(stream.group))  # fmt: skip
    host = Host(region, stream.slots, stream.stage_rows, keys,
                region.barrier(stream.group, stream.spe))  # fmt: skip
    buffer = SlotBuffer.over(host.slots, info.keys)
    refill = RawRefill(reader, buffer, None, info.keys, run.batch_size, host, stream.local,
                       hosts.local)  # fmt: skip
    return Holdings(buffer, None, steps, refill, host), steps


def serve(hold: Holdings, steps: Steps, k: int) -> tuple[np.ndarray, int, int]:
    """Step ``k`` as the Loader's pipeline runs it: reads, hits, settle (host barriers)."""
    steps.enter(k)
    st = steps.plan(k)
    batch = [np.full((st.rows_needed, *s), -1, d) for s, d in keys]
    samples, rows = st.storage_reads()
    if samples.size:
        reader.read(samples, batch, rows)
    hold.gather(st, batch)
    hold.settle(k, st, batch)
    assert batch[0][: st.size].tobytes() == ref[st.samples].tobytes(), k
    return st.samples, samples.size, st.peer_rows.size


for i, (mode, grouping) in enumerate(cases):
    os.environ["SOLAR_HOSTS"] = grouping
    where = host.place(comm)
    hosts, hc = Hosts(where.groups), host.host_comm(comm)
    hold, steps = holdings(hosts, hc)
    if mode == "kill":
        if i:  # the runs before it: every rank passed their last barrier, each checked
            print(f"rank {rank}: runs done", flush=True)
        comm.Barrier()
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        comm.Barrier()  # would wait forever for rank 1
        print("unreachable", file=sys.stderr)
        sys.exit(0)
    reads = peers = 0
    for k in range(run.num_steps):
        ids, r, p = serve(hold, steps, k)
        e, t = divmod(k, run.steps_per_epoch)
        assert np.array_equal(ids, sampler.batch(run, e, t, rank)), (grouping, k)
        reads, peers = reads + r, peers + p
    # Exact resume: a new region, refilled to a step inside epoch 1, serves the same bytes.
    k0 = run.steps_per_epoch + 2
    again, steps2 = holdings(hosts, hc)
    again.refill(k0)
    for k in range(k0, run.num_steps):
        serve(again, steps2, k)
    planner = HostPlanner(spec, hosts)
    planned = sum(planner.next().storage_reads() for _ in range(run.epochs))
    total = comm.allreduce(reads)
    assert total == planned, (grouping, total, planned)
    shared_rows = comm.allreduce(peers)
    if rank == 0:
        print(
            f"node buffer {grouping}: {total} rows read as planned, {shared_rows} shared, "
            f"{hold.host.barriers} barriers {hold.host.barrier_seconds:.3f} s"
        )
    steps._stream.close()
    steps2._stream.close()
    comm.Barrier()

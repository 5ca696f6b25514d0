"""Under mpiexec or torchrun: a host's ranks plan their host's buffer in parts, exchanging their
draws and parts over the planning thread's communicator (solar/host/exchange.py). Each rank
serves the steps its host's whole plan gives it: in order; after a jump forward and one back
while the ranks' planning threads are unevenly ahead (the back one a restart: the host's
threads stop together); then every rank closes while local rank 0's thread waits in a round
the others never begin. ``grouping`` (``SOLAR_HOSTS``): hosts of consecutive ranks, e.g. 3,1.

mpiexec -n 4 python tests/mpi/host_exchange.py 2x2
torchrun --nproc_per_node 4 tests/mpi/host_exchange.py 3,1

Each rank prints ``pid PID`` first; rank 0 prints ``host exchange GROUPING: ok`` last.
"""

import os
import sys

import numpy as np

grouping = sys.argv[1]
os.environ["SOLAR_HOSTS"] = grouping

from solar import BufferConfig, PlanSpec, RunConfig, Weighted, dist, host  # noqa: E402
from solar.schedule.keep.grouping import Hosts, stage_bound  # noqa: E402
from solar.schedule.keep.hostplan import HostPlanner  # noqa: E402
from solar.schedule.plans.stream import RankStream  # noqa: E402
from solar.schedule.policy import SIDE  # noqa: E402

d = dist.init()
comm, rank = d.comm, d.rank
print(f"pid {os.getpid()}", flush=True)
where = host.place(comm)
hosts = Hosts(where.groups)
host_comm = host.host_comm(comm)
n, E = 600, 6
run = RunConfig(n, comm.Get_size(), 10, E, seed=4)
w = ((1.0 + np.arange(n)) ** -0.8)[np.random.default_rng(2).permutation(n)]
spec = PlanSpec(run, BufferConfig(15), sampler=Weighted(w, affinity=False))
spe = run.steps_per_epoch
whole = HostPlanner(spec, hosts, only_host=where.host)
epochs = [whole.next() for _ in range(E)]


def want(steps):
    out = []
    for k in steps:
        ranks = epochs[k // spe].ranks
        lo, so = ranks.rank_offsets[rank], ranks.step_offsets[rank]
        sl = slice(int(lo + so[k % spe]), int(lo + so[k % spe + 1]))
        out.append(ranks.sample[sl][(ranks.flags[sl] & SIDE) == 0].astype(np.int64).tobytes())
    return out


def served(s, steps):
    return [s.window(k).step(k).samples.tobytes() for k in steps]


def stream():
    s = RankStream(spec, rank, hosts=hosts, stage_rows=stage_bound(spec, hosts), comm=host_comm)
    assert s.parted == (where.local_size > 1), (rank, s.parted)
    s.start()
    return s


every = range(E * spe)
s = stream()
assert served(s, every) == want(every), rank
s.close()

s = stream()
s.window(0)
if where.local_rank == 0 and s.exchange is not None:
    s.exchange.wait(s._bg.get().future)  # epoch 1 planned (every local rank plans it) ...
    assert s.planned_end == 2 * spe  # ... collected; epoch 2 planned ahead, alone
ahead, back = range(3 * spe, 4 * spe), range(spe, 2 * spe)
assert served(s, ahead) == want(ahead), rank
assert served(s, back) == want(back), rank  # (a restart: replanned from epoch 0)
if s.exchange is not None:
    s.exchange.wait(s._bg.get().future)  # epoch 2 planned on every local rank ...
    if where.local_rank == 0:
        assert s.planned_end == 3 * spe  # ... collected here: epoch 3 planned ahead, alone
s.close()  # (local rank 0's thread waits in a round the others never begin)
assert s.exchange is None or (s.exchange.closed and not s.exchange._held)
comm.Barrier()
if rank == 0:
    print(f"host exchange {grouping}: ok", flush=True)

"""Under mpiexec: ``solar plan`` run by every process plans as one host, each its share of the
ranks, the topology read once for the host (every process maps the same sealed memfd).

mpiexec -n Q python tests/mpi/plan_cli.py OUT.h5|- ARGS...   (ARGS: solar plan's, less -o)
"""

import sys

from mpi4py import MPI

from solar import cli
from solar.graph import neighbor

out, args = sys.argv[1], sys.argv[2:]
made = []
real = neighbor.NeighborSampler.__init__


def recorded(self, *a, **kw):
    real(self, *a, **kw)
    made.append(self)


neighbor.NeighborSampler.__init__ = recorded
try:
    cli.cli.main(["plan", *args, *([] if out == "-" else ["-o", out])], standalone_mode=False)
finally:
    neighbor.NeighborSampler.__init__ = real
comm = MPI.COMM_WORLD
shared = [s.graph.shared is not None for s in made]
with open("/proc/self/maps") as f:
    sealed = sorted({line.split()[4] for line in f if "solar-sealed" in line})  # inodes
got = comm.gather((shared, sealed), root=0)
if comm.Get_rank() == 0:
    assert all(s == [True] for s, _ in got), got
    assert len({tuple(i) for _, i in got}) == 1 and got[0][1], got  # one mapping, the same
    print("shared topology: ok", flush=True)

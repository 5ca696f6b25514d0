"""Under mpiexec: ``solar plan`` run by every process plans as one host, each its share of the
ranks, the topology read once for the host (every process maps the same sealed memfd).

mpiexec -n Q python tests/mpi/plan_cli.py [--narrow|--slow|--room] OUT.h5|- ARGS...
(ARGS: solar plan's, less -o). --narrow: process 1 sends its ranks' slots as int16 (a part
narrower than its offsets say). --slow: process 0 sleeps 1 s before planning every rank, and
process 0 prints, as ``waited: [[cpu, wall], ...]``, each process's CPU and wall seconds spent
waiting for it. --room: the memory free is three quarters of what the host's processes
need together (each process's own need fits).
"""

import dataclasses
import json
import sys
import time

import numpy as np
from mpi4py import MPI

from solar import cli
from solar.graph import neighbor
from solar.schedule.plans import together

mode = sys.argv.pop(1) if sys.argv[1].startswith("--") else None
out, args = sys.argv[1], sys.argv[2:]
comm = MPI.COMM_WORLD
waited = [0.0, 0.0]
if mode == "--narrow" and comm.Get_rank() == 1:
    epoch = together._epoch

    def narrow(*a, **kw):
        return {r: dataclasses.replace(p, slot=p.slot.astype(np.int16))
                for r, p in epoch(*a, **kw).items()}  # fmt: skip

    together._epoch = narrow
if mode == "--room":
    from solar import _memory

    measure, free, host = together.host_memory, _memory.memory_room, []

    def recorded_memory(*a, **kw):
        host.append(measure(*a, **kw))
        return host[-1]

    def room():
        if not host:  # (before the host's figure: `solar plan` warming its kernels)
            return free()
        assert all(h.mine.need <= 0.75 * h.host for h in host), host
        return int(0.75 * host[-1].host), "available"

    together.host_memory, _memory.memory_room = recorded_memory, room
if mode == "--slow":
    wait, plan_to_file = together.wait_quietly, together.plan_to_file

    def slow_plan(*a, **kw):
        time.sleep(1.0)
        return plan_to_file(*a, **kw)

    def timed_wait(c, *a, **kw):
        cpu, wall = time.process_time(), time.perf_counter()
        wait(c, *a, **kw)
        if c is comm:
            waited[:] = [time.process_time() - cpu, time.perf_counter() - wall]

    together.plan_to_file, together.wait_quietly = slow_plan, timed_wait
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
shared = [s.graph.shared is not None for s in made]
with open("/proc/self/maps") as f:
    sealed = sorted({line.split()[4] for line in f if "solar-sealed" in line})  # inodes
got = comm.gather((shared, sealed), root=0)
times = comm.gather(waited, root=0)
if comm.Get_rank() == 0 and mode == "--slow":
    print(f"waited: {json.dumps(times)}", flush=True)
if comm.Get_rank() == 0 and mode is None:
    assert all(s == [True] for s, _ in got), got
    assert len({tuple(i) for _, i in got}) == 1 and got[0][1], got  # one mapping, the same
    print("shared topology: ok", flush=True)

"""Under mpiexec, one host: a NeighborSampler given the job's communicator holds the graph's
topology once per host -- every rank maps the same sealed memfd read-only --, and so does one
given none, once its Loader passes the job's (the default); their batches are byte-identical
to a private copy's; the graph file rewritten after the load
does not change what is served. Then as two hosts of one rank (SOLAR_HOSTS=1,1): one host's
failure fails the other's rank alike (no rank goes on into the job's next collective alone).

mpiexec -n P python tests/mpi/shared_graph.py GRAPH.h5
"""

import os
import sys

import h5py
import numpy as np

from solar import Loader, NeighborSampler, dist
from solar.errors import SolarError
from solar.graph.csr import Graph
from solar.host.sealed import host_sealed

d = dist.init()
path = sys.argv[1]


def batches(sampler: NeighborSampler) -> list[bytes]:
    with Loader(path, ["features"], sampler=sampler, epochs=1, buffer=60, comm=d.comm) as ld:
        ld.set_epoch(0)
        return [b"".join(b[k].numpy().tobytes() for k in ("n_id", "x", "y", "edge_index"))
                for b in ld]  # fmt: skip


def mappings() -> list[str]:
    with open("/proc/self/maps") as f:
        return [line for line in f if "solar-sealed" in line]


private = NeighborSampler(Graph(path), (4, 2), batch_size=13)  # (a Graph read: private)
assert private.graph.shared is None
before = batches(private)
assert private.graph.shared is None  # (a Loader leaves a graph already read as it is)


def sealed_fds() -> int:
    fds = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
           if os.path.exists(f"/proc/self/fd/{fd}")]  # fmt: skip
    return len([f for f in fds if "solar-sealed" in f])


def one_per_host(g: Graph, held: int) -> int:
    """``g``'s topology is one sealed memfd of the host, mapped read-only, equal to the private
    copy's; ``held``: the sealed graphs this rank maps now."""
    assert g.shared is not None
    inodes = d.comm.allgather(g.shared.inode)
    assert len(set(inodes)) == 1, inodes  # one memfd for the host
    maps = mappings()
    assert maps and all(line.split()[1] == "r--s" for line in maps), maps  # read-only, shared
    assert any(f" {g.shared.inode} " in line for line in maps), maps
    for k in ("indptr", "indices", "labels"):
        a, b = getattr(g, k), getattr(private.graph, k)
        assert a.dtype == b.dtype and np.array_equal(a, b) and not a.flags.writeable, k
    # One descriptor each, the mapping's own (Python's mmap keeps a dup of the one it maps;
    # solar's own is closed once every local rank has mapped it).
    assert sealed_fds() == held, sealed_fds()
    return inodes[0]


# Given the job's communicator: read once per host when made.
explicit = NeighborSampler(path, (4, 2), batch_size=13, comm=d.comm)
first = one_per_host(explicit.graph, 1)
assert batches(explicit) == before
# By default (no communicator) the topology waits for the Loader's: nothing read when made,
# then one copy per host, by the Loader's construction.
shared = NeighborSampler(path, (4, 2), batch_size=13)
assert shared.graph.shared is None and sealed_fds() == 1
assert batches(shared) == before
g = shared.graph
second = one_per_host(g, 2)
assert second != first
inodes = [second]

# The file rewritten after the load: every edge now points at node 0.
d.comm.Barrier()
if d.rank == 0:
    with h5py.File(path, "r+") as f:
        f["indices"][...] = 0
d.comm.Barrier()
assert int(np.count_nonzero(Graph(path).indices)) == 0  # (the rewrite happened)
assert batches(shared) == before, "the shared topology changed with its file"

os.environ["SOLAR_HOSTS"] = "1,1"  # (placed again: each rank a host of its own)


def produce(alloc, written):
    alloc(100)
    if d.rank == 1:
        raise SolarError("host of rank 1: its bytes will not do")


try:
    host_sealed(d.comm, produce, lambda sealed, record: record, "test")
    raise AssertionError("a host's failure did not reach every host")
except SolarError as exc:
    assert str(exc) == "host of rank 1: its bytes will not do", exc


def own() -> list[str]:
    """This process's pid and start time (/proc/self/stat) and the /dev/shm names it maps or
    holds: what the test checks is gone after the job, and nothing else of the machine."""
    with open("/proc/self/stat") as f:
        start = f.read().rsplit(")", 1)[1].split()[19]
    with open("/proc/self/maps") as f:
        names = {line.split("/dev/shm/", 1)[1].split()[0] for line in f if "/dev/shm/" in line}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/dev/shm/"):
            names.add(target.split("/dev/shm/", 1)[1].split()[0])
    return [str(os.getpid()), start, *sorted(names)]


print("ok", d.rank, inodes[0], *own())

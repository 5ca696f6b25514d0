"""Under mpiexec: misses packed in plan order on a host's buffer (``share="node"``, one host of
all ranks). Only rank 0's device makes packing pay (rates given per rank), yet every rank plans rows
alone (one plan). Every rank serves whole epochs of exactly the batches of the random path of that
plan, byte for byte (and h5py's rows), with the same hits; each rank's windows are decided by its
planner from the storage reads the host plan gives that rank (they cover its steps, their rows are
its reads), and the windows chosen packed are built and read. Sizes divide nothing: a prime number
of nodes, seeds not a multiple of the batch, chunks not a multiple of the rows, 2 or 3 ranks.

mpiexec -n 3 python tests/mpi/host_packing.py GRAPH.h5 PACKDIR

Each rank prints ``pid PID`` first; rank 0 prints ``host packing P ranks: ok`` at the end.
"""

import itertools
import os
import sys
from pathlib import Path

import h5py

from solar import Loader, NeighborSampler, dist
from solar.dist import allreduce
from solar.options import ExpertConfig, MemoryConfig, PackingConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: shared helpers
from helpers import every_batch

graph, directory = sys.argv[1], sys.argv[2]
d = dist.init()
comm, rank, world = d.comm, d.rank, d.world_size
print(f"pid {os.getpid()}", flush=True)
feats = h5py.File(graph)["features"][()]
E = 3


def loader(disk, page_mates=True):
    # Random pages made dear (100/s) on rank 0: the planner packs every window it may there.
    # Cheap elsewhere (rates may differ per rank, as probed): one plan, rows alone everywhere.
    rate = 100.0 if rank == 0 else 1e9
    pack = PackingConfig(disk=disk, directory=directory, random_pages_per_second=rate,
                         sequential_bytes_per_second=1e9, chunk_bytes=2**16)  # fmt: skip
    return Loader(graph, ["features"], sampler=NeighborSampler(graph, (4, 2), batch_size=23),
                  epochs=E, buffer=150, comm=comm,
                  memory=MemoryConfig(share="node", pack=pack, page_mates=page_mates),
                  expert=ExpertConfig(warm=False))  # fmt: skip


# The same plan read at random: rows alone, as a packing loader plans where it packs.
with loader(0, page_mates=False) as plain:
    assert plain.share == "node" and plain.stats.packing is None
    want = every_batch(plain, range(E))
    hits = plain.stats.totals().hits
with loader("2MiB") as ld:
    got = every_batch(ld, range(E))
    figures, totals, steps = ld.stats.packing, ld.stats.totals(), ld.run.num_steps
    spec_pages = ld.spec.pages
assert totals.hits == hits, (rank, totals.hits, hits)
assert spec_pages is None and totals.side_reads == 0, (rank, spec_pages)
assert len(got) == len(want), (rank, len(got), len(want))
for a, b in zip(got, want, strict=True):
    assert a["x"].numpy().tobytes() == b["x"].numpy().tobytes(), rank
    assert a["x"].numpy().tobytes() == feats[a["n_id"].numpy()].tobytes(), rank
ws = figures.windows
# The planner's windows of this rank: every step once, in order; their rows its own reads.
assert ws[0].first == 0 and ws[-1].end == steps, (rank, ws[0], ws[-1], steps)
assert all(a.end == b.first for a, b in itertools.pairwise(ws)), rank
assert sum(w.rows for w in ws) == totals.reads, rank
packed = sum(w.packed for w in ws)
assert packed >= (rank == 0) and figures.built == packed, (rank, packed, figures.built)
# The host's reads are its ranks' (a row one rank reads for the host is packed once, by it).
assert allreduce(comm, sum(w.rows for w in ws)) == allreduce(comm, totals.reads)
print(f"rank {rank}: {figures.describe()}", flush=True)
comm.Barrier()
if rank == 0:
    print(f"host packing {world} ranks: ok", flush=True)

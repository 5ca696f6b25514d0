"""Rank 1's transform raises on one sample while the others train (a collective per step):
the job must end promptly, the error naming the sample and epoch.

mpiexec -n 3 python tests/mpi/transform_fail.py DATA.h5
"""

import itertools
import sys

import torch
import torch.distributed as td

from solar import Loader, dist

# Collectives wait up to 15 min (not the default 2): longer than tests/test_mpi.py's hang
# guard, so that only solar's abort, not a collective's timeout, ends the others in time.
d = dist.init(timeout_s=900)


calls = itertools.count()


def fussy(sample, rng):
    if d.rank == 1 and next(calls) == 30:
        raise ValueError("boom from rank 1's transform")
    return {"img": sample["img"] * 2}


ld = Loader(sys.argv[1], batch_size=4, epochs=2, buffer=12, comm=d.comm, transform=fussy)
for e in range(2):
    ld.set_epoch(e)
    for _ in ld:
        td.all_reduce(torch.ones(1))  # a training step: waits for every rank
print("unreachable", file=sys.stderr)

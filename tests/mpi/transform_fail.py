"""Rank 1's transform raises on one sample while the others train (a collective per step):
the job must end promptly, the error naming the sample and epoch.

mpiexec -n 3 python tests/mpi/transform_fail.py DATA.h5
"""

import itertools
import sys

import torch
import torch.distributed as td

from solar import Loader, dist

d = dist.init()


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

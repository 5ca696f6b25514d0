"""Under mpiexec: rank 1 raises while the others wait in collectives; the job must end."""

import sys

import torch
import torch.distributed as td

from solar import dist

d = dist.init()
if d.rank == 1:
    raise RuntimeError("boom from rank 1")
td.all_reduce(torch.ones(1))  # would wait forever for rank 1
print("unreachable", file=sys.stderr)

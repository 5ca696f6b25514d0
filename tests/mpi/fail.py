"""Rank 1 raises while the others wait; the job must end promptly under every launcher.

python tests/mpi/fail.py [allreduce|sleep]: the others wait in a collective (default), or in a
sleep that only an abort can end (as in a collective that never notices a dead peer).
"""

import sys
import time

import torch
import torch.distributed as td

from solar import dist

# Collectives wait up to 15 min (not the default 2): longer than tests/test_mpi.py's hang
# guard, so that only solar's abort, not a collective's timeout, ends the others in time.
d = dist.init(timeout_s=900)
td.barrier()  # every rank is up: the failure below is not one of start-up
if d.rank == 1:
    raise RuntimeError("boom from rank 1")
if sys.argv[1:] == ["sleep"]:
    time.sleep(600)
else:
    td.all_reduce(torch.ones(1))  # would wait forever for rank 1
print("unreachable", file=sys.stderr)

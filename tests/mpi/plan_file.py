"""Under mpiexec: every rank loads one plan file; an edited one is refused on every rank.

mpiexec -n P python tests/mpi/plan_file.py DATA.h5 PLAN.h5
"""

import sys

from solar import Loader, dist
from solar.options import PlanningConfig

data, plan = sys.argv[1], sys.argv[2]
d = dist.init()
ld = Loader([data], batch_size=4, epochs=3, buffer=12, seed=3, comm=d.comm,
            planning=PlanningConfig(plan=plan))  # fmt: skip
served = sum(b["index"].numel() for b in ld)
print(f"rank {d.rank}: ok {served}", flush=True)

"""Under mpiexec: every rank loads one plan file; an edited one is refused on every rank.

mpiexec -n P python tests/mpi/plan_file.py DATA.h5 PLAN.h5 [PLAN.h5 ...]
    (plans in turn, in one job: a refused one ends it; starting the ranks costs more than a
    plan)
"""

import sys

from solar import Loader, dist
from solar.options import PlanningConfig

data = sys.argv[1]
d = dist.init()
for plan in sys.argv[2:]:
    ld = Loader([data], batch_size=4, epochs=3, buffer=12, seed=3, comm=d.comm,
                planning=PlanningConfig(plan=plan))  # fmt: skip
    served = sum(b["index"].numel() for b in ld)
    ld.close()
    print(f"rank {d.rank}: ok {served}", flush=True)

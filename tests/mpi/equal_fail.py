"""With equal batches, rank 1's read fails at its 4th step while the others wait for its rows
in the exchange: the job must end promptly, naming rank 1.

mpiexec -n 3 python tests/mpi/equal_fail.py DATA.h5
"""

import sys

from solar import Loader, dist
from solar.options import PlanningConfig

# Collectives wait up to 15 min (not the default 2): longer than tests/test_mpi.py's hang
# guard, so that only solar's abort, not a collective's timeout, ends the others in time.
d = dist.init(timeout_s=900)
ld = Loader(sys.argv[1], batch_size=4, epochs=2, buffer=12, comm=d.comm, reader=None,
            planning=PlanningConfig(slack=0.5, equal_batches=True))  # fmt: skip
if d.rank == 1:
    submit = ld.reader.submit
    calls = 0

    def failing(*args, **kwargs):
        global calls
        calls += 1
        if calls == 4:
            raise OSError("boom from rank 1's read")
        return submit(*args, **kwargs)

    ld.reader.submit = failing
for e in range(2):
    ld.set_epoch(e)
    for _ in ld:
        pass
print("unreachable", file=sys.stderr)

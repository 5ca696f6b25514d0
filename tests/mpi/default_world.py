"""python tests/mpi/default_world.py DATA.h5 MODE[,MODE...]: a Loader built without comm, rank
or world_size, as a DataLoader user writes it, under any launcher. MODE ``init``: after
``solar.dist.init()``; ``torch``: after the user's own ``torch.distributed.init_process_group``
(torchrun's env://); ``none``: nothing initialised (mpiexec: found from MPI; torchrun and
srun: refused in one line). Each rank prints ``rank r world w``, whether Loaders placed by
hand (``rank=``/``world_size=``) are accepted or refused, and, per epoch, its ids and
whether its rows are h5py's; rank 0 checks every sample is served once per epoch and the
local batches are equal, and prints ``OK``.

Several modes (``none,torch``: a refusal, then the same job initialised; a launch costs more
than a mode) run one after the other, each one's output after a line ``== mode MODE ==``; the
process exits 3 if the last one was refused."""

import sys

import h5py
import numpy as np
import torch.distributed as td

from solar import Loader, SolarError, dist


def run(path: str, mode: str) -> bool:
    """One mode; False if the Loader was refused."""
    if mode == "init":
        dist.init()
    elif mode == "torch":
        td.init_process_group("gloo")
    try:
        loader = Loader(path, batch_size=4, epochs=2, buffer=8)
    except SolarError as exc:
        print(f"refused: {exc}", flush=True)
        return False
    comm = dist.job_comm()
    rank, world = loader.rank, loader.world_size
    print(f"rank {rank} world {world}", flush=True)
    # A place given by hand is checked against the job's group: another world size or another
    # rank refused, the group's own or this process alone accepted.
    for place in ({"world_size": world + 1}, {"rank": 0, "world_size": world},
                  {"rank": rank, "world_size": world}, {"rank": 0, "world_size": 1}):  # fmt: skip
        try:
            Loader(path, batch_size=4, epochs=1, buffer=8, **place).close()
            print(f"place {place}: accepted", flush=True)
        except SolarError as exc:
            print(f"place {place}: refused: {exc}", flush=True)
    with h5py.File(path) as f:
        ref = f["x"][()]
    for e in range(2):
        loader.set_epoch(e)
        ids, sizes, ok = [], [], True
        for b in loader:
            i = b["index"].numpy()
            ids += i.tolist()
            sizes.append(len(i))
            ok &= bool(np.array_equal(b["x"].numpy(), ref[i]))
        every = comm.allgather((ids, sizes, ok))
        if rank == 0:
            served = sorted(x for r in every for x in r[0])
            assert served == list(range(len(ref))), f"epoch {e}: {len(served)} rows served"
            assert all(r[2] for r in every), "bytes differ from h5py's"
            full = [s for r in every for s in r[1][:-1]]  # every step but the short last one
            assert set(full) == {4}, f"local batches {full}"
    loader.close()
    if rank == 0:
        print("OK", flush=True)
    return True


served = True
for mode in sys.argv[2].split(","):
    print(f"== mode {mode} ==", flush=True)
    served = run(sys.argv[1], mode)
if not served:
    sys.exit(3)

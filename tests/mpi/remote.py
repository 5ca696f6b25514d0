"""Trainers served by preprocessing workers of another job: every batch byte-identical to a
Loader transforming locally, whole epochs, each sample once per epoch over the ranks.

mpiexec -n 2 python tests/mpi/remote.py DATA.h5 HOST:PORT WORKERS EPOCHS
(the workers: ``solar worker HOST:PORT``, started apart)
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # transform_fns
from transform_fns import crop_flip_noise

from solar import Loader, dist
from solar.remote import Remote
from solar.transform import Transform

path, address, workers, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
d = dist.init(timeout_s=300)
args = dict(batch_size=10, epochs=epochs, buffer=20, seed=3, comm=d.comm)
remote = Remote(address, workers=workers, keep=1, join_s=60)
ld = Loader(path, transform=Transform(crop_flip_noise, workers=1, remote=remote), **args)
ref = Loader(path, transform=Transform(crop_flip_noise, workers=1), **args)
for e in range(epochs):
    ld.set_epoch(e)
    ref.set_epoch(e)
    ids = []
    for a, b in zip(ld, ref, strict=True):
        for k in b:
            assert np.array_equal(a[k].numpy(), b[k].numpy()), (e, k)
        ids.append(a["index"].numpy())
    every = np.sort(np.concatenate(d.comm.allgather(np.concatenate(ids))))
    assert np.array_equal(every, np.arange(103)), (e, every)
figures = ld.stats.remote
delivered = sum(f.steps for f in figures.values())
print(f"rank {d.rank}: ok, workers {sorted(figures)}, delivered {delivered}", flush=True)
ld.close()
ref.close()

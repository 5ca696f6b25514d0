"""Trainers served by preprocessing workers of another job: every batch byte-identical to a
Loader transforming locally, whole epochs, each sample once per epoch over the ranks.

mpiexec -n 2 python tests/mpi/remote.py DATA.h5 HOST:PORT WORKERS EPOCHS [SAMPLER [PID]]
(the workers: ``solar worker HOST:PORT``, started apart). SAMPLER ``shuffle`` (default: the
planner splits each global batch, equal batches) or ``split`` (each rank's batch its own).
Several runs, one after the other in one job (a launch costs more than a run): HOST:PORT and
SAMPLER lists of as many, comma-separated, each run with the workers of its address; each
line a run prints starts ``rank R: SAMPLER:``.
PID (one run): rank 0 kills it (its worker, -9) at step 1 of epoch 0 (credit of 2 steps: its
steps are late from then on, and it is taken for lost within epochs 0 and 1).

Either sampler, each member (trainer, worker) keeps a buffer of its own steps: Shuffle's
batches as the whole job's plan decides them (pass 1), each member's buffer planned over them
(pass 2). Without PID each rank checks it read exactly its own plan's misses (fewer than
alone) and prints its workers' planned hits and reads (``rank R: worker W planned H hits M
reads``), which the test compares with what each worker says it did.
"""

import os
import signal
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # transform_fns
from helpers import planned_reads
from transform_fns import crop_flip_noise

from solar import Loader, dist
from solar.remote import Remote
from solar.schedule.draw.members import TRAINER
from solar.schedule.draw.samplers import SHUFFLE, Weighted
from solar.transform import Transform

path, workers, epochs = sys.argv[1], int(sys.argv[3]), int(sys.argv[4])
addresses = sys.argv[2].split(",")
samplers = (sys.argv[5] if len(sys.argv) > 5 else "shuffle").split(",")
victim = int(sys.argv[6]) if len(sys.argv) > 6 else None
assert len(addresses) == len(samplers) and (victim is None or len(samplers) == 1)
d = dist.init(timeout_s=300)


def run(address: str, kind: str) -> None:
    """One run served by the workers at ``address``, ``kind``'s sampler."""
    split = kind == "split"
    sampler = Weighted(np.ones(103), replacement=False, affinity=False) if split else SHUFFLE
    args = dict(batch_size=10, epochs=epochs, buffer=20, seed=3, comm=d.comm, sampler=sampler)
    # Without a victim, a worker's step is waited for (none late: each member reads its
    # plan's).
    wait_s = 2.0 if victim else 60.0
    remote = Remote(
        address, workers=workers, keep=1, join_s=60, window=2 if victim else 8, wait_s=wait_s
    )
    ld = Loader(path, transform=Transform(crop_flip_noise, workers=1, remote=remote), **args)
    ref = Loader(path, transform=Transform(crop_flip_noise, workers=1), **args)
    for e in range(epochs):
        ld.set_epoch(e)
        ref.set_epoch(e)
        ids = []
        for t, (a, b) in enumerate(zip(ld, ref, strict=True)):
            if victim is not None and d.rank == 0 and (e, t) == (0, 1):
                os.kill(victim, signal.SIGKILL)
            for k in b:
                assert np.array_equal(a[k].numpy(), b[k].numpy()), (kind, e, k)
            ids.append(a["index"].numpy())
        every = np.sort(np.concatenate(d.comm.allgather(np.concatenate(ids))))
        assert np.array_equal(every, np.arange(103)), (kind, e, every)
    figures = ld.stats.remote
    delivered = sum(f.steps for f in figures.values())
    # Rows this trainer read from storage: its buffer's misses, and its workers' late steps.
    reads = ld.stats.totals().reads + sum(f.read for f in figures.values())
    alone = ref.stats.totals().reads
    assert reads < alone, (kind, reads, alone)  # the trainer reads only its own steps' misses
    said = f"workers {sorted(figures)}, delivered {delivered}, read {reads} of {alone}"
    if victim is None:
        roster = ((0, tuple(sorted(figures))),)
        mine, _ = planned_reads(ld.spec, d.rank, roster, TRAINER)
        assert ld.stats.totals().reads == mine and reads == mine, (kind, reads, mine)
        for w in sorted(figures):
            theirs, hits = planned_reads(ld.spec, d.rank, roster, w)
            print(f"rank {d.rank}: {kind}: worker {w} planned {hits} hits {theirs} reads",
                  flush=True)  # fmt: skip
    print(f"rank {d.rank}: {kind}: ok, {said}", flush=True)
    ld.close()
    ref.close()


for address, kind in zip(addresses, samplers, strict=True):
    run(address, kind)

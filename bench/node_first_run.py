"""What the first node-buffer job compiles: ``Loader(share="node")`` jobs under ``mpiexec -n 2``
(one host of 2 ranks), each launch a fresh set of processes, over one numba cache:

    flock /tmp/solar-bench.lock python bench/node_first_run.py [--json OUT]

Runs, in a new empty ``NUMBA_CACHE_DIR``: ``solar warm --jobs 2`` (timed), then the node job
twice (the first after the warm-up: what a user's first node job compiles; the second: whether
the cache then holds everything); with ``--cold`` also the node job on a second empty cache
(nothing warmed: the control). The job builds, on every rank, node Loaders of the kinds the
node path plans: ``Weighted(affinity=False)`` (a host's union), Shuffle (affinity) with and
without equal batches, ``Weighted`` with affinity, a node tier, and a node plan file; each
Loader warms as users construct it, then serves its epochs. Reported per rank: kernels numba
compiled (not loaded from the cache) while constructing and while serving, their seconds, and
which kernels.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = r"""
import json, os, sys, threading, time
from numba.core import event

class Names(event.Listener):  # numba's compilations (not cache loads), outermost only
    def __init__(self):
        self.depth, self.t0, self.log, self.lock = 0, 0.0, [], threading.Lock()
    def on_start(self, ev):
        with self.lock:
            if self.depth == 0:
                self.t0 = time.perf_counter()
            self.depth += 1
    def on_end(self, ev):
        with self.lock:
            self.depth -= 1
            if self.depth == 0:
                f = ev.data["dispatcher"].py_func
                self.log.append((f"{f.__module__}.{f.__qualname__}",
                                 time.perf_counter() - self.t0))

names = Names()
event.register("numba:compile", names)

import numpy as np
from solar import ExpertConfig, Loader, MemoryConfig, PlanningConfig, Shuffle, Weighted, dist
from solar.schedule.plans.plan import plan_to_file
from solar.schedule.keep.grouping import Hosts

data, tmp = sys.argv[1], sys.argv[2]
d = dist.init()
comm, rank = d.comm, d.rank
n = 160
weights = (1.0 + np.arange(n)) ** -0.8
cases = {
    "weighted": dict(sampler=Weighted(weights, affinity=False)),
    "shuffle (equal batches)": dict(sampler=Shuffle()),
    "shuffle, unequal batches": dict(sampler=Shuffle(),
                                     planning=PlanningConfig(equal_batches=False)),
    "weighted with affinity": dict(sampler=Weighted(weights)),
    "weighted, tier": dict(sampler=Weighted(weights, affinity=False), tier=tmp,
                           tier_size="10%"),
    "weighted, plan file": dict(sampler=Weighted(weights, affinity=False), plan_file=True),
}
out = {}
for name, kw in cases.items():
    memory = MemoryConfig(tier=kw.pop("tier", None), tier_size=kw.pop("tier_size", 0),
                          share="node")
    kw = dict(kw, batch_size=8, epochs=3, buffer="20%", comm=comm, memory=memory, seed=3)
    if kw.pop("plan_file", False):
        made = Loader(data, **kw, expert=ExpertConfig(warm=False))
        path = os.path.join(tmp, "node-plan.h5")
        if rank == 0:
            plan_to_file(made.spec, hosts=Hosts.grid(1, 2), path=path)
        comm.Barrier()
        made.close()
        kw["planning"] = PlanningConfig(plan=path)
    k0, t0 = len(names.log), time.perf_counter()
    ld = Loader(data, **kw)
    k1, t1 = len(names.log), time.perf_counter()
    assert ld.share == "node", name
    for e in range(ld.run.epochs):
        ld.set_epoch(e)
        for _ in ld:
            pass
    t2 = time.perf_counter()
    ld.close()
    built, served = names.log[k0:k1], names.log[k1:]
    out[name] = dict(construct_s=t1 - t0, epochs_s=t2 - t1,
                     loader_compiled=ld.stats.compiled,
                     loader_compile_s=ld.stats.compile_seconds,
                     compiled_constructing=len(built),
                     compile_s_constructing=sum(s for _, s in built),
                     compiled_serving=len(served),
                     compile_s_serving=sum(s for _, s in served),
                     kernels=sorted({k for k, _ in built + served}))
    del names.log[:]
every = comm.gather(out)
if rank == 0:
    print(json.dumps(every))
"""


def _data(root: Path) -> str:
    import h5py
    import numpy as np

    rng = np.random.default_rng(0)
    path = root / "d.h5"
    with h5py.File(path, "w") as f:  # as solar warm's data: float32 samples and labels
        f["x"] = rng.standard_normal((160, 8, 8)).astype(np.float32)
        f["y"] = rng.standard_normal((160, 2)).astype(np.float32)
    return str(path)


def _env(cache: str) -> dict[str, str]:
    skip = ("SLURM_", "PMI_", "OMPI_", "TORCHELASTIC_", "MPI_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(skip)}
    return {**env, "NUMBA_CACHE_DIR": cache, "SOLAR_HOSTS": "1x2"}


def warm(cache: str) -> dict:
    solar = Path(sys.executable).with_name("solar")
    t = time.perf_counter()
    p = subprocess.run([str(solar), "warm", "--jobs", "2"], env=_env(cache), capture_output=True,
                       text=True, check=True)  # fmt: skip
    return {"seconds": time.perf_counter() - t, "said": p.stdout.strip()}


def job(cache: str, data: str, root: Path) -> list[dict]:
    mpiexec = Path(sys.executable).with_name("mpiexec")
    script = root / "job.py"
    script.write_text(JOB)
    tier = root / f"tier-{len(list(root.iterdir()))}"
    tier.mkdir()
    p = subprocess.run([str(mpiexec), "-n", "2", sys.executable, str(script), data, str(tier)],
                       env=_env(cache), capture_output=True, text=True, timeout=1800)  # fmt: skip
    if p.returncode:
        raise SystemExit(p.stderr[-4000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def _total(ranks: list[dict], key: str) -> float:
    """The slowest rank's sum over the cases."""
    return max(sum(c[key] for c in r.values()) for r in ranks)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--cold", action="store_true", help="also a node job on an empty cache")
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="solar-node-first-"))
    try:
        data = _data(root)
        out: dict = {}
        cache = str(root / "cache")
        out["warm"] = warm(cache)
        out["first node job after solar warm"] = job(cache, data, root)
        out["second node job"] = job(cache, data, root)
        if a.cold:
            out["node job, empty cache"] = job(str(root / "cold"), data, root)
        for k, ranks in out.items():
            if k == "warm":
                print(f"solar warm --jobs 2: {ranks['seconds']:.1f} s ({ranks['said']})")
                continue
            print(f"{k}: compiled {_total(ranks, 'compiled_constructing'):.0f} kernels in "
                  f"{_total(ranks, 'compile_s_constructing'):.1f} s constructing, "
                  f"{_total(ranks, 'compiled_serving'):.0f} in "
                  f"{_total(ranks, 'compile_s_serving'):.1f} s serving (slowest rank)")  # fmt: skip
            for case, c in ranks[0].items():
                print(f"  rank 0, {case}: {c['compiled_constructing']} + {c['compiled_serving']}"
                      f" kernels, {c['compile_s_constructing']:.1f} + "
                      f"{c['compile_s_serving']:.1f} s: {', '.join(c['kernels'])}")  # fmt: skip
        if a.json:
            Path(a.json).write_text(json.dumps(out, indent=1))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Fingerprints of the plans of 79 specs, to show a change leaves every decision alone.

    PYTHONPATH=. python bench/plan_hashes.py > after.txt
    git worktree add /tmp/base <commit>
    PYTHONPATH=/tmp/base python bench/plan_hashes.py > before.txt
    diff before.txt after.txt   # empty: the same plans

Every policy, slack 0 and 0.25, drop_last, P = 1, 3, 8, reordered epochs, a tier, sizes that
do not divide evenly, a tier that takes all of N, a buffer larger than N. Per spec: hashes of
the in-memory per-rank arrays, of the saved file's datasets and attributes (but its measured
``plan_seconds``), of the arrays read back, and of ``simulate``'s totals.
"""

import hashlib
import json
import sys
import tempfile
from pathlib import Path

import h5py
import numpy as np

from solar import BufferConfig, PlanSpec, RunConfig, load_plan, make_plan

try:
    from solar.schedule import simulate
except ImportError:  # before plan.py was split (97d142c and earlier)
    from solar.schedule.plans.plan import simulate


def specs():
    for policy in ("solar", "lru", "fifo", "solar-artifact", "nopfs"):
        for slack in (0.0, 0.25):
            for drop_last in (False, True):
                for world in (1, 3, 8):
                    run = RunConfig(997, world, 7, 4, seed=11, drop_last=drop_last)
                    yield PlanSpec(run, BufferConfig(53, slack), policy)
        run = RunConfig(1003, 3, 9, 5, seed=3)
        yield PlanSpec(run, BufferConfig(61, 0.25), policy, reorder_epochs=True)
    for policy in ("solar", "nopfs"):
        for world in (1, 3, 8):
            for reorder in (False, True):
                run = RunConfig(1001, world, 6, 4, seed=5, drop_last=world == 3)
                yield PlanSpec(run, BufferConfig(37, 0.25, tier=90), policy, reorder)
    # a tier that takes every sample RAM leaves, and a buffer larger than N
    yield PlanSpec(RunConfig(211, 3, 5, 3, seed=2), BufferConfig(20, 0.0, tier=500), "solar")
    yield PlanSpec(RunConfig(211, 3, 5, 3, seed=2), BufferConfig(400, 0.25), "solar")


def arr_hash(h, a):
    a = np.ascontiguousarray(a)
    h.update(f"{a.dtype.str}{a.shape}".encode())
    h.update(a.tobytes())


def stats_of(p):
    return [
        [s.accesses, s.hits, s.reads, s.admits, s.min_batch, s.max_batch, s.tier_hits]
        for s in p.stats
    ]


def _datasets(f: h5py.File) -> list[str]:
    names: list[str] = []
    f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
    return names


def main():
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, spec in enumerate(specs()):
            plan = make_plan(spec)
            h = hashlib.sha256()
            arr_hash(h, plan.epoch_order)
            for r in range(spec.run.world_size):
                rp = plan.rank(r)
                for a in (rp.sample, rp.slot, rp.flags, rp.step_offsets, rp.tslot):
                    arr_hash(h, a)
            mem = h.hexdigest()[:16]
            path = plan.save(Path(tmp) / f"{i}.h5")
            h = hashlib.sha256()
            with h5py.File(path, "r") as f:
                names = _datasets(f)
                for n in sorted(names):
                    h.update(n.encode())
                    arr_hash(h, f[n][()])
                for k in sorted(f.attrs):
                    if k != "plan_seconds":  # a measured time
                        h.update(f"{k}={f.attrs[k]}".encode())
            file_h = h.hexdigest()[:16]
            loaded = load_plan(path)
            h = hashlib.sha256()
            for r in range(spec.run.world_size):
                rp = loaded.rank(r)
                for a in (rp.sample, rp.slot, rp.flags, rp.step_offsets, rp.tslot):
                    arr_hash(h, a)
            back = h.hexdigest()[:16]
            assert stats_of(loaded) == stats_of(plan)
            sim = simulate(spec)
            totals = [sim.accesses, sim.hits, sim.tier_hits, sim.ram_hits, sim.hit_rate, sim.bound]
            sim_h = hashlib.sha256(json.dumps([totals, stats_of(sim)]).encode()).hexdigest()[:16]
            assert stats_of(sim) == stats_of(plan)
            out.append(
                f"{i:3d} {spec.policy:15s} P={spec.run.world_size} slack={spec.buffer.slack} "
                f"drop={int(spec.run.drop_last)} reorder={int(spec.reorder_epochs)} "
                f"tier={spec.buffer.tier} fp={spec.fingerprint[:12]} mem={mem} file={file_h} "
                f"loaded={back} sim={sim_h} hits={plan.hits}"
            )
    text = "\n".join(out)
    print(text)
    print("ALL", hashlib.sha256(text.encode()).hexdigest())


if __name__ == "__main__":
    sys.exit(main())

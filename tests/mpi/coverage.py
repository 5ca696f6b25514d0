"""Under mpiexec: every rank's batches are h5py's bytes, each sample once per epoch (with
--weighted: each draw of every global batch once), resume exact.

mpiexec -n P python tests/mpi/coverage.py DATA.h5 [DATA2.h5 ...] --slack X
    [--tier DIR --tier-size D] [--weighted {affinity,split}] [--plan PLAN.h5] [--equal-batches]
    [--batch-size B]
mpiexec -n P python tests/mpi/coverage.py --cases CASES.json
    one job for several cases (a JSON list of such argument lists), run one after the other,
    each line prefixed with ``case I: ``: starting the ranks (torch, solar) costs more than a
    case, so the tests run each launcher and job size once.

With --equal-batches every batch is the rank's nominal share and holds the samples the plan's
exchange (solar.schedule.keep.transfer) delivers to it, in its order. With --transform each sample
passes through a transform drawing from its rng: every row carries the draws its (seed, epoch,
sample, step) give, wherever it was transformed, in the first run and the resumed one.
"""

import argparse
import dataclasses
import json
import os
import sys

import h5py
import numpy as np
from planned import planned

from solar import Loader, MemoryConfig, PlanningConfig, Weighted, dist
from solar.schedule.draw.order import nominal_batches
from solar.schedule.keep.transfer import delivered
from solar.transform import sample_rng


def noisy(sample, rng):
    return {**{k: v.copy() for k, v in sample.items()}, "noise": rng.integers(0, 2**62, 2)}


def check_noise(opts, batch, e, t):
    """Each row's draws are its own (Shuffle: no repeats)."""
    if opts.transform:
        for i, got in zip(batch["index"].tolist(), batch["noise"].numpy(), strict=True):
            assert np.array_equal(got, sample_rng(0, e, i, t, 0).integers(0, 2**62, 2)), (e, t, i)


parser = argparse.ArgumentParser()
parser.add_argument("data", nargs="+")
parser.add_argument("--slack", type=float, default=0.25)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--tier", default=None)
parser.add_argument("--tier-size", type=int, default=0)
parser.add_argument("--weighted", choices=["affinity", "split"])
parser.add_argument("--plan", help="A `solar plan` file to load (proven against the sampler).")
parser.add_argument("--equal-batches", action="store_true")
parser.add_argument("--batch-size", type=int, default=4, help="beyond N/P: a short epoch")
parser.add_argument("--transform", action="store_true")
parser.add_argument("--share", default="auto", help="The Loader's share (rank: a rank's tier).")


def check(opts: argparse.Namespace, d: dist.Dist, tag: str) -> None:
    """One case: ``opts`` as parsed from its arguments."""
    ref: dict[str, list] = {}
    for path in opts.data:
        with h5py.File(path) as f:
            for k in f:
                ref.setdefault(k, []).append(f[k][()])
    ref = {k: np.concatenate(v) for k, v in ref.items()}
    n = len(next(iter(ref.values())))
    kw = {
        "batch_size": opts.batch_size,
        "epochs": opts.epochs,
        "buffer": 12,
        "comm": d.comm,
        "memory": MemoryConfig(tier=opts.tier, tier_size=opts.tier_size, share=opts.share),
    }
    sampler = None
    planning = PlanningConfig(slack=opts.slack)
    if opts.weighted:  # skewed weights, a few samples never drawn
        w = (1.0 + np.arange(n)) ** -1.1
        w[::17] = 0
        sampler = Weighted(w, affinity=opts.weighted == "affinity")
        kw.update(sampler=sampler)
        planning = dataclasses.replace(planning, plan=opts.plan)
    if opts.equal_batches:
        planning = dataclasses.replace(planning, equal_batches=True, plan=opts.plan)
    if opts.transform:
        kw.update(transform=noisy)
    kw.update(planning=planning)
    ld = Loader(opts.data, **kw)
    expected = None
    if opts.equal_batches:
        parts = [ld.plan.rank(r) for r in range(d.world_size)]
        expected = delivered([p.sample for p in parts], [p.step_offsets for p in parts])[d.rank]

    batches = []
    for e in range(opts.epochs):
        ld.set_epoch(e)
        mine = []
        for b in ld:
            idx = b["index"].numpy()
            check_noise(opts, b, e, len(mine))
            for key, want in ref.items():
                assert b[key].numpy().tobytes() == want[idx].tobytes(), (d.rank, e, key)
            if expected is not None:
                k = e * len(ld) + len(mine)
                share = nominal_batches(ld.global_batch, d.world_size)[d.rank]
                assert idx.size == share, (d.rank, k, idx.size, share)
                assert np.array_equal(idx, expected[k]), (d.rank, k)
            mine.append(idx)
            batches.append(idx.copy())
        assert len(mine) == len(ld)
        every = d.comm.gather(np.concatenate(mine), root=0)
        if d.is_root:
            every = np.concatenate(every)
            if sampler is None:
                want = np.arange(n)
            else:
                want = np.concatenate([sampler.global_batch(ld.run, e, t) for t in range(len(ld))])
            assert np.array_equal(np.sort(every), np.sort(want)), f"epoch {e}: not served once"
    figures = planned(ld, d.comm)  # (a node buffer's share where share="auto" chose one)
    served = ld.stats.epochs.values()
    assert sum(s.hits + s.tier_hits for s in served) == figures.hits
    assert sum(s.tier_hits for s in served) == figures.tier_hits
    assert sum(s.reads for s in served) == figures.reads
    if opts.equal_batches:  # rows did move, as many as planned
        mine = ld.plan.stats[d.rank]
        assert sum(s.sent for s in served) == mine.sent
        assert sum(s.received for s in served) == mine.received
        assert sum(d.comm.allgather(mine.sent)) > 0, "no rows moved: the test proves nothing"
    if opts.tier:
        assert ld.tier is not None and os.fstat(ld.tier._fd).st_nlink == 0  # open, unnamed
        # (under skewed draws a rank's RAM may hold all it reuses: the job's tier hits count)
        assert sum(d.comm.allgather(figures.tier_hits)) > 0

    # Resume in a fresh loader from the middle of epoch 1: the same batches follow.
    cut = len(ld) + len(ld) // 2
    first = Loader(opts.data, **kw)
    for e in range(2):
        first.set_epoch(e)
        for i, _ in enumerate(first):
            if e * len(first) + i + 1 == cut:
                break
        else:
            continue
        break
    state = first.state_dict()
    resumed = Loader(opts.data, **kw)
    resumed.load_state_dict(state)
    rest = []
    for e in range(1, opts.epochs):
        resumed.set_epoch(e)
        for t, b in enumerate(resumed, start=cut - e * len(resumed) if e == 1 else 0):
            check_noise(opts, b, e, t)
            rest.append(b["index"].numpy().copy())
    assert len(rest) == len(batches) - cut
    assert all(np.array_equal(a, b) for a, b in zip(rest, batches[cut:], strict=True))
    for loader in (ld, first, resumed):
        loader.close()
    d.comm.Barrier()
    if opts.tier:
        assert os.listdir(opts.tier) == [], os.listdir(opts.tier)  # every rank's tier file removed
    # Which read path each key took: "chunks" (decoded by solar), "h5py" or "offset".
    paths = sorted({"chunks" if lay.decoded else "offset" if lay.offset is not None else "h5py"
                    for file in ld.reader._layouts for lay in file})  # fmt: skip
    print(f"{tag}rank {d.rank} of {d.world_size}: read paths {','.join(paths)}", flush=True)
    print(f"{tag}rank {d.rank} of {d.world_size}: ok", flush=True)


if sys.argv[1:2] == ["--cases"]:
    with open(sys.argv[2]) as f:
        cases = [(f"case {i}: ", argv) for i, argv in enumerate(json.load(f))]
else:
    cases = [("", sys.argv[1:])]
job = dist.init()
for tag, argv in cases:
    check(parser.parse_args([str(a) for a in argv]), job, tag)

"""What a host's ranks exchange per epoch to plan their host's buffer in parts, and what it
costs: sealed memfds (solar/schedule/plans/hostpayload.py) against a gloo allgather of the same
bytes on the host's ranks (issue 44 item 2: would a collective on a communicator of the
planning thread carry the bytes as well?); and, under a launcher (``--launched``), the
exchange as it runs (solar/host/exchange.py): per epoch, each rank packs its part, one round
of records on the planning thread's communicator names every part, each rank maps and checks
every part.

    python bench/host_exchange.py [--samples 200000 --ranks 4 --batch 256 --buffer 0.1]
        [--repeat 5]
    mpiexec -n 4 python bench/host_exchange.py --launched [--samples ... --repeat 5]
    torchrun --standalone --nproc_per_node 4 bench/host_exchange.py --launched [...]

One host of ``--ranks`` local ranks, ``Weighted(affinity=False)`` skewed draws (rows repeat
within and across ranks' batches), a host buffer of ``--buffer`` of the samples, planned in
parts (one per local rank) for epoch 0. Per part: the bytes of its payload (solar's pack),
the seconds to pack it into a sealed memfd and to map and check it (unpack, one rank's view).
Then ``--ranks`` processes (gloo, this machine) allgather payloads of those sizes (each rank
its part, padded to the largest as solar.dist.TorchComm does): the median seconds of
``--repeat`` rounds and the bytes each rank then holds privately (every part), against the
memfd exchange's (each rank maps every part, but touches only its own service's pages).

Measured (2 shared cores, other jobs running: noisy), ``--samples 1000000 --batch 1024``:
parts of 9.6-9.9 MiB; memfd pack 0.03-0.22 s, map and check 0.001-0.03 s; gloo allgather
0.18-0.48 s (median 0.27 s), every rank then holding 40 MiB of parts privately.
The exchange as it runs (``--launched``, same sizes, 4 ranks, medians of 5, slowest rank), on
d85af82: mpiexec pack 0.025 s, round 0.021 s, map and check every part 0.013 s, an epoch's
exchange 0.049 s (a round of records alone 0.021 s); torchrun (gloo) 0.029, 0.021, 0.021 s,
0.065 s (records alone 0.011 s).
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import sys
import tempfile
import time

import numpy as np


def _plan(args) -> tuple[list[int], list[float], list[float], int]:
    from solar import BufferConfig, PlanSpec, RunConfig, Weighted
    from solar.host.memfd import frozen
    from solar.schedule.keep.grouping import Hosts
    from solar.schedule.keep.hostplan import HostPlanner
    from solar.schedule.keep.hostrun import host_parts, host_run_spec
    from solar.schedule.plans.hostpayload import digest, pack, unpack

    n, ranks = args.samples, args.ranks
    w = ((1.0 + np.arange(n)) ** -0.8)[np.random.default_rng(1).permutation(n)]
    cap = int(args.buffer * n / ranks)
    spec = PlanSpec(RunConfig(n, ranks, args.batch, 2, seed=4), BufferConfig(cap),
                    sampler=Weighted(w, affinity=False))  # fmt: skip
    hosts = Hosts.grid(1, ranks)
    hspec = host_run_spec(spec, hosts)
    parts = host_parts(hspec, hosts, 0)
    assert parts is not None, "no parts: a sampler that fixes each rank's batch plans in parts"
    tag = digest(spec.fingerprint, hosts, 0)
    sizes, packs, maps = [], [], []
    for j in range(parts.count):
        p = HostPlanner(spec, hosts, only_host=0, part=j)
        contents = p.planner.contents(0)
        ne = p.next()
        t0 = time.perf_counter()
        fd = frozen(*pack(ne, 0, contents, tag, j))
        packs.append(time.perf_counter() - t0)
        size = os.fstat(fd).st_size
        sizes.append(size)
        t0 = time.perf_counter()
        m = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        unpack(m, epoch=0, hosts=hosts, host=0, rank=j, steps=spec.run.steps_per_epoch,
               num_samples=n, slots=parts.size(hspec.slots, j), tier=0, tag=tag,
               part=j)  # fmt: skip
        maps.append(time.perf_counter() - t0)
        os.close(fd)
    draws = 8 * spec.run.samples_per_epoch // ranks  # a rank's own draws (int64 ids)
    return sizes, packs, maps, draws


def _gather(rank: int, world: int, init: str, sizes: list[int], repeat: int, out: str) -> None:
    import torch
    import torch.distributed as td

    td.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    n = max(sizes)
    send = torch.zeros(n, dtype=torch.uint8)
    send[: sizes[rank]] = 1
    times = []
    for _ in range(repeat):
        recv = [torch.empty(n, dtype=torch.uint8) for _ in range(world)]
        td.barrier()
        t0 = time.perf_counter()
        td.all_gather(recv, send)
        times.append(time.perf_counter() - t0)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(times, f)
    td.destroy_process_group()


def _launched(args) -> None:
    """The exchange of one epoch's parts on this job's one host, ``--repeat`` times: seconds
    to pack, for the round, to map and check every part (medians over the epochs, the slowest
    rank's), and for a round of records alone."""
    from solar import BufferConfig, PlanSpec, RunConfig, Weighted, dist, host
    from solar.host.exchange import HostExchange
    from solar.host.memfd import frozen
    from solar.schedule.keep.grouping import Hosts
    from solar.schedule.keep.hostplan import HostPlanner
    from solar.schedule.keep.hostrun import host_parts, host_run_spec
    from solar.schedule.plans.hostpayload import KINDS, PART, digest, pack, unpack_part

    d = dist.init()
    comm, world = d.comm, d.comm.Get_size()
    where = host.place(comm)
    hosts, hc = Hosts(where.groups), host.host_comm(comm)
    n = args.samples
    w = ((1.0 + np.arange(n)) ** -0.8)[np.random.default_rng(1).permutation(n)]
    spec = PlanSpec(RunConfig(n, world, args.batch, 2, seed=4),
                    BufferConfig(int(args.buffer * n / world)),
                    sampler=Weighted(w, affinity=False))  # fmt: skip
    hspec = host_run_spec(spec, hosts)
    parts = host_parts(hspec, hosts, where.host)
    assert parts is not None
    j, h, tag = where.local_rank, where.host, digest(spec.fingerprint, hosts, where.host)
    p = HostPlanner(spec, hosts, only_host=h, part=j)
    contents = p.planner.contents(h)
    ne = p.next()
    ex = HostExchange(hc, h, j, where.local_size, 0, KINDS)
    t: dict[str, list[float]] = {"pack": [], "round": [], "map_and_check": [], "records": []}
    for _ in range(args.repeat):
        hc.Barrier()
        t0 = time.perf_counter()
        fd = frozen(*pack(ne, h, contents, tag, j))
        t1 = time.perf_counter()
        nbytes = os.fstat(fd).st_size
        got = ex.round(PART, 0, fd)
        t2 = time.perf_counter()
        for q in range(parts.count):
            unpack_part(ex.open(got[q]), epoch=0, hosts=hosts, host=h, rank=d.rank,
                        steps=spec.run.steps_per_epoch, num_samples=n, layout=parts, part=q,
                        slots=parts.size(hspec.slots, q), tier=0, tag=tag)  # fmt: skip
        t3 = time.perf_counter()
        hc.Barrier()
        t4 = time.perf_counter()
        ex.round(PART, 0)
        t["records"].append(time.perf_counter() - t4)
        for k, v in (("pack", t1 - t0), ("round", t2 - t1), ("map_and_check", t3 - t2)):
            t[k].append(v)
    ex.close(lambda: None)
    every = comm.allgather(
        {"mib": nbytes / 2**20, **{k: statistics.median(v) for k, v in t.items()}}
    )
    if d.rank == 0:
        print(json.dumps({
            "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
            "launcher": "mpi" if hasattr(comm, "Dup") else "torch.distributed (gloo)",
            "ranks": world, "repeat": args.repeat,
            "part_payload_mib": [round(e["mib"], 2) for e in every],
            **{f"{k}_s_median_slowest_rank": round(max(e[k] for e in every), 5) for k in t},
            "epoch_exchange_s": round(max(e["pack"] + e["round"] + e["map_and_check"]
                                          for e in every), 5),
        }, indent=1))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=200_000)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--buffer", type=float, default=0.1)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument(
        "--launched",
        action="store_true",
        help="under mpiexec or torchrun: time the exchange as it runs",
    )
    args = ap.parse_args()
    if args.launched:
        _launched(args)
        return
    sizes, packs, maps, draws = _plan(args)
    import torch.multiprocessing as tmp

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "times.json")
        init = f"file://{os.path.join(d, 'rdv')}"
        tmp.spawn(_gather, args=(args.ranks, init, sizes, args.repeat, out), nprocs=args.ranks)
        with open(out) as f:
            times = json.load(f)
    mib = 2**20
    print(json.dumps({
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "part_payload_mib": [round(s / mib, 2) for s in sizes],
        "own_draws_mib": round(draws / mib, 2),
        "memfd_pack_s": [round(t, 4) for t in packs],
        "memfd_map_and_check_s": [round(t, 4) for t in maps],
        "gloo_allgather_s_median": round(statistics.median(times), 4),
        "gloo_allgather_s_all": [round(t, 4) for t in times],
        "private_mib_per_rank_allgather": round(len(sizes) * max(sizes) / mib, 2),
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()

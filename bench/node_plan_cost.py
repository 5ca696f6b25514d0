"""What planning a host costs each rank (issue 35): one rank's trace planned alone, and every
local rank its own side by side (``share="rank"`` in a job), against the node plan of a host
of L local ranks — planned whole by one process (``HostPlanner``: what solar plan, plan files
and a rank saving snapshots do) and as a job plans it (each local rank plans one part of the
host's buffer from the draws its host's ranks post: solar/schedule/keep/hostparts.py).

    python bench/node_plan_cost.py --graph G.h5 [--ranks 4 8 --epochs 3 --batch 1024]
        [--buffer 0.1] [--out bench/results/node-plan-cost-parts.json]

The graph: ``solar gen G.h5 --preset graph --nodes 1000000 --avg-degree 20 --features 1``
(only its CSR is read). Sampler: ``NeighborSampler(fanouts (10, 5), --batch seeds per rank)``;
aggregate buffer ``--buffer`` of the nodes. Every figure is measured in a fresh process
(``rank``: ``Planner(only_rank=0)`` over the run, alone on the machine; ``ranks``: every rank
``Planner(only_rank=r)`` under ``mpiexec -n L``; ``every``: ``HostPlanner(only_host=0)``;
``once``: ``RankStream`` (a host's share) under ``mpiexec -n L`` with the host's communicator,
every rank pulling every epoch). Per process: wall and CPU seconds from the first planned epoch
asked to the last one received (sampling included: a rank samples its own batches to plan
them), peak RSS growth over the process's state before planning (the graph loaded), and at the
end the private and proportional (PSS: shared pages split between the processes mapping them)
memory. L processes on this machine's 2 cores slow each other (caches, switches): compare
``once`` with ``ranks``, measured alike; ``rank`` is the idle machine's figure."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()


def _smaps() -> dict[str, float]:
    """Private and proportional memory now (MiB), from /proc/self/smaps_rollup."""
    out: dict[str, float] = {}
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("Pss", "Private_Clean", "Private_Dirty", "Rss"):
                    out[k] = int(v.split()[0]) / 1024
    except OSError:
        pass
    private = out.get("Private_Clean", 0.0) + out.get("Private_Dirty", 0.0)
    return {"pss_mib": round(out.get("Pss", 0.0), 1), "private_mib": round(private, 1)}


def _digest(h, part) -> None:
    """A rank's service of an epoch into the digest ``h``."""
    for arr in (part.sample, part.slot, part.flags, part.step_offsets):
        h.update(arr.tobytes())


def child(a) -> None:
    from solar import BufferConfig, NeighborSampler, PlanSpec
    from solar.schedule.draw.samplers import sampler_run
    from solar.schedule.keep.grouping import Hosts, stage_bound
    from solar.schedule.keep.hostplan import HostPlanner
    from solar.schedule.keep.planner import Planner
    from solar.schedule.plans.stream import RankStream

    comm, rank = None, 0
    if a.which in ("once", "ranks"):
        from mpi4py import MPI

        comm, rank = MPI.COMM_WORLD, MPI.COMM_WORLD.Get_rank()
    s = NeighborSampler(a.graph, (10, 5), a.batch)
    n, world = s.graph.num_nodes, a.local
    run = sampler_run(s, n, world, a.batch, a.epochs)
    spec = PlanSpec(run, BufferConfig(int(a.buffer * n) // world, 0.25), sampler=s)
    hosts = Hosts.grid(1, world)
    fp: str | list[str] = ""
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if comm is not None:
        comm.Barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    acc = 0
    if a.which in ("rank", "ranks"):  # (ranks: every local rank its own, side by side)
        p = Planner(spec, only_rank=rank)
        for _ in range(run.epochs):
            acc += p.next_rank(rank).sample.size
    elif a.which == "every":
        q = HostPlanner(spec, hosts, only_host=0)
        hs = [hashlib.blake2b(digest_size=8) for _ in range(world)]
        for _ in range(run.epochs):
            ne = q.next()
            acc += ne.host.sample.size
            for r in range(world):
                _digest(hs[r], ne.rank(r))
        fp = [h.hexdigest() for h in hs]
    else:
        st = RankStream(spec, rank, hosts=hosts, stage_rows=stage_bound(spec, hosts), comm=comm)
        st.start()
        h = hashlib.blake2b(digest_size=8)
        spe = run.steps_per_epoch
        for e in range(run.epochs):
            w = st.window(e * spe)
            me = w.parts[0].rank(rank)
            acc += me.sample.size
            _digest(h, me)
        fp = h.hexdigest()
    t1, c1 = time.perf_counter(), time.process_time()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = {"rank": rank, "seconds": round(t1 - t0, 2), "cpu_seconds": round(c1 - c0, 2),
           "rss_growth_mib": round((peak - base) / 1024, 1), "peak_rss_mib": round(peak / 1024, 1),
           **_smaps(), "accesses": int(acc)}  # fmt: skip
    if fp:
        out["service_digest"] = fp
    if comm is not None:
        every = comm.gather(out, root=0)
        if a.which == "once":
            st.close()
        if rank == 0:
            print(json.dumps(every))
    else:
        print(json.dumps([out]))


def _run(a, which: str, local: int) -> list[dict]:
    args = [str(HERE), "child", "--which", which, "--graph", a.graph, "--local", str(local),
            "--epochs", str(a.epochs), "--batch", str(a.batch),
            "--buffer", str(a.buffer)]  # fmt: skip
    cmd = [sys.executable, *args]
    if which in ("once", "ranks"):
        cmd = [str(Path(sys.executable).with_name("mpiexec")), "-n", str(local), *cmd]
    res = subprocess.run(cmd, capture_output=True, text=True, env=os.environ, timeout=3600)
    if res.returncode:
        raise SystemExit(f"{which} L={local}: {res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", nargs="?", default="run", choices=["run", "child"])
    ap.add_argument("--graph", required=True)
    ap.add_argument("--ranks", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--local", type=int, default=1)
    ap.add_argument("--which", choices=["rank", "ranks", "every", "once"], default="rank")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--buffer", type=float, default=0.1)
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.what == "child":
        return child(a)
    result: dict = {"command": " ".join(["python", "bench/node_plan_cost.py", *sys.argv[1:]]),
                    "graph": a.graph, "epochs": a.epochs, "batch": a.batch,
                    "buffer": a.buffer}  # fmt: skip
    for local in a.ranks:
        rank = _run(a, "rank", local)[0]
        ranks = _run(a, "ranks", local)
        every = _run(a, "every", local)[0]
        once = _run(a, "once", local)
        lead, others = once[0], once[1:]
        # The plan is a pure function of the inputs: each rank's service received from local
        # rank 0 equals the one a process planning the whole host makes for it.
        agree = [r["service_digest"] for r in once] == every["service_digest"]

        def ratio(x: dict, k: str, rank: dict = rank) -> float:
            return round(x[k] / max(0.01, rank[k]), 2)

        row = {
            "rank_alone": rank, "every_rank_plans": every, "once_per_host": once,
            "every_seconds_ratio": ratio(every, "seconds"),
            "every_cpu_ratio": ratio(every, "cpu_seconds"),
            "every_rss_growth_ratio": ratio(every, "rss_growth_mib"),
            "planner_rank_seconds_ratio": ratio(lead, "seconds"),
            "planner_rank_cpu_ratio": ratio(lead, "cpu_seconds"),
            "planner_rank_rss_growth_ratio": ratio(lead, "rss_growth_mib"),
            "other_ranks_cpu_ratio_max": max((ratio(r, "cpu_seconds") for r in others), default=0),
            "other_ranks_rss_growth_ratio_max": max(
                (ratio(r, "rss_growth_mib") for r in others), default=0),
            "host_cpu_ratio_once_vs_every": round(
                sum(r["cpu_seconds"] for r in once) / max(0.01, local * every["cpu_seconds"]), 3),
            # Side by side: every local rank planning its own trace at once (share="rank"
            # in a job), on the same cores as the host's ranks planning its node plan.
            "per_rank_side_by_side": ranks,
            "node_over_per_rank_side_by_side_cpu_max": round(
                max(r["cpu_seconds"] for r in once) / max(r["cpu_seconds"] for r in ranks), 2),
            "node_over_per_rank_side_by_side_rss_growth_max": round(
                max(r["rss_growth_mib"] for r in once)
                / max(r["rss_growth_mib"] for r in ranks), 2),
            "union_over_rank_accesses": round(every["accesses"] / max(1, rank["accesses"]), 2),
            "services_equal_to_every_rank_planning": agree,
        }  # fmt: skip
        result[f"L={local}"] = row
        print(json.dumps({f"L={local}": row}, indent=1), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""One buffer per node (issue 35): planned storage reads of per-rank buffers (C/P each) against
one node buffer (C), and the node plan's planning cost.

    python bench/node_bench.py gnn [--nodes 1000000 --world 4 --epochs 3 --buffer 0.1]
        [--model block|chung-lu]
    python bench/node_bench.py weighted [--nodes 1000000 --world 4 --epochs 3 --buffer 0.1]
    python bench/node_bench.py shuffle [--nodes 100000 --world 4 --batch 32 --epochs 5]
    python bench/node_bench.py cost [--nodes 1000000 --world 8 --epochs 2 --graph G.h5]
    python bench/node_bench.py all --out bench/results/node-plan.json   (the four above)

No I/O: planned figures (the plans the Loader executes). ``gnn``: ``--model block`` (the
default) is ``solar gen --preset graph``'s degree-corrected block model (8 communities,
homophily 0.8); ``--model chung-lu`` the power-law Chung–Lu graph the issue's simulation used
(symmetric, ids randomly relabelled); both: average degree 20, weights ∝ (1+i)^-0.5, 10 %
training nodes, ``NeighborSampler(fanouts (10, 5), 1024 seeds per rank)``, features F=256
float32 (1 KiB rows: 4 per 4 KiB page) for page mates.
Per-rank: each rank plans its own trace with C/P rows (today's plan). Node: one host of P ranks,
Belady over their union with C rows; a row several local ranks need at a step is read once.
Rows read = served accesses that are not hits (page mates: the side rows ride the same pages,
counted apart). Hit rate = hits / accesses, over each plan's own accesses (a rank's batch's
distinct rows; the node's union).

``weighted``: ``Weighted`` with replacement, weights Zipf 0.6 over a random order, local batch
1024, per-rank buffers with and without affinity against one node buffer. ``shuffle``: equal
local batches (slack 0.25, the default), hits against the bound, rows moved between ranks
(per-rank plan:
equal batches' transfers; node plan: none within a host, the hosts' surplus across).

``cost``: seconds (wall and CPU: the CPU figures hold on a loaded machine) and peak RSS of
planning one host of ``--world`` ranks (its union, planned by
:class:`HostPlanner(only_host=0)`) against planning one rank's trace alone
(``Planner(only_rank=0)``), each in a fresh process; sampling (the host's: all its ranks'
subgraphs) and planning timed apart.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from solar import BufferConfig, NeighborSampler, PlanSpec, RunConfig
from solar.schedule.draw.pagemates import PageLayout
from solar.schedule.draw.samplers import SHUFFLE, Weighted, sampler_run
from solar.schedule.keep.grouping import Hosts
from solar.schedule.keep.hostequal import host_transfer
from solar.schedule.keep.hostplan import HostPlanner
from solar.schedule.keep.planner import Planner
from solar.schedule.policy import HIT, SIDE, THIT

PAGES = PageLayout(0, 256 * 4)  # F=256 float32 rows, 4 KiB pages


def chung_lu(n: int, degree: float, seed: int = 0, alpha: float = 0.5) -> dict[str, np.ndarray]:
    """The issue's graph model: a symmetric Chung–Lu graph (each of N·D/2 edges joins two
    endpoints drawn in proportion to ``(1 + i) ** -alpha``; self-loops and repeats dropped),
    ids randomly relabelled, 10 % of the nodes for training; as ``Graph`` parts."""
    rng = np.random.default_rng([seed, 21])
    w = (1.0 + np.arange(n)) ** -alpha
    cdf = np.cumsum(w / w.sum())
    cdf[-1] = 1.0
    m = round(n * degree / 2)
    ends = np.searchsorted(cdf, rng.random(2 * m), side="right")
    relabel = rng.permutation(n)
    u, v = relabel[ends[:m]], relabel[ends[m:]]
    keep = u != v
    key = np.unique(np.concatenate([u[keep] * n + v[keep], v[keep] * n + u[keep]]))
    src, dst = np.divmod(key, n)  # sorted by source: rows of sources (symmetric: = targets)
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=indptr[1:])
    train = np.sort(rng.permutation(n)[: max(1, n // 10)])
    return {"indptr": indptr, "indices": dst.astype(np.int32), "train_idx": train}


def graph_sampler(nodes: int, degree: float, batch: int, seed: int = 0,
                  model: str = "block") -> NeighborSampler:  # fmt: skip
    """fanouts (10, 5) over solar's generated graph (solar gen --preset graph; one feature
    column: only the topology is sampled), kept in the system's temporary directory; or over
    the Chung–Lu graph (``model="chung-lu"``, in memory)."""
    from solar.graph import generate_graph

    if model == "chung-lu":
        return NeighborSampler(chung_lu(nodes, degree, seed), (10, 5), batch)

    path = Path(tempfile.gettempdir()) / f"solar-node-bench-{nodes}-{degree}-{seed}.h5"
    if not path.exists():
        generate_graph(path, nodes, degree, 1, seed=seed, train_fraction=0.1)
    return NeighborSampler(str(path), (10, 5), batch)


def _count(flags: np.ndarray) -> dict[str, int]:
    served = (flags & SIDE) == 0
    hit = (flags & (HIT | THIT)) != 0
    return {"accesses": int(served.sum()), "hits": int((hit & served).sum()),
            "reads": int((~hit & served).sum()), "side": int((~served).sum())}  # fmt: skip


def _add(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: a.get(k, 0) + v for k, v in b.items()}


def per_rank(spec: PlanSpec) -> dict:
    """Today's plan: every rank its own buffer."""
    p, tot, t0 = Planner(spec), {}, time.perf_counter()
    for _ in range(spec.run.epochs):
        tot = _add(tot, _count(p.next_all().flags))
    return _figures(tot, spec.run.epochs, time.perf_counter() - t0)


def per_node(spec: PlanSpec, hosts: Hosts) -> dict:
    """One buffer per host (the rank spec's buffer times the ranks per host)."""
    p, tot, t0 = HostPlanner(spec, hosts), {}, time.perf_counter()
    moved = within = 0
    for _ in range(spec.run.epochs):
        ne = p.next()
        tot = _add(tot, _count(ne.host.flags))
        if spec.equal_batches:  # what the Loader's exchange moves: each rank's transfer
            counts = np.diff(ne.ranks.step_offsets, axis=1)  # (P, steps)
            for t in range(counts.shape[1]):
                tr = [host_transfer(ne.ranks.step_offsets, t, r, hosts.count)
                      for r in range(spec.run.world_size)]  # fmt: skip
                if tr[0] is None:
                    continue
                m = np.stack([x.send for x in tr])
                for g in hosts.groups:
                    within += int(m[np.ix_(g, g)].sum())
                moved += int(m.sum())
    out = _figures(tot, spec.run.epochs, time.perf_counter() - t0)
    if spec.equal_batches:
        out["rows_moved_within_hosts"] = within  # (0: a host's rows are dealt in place)
        out["rows_moved_across_hosts"] = moved - within
    return out


def _figures(tot: dict[str, int], epochs: int, seconds: float) -> dict:
    rate = round(tot["hits"] / max(1, tot["accesses"]), 4)
    return {
        **tot,
        "hit_rate": rate,
        "reads_per_epoch": tot["reads"] / epochs,
        "plan_seconds": round(seconds, 2),
    }


def _spec(run, capacity, sampler, pages=None, equal=False) -> PlanSpec:
    return PlanSpec(run, BufferConfig(capacity, 0.25), sampler=sampler,
                    pages=pages, equal_batches=equal)  # fmt: skip


def gnn(a) -> dict:
    t0 = time.perf_counter()
    s = graph_sampler(a.nodes, a.degree, a.batch, model=a.model)
    build = time.perf_counter() - t0
    n, world = a.nodes, a.world
    run = sampler_run(s, n, world, a.batch, a.epochs)
    c = int(a.buffer * n)
    out: dict = {"model": a.model, "graph_seconds": round(build, 1)}
    for name, pages in (("rows", None), ("page_mates", PAGES)):
        rank = per_rank(_spec(run, c // world, s, pages))
        node = per_node(_spec(run, c // world, s, pages), Hosts.grid(1, world))
        out[name] = {"per_rank": rank, "node": node,
                     "fewer_reads": round(rank["reads"] / max(1, node["reads"]), 3)}  # fmt: skip
    return out


def weighted(a) -> dict:
    n, world = a.nodes, a.world
    rng = np.random.default_rng(7)
    w = ((1.0 + np.arange(n)) ** -0.6)[rng.permutation(n)]
    run = RunConfig(n, world, a.batch, a.epochs, 0)
    c = int(a.buffer * n)
    out: dict = {}
    for aff in (True, False):
        s = Weighted(w, affinity=aff)
        rank = per_rank(_spec(run, c // world, s))
        node = per_node(_spec(run, c // world, s), Hosts.grid(1, world))
        fewer = round(rank["reads"] / max(1, node["reads"]), 3)
        out[f"affinity={aff}"] = {"per_rank": rank, "node": node, "fewer_reads": fewer}
    return out


def shuffle(a) -> dict:
    n, world = a.nodes, a.world
    run = RunConfig(n, world, a.batch, a.epochs, 0)
    out: dict = {}
    for share in (0.1, 0.5):
        c = int(share * n)
        spec = _spec(run, c // world, SHUFFLE, equal=True)
        rank = per_rank(spec)
        p = Planner(spec)
        moved = 0
        for _ in range(run.epochs):
            ep = p.next_all()
            counts = np.diff(ep.step_offsets, axis=1)
            moved += int(np.maximum(counts - run.batch_size, 0).sum())
        rank["rows_moved"] = moved
        row = {"bound": round(spec.bound, 4), "per_rank": rank}
        for grid in ((1, world), (2, world // 2)):
            node = per_node(spec, Hosts.grid(*grid))
            node["of_bound"] = round(node["hit_rate"] / spec.bound, 4)
            row[f"node {grid[0]}x{grid[1]}"] = node
        rank["of_bound"] = round(rank["hit_rate"] / spec.bound, 4)
        out[f"buffer {share:.0%}"] = row
    return out


def _cost_child(a) -> None:
    if a.graph:  # a graph file (solar gen --preset graph): not generated again per process
        s = NeighborSampler(a.graph, (10, 5), a.batch)
        a.nodes = s.graph.num_nodes
    else:
        s = graph_sampler(a.nodes, a.degree, a.batch)
    run = sampler_run(s, a.nodes, a.world, a.batch, a.epochs)
    spec = _spec(run, int(a.buffer * a.nodes) // a.world, s)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Sampling first, timed apart (each rank samples its own subgraphs to train on anyway;
    # a host's union needs all of its ranks'), then planning from the draws kept.
    t0, c0 = time.perf_counter(), time.process_time()
    if a.which == "rank":
        kept = {e: s.rank_epoch(run, e, 0) for e in range(run.epochs)}
        s.rank_epoch = lambda run_, e, r: kept[e]  # type: ignore[method-assign]
    else:
        q = HostPlanner(spec, Hosts.grid(1, a.world), only_host=0)
        for e in range(run.epochs):  # kept by the HostSampler (its last four)
            q.host_spec.sampler.rank_draws(e, 0)  # type: ignore[attr-defined]
    t1, c1 = time.perf_counter(), time.process_time()
    if a.which == "rank":
        p = Planner(spec, only_rank=0)
        acc = sum(p.next_rank(0).sample.size for _ in range(run.epochs))
    else:
        acc = sum(q.next().host.sample.size for _ in range(run.epochs))
    t2, c2 = time.perf_counter(), time.process_time()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = {"sample_seconds": round(t1 - t0, 2), "plan_seconds": round(t2 - t1, 2),
           "seconds": round(t2 - t0, 2), "sample_cpu_seconds": round(c1 - c0, 2),
           "plan_cpu_seconds": round(c2 - c1, 2), "peak_rss_mib": round(peak / 1024, 1),
           "rss_growth_mib": round((peak - base) / 1024, 1), "accesses": acc}  # fmt: skip
    print(json.dumps(out))


def cost(a) -> dict:
    out = {}
    for which in ("rank", "node"):
        cmd = [sys.executable, __file__, "cost-child", "--which", which, "--nodes", str(a.nodes),
               "--world", str(a.world), "--epochs", str(a.epochs), "--batch", str(a.batch),
               "--buffer", str(a.buffer), "--degree", str(a.degree)]  # fmt: skip
        cmd += ["--graph", a.graph] if a.graph else []
        res = subprocess.run(cmd, capture_output=True, text=True, check=True, env=os.environ)
        out[which] = json.loads(res.stdout.strip().splitlines()[-1])
    out["seconds_ratio"] = round(out["node"]["seconds"] / out["rank"]["seconds"], 2)
    for k in ("sample_cpu_seconds", "plan_cpu_seconds"):
        out[k.replace("seconds", "ratio")] = round(out["node"][k] / max(0.01, out["rank"][k]), 2)
    out["plan_seconds_ratio"] = round(out["node"]["plan_seconds"]
                                      / max(0.01, out["rank"]["plan_seconds"]), 2)  # fmt: skip
    out["rss_growth_ratio"] = round(out["node"]["rss_growth_mib"]
                                    / max(1.0, out["rank"]["rss_growth_mib"]), 2)  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["gnn", "weighted", "shuffle", "cost", "cost-child", "all"])
    ap.add_argument("--nodes", type=int)
    ap.add_argument("--world", type=int)
    ap.add_argument("--epochs", type=int)
    ap.add_argument("--batch", type=int)
    ap.add_argument("--buffer", type=float, default=0.1)
    ap.add_argument("--degree", type=float, default=20.0)
    ap.add_argument(
        "--model",
        choices=["block", "chung-lu"],
        default="block",
        help="gnn: the graph model (see above)",
    )
    ap.add_argument("--which", choices=["rank", "node"], default="node")
    ap.add_argument("--graph", help="cost: a graph file to sample (else generated per process)")
    ap.add_argument("--out")
    a = ap.parse_args()
    defaults = {"gnn": (10**6, 4, 3, 1024), "weighted": (10**6, 4, 3, 1024),
                "shuffle": (10**5, 4, 5, 32), "cost": (10**6, 8, 2, 1024),
                "cost-child": (10**6, 8, 2, 1024)}  # fmt: skip
    if a.what == "cost-child":
        _fill(a, defaults["cost-child"])
        return _cost_child(a)
    todo = ["gnn", "weighted", "shuffle", "cost"] if a.what == "all" else [a.what]
    result: dict = {"command": " ".join(["python", "bench/node_bench.py", *sys.argv[1:]])}
    given = (a.nodes, a.world, a.epochs, a.batch)
    for w in todo:
        a.nodes, a.world, a.epochs, a.batch = given
        _fill(a, defaults[w])
        t0 = time.perf_counter()
        result[w] = {"nodes": a.nodes, "world": a.world, "epochs": a.epochs, "batch": a.batch,
                     "buffer": a.buffer, **globals()[w](a)}  # fmt: skip
        print(f"{w}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        print(json.dumps({w: result[w]}, indent=1), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")


def _fill(a, d) -> None:
    for name, v in zip(("nodes", "world", "epochs", "batch"), d, strict=True):
        if getattr(a, name) is None:
            setattr(a, name, v)


if __name__ == "__main__":
    main()

"""Fingerprints of the node plans (one buffer per host) and of what a node Loader serves, to
show a change leaves every decision alone, byte for byte, with its reads.

    PYTHONPATH=. python bench/node_plan_hashes.py > after.txt
    git worktree add /tmp/base <commit>
    PYTHONPATH=/tmp/base python bench/node_plan_hashes.py > before.txt
    diff before.txt after.txt   # empty: the same plans, the same service

(``--no-launch``: the in-process plans only.) One line per case, sorted: a name and hashes.

* ``plan ...``: the whole node plan in process (:class:`HostPlanner`) of groupings 1x4, 2x2
  and 3,1 (hosts of 3 and 1 ranks) for Shuffle (with and without equal batches), Weighted
  with affinity, Weighted(affinity=False), a NeighborSampler on a small generated graph and
  a Trace; with and without a tier, page mates where they apply, sizes that do not divide;
  3 epochs. Per case: a hash of every array of every epoch (the hosts' plan, every rank's
  service: samples, slots, flags, tier slots, step offsets; who reads each row, and its host
  access) and one of ``host_totals``; a grouping the planner refuses is ``refused: why``.
* ``run ...``: a Loader with ``share="node"`` run as every rank under ``mpiexec -n 4`` and
  ``torchrun --nproc_per_node 4`` (groupings via ``SOLAR_HOSTS``), on a small dataset and
  on a small graph (NeighborSampler: the host buffer planned in parts). Per rank and case:
  a hash of the ids served at every step of every epoch, in order, and one of every step's
  counters (``loader.stats.steps``: hits, reads, side_reads, tier_hits, tier_writes, sent,
  received), with their totals. Each rank writes its lines to a file of its own; the driver
  joins them. A configuration refused at construction ends its job (the Loader aborts every
  rank): the case is ``refused: why`` and the cases listed after it in that job are not run
  (``not run``). The 3,1 grouping is refused under torchrun today (no host communicator).

The construction of planners and Loaders is in one function each (:func:`node_planners`,
:func:`make_loader`): an API renamed later is fixed there.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from solar import BufferConfig, PlanSpec, Shuffle, Trace, Weighted
from solar.errors import SolarError

GROUPINGS = ("1x4", "2x2", "3,1")
EPOCHS = 3
WORLD = 4
# Loader cases run as every rank: the refused ones of 3,1 last (a refusal ends the job).
RUN_CASES = ("weighted", "graph", "weighted-tier", "shuffle", "shuffle-equal")
FOREIGN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SOLAR_LAUNCHER",
           "SOLAR_HOSTS")  # fmt: skip
FOREIGN_PREFIXES = ("SLURM_", "PMI_", "OMPI_", "TORCHELASTIC_", "MPI_")
BIN = Path(sys.executable).parent


def arr_hash(h, a) -> None:
    a = np.ascontiguousarray(a)
    h.update(f"{a.dtype.str}{a.shape}".encode())
    h.update(a.tobytes())


def skewed(n: int, affinity: bool) -> Weighted:
    """Weights ``(1 + i) ** -0.8`` in a fixed shuffled order: draws repeat within and across
    ranks' batches (tests/helpers.py's ``skewed_weighted``)."""
    weights = (1.0 + np.arange(n)) ** -0.8
    return Weighted(weights[np.random.default_rng(1).permutation(n)], affinity=affinity)


def trace_batch(epoch: int, step: int, rank: int) -> np.ndarray:
    """A Trace's batch: lengths vary, ids repeat within and across ranks."""
    rng = np.random.default_rng([epoch, step, rank, 7])
    return (rng.zipf(1.3, 5 + (step + rank) % 4) * 13) % 997


def make_graph(path: Path) -> Path:
    from solar.graph import generate_graph

    generate_graph(path, 997, 6.0, 5, seed=3, train_fraction=0.3)
    return path


# -- in process: the node planner ----------------------------------------------------------


def node_planners(spec: PlanSpec, hosts_text: str) -> list:
    """The planners of ``spec``'s node plan on ``hosts_text``: one for all hosts, or one per
    host where hosts differ in size (each is planned alone)."""
    from solar.schedule.keep.grouping import Hosts
    from solar.schedule.keep.hostplan import HostPlanner

    hosts = Hosts.parse(hosts_text, spec.run.world_size)
    alone = [None] if hosts.uniform else list(range(hosts.count))
    return [HostPlanner(spec, hosts, only_host=h) for h in alone]


def node_totals_of(spec: PlanSpec, hosts_text: str) -> dict:
    from solar.schedule.keep.grouping import Hosts
    from solar.schedule.keep.hostplan import host_totals

    totals = host_totals(spec, Hosts.parse(hosts_text, spec.run.world_size))
    # A HostTotals record since tier hits are counted (a dict before): its fields but
    # tier_hits, which earlier commits lack, hashed alike.
    out = totals.as_dict() if hasattr(totals, "as_dict") else dict(totals)
    out.pop("tier_hits", None)
    return out


def plan_specs(graph: Path):
    """(name, spec) of every in-process case (per rank buffers; the planner aggregates them)."""
    from solar.graph.neighbor import NeighborSampler
    from solar.io.sources import describe_source
    from solar.runtime.setup import page_layout
    from solar.schedule.draw.pagemates import PageLayout
    from solar.schedule.draw.samplers import sampler_run

    def spec(n, b, sampler, cap, tier=0, slack=0.0, equal=False, pages=None, drop=False):
        run = sampler_run(sampler, n, WORLD, b, EPOCHS, seed=5, drop_last=drop)
        return PlanSpec(run, BufferConfig(cap, slack, tier), sampler=sampler,
                        equal_batches=equal, pages=pages)  # fmt: skip

    pages = PageLayout(40, 24, 256)  # rows of 24 bytes past a 40-byte header, 256-byte pages
    for tier in (0, 15):
        for equal in (False, True):
            yield f"shuffle-t{tier}-eq{int(equal)}", spec(997, 7, Shuffle(), 23, tier, 0.25, equal)
        yield f"weighted-aff-t{tier}", spec(997, 7, skewed(997, True), 23, tier, 0.25)
        yield f"weighted-fixed-t{tier}", spec(997, 7, skewed(997, False), 23, tier, drop=True)
        yield f"trace-t{tier}", spec(997, 7, Trace(trace_batch, 9, "nph.trace"), 4, tier)
    yield "weighted-fixed-pages", spec(997, 7, skewed(997, False), 23, pages=pages)
    yield "trace-pages", spec(997, 7, Trace(trace_batch, 9, "nph.trace"), 4, pages=pages)
    sampler = NeighborSampler(str(graph), (4, 2), batch_size=13)
    layout = page_layout(describe_source(str(graph), ["features"]))
    yield "neighbor-pages", spec(997, 13, sampler, 25, pages=layout)
    yield "neighbor-t10", spec(997, 13, sampler, 25, 10)


def hash_node_plan(spec: PlanSpec, hosts_text: str) -> str:
    """Hashes of every epoch's arrays (every planner's) and of the run's totals."""
    planners = node_planners(spec, hosts_text)
    h = hashlib.sha256()
    accesses = 0
    for _ in range(spec.run.epochs):
        for p in planners:
            ne = p.next()
            for ep in (ne.host, ne.ranks):
                for a in (ep.rank_offsets, ep.step_offsets, ep.sample, ep.slot, ep.flags,
                          ep.tslot):  # fmt: skip
                    arr_hash(h, a)
            arr_hash(h, ne.reader)
            arr_hash(h, ne.at)
            accesses += ne.ranks.sample.size
    totals = node_totals_of(spec, hosts_text)
    th = hashlib.sha256(json.dumps(totals, sort_keys=True).encode()).hexdigest()[:16]
    return (f"epochs={h.hexdigest()[:16]} totals={th} rank_accesses={accesses} "
            f"reads={totals['reads']} hits={totals['hits']} side={totals['side_reads']} "
            f"peer={totals['peer_rows']}")  # fmt: skip


def plan_lines(graph: Path) -> list[str]:
    out = []
    for name, spec in plan_specs(graph):
        for grouping in GROUPINGS:
            try:
                got = hash_node_plan(spec, grouping)
            except SolarError as exc:
                got = f"refused: {exc}"
            out.append(f"plan {grouping} {name} fp={spec.fingerprint[:12]} {got}")
    return out


# -- under launchers: the Loader, run as every rank ----------------------------------------


def make_loader(case: str, comm, data: str, graph: str, tier: str):
    """The Loader of run case ``case`` (share="node"; hosts from SOLAR_HOSTS)."""
    from solar import ExpertConfig, Loader, MemoryConfig, PlanningConfig
    from solar.graph.neighbor import NeighborSampler

    tiered = dict(tier=tier, tier_size="5%") if case == "weighted-tier" else {}
    kw = dict(epochs=EPOCHS, comm=comm, seed=5, expert=ExpertConfig(warm=False),
              memory=MemoryConfig(share="node", **tiered),
              planning=PlanningConfig(equal_batches=case == "shuffle-equal"))  # fmt: skip
    if case == "graph":
        return Loader(graph, ["features"], buffer=100,
                      sampler=NeighborSampler(graph, (4, 2), batch_size=13), **kw)  # fmt: skip
    if case.startswith("weighted"):
        return Loader(data, ["x"], batch_size=12, buffer="10%", sampler=skewed(600, False), **kw)
    return Loader(data, ["x"], batch_size=11, buffer="10%", sampler=Shuffle(), **kw)


COUNTERS = ("hits", "reads", "side_reads", "tier_hits", "tier_writes", "sent", "received")


def run_case(case: str, comm, data: str, graph: str, tier: str) -> str:
    """What this rank served in case ``case``, hashed: ids at every step, then counters."""
    ld = make_loader(case, comm, data, graph, tier)
    served, steps = hashlib.sha256(), 0
    for e in range(EPOCHS):
        ld.set_epoch(e)
        for t, b in enumerate(ld):
            ids = b["n_id"] if "n_id" in b else b["index"]
            served.update(f"{e},{t}:".encode())
            arr_hash(served, ids.numpy().astype(np.int64))
            steps += 1
    rows = [[s.epoch, s.step, s.batch, *(getattr(s, c) for c in COUNTERS)]
            for s in ld.stats.steps]  # fmt: skip
    ld.close()
    counted = hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]
    sums = " ".join(f"{c}={sum(getattr(s, c) for s in ld.stats.steps)}" for c in COUNTERS)
    return f"served={served.hexdigest()[:16]} steps={steps} counters={counted} {sums}"


def rank_main(argv: list[str]) -> None:
    """As every rank: ``--rank LAUNCHER OUTDIR DATA GRAPH TIERDIR GROUPINGS CASES`` (lists
    comma-separated, groupings by ``+``); lines written to OUTDIR/rank-R.txt as cases end."""
    from solar import dist

    launcher, outdir, data, graph, tierdir, groupings, cases = argv
    d = dist.init()
    rank = d.rank
    with open(Path(outdir) / f"rank-{rank}.txt", "a") as out:
        for grouping in groupings.split("+"):
            os.environ["SOLAR_HOSTS"] = grouping
            tier = os.path.join(tierdir, grouping.replace(",", "+"))
            os.makedirs(tier, exist_ok=True)
            for case in cases.split(","):
                got = run_case(case, d.comm, data, graph, tier)
                out.write(f"run {launcher} {grouping} {case} rank={rank} {got}\n")
                out.flush()


def launch(launcher: str, tmp: Path, data: Path, graph: Path, groupings: list[str],
           cases: tuple[str, ...]) -> list[str]:  # fmt: skip
    """Run :func:`rank_main` on 4 ranks under ``launcher``; its ranks' lines, a refused case's
    reason and the cases after it."""
    outdir = Path(tempfile.mkdtemp(dir=tmp))
    tierdir = Path(tempfile.mkdtemp(dir=tmp))
    argv = [__file__, "--rank", launcher, str(outdir), str(data), str(graph), str(tierdir),
            "+".join(groupings), ",".join(cases)]  # fmt: skip
    if launcher == "mpiexec":
        cmd = [str(BIN / "mpiexec"), "-n", str(WORLD), sys.executable, *argv]
    else:
        cmd = [str(BIN / "torchrun"), "--standalone", "--nproc_per_node", str(WORLD), *argv]
    env = {k: v for k, v in os.environ.items()
           if k not in FOREIGN and not k.startswith(FOREIGN_PREFIXES)}  # fmt: skip
    env["OMP_NUM_THREADS"] = "1"
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    lines = [x for f in sorted(outdir.glob("rank-*.txt")) for x in f.read_text().splitlines()]
    done = {(x.split()[2], x.split()[3]) for x in lines}
    want = [(g, c) for g in groupings for c in cases]
    missing = [gc for gc in want if sum(1 for x in lines if tuple(x.split()[2:4]) == gc) < WORLD]
    if res.returncode == 0 and not missing:
        return lines
    why = sorted({x.split("error: ", 1)[1] for x in res.stderr.splitlines()
                  if x.startswith("solar: rank ") and "error: " in x})  # fmt: skip
    if not why:
        raise SystemExit(f"{' '.join(cmd)}: exit {res.returncode}\n{res.stderr[-3000:]}")
    first = missing[0]
    lines = [x for x in lines if tuple(x.split()[2:4]) not in missing]
    lines.append(f"run {launcher} {first[0]} {first[1]} refused: {' | '.join(why)}")
    lines += [f"run {launcher} {g} {c} not run" for g, c in missing[1:] if (g, c) not in done]
    return lines


def run_lines(tmp: Path) -> list[str]:
    import h5py

    x = np.random.default_rng(0).integers(0, 2**31, (600, 24), dtype=np.int64)
    data = tmp / "d.h5"
    with h5py.File(data, "w") as f:
        f["x"] = x
    graph = tmp / "g.h5"
    make_graph(graph)
    out = []
    for launcher in ("mpiexec", "torchrun"):
        out += launch(launcher, tmp, data, graph, ["1x4", "2x2"], RUN_CASES)
        out += launch(launcher, tmp, data, graph, ["3,1"], RUN_CASES)
    return out


def main() -> None:
    if sys.argv[1:2] == ["--rank"]:
        rank_main(sys.argv[2:])
        return
    with tempfile.TemporaryDirectory() as tmp:
        graph = make_graph(Path(tmp) / "plan-graph.h5")
        lines = plan_lines(graph)
        if "--no-launch" not in sys.argv:
            lines += run_lines(Path(tmp))
    text = "\n".join(sorted(lines))
    print(text)
    print("ALL", hashlib.sha256(text.encode()).hexdigest())


if __name__ == "__main__":
    main()

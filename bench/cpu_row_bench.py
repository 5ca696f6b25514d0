"""CPU per served row (issue 47): a GNN Loader's epochs from the page cache, in rows per
CPU-second of this process (every thread), beside ``np.take`` and ``torch.index_select`` of
the same rows.

    solar gen --preset graph --nodes 1000000 /tmp/g1m.h5        # F = 256: 1 KiB rows
    flock /tmp/solar-bench.lock python bench/cpu_row_bench.py compare /tmp/g1m.h5 \\
        --base /tmp/cpurow-base [--runs 3 --epochs 3] [--json out.json]
    python bench/cpu_row_bench.py run /tmp/g1m.h5 [--epochs 3 --stages]    # one run, this tree

``run``: one rank (P = 1) of ``Loader(graph, ["features"], sampler=NeighborSampler(fanouts
(10, 5), batch 1024), buffer 10 %)`` (its defaults otherwise, but reading through the page
cache: ``ReaderConfig(direct_io=False)``) for ``--epochs`` epochs, the features read once
before so that every read is a page-cache hit. Timed: process CPU seconds
(``time.process_time``: all threads) from the Loader's construction to its last batch, and
per epoch; a row is a served feature row (``n_id``'s length summed over the batches). Also
the Loader's own ``stats.bottleneck()`` and per-stage figures, and two references on the
rows of one epoch: ``np.take`` and ``torch.index_select`` from the features in memory (rows
per CPU-second of the gather alone).

``compare``: ``run`` in fresh processes under two trees (``--base``: a checkout of another
commit, e.g. ``git worktree add /tmp/base d98193d``; and this tree), alternated, ``--runs``
each; CPU time, not wall time, so the figures hold on a shared machine.

``--cold``: the features' pages evicted before each epoch instead (buffered reads from
storage, as a dataset is read where ``O_DIRECT`` is not chosen): the figure is each epoch's
wall time (``epoch_wall_s``; epoch 0 also pays the graph's first reads).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
FANOUTS = (10, 5)


# Stages whose thread CPU ``--stages`` accounts (exclusive: a stage nested in another is
# subtracted from it): (module, class, method).
STAGES = {
    "graph load": [("solar.graph.ingest", None, "topology")],
    "sample": [("solar.graph.neighbor", "NeighborSampler", "rank_epoch")],
    "plan": [("solar.schedule.keep.planner", "Planner", "next_schedule")],
    "plan: trace": [("solar.schedule.draw.traces", "TraceOrder", "_trace")],
    "plan: next uses": [("solar.schedule.draw.traces", "TraceOrder", "_window")],
    "plan: belady": [("solar.schedule.keep.belady", "TracePolicy", "_plan")],
    "step plan": [("solar.runtime.steps", "Steps", "plan")],
    "step plan: in_batch": [("solar.schedule.plans.rankplan", "StepPlan", "in_batch")],
    "read: tasks": [("solar.io.reader", "Reader", "submit")],
    "read: preadv": [("solar.io.executor", "Executor", "_job")],
    "buffer gather": [("solar.runtime.holdings", "Holdings", "gather")],
    "buffer settle": [("solar.runtime.holdings", "Holdings", "settle")],
    "delivery": [("solar.runtime.delivery", "Delivery", "batch")],
}


def _account() -> dict[str, float]:
    """Patch :data:`STAGES` to add up their thread CPU seconds (exclusive) into the result."""
    import functools
    import importlib
    import threading

    spent: dict[str, float] = dict.fromkeys(STAGES, 0.0)
    local = threading.local()

    def wrap(name, fn):
        @functools.wraps(fn)
        def timed(*a, **k):
            stack = local.__dict__.setdefault("stack", [])
            stack.append(0.0)
            t0 = time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                dt = time.thread_time() - t0
                inner = stack.pop()
                spent[name] += dt - inner
                if stack:
                    stack[-1] += dt

        return timed

    for name, where in STAGES.items():
        for mod, cls, meth in where:
            m = importlib.import_module(mod)
            owner = getattr(m, cls) if cls else m
            setattr(owner, meth, wrap(name, getattr(owner, meth)))
            if cls is None:  # a module function imported by name elsewhere
                for other in ("solar.graph.neighbor",):
                    o = importlib.import_module(other)
                    if getattr(o, meth, None) is not None:
                        setattr(o, meth, getattr(owner, meth))
    return spent


def _warm(path: str) -> None:
    """Read the file once: every later read is a page-cache hit."""
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass


def _references(path: str, n_ids: list) -> dict:
    """Rows per CPU-second of np.take / torch.index_select of ``n_ids`` from memory."""
    import h5py
    import numpy as np
    import torch

    with h5py.File(path, "r") as f:
        feats = f["features"][...]
    t = torch.from_numpy(feats)
    rows = sum(int(i.size) for i in n_ids)
    out = {}
    take = ("np_take", lambda i: np.take(feats, i, axis=0))
    select = ("index_select", lambda i: t.index_select(0, torch.from_numpy(i)))
    for name, fn in (take, select):
        c0 = time.process_time()
        for i in n_ids:
            fn(i)
        out[f"{name}_rows_per_cpu_s"] = rows / (time.process_time() - c0)
    return out


def run(args: argparse.Namespace) -> dict:
    import numpy as np

    from solar import Loader, NeighborSampler, ReaderConfig
    from solar.io.pagecache import evict

    if not args.cold:
        _warm(args.graph)
    spent = _account() if args.stages else None
    c0, t0 = time.process_time(), time.perf_counter()
    sampler = NeighborSampler(args.graph, FANOUTS, batch_size=args.batch)
    rows, epoch_cpu, epoch_wall, epoch_rows, keep = 0, [], [], [], []
    # Page-cache reads named (a neighbour sampler's default is O_DIRECT where it opens).
    with Loader(args.graph, ["features"], sampler=sampler, epochs=args.epochs,
                buffer=args.buffer, reader=ReaderConfig(direct_io=False)) as ld:  # fmt: skip
        built = time.process_time() - c0
        for e in range(args.epochs):
            if args.cold:
                evict(args.graph)  # the next reads come from storage
            ce, we, re_ = time.process_time(), time.perf_counter(), rows
            ld.set_epoch(e)
            for b in ld:
                rows += int(b["n_id"].shape[0])
                if e == 0:
                    keep.append(np.asarray(b["n_id"]).copy())
            epoch_cpu.append(time.process_time() - ce)
            epoch_wall.append(time.perf_counter() - we)
            epoch_rows.append(rows - re_)
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        stats = ld.stats
        stages = {k: v.as_dict() for k, v in stats.stages().items()}
        out = {
            "tree": os.environ.get("PYTHONPATH", ""), "epochs": args.epochs, "rows": rows,
            "cpu_s": round(cpu, 2), "wall_s": round(wall, 2), "build_cpu_s": round(built, 2),
            "rows_per_cpu_s": rows / cpu,
            "epoch_cpu_s": [round(c, 2) for c in epoch_cpu],
            "epoch_wall_s": [round(w, 2) for w in epoch_wall],
            "epoch_rows_per_cpu_s": [r / c for r, c in zip(epoch_rows, epoch_cpu, strict=True)],
            "bottleneck": str(stats.bottleneck()), "stages": stages,
            "hit_rate": stats.totals().hit_rate,
        }  # fmt: skip
    if spent is not None:
        out["stage_cpu_s"] = {k: round(v, 2) for k, v in spent.items()}
        out["stage_cpu_s"]["rest"] = round(cpu - sum(spent.values()), 2)
    if args.references:
        out.update(_references(args.graph, keep))
    return out


def compare(args: argparse.Namespace) -> dict:
    trees = {"base": str(Path(args.base).resolve()), "new": str(HERE)}
    got: dict[str, list] = {k: [] for k in trees}
    for i in range(args.runs):
        for name, tree in trees.items():
            cmd = [sys.executable, __file__, "run", args.graph, "--epochs", str(args.epochs)]
            cmd += ["--cold"] if args.cold else []
            if i == 0 and name == "new" and not args.cold:
                cmd.append("--references")
            env = dict(os.environ, PYTHONPATH=tree)
            res = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
            r = json.loads(res.stdout)
            got[name].append(r)
            print(f"{name} run {i}: {r['rows_per_cpu_s'] / 1e6:.3f}M rows/CPU-s "
                  f"({r['rows']} rows, {r['cpu_s']} CPU-s, epochs "
                  f"{[round(x / 1e6, 3) for x in r['epoch_rows_per_cpu_s']]}M, wall "
                  f"{r['epoch_wall_s']} s) {r['bottleneck']}", file=sys.stderr)  # fmt: skip
    med = {k: statistics.median(r["rows_per_cpu_s"] for r in v) for k, v in got.items()}
    return {"median_rows_per_cpu_s": med, "ratio": med["new"] / med["base"], "runs": got}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["run", "compare"])
    p.add_argument("graph")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--buffer", default="10%")
    p.add_argument("--references", action="store_true", help="run: np.take / index_select too")
    p.add_argument(
        "--stages", action="store_true", help="run: thread CPU seconds per stage (patched timers)"
    )
    p.add_argument(
        "--cold",
        action="store_true",
        help="evict the features' pages before each epoch (figure: epoch_wall_s)",
    )
    p.add_argument("--base", help="compare: the other tree")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json", help="write the result here too")
    args = p.parse_args()
    got = run(args) if args.mode == "run" else compare(args)
    text = json.dumps(got, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()

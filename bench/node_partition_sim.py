"""Would a node buffer cut into L parts, each planned alone, lose hits? (issue 35's planning
cost: one local rank planning Belady over the whole host's union costs 5.9x one rank's trace
at L=8, docs/performance.md.)

    python bench/node_partition_sim.py [--nodes 1000000 --world 8 --epochs 3 --batch 1024]
        [--buffer 0.1] [--model block|chung-lu] [--out bench/results/node-partition-sim.json]

The host's union of accesses, step by step, is taken from the node planner
(:class:`HostPlanner(only_host=0)`, no page mates, no tier); then Belady with bypass at step
granularity (a step's hits first, their keys become their next uses; a read is kept if used
sooner than the farthest held row of its part, else bypassed) is replayed over it here, with
the C slots whole (parts=1: must equal the planner's hits, which checks this replay) and cut
into ``parts`` independent buffers of C/parts slots, a row's part chosen by its id (``row``:
row mod parts) or by its 4 KiB page (``page``: (row // 4) mod parts, so a page's rows share a
part and page mates stay possible). Each part sees only its rows' accesses: a part is what
one local rank would plan alone, about union / L accesses. No I/O, no timing in the result
(the replay is a simulation, not solar's planner).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from numba import njit

sys.path.insert(0, str(Path(__file__).resolve().parent))

from node_bench import graph_sampler

from solar import BufferConfig, PlanSpec
from solar.schedule.draw.samplers import sampler_run
from solar.schedule.keep.grouping import Hosts
from solar.schedule.keep.hostplan import HostPlanner
from solar.schedule.policy import HIT

NEVER = np.int64(1) << 62


@njit(cache=True)
def _down(key, heap, pos, base, i, m):
    while True:
        lo, big = 2 * i + 1, i
        if lo < m and key[heap[base + lo]] > key[heap[base + big]]:
            big = lo
        if lo + 1 < m and key[heap[base + lo + 1]] > key[heap[base + big]]:
            big = lo + 1
        if big == i:
            return
        a, b = heap[base + i], heap[base + big]
        heap[base + i], heap[base + big] = b, a
        pos[b], pos[a] = i, big
        i = big


@njit(cache=True)
def _up(key, heap, pos, base, i):
    while i > 0:
        p = (i - 1) // 2
        if key[heap[base + p]] >= key[heap[base + i]]:
            return
        a, b = heap[base + i], heap[base + p]
        heap[base + i], heap[base + p] = b, a
        pos[b], pos[a] = i, p
        i = p


@njit(cache=True)
def replay(seq, nu, bounds, part, parts, cap, n):
    """Hits of Belady with bypass over ``seq`` (steps ``bounds``), ``parts`` buffers of ``cap``
    cells each (a max-heap of next uses per part), access i in part ``part[i]``."""
    u = parts * cap
    key = np.full(u, NEVER, np.int64)
    heap = np.arange(u)
    pos = np.arange(u) % cap  # cell -> its place in its part's heap
    occ = np.full(u, -1, np.int64)
    cell = np.full(n, -1, np.int64)
    hits = 0
    for t in range(bounds.size - 1):
        for i in range(bounds[t], bounds[t + 1]):  # hits first
            c = cell[seq[i]]
            if c >= 0:
                hits += 1
                key[c] = nu[i]
                base = (c // cap) * cap
                _up(key, heap, pos, base, pos[c])
                _down(key, heap, pos, base, pos[c], cap)
        for i in range(bounds[t], bounds[t + 1]):
            x = seq[i]
            if cell[x] >= 0:
                continue
            base = part[i] * cap
            top = heap[base]
            if nu[i] < key[top]:
                if occ[top] >= 0:
                    cell[occ[top]] = -1
                occ[top], cell[x], key[top] = x, top, nu[i]
                _down(key, heap, pos, base, 0, cap)
    return hits


def union_trace(a) -> tuple[np.ndarray, np.ndarray, int, int]:
    """The host's union (step-major samples, step bounds) and the planner's hits on it."""
    s = graph_sampler(a.nodes, 20.0, a.batch, model=a.model)
    n, world = a.nodes, a.world
    run = sampler_run(s, n, world, a.batch, a.epochs)
    spec = PlanSpec(run, BufferConfig(int(a.buffer * n) // world, 0.25), sampler=s)
    planner = HostPlanner(spec, Hosts.grid(1, world), only_host=0)
    seqs, bounds, hits = [], [np.zeros(1, np.int64)], 0
    for _ in range(a.epochs):
        h = planner.next().host  # one host: its part is the whole epoch, step-major
        seqs.append(h.sample.astype(np.int64))
        bounds.append(bounds[-1][-1] + h.step_offsets[0][1:])
        hits += int(np.count_nonzero(h.flags & HIT))
    return np.concatenate(seqs), np.concatenate(bounds), hits, planner.host_spec.slots


def next_uses(seq: np.ndarray) -> np.ndarray:
    """Each access's next position of the same row (NEVER: none)."""
    nu = np.full(seq.size, NEVER, np.int64)
    order = np.lexsort((np.arange(seq.size), seq))
    same = seq[order[1:]] == seq[order[:-1]]
    nu[order[:-1][same]] = order[1:][same]
    return nu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=10**6)
    ap.add_argument("--world", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--buffer", type=float, default=0.1)
    ap.add_argument("--model", choices=["block", "chung-lu"], default="block")
    ap.add_argument("--out")
    a = ap.parse_args()
    seq, bounds, planned, cap = union_trace(a)
    nu = next_uses(seq)
    out: dict = {"command": " ".join(["python", "bench/node_partition_sim.py", *sys.argv[1:]]),
                 "nodes": a.nodes, "world": a.world, "epochs": a.epochs, "batch": a.batch,
                 "buffer": a.buffer, "model": a.model, "slots": cap,
                 "union_accesses": int(seq.size), "planner_hits": planned}  # fmt: skip
    whole = replay(seq, nu, bounds, np.zeros(seq.size, np.int64), 1, cap, a.nodes)
    if whole != planned:
        raise SystemExit(f"replay {whole} hits != planner {planned}: the replay is wrong")
    for key, of in (("row", seq), ("page", seq // 4)):
        for parts in sorted({2, 4, a.world, 2 * a.world}):
            part = of % parts
            h = replay(seq, nu, bounds, part, parts, cap // parts, a.nodes)
            sizes = np.bincount(part, minlength=parts)
            out[f"{key}/{parts}"] = {"hits": int(h), "of_whole": round(h / whole, 6),
                                     "hit_rate": round(h / seq.size, 5),
                                     "largest_part_accesses": int(sizes.max())}  # fmt: skip
    print(json.dumps(out, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""What planning a GNN epoch in windows of steps costs in hits, against the whole-epoch plan.

    python bench/window_hits.py GRAPH.h5 [--windows 1,2,5,10] [--ahead 0,1,2] [-B 128] [-P 8]
                                [-E 2] [--buffer 10%] [--planned [--pages]]

A plan made window by window (W steps at a time, when an epoch's trace does not fit) knows
next uses only up to its window's end: Belady then sees every access whose next use lies
beyond it as never used again. This simulates exactly that, in one process, with the solar
policy over the graph's NeighborSampler (fanouts 15, 10, 5; buffer ``--buffer``, 10 % of the
rows by default; page mates off, so that next uses are the one input that changes): each
epoch's next uses beyond the end of the access's window are replaced by NEVER; the totals
are ``simulate``'s. W = 0
is the whole-epoch plan (the horizon of the sampler: next uses into the next epoch too).
``--ahead``: each window's next uses known that many steps past its end (its trace drawn
further: W + A steps held to plan W).

``--planned``: the planner's own windows instead (``PlanSpec.window``: each window's next uses
known to the end of the window after it, drawn once), ``--pages`` with page mates as a Loader
plans them; ``--ahead`` does not apply.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
import warnings

import numpy as np

from solar import BufferConfig, PlanSpec
from solar.config import parse_size
from solar.graph.neighbor import NeighborSampler
from solar.io.sources import describe_source
from solar.schedule.draw import traces
from solar.schedule.draw.samplers import sampler_run
from solar.schedule.plans.plan import simulate
from solar.schedule.policy import EPOCH_SHIFT, NEVER

WHOLE = traces.TraceOrder.with_next_use


def windowed(window: int, ahead: int = 0):
    """TraceOrder.with_next_use, next uses cut at the end of each access's window of steps
    (``ahead`` steps after it: the window's trace drawn that much further)."""
    whole = WHOLE

    def with_next_use(self, k):
        pair, nu = whole(self, k)
        bounds = self.epoch(k).bounds  # each global step's first access
        steps = bounds.size - 1
        ends = bounds[np.minimum((np.arange(steps) // window + 1) * window + ahead, steps)]
        end = (np.int64(k) << EPOCH_SHIFT) + np.repeat(ends, np.diff(bounds))
        return pair, np.where(nu >= end, NEVER, nu)

    return with_next_use


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("graph")
    p.add_argument("--windows", default="1,2,5,10")
    p.add_argument("--ahead", default="0", help="steps of look-ahead past a window's end")
    p.add_argument("-B", type=int, default=128)
    p.add_argument("-P", type=int, default=8)
    p.add_argument("-E", type=int, default=2)
    p.add_argument("--buffer", default="10%", help="the buffer, as solar plan's --buffer")
    p.add_argument("--json")
    p.add_argument("--planned", action="store_true", help="the planner's windows (PlanSpec.window)")
    p.add_argument("--pages", action="store_true", help="with page mates (--planned)")
    a = p.parse_args()
    warnings.simplefilter("ignore")
    sampler = NeighborSampler(a.graph, (15, 10, 5), a.B)
    info = describe_source(a.graph, ["features"])
    n, row = info.num_samples, info.sample_bytes
    run = sampler_run(sampler, n, a.P, a.B, a.E)
    cap = parse_size(a.buffer, sample_bytes=row, num_samples=n, world_size=a.P, name="buffer")
    spec = PlanSpec(run, BufferConfig(cap), "solar", False, row, info.identity, sampler, None,
                    False)  # fmt: skip
    if a.pages:
        from solar.runtime.setup import page_layout

        spec = dataclasses.replace(spec, pages=page_layout(info))
    rows = []
    cases = [(w, h) for w in map(int, a.windows.split(",")) for h in map(int, a.ahead.split(","))]
    if a.planned:
        cases = [(w, w) for w in map(int, a.windows.split(","))]
    for w, h in [(0, 0), *cases]:
        if a.planned:
            run_spec = dataclasses.replace(spec, window=w or None)
        else:
            run_spec = spec
            traces.TraceOrder.with_next_use = WHOLE if w == 0 else windowed(w, h)
        t0 = time.perf_counter()
        s = simulate(run_spec)
        seconds = round(time.perf_counter() - t0, 1)
        rows.append({"window_steps": w, "ahead_steps": h, "steps_per_epoch": run.steps_per_epoch,
                     "accesses": s.accesses, "hits": s.hits, "hit_rate": round(s.hit_rate, 5),
                     "seconds": seconds})  # fmt: skip
        if w:
            rows[-1]["hits_kept"] = round(s.hits / max(1, rows[0]["hits"]), 4)
        print(json.dumps(rows[-1]), flush=True)
    traces.TraceOrder.with_next_use = WHOLE
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

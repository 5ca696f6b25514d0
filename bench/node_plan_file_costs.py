"""Node plan files (read by schedule/plans/stream.py): planning into a file against planning only,
proving it safe (every host, in one process), its size per access. A GNN neighbour sampler,
fanouts (10, 5), 256 seeds per rank, P=4 ranks grouped 1x4 and 2x2, 10 % aggregate buffer,
E=3; each figure after a first (warming) call.

    solar gen /tmp/g5.h5 --preset graph --nodes 100000 --features 64
    flock /tmp/solar-bench.lock python bench/node_plan_file_costs.py /tmp/g5.h5 \
        --out bench/results/node-plan-file-costs.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

from solar import BufferConfig, PlanSpec
from solar.config import parse_size
from solar.graph.neighbor import NeighborSampler
from solar.io.sources import describe_source
from solar.runtime.setup import page_layout
from solar.schedule.draw.samplers import sampler_run
from solar.schedule.keep.grouping import Hosts
from solar.schedule.keep.hostplan import host_totals
from solar.schedule.plans.plan import plan_to_file


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("graph")
    ap.add_argument("--out")
    a = ap.parse_args()
    world, batch, epochs = 4, 256, 3
    sampler = NeighborSampler(a.graph, (10, 5), batch)
    info = describe_source(a.graph, ["features"])
    n = info.num_samples
    run = sampler_run(sampler, n, world, batch, epochs)
    cap = parse_size("10%", sample_bytes=info.sample_bytes, num_samples=n, world_size=world)
    spec = PlanSpec(run, BufferConfig(cap, 0.25), "solar", False, info.sample_bytes,
                    info.identity, sampler, None, False)  # fmt: skip
    pages = page_layout(info)
    if pages is not None and spec.plans_page_mates:  # as a Loader plans it
        spec = dataclasses.replace(spec, pages=pages)
    out: dict = {"graph": a.graph, "nodes": n, "P": world, "B": batch, "E": epochs,
                 "buffer_per_rank": cap, "page_mates": pages is not None}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for grouping in ("1x4", "2x2"):
            hosts = Hosts.parse(grouping)
            host_totals(spec, hosts)  # kernels and the sampler warm
            t0 = time.perf_counter()
            totals = host_totals(spec, hosts)
            only = time.perf_counter() - t0
            t0 = time.perf_counter()
            plan = plan_to_file(spec, hosts=hosts, path=Path(tmp) / f"{grouping}.h5").bound_to(spec)
            to_file = time.perf_counter() - t0
            plan.validate(0)
            t0 = time.perf_counter()
            plan.validate(0)
            proven = time.perf_counter() - t0
            size = plan.file.path.stat().st_size
            accesses = sum(int(plan.epoch(k).ranks.sample.size) for k in range(epochs))
            out[grouping] = {
                "plan_only_s": only, "plan_to_file_s": to_file, "validate_every_host_s": proven,
                "file_bytes": size, "rank_accesses": accesses,
                "bytes_per_rank_access": size / accesses, "hit_rate": totals.hit_rate,
                "peer_rows": totals.peer_rows, "reads": totals.reads,
            }  # fmt: skip
            print(grouping, json.dumps(out[grouping]), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
